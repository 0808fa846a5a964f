//! Unit tests of the query handler, with hickory-proto building queries and
//! decoding answers.

use std::net::IpAddr;
use std::str::FromStr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use super::*;
use crate::db::DbConfig;
use crate::name::Domain;

struct Fixture {
    db: Db,
    handler: Handler,
    out: Vec<u8>,
    rng: FastRng,
    counters: Counters,
}

fn fixture() -> Fixture {
    let db = Db::new(DbConfig::new(Domain::new("weave.local").unwrap()));
    db.add("c1", "10.0.0.1".parse().unwrap(), "web.weave.local")
        .unwrap();
    db.add("c2", "10.0.0.2".parse().unwrap(), "web.weave.local")
        .unwrap();
    db.add("c3", "10.0.0.3".parse().unwrap(), "web.weave.local")
        .unwrap();
    db.add("c4", "fd00::4".parse().unwrap(), "six.weave.local")
        .unwrap();
    let handler = Handler::new(&db);
    Fixture {
        db,
        handler,
        out: vec![0; MAX_MESSAGE],
        rng: FastRng::seeded(1),
        counters: Counters::default(),
    }
}

fn query(name: &str, rtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(0xbeef, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_str(name).unwrap(), rtype));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

impl Fixture {
    fn ask(&mut self, packet: &[u8], transport: Transport) -> Outcome {
        self.handler.handle(
            packet,
            &mut self.out,
            transport,
            &mut self.rng,
            &self.counters,
        )
    }

    fn answer(&mut self, packet: &[u8], transport: Transport) -> Message {
        match self.ask(packet, transport) {
            Outcome::Reply(n) => Message::from_vec(&self.out[..n]).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }
}

fn addrs(m: &Message) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_records_echo_case_and_are_authoritative() {
    let mut f = fixture();
    // Built by hand: hickory's encoder lower-cases names.
    let mut q = vec![0xbe, 0xef, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(b"\x03WeB\x05weave\x05LOCAL\x00\x00\x01\x00\x01");
    let m = f.answer(&q, Transport::Udp);
    assert_eq!(m.metadata.id, 0xbeef);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.authoritative && m.metadata.recursion_desired);
    assert_eq!(m.answers.len(), 3);
    for r in &m.answers {
        assert_eq!(r.name.to_ascii(), "WeB.weave.LOCAL.");
        assert_eq!(r.ttl, 1);
    }
    let want: Vec<IpAddr> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(addrs(&m), want);
}

#[test]
fn answers_are_shuffled() {
    let mut f = fixture();
    let q = query("web.weave.local.", RecordType::A, None);
    let mut firsts = std::collections::HashSet::new();
    for _ in 0..50 {
        let m = f.answer(&q, Transport::Udp);
        firsts.insert(m.answers[0].data.clone());
    }
    assert_eq!(firsts.len(), 3, "every address comes first sometimes");
}

#[test]
fn nodata_and_nxdomain_carry_the_soa() {
    let mut f = fixture();
    for (name, rtype, rcode) in [
        ("web.weave.local.", RecordType::MX, ResponseCode::NoError),
        ("web.weave.local.", RecordType::AAAA, ResponseCode::NoError),
        ("web.weave.local.", RecordType::ANY, ResponseCode::NoError),
        ("six.weave.local.", RecordType::A, ResponseCode::NoError),
        ("nope.weave.local.", RecordType::A, ResponseCode::NXDomain),
        (
            "a.web.weave.local.",
            RecordType::TXT,
            ResponseCode::NXDomain,
        ),
        ("weave.local.", RecordType::A, ResponseCode::NoError),
    ] {
        let m = f.answer(&query(name, rtype, Some(1232)), Transport::Udp);
        assert_eq!(m.metadata.response_code, rcode, "{name} {rtype}");
        assert!(m.metadata.authoritative);
        assert!(m.answers.is_empty(), "{name} {rtype}");
        assert_eq!(m.authorities.len(), 1);
        assert_eq!(m.authorities[0].record_type(), RecordType::SOA);
        assert_eq!(m.authorities[0].name.to_ascii(), "weave.local.");
        assert!(m.edns.is_some(), "OPT echoed");
    }
    let m = f.answer(
        &query("weave.local.", RecordType::SOA, None),
        Transport::Udp,
    );
    assert_eq!(m.answers.len(), 1);
}

#[test]
fn other_names_are_forwarded() {
    let mut f = fixture();
    for (name, rtype) in [
        ("example.com.", RecordType::A),
        ("fooweave.local.", RecordType::A),
        ("local.", RecordType::SOA),
        ("9.9.9.10.in-addr.arpa.", RecordType::PTR),
        ("1.0.0.10.in-addr.arpa.", RecordType::TXT),
    ] {
        assert_eq!(
            f.ask(&query(name, rtype, None), Transport::Udp),
            Outcome::Forward {
                qtype: rtype.into()
            },
            "{name}"
        );
    }
}

#[test]
fn ptr_records() {
    let mut f = fixture();
    f.db.add("c5", "10.0.0.1".parse().unwrap(), "other.weave.local")
        .unwrap();
    let m = f.answer(
        &query("1.0.0.10.IN-ADDR.arpa.", RecordType::PTR, None),
        Transport::Udp,
    );
    let mut names: Vec<String> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::PTR(p) => Some(p.0.to_ascii()),
            _ => None,
        })
        .collect();
    names.sort();
    assert_eq!(names, ["other.weave.local.", "web.weave.local."]);
    let v6 = crate::name::reverse_name("fd00::4".parse().unwrap()).to_uppercase();
    let m = f.answer(&query(&v6, RecordType::PTR, None), Transport::Udp);
    assert_eq!(m.answers.len(), 1);
}

