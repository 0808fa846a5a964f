//! The DNS refresh cycle end to end: `DnsSource` + the refresh loop +
//! `DiscoveryTasks` + `UpstreamLb`, against the in-process test DNS server.
//!
//! Real time, short TTLs and intervals: the resolver talks to a real socket, and
//! tokio's paused clock would fire its timeouts while it waits on the network.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dwara_discovery::{
    DiscoverySnapshot, DiscoverySource, DiscoveryTasks, RefreshPolicy, UpstreamDiscovery,
};
use dwara_discovery_dns::{DnsDiscoveryConfig, DnsSource, RecordType};
use dwara_lb::{EndpointSet, Policy, UpstreamLb};
use dwara_resolver::{DnsResolver, ResolverConfig};
use test_support::dns_server::{FailureMode, SrvRecord, TestDnsServer};

mod lying;

const WAIT: Duration = Duration::from_secs(10);

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn source(
    server: &TestDnsServer,
    host: &str,
    rtype: RecordType,
    port: Option<u64>,
) -> Arc<dyn DiscoverySource> {
    let resolver = DnsResolver::new(ResolverConfig {
        nameservers: vec![server.addr()],
        timeout: Duration::from_millis(200),
        attempts: 1,
        ..ResolverConfig::default()
    })
    .unwrap();
    let mut config = DnsDiscoveryConfig::new(host);
    config.record_type = rtype;
    config.port = port;
    Arc::new(DnsSource::with_resolver(&config, resolver).unwrap())
}

/// A fast policy: 100 ms floor and first backoff, no jitter unless a test wants it.
fn policy(interval_s: u64, fail_open: bool, min_endpoints: usize) -> RefreshPolicy {
    RefreshPolicy {
        refresh_interval: Duration::from_secs(interval_s),
        fail_open,
        min_endpoints,
        min_refresh: Duration::from_millis(100),
        failure_backoff: Duration::from_millis(100),
        jitter: 0.0,
        resolve_timeout: Duration::from_secs(5),
    }
}

struct Running {
    lb: Arc<UpstreamLb>,
    up: UpstreamDiscovery,
    _tasks: DiscoveryTasks,
}

impl Running {
    fn start(source: Arc<dyn DiscoverySource>, policy: RefreshPolicy) -> Self {
        let lb = Arc::new(UpstreamLb::new(Policy::RoundRobin));
        let up = UpstreamDiscovery::new("test", lb.clone(), source, policy);
        let mut tasks = DiscoveryTasks::new();
        tasks.respawn(&DiscoverySnapshot {
            generation: 1,
            upstreams: vec![up.clone()],
        });
        Self {
            lb,
            up,
            _tasks: tasks,
        }
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.lb.endpoints().addrs().collect()
    }

    /// Waits until the published set equals `want`.
    async fn wait_for_set(&self, want: &[&str]) {
        let want: Vec<SocketAddr> = want.iter().map(|a| a.parse().unwrap()).collect();
        let mut rx = self.up.stats.subscribe_changes();
        let ok = tokio::time::timeout(WAIT, async {
            loop {
                if self.addrs() == want {
                    return;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        assert!(ok.is_ok(), "set is {:?}, wanted {want:?}", self.addrs());
    }

    /// Waits until `n` more resolutions have finished.
    async fn wait_resolutions(&self, n: u64) {
        let mut rx = self.up.stats.subscribe_resolutions();
        let target = *rx.borrow() + n;
        tokio::time::timeout(WAIT, rx.wait_for(|v| *v >= target))
            .await
            .expect("resolutions did not happen")
            .unwrap();
    }
}

#[tokio::test]
async fn short_ttl_drives_refresh_under_a_long_interval() {
    test_support::init_tracing();
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &[ip("10.0.0.1")], 2);
    let run = Running::start(
        source(&server, "api.test.", RecordType::A, Some(80)),
        policy(30, true, 1),
    );
    run.wait_for_set(&["10.0.0.1:80"]).await;

    server.set_a("api.test.", &[ip("10.0.0.2")], 2);
    let changed_at = Instant::now();
    run.wait_for_set(&["10.0.0.2:80"]).await;
    let took = changed_at.elapsed();
    // The change arrives at the next TTL expiry, far sooner than the 30 s interval.
    assert!(took < Duration::from_secs(4), "change took {took:?}");
    let last = run.up.stats.last().unwrap();
    assert_eq!(last.ttl_s, Some(2));
    assert_eq!(last.next_in_ms, 2000);
}

#[tokio::test]
async fn short_interval_drives_refresh_under_a_long_ttl() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("fast.test.", &[ip("10.0.0.1")], 60);
    server.set_a("slow.test.", &[ip("10.0.0.1")], 60);
    let fast = Running::start(
        source(&server, "fast.test.", RecordType::A, Some(80)),
        policy(1, true, 1),
    );
    let slow = Running::start(
        source(&server, "slow.test.", RecordType::A, Some(80)),
        policy(30, true, 1),
    );
    let started = Instant::now();
    // Interval 1 s: a query about every second (first one at once).
    fast.wait_resolutions(4).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2900),
        "4 resolutions in {took:?}"
    );
    assert!(server.query_count_for("fast.test.") >= 4);
    // Interval 30 s, TTL 60 s: still just the first query.
    assert_eq!(server.query_count_for("slow.test."), 1);
    assert_eq!(slow.up.stats.last().unwrap().next_in_ms, 30_000);
    // Unchanged answers published nothing after the first set.
    assert_eq!(fast.up.stats.counters().updates, 1);
}

