//! The HTTP path: a client connection served by hyper, each request balanced on
//! its own over the upstream's pooled connections.
//!
//! A connection is served on the L4 worker that accepted it, by hyper's HTTP/1.1
//! server (keep-alive; a head larger than `max_header_bytes` gets 431 and a
//! malformed one 400, both from hyper; with no request open for
//! `header_read_timeout_ms`, the connection closes: an idle keep-alive connection,
//! or one whose next head has not come in whole) or, when it opens with the HTTP/2
//! preface (prior knowledge, `h2c` without an upgrade), by hyper's HTTP/2 server
//! (header lists up to `max_header_bytes`, each stream a task on the same worker;
//! with no stream open for `header_read_timeout_ms`, the connection is shut down
//! gracefully, `GOAWAY`). A request counts as open from its head until its
//! response body ends ([`Streams`]: one timer per connection, not one per
//! request). The
//! first bytes are read to tell which ([`sniff`]) and handed to the server
//! before the rest of the socket ([`Replay`]). Both the client's socket and the
//! pooled connections' keep their small writes for the end of the worker's turn
//! ([`crate::outbox`]). Requests go to endpoints as
//! HTTP/1.1 either way. Per request ([`forward`]): the endpoint is
//! picked from the upstream's load balancer (consistent hash keyed by
//! `hash_header` or the client address) or, with `address:`, from the DNS cache's
//! answer; the request goes out over a pooled connection to it (headers rewritten
//! by [`crate::headers`], bodies streamed both ways, never buffered whole). A new
//! connection to an address that came from an SRV target host goes where the DNS
//! cache finds that host now ([`SrvTargets::current`]).
//!
//! What can go wrong, and what the client gets:
//! - nothing to route to: `503` with `Retry-After: 1` and a line naming the
//!   upstream;
//! - the dial fails, or a pooled connection turns out closed before the request
//!   was written (hyper hands the request back): another try, on another endpoint
//!   when there is one; idempotent requests without a body (GET, HEAD, OPTIONS,
//!   PUT, DELETE, TRACE) also when the connection closes before the response head.
//!   Tries are bounded by `max_tries`; retries after a try whose request may have
//!   reached the endpoint also by the retry budget ([`crate::http_stats`]), while a
//!   request never written (failed dial, connection closed first) reached no one and
//!   takes no budget (an endpoint killed before it leaves discovery costs every
//!   request picking it such a retry); a pooled connection found closed before
//!   anything was written costs no try either (the pool is finite). Every failure of an
//!   endpoint is reported to the load balancer's passive ejection;
//! - the endpoint answers `101 Switching Protocols` to a request that asked for no
//!   upgrade (one that did goes by [`crate::tunnel`]): hyper has ended that
//!   connection, and the try failed as if it had closed before the answer;
//! - every try failed: `502`; no response head within `response_timeout_ms` of the
//!   request sent whole: `504`;
//! - a request body that moves no byte for `body_timeout_ms` ([`crate::upload`]):
//!   `408` when the client stopped sending it, `504` when the endpoint stopped taking
//!   it; one the client breaks: `400`. Only the `504` counts against the endpoint;
//! - a response body the endpoint sends no byte of for `body_timeout_ms`
//!   ([`PooledBody`]): cut off, so that hyper closes the client connection short of
//!   the body's end.
//! - a client that takes no byte written to it for `limits.send_timeout_ms`
//!   ([`Unsent`]): its connection is closed (hyper ends it on the failed write).
//!
//! Each 5xx dwara makes is counted and logged at debug with its reason.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::{Bytes, BytesMut};
use dwara_dns_cache::DnsCache;
use dwara_lb::{PickGuard, Policy};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::build::SrvTargets;
use crate::config::{HttpLimitsSection, HttpSettings};
use crate::forward::Target;
use crate::headers;
use crate::http_stats::{HttpStats, Made};
use crate::linger;
use crate::outbox::Deferred;
use crate::pool::{Conn, DialError, Driver, Pool, ReqBody};
use crate::tunnel;
use crate::upload::{Sending, Stand, Upload};

/// The body of responses to clients.
pub(crate) type RespBody = UnsyncBoxBody<Bytes, BoxError>;

/// The error of a response body: hyper's, or dwara's own (a body cut off).
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where the endpoints of an HTTP upstream come from.
#[derive(Debug)]
pub(crate) enum Dial {
    /// Picks of the upstream's load balancer (discovery fills it). With SRV
    /// discovery by DNS, `targets` is the cache through which discovery resolves
    /// the targets that answers name without their addresses, and through which
    /// a new connection to such an address resolves its host again.
    Lb { targets: Option<Arc<SrvTargets>> },
    /// `address: HOST:PORT`: the DNS cache's answer for HOST, in turn.
    Address {
        cache: DnsCache,
        host: String,
        port: u16,
        next: AtomicUsize,
        /// The latest answer a request took an address from: a pooled
        /// connection to an address it no longer holds is not kept, and the
        /// pool's sweeper closes such idle ones as soon as it changes.
        answer: Answer,
    },
}

/// The latest DNS answer of an `address:` upstream that a request took an address
/// from, and word of its changes for the pool's sweeper.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    /// `None` before the first.
    ips: ArcSwapOption<Vec<std::net::IpAddr>>,
    changed: tokio::sync::Notify,
}

impl Answer {
    /// Records `ips` as the latest answer (stored only when it differs).
    pub(crate) fn note(&self, ips: &[std::net::IpAddr]) {
        if self.ips.load().as_deref().map(Vec::as_slice) != Some(ips) {
            self.ips.store(Some(Arc::new(ips.to_vec())));
            // A permit when the sweeper is not waiting: no change is missed.
            self.changed.notify_one();
        }
    }

    /// Whether the latest answer holds `ip` (any does before the first).
    fn holds(&self, ip: std::net::IpAddr) -> bool {
        self.ips
            .load()
            .as_deref()
            .is_none_or(|ips| ips.contains(&ip))
    }

    /// Completes when the answer changes after the last wait.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }
}

impl Dial {
    /// The DNS cache on the upstream's dial path, if it has one.
    pub(crate) fn cache(&self) -> Option<&DnsCache> {
        match self {
            Self::Lb { targets } => targets.as_deref().map(|t| &t.cache),
            Self::Address { cache, .. } => Some(cache),
        }
    }

    /// The SRV targets of an upstream with SRV discovery by DNS.
    pub(crate) fn srv_targets(&self) -> Option<&Arc<SrvTargets>> {
        match self {
            Self::Lb { targets } => targets.as_ref(),
            Self::Address { .. } => None,
        }
    }

    /// Whether a pooled connection to `addr` may stay: always for a load
    /// balancer's endpoints (their sweep asks the set), and for an `address:`
    /// upstream while the latest answer holds it.
    pub(crate) fn in_answer(&self, addr: SocketAddr) -> bool {
        match self {
            Self::Lb { .. } => true,
            Self::Address { port, answer, .. } => addr.port() == *port && answer.holds(addr.ip()),
        }
    }
}

/// What the HTTP path needs of an upstream beside its [`Target`].
#[derive(Debug)]
pub(crate) struct HttpUpstream {
    pub(crate) settings: HttpSettings,
    pub(crate) pool: Arc<Pool>,
    pub(crate) stats: Arc<HttpStats>,
    pub(crate) dial: Arc<Dial>,
    /// One permit per open client connection (`limits.max_connections`), shared
    /// by every worker.
    pub(crate) connections: Arc<Semaphore>,
    /// Cancelled when the dataplane shuts down: connections finish their request
    /// and close.
    pub(crate) shutdown: CancellationToken,
}

