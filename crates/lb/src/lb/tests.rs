//! Unit tests of `UpstreamLb`: every policy, updates, guards, ejection.

use std::collections::HashMap;

use super::*;
use crate::ManualEjectionClock;
use crate::picker::Picker;

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 8080))
}

fn set(addrs: &[&str]) -> EndpointSet {
    addrs
        .iter()
        .map(|a| a.parse::<SocketAddr>().unwrap())
        .collect()
}

fn uniform(n: usize) -> EndpointSet {
    (0..n).map(addr).collect()
}

fn lb(policy: Policy, set: EndpointSet) -> UpstreamLb {
    UpstreamLb::builder(policy).seed(42).endpoints(set).build()
}

/// Counts picks per address over `n` picks (each guard dropped at once).
fn histogram(lb: &UpstreamLb, n: usize) -> HashMap<SocketAddr, usize> {
    let mut h = HashMap::new();
    for _ in 0..n {
        *h.entry(lb.pick().unwrap().addr()).or_default() += 1;
    }
    h
}

/// `got` is within 5 standard deviations of a binomial(n, p) count.
fn assert_near(got: usize, n: usize, p: f64) {
    let mean = n as f64 * p;
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    assert!(
        (got as f64 - mean).abs() <= 5.0 * sd + 1.0,
        "got {got}, expected {mean:.0} ± {:.0}",
        5.0 * sd
    );
}

#[test]
fn empty_is_no_endpoints_for_every_policy() {
    for policy in Policy::ALL {
        let lb = UpstreamLb::new(policy);
        assert_eq!(lb.pick().unwrap_err(), NoEndpoints);
        assert_eq!(lb.pick_by_key(b"k").unwrap_err(), NoEndpoints);
        assert!(lb.update(set(&["10.0.0.1:80"])));
        assert!(lb.pick().is_ok());
        assert!(lb.clear());
        assert!(!lb.clear());
        assert_eq!(lb.pick().unwrap_err(), NoEndpoints);
    }
}

#[test]
fn round_robin_cycles_in_order() {
    let lb = UpstreamLb::new(Policy::RoundRobin);
    lb.update(set(&["10.0.0.3:80", "10.0.0.1:80", "10.0.0.2:80"]));
    let picks: Vec<String> = (0..6)
        .map(|_| lb.pick().unwrap().addr().to_string())
        .collect();
    assert_eq!(
        picks,
        [
            "10.0.0.1:80",
            "10.0.0.2:80",
            "10.0.0.3:80",
            "10.0.0.1:80",
            "10.0.0.2:80",
            "10.0.0.3:80"
        ]
    );
}

#[test]
fn update_returns_false_on_equal_set() {
    let lb = UpstreamLb::new(Policy::RoundRobin);
    assert!(!lb.update(EndpointSet::empty()));
    assert!(lb.update(set(&["10.0.0.1:80", "10.0.0.2:80"])));
    assert!(!lb.update(set(&["10.0.0.2:80", "10.0.0.1:80"])));
    assert_eq!(lb.endpoints(), set(&["10.0.0.1:80", "10.0.0.2:80"]));
    // a weight change is a change
    let reweighted = EndpointSet::new(vec![
        Endpoint::new(addr(1)).with_weight(2),
        Endpoint::new(addr(2)),
    ]);
    assert!(lb.update(reweighted.clone()));
    assert!(!lb.update(reweighted));
}

#[test]
fn guard_survives_removal_and_counts_as_draining() {
    let lb = UpstreamLb::new(Policy::RoundRobin);
    let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
    lb.update(set(&["10.0.0.1:80"]));
    let guard = lb.pick().unwrap();
    assert_eq!(lb.in_flight(a), 1);
    // a stays: its count carries over
    lb.update(set(&["10.0.0.1:80", "10.0.0.2:80"]));
    assert_eq!(lb.in_flight(a), 1);
    assert!(!guard.is_draining());
    // a leaves: the guard still works, counts as draining, new picks never return it
    lb.update(set(&["10.0.0.2:80"]));
    assert_eq!(guard.addr(), a);
    assert!(guard.is_draining());
    assert_eq!(lb.draining(), 1);
    assert_eq!(lb.in_flight(a), 1);
    assert_eq!(lb.stats().draining, 1);
    for _ in 0..10 {
        assert_ne!(lb.pick().unwrap().addr(), a);
    }
    guard.report_failure(); // harmless on a removed endpoint
    drop(guard);
    assert_eq!(lb.in_flight(a), 0);
    assert_eq!(lb.draining(), 0);
}

