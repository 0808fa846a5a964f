//! [`DnsCacheConfig`]: capacity, TTL bounds, negative caching, serve-stale, refresh-ahead.

use std::time::Duration;

use crate::clock::Clock;
use crate::error::DnsCacheError;

/// Which address families a lookup asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LookupFamily {
    /// A only.
    Ipv4,
    /// AAAA only.
    Ipv6,
    /// A and AAAA, queried concurrently; IPv4 addresses first.
    #[default]
    Both,
}

/// How a [`DnsCache`](crate::DnsCache) behaves. `Default` is a sensible dial-path cache.
#[derive(Debug, Clone)]
pub struct DnsCacheConfig {
    /// Most names kept at once (moka evicts the least recently loaded beyond it).
    pub capacity: u64,
    /// Floor of a positive or negative TTL (TTL 0 would otherwise mean "query on every dial").
    pub min_ttl: Duration,
    /// Ceiling of a positive TTL.
    pub max_ttl: Duration,
    /// Negative TTL used when an NXDOMAIN/NODATA answer carries no SOA.
    pub negative_ttl: Duration,
    /// Ceiling of a negative TTL (the SOA's is used when present).
    pub max_negative_ttl: Duration,
    /// Serve-stale (RFC 8767): how long past its expiry an answer may still be served
    /// while the upstream fails. Zero turns serve-stale off.
    pub max_stale: Duration,
    /// While serving stale, how long a stale answer is handed out before the upstream
    /// is asked again (RFC 8767's stale answer TTL / failure recheck timer).
    pub stale_answer_ttl: Duration,
    /// Refresh-ahead: a name used in the last `refresh_ahead` fraction of its TTL is
    /// refreshed in the background. `0.0` turns it off; values are clamped to `[0, 1)`.
    pub refresh_ahead: f64,
    /// Address families to look up.
    pub family: LookupFamily,
    /// Time source for every freshness decision: [`Clock::coarse`] by default
    /// ([`Clock::precise`] reads the system clock on every hit; tests inject a
    /// [`ManualClock`](crate::ManualClock)).
    pub clock: Clock,
}

impl Default for DnsCacheConfig {
    fn default() -> Self {
        Self {
            capacity: 10_000,
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(5),
            max_negative_ttl: Duration::from_secs(60),
            max_stale: Duration::ZERO,
            stale_answer_ttl: Duration::from_secs(10),
            refresh_ahead: 0.2,
            family: LookupFamily::Both,
            clock: Clock::coarse(),
        }
    }
}

impl DnsCacheConfig {
    pub(crate) fn validate(&self) -> Result<(), DnsCacheError> {
        let fail = |m: String| Err(DnsCacheError::Config(m));
        if self.capacity == 0 {
            return fail("capacity must be at least 1".to_owned());
        }
        if self.min_ttl > self.max_ttl {
            return fail(format!(
                "min_ttl ({:?}) exceeds max_ttl ({:?})",
                self.min_ttl, self.max_ttl
            ));
        }
        if self.min_ttl > self.max_negative_ttl {
            return fail(format!(
                "min_ttl ({:?}) exceeds max_negative_ttl ({:?})",
                self.min_ttl, self.max_negative_ttl
            ));
        }
        if !self.refresh_ahead.is_finite() || !(0.0..1.0).contains(&self.refresh_ahead) {
            return fail(format!(
                "refresh_ahead must be in [0, 1), got {}",
                self.refresh_ahead
            ));
        }
        if !self.max_stale.is_zero() && self.stale_answer_ttl.is_zero() {
            return fail("stale_answer_ttl must be positive when max_stale is set".to_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_bounds_are_rejected() {
        assert!(DnsCacheConfig::default().validate().is_ok());
        let bad = DnsCacheConfig {
            min_ttl: Duration::from_secs(10),
            max_ttl: Duration::from_secs(5),
            ..DnsCacheConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("max_ttl"));
        let bad = DnsCacheConfig {
            refresh_ahead: 1.5,
            ..DnsCacheConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = DnsCacheConfig {
            capacity: 0,
            ..DnsCacheConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
