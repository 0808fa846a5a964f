//! The cache's notion of "now": the system clock, or a manual clock for tests.
//!
//! Every freshness decision (TTL, negative TTL, serve-stale window, refresh-ahead)
//! compares against [`Clock::now`], so tests drive expiry by advancing a
//! [`ManualClock`] instead of sleeping. moka's own expiry runs on real time and only
//! reclaims memory; it is set long enough never to drop an entry the cache still
//! considers usable.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the cache reads the time. Cheap to clone. The default is the system clock.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    manual: Option<ManualClock>,
}

impl Clock {
    /// The system's monotonic clock.
    pub fn system() -> Self {
        Self::default()
    }

    /// The current instant.
    #[inline]
    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(m) => m.now(),
        }
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Self {
        Self {
            manual: Some(manual),
        }
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug)]
struct ManualInner {
    base: Instant,
    offset_nanos: AtomicU64,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A manual clock starting at the current real instant.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(ManualInner {
                base: Instant::now(),
                offset_nanos: AtomicU64::new(0),
            }),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.inner.offset_nanos.fetch_add(nanos, Ordering::SeqCst);
    }

    /// The clock's current instant.
    pub fn now(&self) -> Instant {
        self.inner.base + Duration::from_nanos(self.inner.offset_nanos.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let manual = ManualClock::new();
        let clock = Clock::from(manual.clone());
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        manual.advance(Duration::from_secs(5));
        assert_eq!(clock.now() - t0, Duration::from_secs(5));
    }
}
