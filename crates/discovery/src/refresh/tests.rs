//! Policy tests (pure: no clock, no server) and the loop driven by a push source.

use std::time::Duration;

use dwara_lb::{Endpoint, EndpointSet};

use super::*;

fn set(addrs: &[&str]) -> EndpointSet {
    addrs
        .iter()
        .map(|a| Endpoint::new(a.parse().unwrap()))
        .collect()
}

fn answer(addrs: &[&str], ttl: Option<u64>) -> Result<Resolution, DiscoveryError> {
    Ok(Resolution {
        endpoints: set(addrs),
        ttl: ttl.map(Duration::from_secs),
    })
}

fn failure() -> Result<Resolution, DiscoveryError> {
    Err(DiscoveryError::Timeout {
        source_name: "test".into(),
        after: Duration::from_secs(1),
    })
}

#[test]
fn failures_follow_fail_open() {
    let open = RefreshPolicy::default();
    let closed = RefreshPolicy {
        fail_open: false,
        ..RefreshPolicy::default()
    };
    let current = set(&["10.0.0.1:80"]);
    assert_eq!(decide(&open, &current, &failure()), Decision::KeepOnFailure);
    assert_eq!(decide(&closed, &current, &failure()), Decision::Clear);
    assert_eq!(
        decide(&closed, &EndpointSet::empty(), &failure()),
        Decision::Unchanged
    );
}

