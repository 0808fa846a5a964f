//! L4 forwarding of one client connection to an endpoint of its upstream.
//!
//! Pick (consistent hash keys on the client IP), connect with a timeout, try another
//! pick on a connect failure (at most three tries), then move bytes both ways until
//! both sides have closed (a half-close is passed on). An upstream with no endpoints closes the client at once: the L4
//! analogue of a 503, counted as `no_endpoints`. The pick guard lives as long as the
//! connection, so a connection outlives its endpoint's removal from DNS. The bytes
//! move as [`crate::pump`] moves them, and its byte counters grow while the
//! connection is open.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dwara_lb::{Policy, UpstreamLb};
use parking_lot::Mutex;
use tokio::net::TcpStream;

use crate::pump;
use tracing::{debug, warn};

/// Per-upstream connection counters; kept across reloads for the same upstream name.
#[derive(Debug, Default)]
pub(crate) struct ConnStats {
    pub(crate) accepted: AtomicU64,
    pub(crate) active: AtomicU64,
    pub(crate) no_endpoints: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) bytes_to_upstream: AtomicU64,
    pub(crate) bytes_to_client: AtomicU64,
    pub(crate) picks: Mutex<BTreeMap<SocketAddr, u64>>,
}

/// What a connection needs from its upstream (a snapshot: a reload does not move
/// connections already accepted).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) name: Arc<str>,
    pub(crate) policy: Policy,
    pub(crate) lb: Arc<UpstreamLb>,
    pub(crate) stats: Arc<ConnStats>,
    pub(crate) connect_timeout: Duration,
    /// The HTTP path's state, for a `protocol: http` upstream.
    pub(crate) http: Option<Arc<crate::reverse::HttpUpstream>>,
}

const MAX_TRIES: usize = 3;

/// Forwards `client` until either side closes.
pub(crate) async fn handle(client: TcpStream, peer: SocketAddr, target: Arc<Target>) {
    let stats = &target.stats;
    stats.accepted.fetch_add(1, Ordering::Relaxed);
    let mut connected = None;
    for attempt in 1..=MAX_TRIES {
        let pick = if target.policy == Policy::ConsistentHash {
            target.lb.pick_by_key(peer.ip().to_string().as_bytes())
        } else {
            target.lb.pick()
        };
        let Ok(guard) = pick else {
            stats.no_endpoints.fetch_add(1, Ordering::Relaxed);
            debug!(upstream = %target.name, %peer, "no endpoints: closing the client connection");
            return;
        };
        let addr = guard.addr();
        match tokio::time::timeout(target.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                guard.report_success();
                connected = Some((stream, guard));
                break;
            }
            Ok(Err(e)) => {
                guard.report_failure();
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                warn!(upstream = %target.name, endpoint = %addr, attempt, error = %e, "connect failed");
            }
            Err(_) => {
                guard.report_failure();
                stats.connect_failures.fetch_add(1, Ordering::Relaxed);
                warn!(upstream = %target.name, endpoint = %addr, attempt, timeout = ?target.connect_timeout, "connect timed out");
            }
        }
    }
    let Some((server, guard)) = connected else {
        stats.failed.fetch_add(1, Ordering::Relaxed);
        return;
    };
    *stats.picks.lock().entry(guard.addr()).or_default() += 1;
    stats.active.fetch_add(1, Ordering::Relaxed);
    // The client's socket inherited TCP_NODELAY from the listening socket.
    let _ = server.set_nodelay(true);
    let (client_ended, server_ended) = (AtomicBool::new(false), AtomicBool::new(false));
    let up = pump::Direction {
        from: &client,
        to: &server,
        bytes: &stats.bytes_to_upstream,
        also: None,
        ended: &client_ended,
        to_ended: &server_ended,
    };
    let down = pump::Direction {
        from: &server,
        to: &client,
        bytes: &stats.bytes_to_client,
        also: None,
        ended: &server_ended,
        to_ended: &client_ended,
    };
    match tokio::try_join!(up.run(), down.run()) {
        Ok((up, down)) => {
            debug!(upstream = %target.name, endpoint = %guard.addr(), %peer, up, down, "connection closed");
        }
        Err(e) => {
            debug!(upstream = %target.name, endpoint = %guard.addr(), %peer, error = %e, "connection ended with an error")
        }
    }
    stats.active.fetch_sub(1, Ordering::Relaxed);
    drop(guard);
}