/// Serves one client connection until it closes.
pub(crate) async fn serve(
    socket: TcpStream,
    peer: SocketAddr,
    accepted: Arc<Target>,
    current: Arc<ArcSwap<Target>>,
) {
    let Some(http) = accepted.http.clone() else {
        return;
    };
    let Ok(_permit) = http.connections.clone().try_acquire_owned() else {
        http.stats.client_refused.fetch_add(1, Ordering::Relaxed);
        debug!(upstream = %accepted.name, %peer, limit = http.settings.limits.max_connections, "too many client connections; closing");
        return;
    };
    http.stats
        .client_connections
        .fetch_add(1, Ordering::Relaxed);
    let limits = http.settings.limits;
    let header_timeout = Duration::from_millis(limits.header_read_timeout_ms);
    let shutdown = http.shutdown.clone();
    let client = Client {
        forwarded_for: headers::forwarded_for(peer.ip()),
    };
    // Requests are counted open until their response body ends, so that a
    // connection with none open for the header timeout is closed (HTTP/1.1) or told
    // to go away (HTTP/2). One timer per connection, re-armed when it fires, instead
    // of one per request.
    let streams = Arc::new(Streams::new());
    let counted = streams.clone();
    let tunnel = Arc::new(tunnel::Slot::default());
    let upgraded = tunnel.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        // A reload applies to connections already open from their next request on,
        // unless the listen address now belongs to a TCP upstream.
        let loaded = current.load_full();
        let target = if loaded.http.is_some() {
            loaded
        } else {
            accepted.clone()
        };
        let open = Stream::open(&counted);
        if !req.body().is_end_stream() {
            counted.unread.body_came();
        }
        if tunnel::wants(&req) {
            // Boxed: the upgrade path stays out of every other request's future.
            let up = tunnel::upgrade(req, client.clone(), target, open, upgraded.clone());
            return Either::Right(Box::pin(up));
        }
        Either::Left(forward(req, &client, target, open))
    });
    let mut socket = socket;
    let (head, h2) = match tokio::time::timeout(header_timeout, sniff(&mut socket)).await {
        Ok(Ok(sniffed)) => sniffed,
        // Nothing came in time (as an HTTP/1.1 head that does not), or the socket
        // failed: the connection closes.
        Err(_) | Ok(Err(_)) => return http.stats.client_connections_done(),
    };
    let send_timeout = Duration::from_millis(limits.send_timeout_ms);
    let io = TokioIo::new(Deferred::new(Replay {
        head,
        io: socket,
        unsent: Unsent::new(send_timeout, http.stats.clone()),
        streams: streams.clone(),
    }));
    let idle = streams.idle(header_timeout);
    // hyper's state (2 KiB for HTTP/1.1, 3.5 KiB for HTTP/2) is boxed: in this
    // future, which tokio moves whole as it spawns and ends the task, every
    // connection would pay for copying the larger of the two several times.
    let result = match h2 {
        true => {
            let conn = Box::pin(http2_server(&limits).serve_connection(io, service));
            until_shutdown(conn, &shutdown, idle, OnIdle::GoAway, |c| {
                c.get_mut().as_mut().graceful_shutdown();
            })
            .await
        }
        false => {
            let conn = http1_server(&limits).serve_connection(io, service);
            until_shutdown(
                Box::pin(conn.with_upgrades()),
                &shutdown,
                idle,
                OnIdle::Close,
                |c| {
                    c.get_mut().as_mut().graceful_shutdown();
                },
            )
            .await
        }
    };
    if let Err(e) = result {
        debug!(%peer, error = %e, "client connection ended with an error");
    }
    after_hyper(&tunnel, &streams, peer).await;
    http.stats.client_connections_done();
}

/// What is left of a client connection once hyper is done with it: a tunnel, or
/// a lingering close.
async fn after_hyper(tunnel: &tunnel::Slot, streams: &Streams, peer: SocketAddr) {
    // Upgraded: hyper has handed the socket back, and it is a tunnel from now on.
    let upgraded = tunnel.lock().take();
    if let Some(t) = upgraded {
        // Boxed, as the connection's state above: a tunnel's 2 KiB would make
        // every connection's future that large.
        Box::pin(t.run(peer)).await;
    }
    // Closed by hyper with the client still sending (an answer before the whole
    // request): what it sends is read for a while, so that it is not reset.
    if let Some(fd) = streams.unread.take() {
        Box::pin(linger::linger(fd, peer)).await;
    }
}

/// hyper's HTTP/1.1 server as a client connection runs it: `limits`' header size
/// (431 beyond it), heads and bodies written with `send` rather than `writev`.
fn http1_server(limits: &HttpLimitsSection) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .writev(false);
    builder
}

/// hyper's HTTP/2 server as a client connection runs it, with `limits`' header
/// size.
fn http2_server(limits: &HttpLimitsSection) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    builder
}

/// What a client connection does when it has had no request open for the
/// header timeout.
#[derive(Debug, Clone, Copy)]
enum OnIdle {
    /// HTTP/1.1: closes at once. No request is open, so none is lost; a head that
    /// has begun to come in is cut off, as a head not read in time should be.
    Close,
    /// HTTP/2: `GOAWAY`, then the connection ends when the peer has seen it.
    GoAway,
}

/// Drives a client connection (HTTP/1.1 or HTTP/2) to its end; when `shutdown` is
/// cancelled, asks it to finish gracefully (`graceful`) and waits for that; when
/// `idle` ends first, does what `on_idle` says.
async fn until_shutdown<C: Future<Output = hyper::Result<()>>>(
    conn: C,
    shutdown: &CancellationToken,
    idle: impl Future<Output = ()>,
    on_idle: OnIdle,
    graceful: impl FnOnce(Pin<&mut C>),
) -> C::Output {
    tokio::pin!(conn);
    // Why the connection would end before its client closes it, looked at only
    // when one of the two woke the task, not on every poll of a busy connection
    // (the shutdown token's locks are shared by every connection of every worker).
    let mut stop = WhenWoken::new(async {
        tokio::select! {
            () = shutdown.cancelled() => None,
            () = idle => Some(on_idle),
        }
    });
    // The connection first: a request whose head has come in starts (and is counted
    // open) before the idle timer is looked at.
    tokio::select! {
        biased;
        r = conn.as_mut() => r,
        why = &mut stop => match why {
            Some(OnIdle::Close) => {
                debug!("no request on the connection for the header read timeout; closing it");
                Ok(())
            }
            Some(OnIdle::GoAway) => {
                debug!("no stream on the connection for the header read timeout; GOAWAY");
                graceful(conn.as_mut());
                conn.await
            }
            None => {
                graceful(conn.as_mut());
                conn.await
            }
        },
    }
}

/// A future polled only on its first poll and after it woke the task, for a
/// future that is seldom ready raced against one that is polled often.
struct WhenWoken<F> {
    fut: Pin<Box<F>>,
    flag: Arc<WakeFlag>,
    /// The task's waker as the flag has it.
    task: Option<Waker>,
}

/// Whether the future of a [`WhenWoken`] woke, and the task to wake then.
struct WakeFlag {
    woken: AtomicBool,
    task: parking_lot::Mutex<Option<Waker>>,
}