async fn failure_keeps_or_clears(fail_open: bool) {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &[ip("10.0.0.1"), ip("10.0.0.2")], 1);
    let run = Running::start(
        source(&server, "api.test.", RecordType::A, Some(80)),
        policy(1, fail_open, 1),
    );
    run.wait_for_set(&["10.0.0.1:80", "10.0.0.2:80"]).await;

    for (i, mode) in [
        FailureMode::ServFail,
        FailureMode::Refused,
        FailureMode::Drop,
    ]
    .into_iter()
    .enumerate()
    {
        server.set_failure(mode);
        let failures_before = run.up.stats.counters().failures;
        run.wait_resolutions(2).await;
        assert!(
            run.up.stats.counters().failures > failures_before,
            "{mode:?}"
        );
        if fail_open {
            assert_eq!(
                run.addrs().len(),
                2,
                "{mode:?}: fail_open keeps the last set"
            );
            assert!(run.lb.pick().is_ok());
        } else {
            assert!(run.addrs().is_empty(), "{mode:?}: fail_closed clears");
            assert!(run.lb.pick().is_err(), "no endpoints: a proxy answers 503");
        }
        // Recovery restores, with whatever DNS now says.
        let third = format!("10.0.0.{}", i + 3);
        server.set_a("api.test.", &[ip("10.0.0.1"), ip(&third)], 1);
        server.set_failure(FailureMode::Answer);
        run.wait_for_set(&["10.0.0.1:80", &format!("{third}:80")])
            .await;
    }
    let c = run.up.stats.counters();
    if fail_open {
        assert_eq!(c.cleared, 0);
    } else {
        assert_eq!(c.cleared, 3);
    }
}

#[tokio::test]
async fn fail_open_keeps_the_last_set_on_servfail_refused_and_silence() {
    failure_keeps_or_clears(true).await;
}

#[tokio::test]
async fn fail_closed_clears_on_servfail_refused_and_silence_and_recovers() {
    failure_keeps_or_clears(false).await;
}

#[tokio::test]
async fn nxdomain_is_an_empty_answer_judged_by_the_floor() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_negative_ttl(1);
    server.set_a("api.test.", &[ip("10.0.0.1")], 1);
    // fail_open false: NXDOMAIN must not be treated as a failure, yet the floor keeps.
    let floored = Running::start(
        source(&server, "api.test.", RecordType::A, Some(80)),
        policy(1, false, 1),
    );
    let no_floor = Running::start(
        source(&server, "api.test.", RecordType::A, Some(80)),
        policy(1, true, 0),
    );
    floored.wait_for_set(&["10.0.0.1:80"]).await;
    no_floor.wait_for_set(&["10.0.0.1:80"]).await;

    server.remove("api.test.");
    no_floor.wait_for_set(&[]).await;
    floored.wait_resolutions(2).await;
    assert_eq!(
        floored.addrs(),
        vec!["10.0.0.1:80".parse::<SocketAddr>().unwrap()]
    );
    let c = floored.up.stats.counters();
    assert!(c.answers_empty >= 1 && c.below_floor >= 1, "{c:?}");
    assert_eq!(c.failures, 0, "NXDOMAIN is an answer, not a failure");
    assert_eq!(floored.up.stats.last().unwrap().outcome, "empty");
}

#[tokio::test]
async fn min_endpoints_keeps_the_previous_set_when_fewer_come_back() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a(
        "api.test.",
        &[ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")],
        1,
    );
    let run = Running::start(
        source(&server, "api.test.", RecordType::A, Some(80)),
        policy(1, true, 3),
    );
    run.wait_for_set(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"])
        .await;

    server.set_a("api.test.", &[ip("10.0.0.1"), ip("10.0.0.2")], 1);
    run.wait_resolutions(2).await;
    assert_eq!(run.addrs().len(), 3);
    assert!(run.up.stats.counters().below_floor >= 1);

    server.set_a(
        "api.test.",
        &[
            ip("10.0.0.4"),
            ip("10.0.0.5"),
            ip("10.0.0.6"),
            ip("10.0.0.7"),
        ],
        1,
    );
    run.wait_for_set(&["10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80", "10.0.0.7:80"])
        .await;
}

#[tokio::test]
async fn respawn_stops_the_old_generation_and_drop_stops_everything() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("old.test.", &[ip("10.0.0.1")], 1);
    server.set_a("new.test.", &[ip("10.0.0.2")], 1);
    let lb = Arc::new(UpstreamLb::new(Policy::RoundRobin));
    let snapshot = |generation, host| DiscoverySnapshot {
        generation,
        upstreams: vec![UpstreamDiscovery::new(
            "api",
            lb.clone(),
            source(&server, host, RecordType::A, Some(80)),
            policy(1, true, 1),
        )],
    };
    let mut tasks = DiscoveryTasks::new();
    tasks.respawn(&snapshot(1, "old.test."));
    assert!(server.wait_for_queries(2, WAIT).await);

    tasks.respawn(&snapshot(2, "new.test."));
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks.generation(), Some(2));
    // The new generation resolves; let any query of the old one still in flight land.
    let new_before = server.query_count_for("new.test.");
    assert!(
        test_support::wait_until(WAIT, || async {
            server.query_count_for("new.test.") >= new_before + 2
        })
        .await
    );
    let old = server.query_count_for("old.test.");
    let new = server.query_count_for("new.test.");
    // Two more refresh intervals: the old name is never asked again.
    assert!(
        test_support::wait_until(WAIT, || async {
            server.query_count_for("new.test.") >= new + 2
        })
        .await
    );
    assert_eq!(
        server.query_count_for("old.test."),
        old,
        "old generation still querying"
    );
    assert_eq!(
        lb.endpoints().addrs().collect::<Vec<_>>(),
        vec!["10.0.0.2:80".parse::<SocketAddr>().unwrap()]
    );

    drop(tasks);
    tokio::time::sleep(Duration::from_millis(300)).await; // an in-flight query may land
    let total = server.query_count();
    // Three refresh intervals with no query at all.
    assert!(
        !server
            .wait_for_queries(total + 1, Duration::from_secs(3))
            .await,
        "tasks still running after drop"
    );
}

