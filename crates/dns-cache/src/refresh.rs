//! Background refreshes and the client-response timer.
//!
//! A name has at most one background refresh (a [`Flight`]) at a time, whoever
//! started it: refresh-ahead on a hit late in the TTL, or a caller that found the
//! answer expired but still inside its serve-stale window. The flight asks the
//! upstream and, on failure, tries again after a capped, jittered exponential
//! backoff until it gets an answer or the entry's serve-stale window closes. The
//! number of callers never changes the number of queries: one per attempt.
//!
//! A caller with an expired answer waits for the flight's *first* attempt until the
//! client-response timer (RFC 8767 §5), started with that attempt, fires, and is then
//! answered stale (so it never waits longer than the timer); once an
//! attempt has failed the upstream is known to be failing, so later callers are
//! answered stale at once while the flight keeps trying. When an attempt succeeds,
//! its answer replaces the stale one in moka and on the hit path.
//!
//! Flights live in a mutex-guarded map that only the slow path touches; the hit path
//! reaches it at most once per entry (the entry's `refreshing` flag gates it).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dwara_resolver::ResolveError;
use foldhash::fast::RandomState;
use moka::ops::compute::Op;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::entry::Entry;
use crate::stats::Stats;
use crate::{Addrs, DnsCache, Inner, answer_of};

/// Where a flight is.
#[derive(Debug, Clone)]
pub(crate) enum Phase {
    /// Attempt `n` (from 1) is waiting for the upstream.
    Querying(u32),
    /// The last attempt failed; the next one starts after a backoff.
    BackingOff,
    /// The upstream answered; the entry is in moka and on the hit path.
    Answered(Arc<Entry>),
    /// Given up: the serve-stale window closed, or the cache was dropped.
    GaveUp,
}

/// One background refresh of one name.
#[derive(Debug)]
pub(crate) struct Flight {
    phase: watch::Sender<Phase>,
    /// The entry being refreshed: a refresh that finds moka holding a different,
    /// non-stale fresh entry stops (someone else already got an answer).
    origin: Arc<Entry>,
    /// When the first attempt started (real time): the client-response timer of every
    /// caller waiting on that attempt fires at `started + timer`, so a name's callers
    /// are released together, never later than `timer` after they arrived.
    started: tokio::time::Instant,
}

/// The running flights of one cache, by name.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    running: Mutex<HashMap<String, Arc<Flight>>>,
    jitter: RandomState,
}

impl Flights {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Flight>>> {
        // The map holds no invariant a panicking holder could break half-way.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A number in `[0, 1)` for the jitter of `key`'s `attempt`, different per cache.
    fn unit(&self, key: &str, attempt: u32) -> f64 {
        let bits = self.jitter.hash_one((key, attempt)) >> 11; // 53 bits
        #[allow(clippy::cast_precision_loss)] // exact: 53 bits fit an f64 mantissa
        let unit = bits as f64 / (1u64 << 53) as f64;
        unit
    }

    /// Names with a background refresh running (not a hit-path operation).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// The pause after failed attempt `attempt` (from 1): `initial` doubled per attempt,
/// capped at `max`, then scaled by `0.5 + unit / 2` (`unit` in `[0, 1)`), so the
/// retries of many names failing together spread over half the interval instead of
/// firing together when the upstream comes back.
pub(crate) fn backoff(attempt: u32, initial: Duration, max: Duration, unit: f64) -> Duration {
    let doublings = attempt.saturating_sub(1).min(31);
    let base = initial.saturating_mul(1u32 << doublings).min(max);
    base.mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0)
}

/// What joining a name's background refresh found.
pub(crate) enum Joined {
    /// The flight now running for the name (maybe started by this call).
    Flight(Arc<Flight>),
    /// No flight runs and the hit path already holds a newer, fresh answer.
    Refreshed,
    /// Not on a Tokio runtime: nothing can run in the background.
    NoRuntime,
}

impl DnsCache {
    /// Joins the background refresh of `key`, starting one if none runs. `seen` is
    /// the entry the caller found (expired, or due for refresh-ahead); the flight
    /// retries until `seen`'s serve-stale window closes.
    pub(crate) fn join_flight(&self, key: &str, seen: &Arc<Entry>) -> Joined {
        let inner = &*self.inner;
        let mut running = inner.flights.lock();
        if let Some(flight) = running.get(key) {
            return Joined::Flight(flight.clone());
        }
        // A flight that just succeeded published its answer before leaving the map,
        // so a caller that read the old entry before that sees the new one here.
        let now = inner.config.clock.ticks();
        let refreshed = inner
            .front
            .with(key, |hot| {
                !Arc::ptr_eq(&hot.entry, seen) && !hot.stale && now < hot.fresh_until
            })
            .unwrap_or(false);
        if refreshed {
            return Joined::Refreshed;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Joined::NoRuntime;
        };
        let (phase, _) = watch::channel(Phase::Querying(1));
        let flight = Arc::new(Flight {
            phase,
            origin: seen.clone(),
            started: tokio::time::Instant::now(),
        });
        running.insert(key.to_owned(), flight.clone());
        drop(running);
        Stats::bump(&inner.stats.refreshes);
        debug!(host = %key, "background refresh started");
        runtime.spawn(fly(
            Arc::downgrade(&self.inner),
            key.to_owned(),
            flight.clone(),
        ));
        Joined::Flight(flight)
    }

