//! The settings of a `protocol: http` upstream wired into what a real `dwara
//! serve` does: the client connection limit, the retry budget, passive ejection
//! fed by failed requests, the pool's idle timeout and idle bound, and the
//! figures of `/metrics`. The endpoints are raw HTTP/1.1 servers on 127.0.0.x
//! that record what happens to their connections (how many were opened, which
//! dwara closed and when), so that each setting is seen at work from the
//! endpoint's side as well as in `GET /upstreams` and `/metrics`.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::http_upstreams::{
    common_listener, ip, maybe_sample, metrics, read_response, sample, serve_http,
};
use crate::serve::WAIT;
use crate::slow_bodies::head_of_next;

/// What an [`Endpoint`] has seen.
struct Seen {
    /// Connections accepted.
    accepted: AtomicUsize,
    /// Connections the other side (dwara) closed: end of stream or reset.
    closed: AtomicUsize,
    /// Request heads read, over all connections.
    heads: watch::Sender<usize>,
    /// Answers wait until this many heads have come in, over all connections.
    hold_until: AtomicUsize,
}

/// An endpoint on `ip:port` speaking raw HTTP/1.1 (requests without bodies). It
/// answers each request head with `200` and its IP as the body, holding the
/// answer until [`Seen::hold_until`] heads have come in; a request for `/drop`
/// has its connection closed unanswered once its head is in. It closes no
/// connection otherwise, so every other close it sees is dwara's.
struct Endpoint {
    seen: Arc<Seen>,
    /// When each connection closed by dwara was seen closed here.
    closed: mpsc::UnboundedReceiver<Instant>,
    task: JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Endpoint {
    /// An endpoint on the first of `ips`, on a port every one of them could bind
    /// (kept bound from the moment it is chosen, so no other test can take it):
    /// the endpoint and its port.
    async fn start(ips: &[Ipv4Addr]) -> (Self, u16) {
        let listener = common_listener(ips).await;
        let port = listener.local_addr().unwrap().port();
        (Self::serve_on(listener, ips[0]), port)
    }

    fn serve_on(listener: TcpListener, ip: Ipv4Addr) -> Self {
        let seen = Arc::new(Seen {
            accepted: AtomicUsize::new(0),
            closed: AtomicUsize::new(0),
            heads: watch::Sender::new(0),
            hold_until: AtomicUsize::new(0),
        });
        let (tx, closed) = mpsc::unbounded_channel();
        let shared = seen.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task: every connection closes with it.
            let mut conns = JoinSet::new();
            while let Ok((sock, _)) = listener.accept().await {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                conns.spawn(Self::serve(sock, ip, shared.clone(), tx.clone()));
                while conns.try_join_next().is_some() {}
            }
        });
        Self { seen, closed, task }
    }

    async fn serve(
        mut sock: TcpStream,
        ip: Ipv4Addr,
        seen: Arc<Seen>,
        closed: mpsc::UnboundedSender<Instant>,
    ) {
        let by_dwara = || {
            seen.closed.fetch_add(1, Ordering::SeqCst);
            let _ = closed.send(Instant::now());
        };
        loop {
            let Some(head) = head_of_next(&mut sock).await else {
                return by_dwara();
            };
            seen.heads.send_modify(|n| *n += 1);
            if head.starts_with(b"GET /drop ") {
                // Closed here, unanswered.
                return;
            }
            let mut heads = seen.heads.subscribe();
            let until = seen.hold_until.load(Ordering::SeqCst);
            let _ = heads.wait_for(|n| *n >= until).await;
            let body = ip.to_string();
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            if sock.write_all(answer.as_bytes()).await.is_err() {
                return by_dwara();
            }
        }
    }

    fn accepted(&self) -> usize {
        self.seen.accepted.load(Ordering::SeqCst)
    }

    fn closed_by_dwara(&self) -> usize {
        self.seen.closed.load(Ordering::SeqCst)
    }

    fn heads(&self) -> usize {
        *self.seen.heads.borrow()
    }
}

