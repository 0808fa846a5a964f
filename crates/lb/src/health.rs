//! Passive ejection: per-endpoint failure counting, cool-downs, and the injectable
//! clock that measures them.
//!
//! Nothing here runs on its own. A proxy reports the outcome of each request on its
//! [`PickGuard`](crate::PickGuard) (or by address on the
//! [`UpstreamLb`](crate::UpstreamLb)); after
//! [`EjectionConfig::consecutive_failures`] failures in a row the endpoint is skipped
//! by picks for [`EjectionConfig::cool_down`], then it takes traffic again. When
//! every candidate is ejected a pick ignores ejection rather than fail (Envoy's
//! "panic mode"): an upstream with endpoints never answers [`NoEndpoints`](crate::NoEndpoints)
//! because of ejections.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Monotonic time for cool-downs; inject [`ManualEjectionClock`] in tests.
pub trait EjectionClock: Send + Sync + fmt::Debug {
    /// Time elapsed since an arbitrary, fixed origin. Must never go backwards.
    fn now(&self) -> Duration;
}

/// The real clock: [`Instant`] since the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicEjectionClock {
    origin: Instant,
}

impl MonotonicEjectionClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicEjectionClock {
    fn default() -> Self {
        Self::new()
    }
}

impl EjectionClock for MonotonicEjectionClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to, for deterministic tests.
#[derive(Debug, Default)]
pub struct ManualEjectionClock {
    nanos: AtomicU64,
}

impl ManualEjectionClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(duration_nanos(by), Ordering::SeqCst);
    }
}

impl EjectionClock for ManualEjectionClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// When passive ejection takes an endpoint out of rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EjectionConfig {
    /// Failures in a row (no success between them) that eject an endpoint. `0`
    /// disables automatic ejection.
    pub consecutive_failures: u32,
    /// How long an ejected endpoint is skipped.
    pub cool_down: Duration,
}

impl EjectionConfig {
    /// Eject after `consecutive_failures` failures in a row, for `cool_down`.
    pub const fn new(consecutive_failures: u32, cool_down: Duration) -> Self {
        Self {
            consecutive_failures,
            cool_down,
        }
    }
}

impl Default for EjectionConfig {
    /// Envoy's outlier-detection defaults: 5 consecutive failures, 30 s.
    fn default() -> Self {
        Self::new(5, Duration::from_secs(30))
    }
}

/// What the load balancer shares with every endpoint state.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) ejection: Option<EjectionConfig>,
    pub(crate) clock: Arc<dyn EjectionClock>,
    /// Endpoint states with an ejection pending (never less than the true number):
    /// while it is zero a pick skips the per-endpoint check and never touches the
    /// state's second cache line.
    pub(crate) ejected: AtomicUsize,
}

impl Shared {
    pub(crate) fn new(ejection: Option<EjectionConfig>, clock: Arc<dyn EjectionClock>) -> Self {
        Self {
            ejection,
            clock,
            ejected: AtomicUsize::new(0),
        }
    }

    /// Whether any endpoint may be ejected.
    #[inline]
    pub(crate) fn any_ejected(&self) -> bool {
        self.ejected.load(Ordering::Acquire) != 0
    }
}

/// Per-address state: outlives set updates while the address stays in the set, and
/// outlives the address's removal while guards on it are alive.
///
/// Snapshots (and, once the endpoint has left the set, the load balancer's draining
/// list) hold it by strong references; a [`PickGuard`](crate::PickGuard) holds a
/// `Weak` one. So the in-flight count is the `Arc`'s weak count: a pick pays one
/// reference-count increment and its drop one decrement, with no separate counter,
/// and the count stays exact however many old snapshots are still alive (an
/// [`LbHandle`](crate::LbHandle) keeps its last one until its next pick).
#[derive(Debug)]
#[repr(align(128))] // one cache line per endpoint: no false sharing between picks
pub(crate) struct EndpointState {
    pub(crate) addr: SocketAddr,
    failures: AtomicU32,
    /// Clock nanos until which the endpoint is ejected; 0: not ejected.
    ejected_until: AtomicU64,
    /// Removed from the set; its remaining guards are draining.
    pub(crate) removed: AtomicBool,
    shared: Arc<Shared>,
}

impl EndpointState {
    pub(crate) fn new(addr: SocketAddr, shared: &Arc<Shared>) -> Self {
        Self {
            addr,
            failures: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            shared: Arc::clone(shared),
        }
    }

    /// Requests in flight: guards alive (nothing else holds a `Weak`).
    #[inline]
    pub(crate) fn in_flight(self: &Arc<Self>) -> usize {
        Arc::weak_count(self)
    }

    /// Whether picks should skip this endpoint now. Reads the clock only when an
    /// ejection is pending, so the common case is one relaxed load.
    #[inline]
    pub(crate) fn is_ejected(&self) -> bool {
        let until = self.ejected_until.load(Ordering::Acquire);
        until != 0 && self.ejected_slow(until)
    }

    #[cold]
    fn ejected_slow(&self, until: u64) -> bool {
        if duration_nanos(self.shared.clock.now()) < until {
            return true;
        }
        // cool-down over: back in rotation (a racing new ejection wins)
        if self
            .ejected_until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.shared.ejected.fetch_sub(1, Ordering::AcqRel);
        }
        false
    }

    pub(crate) fn eject_for(&self, cool_down: Duration) -> bool {
        if cool_down.is_zero() {
            return false;
        }
        let until = duration_nanos(self.shared.clock.now())
            .saturating_add(duration_nanos(cool_down))
            .max(1);
        self.failures.store(0, Ordering::Relaxed);
        // count first, so the count never reads lower than the truth
        self.shared.ejected.fetch_add(1, Ordering::AcqRel);
        if self.ejected_until.swap(until, Ordering::AcqRel) != 0 {
            self.shared.ejected.fetch_sub(1, Ordering::AcqRel);
        }
        tracing::warn!(endpoint = %self.addr, cool_down_ms = cool_down.as_millis() as u64, "endpoint ejected");
        true
    }

    pub(crate) fn uneject(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        let was = self.ejected_until.swap(0, Ordering::AcqRel) != 0;
        if was {
            self.shared.ejected.fetch_sub(1, Ordering::AcqRel);
        }
        was
    }

    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    pub(crate) fn report(&self, outcome: Outcome) {
        match outcome {
            Outcome::Success => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
            }
            Outcome::Failure => {
                let failures = self
                    .failures
                    .fetch_add(1, Ordering::Relaxed)
                    .saturating_add(1);
                if let Some(cfg) = self.shared.ejection
                    && cfg.consecutive_failures != 0
                    && failures >= cfg.consecutive_failures
                {
                    self.eject_for(cfg.cool_down);
                }
            }
        }
    }
}

impl Drop for EndpointState {
    fn drop(&mut self) {
        if *self.ejected_until.get_mut() != 0 {
            self.shared.ejected.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The outcome of a request, reported for passive ejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The request succeeded: resets the endpoint's failure streak.
    Success,
    /// The request failed (connect error, timeout, 5xx…): extends the streak.
    Failure,
}
