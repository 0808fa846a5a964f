//! A DNS server that lies to discovery, written at the wire level (a plain UDP
//! socket, no TCP listener): wrong IDs, TC=1 with no TCP to retry on, compression
//! loops, TTL 0, thousands of records, answers for another name, and noise. The
//! published endpoint set is never poisoned (only addresses of the asked name, on
//! the configured port), `fail_open` keeps the last good set when a lie makes the
//! resolution fail, and the refresh loop keeps asking at its cadence (counted at the
//! server, with generous bounds).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dwara_discovery_dns::RecordType;

use super::{Running, policy};

/// What the liar answers, in the order the test goes through them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lie {
    /// The truth: 10.0.0.1 and 10.0.0.2, TTL 1.
    Truth,
    /// The truth with another name's poison, and the ID changed.
    WrongId,
    /// An empty answer with TC=1; there is no TCP listener to retry on.
    TruncatedNoTcp,
    /// An answer whose owner name is a pointer to itself.
    CompressionLoop,
    /// The truth's addresses with TTL 0.
    ZeroTtl,
    /// Only records for another name (the poison 6.6.6.6).
    OtherName,
    /// 10.0.0.9 for the asked name and 6.6.6.6 for another one.
    OtherNameMixed,
    /// 3,000 A records for the asked name (10.1.x.y).
    Thousands,
    /// The right ID and the response bit, then noise.
    Garbage,
}

const LIES: [Lie; 8] = [
    Lie::WrongId,
    Lie::TruncatedNoTcp,
    Lie::CompressionLoop,
    Lie::ZeroTtl,
    Lie::OtherName,
    Lie::OtherNameMixed,
    Lie::Thousands,
    Lie::Garbage,
];

const POISON: [u8; 4] = [6, 6, 6, 6];

/// An A record: a pointer to `owner` (an offset in the message), class IN.
fn a_record(out: &mut Vec<u8>, owner: u16, ttl: u32, ip: [u8; 4]) {
    out.extend_from_slice(&(0xc000 | owner).to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 1]);
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&[0, 4]);
    out.extend_from_slice(&ip);
}

/// `query` turned into a response header with `answers` records (the question kept).
fn header(query: &[u8], question_end: usize, answers: u16, flags: u8) -> Vec<u8> {
    let mut r = query[..question_end].to_vec();
    r[2] = 0x84 | flags; // QR, AA (and TC when asked).
    r[3] = 0x80; // RA, NOERROR.
    r[6..8].copy_from_slice(&answers.to_be_bytes());
    r[8..12].fill(0);
    r
}

/// The end of the question of `query` (one uncompressed name, type, class).
fn question_end(query: &[u8]) -> Option<usize> {
    let mut i = 12;
    loop {
        let len = usize::from(*query.get(i)?);
        if len == 0 {
            return Some(i + 5).filter(|&e| e <= query.len());
        }
        i += 1 + len;
    }
}

fn answer(query: &[u8], lie: Lie, noise: &mut u64) -> Option<Vec<u8>> {
    let end = question_end(query)?;
    // Only A questions are answered; hickory may ask for nothing else here.
    let truth = |ttl| {
        let mut r = header(query, end, 2, 0);
        a_record(&mut r, 12, ttl, [10, 0, 0, 1]);
        a_record(&mut r, 12, ttl, [10, 0, 0, 2]);
        r
    };
    Some(match lie {
        Lie::Truth => truth(1),
        Lie::ZeroTtl => truth(0),
        Lie::WrongId => {
            let mut r = truth(1);
            r[0] ^= 0x5a;
            r
        }
        Lie::TruncatedNoTcp => header(query, end, 0, 0x02),
        Lie::CompressionLoop => {
            let mut r = header(query, end, 1, 0);
            let me = u16::try_from(r.len()).unwrap();
            a_record(&mut r, me, 1, POISON);
            r
        }
        Lie::OtherName | Lie::OtherNameMixed => {
            let mixed = lie == Lie::OtherNameMixed;
            let mut r = header(query, end, 1 + u16::from(mixed), 0);
            // `evil.` A 6.6.6.6, its owner name written out.
            r.extend_from_slice(b"\x04evil\x00\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04");
            r.extend_from_slice(&POISON);
            if mixed {
                a_record(&mut r, 12, 1, [10, 0, 0, 9]);
            }
            r
        }
        Lie::Thousands => {
            let mut r = header(query, end, 3000, 0);
            for n in 0..3000u16 {
                let [hi, lo] = n.to_be_bytes();
                a_record(&mut r, 12, 1, [10, 1, hi, lo]);
            }
            r
        }
        Lie::Garbage => {
            let mut r = vec![query[0], query[1], 0x84, 0x80];
            for _ in 0..200 {
                *noise ^= *noise << 13;
                *noise ^= *noise >> 7;
                *noise ^= *noise << 17;
                r.push(*noise as u8);
            }
            r
        }
    })
}