#[test]
fn endpoint_back_before_draining_ends_keeps_its_count() {
    let lb = UpstreamLb::new(Policy::RoundRobin);
    let a = addr(1);
    lb.update(uniform(2));
    let guards: Vec<PickGuard> = (0..4).map(|_| lb.pick().unwrap()).collect();
    assert_eq!(lb.in_flight(a), 2);
    lb.update([addr(0)].into_iter().collect());
    assert_eq!(lb.draining(), 2);
    lb.update(uniform(2));
    assert_eq!(lb.draining(), 0);
    assert_eq!(lb.in_flight(a), 2);
    assert!(guards.iter().all(|g| !g.is_draining()));
    drop(guards);
    assert_eq!(lb.in_flight(a), 0);
}

#[test]
fn smooth_weighted_round_robin_matches_nginx() {
    // nginx's documented example: weights a=5, b=1, c=1 give a a b a c a a
    let eps = EndpointSet::new(vec![
        Endpoint::new(addr(1)).with_weight(5),
        Endpoint::new(addr(2)).with_weight(1),
        Endpoint::new(addr(3)).with_weight(1),
    ]);
    let lb = lb(Policy::RoundRobin, eps);
    let names: String = (0..14)
        .map(|_| match lb.pick().unwrap().addr() {
            a if a == addr(1) => 'a',
            a if a == addr(2) => 'b',
            _ => 'c',
        })
        .collect();
    assert_eq!(names, "aabacaaaabacaa");
}

#[test]
fn weighted_round_robin_is_exact_over_100k_picks() {
    let weights = [1u16, 2, 3, 10];
    let eps: EndpointSet = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| Endpoint::new(addr(i)).with_weight(w))
        .collect();
    let lb = lb(Policy::RoundRobin, eps);
    let n = 16 * 6250; // whole periods
    let h = histogram(&lb, n);
    for (i, &w) in weights.iter().enumerate() {
        assert_eq!(h[&addr(i)], n / 16 * w as usize);
    }
}

#[test]
fn random_and_weighted_random_within_tolerance() {
    let n = 100_000;
    let lb = lb(Policy::Random, uniform(10));
    let h = histogram(&lb, n);
    for i in 0..10 {
        assert_near(h[&addr(i)], n, 0.1);
    }
    let eps: EndpointSet = [1u16, 3, 6]
        .iter()
        .enumerate()
        .map(|(i, &w)| Endpoint::new(addr(i)).with_weight(w))
        .collect();
    let lb = UpstreamLb::builder(Policy::Random)
        .seed(7)
        .endpoints(eps)
        .build();
    let h = histogram(&lb, n);
    assert_near(h[&addr(0)], n, 0.1);
    assert_near(h[&addr(1)], n, 0.3);
    assert_near(h[&addr(2)], n, 0.6);
}

#[test]
fn same_seed_same_picks() {
    for policy in [
        Policy::Random,
        Policy::P2c,
        Policy::Srv,
        Policy::ConsistentHash,
    ] {
        let a = lb(policy, uniform(50));
        let b = lb(policy, uniform(50));
        let pa: Vec<_> = (0..100).map(|_| a.pick().unwrap().addr()).collect();
        let pb: Vec<_> = (0..100).map(|_| b.pick().unwrap().addr()).collect();
        assert_eq!(pa, pb, "{policy}");
    }
}

#[test]
fn p2c_prefers_the_less_loaded() {
    // two endpoints: P2C always compares both, so the idle one always wins
    let lb2 = lb(Policy::P2c, uniform(2));
    let busy = lb2.pick().unwrap();
    for _ in 0..100 {
        assert_ne!(lb2.pick().unwrap().addr(), busy.addr());
    }
    // ten endpoints, one heavily loaded: it can only win against an equally
    // loaded one, and there is none
    let lb10 = lb(Policy::P2c, uniform(10));
    // fifty requests in flight to endpoint 3 (a guard is a weak reference)
    let load: Vec<Weak<EndpointState>> = (0..50)
        .map(|_| Arc::downgrade(&lb10.current.load().states[3]))
        .collect();
    assert_eq!(lb10.in_flight(addr(3)), 50);
    let h = histogram(&lb10, 10_000);
    assert_eq!(h.get(&addr(3)), None);
    drop(load);
    // held picks spread evenly: the max load stays within a couple of the mean
    let lb = lb(Policy::P2c, uniform(10));
    let held: Vec<PickGuard> = (0..1000).map(|_| lb.pick().unwrap()).collect();
    let loads: Vec<usize> = (0..10).map(|i| lb.in_flight(addr(i))).collect();
    let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
    assert!(max - min <= 2, "{loads:?}");
    drop(held);
}

