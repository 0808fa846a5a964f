//! The per-endpoint pools of keep-alive HTTP/1.1 connections of an HTTP upstream.
//!
//! Each endpoint address has its own list of idle connections (hyper's client
//! connection API: a `SendRequest` per connection and its [`Driver`]) and a count of
//! busy ones. A request takes the most recently used idle connection of its own
//! worker (the one least likely to have been closed by the endpoint's own idle
//! timeout; the socket of a connection of another worker is watched by that
//! worker's reactor, which would wake each of its requests across threads) or dials
//! a new one; the connection comes back when the response body has been read to
//! its end, unless its worker already keeps `max_idle_per_endpoint` idle
//! connections to the endpoint, the endpoint has left the upstream's endpoints,
//! or the connection cannot take another request.
//!
//! A connection has no task of its own: the task of the request that uses it
//! polls its driver (hyper's connection future) beside the request, then the task
//! that streams the response body to the client. A request and its response are so
//! read, written and handed over in the polls of one task, without waking
//! another; wake-ups of the socket go to the task using the connection now
//! ([`Relay`]) and nowhere while it is idle, and those the connection makes while
//! that task takes a piece of the response body are dropped ([`Driver::quietly`]):
//! two task polls per keep-alive request, one for the request and one for the
//! response.
//!
//! hyper-util's pooled client was the other choice; it pools by URI authority and
//! retries on a fresh connection of the same authority by itself, and it has no
//! way to close the idle connections of one endpoint when that endpoint leaves
//! discovery's answer. Here a task of the dataplane per pool does that: as soon
//! as the endpoints change (the load balancer publishes a new set, or an
//! `address:` upstream's DNS answer changes) [`Pool::close_left`] closes the idle
//! connections of endpoints that have left, and every [`SWEEP`] [`Pool::sweep`]
//! closes those, those the endpoint closed, and those idle longer than
//! `idle_timeout` (dropped: the socket closes at once). Busy connections finish
//! their request first; one that comes back after its endpoint left is not kept,
//! or, if it came back as the set changed, closed by the next sweep.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tracing::{debug, trace};

use crate::http_stats::HttpStats;
use crate::outbox::Deferred;

/// The body type of requests sent to endpoints.
pub(crate) type ReqBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// hyper's client connection future of a pooled connection.
type ClientConn = Connection<TokioIo<Deferred<TcpStream>>, ReqBody>;

/// How often the dataplane sweeps an HTTP upstream's pool.
pub(crate) const SWEEP: Duration = Duration::from_millis(100);

/// The hyper connection future of a pooled connection, polled by the task that
/// uses the connection (there is no task of its own).
pub(crate) struct Driver {
    /// `None` once it has ended (the connection is closed).
    conn: Option<Pin<Box<ClientConn>>>,
    relay: Arc<Relay>,
    /// `relay` as a waker, made once.
    waker: Waker,
    addr: SocketAddr,
    /// The response timeout of its requests: one timer per connection, armed again
    /// for each request (a later deadline only updates it: tokio's timer wheel is
    /// not touched unless it fired, nor before its first poll).
    timer: Pin<Box<Sleep>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("addr", &self.addr)
            .field("ended", &self.conn.is_none())
            .finish_non_exhaustive()
    }
}

/// Passes the wake-ups of a connection (its socket, its channels) on to the task
/// using it now, and to none while it is idle in the pool.
#[derive(Debug, Default)]
struct Relay {
    task: Mutex<Option<Waker>>,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // A wake-up made on this thread while the task using the connection polls
        // one of the connection's channels itself ([`Driver::quietly`]) would only
        // make that task poll again for nothing.
        if QUIET.get() == Arc::as_ptr(self) as usize {
            return;
        }
        if let Some(task) = &*self.task.lock() {
            task.wake_by_ref();
        }
    }
}

