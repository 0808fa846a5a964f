//! [`Entry`]: one cached answer with the instants that decide what it is good for.
//!
//! The same `Arc<Entry>` sits in moka (the store) and in the front map (the hit
//! path); its instants come from the cache's [`Clock`](crate::Clock) and are
//! immutable, so a reader needs no lock to decide whether it is fresh.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use dwara_resolver::ResolveError;

use crate::config::DnsCacheConfig;

/// What the upstream said.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Addresses (never empty).
    Addrs(Arc<[IpAddr]>),
    /// Authoritative NXDOMAIN or NODATA, kept for the negative TTL.
    NoRecords(ResolveError),
}

/// One cached answer.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) answer: Answer,
    /// Served from the cache until this instant.
    pub(crate) fresh_until: Instant,
    /// A hit at or after this instant starts a background refresh (refresh-ahead).
    pub(crate) refresh_at: Option<Instant>,
    /// Past `fresh_until`, the answer may still be served on upstream failure until here.
    pub(crate) stale_until: Instant,
    /// This is an expired answer re-served because the upstream failed (RFC 8767).
    pub(crate) stale: bool,
    /// A background refresh of this entry has been started.
    pub(crate) refreshing: AtomicBool,
    /// How long moka keeps the entry (real time): until nothing could use it any more.
    pub(crate) keep_for: Duration,
}

/// `ttl` seconds bounded to `[min, max]` (the bounds are validated: `min <= max`).
pub(crate) fn clamp_ttl(ttl: Duration, min: Duration, max: Duration) -> Duration {
    ttl.max(min).min(max)
}

impl Entry {
    /// A positive answer; its TTL is the smallest record TTL, clamped.
    pub(crate) fn positive(records: &[(IpAddr, u32)], now: Instant, cfg: &DnsCacheConfig) -> Self {
        let ttl_secs = records.iter().map(|(_, t)| *t).min().unwrap_or(0);
        let ttl = clamp_ttl(
            Duration::from_secs(u64::from(ttl_secs)),
            cfg.min_ttl,
            cfg.max_ttl,
        );
        let addrs: Arc<[IpAddr]> = records.iter().map(|(ip, _)| *ip).collect();
        let refresh_at = (cfg.refresh_ahead > 0.0 && !ttl.is_zero())
            .then(|| now + ttl.mul_f64(1.0 - cfg.refresh_ahead));
        Self {
            answer: Answer::Addrs(addrs),
            fresh_until: now + ttl,
            refresh_at,
            stale_until: now + ttl + cfg.max_stale,
            stale: false,
            refreshing: AtomicBool::new(false),
            keep_for: ttl + cfg.max_stale,
        }
    }

    /// A negative answer, for the SOA's negative TTL (or the configured default), clamped.
    pub(crate) fn negative(err: ResolveError, now: Instant, cfg: &DnsCacheConfig) -> Self {
        let ttl = err
            .negative_ttl()
            .map_or(cfg.negative_ttl, |s| Duration::from_secs(u64::from(s)));
        let ttl = clamp_ttl(ttl, cfg.min_ttl, cfg.max_negative_ttl);
        Self {
            answer: Answer::NoRecords(err),
            fresh_until: now + ttl,
            refresh_at: None,
            stale_until: now + ttl,
            stale: false,
            refreshing: AtomicBool::new(false),
            keep_for: ttl,
        }
    }

    /// The expired positive answer `prev`, re-served for `stale_answer_ttl` (never past
    /// its `stale_until`), or `None` when serve-stale does not apply.
    pub(crate) fn stale_copy(prev: &Entry, now: Instant, cfg: &DnsCacheConfig) -> Option<Self> {
        let Answer::Addrs(addrs) = &prev.answer else {
            return None;
        };
        if now >= prev.stale_until {
            return None;
        }
        let fresh_until = (now + cfg.stale_answer_ttl).min(prev.stale_until);
        Some(Self {
            answer: Answer::Addrs(addrs.clone()),
            fresh_until,
            refresh_at: None,
            stale_until: prev.stale_until,
            stale: true,
            refreshing: AtomicBool::new(false),
            keep_for: prev.stale_until - now,
        })
    }

    /// Whether the answer has expired at `now` but may still be served stale
    /// (a positive answer inside its serve-stale window).
    pub(crate) fn is_stale_servable(&self, now: Instant) -> bool {
        matches!(self.answer, Answer::Addrs(_)) && now >= self.fresh_until && now < self.stale_until
    }

    /// Whether the answer can be served at `now` without asking the upstream.
    #[inline]
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ttl_is_the_smallest_record_ttl_clamped() {
        let cfg = DnsCacheConfig {
            min_ttl: secs(5),
            max_ttl: secs(60),
            refresh_ahead: 0.25,
            ..DnsCacheConfig::default()
        };
        let now = Instant::now();
        let e = Entry::positive(&[(ip("10.0.0.1"), 30), (ip("10.0.0.2"), 20)], now, &cfg);
        assert_eq!(e.fresh_until - now, secs(20));
        assert_eq!(e.refresh_at.unwrap() - now, secs(15));
        assert!(e.is_fresh(now + secs(19)) && !e.is_fresh(now + secs(20)));
        let low = Entry::positive(&[(ip("10.0.0.1"), 0)], now, &cfg);
        assert_eq!(low.fresh_until - now, secs(5));
        let high = Entry::positive(&[(ip("10.0.0.1"), 86_400)], now, &cfg);
        assert_eq!(high.fresh_until - now, secs(60));
    }

    #[test]
    fn stale_copy_is_bounded_by_max_stale() {
        let cfg = DnsCacheConfig {
            min_ttl: secs(1),
            max_stale: secs(30),
            stale_answer_ttl: secs(10),
            ..DnsCacheConfig::default()
        };
        let now = Instant::now();
        let e = Entry::positive(&[(ip("10.0.0.1"), 10)], now, &cfg);
        assert_eq!(e.stale_until - now, secs(40));
        let s = Entry::stale_copy(&e, now + secs(12), &cfg).unwrap();
        assert!(s.stale);
        assert_eq!(s.fresh_until - now, secs(22));
        let s = Entry::stale_copy(&e, now + secs(35), &cfg).unwrap();
        assert_eq!(s.fresh_until - now, secs(40));
        assert!(Entry::stale_copy(&e, now + secs(40), &cfg).is_none());
        assert!(!e.is_stale_servable(now + secs(9)));
        assert!(e.is_stale_servable(now + secs(10)) && e.is_stale_servable(now + secs(39)));
        assert!(!e.is_stale_servable(now + secs(40)));
    }
}