#[test]
fn p2c_weighted_takes_weight_into_account() {
    let eps: EndpointSet = [1u16, 4]
        .iter()
        .enumerate()
        .map(|(i, &w)| Endpoint::new(addr(i)).with_weight(w))
        .collect();
    let lb = lb(Policy::P2c, eps);
    let held: Vec<PickGuard> = (0..500).map(|_| lb.pick().unwrap()).collect();
    let (a, b) = (lb.in_flight(addr(0)), lb.in_flight(addr(1)));
    assert!(
        (95..=105).contains(&a) && (395..=405).contains(&b),
        "{a} {b}"
    );
    drop(held);
}

fn srv(entries: &[(usize, u16, u16)]) -> EndpointSet {
    entries
        .iter()
        .map(|&(i, prio, w)| Endpoint::new(addr(i)).with_priority(prio).with_weight(w))
        .collect()
}

#[test]
fn srv_uses_lowest_priority_group_weighted() {
    let lb = lb(
        Policy::Srv,
        srv(&[(0, 10, 10), (1, 10, 30), (2, 20, 100), (3, 5, 0), (4, 5, 0)]),
    );
    // priority 5 holds only zero-weight endpoints: uniform among them
    let h = histogram(&lb, 10_000);
    assert_eq!(h.len(), 2, "{h:?}");
    assert_near(h[&addr(3)], 10_000, 0.5);
    // priority 5 emptied: priority 10 takes over, weighted 1:3
    lb.update(srv(&[(0, 10, 10), (1, 10, 30), (2, 20, 100)]));
    let n = 100_000;
    let h = histogram(&lb, n);
    assert_eq!(h.get(&addr(2)), None, "priority 20 only when 10 is empty");
    assert_near(h[&addr(0)], n, 0.25);
    assert_near(h[&addr(1)], n, 0.75);
    lb.update(srv(&[(2, 20, 100), (5, 30, 1)]));
    let h = histogram(&lb, 1000);
    assert_eq!(h[&addr(2)], 1000);
}

#[test]
fn srv_zero_weight_is_rare_but_possible() {
    // RFC 2782: a weight-0 record has a very small chance when others have weight
    let lb = lb(Policy::Srv, srv(&[(0, 0, 0), (1, 0, 99)]));
    let n = 100_000;
    let h = histogram(&lb, n);
    assert_near(h[&addr(0)], n, 0.01);
}

#[test]
fn consistent_hash_is_sticky_and_spreads() {
    let lb = lb(Policy::ConsistentHash, uniform(10));
    let first = lb.pick_by_key(b"user-1").unwrap().addr();
    for _ in 0..10 {
        assert_eq!(lb.pick_by_key(b"user-1").unwrap().addr(), first);
    }
    // another process with the same set agrees (no per-process seed)
    let other = UpstreamLb::builder(Policy::ConsistentHash)
        .seed(1)
        .endpoints(uniform(10))
        .build();
    assert_eq!(other.pick_by_key(b"user-1").unwrap().addr(), first);
    let n = 100_000;
    let mut h: HashMap<SocketAddr, usize> = HashMap::new();
    for k in 0..n {
        let key = format!("key-{k}");
        *h.entry(lb.pick_by_key(key.as_bytes()).unwrap().addr())
            .or_default() += 1;
    }
    for i in 0..10 {
        // 160 points per endpoint: shares vary by ~8% of the ideal (see hash.rs)
        let share = h[&addr(i)] as f64 / n as f64;
        assert!((share - 0.1).abs() < 0.03, "{i}: {share}");
    }
    // keyless picks work too
    assert!(lb.pick().is_ok());
}