/// Sends `GET path` on `raw`, a keep-alive connection to the proxy, and reads
/// the answer.
async fn get(raw: &mut TcpStream, path: &str) -> String {
    raw.write_all(format!("GET {path} HTTP/1.1\r\nHost: web.test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_response(raw).await
}

/// A `GET /` on a new connection to `proxy` that must be answered 200: the
/// connection, kept open.
async fn served(proxy: SocketAddr) -> TcpStream {
    let mut raw = TcpStream::connect(proxy).await.unwrap();
    let text = get(&mut raw, "/").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    raw
}

/// A figure of upstream `web`'s `http` part of `GET /upstreams`.
fn figure(status: &serde_json::Value, key: &str) -> u64 {
    status["upstreams"][0]["http"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no http.{key}: {status}"))
}

/// `limits.max_connections: 2`: two client connections are served; a third (and
/// a fourth) is closed at once without an answer, even to a whole request, and
/// counted in `client_connections_refused`; once one of the two has closed, a new
/// connection is served. (The header read timeout is far beyond the test: a
/// connection not refused would get its answer, not a close.)
#[tokio::test]
async fn client_connections_beyond_max_connections_are_closed_unanswered_and_counted() {
    let (_endpoint, port) = Endpoint::start(&[ip(2)]).await;
    let limits = "    limits: {max_connections: 2, header_read_timeout_ms: 600000}\n";
    let (proxy, _dns, serve) = serve_http(&[ip(2)], port, limits, &[]).await;

    let first = served(proxy).await;
    let _second = served(proxy).await;
    let status = serve.status().await;
    assert_eq!(figure(&status, "client_connections"), 2, "{status}");
    assert_eq!(figure(&status, "client_connections_refused"), 0, "{status}");

    for extra in 1..=2u64 {
        let mut raw = TcpStream::connect(proxy).await.unwrap();
        // Written before dwara closes it, or after (then the write may fail).
        let _ = raw
            .write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\nConnection: close\r\n\r\n")
            .await;
        let mut got = Vec::new();
        // End of stream, or a reset for the request left unread.
        let _ = tokio::time::timeout(WAIT, raw.read_to_end(&mut got))
            .await
            .expect("a connection over the limit stayed open");
        assert!(
            got.is_empty(),
            "connection {} of 2 allowed was answered: {}",
            2 + extra,
            String::from_utf8_lossy(&got)
        );
        let status = serve.status().await;
        assert_eq!(
            figure(&status, "client_connections_refused"),
            extra,
            "{status}"
        );
        assert_eq!(figure(&status, "client_connections"), 2, "{status}");
    }
    let m = metrics(&serve).await;
    assert_eq!(
        sample(
            &m,
            "dwara_http_client_connections_refused_total{upstream=\"web\"}"
        ),
        2.0,
        "{m}"
    );

    // One of the two closes: its place is free again.
    drop(first);
    let freed = test_support::wait_until(WAIT, || async {
        figure(&serve.status().await, "client_connections") == 1
    })
    .await;
    assert!(freed, "{}", serve.status().await);
    let mut again = served(proxy).await;
    let text = get(&mut again, "/").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let status = serve.status().await;
    assert_eq!(figure(&status, "client_connections"), 2, "{status}");
    assert_eq!(figure(&status, "client_connections_refused"), 2, "{status}");
}

/// The retry budget on the request path: an endpoint that takes every request
/// and closes its connection unanswered makes each GET (idempotent, no body)
/// want two retries (`max_tries: 3`), each of which may have reached it. Retries
/// are granted while they stay within 20% of the requests of the last 10 s, with
/// a floor of 10 (`MIN_RETRIES`); the rest are refused and counted in
/// `retry_budget_exhausted`. The endpoint's own count of connections (one per
/// try) agrees with dwara's count of retries.
#[tokio::test]
async fn retries_of_lost_requests_stay_within_the_retry_budget() {
    const REQUESTS: u64 = 60;
    const MIN_RETRIES: u64 = 10;
    let (endpoint, port) = Endpoint::start(&[ip(2)]).await;
    let (proxy, _dns, serve) = serve_http(&[ip(2)], port, "    max_tries: 3\n", &[]).await;

    let mut raw = TcpStream::connect(proxy).await.unwrap();
    let started = Instant::now();
    for i in 0..REQUESTS {
        let text = get(&mut raw, "/drop").await;
        assert!(text.starts_with("HTTP/1.1 502"), "request {i}: {text}");
    }
    let took = started.elapsed();

    let status = serve.status().await;
    let retries = figure(&status, "retries");
    let exhausted = figure(&status, "retry_budget_exhausted");
    assert!(retries > 0, "no request was retried: {status}");
    assert!(exhausted > 0, "the budget never refused a retry: {status}");
    // Within the budget: its windows of 10 s that the requests spanned, each
    // allowing the floor or a fifth of its requests.
    let windows = (took.as_secs() + 1) / 10 + 1;
    let allowed = MIN_RETRIES * windows + REQUESTS / 5;
    assert!(
        retries <= allowed,
        "{retries} retries of {REQUESTS} requests in {took:?}, at most {allowed}: {status}"
    );
    // Every request ended in a 502, either out of tries (two retries) or refused a
    // retry by the budget (once).
    assert!(retries + exhausted >= REQUESTS, "{status}");
    assert_eq!(figure(&status, "bad_gateway_502"), REQUESTS, "{status}");
    assert_eq!(status["upstreams"][0]["http"]["requests"]["5xx"], REQUESTS);
    // Each try was a connection of its own at the endpoint, which took its request.
    let tries = usize::try_from(REQUESTS + retries).unwrap();
    assert_eq!(endpoint.accepted(), tries, "{status}");
    assert_eq!(endpoint.heads(), tries, "{status}");
    let m = metrics(&serve).await;
    assert_eq!(
        sample(
            &m,
            "dwara_http_retry_budget_exhausted_total{upstream=\"web\"}"
        ),
        exhausted as f64,
        "{m}"
    );
    assert_eq!(
        sample(&m, "dwara_http_retries_total{upstream=\"web\"}"),
        retries as f64,
        "{m}"
    );
}

/// Passive ejection fed by the HTTP path: of two endpoints, one refuses
/// connections (in DNS with nothing listening). Each request round robin sends
/// to it fails its dial (and is retried on the other, so every request gets its
/// 200); after `consecutive_failures` such failures it is ejected, shown in
/// `GET /upstreams` and `/metrics`, and the requests that follow all go to the
/// healthy endpoint without another dial of the ejected one.
#[tokio::test]
async fn an_endpoint_refusing_connections_is_ejected_and_gets_no_more_requests() {
    // Nothing listens on 127.0.0.3 at the live endpoint's port.
    let (_live, port) = Endpoint::start(&[ip(2), ip(3)]).await;
    let ejection = "    ejection: {consecutive_failures: 3, cool_down_s: 600}\n";
    let (proxy, _dns, serve) = serve_http(&[ip(2), ip(3)], port, ejection, &[]).await;
    let dead = format!("{}:{port}", ip(3));
    let ejected = |status: &serde_json::Value| {
        status["upstreams"][0]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["addr"] == dead.as_str())
            .unwrap_or_else(|| panic!("{dead} is not an endpoint: {status}"))["ejected"]
            == true
    };

    let mut raw = TcpStream::connect(proxy).await.unwrap();
    let deadline = Instant::now() + WAIT;
    let mut sent = 0;
    let status = loop {
        let status = serve.status().await;
        if ejected(&status) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "{dead} never ejected after {sent} requests: {status}"
        );
        let text = get(&mut raw, "/").await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("127.0.0.2"), "{text}");
        sent += 1;
    };
    // Ejected at the third failure in a row, not before.
    assert_eq!(figure(&status, "connect_failures"), 3, "{status}");
    let m = metrics(&serve).await;
    assert_eq!(
        sample(&m, "dwara_upstream_endpoints_ejected{upstream=\"web\"}"),
        1.0,
        "{m}"
    );

    // Round robin would send every other request to it: none goes.
    for _ in 0..20 {
        let text = get(&mut raw, "/").await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("127.0.0.2"), "{text}");
    }
    let status = serve.status().await;
    assert_eq!(figure(&status, "connect_failures"), 3, "{status}");
    assert_eq!(figure(&status, "retries"), 3, "{status}");
    assert!(ejected(&status), "{status}");
}

