//! `DnsCache` against the in-process test DNS server (which counts queries).
//!
//! Expiry is driven by a `ManualClock`; network behaviour (delays, concurrency,
//! refresh-ahead) runs on real time against the real server.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[cfg(feature = "hyper-util")]
mod hyper_adapter;
mod outage;
#[cfg(feature = "reqwest")]
mod reqwest_adapter;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dwara_dns_cache::{DnsCache, DnsCacheConfig, LookupFamily, ManualClock};
use dwara_resolver::{DnsResolver, ResolverConfig};
use test_support::dns_server::{FailureMode, TestDnsServer};

pub(crate) fn resolver_for(addr: SocketAddr) -> DnsResolver {
    DnsResolver::new(ResolverConfig {
        nameservers: vec![addr],
        timeout: Duration::from_millis(500),
        attempts: 1,
        ..ResolverConfig::default()
    })
    .unwrap()
}

/// A config on a manual clock, IPv4 only, refresh-ahead off (tests turn on what they test).
fn manual(clock: &ManualClock) -> DnsCacheConfig {
    DnsCacheConfig {
        clock: clock.clone().into(),
        family: LookupFamily::Ipv4,
        refresh_ahead: 0.0,
        ..DnsCacheConfig::default()
    }
}

async fn start() -> TestDnsServer {
    test_support::init_tracing();
    TestDnsServer::start().await.unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[tokio::test]
async fn ttl_is_honoured() {
    let server = start().await;
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 30);
    let clock = ManualClock::new();
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&clock)).unwrap();

    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    server.set_a("api.test.", &["10.0.0.2".parse().unwrap()], 30);
    clock.advance(secs(29));
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    assert_eq!(server.query_count_for("api.test."), 1);

    clock.advance(secs(1));
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.2")]
    );
    assert_eq!(server.query_count_for("api.test."), 2);
    let stats = cache.stats();
    assert_eq!(
        (stats.hits, stats.misses, stats.upstream_queries),
        (1, 2, 2)
    );
}

#[tokio::test]
async fn ttl_is_clamped_to_min_and_max() {
    let server = start().await;
    server.set_a("low.test.", &["10.0.0.1".parse().unwrap()], 1);
    server.set_a("high.test.", &["10.0.0.2".parse().unwrap()], 86_400);
    let clock = ManualClock::new();
    let config = DnsCacheConfig {
        min_ttl: secs(10),
        max_ttl: secs(60),
        ..manual(&clock)
    };
    let cache = DnsCache::new(resolver_for(server.addr()), config).unwrap();
    cache.resolve("low.test").await.unwrap();
    cache.resolve("high.test").await.unwrap();

    clock.advance(secs(9)); // TTL 1 raised to 10
    cache.resolve("low.test").await.unwrap();
    assert_eq!(server.query_count_for("low.test."), 1);
    clock.advance(secs(1));
    cache.resolve("low.test").await.unwrap();
    assert_eq!(server.query_count_for("low.test."), 2);

    clock.advance(secs(49)); // 59 s: TTL 86400 capped at 60
    cache.resolve("high.test").await.unwrap();
    assert_eq!(server.query_count_for("high.test."), 1);
    clock.advance(secs(1));
    cache.resolve("high.test").await.unwrap();
    assert_eq!(server.query_count_for("high.test."), 2);
}