#[test]
fn consistent_hash_remaps_about_one_nth() {
    for n in [5usize, 20, 100] {
        let lb = lb(Policy::ConsistentHash, uniform(n));
        let keys: Vec<String> = (0..50_000).map(|k| format!("session-{k}")).collect();
        let before: Vec<SocketAddr> = keys
            .iter()
            .map(|k| lb.pick_by_key(k.as_bytes()).unwrap().addr())
            .collect();
        let gone = addr(n / 2);
        lb.update((0..n).map(addr).filter(|&a| a != gone).collect());
        let moved = keys
            .iter()
            .zip(&before)
            .filter(|(k, b)| lb.pick_by_key(k.as_bytes()).unwrap().addr() != **b)
            .count();
        let frac = moved as f64 / keys.len() as f64;
        let ideal = 1.0 / n as f64;
        assert!(
            frac >= ideal * 0.8 && frac <= ideal * 1.3,
            "n={n}: moved {frac:.4}, ideal {ideal:.4}"
        );
        // and only the keys of the endpoint that left moved
        let stayed_put = keys
            .iter()
            .zip(&before)
            .filter(|(_, b)| **b != gone)
            .all(|(k, b)| lb.pick_by_key(k.as_bytes()).unwrap().addr() == *b);
        assert!(stayed_put, "n={n}");
    }
}

#[test]
fn consistent_hash_weighted_remaps_close_to_the_departed_share() {
    let n = 50;
    let set = |skip: Option<usize>| -> EndpointSet {
        (0..n)
            .filter(|&i| Some(i) != skip)
            .map(|i| Endpoint::new(addr(i)).with_weight(1 + (i % 5) as u16))
            .collect()
    };
    let lb = lb(Policy::ConsistentHash, set(None));
    let keys: Vec<String> = (0..50_000).map(|k| format!("k{k}")).collect();
    let before: Vec<SocketAddr> = keys
        .iter()
        .map(|k| lb.pick_by_key(k.as_bytes()).unwrap().addr())
        .collect();
    let gone = addr(7); // weight 3, the average
    let own = before.iter().filter(|&&a| a == gone).count();
    lb.update(set(Some(7)));
    let moved = keys
        .iter()
        .zip(&before)
        .filter(|(k, b)| lb.pick_by_key(k.as_bytes()).unwrap().addr() != **b)
        .count();
    // the departed endpoint's keys, plus a little churn from rescaled stayers
    assert!(
        moved >= own && moved <= own + own / 2,
        "moved {moved}, own {own}"
    );
}

fn ejecting_lb(policy: Policy, set: EndpointSet) -> (UpstreamLb, Arc<ManualEjectionClock>) {
    let clock = Arc::new(ManualEjectionClock::new());
    let lb = UpstreamLb::builder(policy)
        .seed(3)
        .ejection(EjectionConfig::new(3, Duration::from_secs(10)))
        .clock(clock.clone())
        .endpoints(set)
        .build();
    (lb, clock)
}

#[test]
fn consecutive_failures_eject_for_the_cool_down() {
    for policy in Policy::ALL {
        let (lb, clock) = ejecting_lb(policy, uniform(3));
        let bad = addr(1);
        // two failures, a success, two failures: no streak of three
        for outcome in [
            Outcome::Failure,
            Outcome::Failure,
            Outcome::Success,
            Outcome::Failure,
            Outcome::Failure,
        ] {
            assert!(lb.report(bad, outcome));
        }
        assert!(!lb.is_ejected(bad));
        assert_eq!(lb.stats().endpoints[1].consecutive_failures, 2);
        // the third in a row ejects, reported on a guard
        let g = loop {
            let g = lb.pick_by_key(b"x").unwrap();
            if g.addr() == bad {
                break g;
            }
            // consistent hash with a fixed key: use the explicit API instead
            if policy == Policy::ConsistentHash {
                lb.report(bad, Outcome::Failure);
                break lb.pick().unwrap();
            }
        };
        if g.addr() == bad {
            g.report_failure();
        }
        drop(g);
        assert!(lb.is_ejected(bad), "{policy}");
        assert!(lb.stats().endpoints[1].ejected);
        let h = histogram(&lb, 1000);
        assert_eq!(h.get(&bad), None, "{policy}: ejected endpoint picked");
        for k in 0..1000u32 {
            assert_ne!(lb.pick_by_key(&k.to_le_bytes()).unwrap().addr(), bad);
        }
        // cool-down over: back in rotation
        clock.advance(Duration::from_secs(9));
        assert!(lb.is_ejected(bad));
        clock.advance(Duration::from_secs(1));
        assert!(!lb.is_ejected(bad));
        let h = histogram(&lb, 1000);
        assert!(h.get(&bad).copied().unwrap_or(0) > 0, "{policy}: {h:?}");
    }
}

