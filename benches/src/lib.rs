//! Shared helpers for the criterion benchmarks in `benches/benches/`.

#![forbid(unsafe_code)]

/// The README's Rust snippet, compiled as a doctest so it stays true.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    //! The README tells proxy authors to use `dwara-lb` and `dwara-dns-cache`
    //! together; their public names must not collide with different meanings.

    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    // Glob imports, as a proxy using both crates might write them: a name both
    // export is ambiguous here and fails to compile.
    use dwara_dns_cache::*;
    use dwara_lb::*;

    #[test]
    fn lb_and_dns_cache_clocks_have_one_name_per_meaning() {
        // The cache's clock hands out instants …
        let manual = ManualClock::new();
        let cache_clock = Clock::from(manual.clone());
        let t0 = cache_clock.now();
        manual.advance(Duration::from_secs(2));
        assert_eq!(cache_clock.now() - t0, Duration::from_secs(2));

        // … the LB's ejection clock measures elapsed time for cool-downs.
        let ejection = Arc::new(ManualEjectionClock::new());
        let lb = UpstreamLb::builder(Policy::RoundRobin)
            .ejection(EjectionConfig::new(1, Duration::from_secs(10)))
            .clock(ejection.clone())
            .endpoints(EndpointSet::from_iter([
                Endpoint::new("10.0.0.1:80".parse().unwrap()),
                Endpoint::new("10.0.0.2:80".parse().unwrap()),
            ]))
            .build();
        let bad = "10.0.0.1:80".parse().unwrap();
        assert!(lb.report(bad, Outcome::Failure));
        assert!(lb.is_ejected(bad));
        ejection.advance(Duration::from_secs(11));
        assert_eq!(EjectionClock::now(&*ejection), Duration::from_secs(11));
        assert!(!lb.is_ejected(bad), "back after the cool-down");
    }
}
