//! The cache's notion of "now": the system clock (coarse by default, see [`Clock`]),
//! or a manual clock for tests.
//!
//! Every freshness decision (TTL, negative TTL, serve-stale window, refresh-ahead)
//! compares against [`Clock::now`], so tests drive expiry by advancing a
//! [`ManualClock`] instead of sleeping. moka's own expiry runs on real time and only
//! reclaims memory; it is set long enough never to drop an entry the cache still
//! considers usable.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::warn;

/// How often the coarse clock's ticker thread reads the system clock.
pub const COARSE_TICK: Duration = Duration::from_millis(5);

/// The name of the coarse clock's ticker thread (tests look for it).
pub const COARSE_THREAD_NAME: &str = "dwara-dns-clock";

/// Where the cache reads the time. Cheap to clone.
///
/// The default is [`Clock::coarse`]: reading the system clock costs tens to hundreds
/// of nanoseconds on virtual machines, more than the rest of a cache hit, so a
/// ticker thread reads it every [`COARSE_TICK`] and a hit reads an atomic. DNS TTLs
/// are whole seconds; a few milliseconds of imprecision do not matter. The thread
/// lives exactly as long as some coarse `Clock` does: dropping the last cache (and
/// the last config holding a coarse clock) stops and joins it, so a library user is
/// never left with a thread it did not ask for.
#[derive(Debug, Clone)]
pub struct Clock {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// The shared atomics (what the hit path reads, one pointer away) and the
    /// handle that keeps the ticker thread alive.
    Coarse {
        shared: Arc<Coarse>,
        _ticker: Arc<Ticker>,
    },
    Precise,
    Manual(ManualClock),
}

impl Default for Clock {
    fn default() -> Self {
        Self::coarse()
    }
}

/// What the ticker thread writes and the hit path reads.
#[derive(Debug)]
struct Coarse {
    base: Instant,
    nanos: AtomicU64,
    ticking: AtomicBool,
    stop: AtomicBool,
}

/// The handle every coarse [`Clock`] shares; dropping the last one stops the thread.
#[derive(Debug)]
struct Ticker {
    shared: Arc<Coarse>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            thread.thread().unpark();
            // The thread only sleeps and stores; it ends within one tick of being woken.
            if thread.join().is_err() {
                warn!("the DNS cache clock thread panicked");
            }
        }
    }
}

/// The live ticker, if any: every coarse clock made while one runs shares it.
static TICKER: Mutex<Weak<Ticker>> = Mutex::new(Weak::new());
static PRECISE_BASE: LazyLock<Instant> = LazyLock::new(Instant::now);

fn elapsed_nanos(base: Instant) -> u64 {
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn tick(shared: &Coarse) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(COARSE_TICK);
        shared
            .nanos
            .store(elapsed_nanos(shared.base), Ordering::Relaxed);
    }
}

fn start_ticker() -> Arc<Ticker> {
    let base = Instant::now();
    let shared = Arc::new(Coarse {
        base,
        nanos: AtomicU64::new(elapsed_nanos(base)),
        ticking: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let for_thread = Arc::clone(&shared);
    let spawned = std::thread::Builder::new()
        .name(COARSE_THREAD_NAME.to_owned())
        .spawn(move || tick(&for_thread));
    let thread = match spawned {
        Ok(thread) => {
            shared.ticking.store(true, Ordering::Release);
            Some(thread)
        }
        Err(e) => {
            warn!(error = %e, "cannot start the DNS cache clock thread; reading the system clock on every hit");
            None
        }
    };
    Arc::new(Ticker {
        shared,
        thread: Mutex::new(thread),
    })
}

impl Clock {
    /// The system's monotonic clock, read through a ticker thread shared by every
    /// coarse clock alive in the process: started by the first, stopped when the last
    /// is dropped. Falls back to reading the system clock on every call if the thread
    /// cannot be started.
    pub fn coarse() -> Self {
        let mut live = TICKER.lock().unwrap_or_else(PoisonError::into_inner);
        let ticker = match live.upgrade() {
            Some(ticker) => ticker,
            None => {
                let ticker = start_ticker();
                *live = Arc::downgrade(&ticker);
                ticker
            }
        };
        Self {
            kind: Kind::Coarse {
                shared: Arc::clone(&ticker.shared),
                _ticker: ticker,
            },
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
            Kind::Coarse { shared: c, .. } if c.ticking.load(Ordering::Relaxed) => {
                c.nanos.load(Ordering::Relaxed)
            }
            Kind::Coarse { shared: c, .. } => elapsed_nanos(c.base),
            Kind::Precise => elapsed_nanos(*PRECISE_BASE),
            Kind::Manual(m) => m.inner.offset_nanos.load(Ordering::SeqCst),
        }
    }

    /// `at` in [`ticks`](Self::ticks).
    pub(crate) fn ticks_of(&self, at: Instant) -> u64 {
        let base = match &self.kind {
            Kind::Coarse { shared: c, .. } => c.base,
            Kind::Precise => *PRECISE_BASE,
            Kind::Manual(m) => m.inner.base,
        };
        u64::try_from(at.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The current instant.
    #[inline]
    pub fn now(&self) -> Instant {
        match &self.kind {
            Kind::Coarse { shared: c, .. } if c.ticking.load(Ordering::Relaxed) => {
                c.base + Duration::from_nanos(c.nanos.load(Ordering::Relaxed))
            }
            Kind::Coarse { .. } | Kind::Precise => Instant::now(),
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
            assert!(
                clock.ticks() >= clock.ticks_of(now) || matches!(clock.kind, Kind::Coarse { .. })
            );
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