    /// A caller whose answer `expired` is inside its serve-stale window: the name's
    /// background refresh answers it if its first attempt does within `timer`;
    /// otherwise the stale answer does.
    pub(crate) async fn ride_out(&self, key: &str, expired: Arc<Entry>, timer: Duration) -> Addrs {
        let flight = match self.join_flight(key, &expired) {
            Joined::Flight(flight) => flight,
            Joined::Refreshed => match self.hit(key) {
                Some(answer) => return answer,
                None => return self.serve_stale(key, &expired).await,
            },
            Joined::NoRuntime => return self.serve_stale(key, &expired).await,
        };
        let mut phase = flight.phase.subscribe();
        let current = phase.borrow_and_update().clone();
        // `None`: the timer fired before the first attempt settled.
        let settled = match current {
            Phase::Querying(1) if !timer.is_zero() => {
                let first_settled = |p: &Phase| !matches!(p, Phase::Querying(1));
                let fires = flight.started + timer;
                match tokio::time::timeout_at(fires, phase.wait_for(first_settled)).await {
                    Ok(Ok(p)) => Some(p.clone()),
                    // The sender lives in `flight`, which we hold: only the timer ends it.
                    Ok(Err(_)) | Err(_) => None,
                }
            }
            Phase::Querying(1) => None,
            other => Some(other),
        };
        match settled {
            Some(Phase::Answered(entry)) => answer_of(key, &entry),
            Some(_) => self.serve_stale(key, &expired).await,
            None => {
                Stats::bump(&self.inner.stats.client_timeouts);
                debug!(host = %key, timer = ?timer, "client-response timer fired; answering stale");
                self.serve_stale(key, &expired).await
            }
        }
    }

    /// Answers `expired` stale, putting a copy on the hit path for the stale answer
    /// TTL (unless moka meanwhile got a fresh entry, which is answered instead).
    async fn serve_stale(&self, key: &str, expired: &Arc<Entry>) -> Addrs {
        let inner = &*self.inner;
        let now = inner.config.clock.now();
        let Some(copy) = Entry::stale_copy(expired, now, &inner.config) else {
            // The window closed while the caller waited: ask like any other miss.
            return self.load_through(key.to_owned(), None).await;
        };
        let copy = Arc::new(copy);
        let put = copy.clone();
        let kept = inner
            .store
            .entry_by_ref(key)
            .and_compute_with(|cur| {
                let op = match cur {
                    Some(cur) if cur.value().is_fresh(now) => Op::Nop,
                    _ => Op::Put(put),
                };
                std::future::ready(op)
            })
            .await
            .into_entry()
            .map_or(copy, |e| e.into_value());
        self.publish(key, &kept).await;
        if kept.stale {
            inner.stats.stale_served();
        }
        answer_of(key, &kept)
    }

    /// One upstream query of a background refresh. An answer (positive, or an
    /// authoritative NXDOMAIN/NODATA) replaces whatever the cache holds.
    async fn refresh_once(&self, key: &str) -> Result<Arc<Entry>, ResolveError> {
        let inner = &*self.inner;
        Stats::bump(&inner.stats.upstream_queries);
        let result = self.query(key).await;
        let now = inner.config.clock.now();
        let entry = match result {
            Ok(records) => Entry::positive(&records, now, &inner.config),
            Err(e) if e.is_no_records() => Entry::negative(e, now, &inner.config),
            Err(e) => return Err(e),
        };
        let entry = Arc::new(entry);
        inner.store.insert(key.to_owned(), entry.clone()).await;
        self.publish(key, &entry).await;
        Ok(entry)
    }

