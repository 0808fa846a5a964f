//! `protocol: http` upstreams and bodies that take their time or stop coming: a
//! real `dwara` process between raw TCP clients and endpoints (plain backends, or
//! raw listeners that stop reading or writing half way).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::http_upstreams::{
    Backend, Pieces, common_port, dns, in_front_of_127_0_0_2, ip, metrics, read_response,
    read_until, upstream, wait_listening,
};
use crate::serve::{Serve, WAIT};

/// Sends `POST /upload` with a body of `pieces` (Content-Length their sum), one
/// piece each `gap`, on a new connection to `proxy`; the connection, to read the
/// answer from.
async fn upload(proxy: SocketAddr, pieces: &[&[u8]], gap: Duration) -> TcpStream {
    let len: usize = pieces.iter().map(|p| p.len()).sum();
    let mut raw = TcpStream::connect(proxy).await.unwrap();
    let head = format!("POST /upload HTTP/1.1\r\nHost: web\r\nContent-Length: {len}\r\n\r\n");
    raw.write_all(head.as_bytes()).await.unwrap();
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            // The client's pace is what is under test.
            tokio::time::sleep(gap).await;
        }
        raw.write_all(piece).await.unwrap();
    }
    raw
}

/// The body of a raw HTTP/1.1 response.
fn body_of(text: &str) -> &str {
    text.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

/// An upload that takes longer than the response timeout is answered: the
/// response timeout counts from the request sent whole, and while the body moves
/// the body timeout is what watches it.
#[tokio::test]
async fn an_upload_slower_than_the_response_timeout_is_answered() {
    let port = common_port(&[ip(2)]).await;
    let _backend = Backend::start(ip(2), port).await;
    let extra = "    response_timeout_ms: 300\n    body_timeout_ms: 2000\n";
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, extra).await;

    let started = Instant::now();
    let pieces: [&[u8]; 4] = [b"one;", b"two;", b"three;", b"four"];
    let mut raw = upload(proxy, &pieces, Duration::from_millis(200)).await;
    let text = read_response(&mut raw).await;
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let json: serde_json::Value = serde_json::from_str(body_of(&text)).unwrap();
    assert_eq!(json["body"], "one;two;three;four", "{json}");
    assert_eq!(json["method"], "POST", "{json}");

    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["timeout_504"], 0, "{status}");
    assert_eq!(h["requests"]["2xx"], 1, "{status}");
}

