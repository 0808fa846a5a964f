//! Property tests: whatever the sets, updates and policy, a pick only ever returns an
//! endpoint of the current set (and, under SRV, of its lowest priority).

use std::collections::HashMap;
use std::net::SocketAddr;

use dwara_lb::{Endpoint, EndpointSet, Policy, UpstreamLb};
use proptest::prelude::*;

fn endpoint() -> impl Strategy<Value = Endpoint> {
    // a small address space so sets overlap between updates
    (
        0u8..24,
        prop_oneof![Just(80u16), Just(443)],
        0u16..5,
        0u16..4,
    )
        .prop_map(|(host, port, weight, priority)| {
            Endpoint::new(SocketAddr::from(([10, 0, 0, host], port)))
                .with_weight(weight)
                .with_priority(priority)
        })
}

fn endpoint_set() -> impl Strategy<Value = EndpointSet> {
    prop::collection::vec(endpoint(), 0..20).prop_map(EndpointSet::new)
}

fn policy() -> impl Strategy<Value = Policy> {
    prop::sample::select(Policy::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn picks_come_from_the_current_set(
        policy in policy(),
        seed in any::<u64>(),
        sets in prop::collection::vec(endpoint_set(), 1..6),
        keys in prop::collection::vec(any::<u32>(), 1..20),
    ) {
        let lb = std::sync::Arc::new(UpstreamLb::builder(policy).seed(seed).build());
        let mut handle = lb.handle();
        let mut held = Vec::new();
        for set in sets {
            lb.update(set.clone());
            prop_assert_eq!(lb.endpoints(), set.clone());
            let min_priority = set.iter().map(|e| e.priority).min();
            for k in &keys {
                let key = k.to_le_bytes();
                for guard in [lb.pick(), lb.pick_by_key(&key), handle.pick(), handle.pick_by_key(&key)] {
                    match guard {
                        Ok(g) => {
                            prop_assert_eq!(set.get(g.addr()), Some(g.endpoint()));
                            if policy == Policy::Srv {
                                prop_assert_eq!(Some(g.endpoint().priority), min_priority);
                            }
                            held.push(g);
                        }
                        Err(_) => prop_assert!(set.is_empty()),
                    }
                }
                for e in [lb.pick_endpoint(), handle.pick_endpoint_by_key(&key).copied()] {
                    match e {
                        Ok(e) => prop_assert_eq!(set.get(e.addr), Some(&e)),
                        Err(_) => prop_assert!(set.is_empty()),
                    }
                }
            }
        }
        // every in-flight count, current or draining, adds up to the guards alive
        let current: usize = lb.stats().endpoints.iter().map(|e| e.in_flight).sum();
        prop_assert_eq!(current + lb.draining(), held.len());
        drop(held);
        prop_assert_eq!(lb.draining(), 0);
        prop_assert!(lb.stats().endpoints.iter().all(|e| e.in_flight == 0));
    }

    #[test]
    fn endpoint_sets_are_sorted_and_unique(eps in prop::collection::vec(endpoint(), 0..40)) {
        let set = EndpointSet::new(eps.clone());
        prop_assert!(set.as_slice().windows(2).all(|w| w[0].addr < w[1].addr));
        for e in &eps {
            let kept = set.get(e.addr).copied();
            prop_assert!(kept.is_some());
            prop_assert!(kept <= Some(*e), "the most preferred duplicate is kept");
        }
        let again: EndpointSet = set.iter().rev().copied().collect();
        prop_assert_eq!(again, set);
    }

    #[test]
    fn smooth_round_robin_gives_each_its_weight_per_period(
        weights in prop::collection::vec(1u16..8, 1..10),
        start in 0usize..100,
    ) {
        let set: EndpointSet = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| Endpoint::new(SocketAddr::from(([10, 0, 0, i as u8], 80))).with_weight(w))
            .collect();
        let lb = UpstreamLb::builder(Policy::RoundRobin).endpoints(set).build();
        let g = weights.iter().fold(0u16, |a, &b| gcd(a, b));
        let period: usize = weights.iter().map(|&w| usize::from(w / g)).sum();
        for _ in 0..start {
            let _ = lb.pick();
        }
        let mut counts: HashMap<SocketAddr, usize> = HashMap::new();
        for _ in 0..period {
            *counts.entry(lb.pick().unwrap().addr()).or_default() += 1;
        }
        for (i, &w) in weights.iter().enumerate() {
            let a = SocketAddr::from(([10, 0, 0, i as u8], 80));
            prop_assert_eq!(counts.get(&a).copied().unwrap_or(0), usize::from(w / g));
        }
    }

    #[test]
    fn consistent_hash_agrees_across_instances_and_stays_put(
        set in endpoint_set(),
        keys in prop::collection::vec(any::<u64>(), 1..50),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let a = UpstreamLb::builder(Policy::ConsistentHash).seed(seeds.0).endpoints(set.clone()).build();
        let b = UpstreamLb::builder(Policy::ConsistentHash).seed(seeds.1).endpoints(set.clone()).build();
        for k in keys {
            let k = k.to_le_bytes();
            match (a.pick_by_key(&k), b.pick_by_key(&k)) {
                (Ok(x), Ok(y)) => {
                    prop_assert_eq!(x.addr(), y.addr());
                    prop_assert_eq!(a.pick_by_key(&k).unwrap().addr(), x.addr());
                }
                (Err(_), Err(_)) => prop_assert!(set.is_empty()),
                _ => prop_assert!(false, "instances disagree on emptiness"),
            }
        }
    }
}

fn gcd(a: u16, b: u16) -> u16 {
    if b == 0 { a } else { gcd(b, a % b) }
}
