//! Response rate limiting per client prefix (`--dns-rate-limit`), as BIND's RRL.
//!
//! A UDP query's source address can be forged, so an open name server is a
//! reflector: an attacker sends queries "from" a victim and the server sends the
//! replies to it. The limiter gives each client prefix (IPv4 /24, IPv6 /56: one
//! victim network whichever of its addresses is forged) a token bucket of `qps`
//! tokens per second holding at most `burst`; a query that finds the bucket empty is
//! not answered, except every `slip`th, which gets an empty truncated reply (TC=1,
//! no records: about the query's own size) so that a real client behind that prefix
//! retries over TCP, which cannot be forged and is never limited. A flood of forged
//! queries therefore reflects at most `qps` answers per prefix plus a fraction
//! `1/slip` of its own bytes.
//!
//! The buckets live in a table of bounded size (`buckets`, default
//! [`DEFAULT_BUCKETS`]): 64 shards behind their own locks, each a 4-way
//! set-associative array indexed by a randomly seeded hash of the prefix. A new prefix
//! takes the way whose bucket has been full (idle) the longest, so evicting one
//! loses no state unless all four ways of a set are being limited at once (counted
//! in `evictions`). The limiter is a GCRA: each bucket is one "theoretical arrival
//! time", so a check is a hash, a lock, a compare and a store.

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;

use crate::access::key;

/// The default of `--dns-rate-limit`: replies per second to one client prefix.
pub const DEFAULT_RATE_LIMIT_QPS: u32 = 2000;
/// The default of `--dns-rate-limit-slip`: every second limited query gets a
/// truncated reply (BIND's default).
pub const DEFAULT_SLIP: u32 = 2;
/// The default number of buckets (about 2 MiB).
pub const DEFAULT_BUCKETS: usize = 65_536;

const SHARDS: usize = 64;
const WAYS: usize = 4;

/// How replies to clients other than loopback are limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Replies per second to one client prefix; 0: no limit.
    pub qps: u32,
    /// Replies a prefix may get at once after being quiet (0: one second's worth,
    /// `qps`).
    pub burst: u32,
    /// Every `slip`th limited query gets an empty truncated reply; 0: none, 1: all.
    pub slip: u32,
    /// Most prefixes tracked at once (rounded up to a multiple of 256).
    pub buckets: usize,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            qps: DEFAULT_RATE_LIMIT_QPS,
            burst: 0,
            slip: DEFAULT_SLIP,
            buckets: DEFAULT_BUCKETS,
        }
    }
}

impl RateLimit {
    /// No limit.
    pub const OFF: Self = Self {
        qps: 0,
        burst: 0,
        slip: DEFAULT_SLIP,
        buckets: DEFAULT_BUCKETS,
    };
}

/// What to do with a query from a limited prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Within the limit: answer.
    Pass,
    /// Over the limit: an empty truncated reply.
    Slip,
    /// Over the limit: no reply.
    Drop,
}

/// The prefix a client is limited by: IPv4 /24, IPv6 /56.
#[inline]
pub(crate) fn prefix_key(ip: IpAddr) -> u128 {
    let k = key(ip);
    match ip.to_canonical() {
        IpAddr::V4(_) => k & !0xff,
        IpAddr::V6(_) => k & (u128::MAX << 72),
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    used: bool,
    key: u128,
    /// Theoretical arrival time (ns since the limiter started) of the next
    /// conforming query; the bucket is full when it is at or before now.
    tat: u64,
    /// Limited queries so far (for the slip).
    over: u32,
}

/// The limiter shared by every UDP worker.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    shards: Box<[Mutex<Box<[Slot]>>]>,
    sets: usize,
    /// Nanoseconds per token.
    interval: u64,
    /// Nanoseconds a full bucket is worth.
    capacity: u64,
    slip: u32,
    start: Instant,
    hasher: foldhash::fast::RandomState,
    evictions: Arc<AtomicU64>,
}