/// A request body the client stops sending gets 408 after the body timeout (the
/// connection closed after it), one it breaks 400, and the endpoint it was going
/// to is not blamed: with ejection after one failure, both endpoints still get
/// requests.
#[tokio::test]
async fn a_request_body_the_client_stops_or_breaks_gets_408_or_400_and_blames_no_endpoint() {
    let ips = [ip(2), ip(3)];
    let port = common_port(&ips).await;
    let _backends = [
        Backend::start(ips[0], port).await,
        Backend::start(ips[1], port).await,
    ];
    let dns = dns(&ips).await;
    let proxy = test_support::free_addr();
    let extra =
        "    body_timeout_ms: 300\n    ejection: {consecutive_failures: 1, cool_down_s: 60}\n";
    let serve = Serve::spawn(&upstream(proxy, port, dns.addr(), extra));
    serve
        .wait_endpoints(&[format!("{}:{port}", ips[0]), format!("{}:{port}", ips[1])])
        .await;
    wait_listening(proxy).await;

    for round in 1..=2u64 {
        let started = Instant::now();
        let mut raw = TcpStream::connect(proxy).await.unwrap();
        raw.write_all(
            b"POST /upload HTTP/1.1\r\nHost: web\r\nContent-Length: 100\r\n\r\nten bytes.",
        )
        .await
        .unwrap();
        let text = read_response(&mut raw).await;
        let took = started.elapsed();
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
        assert_eq!(body_of(&text), "the request body did not come in time\n");
        assert!(took >= Duration::from_millis(300), "408 after {took:?}");
        // The rest of the body would be read as the next request: the connection
        // closes.
        let mut buf = [0u8; 64];
        let end = tokio::time::timeout(WAIT, raw.read(&mut buf)).await;
        assert!(matches!(end, Ok(Ok(0) | Err(_))), "{end:?}");
        let status = serve.status().await;
        assert_eq!(
            status["upstreams"][0]["http"]["client_timeout_408"], round,
            "{status}"
        );
    }

    // A chunked body the client breaks (a chunk size that is no number): 400.
    let mut raw = TcpStream::connect(proxy).await.unwrap();
    raw.write_all(
        b"POST /upload HTTP/1.1\r\nHost: web\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nfine\r\nzz\r\n",
    )
    .await
    .unwrap();
    let text = read_response(&mut raw).await;
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert_eq!(body_of(&text), "the request body could not be read\n");
    let status = serve.status().await;
    assert_eq!(
        status["upstreams"][0]["http"]["bad_request_400"], 1,
        "{status}"
    );

    // Neither endpoint was ejected: both still answer.
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let (code, body) = crate::serve::http(proxy, "GET", "/").await;
        assert_eq!(code, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        seen.insert(json["ip"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        seen.len(),
        2,
        "an endpoint was blamed for the client's stall: {seen:?}"
    );
    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["timeout_504"], 0, "{status}");
    assert_eq!(h["bad_gateway_502"], 0, "{status}");
    let m = metrics(&serve).await;
    assert!(
        m.lines()
            .any(|l| l == "dwara_http_generated_total{upstream=\"web\",status=\"408\"} 2"),
        "{m}"
    );
}

/// A request body the endpoint stops taking (it reads nothing) gets 504 after the
/// body timeout, though the client goes on sending.
#[tokio::test]
async fn a_request_body_the_endpoint_stops_taking_gets_504() {
    let port = common_port(&[ip(2)]).await;
    // The endpoint: accepts and reads nothing.
    let listener = TcpListener::bind((ip(2), port)).await.unwrap();
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, "    body_timeout_ms: 300\n").await;

    let raw = TcpStream::connect(proxy).await.unwrap();
    let (mut rx, mut tx) = raw.into_split();
    // More than every socket buffer on the way holds.
    let len = 1u64 << 30;
    let sending = tokio::spawn(async move {
        let head = format!("POST /upload HTTP/1.1\r\nHost: web\r\nContent-Length: {len}\r\n\r\n");
        tx.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 64 << 10];
        loop {
            tx.write_all(&chunk).await?;
        }
        #[allow(unreachable_code)]
        Ok::<(), std::io::Error>(())
    });
    let (_held, _) = tokio::time::timeout(WAIT, listener.accept())
        .await
        .expect("the request reached no endpoint")
        .unwrap();

    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let text = loop {
        let n = tokio::time::timeout(WAIT, rx.read(&mut buf))
            .await
            .expect("no answer while the endpoint took nothing")
            .unwrap();
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if n == 0 || text.ends_with("in time\n") {
            break text;
        }
    };
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert_eq!(body_of(&text), "upstream web did not answer in time\n");
    sending.abort();
    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["timeout_504"], 1, "{status}");
    assert_eq!(h["client_timeout_408"], 0, "{status}");
}

/// A request body that ends with trailers has been sent whole once they are: the
/// response timeout, not the body timeout, then watches for the answer. (hyper
/// polls a body no further after its trailers; taken as still moving, the
/// request waited out the body timeout instead, and an answer that came after
/// the response timeout went through.)
#[tokio::test]
async fn a_request_body_ended_by_trailers_is_sent_and_the_response_timeout_follows() {
    let port = common_port(&[ip(2)]).await;
    let listener = TcpListener::bind((ip(2), port)).await.unwrap();
    let extra = "    response_timeout_ms: 300\n    body_timeout_ms: 20000\n    max_tries: 1\n";
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, extra).await;
    // The endpoint takes the whole request, trailer included, and answers late.
    let endpoint = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let ended = read_until(&mut conn, &mut got, b"0\r\nx-check: 7\r\n\r\n").await;
        assert!(ended, "closed after {:?}", String::from_utf8_lossy(&got));
        // The endpoint's pace is what is under test.
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let _ = conn
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            .await;
        got
    });
    let mut raw = TcpStream::connect(proxy).await.unwrap();
    raw.write_all(
        b"POST /upload HTTP/1.1\r\nHost: web\r\nTrailer: x-check\r\n\
          Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-check: 7\r\n\r\n",
    )
    .await
    .unwrap();
    let text = read_response(&mut raw).await;
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert_eq!(body_of(&text), "upstream web did not answer in time\n");
    let seen = endpoint.await.unwrap();
    assert!(seen.ends_with(b"3\r\nabc\r\n0\r\nx-check: 7\r\n\r\n"));
    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["timeout_504"], 1, "{status}");
}

