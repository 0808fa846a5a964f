//! [`DnsCacheConfig`]: capacity, TTL bounds, negative caching, serve-stale (with its
//! client-response timer), refresh-ahead and the retry backoff of background refreshes.

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
    /// Client-response timer (RFC 8767 §5, unbound's `serve-expired-client-timeout`):
    /// how long a caller whose answer has expired (but is within `max_stale`) waits
    /// for the upstream before it is answered stale, while one background refresh of
    /// the name keeps trying. It only bounds the wait on a name's first attempt: once
    /// an attempt has failed, callers are answered stale at once until the refresh
    /// succeeds. `Some(Duration::ZERO)` answers stale at once and refreshes behind
    /// (stale-while-revalidate). `None` turns the timer off: a caller waits for the
    /// upstream's own verdict (the resolver's timeout) before it gets the stale
    /// answer, as before this setting existed. Unused while `max_stale` is zero.
    pub client_response_timeout: Option<Duration>,
    /// First pause before a failed background refresh (refresh-ahead, or the refresh
    /// behind a stale answer) tries again; each retry doubles it up to
    /// `refresh_retry_max`, jittered to between half and all of it.
    pub refresh_retry_initial: Duration,
    /// Longest pause between two attempts of a background refresh. A refresh retries
    /// until it succeeds or its entry's serve-stale window (`max_stale` past expiry)
    /// runs out.
    pub refresh_retry_max: Duration,
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
            client_response_timeout: Some(Duration::from_millis(1800)),
            refresh_retry_initial: Duration::from_millis(250),
            refresh_retry_max: Duration::from_secs(10),
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
        if self.refresh_retry_initial.is_zero() {
            return fail("refresh_retry_initial must be positive".to_owned());
        }
        if self.refresh_retry_initial > self.refresh_retry_max {
            return fail(format!(
                "refresh_retry_initial ({:?}) exceeds refresh_retry_max ({:?})",
                self.refresh_retry_initial, self.refresh_retry_max
            ));
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
        let bad = DnsCacheConfig {
            refresh_retry_initial: Duration::from_secs(20),
            refresh_retry_max: Duration::from_secs(10),
            ..DnsCacheConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("refresh_retry_max")
        );
        let bad = DnsCacheConfig {
            refresh_retry_initial: Duration::ZERO,
            ..DnsCacheConfig::default()
        };
        assert!(bad.validate().is_err());
    }
}