/// `pool.idle_timeout_s`: a pooled connection left idle is closed by dwara once
/// it has been idle that long (the endpoint reads the end of its stream, not
/// sooner than the timeout after the response), and leaves the pool; the next
/// request dials a new one.
#[tokio::test]
async fn an_idle_pooled_connection_is_closed_after_the_idle_timeout() {
    let (mut endpoint, port) = Endpoint::start(&[ip(2)]).await;
    let pool = "    pool: {max_idle_per_endpoint: 4, idle_timeout_s: 2}\n";
    let (proxy, _dns, serve) = serve_http(&[ip(2)], port, pool, &[]).await;
    let endpoint_addr = format!("{}:{port}", ip(2));

    let mut raw = served(proxy).await;
    let answered = Instant::now();
    // Back in the pool, idle, before the client had its answer.
    let status = serve.status().await;
    assert_eq!(
        status["upstreams"][0]["http"]["pool"],
        serde_json::json!([{ "endpoint": endpoint_addr, "idle": 1, "busy": 0 }]),
        "{status}"
    );

    let closed_at = tokio::time::timeout(WAIT, endpoint.closed.recv())
        .await
        .expect("dwara kept an idle pooled connection past its idle timeout")
        .unwrap();
    let idle_for = closed_at.duration_since(answered);
    assert!(
        idle_for >= Duration::from_millis(1500),
        "closed {idle_for:?} after its response, before the 2 s idle timeout"
    );
    assert_eq!(endpoint.accepted(), 1);
    assert_eq!(endpoint.closed_by_dwara(), 1);
    let status = serve.status().await;
    let pool = status["upstreams"][0]["http"]["pool"].as_array().unwrap();
    assert!(pool.iter().all(|p| p["idle"] == 0), "{status}");

    // The next request goes out on a new connection.
    let text = get(&mut raw, "/").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(endpoint.accepted(), 2);
    let status = serve.status().await;
    assert_eq!(figure(&status, "connects"), 2, "{status}");
    assert_eq!(figure(&status, "reused"), 0, "{status}");
}