/// An endpoint that answers an upload before taking its body, and closes: its
/// answer reaches the client every time. (Closed with the body unread, the
/// endpoint's connection is reset; a send of the body that met the reset before
/// the answer was read ended hyper's connection and lost the answer: the client
/// got a `502` for the first upload or one of the next few, where HAProxy passes
/// every `413` on.)
#[tokio::test]
async fn an_answer_before_the_whole_upload_reaches_the_client() {
    let port = common_port(&[ip(2)]).await;
    let listener = TcpListener::bind((ip(2), port)).await.unwrap();
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, "    max_tries: 1\n").await;
    let _endpoint = tokio::spawn(async move {
        loop {
            let (conn, _) = listener.accept().await.unwrap();
            tokio::spawn(answer_early(conn));
        }
    });
    const UPLOADS: usize = 30;
    let body = vec![b'x'; 2 << 20];
    for i in 0..UPLOADS {
        let raw = TcpStream::connect(proxy).await.unwrap();
        let (mut rx, mut tx) = raw.into_split();
        let head = format!(
            "POST /upload HTTP/1.1\r\nHost: web\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let body = body.clone();
        // Sent while the answer is read: the endpoint answers before taking it.
        let sending = tokio::spawn(async move {
            let _ = tx.write_all(head.as_bytes()).await;
            let _ = tx.write_all(&body).await;
            tx
        });
        let text = read_response(&mut rx).await;
        assert!(text.starts_with("HTTP/1.1 413"), "upload {i}: {text:?}");
        assert_eq!(body_of(&text), "too large\n", "upload {i}");
        // What is left of the body is not sent: the answer is what is under test.
        drop(rx);
        sending.abort();
    }
    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["requests"]["4xx"], UPLOADS, "{status}");
    assert_eq!(h["requests"]["5xx"], 0, "{status}");
}

/// A client still sending its body when the endpoint's early answer comes is not
/// reset: dwara reads and drops what it still sends (for up to 2 s) before it
/// closes, so that the whole upload goes out and the client then reads the
/// answer. (Closed at once with the body unread, the connection was reset under
/// the client's send: curl then gives up with a send error and never reads the
/// `413` waiting in its socket.)
#[tokio::test]
async fn a_client_still_sending_after_an_early_answer_is_not_reset() {
    let port = common_port(&[ip(2)]).await;
    let listener = TcpListener::bind((ip(2), port)).await.unwrap();
    let (proxy, _dns, _serve) = in_front_of_127_0_0_2(port, "    max_tries: 1\n").await;
    let _endpoint = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        answer_early(conn).await;
    });
    // More than the sockets on the way hold, so that the client is still sending
    // when dwara closes.
    let body = vec![b'x'; 32 << 20];
    let mut raw = TcpStream::connect(proxy).await.unwrap();
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: web\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    tokio::time::timeout(WAIT, raw.write_all(&body))
        .await
        .expect("the upload did not go out in time")
        .expect("the upload was reset");
    let text = read_response(&mut raw).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text:?}");
    assert_eq!(body_of(&text), "too large\n");
}

/// An endpoint's early answer to an upload: `413` once the request head is in,
/// without reading the body, and the connection closed (reset, as the body is
/// unread).
async fn answer_early(mut conn: TcpStream) {
    if head_of_next(&mut conn).await.is_some() {
        let answer = b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 10\r\n\
                       Connection: close\r\n\r\ntoo large\n";
        let _ = conn.write_all(answer).await;
    }
}

/// The head of the next request on `sock`, as its bytes came (`None` when it
/// closed first).
pub(crate) async fn head_of_next(sock: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match sock.read(&mut buf).await {
            Ok(1) => head.push(buf[0]),
            _ => return None,
        }
    }
    Some(head)
}