#[test]
fn explicit_eject_and_uneject() {
    let lb = lb(Policy::RoundRobin, uniform(3));
    let a = addr(0);
    assert!(!lb.eject(addr(9), Duration::from_secs(1)), "not in the set");
    assert!(!lb.eject(a, Duration::ZERO));
    // without an ejection config reports only count
    for _ in 0..100 {
        lb.report(a, Outcome::Failure);
    }
    assert!(!lb.is_ejected(a));
    assert!(lb.eject(a, Duration::from_secs(3600)));
    assert!(lb.is_ejected(a));
    assert_eq!(histogram(&lb, 300).get(&a), None);
    assert!(lb.uneject(a));
    assert!(!lb.uneject(a));
    assert_eq!(histogram(&lb, 300)[&a], 100);
}

#[test]
fn ejection_survives_updates_for_endpoints_that_stay() {
    let lb = lb(Policy::Random, uniform(3));
    lb.eject(addr(0), Duration::from_secs(3600));
    lb.update(uniform(4));
    assert!(lb.is_ejected(addr(0)));
    assert_eq!(histogram(&lb, 1000).get(&addr(0)), None);
}

#[test]
fn all_ejected_still_picks() {
    for policy in Policy::ALL {
        let lb = lb(policy, uniform(3));
        for i in 0..3 {
            lb.eject(addr(i), Duration::from_secs(60));
        }
        assert!(lb.pick().is_ok(), "{policy}");
        assert!(lb.pick_by_key(b"k").is_ok(), "{policy}");
    }
}

#[test]
fn srv_ejection_falls_to_next_priority_only_when_group_is_all_ejected() {
    let lb = lb(Policy::Srv, srv(&[(0, 1, 1), (1, 1, 1), (2, 2, 1)]));
    lb.eject(addr(0), Duration::from_secs(60));
    let h = histogram(&lb, 1000);
    assert_eq!(h[&addr(1)], 1000);
    lb.eject(addr(1), Duration::from_secs(60));
    let h = histogram(&lb, 1000);
    assert_eq!(h[&addr(2)], 1000);
}

#[test]
fn consistent_hash_fallback_is_stable_per_key() {
    let lb = lb(Policy::ConsistentHash, uniform(10));
    let home = lb.pick_by_key(b"k").unwrap().addr();
    lb.eject(home, Duration::from_secs(60));
    let fallback = lb.pick_by_key(b"k").unwrap().addr();
    assert_ne!(fallback, home);
    for _ in 0..10 {
        assert_eq!(lb.pick_by_key(b"k").unwrap().addr(), fallback);
    }
    lb.uneject(home);
    assert_eq!(lb.pick_by_key(b"k").unwrap().addr(), home);
}

#[test]
fn a_key_retried_avoids_the_endpoints_tried_in_a_stable_order() {
    for n in [2, 3, 10] {
        let lb = lb(Policy::ConsistentHash, uniform(n));
        for k in 0..200u32 {
            let key = k.to_le_bytes();
            let home = lb.pick_by_key(&key).unwrap().addr();
            let pick = |tried: &[SocketAddr]| lb.pick_by_key_excluding(&key, tried).unwrap().addr();
            assert_eq!(pick(&[]), home);
            let second = pick(&[home]);
            assert_ne!(second, home, "{n} endpoints, key {k}");
            assert_eq!(pick(&[home]), second, "the same key falls back alike");
            if n > 2 {
                let third = pick(&[home, second]);
                assert!(third != home && third != second, "{n} endpoints, key {k}");
            }
            // Every endpoint tried: the key's own endpoint again.
            let all: Vec<SocketAddr> = (0..n).map(addr).collect();
            assert_eq!(pick(&all), home);
        }
    }
}

