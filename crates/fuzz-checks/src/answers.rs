//! `dns_answers`: what an upstream name server answers, turned into endpoint sets
//! by the DNS discovery source ([`DnsSource`] over the workspace's resolver). The
//! upstream is a tiny in-process server on loopback (UDP and TCP on one port) that
//! answers every question with the records the fuzz input describes, whatever was
//! asked: records for other names, CNAME chains and loops, duplicates, zero and
//! huge TTLs, thousands of records.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dwara_discovery::DiscoverySource;
use dwara_discovery_dns::{DnsDiscoveryConfig, DnsSource, RecordType as Kind};
use dwara_resolver::{DnsResolver, ResolverConfig};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SRV};
use hickory_proto::rr::{Name, RData, Record};

/// The names records are about; index 0 is the one discovery asks for.
const NAMES: [&str; 7] = [
    "svc.test.",
    "c1.test.",
    "c2.test.",
    "evil.test.",
    "t1.test.",
    "t2.test.",
    "SVC.Test.",
];
const TTLS: [u32; 8] = [0, 1, 30, 300, u32::MAX, 0x7fff_ffff, 86_400, 5];
const RCODES: [ResponseCode; 6] = [
    ResponseCode::NoError,
    ResponseCode::NoError,
    ResponseCode::NXDomain,
    ResponseCode::ServFail,
    ResponseCode::Refused,
    ResponseCode::NoError,
];
/// The port the A/AAAA sources put on their endpoints.
const PORT: u16 = 8080;
/// Most records one answer carries (a TCP message holds at most 64 KiB).
const MAX_RECORDS: usize = 3000;
/// Largest UDP answer; larger ones are sent truncated, so the client asks over TCP.
const MAX_UDP: usize = 1232;

fn name(i: u8) -> Name {
    Name::from_ascii(NAMES[usize::from(i) % NAMES.len()]).unwrap()
}

/// What the upstream answers: an rcode and the answer records.
#[derive(Debug)]
struct Script {
    rcode: ResponseCode,
    records: Vec<Record>,
}

/// Reads records from the input: per record one byte (owner in bits 0–2, type in
/// bits 3–4: A, AAAA, CNAME, SRV; TTL choice in bits 5–7), then its data.
fn parse_script(data: &[u8]) -> (Kind, Script) {
    let (&head, mut rest) = data.split_first().unwrap_or((&0, &[]));
    let kind = [Kind::A, Kind::AAAA, Kind::SRV][usize::from(head % 3)];
    let rcode = RCODES[usize::from(head / 3) % RCODES.len()];
    let repeat = usize::from(head >> 6) * 8 + 1;
    let mut records = Vec::new();
    while let Some((&h, tail)) = rest.split_first() {
        let owner = name(h & 7);
        let ttl = TTLS[usize::from(h >> 5)];
        let (rdata, tail) = match (h >> 3) & 3 {
            0 => match tail.split_first_chunk::<4>() {
                Some((a, t)) => (RData::A(A(Ipv4Addr::from(*a))), t),
                None => break,
            },
            1 => match tail.split_first_chunk::<16>() {
                Some((a, t)) => (RData::AAAA(AAAA(Ipv6Addr::from(*a))), t),
                None => break,
            },
            2 => match tail.split_first() {
                Some((&t, rest)) => (RData::CNAME(CNAME(name(t))), rest),
                None => break,
            },
            _ => match tail.split_first_chunk::<5>() {
                Some(([t, p0, p1, prio, weight], rest)) => (
                    RData::SRV(SRV::new(
                        u16::from(*prio),
                        u16::from(*weight),
                        u16::from_be_bytes([*p0, *p1]),
                        name(*t),
                    )),
                    rest,
                ),
                None => break,
            },
        };
        records.push(Record::from_rdata(owner, ttl, rdata));
        rest = tail;
    }
    let n = records.len();
    let records = records
        .into_iter()
        .cycle()
        .take((n * repeat).min(MAX_RECORDS))
        .collect();
    (kind, Script { rcode, records })
}

/// The reply to `query` under `script` (SERVFAIL if the records do not encode),
/// cut to a TC-flagged empty answer above `limit` bytes.
fn reply(query: &[u8], script: &Script, limit: usize) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    let mut m = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
    m.metadata.recursion_desired = q.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.response_code = script.rcode;
    m.add_queries(q.queries.clone());
    m.add_answers(script.records.iter().cloned());
    let bytes = m.to_vec().ok().filter(|b| b.len() <= limit);
    match bytes {
        Some(b) => Some(b),
        None => {
            m.answers.clear();
            m.metadata.truncation = true;
            m.to_vec().ok()
        }
    }
}

/// The fake upstream and the sources that ask it.
struct Upstream {
    script: Arc<Mutex<Arc<Script>>>,
    sources: [DnsSource; 3],
    runtime: tokio::runtime::Runtime,
}

fn bind_pair() -> (UdpSocket, TcpListener) {
    for _ in 0..50 {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        if let Ok(tcp) = TcpListener::bind(udp.local_addr().unwrap()) {
            return (udp, tcp);
        }
    }
    panic!("no port free for both UDP and TCP");
}