/// The liar: answers per the current lie, counting the queries it receives.
struct Liar {
    addr: SocketAddr,
    lie: Arc<Mutex<Lie>>,
    queries: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Liar {
    fn start() -> Self {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let lie = Arc::new(Mutex::new(Lie::Truth));
        let queries = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, q, s) = (lie.clone(), queries.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut noise = 0x2545_f491_4f6c_dd1d_u64;
            while !s.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                q.fetch_add(1, Ordering::Relaxed);
                let lie = *l.lock().unwrap();
                if let Some(r) = answer(&buf[..n], lie, &mut noise) {
                    let _ = sock.send_to(&r, from);
                }
            }
        });
        Self {
            addr,
            lie,
            queries,
            stop,
        }
    }
}

impl Drop for Liar {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn good() -> BTreeSet<SocketAddr> {
    ["10.0.0.1:80", "10.0.0.2:80"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect()
}

/// Every lie for 1.5 s against a refresh loop with a 1 s interval (100 ms floor and
/// first backoff): the set is still the truth after each lie, except after the
/// mixed one, where it is 10.0.0.9 alone (its one record for the asked name);
/// nothing published ever holds the poison; after a lie that fails the resolution the truth is still
/// published; between 1 and 60 queries reach the liar in each window (a 1 s
/// interval asks at least once, a hot loop would ask thousands of times).
#[tokio::test]
async fn lies_never_poison_the_endpoint_set_and_the_refresh_keeps_its_schedule() {
    let liar = Liar::start();
    let resolver = dwara_resolver::DnsResolver::new(dwara_resolver::ResolverConfig {
        nameservers: vec![liar.addr],
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
    let run = Running::start(source, policy(1, true, 1));
    run.wait_for_set(&["10.0.0.1:80", "10.0.0.2:80"]).await;

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

    let thousands: BTreeSet<SocketAddr> = (0..3000u16)
        .map(|n| {
            let [hi, lo] = n.to_be_bytes();
            SocketAddr::from((Ipv4Addr::new(10, 1, hi, lo), 80))
        })
        .collect();
    let mixed: BTreeSet<SocketAddr> = ["10.0.0.9:80".parse().unwrap()].into();
    let mut report = Vec::new();
    for lie in LIES {
        *liar.lie.lock().unwrap() = lie;
        let before = liar.queries.load(Ordering::Relaxed);
        let failures = run.up.stats.counters().failures;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let asked = liar.queries.load(Ordering::Relaxed) - before;
        let failed = run.up.stats.counters().failures - failures;
        let now: BTreeSet<SocketAddr> = run.addrs().into_iter().collect();
        // The mixed lie's one record for the asked name is a true answer; hickory
        // takes at most 4,096 bytes over UDP, so the 3,000 records fail to parse.
        let want = match lie {
            Lie::OtherNameMixed => mixed.clone(),
            _ => good(),
        };
        assert!(
            now == want || (lie == Lie::Thousands && now == thousands),
            "{lie:?}: published {now:?}"
        );
        if failed > 0 {
            assert_eq!(now, good(), "{lie:?}: fail_open keeps the last good set");
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
        *liar.lie.lock().unwrap() = Lie::Truth;
        run.wait_for_set(&["10.0.0.1:80", "10.0.0.2:80"]).await;
    }
    watcher.abort();
    for set in seen.lock().unwrap().iter() {
        assert!(
            set.is_empty() || *set == good() || *set == mixed || *set == thousands,
            "a poisoned set was published: {set:?}"
        );
        assert!(
            !set.iter().any(|a| a.ip() == Ipv4Addr::from(POISON)),
            "the poison was published"
        );
    }
    assert!(
        seen.lock().unwrap().iter().all(|s| !s.is_empty()),
        "fail_open never clears"
    );
    eprintln!("lying upstream: {}", report.join("; "));
}
