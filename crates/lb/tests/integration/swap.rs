//! Two threads pick while a third swaps sets 10,000 times: no panic, no torn
//! snapshot, and once a swap has returned no pick sees a set from before it. One
//! thread picks through the `UpstreamLb`, the other through an `LbHandle` (its cached
//! snapshot must be revalidated on every pick).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use dwara_lb::{Endpoint, EndpointSet, NoEndpoints, Policy, UpstreamLb};

const SWAPS: u64 = 10_000;

/// Generation `g`'s set: every endpoint's port is `1000 + g % 60000` and its last
/// octet tells the generation's parity, so a pick names the generation it came from
/// and a mix of two generations would be visible. Every 16th generation is empty.
fn generation(g: u64) -> EndpointSet {
    if g % 16 == 15 {
        return EndpointSet::empty();
    }
    let port = 1000 + (g % 60_000) as u16;
    (0..(1 + g % 7) as u8)
        .map(|i| {
            Endpoint::new(SocketAddr::from(([10, 0, i, (g % 2) as u8], port)))
                .with_weight(1 + (g % 3) as u16)
                .with_priority((g % 2) as u16)
        })
        .collect()
}

fn generation_of(addr: SocketAddr) -> u64 {
    u64::from(addr.port() - 1000)
}

fn run(policy: Policy) {
    let lb = Arc::new(UpstreamLb::builder(policy).seed(9).build());
    lb.update(generation(0));
    // the newest generation whose update() has returned
    let published = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let pickers: Vec<_> = (0..2)
        .map(|t| {
            let (lb, published, done, started) =
                (lb.clone(), published.clone(), done.clone(), started.clone());
            thread::spawn(move || {
                let mut picks = 0u64;
                let mut key = t as u64;
                let mut handle = (t == 1).then(|| lb.handle());
                while !done.load(Ordering::Acquire) {
                    let floor = published.load(Ordering::Acquire);
                    key = key.wrapping_add(0x9E37_79B9);
                    let pick = match &mut handle {
                        Some(h) => h.pick_by_key(&key.to_le_bytes()),
                        None => lb.pick_by_key(&key.to_le_bytes()),
                    };
                    match pick {
                        Ok(g) => {
                            let seen = generation_of(g.addr());
                            assert!(
                                seen >= floor,
                                "{policy}: picked generation {seen} after {floor} was published"
                            );
                            let parity = match g.addr().ip() {
                                std::net::IpAddr::V4(ip) => u64::from(ip.octets()[3]),
                                std::net::IpAddr::V6(_) => unreachable!(),
                            };
                            assert_eq!(parity, seen % 2, "torn endpoint");
                            assert_eq!(g.endpoint().priority as u64, seen % 2, "torn endpoint");
                        }
                        Err(NoEndpoints) => {
                            // only an empty generation current during the pick may
                            // answer NoEndpoints
                            let after = published.load(Ordering::Acquire);
                            assert!(
                                (floor..=after + 1).any(|g| g % 16 == 15),
                                "{policy}: empty at {floor}..={after}"
                            );
                        }
                    }
                    picks += 1;
                    if picks == 1 {
                        started.fetch_add(1, Ordering::Release);
                    }
                }
                picks
            })
        })
        .collect();
    // swaps start once both pickers are picking, so they overlap
    while started.load(Ordering::Acquire) < 2 {
        thread::yield_now();
    }
    for g in 1..=SWAPS {
        assert!(lb.update(generation(g)));
        published.store(g, Ordering::Release);
    }
    done.store(true, Ordering::Release);
    let picks: u64 = pickers
        .into_iter()
        .map(|h| h.join().expect("picker thread panicked"))
        .sum();
    assert!(picks > 0);
    assert_eq!(lb.draining(), 0, "every guard was dropped");
}

#[test]
fn picks_never_see_a_set_older_than_the_last_swap() {
    for policy in Policy::ALL {
        run(policy);
    }
}
