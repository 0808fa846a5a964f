//! Upgrades: a client connection switched to another protocol (WebSocket's
//! handshake, or any other `Upgrade:` of HTTP/1.1) and tunnelled to an endpoint.
//!
//! A request that asks for an upgrade (HTTP/1.1, `Upgrade:` and `Connection:
//! upgrade`; hyper marks it with its upgrade handle) is not sent over a pooled
//! connection: the connection it goes out on may become a tunnel, and a tunnel
//! never goes back to a pool. It gets a new connection of its own to the endpoint
//! the load balancer picks, and goes out with its headers rewritten as every
//! request's are ([`crate::headers`]) but with `Upgrade` (as the client sent it)
//! and `Connection: upgrade` put back. It is tried again as other requests are: on
//! another endpoint when the dial fails, and (a GET without a body) when the
//! connection closes before the response head, within `max_tries` and the retry
//! budget.
//!
//! - The endpoint answers `101 Switching Protocols`: the client gets that answer
//!   (the endpoint's headers, hop-by-hop ones removed, with its `Upgrade` and
//!   `Connection: upgrade` put back), and once hyper has written it, both
//!   connections leave HTTP: [`Tunnel::run`] takes both sockets back from hyper and
//!   moves bytes between them as an L4 connection does ([`crate::pump`]: copies
//!   through a per-thread buffer, `splice(2)` for long transfers, no buffer of its
//!   own while idle), first the bytes either side sent right behind its head, until
//!   both sides have closed, either fails, or nothing moved either way for
//!   `limits.tunnel_idle_timeout_s`. Its bytes count in the upstream's
//!   `connections.bytes_to_upstream` and `bytes_to_client`.
//!   The tunnel runs in the task that served the client connection, after hyper
//!   hands its socket back ([`crate::reverse::serve`]): it keeps the connection's
//!   permit of `max_connections`, and at shutdown it is drained as an L4
//!   connection is (closed at the drain deadline). It also keeps its pick guard:
//!   the load balancer counts it in flight on its endpoint (`least_connections`
//!   sees tunnels) until it ends.
//! - Any other answer goes to the client as usual (its body streamed) and the
//!   client connection stays HTTP/1.1; the connection to the endpoint closes after
//!   the answer.
//!
//! Upgrades over HTTP/2 (extended `CONNECT`, RFC 8441) are not offered. A
//! `CONNECT` (over either version) is answered here with `501 Not Implemented`
//! and goes to no endpoint: a gateway opens no tunnel to the authority it names,
//! and an endpoint's `2xx` to it would leave a connection neither side can use.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use dwara_lb::PickGuard;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::forward::{ConnStats, Target};
use crate::headers;
use crate::http_stats::{HttpStats, Made};
use crate::outbox::Deferred;
use crate::pool::ReqBody;
use crate::pump;
use crate::reverse::{
    BoxError, Choice, Client, HttpUpstream, Replay, RespBody, Stream, Template, Unanswered, choose,
    dial_addr, dial_failed, empty_resp, hash_key, made, outgoing, refused,
};

/// The tunnel a client connection's upgrade request opened, waiting for hyper to
/// hand the connection's socket back (one per HTTP/1.1 connection: nothing is read
/// from it as HTTP after a `101`).
pub(crate) type Slot = parking_lot::Mutex<Option<Tunnel>>;

/// Whether `req` asks for a tunnel: HTTP/1.1 with `Upgrade:` (hyper gives such a
/// request its upgrade handle), or a `CONNECT` over either version, which
/// [`upgrade`] answers with a `501`. `Upgrade: h2c` alone is not one: HTTP/2 is
/// offered to clients by prior knowledge, and a client asking for h2c (`curl
/// --http2`) goes on with HTTP/1.1 when the answer is not a `101`, so such a
/// request takes the pooled path with `Upgrade` removed, as before. For any other
/// request this reads its method and one empty extension map.
pub(crate) fn wants(req: &Request<Incoming>) -> bool {
    if req.method() == Method::CONNECT {
        return true;
    }
    req.extensions().get::<OnUpgrade>().is_some()
        && req
            .headers()
            .get_all(header::UPGRADE)
            .iter()
            .any(|p| !p.as_bytes().eq_ignore_ascii_case(b"h2c"))
}