impl<F: Future> WhenWoken<F> {
    fn new(fut: F) -> Self {
        Self {
            fut: Box::pin(fut),
            flag: Arc::new(WakeFlag {
                woken: AtomicBool::new(true),
                task: parking_lot::Mutex::new(None),
            }),
            task: None,
        }
    }
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        if let Some(task) = &*self.task.lock() {
            task.wake_by_ref();
        }
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        if !this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            // Another task's waker (or the first poll): the flag wakes that one, and
            // the future is polled to register with it.
            *this.flag.task.lock() = Some(cx.waker().clone());
            this.task = Some(cx.waker().clone());
            this.flag.woken.store(true, Ordering::Release);
        }
        // Cleared before the poll, so that a wake-up during it is not lost.
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let waker = Waker::from(this.flag.clone());
        this.fut.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

/// The requests (HTTP/2: streams) of a client connection whose response is not
/// over yet, and when the last one ended.
struct Streams {
    open: AtomicUsize,
    /// When the connection started.
    base: Instant,
    /// When the last request ended, in nanoseconds since `base`.
    last_end: AtomicU64,
    /// The client's socket, when hyper shut it down with the client still sending.
    unread: linger::Unread,
}

impl Streams {
    fn new() -> Self {
        Self {
            open: AtomicUsize::new(0),
            base: Instant::now(),
            last_end: AtomicU64::new(0),
            unread: linger::Unread::default(),
        }
    }

    /// Ends once the connection has had no request open for `timeout`. Its timer
    /// is armed once per `timeout`, not once per request.
    async fn idle(&self, timeout: Duration) {
        loop {
            let wake = if self.open.load(Ordering::Acquire) > 0 {
                Instant::now() + timeout
            } else {
                let since = self.base + Duration::from_nanos(self.last_end.load(Ordering::Acquire));
                if since.elapsed() >= timeout && self.open.load(Ordering::Acquire) == 0 {
                    return;
                }
                since + timeout
            };
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}

/// One request counted open until its response body is done or dropped.
pub(crate) struct Stream(Arc<Streams>);

impl Stream {
    fn open(streams: &Arc<Streams>) -> Self {
        streams.open.fetch_add(1, Ordering::AcqRel);
        Self(streams.clone())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let ended = u64::try_from(self.0.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.last_end.store(ended, Ordering::Release);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The client preface of HTTP/2 with prior knowledge (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the first bytes of a client connection: whether they are the HTTP/2
/// preface (prior knowledge), and the bytes read, to be served again by
/// [`Replay`]. Reads until they match the preface whole or differ from it; the
/// first read is usually the whole request head of an HTTP/1.1 client.
async fn sniff(socket: &mut TcpStream) -> std::io::Result<(Bytes, bool)> {
    let mut buf = BytesMut::with_capacity(SNIFF_BUF);
    loop {
        let n = socket.read_buf(&mut buf).await?;
        let k = buf.len().min(H2_PREFACE.len());
        if n == 0 || buf[..k] != H2_PREFACE[..k] {
            return Ok((buf.freeze(), false));
        }
        if k == H2_PREFACE.len() {
            return Ok((buf.freeze(), true));
        }
    }
}

/// The size of the first read of a client connection: nginx's
/// `client_header_buffer_size`. Most request heads fit; a longer one is read on
/// by hyper behind these bytes. Within glibc's per-thread cache (chunks up to
/// 1,032 bytes), where a 4 KiB buffer took a trip through its arenas per
/// connection.
const SNIFF_BUF: usize = 1024;

/// A client socket with the bytes [`sniff`] read put back in front of it, whose
/// writes fail once the client has taken no byte for the send timeout.
pub(crate) struct Replay {
    /// What is left of those bytes.
    pub(crate) head: Bytes,
    pub(crate) io: TcpStream,
    pub(crate) unsent: Unsent,
    /// The connection's requests, and its socket's duplicate kept at shutdown.
    streams: Arc<Streams>,
}

/// The send timeout of a client connection: a timer armed when a write finds the
/// socket full after one that did not (a write that goes through costs nothing
/// here), and an error for the write still waiting when it fires. hyper then ends
/// the connection.
pub(crate) struct Unsent {
    timeout: Duration,
    /// Made on the first write that waits.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
    stats: Arc<HttpStats>,
}

impl Unsent {
    fn new(timeout: Duration, stats: Arc<HttpStats>) -> Self {
        Self {
            timeout,
            timer: None,
            armed: false,
            stats,
        }
    }

    /// What a write that found the socket full returns: still pending, or the
    /// error once the client has taken nothing for the timeout.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            self.armed = true;
            timer.as_mut().reset(deadline);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.stats.send_timeouts.fetch_add(1, Ordering::Relaxed);
        debug!(timeout = ?self.timeout, "the client took no byte for the send timeout; closing its connection");
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the client took no byte for {:?}", self.timeout),
        )))
    }

    /// Passes a write's outcome on: pending (timed), or done (the timer stops).
    fn written<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if polled.is_pending() {
            return self.waiting(cx);
        }
        self.armed = false;
        polled
    }
}

impl std::os::fd::AsFd for Replay {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.io.as_fd()
    }
}