#[test]
fn a_key_retried_prefers_a_healthy_endpoint_and_keeps_its_own_pick_otherwise() {
    let lb = lb(Policy::ConsistentHash, uniform(3));
    let home = lb.pick_by_key(b"k").unwrap().addr();
    let others: Vec<SocketAddr> = (0..3).map(addr).filter(|a| *a != home).collect();
    lb.eject(others[0], Duration::from_secs(60));
    for _ in 0..20 {
        let next = lb.pick_by_key_excluding(b"k", &[home]).unwrap().addr();
        assert_eq!(next, others[1]);
    }
    // Only an ejected endpoint left untried: it, rather than one tried.
    let next = lb.pick_by_key_excluding(b"k", &[home, others[1]]).unwrap();
    assert_eq!(next.addr(), others[0]);
    let empty = UpstreamLb::new(Policy::ConsistentHash);
    assert_eq!(
        empty.pick_by_key_excluding(b"k", &[home]).unwrap_err(),
        NoEndpoints
    );
}

#[test]
fn lb_and_guard_are_send_sync_static() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<UpstreamLb>();
    assert_send_sync::<PickGuard>();
    assert_send_sync::<LbHandle>();
}

#[test]
fn handle_sees_every_update_at_its_next_pick() {
    for policy in Policy::ALL {
        let lb = Arc::new(lb(policy, uniform(3)));
        let mut h = lb.handle();
        assert!(uniform(3).contains(h.pick().unwrap().addr()));
        let next: EndpointSet = (10..13).map(addr).collect();
        lb.update(next.clone());
        for _ in 0..20 {
            assert!(next.contains(h.pick().unwrap().addr()), "{policy}");
            assert!(next.contains(h.pick_endpoint().unwrap().addr), "{policy}");
            assert!(
                next.contains(h.pick_by_key(b"k").unwrap().addr()),
                "{policy}"
            );
        }
        lb.clear();
        assert_eq!(h.pick().unwrap_err(), NoEndpoints);
        assert_eq!(h.pick_endpoint_by_key(b"k").unwrap_err(), NoEndpoints);
    }
}

#[test]
fn a_stale_handle_does_not_distort_in_flight_counts() {
    let lb = Arc::new(lb(Policy::P2c, uniform(2)));
    let (a, b) = (addr(0), addr(1));
    let mut h = lb.handle();
    let guard = h.pick().unwrap();
    let picked = guard.addr();
    let other = if picked == a { b } else { a };
    // the handle keeps the old snapshot until its next pick: the counts must not see it
    lb.update([picked, addr(2)].into_iter().collect());
    assert_eq!(lb.in_flight(picked), 1);
    assert_eq!(lb.in_flight(addr(2)), 0);
    assert_eq!(lb.in_flight(other), 0, "removed, no guard");
    assert_eq!(lb.draining(), 0);
    lb.update([addr(2)].into_iter().collect());
    assert_eq!(lb.draining(), 1, "the guard drains");
    assert!(guard.is_draining());
    drop(guard);
    assert_eq!(lb.draining(), 0, "the stale snapshot is not a request");
    assert!(lb.stats().endpoints.iter().all(|e| e.in_flight == 0));
    // P2C still compares true loads: endpoint 2 is in both the handle's cached
    // snapshot and the current one, endpoint 3 only in the current one
    let mut stale = lb.handle();
    let _ = stale.pick_endpoint();
    lb.update([addr(2), addr(3)].into_iter().collect());
    let busy = lb.pick().unwrap();
    for _ in 0..100 {
        assert_ne!(lb.pick().unwrap().addr(), busy.addr());
    }
    drop((stale, busy));
}