#[test]
fn floor_keeps_previous_set_but_never_holds_at_zero() {
    let p = RefreshPolicy {
        min_endpoints: 2,
        ..RefreshPolicy::default()
    };
    let current = set(&["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]);
    assert_eq!(
        decide(&p, &current, &answer(&["10.0.0.1:80"], None)),
        Decision::KeepBelowFloor
    );
    assert_eq!(
        decide(&p, &current, &answer(&[], None)),
        Decision::KeepBelowFloor
    );
    assert_eq!(
        decide(&p, &current, &answer(&["10.0.0.1:80", "10.0.0.9:80"], None)),
        Decision::Publish(set(&["10.0.0.1:80", "10.0.0.9:80"]))
    );
    // Starting from nothing, one endpoint beats none.
    assert_eq!(
        decide(&p, &EndpointSet::empty(), &answer(&["10.0.0.1:80"], None)),
        Decision::Publish(set(&["10.0.0.1:80"]))
    );
    // min_endpoints 0 lets an empty answer through.
    let zero = RefreshPolicy {
        min_endpoints: 0,
        ..RefreshPolicy::default()
    };
    assert_eq!(
        decide(&zero, &current, &answer(&[], None)),
        Decision::Publish(EndpointSet::empty())
    );
}

#[test]
fn unchanged_answers_publish_nothing() {
    let p = RefreshPolicy::default();
    let current = set(&["10.0.0.1:80", "10.0.0.2:80"]);
    assert_eq!(
        decide(
            &p,
            &current,
            &answer(&["10.0.0.2:80", "10.0.0.1:80"], Some(5))
        ),
        Decision::Unchanged
    );
}

#[test]
fn delay_is_min_of_interval_and_ttl_with_floor() {
    let p = RefreshPolicy {
        refresh_interval: Duration::from_secs(30),
        jitter: 0.0,
        ..RefreshPolicy::default()
    };
    assert_eq!(
        next_delay(&p, &answer(&["10.0.0.1:80"], Some(2)), 0, 0.5),
        Duration::from_secs(2)
    );
    assert_eq!(
        next_delay(&p, &answer(&["10.0.0.1:80"], Some(600)), 0, 0.5),
        Duration::from_secs(30)
    );
    assert_eq!(
        next_delay(&p, &answer(&["10.0.0.1:80"], None), 0, 0.5),
        Duration::from_secs(30)
    );
    // TTL 0 is floored.
    assert_eq!(
        next_delay(&p, &answer(&["10.0.0.1:80"], Some(0)), 0, 0.5),
        Duration::from_secs(1)
    );
}

#[test]
fn jitter_only_shortens_and_respects_the_floor() {
    let p = RefreshPolicy::default(); // jitter 0.1
    let d = next_delay(&p, &answer(&["10.0.0.1:80"], Some(10)), 0, 0.999);
    assert!(
        d <= Duration::from_secs(10) && d >= Duration::from_secs(9),
        "{d:?}"
    );
    let d = next_delay(&p, &answer(&["10.0.0.1:80"], Some(1)), 0, 0.999);
    assert_eq!(d, Duration::from_secs(1));
}

#[test]
fn failures_back_off_up_to_the_interval() {
    let p = RefreshPolicy {
        refresh_interval: Duration::from_secs(10),
        jitter: 0.0,
        ..RefreshPolicy::default()
    };
    let delays: Vec<u64> = (1..=6)
        .map(|n| next_delay(&p, &failure(), n, 0.0).as_secs())
        .collect();
    assert_eq!(delays, vec![1, 2, 4, 8, 10, 10]);
    // Absurd failure counts do not overflow.
    assert_eq!(
        next_delay(&p, &failure(), u32::MAX, 0.0),
        Duration::from_secs(10)
    );
}

/// A reader racing the refresh loop sees each outcome counted on its own: with only
/// empty answers and failures recorded, a snapshot never shows a non-empty answer
/// (deriving it as `answers - empty_answers` from two loads once did, or underflowed).
#[test]
fn outcome_counts_stay_consistent_while_the_loop_records() {
    use std::sync::atomic::AtomicUsize;

    const ROUNDS: u64 = 1_000_000;
    let stats = Arc::new(DiscoveryStats::default());
    let running = Arc::new(AtomicUsize::new(2));
    let writers: Vec<_> = [answer(&[], None), failure()]
        .into_iter()
        .map(|result| {
            let (stats, running) = (stats.clone(), running.clone());
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    stats.record_resolution(&result);
                }
                running.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();
    let mut reads = 0u64;
    let mut last = Counters::default();
    while running.load(Ordering::SeqCst) > 0 {
        let c = stats.counters();
        assert!(
            c.answers_nonempty == 0
                && c.answers_empty >= last.answers_empty
                && c.failures >= last.failures
                && c.resolutions() <= 2 * ROUNDS,
            "inconsistent snapshot after {reads} reads: {c:?} (before: {last:?})"
        );
        last = c;
        reads += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    let c = stats.counters();
    assert_eq!(
        (c.answers_nonempty, c.answers_empty, c.failures),
        (0, ROUNDS, ROUNDS)
    );
    assert_eq!((c.answers(), c.resolutions()), (ROUNDS, 2 * ROUNDS));
}

/// A push source: a set changed in place, and a watch marked on every change.
#[derive(Debug)]
struct Pushed {
    set: Mutex<EndpointSet>,
    changes: watch::Sender<u64>,
}

impl Pushed {
    fn put(&self, addrs: &[&str]) {
        *self.set.lock() = set(addrs);
        self.changes.send_modify(|g| *g += 1);
    }
}

#[async_trait::async_trait]
impl DiscoverySource for Pushed {
    fn describe(&self) -> String {
        "pushed".into()
    }

    async fn resolve(&self) -> Result<Resolution, DiscoveryError> {
        Ok(Resolution {
            endpoints: self.set.lock().clone(),
            ttl: None,
        })
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }
}

/// With a refresh interval of a day only the pushes can move the set; a push that
/// leaves the answer as it was is not counted as a resolution.
#[tokio::test]
async fn a_push_source_is_resolved_on_each_change_and_only_then() {
    let source = Arc::new(Pushed {
        set: Mutex::new(set(&[])),
        changes: watch::Sender::new(0),
    });
    let lb = Arc::new(UpstreamLb::new(dwara_lb::Policy::RoundRobin));
    let stats = Arc::new(DiscoveryStats::default());
    let policy = RefreshPolicy {
        refresh_interval: Duration::from_secs(86_400),
        ..RefreshPolicy::default()
    };
    let task = tokio::spawn(run(
        "api".into(),
        source.clone(),
        lb.clone(),
        policy,
        stats.clone(),
    ));
    let mut resolved = stats.subscribe_resolutions();
    async fn until(rx: &mut watch::Receiver<u64>, n: u64) {
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|r| *r >= n))
            .await
            .expect("no resolution")
            .expect("loop gone");
    }
    until(&mut resolved, 1).await;
    source.put(&["10.0.0.1:80"]);
    until(&mut resolved, 2).await;
    assert_eq!(lb.endpoints(), set(&["10.0.0.1:80"]));
    // An unrelated change: same answer, nothing counted.
    source.changes.send_modify(|g| *g += 1);
    source.put(&["10.0.0.1:80", "10.0.0.2:80"]);
    until(&mut resolved, 3).await;
    assert_eq!(lb.endpoints(), set(&["10.0.0.1:80", "10.0.0.2:80"]));
    assert_eq!(stats.counters().resolutions(), 3);
    assert_eq!(stats.counters().updates, 2);
    task.abort();
}