    /// A fresh, non-stale entry of `key` that is not `origin`: someone else's answer.
    async fn answered_elsewhere(&self, key: &str, origin: &Arc<Entry>) -> Option<Arc<Entry>> {
        let now = self.inner.config.clock.now();
        self.inner
            .store
            .get(key)
            .await
            .filter(|e| !Arc::ptr_eq(e, origin) && !e.stale && e.is_fresh(now))
    }
}

/// The body of a flight. It holds the cache only weakly between attempts, so a
/// dropped cache ends it.
async fn fly(cache: Weak<Inner>, key: String, flight: Arc<Flight>) {
    let deadline = flight.origin.stale_until;
    let mut attempt: u32 = 1;
    let end = loop {
        let Some(inner) = cache.upgrade() else {
            break Phase::GaveUp;
        };
        let this = DnsCache { inner };
        if attempt > 1 {
            if let Some(entry) = this.answered_elsewhere(&key, &flight.origin).await {
                break Phase::Answered(entry);
            }
            Stats::bump(&this.inner.stats.refresh_retries);
        }
        flight.phase.send_replace(Phase::Querying(attempt));
        let error = match this.refresh_once(&key).await {
            Ok(entry) => {
                if attempt > 1 {
                    debug!(host = %key, attempt, "background refresh succeeded after retrying");
                }
                break Phase::Answered(entry);
            }
            Err(e) => e,
        };
        let (config, stats) = (&this.inner.config, &this.inner.stats);
        Stats::bump(&stats.refreshes_failed);
        let unit = this.inner.flights.unit(&key, attempt);
        let pause = backoff(
            attempt,
            config.refresh_retry_initial,
            config.refresh_retry_max,
            unit,
        );
        if config.clock.now() + pause >= deadline {
            Stats::bump(&stats.refreshes_abandoned);
            warn!(host = %key, error = %error, kind = error.kind(), attempts = attempt,
                "background refresh gave up: the answer's serve-stale window closes");
            break Phase::GaveUp;
        }
        if attempt == 1 {
            warn!(host = %key, error = %error, kind = error.kind(), retry_in = ?pause,
                "background refresh failed; retrying until it succeeds or max_stale runs out");
        } else {
            debug!(host = %key, error = %error, kind = error.kind(), attempt, retry_in = ?pause,
                "background refresh failed again");
        }
        flight.phase.send_replace(Phase::BackingOff);
        drop(this);
        tokio::time::sleep(pause).await;
        attempt = attempt.saturating_add(1);
    };
    if let Some(inner) = cache.upgrade() {
        let mut running = inner.flights.lock();
        if running.get(&key).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
            running.remove(&key);
        }
    }
    flight.phase.send_replace(end);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitters_within_half() {
        let (initial, max) = (ms(100), ms(1000));
        let top = backoff(1, initial, max, 0.999_999);
        assert!(top > ms(99) && top < ms(100), "{top:?}");
        assert_eq!(backoff(1, initial, max, 0.0), ms(50));
        assert_eq!(backoff(2, initial, max, 0.0), ms(100));
        assert_eq!(backoff(3, initial, max, 0.0), ms(200));
        assert_eq!(backoff(4, initial, max, 0.0), ms(400));
        assert_eq!(backoff(5, initial, max, 0.0), ms(500)); // 1,600 capped at 1,000, halved
        for attempt in 6..100 {
            let d = backoff(attempt, initial, max, 0.5);
            assert_eq!(d, ms(750), "attempt {attempt}");
        }
        assert_eq!(backoff(u32::MAX, initial, max, 0.0), ms(500));
    }

    #[test]
    fn jitter_units_are_spread_and_in_range() {
        let flights = Flights::default();
        let units: Vec<f64> = (0..1000)
            .map(|i| flights.unit(&format!("n{i}.test"), 1))
            .collect();
        assert!(units.iter().all(|u| (0.0..1.0).contains(u)));
        let low = units.iter().filter(|u| **u < 0.5).count();
        assert!((350..650).contains(&low), "{low} of 1000 below 0.5");
    }
}
