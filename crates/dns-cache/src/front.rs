//! The hit path: a read-optimised map from cache key to the `Arc<Entry>` moka holds.
//!
//! Sharded by hash; each shard is an immutable `HashMap` behind an [`ArcSwap`], so a
//! read is a hash, an arc-swap load (thread-local bookkeeping only, no shared write)
//! and a map probe. Writes copy one shard (about 256 entries) and swap it in; they
//! only happen on misses, refreshes and evictions, which all cost far more than the
//! copy.
//!
//! **Invariant:** the front map never holds an entry moka does not hold. Entries are
//! added after moka has them (and withdrawn if moka replaced them meanwhile), and
//! moka's eviction listener withdraws every entry moka drops, by pointer identity, so
//! a late listener call never withdraws a newer entry of the same name.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use foldhash::fast::RandomState;

use crate::clock::Clock;
use crate::entry::{Answer, Entry};

/// What a hit needs, inline in the map's bucket: one probe, then only the answer's
/// reference count is touched (the `Entry` itself is a pointer chase away).
#[derive(Debug, Clone)]
pub(crate) struct Hot {
    /// [`Clock::ticks`] until which the answer is fresh.
    pub(crate) fresh_until: u64,
    /// Ticks from which a hit starts refresh-ahead (`u64::MAX`: never).
    pub(crate) refresh_at: u64,
    pub(crate) stale: bool,
    /// The addresses; `None` for a negative answer (the error is in `entry`).
    pub(crate) addrs: Option<Arc<[IpAddr]>>,
    pub(crate) entry: Arc<Entry>,
}

impl Hot {
    fn of(entry: &Arc<Entry>, clock: &Clock) -> Self {
        Self {
            fresh_until: clock.ticks_of(entry.fresh_until),
            refresh_at: entry.refresh_at.map_or(u64::MAX, |at| clock.ticks_of(at)),
            stale: entry.stale,
            addrs: match &entry.answer {
                Answer::Addrs(a) => Some(a.clone()),
                Answer::NoRecords(_) => None,
            },
            entry: entry.clone(),
        }
    }
}

// `Arc<str>` keys: copying a shard on a write bumps reference counts instead of
// allocating every key again.
type Shard = HashMap<Arc<str>, Hot, RandomState>;

pub(crate) struct FrontMap {
    shards: Box<[ArcSwap<Shard>]>,
    mask: usize,
    hasher: RandomState,
    clock: Clock,
}

impl std::fmt::Debug for FrontMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontMap")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl FrontMap {
    /// A map sized for about `capacity` entries (~256 per shard: few enough shard
    /// headers to stay in cache on the hit path, small enough to copy on a write).
    pub(crate) fn new(capacity: u64, clock: Clock) -> Self {
        let shards = usize::try_from(capacity / 256).unwrap_or(usize::MAX);
        let n = shards.clamp(16, 4096).next_power_of_two();
        let hasher = RandomState::default();
        let shards = (0..n)
            .map(|_| ArcSwap::from_pointee(HashMap::with_hasher(hasher.clone())))
            .collect();
        Self {
            shards,
            mask: n - 1,
            hasher,
            clock,
        }
    }

    #[inline]
    fn shard(&self, key: &str) -> &ArcSwap<Shard> {
        // High bits pick the shard; the shard's own table uses the low bits.
        let h = self.hasher.hash_one(key);
        let idx = usize::try_from(h >> 48).unwrap_or(0) & self.mask;
        &self.shards[idx]
    }

    /// Runs `f` on the entry of `key`, if any, without cloning it.
    #[inline]
    pub(crate) fn with<R>(&self, key: &str, f: impl FnOnce(&Hot) -> R) -> Option<R> {
        let shard = self.shard(key).load();
        shard.get(key).map(f)
    }

    /// Whether `key` maps to exactly `entry`.
    pub(crate) fn holds(&self, key: &str, entry: &Arc<Entry>) -> bool {
        self.with(key, |h| Arc::ptr_eq(&h.entry, entry))
            .unwrap_or(false)
    }

    /// Maps `key` to `entry`, replacing what was there.
    pub(crate) fn insert(&self, key: &str, entry: &Arc<Entry>) {
        let name: Arc<str> = Arc::from(key);
        let hot = Hot::of(entry, &self.clock);
        self.shard(key).rcu(|cur| {
            let mut next = Shard::clone(cur);
            next.insert(name.clone(), hot.clone());
            next
        });
    }

    /// Removes `key` if it maps to exactly `entry`.
    pub(crate) fn remove_if(&self, key: &str, entry: &Arc<Entry>) {
        let shard = self.shard(key);
        if !self.holds(key, entry) {
            return;
        }
        shard.rcu(|cur| {
            if cur.get(key).is_some_and(|h| Arc::ptr_eq(&h.entry, entry)) {
                let mut next = Shard::clone(cur);
                next.remove(key);
                Arc::new(next)
            } else {
                Arc::clone(cur)
            }
        });
    }

    /// Removes `key` whatever it maps to.
    pub(crate) fn remove(&self, key: &str) {
        let shard = self.shard(key);
        if self.with(key, |_| ()).is_none() {
            return;
        }
        shard.rcu(|cur| {
            let mut next = Shard::clone(cur);
            next.remove(key);
            next
        });
    }

    /// Entries held (sums the shards; not a hit-path operation).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.load().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DnsCacheConfig;
    use std::time::Instant;

    fn entry() -> Arc<Entry> {
        Arc::new(Entry::positive(
            &[("10.0.0.1".parse().unwrap(), 30)],
            Instant::now(),
            &DnsCacheConfig::default(),
        ))
    }

    #[test]
    fn insert_get_and_remove_by_identity() {
        let m = FrontMap::new(100, Clock::precise());
        let (a, b) = (entry(), entry());
        m.insert("a.test", &a);
        assert!(m.holds("a.test", &a));
        m.insert("a.test", &b);
        m.remove_if("a.test", &a); // a late eviction of the old entry
        assert!(m.holds("a.test", &b));
        m.remove_if("a.test", &b);
        assert!(m.with("a.test", |_| ()).is_none());
        for i in 0..500 {
            m.insert(&format!("n{i}.test"), &a);
        }
        assert_eq!(m.len(), 500);
        m.remove("n7.test");
        assert_eq!(m.len(), 499);
    }
}
