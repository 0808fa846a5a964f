//! A DNS server that lies to discovery ([`test_support::liar`]): wrong IDs, TC=1
//! with no TCP to retry on, compression loops, TTL 0, thousands of records, answers
//! for another name, and noise. The published endpoint set is never poisoned (only
//! addresses of the asked name, on the configured port); a lie that makes the
//! resolution fail keeps the last good set under `fail_open` and clears it without;
//! and the refresh loop keeps asking at its cadence (counted at the server, with
//! generous bounds).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dwara_discovery_dns::RecordType;
use test_support::liar::{Addresses, Lie, LyingDnsServer};

use super::{Running, policy};

const POISON: Ipv4Addr = Ipv4Addr::new(6, 6, 6, 6);

fn addresses() -> Addresses {
    Addresses {
        truth: vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)],
        mixed: Ipv4Addr::new(10, 0, 0, 9),
        poison: POISON,
        thousands: [10, 1],
    }
}

fn set(ips: &[Ipv4Addr]) -> BTreeSet<SocketAddr> {
    ips.iter().map(|ip| SocketAddr::from((*ip, 80))).collect()
}

/// Every lie for 1.5 s against a refresh loop with a 1 s interval (100 ms floor and
/// first backoff): after each lie the set is the truth, or 10.0.0.9 alone after the
/// mixed one (its one record for the asked name); after a lie that failed the
/// resolution it is the truth under `fail_open` and empty without; nothing published
/// ever holds the poison; between 1 and 60 queries reach the liar in each window (a
/// 1 s interval asks at least once, a hot loop would ask thousands of times).
async fn lies_against_discovery(fail_open: bool) {
    let addrs = addresses();
    let liar = LyingDnsServer::start(addrs.clone()).unwrap();
    let resolver = dwara_resolver::DnsResolver::new(dwara_resolver::ResolverConfig {
        nameservers: vec![liar.addr()],
        timeout: Duration::from_millis(200),
        attempts: 1,
        ..dwara_resolver::ResolverConfig::default()
    })
    .unwrap();
    let mut config = dwara_discovery_dns::DnsDiscoveryConfig::new("api.test.");
    config.record_type = RecordType::A;
    config.port = Some(80);
    let source =
        Arc::new(dwara_discovery_dns::DnsSource::with_resolver(&config, resolver).unwrap());
    let run = Running::start(source, policy(1, fail_open, 1));
    let good = set(&addrs.truth);
    let good_strs: Vec<String> = good.iter().map(ToString::to_string).collect();
    let good_strs: Vec<&str> = good_strs.iter().map(String::as_str).collect();
    run.wait_for_set(&good_strs).await;

    // Every set published, as the watcher sees it.
    let seen = Arc::new(Mutex::new(Vec::<BTreeSet<SocketAddr>>::new()));
    let changes = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (lb, seen, changes) = (run.lb.clone(), seen.clone(), changes.clone());
        let mut rx = run.up.stats.subscribe_changes();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                seen.lock().unwrap().push(lb.endpoints().addrs().collect());
                changes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let thousands = set(&addrs.thousands());
    let mixed = set(&[addrs.mixed]);
    let mut report = Vec::new();
    let mut cleared_by_lies = 0;
    for lie in Lie::ALL {
        liar.set_lie(lie);
        let before = liar.queries();
        let counters = run.up.stats.counters();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let asked = liar.queries() - before;
        let after = run.up.stats.counters();
        let failed = after.failures - counters.failures;
        let now: BTreeSet<SocketAddr> = run.addrs().into_iter().collect();
        if failed > 0 {
            // Within the window the lie never changes: once a resolution failed,
            // every later one failed too (a cached truth can only come first).
            if fail_open {
                assert_eq!(now, good, "{lie:?}: fail_open keeps the last good set");
            } else {
                assert!(
                    now.is_empty(),
                    "{lie:?}: without fail_open the set is cleared, is {now:?}"
                );
                assert!(
                    after.cleared > counters.cleared,
                    "{lie:?}: the clear is counted"
                );
                cleared_by_lies += 1;
            }
        } else {
            // The mixed lie's one record for the asked name is a true answer; hickory
            // takes at most 4,096 bytes over UDP, so the 3,000 records fail to parse.
            let want = match lie {
                Lie::OtherNameMixed => &mixed,
                _ => &good,
            };
            assert!(
                now == *want || (lie == Lie::Thousands && now == thousands),
                "{lie:?}: published {now:?}"
            );
        }
        assert!(
            (1..=60).contains(&asked),
            "{lie:?}: {asked} queries in 1.5 s"
        );
        report.push(format!(
            "{lie:?} {asked} queries, {failed} failures, {} endpoints",
            now.len()
        ));
        // Back to the truth before the next lie, so each lie starts from it.
        liar.set_lie(Lie::Truth);
        run.wait_for_set(&good_strs).await;
    }
    watcher.abort();
    for published in seen.lock().unwrap().iter() {
        assert!(
            (published.is_empty() && !fail_open)
                || *published == good
                || *published == mixed
                || *published == thousands,
            "a poisoned set was published: {published:?}"
        );
        assert!(
            !published.iter().any(|a| a.ip() == POISON),
            "the poison was published"
        );
    }
    if fail_open {
        assert!(
            seen.lock().unwrap().iter().all(|s| !s.is_empty()),
            "fail_open never clears"
        );
    } else {
        // Wrong IDs, TC without TCP, the loop, the flood and the noise all fail.
        assert!(
            cleared_by_lies >= 3,
            "only {cleared_by_lies} lies failed the resolution"
        );
    }
    eprintln!(
        "lying upstream (fail_open: {fail_open}): {}",
        report.join("; ")
    );
}

#[tokio::test]
async fn lies_never_poison_the_endpoint_set_and_the_refresh_keeps_its_schedule() {
    lies_against_discovery(true).await;
}

#[tokio::test]
async fn without_fail_open_a_lie_clears_the_set_and_never_poisons_it() {
    lies_against_discovery(false).await;
}