/// The path of the request whose head is read from `sock` (`None` when it closed).
pub(crate) async fn path_of_next(sock: &mut TcpStream) -> Option<String> {
    let head = head_of_next(sock).await?;
    let text = String::from_utf8_lossy(&head).into_owned();
    text.split(' ').nth(1).map(str::to_owned)
}

/// A response body that keeps coming, however slowly, or that the client takes
/// its time to read, goes through whole; one the endpoint stops sending is cut
/// off after the body timeout: the client's connection closes short of the
/// `Content-Length`, the endpoint's connection is closed, and the cut is counted.
#[tokio::test]
async fn a_response_body_the_endpoint_stops_sending_is_cut_off() {
    let port = common_port(&[ip(2)]).await;
    let listener = TcpListener::bind((ip(2), port)).await.unwrap();
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
    let endpoint = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let ended_tx = ended_tx.clone();
            tokio::spawn(async move {
                while let Some(path) = path_of_next(&mut sock).await {
                    match path.as_str() {
                        "/slow" => {
                            // 4 pieces of 10 bytes, 200 ms apart (the body timeout
                            // is 300 ms).
                            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n")
                                .await
                                .unwrap();
                            for i in 0..4 {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                sock.write_all(format!("piece {i}...").as_bytes())
                                    .await
                                    .unwrap();
                            }
                        }
                        "/big" => {
                            // 4 MiB at once, more than the socket buffers hold.
                            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4194314\r\n\r\n")
                                .await
                                .unwrap();
                            sock.write_all(&vec![b'x'; 4 << 20]).await.unwrap();
                            sock.write_all(b"0123456789").await.unwrap();
                        }
                        _ => {
                            sock.write_all(
                                b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nten bytes.",
                            )
                            .await
                            .unwrap();
                            // Holds: the body is 90 bytes short, until dwara closes
                            // the connection.
                            let mut buf = [0u8; 64];
                            let end = sock.read(&mut buf).await;
                            let _ = ended_tx.send(end.map(|n| n == 0).unwrap_or(true));
                            return;
                        }
                    }
                }
            });
        }
    });
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, "    body_timeout_ms: 300\n").await;
    let mut raw = TcpStream::connect(proxy).await.unwrap();

    // The slow body comes whole.
    raw.write_all(b"GET /slow HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap();
    let text = read_response(&mut raw).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(body_of(&text), "piece 0...piece 1...piece 2...piece 3...");

    // The big one too, though the client reads none of it for twice the body
    // timeout while the endpoint has sent what the buffers hold.
    raw.write_all(b"GET /big HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap();
    // The client's pace is what is under test.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let head = head_of_next(&mut raw)
        .await
        .expect("closed before the response head");
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut body = vec![0u8; 4194314];
    tokio::time::timeout(WAIT, raw.read_exact(&mut body))
        .await
        .expect("the big body stopped")
        .unwrap();
    assert!(body.ends_with(b"x0123456789"));

    // The one that stops: head and 10 bytes, then the connection closes.
    let started = Instant::now();
    raw.write_all(b"GET /stops HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap();
    let text = read_response(&mut raw).await;
    let took = started.elapsed();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(body_of(&text), "ten bytes.", "closed short of its length");
    assert!(took >= Duration::from_millis(300), "cut after {took:?}");
    let closed = tokio::time::timeout(WAIT, ended.recv())
        .await
        .expect("the endpoint's connection stayed open");
    assert_eq!(closed, Some(true));

    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["response_body_timeouts"], 1, "{status}");
    let m = metrics(&serve).await;
    assert!(
        m.lines()
            .any(|l| l == "dwara_http_response_body_timeouts_total{upstream=\"web\"} 1"),
        "{m}"
    );
    endpoint.abort();
}

/// Over HTTP/2 a stalled request body costs its stream only: the stream gets 408,
/// and the connection goes on carrying requests.
#[tokio::test]
async fn an_h2_stream_whose_body_stops_gets_408_and_its_connection_lives_on() {
    let port = common_port(&[ip(2)]).await;
    let _backend = Backend::start(ip(2), port).await;
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, "    body_timeout_ms: 300\n").await;

    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let driving = tokio::spawn(conn);
    // One piece of the body, then nothing (the sender is kept).
    let (pieces, rx) = tokio::sync::mpsc::channel(1);
    pieces.send(Bytes::from_static(b"first;")).await.unwrap();
    let req = Request::post("http://web/upload").body(Pieces(rx)).unwrap();
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("no answer to the stalled stream")
        .unwrap();
    assert_eq!(resp.status(), 408);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"the request body did not come in time\n");

    // The same connection, another stream.
    let (done, rx) = tokio::sync::mpsc::channel(1);
    done.send(Bytes::from_static(b"whole")).await.unwrap();
    drop(done);
    let req = Request::post("http://web/upload").body(Pieces(rx)).unwrap();
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("no answer on the same connection")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["body"], "whole", "{json}");
    assert!(!driving.is_finished(), "the HTTP/2 connection closed");
    drop(pieces);

    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["client_timeout_408"], 1, "{status}");
    assert_eq!(h["requests"]["2xx"], 1, "{status}");
}

