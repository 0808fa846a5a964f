//! The cache's notion of "now": the system clock (coarse by default, see [`Clock`]),
//! or a manual clock for tests.
//!
//! Every freshness decision (TTL, negative TTL, serve-stale window, refresh-ahead)
//! compares against [`Clock::now`], so tests drive expiry by advancing a
//! [`ManualClock`] instead of sleeping. moka's own expiry runs on real time and only
//! reclaims memory; it is set long enough never to drop an entry the cache still
//! considers usable.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Once};
use std::time::{Duration, Instant};

use tracing::warn;

/// How often the coarse clock's ticker thread reads the system clock.
pub const COARSE_TICK: Duration = Duration::from_millis(5);

/// Where the cache reads the time. Cheap to clone.
///
/// The default is [`Clock::coarse`]: reading the system clock costs tens to hundreds
/// of nanoseconds on virtual machines, more than the rest of a cache hit, so a
/// ticker thread reads it every [`COARSE_TICK`] and a hit reads an atomic. DNS TTLs
/// are whole seconds; a few milliseconds of imprecision do not matter.
#[derive(Debug, Clone)]
pub struct Clock {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Coarse(&'static Coarse),
    Precise,
    Manual(ManualClock),
}

impl Default for Clock {
    fn default() -> Self {
        Self::coarse()
    }
}

#[derive(Debug)]
struct Coarse {
    base: Instant,
    nanos: AtomicU64,
    ticking: AtomicBool,
}

static COARSE: LazyLock<Coarse> = LazyLock::new(|| Coarse {
    base: Instant::now(),
    nanos: AtomicU64::new(0),
    ticking: AtomicBool::new(false),
});
static START_TICKER: Once = Once::new();
static PRECISE_BASE: LazyLock<Instant> = LazyLock::new(Instant::now);

fn elapsed_nanos(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Clock {
    /// The system's monotonic clock, read through a shared ticker thread (one per
    /// process, started on first use). Falls back to [`Clock::precise`] if the
    /// thread cannot be started.
    pub fn coarse() -> Self {
        let coarse: &'static Coarse = &COARSE;
        START_TICKER.call_once(|| {
            coarse.nanos.store(elapsed_nanos(coarse.base), Ordering::Relaxed);
            let spawned = std::thread::Builder::new()
                .name("dwara-dns-clock".to_owned())
                .spawn(move || {
                    loop {
                        std::thread::sleep(COARSE_TICK);
                        coarse.nanos.store(elapsed_nanos(coarse.base), Ordering::Relaxed);
                    }
                });
            match spawned {
                Ok(_) => coarse.ticking.store(true, Ordering::Release),
                Err(e) => warn!(error = %e, "cannot start the DNS cache clock thread; reading the system clock on every hit"),
            }
        });
        Self {
            kind: Kind::Coarse(coarse),
        }
    }

    /// The system's monotonic clock, read on every call.
    pub fn precise() -> Self {
        // Fix the base before any instant this clock hands out.
        LazyLock::force(&PRECISE_BASE);
        Self {
            kind: Kind::Precise,
        }
    }

    /// `now()` as nanoseconds since the clock's base: what the hit path compares
    /// (a `u64` keeps the front map's buckets small).
    #[inline]
    pub(crate) fn ticks(&self) -> u64 {
        match &self.kind {
            Kind::Coarse(c) if c.ticking.load(Ordering::Relaxed) => c.nanos.load(Ordering::Relaxed),
            Kind::Coarse(c) => elapsed_nanos(c.base),
            Kind::Precise => elapsed_nanos(*PRECISE_BASE),
            Kind::Manual(m) => m.inner.offset_nanos.load(Ordering::SeqCst),
        }
    }

    /// `at` in [`ticks`](Self::ticks).
    pub(crate) fn ticks_of(&self, at: Instant) -> u64 {
        let base = match &self.kind {
            Kind::Coarse(c) => c.base,
            Kind::Precise => *PRECISE_BASE,
            Kind::Manual(m) => m.inner.base,
        };
        u64::try_from(at.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The current instant.
    #[inline]
    pub fn now(&self) -> Instant {
        match &self.kind {
            Kind::Coarse(c) if c.ticking.load(Ordering::Relaxed) => {
                c.base + Duration::from_nanos(c.nanos.load(Ordering::Relaxed))
            }
            Kind::Coarse(_) | Kind::Precise => Instant::now(),
            Kind::Manual(m) => m.now(),
        }
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Self {
        Self {
            kind: Kind::Manual(manual),
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
    fn coarse_clock_moves() {
        let clock = Clock::coarse();
        let t0 = clock.now();
        let deadline = Instant::now() + Duration::from_secs(10);
        while clock.now() <= t0 && Instant::now() < deadline {
            std::thread::sleep(COARSE_TICK);
        }
        assert!(clock.now() > t0, "the coarse clock did not move in 10 s");
    }

    #[test]
    fn ticks_agree_with_instants() {
        let manual = ManualClock::new();
        for clock in [
            Clock::coarse(),
            Clock::precise(),
            Clock::from(manual.clone()),
        ] {
            let now = clock.now();
            let later = now + Duration::from_secs(3);
            assert_eq!(clock.ticks_of(later) - clock.ticks_of(now), 3_000_000_000);
            assert!(clock.ticks() >= clock.ticks_of(now) || matches!(clock.kind, Kind::Coarse(_)));
        }
        let clock = Clock::from(manual.clone());
        manual.advance(Duration::from_millis(1500));
        assert_eq!(clock.ticks(), 1_500_000_000);
        assert_eq!(clock.ticks_of(clock.now()), clock.ticks());
    }

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