#[tokio::test]
async fn names_are_normalised_and_literals_bypass_the_cache() {
    let server = start().await;
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 30);
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&ManualClock::new())).unwrap();

    for host in ["API.Test.", "api.test", "api.TEST", "api.test."] {
        assert_eq!(&*cache.resolve(host).await.unwrap(), &[ip("10.0.0.1")]);
    }
    assert_eq!(server.query_count_for("api.test."), 1);

    assert_eq!(
        &*cache.resolve("10.1.2.3").await.unwrap(),
        &[ip("10.1.2.3")]
    );
    assert_eq!(
        &*cache.resolve("[fd00::1]").await.unwrap(),
        &[ip("fd00::1")]
    );
    assert_eq!(
        &*cache.resolve("LocalHost.").await.unwrap(),
        &[ip("127.0.0.1"), ip("::1")]
    );
    let dial = cache.resolve_socket_addrs("api.test", 8080).await.unwrap();
    assert_eq!(dial, vec!["10.0.0.1:8080".parse::<SocketAddr>().unwrap()]);
    assert_eq!(server.query_count(), 1);
    assert_eq!(cache.stats().bypassed, 3);
}

#[tokio::test]
async fn negative_answers_are_cached_for_their_ttl() {
    let server = start().await;
    server.set_negative_ttl(7);
    server.set_aaaa("v6only.test.", &["fd00::1".parse().unwrap()], 30);
    let clock = ManualClock::new();
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&clock)).unwrap();

    for name in ["gone.test", "v6only.test"] {
        let err = cache.resolve(name).await.unwrap_err();
        assert!(err.is_no_records(), "{err}");
        assert!(cache.resolve(name).await.unwrap_err().is_no_records());
    }
    assert_eq!(server.query_count_for("gone.test."), 1);
    assert_eq!(server.query_count_for("v6only.test."), 1);

    clock.advance(secs(6));
    server.set_a("gone.test.", &["10.0.0.5".parse().unwrap()], 30);
    assert!(cache.resolve("gone.test").await.is_err());
    assert_eq!(server.query_count_for("gone.test."), 1);

    clock.advance(secs(1));
    assert_eq!(
        &*cache.resolve("gone.test").await.unwrap(),
        &[ip("10.0.0.5")]
    );
    assert_eq!(server.query_count_for("gone.test."), 2);
}

#[tokio::test]
async fn negative_ttl_is_clamped() {
    let server = start().await;
    server.set_negative_ttl(86_400);
    let clock = ManualClock::new();
    let config = DnsCacheConfig {
        max_negative_ttl: secs(30),
        ..manual(&clock)
    };
    let cache = DnsCache::new(resolver_for(server.addr()), config).unwrap();
    assert!(
        cache
            .resolve("gone.test")
            .await
            .unwrap_err()
            .is_no_records()
    );
    clock.advance(secs(29));
    assert!(
        cache
            .resolve("gone.test")
            .await
            .unwrap_err()
            .is_no_records()
    );
    assert_eq!(server.query_count_for("gone.test."), 1);
    clock.advance(secs(1));
    assert!(
        cache
            .resolve("gone.test")
            .await
            .unwrap_err()
            .is_no_records()
    );
    assert_eq!(server.query_count_for("gone.test."), 2);
}

#[tokio::test]
async fn failures_are_not_cached() {
    let server = start().await;
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 30);
    server.set_failure(FailureMode::ServFail);
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&ManualClock::new())).unwrap();

    let err = cache.resolve("api.test").await.unwrap_err();
    assert!(!err.is_no_records());
    assert_eq!(err.resolve_error().unwrap().kind(), "servfail");
    let first = server.query_count_for("api.test.");
    assert!(cache.resolve("api.test").await.is_err());
    assert!(
        server.query_count_for("api.test.") > first,
        "a failure was cached"
    );

    server.set_failure(FailureMode::Answer);
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_misses_send_one_query() {
    let server = start().await;
    server.set_a("hot.test.", &["10.0.0.1".parse().unwrap()], 30);
    server.set_delay(Duration::from_millis(200));
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&ManualClock::new())).unwrap();

    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.resolve("hot.test").await })
        })
        .collect();
    let answers: Vec<Arc<[IpAddr]>> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert_eq!(server.query_count_for("hot.test."), 1);
    assert!(answers.iter().all(|a| Arc::ptr_eq(a, &answers[0])));
    let stats = cache.stats();
    assert_eq!(stats.upstream_queries, 1);
    assert_eq!(stats.hits + stats.misses, 1000);
    assert_eq!(stats.coalesced, stats.misses - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_share_one_failure() {
    let server = start().await;
    server.set_failure(FailureMode::ServFail);
    server.set_delay(Duration::from_millis(200));
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&ManualClock::new())).unwrap();
    // What one lookup costs the server under SERVFAIL (hickory may retry).
    let resolver = resolver_for(server.addr());
    assert!(resolver.lookup_a("probe.test").await.is_err());
    let one_lookup = server.query_count_for("probe.test.");

    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.resolve("bad.test").await })
        })
        .collect();
    for result in futures::future::join_all(tasks).await {
        let err = result.unwrap().unwrap_err();
        assert_eq!(err.resolve_error().unwrap().kind(), "servfail");
    }
    assert_eq!(server.query_count_for("bad.test."), one_lookup);
    assert_eq!(cache.stats().upstream_queries, 1);
}