/// The length of the response body a slow reader takes: more than the socket
/// buffers on the way hold.
const BIG: usize = 16 << 20;

/// A client that stops reading is closed after the send timeout (with the
/// connection to the endpoint its response came on), while one that reads slowly
/// but keeps reading gets its whole response.
#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_the_send_timeout() {
    let port = common_port(&[ip(2)]).await;
    let listener = TcpListener::bind((ip(2), port)).await.unwrap();
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
    let endpoint = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let ended_tx = ended_tx.clone();
            tokio::spawn(async move {
                while let Some(path) = path_of_next(&mut sock).await {
                    let chunk = vec![b'x'; 64 << 10];
                    if path == "/big" {
                        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n");
                        sock.write_all(head.as_bytes()).await.unwrap();
                        for _ in 0..BIG / chunk.len() {
                            sock.write_all(&chunk).await.unwrap();
                        }
                        continue;
                    }
                    // Endless, until dwara closes the connection.
                    sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                        .await
                        .unwrap();
                    while sock.write_all(&chunk).await.is_ok() {}
                    let _ = ended_tx.send(());
                    return;
                }
            });
        }
    });
    let extra = "    limits: {send_timeout_ms: 300}\n";
    let (proxy, _dns, serve) = in_front_of_127_0_0_2(port, extra).await;

    // Slow but steady: 1 MiB each 100 ms, through a small receive buffer, so that
    // dwara's writes wait on the client between reads.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let mut raw = socket.connect(proxy).await.unwrap();
    raw.write_all(b"GET /big HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap();
    let head = head_of_next(&mut raw)
        .await
        .expect("closed before the response head");
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut left = BIG;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        // The client's pace is what is under test.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let n = left.min(buf.len());
        tokio::time::timeout(WAIT, raw.read_exact(&mut buf[..n]))
            .await
            .expect("the slow reader's response stopped")
            .unwrap_or_else(|e| panic!("closed on a slow reader with {left} bytes left: {e}"));
        left -= n;
    }

    // Stops reading: closed after the timeout, and the endpoint's connection too.
    let mut stuck = TcpStream::connect(proxy).await.unwrap();
    stuck
        .write_all(b"GET /endless HTTP/1.1\r\nHost: web\r\n\r\n")
        .await
        .unwrap();
    tokio::time::timeout(WAIT, ended.recv())
        .await
        .expect("the endpoint's connection stayed open")
        .unwrap();
    let counted = test_support::wait_until(WAIT, || async {
        serve.status().await["upstreams"][0]["http"]["client_send_timeouts"] == 1
    })
    .await;
    assert!(counted, "{}", serve.status().await);
    // What the client can still read ends: its connection was closed.
    let drained = tokio::time::timeout(WAIT, async {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match stuck.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(drained.is_ok(), "the stuck client's connection stayed open");

    let status = serve.status().await;
    let h = &status["upstreams"][0]["http"];
    assert_eq!(h["response_body_timeouts"], 0, "{status}");
    let m = metrics(&serve).await;
    assert!(
        m.lines()
            .any(|l| l == "dwara_http_client_send_timeouts_total{upstream=\"web\"} 1"),
        "{m}"
    );
    endpoint.abort();
}