/// One upgrade request through the upstream, answered whatever happens; after a
/// `101`, the tunnel waits in `slot` for the client connection to end as HTTP.
pub(crate) async fn upgrade(
    mut req: Request<Incoming>,
    client: Client,
    target: Arc<Target>,
    open: Stream,
    slot: Arc<Slot>,
) -> Result<Response<RespBody>, Infallible> {
    let Some(http) = target.http.as_deref() else {
        return Ok(Response::new(empty_resp()));
    };
    let started = Instant::now();
    if let Err(why) = headers::check_host(req.headers(), req.uri()) {
        return Ok(refused(&target, http, (Made::BadHost, why), started));
    }
    if req.method() == Method::CONNECT {
        // A tunnel to the authority CONNECT names is a forward proxy's job; sent to
        // an endpoint, a 2xx would turn the connection into a tunnel that nothing
        // here would carry.
        let why = (Made::NotImplemented, "CONNECT is not proxied");
        return Ok(refused(&target, http, why, started));
    }
    http.stats.budget.request(started);
    let on_client = hyper::upgrade::on(&mut req);
    let key = hash_key(&target, http, &req, &client);
    let protocols: Vec<HeaderValue> = req
        .headers()
        .get_all(header::UPGRADE)
        .iter()
        .cloned()
        .collect();
    let Ok((mut out, retry_safe, _)) = outgoing(req, &client.forwarded_for) else {
        let why = (Made::UnknownCoding, "a transfer coding other than chunked");
        return Ok(refused(&target, http, why, started));
    };
    put_back(out.headers_mut(), protocols);
    let template = retry_safe.is_some().then(|| Template::of(&out));
    let mut unanswered = Unanswered {
        upstream: &target.name,
        stats: &http.stats,
        armed: true,
    };
    let tried = tries(&target, http, key.as_deref(), out, template.as_ref()).await;
    unanswered.armed = false;
    let resp = match tried {
        Tried::Switched {
            resp,
            endpoint,
            conn,
            guard,
            addr,
        } => {
            http.stats.upgrades.fetch_add(1, Ordering::Relaxed);
            debug!(upstream = %target.name, endpoint = %addr, "switching protocols: the connection becomes a tunnel");
            *slot.lock() = Some(Tunnel {
                client: on_client,
                endpoint,
                _conn: conn,
                _guard: guard,
                stats: http.stats.clone(),
                bytes: target.stats.clone(),
                idle_timeout: Duration::from_secs(http.settings.limits.tunnel_idle_timeout_s),
                upstream: target.name.clone(),
                addr,
            });
            resp
        }
        Tried::Answered(resp, conn, guard) => {
            let (parts, body) = resp.into_parts();
            let body = Held {
                inner: body,
                _hold: (open, guard, conn),
            };
            Response::from_parts(parts, body.boxed_unsync())
        }
        Tried::Made(resp) => resp,
    };
    http.stats
        .answered(resp.status().as_u16(), started.elapsed());
    Ok(resp)
}

/// `Upgrade` (as the client sent it) and `Connection: upgrade`, put back after
/// the hop-by-hop headers went; a `TE: trailers` put back for this hop goes
/// again (its `Connection: te` is replaced, and a tunnel carries no trailers).
fn put_back(headers: &mut HeaderMap, protocols: Vec<HeaderValue>) {
    headers.remove(header::TE);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    for p in protocols {
        headers.append(header::UPGRADE, p);
    }
}

/// How an upgrade request ended.
enum Tried {
    /// `101`: the answer for the client, and what the tunnel needs.
    Switched {
        resp: Response<RespBody>,
        endpoint: OnUpgrade,
        conn: Task,
        guard: Option<PickGuard>,
        addr: SocketAddr,
    },
    /// Any other answer of the endpoint, with what must live until its body is
    /// done.
    Answered(Response<Incoming>, Task, Option<PickGuard>),
    /// Answered here: 503, 502 or 504.
    Made(Response<RespBody>),
}

