//! A DNS outage: the client-response timer, the one background refresh per name and
//! its retries, and recovery, against the test server in drop and SERVFAIL mode.
//!
//! Expiry runs on a `ManualClock`; the timer, the resolver timeout and the retry
//! backoff run on real time. Latency bounds are generous multiples of the configured
//! timer, far below the resolver timeout a caller used to wait for.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use dwara_dns_cache::{DnsCache, DnsCacheConfig, LookupFamily, ManualClock};
use dwara_resolver::{DnsResolver, ResolverConfig};
use test_support::dns_server::{FailureMode, TestDnsServer};
use test_support::wait_until;

fn resolver(addr: SocketAddr, timeout: Duration) -> DnsResolver {
    DnsResolver::new(ResolverConfig {
        nameservers: vec![addr],
        timeout,
        attempts: 1,
        ..ResolverConfig::default()
    })
    .unwrap()
}

/// Serve-stale on a manual clock: TTL 30 s on the server, 60 s of `max_stale`.
fn stale_config(clock: &ManualClock, timer: Option<Duration>) -> DnsCacheConfig {
    DnsCacheConfig {
        clock: clock.clone().into(),
        family: LookupFamily::Ipv4,
        refresh_ahead: 0.0,
        max_stale: Duration::from_secs(60),
        stale_answer_ttl: Duration::from_secs(10),
        client_response_timeout: timer,
        refresh_retry_initial: Duration::from_millis(100),
        refresh_retry_max: Duration::from_millis(200),
        ..DnsCacheConfig::default()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A server answering `api.test` (TTL 30), a cache that has it, then the outage.
async fn expired_during_outage(
    mode: FailureMode,
    resolver_timeout: Duration,
    config: impl FnOnce(&ManualClock) -> DnsCacheConfig,
) -> (TestDnsServer, ManualClock, DnsCache) {
    test_support::init_tracing();
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 30);
    let clock = ManualClock::new();
    let cache = DnsCache::new(resolver(server.addr(), resolver_timeout), config(&clock)).unwrap();
    cache.resolve("api.test").await.unwrap();
    server.set_failure(mode);
    clock.advance(Duration::from_secs(31));
    (server, clock, cache)
}

#[tokio::test]
async fn silent_upstream_answers_stale_when_the_timer_fires() {
    let timer = Duration::from_millis(300);
    let resolver_timeout = Duration::from_secs(4);
    let (server, _clock, cache) = expired_during_outage(FailureMode::Drop, resolver_timeout, |c| {
        stale_config(c, Some(timer))
    })
    .await;

    let t = Instant::now();
    let answer = cache.resolve("api.test").await.unwrap();
    let waited = t.elapsed();
    assert_eq!(&*answer, &[ip("10.0.0.1")]);
    assert!(
        waited >= timer - Duration::from_millis(50),
        "answered stale after {waited:?}, before the {timer:?} timer (the upstream is silent)"
    );
    assert!(
        waited < timer + Duration::from_secs(1),
        "waited {waited:?} with a {timer:?} timer (resolver timeout {resolver_timeout:?})"
    );
    let stats = cache.stats();
    assert_eq!(
        (stats.stale_served, stats.client_timeouts, stats.refreshes),
        (1, 1, 1),
        "{stats:?}"
    );
    assert!(stats.longest_wait >= waited.min(timer - Duration::from_millis(50)));
    // The refresh keeps going behind the answer: the query is still out.
    assert_eq!(cache.refreshes_running(), 1);
    assert!(server.wait_for_queries(2, Duration::from_secs(5)).await);

    // The next caller is answered from the hit path, without waiting.
    let t = Instant::now();
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(cache.stats().misses, 2);
}

#[tokio::test]
async fn a_zero_timer_answers_stale_at_once_and_refreshes_behind() {
    let (server, _clock, cache) =
        expired_during_outage(FailureMode::Drop, Duration::from_secs(4), |c| {
            stale_config(c, Some(Duration::ZERO))
        })
        .await;

    let t = Instant::now();
    let answer = cache.resolve("api.test").await.unwrap();
    let waited = t.elapsed();
    assert_eq!(&*answer, &[ip("10.0.0.1")]);
    assert!(
        waited < Duration::from_millis(500),
        "a zero timer waited {waited:?}"
    );
    assert_eq!(cache.stats().client_timeouts, 1);
    // The background refresh asks the upstream after the caller has its answer.
    assert!(server.wait_for_queries(2, Duration::from_secs(5)).await);
    assert_eq!(cache.refreshes_running(), 1);
}

#[tokio::test]
async fn servfail_answers_stale_without_waiting_for_the_timer() {
    let timer = Duration::from_secs(10);
    let (_server, _clock, cache) =
        expired_during_outage(FailureMode::ServFail, Duration::from_secs(4), |c| {
            stale_config(c, Some(timer))
        })
        .await;

    let t = Instant::now();
    let answer = cache.resolve("api.test").await.unwrap();
    let waited = t.elapsed();
    assert_eq!(&*answer, &[ip("10.0.0.1")]);
    assert!(waited < timer / 2, "waited {waited:?} for a SERVFAIL");
    let stats = cache.stats();
    assert_eq!(stats.client_timeouts, 0, "{stats:?}");
    assert!(stats.refreshes_failed >= 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_callers_cause_one_query_per_attempt() {
    let timer = Duration::from_millis(100);
    let resolver_timeout = Duration::from_millis(300);
    let (server, clock, cache) = expired_during_outage(FailureMode::Drop, resolver_timeout, |c| {
        stale_config(c, Some(timer))
    })
    .await;
    // What one lookup costs the server while it drops queries.
    assert!(
        resolver(server.addr(), resolver_timeout)
            .lookup_a("probe.test")
            .await
            .is_err()
    );
    let one_lookup = server.query_count_for("probe.test.");
    assert!(one_lookup >= 1);

    const WAVES: u64 = 4;
    for wave in 0..WAVES {
        let failed_before = cache.stats().refreshes_failed;
        let tasks: Vec<_> = (0..1000)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move {
                    let t = Instant::now();
                    let answer = cache.resolve("api.test").await;
                    (answer, t.elapsed())
                })
            })
            .collect();
        for task in futures::future::join_all(tasks).await {
            let (answer, waited) = task.unwrap();
            assert_eq!(&*answer.unwrap(), &[ip("10.0.0.1")], "wave {wave}");
            assert!(
                waited < timer + Duration::from_secs(1),
                "wave {wave}: a caller waited {waited:?} with a {timer:?} timer"
            );
        }
        // Let the refresh fail once more, and the stale copy expire, before the next wave.
        assert!(
            wait_until(Duration::from_secs(10), || async {
                cache.stats().refreshes_failed > failed_before
            })
            .await,
            "wave {wave}: no further attempt failed: {:?}",
            cache.stats()
        );
        clock.advance(Duration::from_secs(10));
    }

    // Past TTL + max_stale: the refresh gives up after its current attempt.
    clock.advance(Duration::from_secs(60));
    assert!(
        wait_until(Duration::from_secs(10), || async {
            cache.stats().refreshes_abandoned == 1 && cache.refreshes_running() == 0
        })
        .await,
        "{:?}",
        cache.stats()
    );
    let stats = cache.stats();
    let attempts = 1 + stats.refresh_retries;
    assert_eq!(stats.refreshes, 1, "one refresh for the name: {stats:?}");
    assert_eq!(stats.refreshes_failed, attempts, "{stats:?}");
    assert!(attempts >= WAVES, "{stats:?}");
    assert_eq!(stats.upstream_queries, 1 + attempts, "{stats:?}");
    assert_eq!(
        server.query_count_for("api.test."),
        1 + attempts * one_lookup,
        "{} callers, {attempts} attempts: {stats:?}",
        1000 * WAVES
    );
    // Every caller got the stale answer, from the hit path or after its wait.
    assert_eq!(stats.stale_served, 1000 * WAVES, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fresh_answer_replaces_the_stale_one_when_the_upstream_is_back() {
    let (server, _clock, cache) =
        expired_during_outage(FailureMode::ServFail, Duration::from_secs(2), |c| {
            stale_config(c, Some(Duration::from_millis(1800)))
        })
        .await;
    assert_eq!(
        &*cache.resolve("api.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            cache.stats().refresh_retries >= 2
        })
        .await,
        "{:?}",
        cache.stats()
    );

    server.set_a("api.test.", &["10.0.0.2".parse().unwrap()], 30);
    server.set_failure(FailureMode::Answer);
    let recovered = Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            cache.resolve("api.test").await.unwrap()[..] == [ip("10.0.0.2")]
        })
        .await,
        "still stale 5 s after recovery: {:?}",
        cache.stats()
    );
    println!("fresh answer {:?} after recovery", recovered.elapsed());
    assert!(
        wait_until(Duration::from_secs(5), || async {
            cache.refreshes_running() == 0
        })
        .await
    );

    // No stampede: the fresh answer is cached, 1,000 callers send nothing more.
    let queries = server.query_count_for("api.test.");
    let answers = futures::future::join_all((0..1000).map(|_| cache.resolve("api.test"))).await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().unwrap()[..] == [ip("10.0.0.2")])
    );
    assert_eq!(server.query_count_for("api.test."), queries);
    assert_eq!(cache.stats().refreshes, 1, "{:?}", cache.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_ahead_retries_until_the_upstream_answers() {
    test_support::init_tracing();
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("hot.test.", &["10.0.0.1".parse().unwrap()], 30);
    let clock = ManualClock::new();
    let config = DnsCacheConfig {
        refresh_ahead: 0.2,
        ..stale_config(&clock, Some(Duration::from_millis(1800)))
    };
    let cache = DnsCache::new(resolver(server.addr(), Duration::from_secs(2)), config).unwrap();
    cache.resolve("hot.test").await.unwrap();
    server.set_failure(FailureMode::ServFail);
    clock.advance(Duration::from_secs(25)); // inside the last 20% of the TTL

    // A hit starts the refresh and is answered at once; the refresh fails and retries.
    assert_eq!(
        &*cache.resolve("hot.test").await.unwrap(),
        &[ip("10.0.0.1")]
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            cache.stats().refresh_retries >= 2
        })
        .await,
        "{:?}",
        cache.stats()
    );
    server.set_a("hot.test.", &["10.0.0.2".parse().unwrap()], 30);
    server.set_failure(FailureMode::Answer);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            cache.resolve("hot.test").await.unwrap()[..] == [ip("10.0.0.2")]
        })
        .await,
        "{:?}",
        cache.stats()
    );
    let stats = cache.stats();
    assert_eq!((stats.refreshes, stats.misses), (1, 1), "{stats:?}");
    assert_eq!(stats.stale_served, 0, "{stats:?}");
}