#[test]
fn handles_round_robin_evenly_between_them() {
    let lb = Arc::new(lb(Policy::RoundRobin, uniform(10)));
    let mut handles: Vec<LbHandle> = (0..3).map(|_| lb.handle()).collect();
    let mut counts: HashMap<SocketAddr, usize> = HashMap::new();
    let mut first = Vec::new();
    let position = |a: SocketAddr| (0..10).position(|i| addr(i) == a).unwrap();
    for h in &mut handles {
        let mut prev = None;
        for _ in 0..1_000 {
            let e = h.pick_endpoint().unwrap();
            match prev {
                None => first.push(e.addr),
                // each handle goes round in the set's order
                Some(p) => assert_eq!(position(e.addr), (p + 1) % 10),
            }
            prev = Some(position(e.addr));
            *counts.entry(e.addr).or_default() += 1;
        }
    }
    // 1,000 picks over 10 endpoints: exactly 100 each per handle
    assert!(counts.values().all(|&c| c == 300), "{counts:?}");
    first.dedup();
    assert!(
        first.len() > 1,
        "handles start at different positions: {first:?}"
    );
    // smooth weighted round robin too: each its weight per period, per handle
    let eps: EndpointSet = [5u16, 1, 1]
        .iter()
        .enumerate()
        .map(|(i, &w)| Endpoint::new(addr(i)).with_weight(w))
        .collect();
    let lb = Arc::new(self::lb(Policy::RoundRobin, eps));
    let mut h = lb.handle();
    let mut counts = [0usize; 3];
    for _ in 0..7_000 {
        let a = h.pick().unwrap().addr();
        counts[(0..3).position(|i| addr(i) == a).unwrap()] += 1;
    }
    assert_eq!(counts, [5_000, 1_000, 1_000]);
}

#[test]
fn seeded_handles_repeat_and_clones_draw_anew() {
    for policy in [Policy::Random, Policy::P2c, Policy::Srv, Policy::RoundRobin] {
        let picks = |h: &mut LbHandle| -> Vec<SocketAddr> {
            (0..100).map(|_| h.pick_endpoint().unwrap().addr).collect()
        };
        let a = Arc::new(lb(policy, uniform(50)));
        let b = Arc::new(lb(policy, uniform(50)));
        let (mut ha, mut hb) = (a.handle(), b.handle());
        let first = picks(&mut ha);
        assert_eq!(first, picks(&mut hb), "{policy}");
        let mut clone = ha.clone();
        assert_ne!(
            picks(&mut clone),
            picks(&mut ha),
            "{policy}: a clone is not in lockstep"
        );
        assert!(Arc::ptr_eq(clone.lb(), &a));
    }
}

#[test]
fn uncounted_picks_count_nothing() {
    let lb = Arc::new(lb(Policy::P2c, uniform(4)));
    let mut h = lb.handle();
    for _ in 0..100 {
        let _ = lb.pick_endpoint().unwrap();
        let _ = h.pick_endpoint().unwrap();
    }
    // keep the endpoints so that in flight would show if the picks had counted
    let held: Vec<Endpoint> = (0..10).map(|_| *h.pick_endpoint().unwrap()).collect();
    assert_eq!(held.len(), 10);
    assert!(lb.stats().endpoints.iter().all(|e| e.in_flight == 0));
    // but they do follow ejection
    lb.eject(addr(0), Duration::from_secs(60));
    for _ in 0..100 {
        assert_ne!(h.pick_endpoint().unwrap().addr, addr(0));
        assert_ne!(lb.pick_endpoint_by_key(b"k").unwrap().addr, addr(0));
    }
}

#[test]
fn ejection_count_returns_to_zero() {
    let (lb, clock) = ejecting_lb(Policy::RoundRobin, uniform(3));
    let count = || lb.shared.ejected.load(Ordering::SeqCst);
    assert!(lb.eject(addr(0), Duration::from_secs(1)));
    assert!(
        lb.eject(addr(0), Duration::from_secs(1)),
        "re-ejecting extends"
    );
    assert_eq!(count(), 1);
    assert!(lb.uneject(addr(0)));
    assert_eq!(count(), 0);
    // expiry, seen by a pick
    lb.eject(addr(1), Duration::from_secs(1));
    clock.advance(Duration::from_secs(2));
    let _ = histogram(&lb, 3);
    assert_eq!(count(), 0);
    // an ejected endpoint that leaves the set and has no guards
    lb.eject(addr(2), Duration::from_secs(1));
    lb.update(uniform(2));
    assert_eq!(count(), 0);
}

#[test]
fn alias_table_is_exact() {
    for weights in [
        vec![1u16, 3, 6],
        vec![7, 1, 1, 1, 1, 1, 1, 1],
        vec![65_535, 1, 2, 0],
        vec![5],
    ] {
        let eps: Vec<Endpoint> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Endpoint::new(addr(i)).with_weight(w))
            .collect();
        let mass = Picker::build(Policy::Random, &eps).alias_mass();
        let Some(mass) = mass else {
            assert!(weights.len() == 1, "uniform sets use the plain picker");
            continue;
        };
        let n = eps.len() as u64;
        for (e, m) in eps.iter().zip(mass) {
            assert_eq!(m, u64::from(e.weight.max(1)) * n, "{weights:?}");
        }
    }
}