/// The tries of an upgrade request (see the module docs).
async fn tries(
    target: &Target,
    http: &HttpUpstream,
    key: Option<&[u8]>,
    req: Request<ReqBody>,
    template: Option<&Template>,
) -> Tried {
    let mut pending = Some(req);
    let mut tried: Vec<SocketAddr> = Vec::new();
    let mut last_error = String::new();
    let mut reached = false;
    for n in 0..http.settings.max_tries {
        let mut choice = match choose(target, http, key, &tried).await {
            Ok(c) => c,
            Err(why) if tried.is_empty() => {
                return Tried::Made(made(target, http, Made::NoEndpoints, &why));
            }
            Err(why) => {
                last_error = why;
                break;
            }
        };
        if n > 0 {
            if reached && !http.stats.budget.try_retry() {
                http.stats.budget_exhausted.fetch_add(1, Ordering::Relaxed);
                last_error = format!("{last_error}; retry budget spent");
                break;
            }
            http.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        let Some(req) = pending
            .take()
            .or_else(|| template.and_then(Template::request))
        else {
            break;
        };
        let addr = dial_addr(&choice, http).await;
        let stream = match http.pool.dial(addr).await {
            Ok(s) => s,
            Err(e) => {
                last_error = dial_failed(&choice, http, addr, &e);
                tried.push(choice.addr);
                pending = Some(req);
                continue;
            }
        };
        let (mut sender, conn) = match hyper::client::conn::http1::Builder::new()
            .max_header_size(http.settings.max_response_header_bytes)
            .handshake::<_, ReqBody>(TokioIo::new(stream))
            .await
        {
            Ok(c) => c,
            Err(e) => {
                last_error = format!("{addr}: HTTP handshake failed: {e}");
                tried.push(choice.addr);
                pending = Some(req);
                continue;
            }
        };
        http.stats.connects.fetch_add(1, Ordering::Relaxed);
        // The connection's own task: it hands the socket to the response's upgrade
        // handle after a 101, or reads the response's body for it. Ended with
        // whatever holds it.
        let conn = Task(tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                debug!(error = %e, "connection of an upgrade request ended with an error");
            }
        }));
        let sent =
            tokio::time::timeout(http.settings.response_timeout, sender.try_send_request(req))
                .await;
        match sent {
            Err(_) => {
                choice.failed();
                let why = format!(
                    "{}: no response head within {:?}",
                    choice.addr, http.settings.response_timeout
                );
                return Tried::Made(made(target, http, Made::Timeout, &why));
            }
            Ok(Ok(resp)) => return answered(resp, conn, &mut choice, (target, http)),
            Ok(Err(mut e)) => {
                choice.failed();
                last_error = format!("{}: {}", choice.addr, e.error());
                tried.push(choice.addr);
                match e.take_message() {
                    Some(req) => pending = Some(req),
                    None if template.is_some() => reached = true,
                    None => break,
                }
            }
        }
    }
    Tried::Made(made(target, http, Made::BadGateway, &last_error))
}

/// The endpoint's answer to an upgrade request, sorted.
fn answered(
    mut resp: Response<Incoming>,
    conn: Task,
    choice: &mut Choice,
    (target, http): (&Target, &HttpUpstream),
) -> Tried {
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (mut parts, body) = resp.into_parts();
        if let Err(coding) = headers::to_client(&mut parts.headers) {
            choice.failed();
            let why = format!("{}: the answer is in {coding}", choice.addr);
            return Tried::Made(made(target, http, Made::BadGateway, &why));
        }
        if let Some(g) = &choice.guard {
            g.report_success();
        }
        return Tried::Answered(Response::from_parts(parts, body), conn, choice.guard.take());
    }
    if let Some(g) = &choice.guard {
        g.report_success();
    }
    let endpoint = hyper::upgrade::on(&mut resp);
    let (mut parts, _) = resp.into_parts();
    let protocols: Vec<HeaderValue> = parts
        .headers
        .get_all(header::UPGRADE)
        .iter()
        .cloned()
        .collect();
    // A 101 has no body: whatever its Transfer-Encoding said, nothing is lost.
    let _ = headers::to_client(&mut parts.headers);
    put_back(&mut parts.headers, protocols);
    Tried::Switched {
        resp: Response::from_parts(parts, empty_resp()),
        endpoint,
        conn,
        guard: choice.guard.take(),
        addr: choice.addr,
    }
}