#[tokio::test]
async fn serve_stale_within_max_stale_then_the_error() {
    let server = start().await;
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 10);
    let clock = ManualClock::new();
    // Without the client-response timer every caller past the stale answer TTL asks
    // the upstream itself (`outage.rs` tests the timer and the background refresh).
    let config = DnsCacheConfig {
        max_stale: secs(60),
        stale_answer_ttl: secs(10),
        client_response_timeout: None,
        ..manual(&clock)
    };
    let cache = DnsCache::new(resolver_for(server.addr()), config).unwrap();
    cache.resolve("api.test").await.unwrap();
    server.set_failure(FailureMode::ServFail);

    clock.advance(secs(11)); // expired: the refresh fails, the old answer is served
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    let asked = server.query_count_for("api.test.");
    assert!(asked >= 2);
    assert_eq!(cache.stats().stale_served, 1);

    clock.advance(secs(5)); // within the stale answer TTL: no new query
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    assert_eq!(server.query_count_for("api.test."), asked);
    assert_eq!(cache.stats().stale_served, 2);

    clock.advance(secs(10)); // 26 s: asks again, still failing, still stale
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    assert!(server.query_count_for("api.test.") > asked);

    clock.advance(secs(44)); // 70 s = TTL 10 + max_stale 60: the error surfaces
    let err = cache.resolve("api.test").await.unwrap_err();
    assert_eq!(err.resolve_error().unwrap().kind(), "servfail");
    assert_eq!(cache.stats().stale_served, 3);

    server.set_failure(FailureMode::Answer);
    server.set_a("api.test.", &["10.0.0.2".parse().unwrap()], 10);
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.2")]
    );
}

#[tokio::test]
async fn serve_stale_on_a_timeout_too() {
    let server = start().await;
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 10);
    let clock = ManualClock::new();
    let config = DnsCacheConfig {
        max_stale: secs(60),
        ..manual(&clock)
    };
    let cache = DnsCache::new(resolver_for(server.addr()), config).unwrap();
    cache.resolve("api.test").await.unwrap();
    server.set_failure(FailureMode::Drop); // no answer: the resolver times out
    clock.advance(secs(11));
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    assert_eq!(cache.stats().stale_served, 1);
    clock.advance(secs(60));
    let err = cache.resolve("api.test").await.unwrap_err();
    assert_eq!(err.resolve_error().unwrap().kind(), "timeout");
}

