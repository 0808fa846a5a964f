//! `dwara-nameserver` per-packet cost beside baselines measured in the same run.
//!
//! What one UDP query costs the server once the packet is in memory: parse, look up,
//! write the answer (A hit with 1 and 3 addresses, NXDOMAIN, PTR, SRV with its three
//! addresses as additional records, NXDOMAIN for a service name), at 1,000 and
//! 100,000 registered names. Baselines: hickory-proto decoding the same query and
//! encoding a response to it (the cheapest a server that goes through the message
//! model can be), and a bare `HashMap` lookup of the name (the floor). The
//! `guard_*` cases are the A hit through the allow list and rate limit (a client
//! outside loopback): allowed by the fourth of four prefixes and within its
//! bucket; refused; over its bucket's limit (an empty truncated reply).
//!
//! Run: `cargo bench -p dwara-benches --bench dns_handler -- --warm-up-time 1 --measurement-time 2`

#![allow(clippy::unwrap_used, reason = "a benchmark over fixed, valid inputs")]

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{BenchmarkId, Criterion};
use dwara_nameserver::{
    AccessConfig, Db, DbConfig, Domain, LocalNames, QueryHandler, RateLimit, ServicePort,
};
use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::{RData, Record};

fn query(name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, (qtype >> 8) as u8, qtype as u8, 0, 1]);
    q
}

/// `n` names `hostI.weave.local`, every fifth with three addresses and the service
/// `_http._tcp` on port 80.
fn db(n: usize) -> Db {
    let db = Db::new(DbConfig::new(Domain::new("weave.local").unwrap()));
    let http = ServicePort::parse("_http._tcp", "80").unwrap();
    let mut next = 0u32;
    for i in 0..n {
        let service = (i % 5 == 0).then_some(&http);
        for _ in 0..if i % 5 == 0 { 3 } else { 1 } {
            next += 1;
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + next));
            db.add_service(
                &format!("c{i}"),
                ip,
                &format!("host{i}.weave.local"),
                service,
            )
            .unwrap();
        }
    }
    db
}

fn hickory_round_trip(packet: &[u8]) -> Vec<u8> {
    let q = Message::from_vec(packet).unwrap();
    let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
    r.metadata.authoritative = true;
    r.add_queries(q.queries.iter().cloned());
    if let Some(query) = q.queries.first() {
        r.add_answer(Record::from_rdata(
            query.name().clone(),
            1,
            RData::A(Ipv4Addr::new(10, 0, 0, 2).into()),
        ));
    }
    r.to_vec().unwrap()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("dns_handler");
    for n in [1_000, 100_000] {
        let db = db(n);
        let mut handler = QueryHandler::new(&db);
        let cases = [
            ("a_1_addr", query("host1.weave.local", 1)),
            ("a_3_addrs", query("host5.weave.local", 1)),
            ("nxdomain", query("nohost.weave.local", 1)),
            ("ptr", query("2.0.0.10.in-addr.arpa", 12)),
            (
                "srv_1_port_3_addrs",
                query("_http._tcp.host5.weave.local", 33),
            ),
            ("srv_nxdomain", query("_http._tcp.host1.weave.local", 33)),
        ];
        for (name, packet) in &cases {
            assert!(handler.answer_udp(packet).is_some(), "{name}");
            group.bench_with_input(BenchmarkId::new(*name, n), packet, |b, p| {
                b.iter(|| black_box(handler.answer_udp(black_box(p)).map(<[u8]>::len)))
            });
        }
        let packet = &cases[0].1;
        let access = |qps| AccessConfig {
            allow: ["192.0.2.0/24", "198.51.100.0/24", "fd00::/8", "10.0.0.0/8"]
                .iter()
                .map(|c| c.parse().unwrap())
                .collect(),
            local_names: LocalNames::AllowedClients,
            rate_limit: RateLimit {
                qps,
                ..RateLimit::default()
            },
        };
        for (name, qps, client) in [
            ("guard_allowed", u32::MAX, "10.1.2.3"),
            ("guard_refused", u32::MAX, "203.0.113.7"),
            ("guard_rate_limited", 1, "10.1.2.3"),
        ] {
            let mut handler = QueryHandler::with_access(&db, &access(qps)).unwrap();
            let client: IpAddr = client.parse().unwrap();
            assert!(handler.answer_udp_from(client, packet).is_some(), "{name}");
            group.bench_with_input(BenchmarkId::new(name, n), packet, |b, p| {
                b.iter(|| {
                    black_box(
                        handler
                            .answer_udp_from(black_box(client), black_box(p))
                            .map(<[u8]>::len),
                    )
                })
            });
        }
        group.bench_with_input(
            BenchmarkId::new("baseline_hickory_decode_encode", n),
            packet,
            |b, p| b.iter(|| black_box(hickory_round_trip(black_box(p)))),
        );
        let map: HashMap<Vec<u8>, u32> = (0..n)
            .map(|i| {
                (
                    query(&format!("host{i}.weave.local"), 1)[12..].to_vec(),
                    i as u32,
                )
            })
            .collect();
        group.bench_with_input(
            BenchmarkId::new("baseline_hashmap_lookup", n),
            packet,
            |b, p| b.iter(|| black_box(map.get(&black_box(p)[12..]))),
        );
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