#[test]
fn truncation_follows_the_transport() {
    let mut f = fixture();
    for i in 0..50u8 {
        f.db.add(
            &format!("big{i}"),
            IpAddr::from([10, 1, 0, i]),
            "big.weave.local",
        )
        .unwrap();
        f.db.add(
            &format!("big{i}"),
            format!("fd00::{i:x}").parse().unwrap(),
            "big.weave.local",
        )
        .unwrap();
    }
    let udp = f.answer(
        &query("big.weave.local.", RecordType::A, None),
        Transport::Udp,
    );
    assert!(udp.metadata.truncation);
    assert!(!udp.answers.is_empty() && udp.answers.len() < 50);
    let edns = f.answer(
        &query("big.weave.local.", RecordType::A, Some(4096)),
        Transport::Udp,
    );
    assert!(!edns.metadata.truncation);
    assert_eq!(edns.answers.len(), 50);
    let v6 = f.answer(
        &query("big.weave.local.", RecordType::AAAA, Some(1232)),
        Transport::Udp,
    );
    assert!(v6.metadata.truncation);
    assert!(v6.to_vec().unwrap().len() <= 1232);
    let tcp = f.answer(
        &query("big.weave.local.", RecordType::AAAA, None),
        Transport::Tcp,
    );
    assert!(!tcp.metadata.truncation);
    assert_eq!(tcp.answers.len(), 50);
}

