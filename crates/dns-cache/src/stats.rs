//! Counters: hits, misses, coalesced waiters, stale answers served, refreshes and
//! their failures and retries, evictions, upstream queries, bypasses, and how long
//! callers waited.
//!
//! Hit-path counters are striped over cache-line-padded slots picked per thread, so
//! two threads hitting the cache do not write the same cache line.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Debug, Default)]
struct Stripe {
    hits: AtomicU64,
    stale_served: AtomicU64,
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

#[inline]
fn slot() -> usize {
    SLOT.try_with(|s| {
        let v = s.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % STRIPES;
        s.set(v);
        v
    })
    .unwrap_or(0)
}

/// The live counters of one cache.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    stripes: [Stripe; STRIPES],
    pub(crate) misses: AtomicU64,
    pub(crate) coalesced: AtomicU64,
    pub(crate) refreshes: AtomicU64,
    pub(crate) refreshes_failed: AtomicU64,
    pub(crate) refresh_retries: AtomicU64,
    pub(crate) refreshes_abandoned: AtomicU64,
    pub(crate) client_timeouts: AtomicU64,
    waited_nanos: AtomicU64,
    longest_wait_nanos: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) upstream_queries: AtomicU64,
    pub(crate) bypassed: AtomicU64,
}

/// A snapshot of a cache's counters (monotonic since the cache was built).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Lookups answered from a fresh cached entry (positive or negative).
    pub hits: u64,
    /// Lookups that found no fresh entry (each went to, or waited on, the upstream).
    pub misses: u64,
    /// Misses that waited on another caller's upstream query instead of their own.
    pub coalesced: u64,
    /// Expired answers served because the upstream failed (RFC 8767).
    pub stale_served: u64,
    /// Background refreshes started (refresh-ahead, or behind a stale answer); each
    /// is one per name at a time and may make several attempts.
    pub refreshes: u64,
    /// Background refresh attempts that failed (timeout, SERVFAIL, …).
    pub refreshes_failed: u64,
    /// Background refresh attempts after a failed one (after a backoff).
    pub refresh_retries: u64,
    /// Background refreshes given up because the entry's serve-stale window closed.
    pub refreshes_abandoned: u64,
    /// Stale answers served because the client-response timer fired (or was zero)
    /// while the upstream had not answered yet.
    pub client_timeouts: u64,
    /// Total time callers spent on the slow path (every miss: waiting for the
    /// upstream, for another caller's query, or for the client-response timer).
    /// Hits do not wait. `waited / misses` is the mean wait of a miss.
    pub waited: Duration,
    /// The longest single wait of a caller so far.
    pub longest_wait: Duration,
    /// Entries evicted to stay within capacity.
    pub evictions: u64,
    /// Lookups sent upstream (misses that were not coalesced, plus refreshes).
    pub upstream_queries: u64,
    /// Lookups of IP literals and localhost, answered without the cache.
    pub bypassed: u64,
}

impl Stats {
    #[inline]
    pub(crate) fn hit(&self) {
        self.stripes[slot()].hits.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn stale_served(&self) {
        self.stripes[slot()]
            .stale_served
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Records one caller's time on the slow path.
    pub(crate) fn waited(&self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.waited_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.longest_wait_nanos.fetch_max(nanos, Ordering::Relaxed);
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CacheStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheStats {
            hits: self.stripes.iter().map(|s| get(&s.hits)).sum(),
            stale_served: self.stripes.iter().map(|s| get(&s.stale_served)).sum(),
            misses: get(&self.misses),
            coalesced: get(&self.coalesced),
            refreshes: get(&self.refreshes),
            refreshes_failed: get(&self.refreshes_failed),
            refresh_retries: get(&self.refresh_retries),
            refreshes_abandoned: get(&self.refreshes_abandoned),
            client_timeouts: get(&self.client_timeouts),
            waited: Duration::from_nanos(get(&self.waited_nanos)),
            longest_wait: Duration::from_nanos(get(&self.longest_wait_nanos)),
            evictions: get(&self.evictions),
            upstream_queries: get(&self.upstream_queries),
            bypassed: get(&self.bypassed),
        }
    }
}