thread_local! {
    /// The [`Relay`] (its address) whose wake-ups on this thread are dropped now.
    static QUIET: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Driver {
    fn new(conn: ClientConn, addr: SocketAddr) -> Self {
        let relay = Arc::new(Relay::default());
        Self {
            conn: Some(Box::pin(conn)),
            waker: Waker::from(relay.clone()),
            relay,
            addr,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// Arms the response timer: `timeout` from now.
    pub(crate) fn arm(&mut self, timeout: Duration) {
        self.timer
            .as_mut()
            .reset(tokio::time::Instant::now() + timeout);
    }

    /// Ready once the response timer armed last has fired (it wakes the task of
    /// `cx`).
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.timer.as_mut().poll(cx)
    }

    /// Drives the connection for the task of `cx` (its wake-ups go there from now
    /// on): ready once the connection has ended.
    pub(crate) fn poll(&mut self, cx: &Context<'_>) -> Poll<()> {
        {
            let mut task = self.relay.task.lock();
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        self.poll_conn()
    }

    /// Whether the connection can take a request now, as far as its last poll saw:
    /// it has not ended and `sender` (its half) is waiting for a request (it is not,
    /// for one, while a request body is still being sent).
    fn ready(&self, sender: &SendRequest<ReqBody>) -> bool {
        self.conn.is_some() && sender.is_ready()
    }

    /// Runs `f`, a poll of one of the connection's channels (the response body) by
    /// the task that drives the connection, with the connection's wake-ups on this
    /// thread dropped meanwhile.
    ///
    /// Taking a chunk of the body wakes the channel's sender, hyper's connection,
    /// whose wake-ups go to the task using it: to the very task taking the chunk,
    /// which would then be polled once more for nothing (once per response: a
    /// third of its task's polls). That task polls the connection again before it
    /// waits (it takes the next chunk, or the body has ended); a wake-up from
    /// another thread (the socket's, on a multi-threaded runtime) still goes
    /// through.
    pub(crate) fn quietly<R>(&self, f: impl FnOnce() -> R) -> R {
        /// Puts the mark back when `f` returns, and when it panics (tokio catches
        /// a task's panic and the thread goes on: a stale mark would silence a
        /// later connection's relay allocated at the same address).
        struct Restore(usize);
        impl Drop for Restore {
            fn drop(&mut self) {
                QUIET.set(self.0);
            }
        }
        let _restore = Restore(QUIET.replace(Arc::as_ptr(&self.relay) as usize));
        f()
    }

    /// Wake-ups go to no task until the next [`Driver::poll`].
    pub(crate) fn detach(&self) {
        *self.relay.task.lock() = None;
    }

    fn poll_conn(&mut self) -> Poll<()> {
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Ready(());
        };
        let ended = match conn.as_mut().poll(&mut Context::from_waker(&self.waker)) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        if let Err(e) = ended {
            trace!(endpoint = %self.addr, error = %e, "pooled connection ended");
        }
        // Dropped at once: a request still waiting on it gets its error now.
        self.conn = None;
        Poll::Ready(())
    }
}

/// An idle connection: since which sweep, and the worker thread whose reactor watches
/// its socket.
#[derive(Debug)]
struct Idle {
    sender: SendRequest<ReqBody>,
    driver: Driver,
    /// The pool's sweep count when it came back (its age is counted in sweeps, so
    /// that a request reads no clock for it).
    since: u64,
    home: ThreadId,
}

impl Idle {
    /// Whether it can take a request now, after a poll with no task to wake (idle
    /// connections have none: one the endpoint closed ends).
    fn usable(&mut self) -> bool {
        let _ = self.driver.poll_conn();
        self.driver.ready(&self.sender)
    }
}

/// Idle and busy connections of one endpoint.
#[derive(Debug, Default)]
struct EndpointPool {
    idle: Vec<Idle>,
    busy: usize,
}

thread_local! {
    /// The current thread's id, read once per thread.
    static HOME: ThreadId = std::thread::current().id();
}

fn home() -> ThreadId {
    HOME.with(|h| *h)
}

/// The pools of one HTTP upstream.
#[derive(Debug)]
pub(crate) struct Pool {
    /// By endpoint address, hashed with foldhash: a lookup per request and per
    /// response, of addresses that come from discovery, not from clients.
    endpoints: Mutex<HashMap<SocketAddr, EndpointPool, foldhash::fast::RandomState>>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    /// Sweeps so far: the clock of idle ages (one tick per [`SWEEP`]).
    sweeps: AtomicU64,
}

/// One connection taken from the pool (or dialled for it), counted busy until it is
/// put back or dropped.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) sender: SendRequest<ReqBody>,
    pub(crate) driver: Driver,
    pub(crate) addr: SocketAddr,
    /// The worker thread whose reactor watches the connection's socket (it dialled
    /// it).
    home: ThreadId,
    /// Whether it served a request before (a failure before any byte was written
    /// then says "the endpoint closed it while idle", not "the endpoint is down").
    pub(crate) reused: bool,
    _busy: Busy,
}

/// Counts its connection busy while it lives (unless [`Pool::checkin`] took it off
/// `busy` already).
#[derive(Debug)]
struct Busy {
    pool: Arc<Pool>,
    addr: SocketAddr,
    counted: bool,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut eps = self.pool.endpoints.lock();
        if let Some(ep) = eps.get_mut(&self.addr) {
            ep.busy = ep.busy.saturating_sub(1);
            if ep.busy == 0 && ep.idle.is_empty() {
                eps.remove(&self.addr);
            }
        }
    }
}

