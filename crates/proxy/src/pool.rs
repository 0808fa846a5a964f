//! The per-endpoint pools of keep-alive HTTP/1.1 connections of an HTTP upstream.
//!
//! Each endpoint address has its own list of idle connections (hyper's client
//! connection API: a `SendRequest` per connection, its connection driven by a task
//! on the worker that dialled it) and a count of busy ones. A request takes the
//! most recently used idle connection of its own worker (the one least likely to
//! have been closed by the endpoint's own idle timeout; a connection of another
//! worker would make each of its requests wake tasks across threads) or dials a
//! new one; the connection comes back when the response body has been read to
//! its end, unless its worker already keeps `max_idle_per_endpoint` idle
//! connections to the endpoint, the endpoint has left the upstream's endpoints,
//! or the connection cannot take another request.
//!
//! hyper-util's pooled client was the other choice; it pools by URI authority and
//! retries on a fresh connection of the same authority by itself, and it has no
//! way to close the idle connections of one endpoint when that endpoint leaves
//! discovery's answer. Here [`Pool::sweep`] does that (called by a task of the
//! dataplane every [`SWEEP`]): idle connections of endpoints that have left, and
//! those idle longer than `idle_timeout`, are closed (dropping the `SendRequest` of
//! an idle connection closes it). Busy connections finish their request first.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tracing::trace;

use crate::http_stats::HttpStats;

/// The body type of requests sent to endpoints.
pub(crate) type ReqBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// How often the dataplane sweeps an HTTP upstream's pool.
pub(crate) const SWEEP: Duration = Duration::from_millis(100);

/// An idle connection: since when, and the worker thread whose runtime drives it.
#[derive(Debug)]
struct Idle {
    sender: SendRequest<ReqBody>,
    since: Instant,
    home: ThreadId,
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
}

/// One connection taken from the pool (or dialled for it), counted busy until it is
/// put back or dropped.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) sender: SendRequest<ReqBody>,
    pub(crate) addr: SocketAddr,
    /// The worker thread whose runtime drives the connection (it dialled it).
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
        }
    }

    /// An idle connection to `addr` that can take a request now, if there is one
    /// driven by the current worker: the most recently used of them. A connection
    /// of another worker is left to that worker; taking it would make each of its
    /// requests and responses wake a task across threads.
    pub(crate) fn checkout(self: &Arc<Self>, addr: SocketAddr) -> Option<Conn> {
        let me = home();
        let mut eps = self.endpoints.lock();
        let ep = eps.get_mut(&addr)?;
        while let Some(i) = ep.idle.iter().rposition(|c| c.home == me) {
            let Idle { sender, since, .. } = ep.idle.remove(i);
            if sender.is_closed() || since.elapsed() > self.idle_timeout {
                continue;
            }
            ep.busy += 1;
            return Some(Conn {
                sender,
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

    /// Dials `addr` and hands the connection to hyper, whose driver runs as a task
    /// of the current runtime (the worker of the request).
    pub(crate) async fn connect(
        self: &Arc<Self>,
        addr: SocketAddr,
        stats: &HttpStats,
    ) -> Result<Conn, DialError> {
        let dialled = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await;
        let stream = match dialled {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(DialError::Connect(e)),
            Err(_) => return Err(DialError::Timeout(self.connect_timeout)),
        };
        // Requests and responses of a few hundred bytes: no Nagle delays.
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(DialError::Handshake)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                trace!(endpoint = %addr, error = %e, "pooled connection ended");
            }
        });
        stats.connects.fetch_add(1, Ordering::Relaxed);
        self.endpoints.lock().entry(addr).or_default().busy += 1;
        Ok(Conn {
            sender,
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

    /// Puts `conn` back after its response ended, unless it cannot take another
    /// request, the pool of its endpoint is full, or `keep` says the endpoint left.
    pub(crate) fn checkin(&self, conn: Conn, keep: bool) {
        if !keep || conn.sender.is_closed() {
            return;
        }
        let Conn {
            sender,
            addr,
            home,
            mut _busy,
            ..
        } = conn;
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
                since: Instant::now(),
                home,
            });
        } else if ep.busy == 0 && ep.idle.is_empty() {
            eps.remove(&addr);
        }
    }

    /// Closes idle connections of endpoints for which `wanted` is false, and those
    /// idle longer than the idle timeout.
    pub(crate) fn sweep(&self, wanted: impl Fn(SocketAddr) -> bool) {
        let mut closed = Vec::new();
        {
            let mut eps = self.endpoints.lock();
            eps.retain(|addr, ep| {
                if !wanted(*addr) {
                    closed.append(&mut ep.idle);
                } else {
                    let timeout = self.idle_timeout;
                    let (old, kept): (Vec<_>, Vec<_>) = ep
                        .idle
                        .drain(..)
                        .partition(|c| c.sender.is_closed() || c.since.elapsed() > timeout);
                    ep.idle = kept;
                    closed.extend(old);
                }
                ep.busy > 0 || !ep.idle.is_empty()
            });
        }
        // Dropped outside the lock: each drop wakes its connection's driver.
        if !closed.is_empty() {
            trace!(connections = closed.len(), "idle pooled connections closed");
        }
        drop(closed);
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