fn upstream() -> &'static Upstream {
    static UP: OnceLock<Upstream> = OnceLock::new();
    UP.get_or_init(|| {
        let (udp, tcp) = bind_pair();
        let addr: SocketAddr = udp.local_addr().unwrap();
        let script = Arc::new(Mutex::new(Arc::new(Script {
            rcode: ResponseCode::NoError,
            records: Vec::new(),
        })));
        let s = script.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok((n, peer)) = udp.recv_from(&mut buf) {
                let current = s.lock().unwrap().clone();
                if let Some(out) = reply(&buf[..n], &current, MAX_UDP) {
                    let _ = udp.send_to(&out, peer);
                }
            }
        });
        let s = script.clone();
        std::thread::spawn(move || {
            for conn in tcp.incoming() {
                let Ok(mut conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut len = [0u8; 2];
                    while conn.read_exact(&mut len).is_ok() {
                        let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if conn.read_exact(&mut q).is_err() {
                            return;
                        }
                        let current = s.lock().unwrap().clone();
                        let Some(out) = reply(&q, &current, 65_535) else {
                            return;
                        };
                        let framed = [&(out.len() as u16).to_be_bytes()[..], &out].concat();
                        if conn.write_all(&framed).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let resolver = runtime.block_on(async {
            DnsResolver::new(ResolverConfig {
                nameservers: vec![addr],
                timeout: Duration::from_secs(2),
                attempts: 1,
                ..ResolverConfig::default()
            })
            .unwrap()
        });
        let source = |kind: Kind| {
            let mut c = DnsDiscoveryConfig::new(NAMES[0].trim_end_matches('.'));
            c.record_type = kind;
            c.port = (kind != Kind::SRV).then_some(u64::from(PORT));
            DnsSource::with_resolver(&c, resolver.clone()).unwrap()
        };
        let sources = [source(Kind::A), source(Kind::AAAA), source(Kind::SRV)];
        Upstream {
            script,
            sources,
            runtime,
        }
    })
}

fn lower(n: &Name) -> String {
    n.to_lowercase().to_ascii()
}

/// The names `start` leads to through the script's CNAME records (itself included).
fn chain(records: &[Record], start: &Name) -> BTreeSet<String> {
    let mut names = BTreeSet::from([lower(start)]);
    loop {
        let before = names.len();
        for r in records {
            if let RData::CNAME(c) = &r.data
                && names.contains(&lower(&r.name))
            {
                names.insert(lower(&c.0));
            }
        }
        if names.len() == before {
            return names;
        }
    }
}

/// The addresses the script gives a name (through CNAMEs), of one family or both.
fn addrs_of(records: &[Record], start: &Name, kind: Kind) -> BTreeSet<IpAddr> {
    let names = chain(records, start);
    records
        .iter()
        .filter(|r| names.contains(&lower(&r.name)))
        .filter_map(|r| match (&r.data, kind) {
            (RData::A(a), Kind::A | Kind::SRV) => Some(IpAddr::V4(a.0)),
            (RData::AAAA(a), Kind::AAAA | Kind::SRV) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// The first byte picks the lookup (A, AAAA or SRV by `% 3`), the rcode and a
/// repeat factor (bits 6–7: the record list repeated up to 25 times, capped at
/// 3000 records); the rest are records (see `parse_script`). Every endpoint the
/// source returns is justified by the answers: an address of the asked name or of a
/// name its CNAMEs lead to (for SRV: of a target of an SRV record of the asked
/// name, with that record's port), never an address given for another name; no
/// endpoint twice; a SERVFAIL or REFUSED is a failure, not an endpoint set.
pub fn dns_answers(data: &[u8]) {
    let up = upstream();
    let (kind, script) = parse_script(data);
    let rcode = script.rcode;
    let records = script.records.clone();
    *up.script.lock().unwrap() = Arc::new(script);
    let source = match kind {
        Kind::A => &up.sources[0],
        Kind::AAAA => &up.sources[1],
        _ => &up.sources[2],
    };
    let result = up.runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), source.resolve())
            .await
            .expect("resolution did not end within 20 s")
    });
    let Ok(resolution) = result else {
        return;
    };
    if matches!(rcode, ResponseCode::ServFail | ResponseCode::Refused) {
        assert!(
            resolution.endpoints.is_empty(),
            "{rcode} answered with endpoints {:?}",
            resolution.endpoints
        );
    }
    let qname = name(0);
    let mut allowed = BTreeSet::new();
    match kind {
        Kind::A | Kind::AAAA => {
            for ip in addrs_of(&records, &qname, kind) {
                allowed.insert(SocketAddr::new(ip, PORT));
            }
        }
        _ => {
            let owners = chain(&records, &qname);
            // Each target's addresses once: thousands of SRV records name at most
            // seven targets, and the check must stay linear in the records too.
            let mut targets: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
            for r in &records {
                if let RData::SRV(srv) = &r.data
                    && owners.contains(&lower(&r.name))
                {
                    let ips = targets
                        .entry(lower(&srv.target))
                        .or_insert_with(|| addrs_of(&records, &srv.target, Kind::SRV));
                    for ip in ips.iter() {
                        allowed.insert(SocketAddr::new(*ip, srv.port));
                    }
                }
            }
        }
    }
    let got: Vec<SocketAddr> = resolution.endpoints.addrs().collect();
    let unique: BTreeSet<SocketAddr> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "duplicate endpoints {got:?}");
    let poisoned: Vec<_> = unique.difference(&allowed).collect();
    assert!(
        poisoned.is_empty(),
        "{kind:?} lookup returned endpoints no answer justifies: {poisoned:?} \
         (allowed {allowed:?}; records {records:?})"
    );
}