impl RateLimiter {
    /// `None` when `config.qps` is 0 (no limit). Evictions of buckets still
    /// limiting are counted in `evictions`.
    pub(crate) fn new(config: &RateLimit, evictions: Arc<AtomicU64>) -> Option<Self> {
        if config.qps == 0 {
            return None;
        }
        let interval = 1_000_000_000 / u64::from(config.qps);
        let burst = if config.burst == 0 {
            config.qps
        } else {
            config.burst
        };
        let sets = config.buckets.div_ceil(SHARDS * WAYS).max(1);
        Some(Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(vec![Slot::default(); sets * WAYS].into_boxed_slice()))
                .collect(),
            sets,
            interval,
            capacity: interval.saturating_mul(u64::from(burst)),
            slip: config.slip,
            start: Instant::now(),
            hasher: foldhash::fast::RandomState::default(),
            evictions,
        })
    }

    /// Charges one reply to `client`'s prefix at `now`.
    #[inline]
    pub(crate) fn check(&self, client: IpAddr, now: Instant) -> Verdict {
        let key = prefix_key(client);
        let hash = self.hasher.hash_one(key) as usize;
        let shard = &self.shards[hash % SHARDS];
        let set = (hash / SHARDS) % self.sets;
        // Nanoseconds since start fit u64 for 584 years.
        let now = now.saturating_duration_since(self.start).as_nanos() as u64;
        let mut slots = shard.lock();
        let ways = &mut slots[set * WAYS..(set + 1) * WAYS];
        let i = match ways.iter().position(|s| s.used && s.key == key) {
            Some(i) => i,
            None => {
                // A free way, else the one that has been full the longest.
                let i = ways
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| (s.used, s.tat))
                    .map_or(0, |(i, _)| i);
                if ways[i].used && ways[i].tat > now {
                    self.evictions.fetch_add(1, Relaxed);
                }
                ways[i] = Slot {
                    used: true,
                    key,
                    tat: now,
                    over: 0,
                };
                i
            }
        };
        let slot = &mut ways[i];
        let tat = slot.tat.max(now) + self.interval;
        if tat - now <= self.capacity {
            slot.tat = tat;
            return Verdict::Pass;
        }
        slot.over = slot.over.wrapping_add(1);
        if self.slip != 0 && slot.over.is_multiple_of(self.slip) {
            Verdict::Slip
        } else {
            Verdict::Drop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn limiter(qps: u32, burst: u32, slip: u32, buckets: usize) -> RateLimiter {
        RateLimiter::new(
            &RateLimit {
                qps,
                burst,
                slip,
                buckets,
            },
            Arc::default(),
        )
        .unwrap()
    }

    #[test]
    fn off_is_none() {
        assert!(RateLimiter::new(&RateLimit::OFF, Arc::default()).is_none());
    }

    #[test]
    fn prefixes_are_v4_24_and_v6_56() {
        assert_eq!(prefix_key(ip("10.1.2.3")), prefix_key(ip("10.1.2.200")));
        assert_eq!(
            prefix_key(ip("10.1.2.3")),
            prefix_key(ip("::ffff:10.1.2.9"))
        );
        assert_ne!(prefix_key(ip("10.1.2.3")), prefix_key(ip("10.1.3.3")));
        assert_eq!(
            prefix_key(ip("2001:db8:0:1ff::1")),
            prefix_key(ip("2001:db8:0:100:ffff::2"))
        );
        assert_ne!(
            prefix_key(ip("2001:db8:0:200::1")),
            prefix_key(ip("2001:db8:0:100::1"))
        );
    }

    #[test]
    fn a_burst_passes_then_the_rate_with_every_nth_slipped() {
        let l = limiter(10, 5, 3, 1024);
        let t0 = Instant::now();
        let c = ip("192.0.2.1");
        let verdicts: Vec<Verdict> = (0..11).map(|_| l.check(c, t0)).collect();
        use Verdict::{Drop, Pass, Slip};
        assert_eq!(
            verdicts,
            [
                Pass, Pass, Pass, Pass, Pass, Drop, Drop, Slip, Drop, Drop, Slip
            ]
        );
        // Another address of the same /24 shares the bucket; another /24 does not.
        assert_eq!(l.check(ip("192.0.2.77"), t0), Drop);
        assert_eq!(l.check(ip("192.0.3.1"), t0), Pass);
        // 100 ms later one token is back (10 per second), not more.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(l.check(c, t1), Pass);
        assert_ne!(l.check(c, t1), Pass);
        // A quiet second refills the bucket up to the burst only.
        let t2 = t1 + Duration::from_secs(10);
        let passed = (0..20).filter(|_| l.check(c, t2) == Pass).count();
        assert_eq!(passed, 5);
    }

    #[test]
    fn a_steady_client_at_the_rate_is_never_limited() {
        let l = limiter(1000, 0, 2, 1024);
        let t0 = Instant::now();
        let c = ip("198.51.100.7");
        for i in 0..10_000u64 {
            let t = t0 + Duration::from_micros(i * 1000);
            assert_eq!(l.check(c, t), Verdict::Pass, "query {i}");
        }
    }

    #[test]
    fn the_table_is_bounded_and_idle_buckets_go_first() {
        let l = limiter(1, 1, 0, 256);
        let t0 = Instant::now();
        let victim = ip("203.0.113.1");
        assert_eq!(l.check(victim, t0), Verdict::Pass);
        assert_eq!(l.check(victim, t0), Verdict::Drop);
        // Many other prefixes, each full again a second later: they evict each
        // other (and idle ones), at most WAYS per set, never more than the table.
        for i in 0..100_000u32 {
            let [a, b, c, _] = i.to_be_bytes();
            let other = IpAddr::from([10, a.wrapping_add(b), c, 1]);
            let _ = l.check(other, t0 + Duration::from_secs(2 + u64::from(i)));
        }
        let total: usize = l.shards.iter().map(|s| s.lock().len()).sum();
        assert_eq!(total, 256);
    }
}