#[test]
fn superseded_snapshots_are_freed_by_the_writer_not_by_picks() {
    let lb = Arc::new(lb(Policy::RoundRobin, uniform(3)));
    let retired = || lb.writer.lock().unwrap().retired.len();
    let mut h = lb.handle();
    let _ = h.pick_endpoint();
    lb.update(uniform(4));
    assert_eq!(retired(), 1, "the handle still holds the first snapshot");
    let held = Arc::downgrade(&lb.writer.lock().unwrap().retired[0]);
    let _ = h.pick_endpoint(); // reloads: lets go of the first snapshot…
    assert!(held.upgrade().is_some(), "…but does not free it");
    lb.update(uniform(5));
    assert!(held.upgrade().is_none(), "the next publish frees it");
    assert_eq!(retired(), 1, "the second snapshot, still in the handle");
    drop(h);
    lb.update(uniform(6));
    assert_eq!(retired(), 0);
}

#[test]
fn a_guard_outlives_its_load_balancer() {
    let lb = Arc::new(lb(Policy::RoundRobin, uniform(2)));
    let mut h = lb.handle();
    let (g1, g2) = (lb.pick().unwrap(), h.pick().unwrap());
    assert!(!g1.is_draining());
    drop((lb, h));
    // the states are gone with the load balancer; the guards still answer
    for g in [&g1, &g2] {
        assert!(uniform(2).contains(g.addr()));
        assert!(g.is_draining(), "no load balancer serves it any more");
        g.report_failure(); // nothing to report to: a no-op, not a panic
    }
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn updated_completes_once_a_new_set_is_published_and_wakes_its_task() {
    let lb = lb(Policy::RoundRobin, set(&["10.0.0.1:80", "10.0.0.2:80"]));
    let wakes = Arc::new(Wakes::default());
    let waker = Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let version = lb.version();
    let mut updated = Box::pin(lb.updated(version));
    assert!(updated.as_mut().poll(&mut cx).is_pending());
    // Polled again by the same task: still one watcher.
    assert!(updated.as_mut().poll(&mut cx).is_pending());
    // The same set again publishes nothing and wakes no one.
    assert!(!lb.update(set(&["10.0.0.2:80", "10.0.0.1:80"])));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
    assert!(updated.as_mut().poll(&mut cx).is_pending());
    assert!(lb.update(set(&["10.0.0.1:80"])));
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    assert!(updated.as_mut().poll(&mut cx).is_ready());
    assert!(lb.version() > version);
    // A set published before the future was made: ready at its first poll.
    assert!(lb.clear());
    assert!(
        Box::pin(lb.updated(version))
            .as_mut()
            .poll(&mut cx)
            .is_ready()
    );
    assert!(
        Box::pin(lb.updated(lb.version()))
            .as_mut()
            .poll(&mut cx)
            .is_pending()
    );
}

#[test]
fn updated_wakes_a_task_waiting_on_another_thread() {
    let lb = Arc::new(lb(Policy::RoundRobin, set(&["10.0.0.1:80"])));
    let version = lb.version();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let lb = lb.clone();
        std::thread::spawn(move || {
            // A one-future executor: park until woken, poll again.
            struct Unpark(std::thread::Thread);
            impl std::task::Wake for Unpark {
                fn wake(self: Arc<Self>) {
                    self.0.unpark();
                }
            }
            let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
            let mut cx = Context::from_waker(&waker);
            let mut updated = Box::pin(lb.updated(version));
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut polls = 0;
            // Not woken within the deadline: `None`, and the test fails.
            while std::time::Instant::now() < deadline {
                polls += 1;
                if updated.as_mut().poll(&mut cx).is_ready() {
                    return Some(polls);
                }
                if polls == 1 {
                    tx.send(()).unwrap();
                }
                std::thread::park_timeout(deadline - std::time::Instant::now());
            }
            None
        })
    };
    rx.recv().unwrap();
    assert!(lb.update(set(&["10.0.0.2:80"])));
    let polls = waiter.join().unwrap();
    assert!(polls.is_some_and(|p| p >= 2), "never woken: {polls:?}");
}