/// `pool.max_idle_per_endpoint: 2` with one L4 worker (the bound is per worker):
/// five requests at once hold five connections to the endpoint (it answers none
/// until all five are in); once answered, two stay idle in the pool and dwara
/// closes the other three, seen closed by the endpoint. The two kept are live:
/// two requests at once go out on them without a new connection.
#[tokio::test]
async fn at_most_max_idle_per_endpoint_connections_stay_idle_after_a_burst() {
    let (endpoint, port) = Endpoint::start(&[ip(2)]).await;
    endpoint.seen.hold_until.store(5, Ordering::SeqCst);
    let pool = "    pool: {max_idle_per_endpoint: 2, idle_timeout_s: 600}\n";
    let (proxy, _dns, serve) = serve_http(&[ip(2)], port, pool, &["--l4-workers", "1"]).await;
    let endpoint_addr = format!("{}:{port}", ip(2));

    let burst = |n: usize| async move {
        let mut clients = JoinSet::new();
        for _ in 0..n {
            clients.spawn(served(proxy));
        }
        let mut kept = Vec::new();
        while let Some(conn) = clients.join_next().await {
            kept.push(conn.unwrap());
        }
        kept
    };
    let _clients = burst(5).await;
    assert_eq!(endpoint.accepted(), 5);
    let closed = test_support::wait_until(WAIT, || async { endpoint.closed_by_dwara() >= 3 }).await;
    assert!(closed, "dwara closed {} of 5", endpoint.closed_by_dwara());
    let status = serve.status().await;
    assert_eq!(
        status["upstreams"][0]["http"]["pool"],
        serde_json::json!([{ "endpoint": endpoint_addr, "idle": 2, "busy": 0 }]),
        "{status}"
    );
    assert_eq!(endpoint.closed_by_dwara(), 3, "{status}");
    assert_eq!(figure(&status, "connects"), 5, "{status}");

    // The two left take two requests at once (the endpoint holds each answer
    // until both are in, so neither connection is free for the other request).
    endpoint.seen.hold_until.store(7, Ordering::SeqCst);
    let _more = burst(2).await;
    assert_eq!(
        endpoint.accepted(),
        5,
        "a new connection for the second burst"
    );
    let status = serve.status().await;
    assert_eq!(figure(&status, "reused"), 2, "{status}");
    assert_eq!(figure(&status, "connects"), 5, "{status}");
    assert_eq!(endpoint.closed_by_dwara(), 3, "{status}");
}