impl AsyncRead for Replay {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            buf.put_slice(&self.head.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replay {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.unsent.written(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.unsent.written(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.streams.unread.note(&self.io);
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Whether a request may be sent again after it went out without an answer.
fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// A request head kept to send the request again.
///
/// Its headers are packed into one buffer (each name and value after its length)
/// rather than kept as a second `HeaderMap`: cloning a map costs two allocations
/// and a reference count taken (and later dropped) on every value, for every
/// request, when only a request lost on its way (rare) is ever sent again. The
/// map is rebuilt from the buffer then.
pub(crate) struct Template {
    method: Method,
    uri: Uri,
    /// Each header: its name's length (4 bytes, little-endian), its name, its
    /// value's length, its value; in the order of the request's map.
    packed: Vec<u8>,
    /// How many headers `packed` holds.
    count: usize,
}

impl Template {
    /// A copy of `req`'s head, to send it again without a body.
    pub(crate) fn of<B>(req: &Request<B>) -> Self {
        Self::from_head(req.method(), req.uri(), req.headers())
    }

    fn from_head(method: &Method, uri: &Uri, headers: &HeaderMap) -> Self {
        const LEN: usize = size_of::<u32>();
        let size = headers
            .iter()
            .map(|(n, v)| 2 * LEN + n.as_str().len() + v.len())
            .sum();
        let mut packed = Vec::with_capacity(size);
        for (name, value) in headers {
            for part in [name.as_str().as_bytes(), value.as_bytes()] {
                // A header is at most `limits.max_header_bytes` (1 MiB) long.
                let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
                packed.extend_from_slice(&len.to_le_bytes());
                packed.extend_from_slice(part);
            }
        }
        Self {
            method: method.clone(),
            uri: uri.clone(),
            packed,
            count: headers.len(),
        }
    }

    /// The request again, without a body; `None` if its headers cannot be
    /// rebuilt (they were valid when packed, and a map held them, so this does
    /// not happen; the map's size limits are checked rather than left to panic).
    pub(crate) fn request(&self) -> Option<Request<ReqBody>> {
        let mut headers = HeaderMap::try_with_capacity(self.count).ok()?;
        let mut rest = self.packed.as_slice();
        while !rest.is_empty() {
            let (name, after) = unpack(rest)?;
            let (value, after) = unpack(after)?;
            rest = after;
            headers
                .try_append(
                    header::HeaderName::from_bytes(name).ok()?,
                    HeaderValue::from_bytes(value).ok()?,
                )
                .ok()?;
        }
        let mut req = Request::new(empty());
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = headers;
        Some(req)
    }
}

/// The first part of `packed` (after its length) and what follows it.
fn unpack(packed: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = packed.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
    (len <= rest.len()).then(|| rest.split_at(len))
}

fn empty() -> ReqBody {
    http_body_util::Empty::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A request as it goes to an endpoint, a template to send it again when that is
/// safe, and the watch on its body when it has one.
pub(crate) type Outgoing = (Request<ReqBody>, Option<Template>, Option<Arc<Upload>>);

/// The request as it goes to an endpoint: origin-form URI, HTTP/1.1, headers
/// rewritten; and a template to send it again when that is safe. [`headers::UnknownCoding`]
/// for a body in a transfer coding other than chunked, which is not sent.
pub(crate) fn outgoing(
    req: Request<Incoming>,
    client: &HeaderValue,
) -> Result<Outgoing, headers::UnknownCoding> {
    let (mut parts, body) = req.into_parts();
    // Host and port only: `Host` carries no user information.
    let authority = parts.uri.host().map(|host| match parts.uri.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    });
    headers::rewrite_request(&mut parts.headers, client, authority.as_deref())?;
    if parts.version == Version::HTTP_2 {
        headers::join_cookies(&mut parts.headers);
    }
    if let Some(pq) = parts.uri.path_and_query()
        && parts.uri.scheme().is_some()
        && let Ok(uri) = Uri::try_from(pq.as_str())
    {
        parts.uri = uri;
    }
    parts.version = Version::HTTP_11;
    let template = (body.is_end_stream() && idempotent(&parts.method))
        .then(|| Template::from_head(&parts.method, &parts.uri, &parts.headers));
    if body.is_end_stream() {
        return Ok((Request::from_parts(parts, empty()), template, None));
    }
    if body.size_hint().exact().is_none() {
        // Of unknown length (chunked, or HTTP/2 without a length): said so, since
        // hyper's client sends no body at all for a GET or HEAD of unknown
        // length unless the request asks for chunks (it takes them to have
        // none), and the client's body would be lost. For other methods hyper
        // chooses chunks itself.
        parts.headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
    }
    let (body, upload) = Sending::new(body);
    Ok((
        Request::from_parts(parts, body.boxed_unsync()),
        template,
        Some(upload),
    ))
}

/// An endpoint to try: its address and, from the load balancer, the pick guard
/// that counts the request in flight and takes its outcome.
pub(crate) struct Choice {
    pub(crate) addr: SocketAddr,
    pub(crate) guard: Option<PickGuard>,
}

impl Choice {
    pub(crate) fn failed(&self) {
        if let Some(g) = &self.guard {
            g.report_failure();
        }
    }
}

/// Picks an endpoint not tried yet when there is one (a few picks, then any).
///
/// An `address:` upstream asks its DNS cache, a future boxed so that it stays out
/// of the request's future, which every request moves (into hyper's dispatcher)
/// whichever upstream it is for.
pub(crate) async fn choose(
    target: &Target,
    http: &HttpUpstream,
    key: Option<&[u8]>,
    tried: &[SocketAddr],
) -> Result<Choice, String> {
    match &*http.dial {
        Dial::Lb { .. } => pick(target, key, tried),
        Dial::Address {
            cache,
            host,
            port,
            next,
            answer,
        } => Box::pin(from_cache(cache, host, (*port, next, answer), tried)).await,
    }
}

/// A pick of the load balancer not tried yet when there is one: under
/// `consistent_hash` the key's next endpoint after those tried (a key's own
/// endpoint is the same for every pick), otherwise a few picks, then any.
fn pick(target: &Target, key: Option<&[u8]>, tried: &[SocketAddr]) -> Result<Choice, String> {
    if let Some(k) = key {
        let guard = target
            .lb
            .pick_by_key_excluding(k, tried)
            .map_err(|_| "no endpoints".to_owned())?;
        return Ok(Choice {
            addr: guard.addr(),
            guard: Some(guard),
        });
    }
    let mut last = None;
    for _ in 0..4 {
        let guard = target.lb.pick().map_err(|_| "no endpoints".to_owned())?;
        if !tried.contains(&guard.addr()) {
            return Ok(Choice {
                addr: guard.addr(),
                guard: Some(guard),
            });
        }
        last = Some(guard);
    }
    let guard = last.ok_or_else(|| "no endpoints".to_owned())?;
    Ok(Choice {
        addr: guard.addr(),
        guard: Some(guard),
    })
}

/// An address of the DNS cache's answer for `host`, in turn, not tried yet when
/// there is one.
async fn from_cache(
    cache: &DnsCache,
    host: &str,
    (port, next, answer): (u16, &AtomicUsize, &Answer),
    tried: &[SocketAddr],
) -> Result<Choice, String> {
    let ips = cache
        .resolve(host)
        .await
        .map_err(|e| format!("{host}: {e}"))?;
    if ips.is_empty() {
        return Err(format!("{host}: no addresses"));
    }
    answer.note(&ips);
    let start = next.fetch_add(1, Ordering::Relaxed);
    let addrs = (0..ips.len()).map(|i| SocketAddr::new(ips[(start + i) % ips.len()], port));
    let mut first = None;
    for addr in addrs {
        if !tried.contains(&addr) {
            return Ok(Choice { addr, guard: None });
        }
        first.get_or_insert(addr);
    }
    let addr = first.ok_or_else(|| format!("{host}: no addresses"))?;
    Ok(Choice { addr, guard: None })
}

/// An answer made here (a 5xx, or a 408 or 400 for a request body that did not
/// come): counted, logged at debug with why, one line of body.
///
/// Cold, as every path to an answer made here: laid out away from the path of a
/// request an endpoint answers, so that path takes fewer lines of the
/// instruction cache.
#[cold]
pub(crate) fn made(
    target: &Target,
    http: &HttpUpstream,
    why: Made,
    detail: &str,
) -> Response<RespBody> {
    http.stats.made(why);
    let (status, text) = match why {
        Made::NoEndpoints => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no endpoints for upstream {}\n", target.name),
        ),
        Made::BadGateway => (
            StatusCode::BAD_GATEWAY,
            format!("no endpoint of upstream {} answered\n", target.name),
        ),
        Made::Timeout => (
            StatusCode::GATEWAY_TIMEOUT,
            format!("upstream {} did not answer in time\n", target.name),
        ),
        Made::ClientTimeout => (
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not come in time\n".to_owned(),
        ),
        Made::BadRequest => (
            StatusCode::BAD_REQUEST,
            "the request body could not be read\n".to_owned(),
        ),
        Made::BadHost => (StatusCode::BAD_REQUEST, format!("{detail}\n")),
        Made::UnknownCoding => (
            StatusCode::NOT_IMPLEMENTED,
            format!("the request body is in {detail}\n"),
        ),
        Made::NotImplemented => (
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "CONNECT is not proxied by upstream {} (a tcp upstream forwards a proxy's connections)\n",
                target.name
            ),
        ),
    };
    debug!(upstream = %target.name, status = status.as_u16(), why = detail, "answered by dwara");
    let mut resp = Response::new(
        Full::new(Bytes::from(text))
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    match why {
        Made::NoEndpoints => {
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // The rest of the request body is not read: where the next request would
        // begin is unknown, and the connection closes after this answer.
        Made::ClientTimeout | Made::BadRequest | Made::BadHost | Made::UnknownCoding => {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        Made::BadGateway | Made::Timeout | Made::NotImplemented => {}
    }
    resp
}

/// The answer [`made`] here to a request refused before it went anywhere (a bad
/// `Host`, `CONNECT`, a transfer coding other than chunked), counted among the
/// upstream's answers as every other is.
#[cold]
pub(crate) fn refused(
    target: &Target,
    http: &HttpUpstream,
    (why, detail): (Made, &str),
    started: Instant,
) -> Response<RespBody> {
    let resp = made(target, http, why, detail);
    http.stats
        .answered(resp.status().as_u16(), started.elapsed());
    resp
}

/// The client of a connection, as each of its requests needs it.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    /// Its address as this hop appends it to `X-Forwarded-For` (made once).
    pub(crate) forwarded_for: HeaderValue,
}

/// One request through the upstream, answered whatever happens.
///
/// What needs only the request is done before the future is made, and every
/// rarely taken path (a new connection, the DNS cache of an `address:` upstream)
/// is boxed: hyper moves each request's future into its dispatcher, and every byte
/// of it is copied. (Hence also the references: an `async fn` keeps a copy of each
/// argument it takes by value.)
///
/// The client is borrowed: only the work done before the future is made needs it
/// (a clone per request would take and drop a reference count).
pub(crate) fn forward(
    req: Request<Incoming>,
    client: &Client,
    target: Arc<Target>,
    open: Stream,
) -> impl Future<Output = Result<Response<RespBody>, Infallible>> + Send + use<> {
    let started = Instant::now();
    // Refused here (the answer to make, and why): the request goes to no endpoint.
    // Beside the prepared request rather than around it, which would add to what
    // is moved of every request's future.
    let mut refusal = None;
    let mut prepared = target.http.as_deref().and_then(|http| {
        let has_host = match headers::check_host(req.headers(), req.uri()) {
            // RFC 9112 §3.2: an HTTP/1.1 request must name its host. (An HTTP/1.0
            // one need not, and goes on with the endpoint's address.)
            Ok(false) if req.version() == Version::HTTP_11 => {
                refusal = Some((Made::BadHost, "an HTTP/1.1 request without Host"));
                return None;
            }
            Ok(h) => h,
            Err(why) => {
                refusal = Some((Made::BadHost, why));
                return None;
            }
        };
        http.stats.budget.request(started);
        let key = hash_key(&target, http, &req, client);
        let Ok((req, template, upload)) = outgoing(req, &client.forwarded_for) else {
            refusal = Some((Made::UnknownCoding, "a transfer coding other than chunked"));
            return None;
        };
        Some(Prepared {
            key,
            has_host,
            pending: Some(req),
            template,
            upload,
            open: Some(open),
        })
    });
    async move {
        let Some(http) = target.http.as_ref() else {
            return Ok(Response::new(empty_resp()));
        };
        let Some(prepared) = prepared.as_mut() else {
            let why = refusal.unwrap_or((Made::BadRequest, "refused"));
            return Ok(refused(&target, http, why, started));
        };
        let mut unanswered = Unanswered {
            upstream: &target.name,
            stats: &http.stats,
            armed: true,
        };
        let resp = tries(&target, http, prepared).await;
        unanswered.armed = false;
        http.stats
            .answered(resp.status().as_u16(), started.elapsed());
        Ok(resp)
    }
}

/// Counts a request whose future is dropped before its answer is made: hyper drops
/// it when the client goes away (see [`HttpStats::cancelled`]). Disarmed once the
/// answer is there.
pub(crate) struct Unanswered<'a> {
    pub(crate) upstream: &'a str,
    pub(crate) stats: &'a HttpStats,
    pub(crate) armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            debug!(
                upstream = self.upstream,
                "request cancelled before its answer: the client went away"
            );
        }
    }
}

/// A request ready to go to an endpoint.
struct Prepared {
    /// Its hash key under `consistent_hash`.
    key: Option<Vec<u8>>,
    /// Whether the client sent a `Host`.
    has_host: bool,
    /// The request, until a try takes it.
    pending: Option<Request<ReqBody>>,
    /// Its head, to send it again when that is safe.
    template: Option<Template>,
    /// How its body is getting on, when it has one.
    upload: Option<Arc<Upload>>,
    /// Counts it open on its client connection: handed to the response body from
    /// the endpoint, else dropped with the answer made here.
    open: Option<Stream>,
}

impl Prepared {
    /// The request for a try on `addr`: the pending one, else a copy made from the
    /// template; with `Host: addr` when the client sent no `Host` (HTTP/1.0, or
    /// HTTP/2 without `:authority`).
    fn request(&mut self, addr: SocketAddr) -> Option<Request<ReqBody>> {
        let mut req = self
            .pending
            .take()
            .or_else(|| self.template.as_ref().and_then(Template::request))?;
        if !self.has_host
            && let Ok(v) = HeaderValue::from_str(&addr.to_string())
        {
            req.headers_mut().insert(header::HOST, v);
        }
        Some(req)
    }
}

/// The tries of one request.
async fn tries(target: &Target, http: &Arc<HttpUpstream>, p: &mut Prepared) -> Response<RespBody> {
    // Endpoints whose try failed (a list only once one has).
    let mut tried = Vec::new();
    let mut last_error = String::new();
    let mut tries = 0;
    // A pooled connection found closed before the request was written costs no
    // try: the endpoint closed it while idle. At most this many per request.
    let mut free_left = 3u32;
    let mut free = false;
    // Whether a try so far may have reached an endpoint (its request written): only
    // then does a retry take from the retry budget, which guards endpoints against
    // retries multiplying their load. A request that was never written (the dial
    // failed, or the connection closed first) reached no one: trying it elsewhere
    // adds nothing to any endpoint's load, and `max_tries` still bounds it.
    let mut reached = false;
    while tries < http.settings.max_tries {
        let mut choice = match choose(target, http, p.key.as_deref(), &tried).await {
            Ok(c) => c,
            Err(why) if tried.is_empty() => return made(target, http, Made::NoEndpoints, &why),
            Err(why) => {
                last_error = why;
                break;
            }
        };
        if !free {
            if tries > 0 && reached && !http.stats.budget.try_retry() {
                http.stats.budget_exhausted.fetch_add(1, Ordering::Relaxed);
                last_error = format!("{last_error}; retry budget spent");
                break;
            }
            if tries > 0 {
                http.stats.retries.fetch_add(1, Ordering::Relaxed);
            }
            tries += 1;
        }
        if p.pending.is_none() && p.template.is_none() {
            break;
        }
        free = false;
        let mut conn = match connection(&choice, http).await {
            Ok(c) => c,
            Err(why) => {
                // Not written: the request is still pending.
                last_error = why;
                tried.push(choice.addr);
                if every_endpoint_ejected(target) {
                    // Only ejected endpoints left, and they still fail: a fleet
                    // that is down is not dialled once more per try.
                    break;
                }
                continue;
            }
        };
        // Taken only now (and the future made at once), so that the request is not
        // kept beside the future that holds it.
        let Some(req) = p.request(choice.addr) else {
            break;
        };
        // Sent with no task to wake: this task drives the connection next.
        conn.driver.detach();
        let answer = conn.sender.try_send_request(req);
        let timers = Timers {
            response: http.settings.response_timeout,
            body: http.settings.body_timeout,
        };
        let sent = exchange(&mut conn.driver, answer, timers, p.upload.as_deref()).await;
        let upload = p.upload.as_deref().map(Upload::stand);
        match outcome(sent, conn, &mut choice, target, http, &mut p.open, upload) {
            Sent::Answered(resp) => return resp,
            Sent::Unsent {
                req,
                why,
                idle_closed,
            } => {
                p.pending = Some(req);
                last_error = why;
                if idle_closed && free_left > 0 {
                    free_left -= 1;
                    // The endpoint is not to blame: it may be chosen again.
                    free = true;
                } else {
                    tried.push(choice.addr);
                }
            }
            Sent::Lost(why) => {
                reached = true;
                last_error = why;
                tried.push(choice.addr);
                if p.template.is_none() {
                    break;
                }
            }
            Sent::Stopped(stop) => return stopped(target, http, choice.addr, stop),
        }
    }
    no_try_answered(target, http, reached, &last_error)
}

/// The answer to a request no try got an answer for: a 503 when none reached an
/// endpoint and every endpoint is ejected (there is nothing to route to), else a
/// 502.
#[cold]
fn no_try_answered(
    target: &Target,
    http: &HttpUpstream,
    reached: bool,
    last_error: &str,
) -> Response<RespBody> {
    if !reached && every_endpoint_ejected(target) {
        let why = format!("every endpoint ejected and unreachable ({last_error})");
        return made(target, http, Made::NoEndpoints, &why);
    }
    made(target, http, Made::BadGateway, last_error)
}

pub(crate) fn empty_resp() -> RespBody {
    http_body_util::Empty::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// The hash key of a request under `consistent_hash`.
pub(crate) fn hash_key(
    target: &Target,
    http: &HttpUpstream,
    req: &Request<Incoming>,
    client: &Client,
) -> Option<Vec<u8>> {
    if target.policy != Policy::ConsistentHash {
        return None;
    }
    let from_header = http
        .settings
        .hash_header
        .as_ref()
        .and_then(|h| req.headers().get(h))
        .map(|v| v.as_bytes().to_vec());
    // The client's address as text (IPv4-mapped addresses in their IPv4 form).
    Some(from_header.unwrap_or_else(|| client.forwarded_for.as_bytes().to_vec()))
}

/// How one try ended.
enum Sent {
    /// A response (its body streams on).
    Answered(Response<RespBody>),
    /// The request was not written: here it is, to try again.
    Unsent {
        req: Request<ReqBody>,
        why: String,
        /// On a pooled connection the endpoint had closed while it was idle.
        idle_closed: bool,
    },
    /// The request went (at least partly) and no response head came.
    Lost(String),
    /// The request is answered here, with no other try.
    Stopped(Stop),
}

/// Why a request gets no other try, and is answered here.
enum Stop {
    /// No response head within the response timeout.
    TimedOut,
    /// The endpoint took no byte of the request body for the body timeout.
    NotTaken,
    /// The client sent no byte of its request body for the body timeout.
    ClientStalled,
    /// The client's side failed while its request body was being sent: not the
    /// endpoint's doing, and not to try again.
    ClientFailed(String),
}

/// The answer made here to a request stopped on its try of `addr`.
#[cold]
fn stopped(
    target: &Target,
    http: &HttpUpstream,
    addr: SocketAddr,
    stop: Stop,
) -> Response<RespBody> {
    let timeouts = &http.settings;
    match stop {
        Stop::TimedOut => {
            let why = format!(
                "{addr}: no response head within {:?}",
                timeouts.response_timeout
            );
            made(target, http, Made::Timeout, &why)
        }
        Stop::NotTaken => {
            let why = format!(
                "{addr}: took no byte of the request body for {:?}",
                timeouts.body_timeout
            );
            made(target, http, Made::Timeout, &why)
        }
        Stop::ClientStalled => {
            let why = format!(
                "the client sent no byte of its request body for {:?}",
                timeouts.body_timeout
            );
            made(target, http, Made::ClientTimeout, &why)
        }
        Stop::ClientFailed(why) => made(target, http, Made::BadRequest, &why),
    }
}

/// A connection to `choice`: a pooled one that is ready, or a new one (to where
/// the SRV target the address came from is now, see [`SrvTargets::current`]).
async fn connection(choice: &Choice, http: &HttpUpstream) -> Result<Conn, String> {
    if let Some(conn) = http.pool.checkout(choice.addr) {
        http.stats.reused.fetch_add(1, Ordering::Relaxed);
        return Ok(conn);
    }
    // Boxed: the futures of the dial, the handshake and the DNS cache stay out of
    // every request's future (which hyper moves), and a new connection costs far
    // more than this allocation.
    Box::pin(dial(choice, http)).await
}

/// A new connection to `choice` (to where the SRV target its address came from
/// is now).
async fn dial(choice: &Choice, http: &HttpUpstream) -> Result<Conn, String> {
    let addr = dial_addr(choice, http).await;
    http.pool
        .connect(addr, &http.stats, http.settings.max_response_header_bytes)
        .await
        .map_err(|e| dial_failed(choice, http, addr, &e))
}

/// Where a new connection to `choice` goes: its address, or where the SRV target
/// the address came from is now.
pub(crate) async fn dial_addr(choice: &Choice, http: &HttpUpstream) -> SocketAddr {
    match &*http.dial {
        Dial::Lb {
            targets: Some(targets),
        } => targets.current(choice.addr).await,
        _ => choice.addr,
    }
}

/// Whether the upstream has endpoints and every one of them is ejected (picks
/// then ignore ejection). Asked only after a failed dial, where copying the
/// endpoints' figures costs little beside the failure.
#[cold]
fn every_endpoint_ejected(target: &Target) -> bool {
    let eps = target.lb.stats().endpoints;
    !eps.is_empty() && eps.iter().all(|e| e.ejected)
}

/// Counts and reports a failed dial of `choice` (to `addr`), and says why.
#[cold]
pub(crate) fn dial_failed(
    choice: &Choice,
    http: &HttpUpstream,
    addr: SocketAddr,
    e: &DialError,
) -> String {
    http.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
    choice.failed();
    if addr == choice.addr {
        format!("{addr}: {e}")
    } else {
        format!("{addr} (where {} moved): {e}", choice.addr)
    }
}

/// The timeouts of a try.
#[derive(Debug, Clone, Copy)]
struct Timers {
    /// From the request sent whole to the response head.
    response: Duration,
    /// For a request body that moves no byte.
    body: Duration,
}

/// How an exchange ended.
enum Exchanged<T> {
    /// hyper's answer.
    Answered(T),
    /// No response head within the response timeout of the request sent whole.
    TimedOut,
    /// The request body moved no byte for the body timeout: `Waiting` for the
    /// client, or `Moving` (the endpoint's connection took none).
    BodyStalled(Stand),
}

/// Drives `driver` for this task until `answer`, hyper's answer to a request sent
/// on its connection, is ready, or the connection's timer fires: armed with the
/// response timeout once the request has been sent whole (at once for a request
/// without a body), and before that with the body timeout, again each time the
/// body (`upload`) moves.
///
/// Only the driver completes the answer, in this task's polls: the answer is
/// polled with no waker (the task wakes for the connection's socket) and outside
/// tokio's cooperative budget (whose wake-up would go to that no waker).
async fn exchange<F: Future>(
    driver: &mut Driver,
    answer: F,
    timers: Timers,
    upload: Option<&Upload>,
) -> Exchanged<F::Output> {
    let mut answer = std::pin::pin!(tokio::task::unconstrained(answer));
    // The body's progress as last seen, while it is being sent.
    let mut sending = upload.filter(|u| u.stand() != Stand::Ended).map(|u| {
        driver.arm(timers.body);
        (u, u.frames())
    });
    if sending.is_none() {
        driver.arm(timers.response);
    }
    std::future::poll_fn(|cx| {
        // Ready once the connection ended: hyper has then answered with an error.
        let _ = driver.poll(cx);
        let quiet = &mut Context::from_waker(Waker::noop());
        if let Poll::Ready(answered) = answer.as_mut().poll(quiet) {
            return Poll::Ready(Exchanged::Answered(answered));
        }
        if let Some((upload, seen)) = &mut sending {
            match upload.stand() {
                Stand::Ended => {
                    sending = None;
                    driver.arm(timers.response);
                }
                // Failed: the connection ends, and hyper answers with an error.
                stand => {
                    let frames = upload.frames();
                    if frames != *seen {
                        *seen = frames;
                        driver.arm(timers.body);
                    }
                    return driver.expired(cx).map(|()| Exchanged::BodyStalled(stand));
                }
            }
        }
        driver.expired(cx).map(|()| Exchanged::TimedOut)
    })
    .await
}

/// How the try of a request on `conn` ended (`sent`: how its exchange did;
/// `upload`: where its body stands, when it has one).
fn outcome(
    sent: Exchanged<
        Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<ReqBody>>>,
    >,
    conn: Conn,
    choice: &mut Choice,
    target: &Target,
    http: &Arc<HttpUpstream>,
    open: &mut Option<Stream>,
    upload: Option<Stand>,
) -> Sent {
    let sent = match sent {
        Exchanged::Answered(sent) => sent,
        Exchanged::TimedOut => {
            choice.failed();
            return Sent::Stopped(Stop::TimedOut);
        }
        Exchanged::BodyStalled(stand) => return stalled(stand, choice),
    };
    match sent {
        // A switch of protocols nobody asked for (a request that did is not sent
        // on a pooled connection, see `crate::tunnel`): hyper has ended the
        // connection, and the client could make nothing of it.
        Ok(resp) if resp.status() == StatusCode::SWITCHING_PROTOCOLS => {
            choice.failed();
            Sent::Lost(unasked_upgrade(choice.addr))
        }
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            if let Err(coding) = headers::to_client(&mut parts.headers) {
                // Dropped with its connection: the body is not read.
                choice.failed();
                return Sent::Lost(format!("{}: the answer is in {coding}", choice.addr));
            }
            if let Some(g) = &choice.guard {
                g.report_success();
            }
            let keep = match &*http.dial {
                Dial::Lb { .. } => Keep::InSet(target.lb.clone()),
                Dial::Address { .. } => Keep::InAnswer(http.dial.clone()),
            };
            let body = PooledBody::new(
                body,
                conn,
                http.clone(),
                keep,
                choice.guard.take(),
                open.take(),
            );
            Sent::Answered(Response::from_parts(parts, body.boxed_unsync()))
        }
        Err(e) => not_answered(e, &conn, choice, http, upload),
    }
}

/// [`outcome`] of an exchange whose request body stalled (`stand`: where it
/// stood). The connection is dropped: with a request half sent, it is of no use.
#[cold]
fn stalled(stand: Stand, choice: &Choice) -> Sent {
    match stand {
        Stand::Waiting => Sent::Stopped(Stop::ClientStalled),
        Stand::Failed => Sent::Stopped(Stop::ClientFailed(
            "the request body from the client failed".to_owned(),
        )),
        _ => {
            choice.failed();
            Sent::Stopped(Stop::NotTaken)
        }
    }
}

/// Why a `101` to a request that asked for no upgrade is lost.
#[cold]
fn unasked_upgrade(addr: SocketAddr) -> String {
    format!("{addr}: 101 Switching Protocols to a request that asked for no upgrade")
}

/// [`outcome`] of a request hyper gave no answer to: the request back when it was
/// not written, else lost.
#[cold]
fn not_answered(
    mut e: hyper::client::conn::TrySendError<Request<ReqBody>>,
    conn: &Conn,
    choice: &Choice,
    http: &HttpUpstream,
    upload: Option<Stand>,
) -> Sent {
    let why = if e.error().is_parse_too_large() {
        format!(
            "{}: a response head larger than max_response_header_bytes ({})",
            choice.addr, http.settings.max_response_header_bytes
        )
    } else {
        format!("{}: {}", choice.addr, e.error())
    };
    if upload == Some(Stand::Failed) {
        return Sent::Stopped(Stop::ClientFailed(format!(
            "the request body from the client failed ({why})"
        )));
    }
    match e.take_message() {
        Some(req) => {
            if !conn.reused {
                choice.failed();
            }
            Sent::Unsent {
                req,
                why,
                idle_closed: conn.reused,
            }
        }
        None => {
            choice.failed();
            Sent::Lost(why)
        }
    }
}

/// Whether a connection goes back to the pool after its response.
enum Keep {
    /// While its endpoint is in the load balancer's set (a connection dialled to
    /// where an SRV target moved is not, until discovery's next refresh).
    InSet(Arc<dwara_lb::UpstreamLb>),
    /// While the latest DNS answer of an `address:` upstream holds its address.
    InAnswer(Arc<Dial>),
}

impl Keep {
    fn keep(&self, addr: SocketAddr) -> bool {
        match self {
            Self::InSet(lb) => lb.endpoints().contains(addr),
            Self::InAnswer(dial) => dial.in_answer(addr),
        }
    }
}

/// A response body from an endpoint that drives its connection while it is read
/// and puts it back into the pool when it has been read to its end; cut off (an
/// error, which makes hyper close the client connection) when the endpoint sends no
/// byte of it for the body timeout.
struct PooledBody {
    inner: Incoming,
    conn: Option<Conn>,
    up: Arc<HttpUpstream>,
    keep: Keep,
    /// Whether the connection's timer runs for the body timeout: armed when a poll
    /// finds nothing after one that found a frame (or the first), so that the time
    /// the client takes to read is not counted.
    armed: bool,
    /// Counts the request in flight on its endpoint until the body is done.
    guard: Option<PickGuard>,
    /// Counts the request open on its client connection until the body is done.
    open: Option<Stream>,
    /// The endpoint's body failed (it closed the connection before the body's
    /// end, or sent what is not HTTP): the error, held back for one poll.
    failed: Option<BoxError>,
}

impl PooledBody {
    fn new(
        inner: Incoming,
        conn: Conn,
        up: Arc<HttpUpstream>,
        keep: Keep,
        guard: Option<PickGuard>,
        open: Option<Stream>,
    ) -> Self {
        let mut body = Self {
            inner,
            conn: Some(conn),
            up,
            keep,
            armed: false,
            guard,
            open,
            failed: None,
        };
        if body.inner.is_end_stream() {
            body.release();
        }
        body
    }

    /// Gives up on the body: the connection is closed (dropped, not pooled), the
    /// cut counted and logged.
    #[cold]
    fn cut_off(&mut self) -> BoxError {
        let timeout = self.up.settings.body_timeout;
        if let Some(conn) = self.conn.take() {
            debug!(endpoint = %conn.addr, ?timeout, "response body cut off: the endpoint sent nothing for the body timeout");
        }
        self.up.stats.body_timeouts.fetch_add(1, Ordering::Relaxed);
        Box::new(BodyTimedOut(timeout))
    }

    /// The body failed (`polled` holds the error): the connection goes, and the
    /// error is held back for one poll, the task woken for it. hyper ends the
    /// client's connection on the error, and what it has written of the
    /// response (the head, the body so far) but not sent yet would go with it:
    /// an endpoint that closed right after a first piece of its body left the
    /// client an empty reply. Now the client gets what came, then the close.
    #[cold]
    fn fail(
        &mut self,
        e: hyper::Error,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // A failed body leaves the connection in no state to reuse.
        if let Some(conn) = self.conn.take() {
            debug!(endpoint = %conn.addr, error = %e, "the endpoint's response body failed; the client's connection ends after what came of it");
        }
        self.failed = Some(e.into());
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn release(&mut self) {
        self.guard = None;
        self.open = None;
        if let Some(conn) = self.conn.take() {
            let keep = self.keep.keep(conn.addr);
            self.up.pool.checkin(conn, keep);
        }
    }
}

/// A response body cut off: the endpoint sent no byte of it for the body timeout.
#[derive(Debug)]
struct BodyTimedOut(Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the endpoint sent no byte of the response body for {:?}",
            self.0
        )
    }
}

impl std::error::Error for BodyTimedOut {}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(e) = self.failed.take() {
            return Poll::Ready(Some(Err(e)));
        }
        // Only the driver, polled here, fills the body: it is polled with no waker
        // (the task wakes for the connection's socket), before and after the
        // driver.
        let this = &mut *self;
        let mut quiet = Context::from_waker(Waker::noop());
        let inner = &mut this.inner;
        let mut polled = match &this.conn {
            Some(conn) => conn
                .driver
                .quietly(|| Pin::new(&mut *inner).poll_frame(&mut quiet)),
            None => Pin::new(&mut *inner).poll_frame(&mut quiet),
        };
        if polled.is_pending() {
            polled = match &mut this.conn {
                Some(conn) => {
                    // Ready once the connection ended: the body then ends or fails.
                    let _ = conn.driver.poll(cx);
                    let again = conn
                        .driver
                        .quietly(|| Pin::new(&mut this.inner).poll_frame(&mut quiet));
                    if again.is_pending() {
                        if !this.armed {
                            this.armed = true;
                            conn.driver.arm(this.up.settings.body_timeout);
                        }
                        if conn.driver.expired(cx).is_ready() {
                            return Poll::Ready(Some(Err(this.cut_off())));
                        }
                    }
                    again
                }
                // Not driven here any more (it is not once the body has ended or
                // failed): waits with the task's own waker.
                None => Pin::new(&mut this.inner).poll_frame(cx),
            };
        }
        let polled = match polled {
            Poll::Ready(Some(Err(e))) => return self.fail(e, cx),
            other => other,
        };
        match &polled {
            Poll::Ready(None) => self.release(),
            // Trailers are the last frame, and hyper's servers poll no further
            // after them: the connection goes back to the pool now or never.
            Poll::Ready(Some(Ok(frame))) if frame.is_trailers() || self.inner.is_end_stream() => {
                self.release();
            }
            Poll::Ready(Some(Ok(_))) => self.armed = false,
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        polled.map_err(BoxError::from)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's waker that counts its wake-ups.
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A future that counts its polls and is ready when `rx` has a value.
    fn counted(
        polls: &Arc<AtomicUsize>,
        mut rx: tokio::sync::oneshot::Receiver<u32>,
    ) -> impl Future<Output = u32> + use<> {
        let polls = polls.clone();
        std::future::poll_fn(move |cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut rx).poll(cx).map(|r| r.unwrap_or(0))
        })
    }

    #[test]
    fn a_template_gives_back_the_head_it_was_made_from() {
        let mut req = Request::new(empty());
        *req.method_mut() = Method::PUT;
        *req.uri_mut() = Uri::from_static("/a/b?c=d");
        let h = req.headers_mut();
        h.append(header::HOST, HeaderValue::from_static("web.example:8080"));
        h.append("x-twice", HeaderValue::from_static("one"));
        h.append(header::ACCEPT, HeaderValue::from_static("text/plain"));
        h.append("x-twice", HeaderValue::from_static("two"));
        h.append("x-empty", HeaderValue::from_static(""));
        // obs-text, as hyper's parser lets it through.
        h.append(
            "x-latin",
            HeaderValue::from_bytes(b"caf\xe9\tau lait").unwrap(),
        );
        h.append(
            "x-long",
            HeaderValue::from_str(&"v".repeat(70_000)).unwrap(),
        );
        let t = Template::of(&req);
        for _ in 0..2 {
            let again = t.request().expect("the template rebuilds its head");
            assert_eq!(again.method(), Method::PUT);
            assert_eq!(again.uri(), "/a/b?c=d");
            let pairs = |m: &HeaderMap| {
                m.iter()
                    .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(pairs(again.headers()), pairs(req.headers()));
            assert!(again.body().is_end_stream());
        }
    }

    #[test]
    fn a_template_without_headers_and_a_cut_one() {
        let req = Request::new(empty());
        let t = Template::of(&req);
        assert!(t.request().expect("an empty head").headers().is_empty());
        // A buffer cut short (which `of` never makes) gives no request rather
        // than a wrong one.
        let mut req = Request::new(empty());
        req.headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        let mut t = Template::of(&req);
        t.packed.pop();
        assert!(t.request().is_none());
        // More headers than a map can hold: no request, and no panic.
        let mut t = Template::of(&req);
        t.count = 1 << 20;
        assert!(t.request().is_none());
    }

    #[test]
    fn a_when_woken_future_is_polled_first_and_then_only_after_it_woke() {
        let polls = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut stop = WhenWoken::new(counted(&polls, rx));
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        for _ in 0..5 {
            assert!(Pin::new(&mut stop).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1, "polled without a wake-up");
        tx.send(7).unwrap();
        assert_eq!(Pin::new(&mut stop).poll(&mut cx), Poll::Ready(7));
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_when_woken_future_wakes_its_task_and_registers_again_with_a_new_one() {
        let polls = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut stop = WhenWoken::new(counted(&polls, rx));
        let first = Arc::new(Count(AtomicUsize::new(0)));
        let second = Arc::new(Count(AtomicUsize::new(0)));
        let first_waker = Waker::from(first.clone());
        assert!(
            Pin::new(&mut stop)
                .poll(&mut Context::from_waker(&first_waker))
                .is_pending()
        );
        // Another task's waker: polled again, so that the wake-up goes there.
        let second_waker = Waker::from(second.clone());
        assert!(
            Pin::new(&mut stop)
                .poll(&mut Context::from_waker(&second_waker))
                .is_pending()
        );
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        tx.send(7).unwrap();
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            Pin::new(&mut stop).poll(&mut Context::from_waker(&second_waker)),
            Poll::Ready(7)
        );
    }
}