#[tokio::test]
async fn without_max_stale_an_expired_answer_is_not_served() {
    let server = start().await;
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 10);
    let clock = ManualClock::new();
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&clock)).unwrap();
    cache.resolve("api.test").await.unwrap();
    server.set_failure(FailureMode::Refused);
    clock.advance(secs(10));
    let err = cache.resolve("api.test").await.unwrap_err();
    assert_eq!(err.resolve_error().unwrap().kind(), "refused");
    assert_eq!(cache.stats().stale_served, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_ahead_keeps_a_hot_name_from_waiting() {
    let server = start().await;
    server.set_a("hot.test.", &["10.0.0.1".parse().unwrap()], 2);
    server.set_delay(Duration::from_millis(200));
    // Real time: the background refresh talks to the real server.
    let config = DnsCacheConfig {
        family: LookupFamily::Ipv4,
        refresh_ahead: 0.5,
        ..DnsCacheConfig::default()
    };
    let cache = DnsCache::new(resolver_for(server.addr()), config).unwrap();

    cache.resolve("hot.test").await.unwrap(); // the first caller waits for DNS
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    while start.elapsed() < Duration::from_secs(5) {
        let t = Instant::now();
        assert_eq!(
            &*cache.resolve("hot.test").await.unwrap(),
            &[ip("10.0.0.1")]
        );
        slowest = slowest.max(t.elapsed());
        calls += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = cache.stats();
    assert!(
        slowest < Duration::from_millis(50),
        "a caller waited {slowest:?} (upstream delay 200 ms)"
    );
    assert_eq!(stats.misses, 1, "{stats:?}");
    assert!(stats.refreshes >= 2, "{stats:?}");
    assert!(server.query_count_for("hot.test.") >= 3);
    assert!(calls > 50);
}

#[tokio::test]
async fn capacity_bound_holds() {
    let server = start().await;
    for i in 0..200 {
        server.set_a(&format!("n{i}.test."), &["10.0.0.1".parse().unwrap()], 300);
    }
    let config = DnsCacheConfig {
        capacity: 50,
        ..manual(&ManualClock::new())
    };
    let cache = DnsCache::new(resolver_for(server.addr()), config).unwrap();
    for i in 0..200 {
        cache.resolve(&format!("n{i}.test")).await.unwrap();
        if i % 20 == 0 {
            cache.run_pending_tasks().await;
        }
    }
    cache.run_pending_tasks().await;
    assert!(cache.entry_count() <= 50, "{} entries", cache.entry_count());
    assert!(
        cache.front_len() <= 50,
        "{} on the hit path",
        cache.front_len()
    );
    assert!(cache.stats().evictions >= 150, "{:?}", cache.stats());

    // The most recent name is still served from the cache.
    let before = server.query_count();
    cache.resolve("n199.test").await.unwrap();
    assert_eq!(server.query_count(), before);
}

#[tokio::test]
async fn the_resolve_future_is_small() {
    // A hit must not move the miss path's kilobytes of state around.
    let server = start().await;
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&ManualClock::new())).unwrap();
    let size = size_of_val(&cache.resolve("api.test"));
    assert!(size <= 256, "resolve() future is {size} bytes");
}

#[tokio::test]
async fn invalidate_forgets_a_name() {
    let server = start().await;
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 300);
    let cache = DnsCache::new(resolver_for(server.addr()), manual(&ManualClock::new())).unwrap();
    cache.resolve("api.test").await.unwrap();
    server.set_a("api.test.", &["10.0.0.2".parse().unwrap()], 300);
    cache.invalidate("API.test.").await;
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.2")]
    );
    assert_eq!(server.query_count_for("api.test."), 2);
}

#[tokio::test]
async fn both_families_are_one_lookup() {
    let server = start().await;
    server.set_a("dual.test.", &["10.0.0.1".parse().unwrap()], 30);
    server.set_aaaa("dual.test.", &["fd00::1".parse().unwrap()], 30);
    let config = DnsCacheConfig {
        family: LookupFamily::Both,
        ..manual(&ManualClock::new())
    };
    let cache = DnsCache::new(resolver_for(server.addr()), config).unwrap();
    for _ in 0..3 {
        assert_eq!(
            &*cache.resolve("dual.test").await.unwrap(),
            &[ip("10.0.0.1"), ip("fd00::1")]
        );
    }
    assert_eq!(server.query_count_for("dual.test."), 2); // one A + one AAAA
}