/// The task of a connection to an endpoint, ended when this is dropped.
struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response body that keeps `H` until it is dropped (hyper drops it once it has
/// been sent, or when the client went away).
struct Held<H> {
    inner: Incoming,
    _hold: H,
}

impl<H: Unpin> Body for Held<H> {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, BoxError>>> {
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client connection switched to another protocol and its endpoint's, to be
/// joined once hyper has handed both sockets over.
pub(crate) struct Tunnel {
    client: OnUpgrade,
    endpoint: OnUpgrade,
    /// The endpoint connection's task, until it has handed its socket over.
    _conn: Task,
    /// Counts the tunnel in flight on its endpoint.
    _guard: Option<PickGuard>,
    stats: Arc<HttpStats>,
    /// The upstream's byte counters (`connections.bytes_*`).
    bytes: Arc<ConnStats>,
    idle_timeout: Duration,
    upstream: Arc<str>,
    addr: SocketAddr,
}

impl Tunnel {
    /// Takes both sockets back from hyper and moves bytes between them as an L4
    /// connection does ([`crate::pump`]: copies, then `splice(2)` for long
    /// transfers), first what hyper had read past each side's head, until both
    /// sides have closed, either fails, or nothing moved for the idle timeout.
    pub(crate) async fn run(self, peer: SocketAddr) {
        let (client, endpoint) = match (self.client.await, self.endpoint.await) {
            (Ok(c), Ok(e)) => (c, e),
            (Err(e), _) | (_, Err(e)) => {
                debug!(upstream = %self.upstream, %peer, endpoint = %self.addr, error = %e, "upgrade not completed; closing");
                return;
            }
        };
        // The sockets hyper was given: the client's behind what `sniff` read, and
        // the endpoint's.
        let (Ok(client), Ok(endpoint)) = (
            client.downcast::<TokioIo<Deferred<Replay>>>(),
            endpoint.downcast::<TokioIo<TcpStream>>(),
        ) else {
            debug!(upstream = %self.upstream, %peer, "an upgraded connection of another kind; closing");
            return;
        };
        // What the worker's turn had not sent yet of the client's answer (the end
        // of the `101`) goes before any byte of the tunnel.
        let (replay, answer_end) = match client.io.into_inner().into_parts() {
            Ok(parts) => parts,
            Err(e) => {
                debug!(upstream = %self.upstream, %peer, error = %e, "the 101 did not reach the client; closing");
                return;
            }
        };
        let Replay {
            head: unread,
            io: mut client_socket,
            ..
        } = replay;
        let mut endpoint_socket = endpoint.io.into_inner();
        // In the order they came: what hyper read past the head, then what it had
        // not read yet of the bytes `sniff` read.
        let (to_endpoint, to_client) = ([client.read_buf, unread], [endpoint.read_buf]);
        let _open = Open::new(&self.stats);
        let moved = AtomicU64::new(0);
        let run = async {
            client_socket.write_all(&answer_end).await?;
            for b in to_endpoint.iter().filter(|b| !b.is_empty()) {
                endpoint_socket.write_all(b).await?;
                count(&self.bytes.bytes_to_upstream, &moved, b.len());
            }
            for b in to_client.iter().filter(|b| !b.is_empty()) {
                client_socket.write_all(b).await?;
                count(&self.bytes.bytes_to_client, &moved, b.len());
            }
            let (client_ended, endpoint_ended) = (AtomicBool::new(false), AtomicBool::new(false));
            let up = pump::Direction {
                from: &client_socket,
                to: &endpoint_socket,
                bytes: &self.bytes.bytes_to_upstream,
                also: Some(&moved),
                ended: &client_ended,
                to_ended: &endpoint_ended,
            };
            let down = pump::Direction {
                from: &endpoint_socket,
                to: &client_socket,
                bytes: &self.bytes.bytes_to_client,
                also: Some(&moved),
                ended: &endpoint_ended,
                to_ended: &client_ended,
            };
            tokio::try_join!(up.run(), down.run())
        };
        tokio::select! {
            ran = run => match ran {
                Ok((up, down)) => debug!(upstream = %self.upstream, %peer, endpoint = %self.addr, up, down, "tunnel closed"),
                Err(e) => debug!(upstream = %self.upstream, %peer, endpoint = %self.addr, error = %e, "tunnel failed; closing both sides"),
            },
            () = idle(&moved, self.idle_timeout) => debug!(upstream = %self.upstream, %peer, endpoint = %self.addr, idle = ?self.idle_timeout, "nothing through the tunnel for its idle timeout; closing both sides"),
        }
    }
}

/// Counts `n` bytes in the upstream's counter and the tunnel's own.
fn count(upstream: &AtomicU64, moved: &AtomicU64, n: usize) {
    upstream.fetch_add(n as u64, Ordering::Relaxed);
    moved.fetch_add(n as u64, Ordering::Relaxed);
}

/// Ends once `moved` (bytes moved either way) has not changed for `timeout`,
/// looked at eight times per timeout (at most once a minute, at least every 100 ms
/// apart): an idle tunnel costs a timer, not a buffer.
async fn idle(moved: &AtomicU64, timeout: Duration) {
    let tick = (timeout / 8).clamp(Duration::from_millis(100), Duration::from_secs(60));
    let mut seen = moved.load(Ordering::Relaxed);
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let now = moved.load(Ordering::Relaxed);
        if now != seen {
            seen = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= timeout {
            return;
        }
    }
}

/// Counts a tunnel open while it lives.
struct Open<'a>(&'a HttpStats);

impl<'a> Open<'a> {
    fn new(stats: &'a HttpStats) -> Self {
        stats.tunnels.fetch_add(1, Ordering::Relaxed);
        Self(stats)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.tunnels.fetch_sub(1, Ordering::Relaxed);
    }
}