#[tokio::test]
async fn guard_outlives_removal_and_new_picks_never_see_removed_endpoints() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &[ip("10.0.0.1"), ip("10.0.0.2")], 1);
    let run = Running::start(
        source(&server, "api.test.", RecordType::A, Some(80)),
        policy(1, true, 1),
    );
    run.wait_for_set(&["10.0.0.1:80", "10.0.0.2:80"]).await;

    let removed: SocketAddr = "10.0.0.1:80".parse().unwrap();
    let guard = loop {
        let g = run.lb.pick().unwrap();
        if g.addr() == removed {
            break g;
        }
    };
    server.set_a("api.test.", &[ip("10.0.0.2"), ip("10.0.0.3")], 1);
    run.wait_for_set(&["10.0.0.2:80", "10.0.0.3:80"]).await;

    // The "connection" taken before the removal still holds its endpoint.
    assert_eq!(guard.addr(), removed);
    assert_eq!(guard.endpoint().addr, removed);
    for _ in 0..1000 {
        assert_ne!(run.lb.pick().unwrap().addr(), removed);
    }
    drop(guard);
}

#[tokio::test]
async fn srv_discovery_carries_ports_weights_and_priorities() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_srv(
        "_api._tcp.test.",
        &[
            SrvRecord {
                priority: 10,
                weight: 60,
                port: 8080,
                target: "a.test.".into(),
            },
            SrvRecord {
                priority: 10,
                weight: 40,
                port: 8081,
                target: "b.test.".into(),
            },
            SrvRecord {
                priority: 20,
                weight: 1,
                port: 9090,
                target: "c.test.".into(),
            },
        ],
        5,
    );
    server.set_a("a.test.", &[ip("10.0.0.1")], 3);
    server.set_a("b.test.", &[ip("10.0.0.2")], 30);
    server.set_a("c.test.", &[ip("10.0.0.3")], 30);
    let run = Running::start(
        source(&server, "_api._tcp.test.", RecordType::SRV, None),
        policy(30, true, 1),
    );
    run.wait_for_set(&["10.0.0.1:8080", "10.0.0.2:8081", "10.0.0.3:9090"])
        .await;
    let set: EndpointSet = run.lb.endpoints();
    let got: Vec<(String, u16, u16)> = set
        .iter()
        .map(|e| (e.addr.to_string(), e.priority, e.weight))
        .collect();
    assert_eq!(
        got,
        vec![
            ("10.0.0.1:8080".into(), 10, 60),
            ("10.0.0.2:8081".into(), 10, 40),
            ("10.0.0.3:9090".into(), 20, 1),
        ]
    );
    // TTL is the minimum of SRV (5) and address (3) TTLs.
    assert_eq!(run.up.stats.last().unwrap().ttl_s, Some(3));
    assert!(
        server.query_count_for("c.test.") >= 1,
        "targets are resolved explicitly"
    );
}

#[tokio::test]
async fn a_failed_resolution_keeps_the_resolver_error_as_its_source() {
    use std::error::Error as _;

    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &[ip("10.0.0.1")], 1);
    server.set_failure(FailureMode::ServFail);
    let source = source(&server, "api.test.", RecordType::A, Some(80));
    let e = source.resolve().await.unwrap_err();
    assert_eq!(e.kind(), "servfail", "{e:?}");
    let resolve = e
        .source()
        .and_then(|s| s.downcast_ref::<dwara_resolver::ResolveError>())
        .unwrap_or_else(|| panic!("no typed ResolveError behind {e:?}"));
    assert!(
        matches!(
            resolve,
            dwara_resolver::ResolveError::ServerError { name, .. } if name == "api.test."
        ),
        "{resolve:?}"
    );
}