/// Why a new connection could not be made.
#[derive(Debug)]
pub(crate) enum DialError {
    Connect(std::io::Error),
    Timeout(Duration),
    Handshake(hyper::Error),
}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "connect failed: {e}"),
            Self::Timeout(t) => write!(f, "connect timed out after {t:?}"),
            Self::Handshake(e) => write!(f, "HTTP handshake failed: {e}"),
        }
    }
}

/// The pool sizes of one endpoint, for status and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub(crate) idle: usize,
    pub(crate) busy: usize,
}

impl Pool {
    pub(crate) fn new(max_idle: usize, idle_timeout: Duration, connect_timeout: Duration) -> Self {
        Self {
            endpoints: Mutex::new(HashMap::default()),
            max_idle,
            idle_timeout,
            connect_timeout,
            sweeps: AtomicU64::new(0),
        }
    }

    /// Whether a connection idle since sweep `since` has been idle longer than the
    /// idle timeout (give or take one sweep).
    fn too_old(&self, since: u64) -> bool {
        let sweeps = self.sweeps.load(Ordering::Relaxed).saturating_sub(since);
        SWEEP.saturating_mul(u32::try_from(sweeps).unwrap_or(u32::MAX)) > self.idle_timeout
    }

    /// An idle connection to `addr` that can take a request now, if there is one
    /// of the current worker: the most recently used of them. A connection
    /// of another worker is left to that worker; taking it would make each of its
    /// requests and responses wake a task across threads.
    pub(crate) fn checkout(self: &Arc<Self>, addr: SocketAddr) -> Option<Conn> {
        let me = home();
        let mut eps = self.endpoints.lock();
        let ep = eps.get_mut(&addr)?;
        while let Some(i) = ep.idle.iter().rposition(|c| c.home == me) {
            let idle = ep.idle.remove(i);
            // Not driven here: the first poll of a request's exchange reads before
            // it writes, so that a connection the endpoint closed while it was idle
            // hands the request back unwritten (the sweep closes such connections
            // too).
            if self.too_old(idle.since) || !idle.driver.ready(&idle.sender) {
                continue;
            }
            ep.busy += 1;
            return Some(Conn {
                sender: idle.sender,
                driver: idle.driver,
                addr,
                home: me,
                reused: true,
                _busy: Busy {
                    pool: self.clone(),
                    addr,
                    counted: true,
                },
            });
        }
        None
    }

    /// Dials `addr` and hands the connection to hyper, which takes response heads
    /// of up to `max_head` bytes; its driver is polled by the tasks that use it, on
    /// the current worker (whose reactor watches the socket).
    pub(crate) async fn connect(
        self: &Arc<Self>,
        addr: SocketAddr,
        stats: &HttpStats,
        max_head: usize,
    ) -> Result<Conn, DialError> {
        let stream = self.dial(addr).await?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .writev(false)
            .max_header_size(max_head)
            .handshake(TokioIo::new(Deferred::endpoint(stream)))
            .await
            .map_err(DialError::Handshake)?;
        stats.connects.fetch_add(1, Ordering::Relaxed);
        self.endpoints.lock().entry(addr).or_default().busy += 1;
        Ok(Conn {
            sender,
            driver: Driver::new(conn, addr),
            addr,
            home: home(),
            reused: false,
            _busy: Busy {
                pool: self.clone(),
                addr,
                counted: true,
            },
        })
    }