/// `/metrics` after known traffic: seven requests answered 200 (on one pooled
/// connection, idle afterwards) and one GET the endpoint drops unanswered on
/// every try (two retries, then a 502). The request counters by class, the
/// retries, the 502 made here, the pool gauge while the connection is idle and
/// the latency histogram's count all say so.
#[tokio::test]
async fn metrics_count_answers_retries_pool_connections_and_latencies() {
    const OK: u64 = 7;
    let (endpoint, port) = Endpoint::start(&[ip(2)]).await;
    let extra = "    max_tries: 3\n    pool: {max_idle_per_endpoint: 4, idle_timeout_s: 600}\n";
    let (proxy, _dns, serve) = serve_http(&[ip(2)], port, extra, &[]).await;
    let requests =
        |class: &str| format!("dwara_http_requests_total{{upstream=\"web\",class=\"{class}\"}}");
    let pooled = |state: &str| {
        format!(
            "dwara_http_pool_connections{{upstream=\"web\",endpoint=\"127.0.0.2:{port}\",state=\"{state}\"}}"
        )
    };
    const COUNT: &str = "dwara_http_request_duration_seconds_count{upstream=\"web\"}";
    const INF: &str = "dwara_http_request_duration_seconds_bucket{upstream=\"web\",le=\"+Inf\"}";

    let m = metrics(&serve).await;
    assert_eq!(sample(&m, &requests("2xx")), 0.0, "{m}");
    assert_eq!(sample(&m, COUNT), 0.0, "{m}");

    let mut raw = TcpStream::connect(proxy).await.unwrap();
    for _ in 0..OK {
        let text = get(&mut raw, "/").await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
    let m = metrics(&serve).await;
    assert_eq!(sample(&m, &requests("2xx")), OK as f64, "{m}");
    assert_eq!(sample(&m, &requests("5xx")), 0.0, "{m}");
    assert_eq!(
        sample(&m, "dwara_http_answered_total{upstream=\"web\"}"),
        OK as f64,
        "{m}"
    );
    assert_eq!(sample(&m, COUNT), OK as f64, "{m}");
    assert_eq!(sample(&m, INF), OK as f64, "{m}");
    assert!(
        sample(
            &m,
            "dwara_http_request_duration_seconds_sum{upstream=\"web\"}"
        ) > 0.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "dwara_http_retries_total{upstream=\"web\"}"),
        0.0,
        "{m}"
    );
    // One connection, reused by the six requests after the first, idle now.
    assert_eq!(sample(&m, &pooled("idle")), 1.0, "{m}");
    assert_eq!(sample(&m, &pooled("busy")), 0.0, "{m}");
    assert_eq!(
        sample(&m, "dwara_http_connects_total{upstream=\"web\"}"),
        1.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "dwara_http_reused_total{upstream=\"web\"}"),
        (OK - 1) as f64,
        "{m}"
    );
    assert_eq!(endpoint.accepted(), 1);

    let text = get(&mut raw, "/drop").await;
    assert!(text.starts_with("HTTP/1.1 502"), "{text}");
    let m = metrics(&serve).await;
    assert_eq!(
        sample(&m, "dwara_http_retries_total{upstream=\"web\"}"),
        2.0,
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "dwara_http_generated_total{upstream=\"web\",status=\"502\"}"
        ),
        1.0,
        "{m}"
    );
    assert_eq!(sample(&m, &requests("2xx")), OK as f64, "{m}");
    assert_eq!(sample(&m, &requests("5xx")), 1.0, "{m}");
    assert_eq!(sample(&m, COUNT), (OK + 1) as f64, "{m}");
    assert_eq!(sample(&m, INF), (OK + 1) as f64, "{m}");
    // `/upstreams` has the same histogram: cumulative buckets, the last `+Inf`.
    let status = serve.status().await;
    let latency = &status["upstreams"][0]["http"]["latency"];
    assert_eq!(latency["count"], OK + 1, "{status}");
    let buckets = latency["buckets"].as_array().unwrap();
    assert_eq!(buckets.last().unwrap()["le"], "+Inf", "{status}");
    assert_eq!(buckets.last().unwrap()["count"], OK + 1, "{status}");
    let counts: Vec<u64> = buckets
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{status}");
    assert!(latency["sum_seconds"].as_f64().unwrap() > 0.0, "{status}");
    // The pooled connection was dropped with the lost request (an endpoint with
    // no connection left has no sample).
    assert_eq!(maybe_sample(&m, &pooled("idle")).unwrap_or(0.0), 0.0, "{m}");
    // Its three tries reached the endpoint: the pooled connection, two new ones.
    assert_eq!(endpoint.heads(), usize::try_from(OK).unwrap() + 3);
    assert_eq!(endpoint.accepted(), 3);
}