#[test]
fn garbage_gets_formerr_or_nothing() {
    let mut f = fixture();
    assert_eq!(f.ask(&[1, 2, 3], Transport::Udp), Outcome::Drop);
    let mut bad = query("web.weave.local.", RecordType::A, None);
    bad.truncate(20);
    let m = match f.ask(&bad, Transport::Udp) {
        Outcome::Reply(n) => Message::from_vec(&f.out[..n]).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(m.metadata.id, 0xbeef);
    // Two questions.
    let mut two = Message::new(7, MessageType::Query, OpCode::Query);
    two.add_query(Query::query(
        Name::from_str("a.weave.local.").unwrap(),
        RecordType::A,
    ));
    two.add_query(Query::query(
        Name::from_str("b.weave.local.").unwrap(),
        RecordType::A,
    ));
    let m = f.answer(&two.to_vec().unwrap(), Transport::Udp);
    assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
    // Another opcode.
    let mut notify = Message::new(8, MessageType::Query, OpCode::Notify);
    notify.add_query(Query::query(
        Name::from_str("weave.local.").unwrap(),
        RecordType::SOA,
    ));
    let m = f.answer(&notify.to_vec().unwrap(), Transport::Udp);
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    // A response is never answered.
    let mut resp = query("web.weave.local.", RecordType::A, None);
    resp[2] |= 0x80;
    assert_eq!(f.ask(&resp, Transport::Udp), Outcome::Drop);
}

#[test]
fn unusual_but_valid_queries_take_the_slow_path() {
    let mut f = fixture();
    // EDNS version 1: BADVERS.
    let mut m = Message::new(9, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(
        Name::from_str("web.weave.local.").unwrap(),
        RecordType::A,
    ));
    let mut e = Edns::new();
    e.set_version(1);
    m.set_edns(e);
    let r = f.answer(&m.to_vec().unwrap(), Transport::Udp);
    // Extended rcode 16 is BADVERS (hickory decodes it by its other name, BADSIG).
    assert_eq!(u16::from(r.metadata.response_code), 16);
    // Extra records (here an additional A record) make the fast parser give up;
    // the query is still answered like any other.
    let mut m = Message::new(10, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(
        Name::from_str("web.weave.local.").unwrap(),
        RecordType::A,
    ));
    m.add_additional(hickory_proto::rr::Record::from_rdata(
        Name::from_str("x.").unwrap(),
        5,
        RData::A("127.0.0.1".parse().unwrap()),
    ));
    let p = m.to_vec().unwrap();
    let mut lower = [0u8; 256];
    assert!(matches!(wire::parse(&p, &mut lower), Parse::Slow));
    let r = f.answer(&p, Transport::Udp);
    assert_eq!(r.answers.len(), 3, "{r:?}");
    // A forward compression pointer is malformed: FORMERR.
    let mut p = vec![0, 11, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(b"\x03WEB\xc0\x16\x00\x01\x00\x01\x05weave\x05local\x00");
    let r = f.answer(&p, Transport::Udp);
    assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
}

#[test]
fn random_bytes_never_panic() {
    let mut f = fixture();
    let mut rng = FastRng::seeded(99);
    let seed = query("web.weave.local.", RecordType::A, Some(1232));
    for _ in 0..20_000 {
        let mut p = seed.clone();
        for _ in 0..=rng.below(4) {
            let i = rng.below(p.len());
            p[i] = rng.below(256) as u8;
        }
        p.truncate(rng.below(p.len() + 1));
        let _ = f.ask(&p, Transport::Udp);
        let _ = servfail(&p, &mut f.out);
    }
}

#[test]
fn hidden_and_removed_records_are_not_served() {
    let mut f = fixture();
    f.db.apply(crate::db::Entry {
        id: "r1".into(),
        ip: "10.9.0.1".parse().unwrap(),
        fqdn: "remote.weave.local.".into(),
        origin: "peer-b".into(),
        version: 1,
        tombstone: false,
    })
    .unwrap();
    let q = query("remote.weave.local.", RecordType::A, None);
    assert_eq!(f.answer(&q, Transport::Udp).answers.len(), 1);
    f.db.hide_origin("peer-b");
    let m = f.answer(&q, Transport::Udp);
    assert_eq!(
        m.metadata.response_code,
        ResponseCode::NXDomain,
        "a hidden peer's name is unknown"
    );
    // Its PTR is not ours any more either: forwarded.
    let ptr = query("1.0.9.10.in-addr.arpa.", RecordType::PTR, None);
    assert_eq!(f.ask(&ptr, Transport::Udp), Outcome::Forward { qtype: 12 });
    f.db.show_origin("peer-b");
    assert_eq!(f.answer(&q, Transport::Udp).answers.len(), 1);
    assert_eq!(f.answer(&ptr, Transport::Udp).answers.len(), 1);
    // Removing one of three addresses removes it from answers at once.
    f.db.remove_all("c2");
    let m = f.answer(
        &query("web.weave.local.", RecordType::A, None),
        Transport::Udp,
    );
    assert_eq!(addrs(&m).len(), 2);
}

#[test]
fn reads_beside_writes_see_whole_record_sets() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let db = Arc::new(Db::new(DbConfig::new(Domain::new("weave.local").unwrap())));
    db.add("base", "10.7.0.1".parse().unwrap(), "busy.weave.local")
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for i in 2..20u8 {
                    db.add(
                        &format!("c{i}"),
                        IpAddr::from([10, 7, 0, i]),
                        "busy.weave.local",
                    )
                    .unwrap();
                }
                for i in 2..20u8 {
                    db.remove_all(&format!("c{i}"));
                }
                rounds += 1;
            }
            rounds
        })
    };
    let handler = Handler::new(&db);
    let (mut out, mut rng, counters) = (
        vec![0; MAX_MESSAGE],
        FastRng::seeded(3),
        Counters::default(),
    );
    let q = query("busy.weave.local.", RecordType::A, Some(1232));
    let mut sizes = std::collections::HashSet::new();
    for _ in 0..5_000 {
        let Outcome::Reply(n) = handler.handle(&q, &mut out, Transport::Udp, &mut rng, &counters)
        else {
            panic!("no reply");
        };
        let m = Message::from_vec(&out[..n]).unwrap();
        let got = addrs(&m);
        assert!(!got.is_empty() && got.len() <= 19, "{got:?}");
        assert!(
            got.contains(&"10.7.0.1".parse().unwrap()),
            "the stable record is always there"
        );
        sizes.insert(got.len());
    }
    stop.store(true, Ordering::Relaxed);
    assert!(writer.join().unwrap() > 0);
    assert!(sizes.len() > 1, "the reader saw the set change: {sizes:?}");
}