    /// A new TCP connection to `addr` within the connect timeout, without Nagle
    /// delays (requests and responses of a few hundred bytes).
    pub(crate) async fn dial(&self, addr: SocketAddr) -> Result<TcpStream, DialError> {
        let dialled = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await;
        let stream = match dialled {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(DialError::Connect(e)),
            Err(_) => return Err(DialError::Timeout(self.connect_timeout)),
        };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// Puts `conn` back after its response ended, unless it cannot take another
    /// request now (it ended, or is still sending a request body the endpoint
    /// answered before it had read it all: no task would drive it on), the pool of
    /// its endpoint is full, or `keep` says the endpoint left.
    pub(crate) fn checkin(&self, conn: Conn, keep: bool) {
        if !keep || !conn.driver.ready(&conn.sender) {
            return;
        }
        let Conn {
            sender,
            driver,
            addr,
            home,
            mut _busy,
            ..
        } = conn;
        driver.detach();
        // Off `busy` and onto `idle` under one lock.
        let mut eps = self.endpoints.lock();
        let ep = eps.entry(addr).or_default();
        ep.busy = ep.busy.saturating_sub(1);
        _busy.counted = false;
        // The bound is per worker, as each worker takes only its own connections
        // (counted only when the pool as a whole holds that many).
        let room = ep.idle.len() < self.max_idle
            || ep.idle.iter().filter(|c| c.home == home).count() < self.max_idle;
        if room {
            ep.idle.push(Idle {
                sender,
                driver,
                since: self.sweeps.load(Ordering::Relaxed),
                home,
            });
        } else if ep.busy == 0 && ep.idle.is_empty() {
            eps.remove(&addr);
        }
    }

    /// Closes idle connections of endpoints for which `wanted` is false, those the
    /// endpoint closed, and those idle longer than the idle timeout.
    pub(crate) fn sweep(&self, wanted: &dyn Fn(SocketAddr) -> bool) {
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        // Each idle connection is driven here (`usable`), with no task to wake:
        // one the endpoint closed ends.
        let closed = self.close(wanted, |c| !self.too_old(c.since) && c.usable());
        if !closed.is_empty() {
            trace!(connections = closed.len(), "idle pooled connections closed");
        }
        // Dropped outside the lock: each drop closes its socket.
        drop(closed);
    }

    /// Closes the idle connections of endpoints for which `wanted` is false (those
    /// that left the upstream's endpoints), at once; the others are left as they
    /// are.
    pub(crate) fn close_left(&self, wanted: &dyn Fn(SocketAddr) -> bool) {
        let closed = self.close(wanted, |_| true);
        if !closed.is_empty() {
            debug!(
                connections = closed.len(),
                "idle pooled connections to endpoints that left closed"
            );
        }
        drop(closed);
    }

    /// Takes out the idle connections of endpoints for which `wanted` is false and
    /// those of the others that `stays` refuses, and forgets endpoints left with
    /// none.
    fn close(
        &self,
        wanted: &dyn Fn(SocketAddr) -> bool,
        mut stays: impl FnMut(&mut Idle) -> bool,
    ) -> Vec<Idle> {
        let mut closed = Vec::new();
        let mut eps = self.endpoints.lock();
        eps.retain(|addr, ep| {
            if !wanted(*addr) {
                closed.append(&mut ep.idle);
            } else {
                for mut c in std::mem::take(&mut ep.idle) {
                    if stays(&mut c) {
                        ep.idle.push(c);
                    } else {
                        closed.push(c);
                    }
                }
            }
            ep.busy > 0 || !ep.idle.is_empty()
        });
        closed
    }

    /// How many sweeps have run.
    #[cfg(test)]
    pub(crate) fn sweeps(&self) -> u64 {
        self.sweeps.load(Ordering::Relaxed)
    }

    /// Idle and busy connections per endpoint.
    pub(crate) fn sizes(&self) -> Vec<(SocketAddr, Sizes)> {
        let eps = self.endpoints.lock();
        let mut v: Vec<_> = eps
            .iter()
            .map(|(a, ep)| {
                (
                    *a,
                    Sizes {
                        idle: ep.idle.len(),
                        busy: ep.busy,
                    },
                )
            })
            .collect();
        v.sort_unstable_by_key(|(a, _)| *a);
        v
    }
}
