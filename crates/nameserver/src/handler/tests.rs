//! Unit tests of the query handler, with hickory-proto building queries and
//! decoding answers.

use std::net::IpAddr;
use std::str::FromStr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use super::*;
use dwara_records::DbConfig;
use dwara_records::Domain;

struct Fixture {
    db: Db,
    handler: Handler,
    out: Vec<u8>,
    state: WorkerState,
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
        state: WorkerState::seeded(1),
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
        let mut worker = Worker {
            handler: &self.handler,
            counters: &self.counters,
            transport,
            state: &mut self.state,
        };
        worker.handle(packet, &mut self.out)
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
    let v6 = dwara_records::reverse_name("fd00::4".parse().unwrap()).to_uppercase();
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
    f.db.apply(dwara_records::Entry {
        id: "r1".into(),
        ip: "10.9.0.1".parse().unwrap(),
        fqdn: "remote.weave.local.".into(),
        origin: "peer-b".into(),
        version: 1,
        tombstone: false,
        service: None,
        health: Default::default(),
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
    let (mut out, mut state, counters) = (
        vec![0; MAX_MESSAGE],
        WorkerState::seeded(3),
        Counters::default(),
    );
    let mut worker = Worker {
        handler: &handler,
        counters: &counters,
        transport: Transport::Udp,
        state: &mut state,
    };
    let q = query("busy.weave.local.", RecordType::A, Some(1232));
    let mut sizes = std::collections::HashSet::new();
    for _ in 0..5_000 {
        let Outcome::Reply(n) = worker.handle(&q, &mut out) else {
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

fn srv_fixture() -> Fixture {
    let f = fixture();
    let http = crate::ServicePort::parse("_http._tcp", "80").unwrap();
    let alt = crate::ServicePort::parse("_http._tcp", "8080").unwrap();
    let dns = crate::ServicePort::parse("_dns._udp", "53").unwrap();
    let db = &f.db;
    db.add_service("s1", ip("10.1.0.1"), "api.weave.local", Some(&http))
        .unwrap();
    db.add_service("s2", ip("fd00::2"), "api.weave.local", Some(&http))
        .unwrap();
    db.add_service("s3", ip("10.1.0.3"), "api.weave.local", Some(&alt))
        .unwrap();
    db.add_service("s4", ip("10.1.0.4"), "api.weave.local", Some(&dns))
        .unwrap();
    db.add("s5", ip("10.1.0.5"), "api.weave.local").unwrap();
    f
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The SRV records of an answer as (priority, weight, port, target), sorted.
fn srv_records(m: &Message) -> Vec<(u16, u16, u16, String)> {
    let mut srv: Vec<_> = m
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::SRV(s) => (s.priority, s.weight, s.port, s.target.to_ascii()),
            other => panic!("{other:?}"),
        })
        .collect();
    srv.sort();
    srv
}

/// The additional records of an answer as (owner, address), sorted.
fn additional_addrs(m: &Message) -> Vec<(String, IpAddr)> {
    let mut extra: Vec<_> = m
        .additionals
        .iter()
        .map(|r| match &r.data {
            RData::A(a) => (r.name.to_ascii(), IpAddr::V4(a.0)),
            RData::AAAA(a) => (r.name.to_ascii(), IpAddr::V6(a.0)),
            other => panic!("{other:?}"),
        })
        .collect();
    extra.sort();
    extra
}

/// The raw rdata of each SRV record of a response (walked by hand: hickory's
/// decoder hides whether a name was compressed).
fn raw_srv_rdata(reply: &[u8]) -> Vec<&[u8]> {
    let an = usize::from(u16::from_be_bytes([reply[6], reply[7]]));
    let mut pos = HEADER_LEN;
    while reply[pos] != 0 {
        pos += 1 + usize::from(reply[pos]);
    }
    pos += 5;
    let mut out = Vec::new();
    for _ in 0..an {
        assert_eq!(&reply[pos..pos + 2], &[0xc0, 0x0c], "owner: the question");
        let rdlen = usize::from(u16::from_be_bytes([reply[pos + 10], reply[pos + 11]]));
        out.push(&reply[pos + 12..pos + 12 + rdlen]);
        pos += 12 + rdlen;
    }
    out
}

#[test]
fn srv_answers_one_record_per_instance_with_its_own_target() {
    let mut f = srv_fixture();
    for transport in [Transport::Udp, Transport::Tcp] {
        let q = query("_HTTP._tcp.Api.weave.local.", RecordType::SRV, None);
        let m = f.answer(&q, transport);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative);
        assert!(!m.metadata.truncation);
        for r in &m.answers {
            assert!(
                r.name
                    .to_ascii()
                    .eq_ignore_ascii_case("_http._tcp.api.weave.local.")
            );
        }
        // One record per (address, port), each naming its own instance.
        assert_eq!(
            srv_records(&m),
            vec![
                (0, 1, 80, "0a010001.addr.weave.local.".to_owned()),
                (
                    0,
                    1,
                    80,
                    "fd000000000000000000000000000002.addr.weave.local.".to_owned()
                ),
                (0, 1, 8080, "0a010003.addr.weave.local.".to_owned()),
            ]
        );
        // Each target's address, none other.
        assert_eq!(
            additional_addrs(&m),
            vec![
                ("0a010001.addr.weave.local.".to_owned(), ip("10.1.0.1")),
                ("0a010003.addr.weave.local.".to_owned(), ip("10.1.0.3")),
                (
                    "fd000000000000000000000000000002.addr.weave.local.".to_owned(),
                    ip("fd00::2")
                ),
            ]
        );
    }
    // The targets are written out, never compressed (RFC 2782).
    let q = query("_http._tcp.api.weave.local.", RecordType::SRV, None);
    let Outcome::Reply(n) = f.ask(&q, Transport::Udp) else {
        panic!("no reply")
    };
    let rdata = raw_srv_rdata(&f.out[..n]);
    assert_eq!(rdata.len(), 3);
    for r in rdata {
        let mut pos = 6;
        while r[pos] != 0 {
            assert!(r[pos] <= 63, "a label, not a pointer: {r:02x?}");
            pos += 1 + usize::from(r[pos]);
        }
        assert_eq!(pos + 1, r.len(), "the name fills the rdata");
    }
    assert_eq!(
        f.db.lookup_service("_http._tcp.api.weave.local"),
        vec![
            "10.1.0.1:80".parse().unwrap(),
            "[fd00::2]:80".parse().unwrap(),
            "10.1.0.3:8080".parse().unwrap()
        ]
    );
}

#[test]
fn srv_targets_answer_their_address_while_it_is_served() {
    let mut f = srv_fixture();
    let ask = |f: &mut Fixture, name: &str, t: RecordType| {
        let m = f.answer(&query(name, t, None), Transport::Udp);
        (m.metadata.response_code, addrs(&m), m.authorities.len())
    };
    let v4 = "0A010001.addr.weave.local.";
    let v6 = "fd000000000000000000000000000002.addr.weave.local.";
    assert_eq!(
        ask(&mut f, v4, RecordType::A),
        (ResponseCode::NoError, vec![ip("10.1.0.1")], 0)
    );
    assert_eq!(
        ask(&mut f, v6, RecordType::AAAA),
        (ResponseCode::NoError, vec![ip("fd00::2")], 0)
    );
    // Other types, and the other family: NODATA.
    let nodata = (ResponseCode::NoError, vec![], 1);
    assert_eq!(ask(&mut f, v4, RecordType::AAAA), nodata);
    assert_eq!(ask(&mut f, v4, RecordType::TXT), nodata);
    assert_eq!(ask(&mut f, v6, RecordType::A), nodata);
    // `addr.<domain>` is an empty non-terminal.
    assert_eq!(ask(&mut f, "addr.weave.local.", RecordType::A), nodata);
    // Any address some name serves has a target, with a service or not.
    assert_eq!(
        ask(&mut f, "0a010005.addr.weave.local.", RecordType::A).1,
        vec![ip("10.1.0.5")]
    );
    // Unknown addresses, malformed hex, deeper names: no such name.
    let nxdomain = (ResponseCode::NXDomain, vec![], 1);
    for name in [
        "0a0100ff.addr.weave.local.",
        "0a01000g.addr.weave.local.",
        "0a0100010.addr.weave.local.",
        "a010001.addr.weave.local.",
        "x.0a010001.addr.weave.local.",
    ] {
        assert_eq!(ask(&mut f, name, RecordType::A), nxdomain, "{name}");
    }
    // A removed instance's target goes with it.
    f.db.remove_all("s1");
    assert_eq!(ask(&mut f, v4, RecordType::A), nxdomain);
}

#[test]
fn srv_negative_answers() {
    let mut f = srv_fixture();
    let ask = |f: &mut Fixture, name: &str, t: RecordType| {
        let m = f.answer(&query(name, t, None), Transport::Udp);
        (
            m.metadata.response_code,
            m.answers.len(),
            m.authorities.len(),
        )
    };
    let nodata = (ResponseCode::NoError, 0, 1);
    let nxdomain = (ResponseCode::NXDomain, 0, 1);
    // The service name exists: other types are NODATA.
    assert_eq!(
        ask(&mut f, "_http._tcp.api.weave.local.", RecordType::A),
        nodata
    );
    assert_eq!(
        ask(&mut f, "_dns._udp.api.weave.local.", RecordType::TXT),
        nodata
    );
    // The empty non-terminal above it exists too.
    assert_eq!(
        ask(&mut f, "_tcp.api.weave.local.", RecordType::SRV),
        nodata
    );
    assert_eq!(ask(&mut f, "_udp.api.weave.local.", RecordType::A), nodata);
    // A name that exists without that service: SRV on the name itself is NODATA,
    // other services do not exist.
    assert_eq!(ask(&mut f, "api.weave.local.", RecordType::SRV), nodata);
    assert_eq!(ask(&mut f, "web.weave.local.", RecordType::SRV), nodata);
    assert_eq!(
        ask(&mut f, "_ftp._tcp.api.weave.local.", RecordType::SRV),
        nxdomain
    );
    assert_eq!(
        ask(&mut f, "_http._udp.api.weave.local.", RecordType::SRV),
        nxdomain
    );
    assert_eq!(
        ask(&mut f, "_http._tcp.web.weave.local.", RecordType::SRV),
        nxdomain
    );
    assert_eq!(
        ask(&mut f, "_sctp.api.weave.local.", RecordType::SRV),
        nxdomain
    );
    assert_eq!(
        ask(&mut f, "_http._tcp.nope.weave.local.", RecordType::SRV),
        nxdomain
    );
    // Outside the domain: forwarded.
    let q = query("_http._tcp.example.com.", RecordType::SRV, None);
    assert_eq!(f.ask(&q, Transport::Udp), Outcome::Forward { qtype: 33 });
    // Removing the last entry of a service removes the name.
    f.db.remove_all("s4");
    assert_eq!(
        ask(&mut f, "_dns._udp.api.weave.local.", RecordType::SRV),
        nxdomain
    );
    assert_eq!(
        ask(&mut f, "_udp.api.weave.local.", RecordType::SRV),
        nxdomain
    );
    // So does hiding its origin, and replacing the service.
    let http = crate::ServicePort::parse("_http._tcp", "80").unwrap();
    let web = crate::ServicePort::parse("_web._tcp", "81").unwrap();
    for id in ["s1", "s2"] {
        let ip = if id == "s1" {
            ip("10.1.0.1")
        } else {
            ip("fd00::2")
        };
        assert!(
            f.db.add_service(id, ip, "api.weave.local", Some(&http))
                .is_ok()
        );
        assert!(
            f.db.add_service(id, ip, "api.weave.local", Some(&web))
                .unwrap()
        );
    }
    f.db.add("s3", ip("10.1.0.3"), "api.weave.local").unwrap();
    assert_eq!(
        ask(&mut f, "_http._tcp.api.weave.local.", RecordType::SRV),
        nxdomain
    );
    // One record per instance: s1 and s2.
    assert_eq!(
        ask(&mut f, "_web._tcp.api.weave.local.", RecordType::SRV).1,
        2
    );
}

/// Two entries at one address offering one service on two ports (two containers
/// sharing a network namespace): both ports are answered, the address once.
#[test]
fn srv_answers_every_port_of_a_shared_address() {
    let mut f = fixture();
    for (id, port) in [("p1", "80"), ("p2", "8080"), ("p3", "80")] {
        let s = crate::ServicePort::parse("_http._tcp", port).unwrap();
        f.db.add_service(id, ip("10.4.0.1"), "pod.weave.local", Some(&s))
            .unwrap();
    }
    let m = f.answer(
        &query("_http._tcp.pod.weave.local.", RecordType::SRV, None),
        Transport::Udp,
    );
    let target = "0a040001.addr.weave.local.".to_owned();
    assert_eq!(
        srv_records(&m),
        [(0, 1, 80, target.clone()), (0, 1, 8080, target.clone())]
    );
    assert_eq!(additional_addrs(&m), [(target, ip("10.4.0.1"))]);
    let mut eps = f.db.lookup_service("_http._tcp.pod.weave.local");
    eps.sort_unstable();
    assert_eq!(
        eps,
        [
            "10.4.0.1:80".parse().unwrap(),
            "10.4.0.1:8080".parse().unwrap()
        ]
    );
    // Removing the entry with port 8080 leaves port 80 alone.
    f.db.remove("p2", None, None);
    let m = f.answer(
        &query("_http._tcp.pod.weave.local.", RecordType::SRV, None),
        Transport::Udp,
    );
    assert_eq!((m.answers.len(), m.additionals.len()), (1, 1));
}

#[test]
fn srv_answers_truncate_and_leave_out_additionals() {
    let mut f = fixture();
    // 40 instances: 40 SRV records of 45 bytes do not fit 512 bytes.
    for i in 0..40u16 {
        let s = crate::ServicePort::parse("_x._tcp", &(1000 + i).to_string()).unwrap();
        let ip = IpAddr::from([10, 2, 0, i as u8]);
        f.db.add_service(&format!("t{i}"), ip, "many.weave.local", Some(&s))
            .unwrap();
    }
    let q = query("_x._tcp.many.weave.local.", RecordType::SRV, None);
    let n = match f.ask(&q, Transport::Udp) {
        Outcome::Reply(n) => n,
        other => panic!("{other:?}"),
    };
    assert!(n <= 512);
    let m = Message::from_vec(&f.out[..n]).unwrap();
    assert!(m.metadata.truncation);
    assert!(m.additionals.is_empty());
    assert!(!m.answers.is_empty());
    // Over TCP everything fits.
    let m = f.answer(&q, Transport::Tcp);
    assert!(!m.metadata.truncation);
    assert_eq!((m.answers.len(), m.additionals.len()), (40, 40));
    // 24 instances in 1232 bytes: the SRV records fit, the additionals are cut.
    for i in 0..24u8 {
        let s = crate::ServicePort::parse("_y._tcp", "9").unwrap();
        f.db.add_service(
            &format!("u{i}"),
            IpAddr::from([10, 3, 0, i]),
            "wide.weave.local",
            Some(&s),
        )
        .unwrap();
    }
    let q = query("_y._tcp.wide.weave.local.", RecordType::SRV, Some(1232));
    let n = match f.ask(&q, Transport::Udp) {
        Outcome::Reply(n) => n,
        other => panic!("{other:?}"),
    };
    assert!(n <= 1232);
    let m = Message::from_vec(&f.out[..n]).unwrap();
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 24);
    assert!(
        !m.additionals.is_empty() && m.additionals.len() < 24,
        "{}",
        m.additionals.len()
    );
    // Each additional record is the address of an answered target.
    let targets = srv_records(&m);
    for (owner, addr) in additional_addrs(&m) {
        assert!(targets.iter().any(|t| t.3 == owner), "{owner}");
        assert_eq!(Some(addr), parse_target_text(&owner));
    }
    assert!(m.edns.is_some(), "the OPT record is kept");
}

/// The address a target name (text) stands for.
fn parse_target_text(name: &str) -> Option<IpAddr> {
    let hex = name.strip_suffix(".addr.weave.local.")?;
    let mut label = vec![u8::try_from(hex.len()).ok()?];
    label.extend_from_slice(hex.as_bytes());
    parse_target(&label)
}

/// Over TCP an answer can pass 16 KiB, beyond a compression pointer's reach: the
/// additional records of targets written there carry their owner written out.
#[test]
fn srv_answers_past_16k_write_additional_owners_out() {
    let mut f = fixture();
    let s = crate::ServicePort::parse("_z._tcp", "7").unwrap();
    for i in 0..600u16 {
        let [hi, lo] = i.to_be_bytes();
        f.db.add_service(
            &format!("v{i}"),
            IpAddr::from([10, 5, hi, lo]),
            "huge.weave.local",
            Some(&s),
        )
        .unwrap();
    }
    let q = query("_z._tcp.huge.weave.local.", RecordType::SRV, None);
    let Outcome::Reply(n) = f.ask(&q, Transport::Tcp) else {
        panic!("no reply")
    };
    assert!(n > 0x4000, "{n}");
    let m = Message::from_vec(&f.out[..n]).unwrap();
    assert!(!m.metadata.truncation);
    assert_eq!(m.answers.len(), 600);
    let extra = additional_addrs(&m);
    assert!(extra.len() > 100, "{}", extra.len());
    for (owner, addr) in extra {
        assert_eq!(Some(addr), parse_target_text(&owner), "{owner}");
    }
}

/// A query with EDNS: `version`, flags (DO is 0x8000) and options as given.
fn query_edns(name: &str, rtype: RecordType, version: u8, flags: u16, options: &[u8]) -> Vec<u8> {
    let mut p = query(name, rtype, None);
    p[11] = 1;
    let f = flags.to_be_bytes();
    let len = (options.len() as u16).to_be_bytes();
    p.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, version, f[0], f[1], len[0], len[1]]);
    p.extend_from_slice(options);
    p
}

/// The response's OPT record: (extended rcode byte, version, flags, rdata length).
fn opt_of(reply: &[u8]) -> (u8, u8, u16, u16) {
    let opt = &reply[reply.len() - 11..];
    assert_eq!(&opt[..3], &[0, 0, 41], "the OPT record comes last");
    (
        opt[5],
        opt[6],
        u16::from_be_bytes([opt[7], opt[8]]),
        u16::from_be_bytes([opt[9], opt[10]]),
    )
}

#[test]
fn the_do_bit_is_echoed_and_other_flags_are_not() {
    let mut f = srv_fixture();
    let names = [
        ("web.weave.local.", RecordType::A),
        ("nope.weave.local.", RecordType::A),
        ("web.weave.local.", RecordType::MX),
        ("weave.local.", RecordType::SOA),
        ("_http._tcp.api.weave.local.", RecordType::SRV),
        ("1.0.0.10.in-addr.arpa.", RecordType::PTR),
    ];
    for (name, rtype) in names {
        for (flags, options, want_flags) in [
            (0x8000u16, &[][..], 0x8000u16),
            (0x0000, &[][..], 0),
            (0x0080, &[][..], 0),
            (0x8080, &[0, 100, 0, 2, 1, 2][..], 0x8000),
            // A client subnet option: the hickory-proto path.
            (0x8000, &[0, 8, 0, 4, 0, 1, 0, 0][..], 0x8000),
        ] {
            let p = query_edns(name, rtype, 0, flags, options);
            let Outcome::Reply(n) = f.ask(&p, Transport::Udp) else {
                panic!("{name}: no reply")
            };
            let (ext, version, got, rdlen) = opt_of(&f.out[..n]);
            assert_eq!(
                (ext, version, got, rdlen),
                (0, 0, want_flags, 0),
                "{name} {flags:#x}"
            );
        }
        // Version 1: BADVERS, with the DO bit echoed (RFC 8906 §8.2.9).
        for (flags, options, want_flags) in [
            (0x8000u16, &[][..], 0x8000u16),
            (0x0080, &[][..], 0),
            (0x0000, &[0, 100, 0, 0][..], 0),
        ] {
            let p = query_edns(name, rtype, 1, flags, options);
            let Outcome::Reply(n) = f.ask(&p, Transport::Udp) else {
                panic!("{name}: no reply")
            };
            let reply = &f.out[..n];
            assert_eq!(
                Rcode::of(reply),
                Some(Rcode::NOERROR),
                "BADVERS is 16: low bits 0"
            );
            assert_eq!(opt_of(reply), (1, 0, want_flags, 0), "{name} {flags:#x}");
        }
    }
}

/// A name with nothing of its own but an answered name below it is an empty
/// non-terminal: NODATA with the SOA to every type (RFC 8020), through the fast
/// path and the hickory-proto one, until the last answered name below it goes.
#[test]
fn empty_non_terminals_answer_nodata_until_the_last_name_below_goes() {
    let mut f = fixture();
    let ask = |f: &mut Fixture, name: &str, t: RecordType, edns: Option<u16>| {
        let m = f.answer(&query(name, t, edns), Transport::Udp);
        let soa = m.authorities.len() == 1
            && m.authorities[0].record_type() == RecordType::SOA
            && m.authorities[0].name.to_ascii() == "weave.local.";
        (m.metadata.response_code, m.answers.len(), soa)
    };
    let nodata = (ResponseCode::NoError, 0, true);
    let nxdomain = (ResponseCode::NXDomain, 0, true);
    assert_eq!(
        ask(&mut f, "prod.weave.local.", RecordType::A, None),
        nxdomain
    );
    f.db.add("e1", ip("10.9.0.1"), "api.eu.prod.weave.local")
        .unwrap();
    for name in ["prod.weave.local.", "Eu.Prod.weave.local."] {
        for t in [
            RecordType::A,
            RecordType::AAAA,
            RecordType::MX,
            RecordType::SRV,
            RecordType::TXT,
            RecordType::SOA,
            RecordType::ANY,
        ] {
            assert_eq!(ask(&mut f, name, t, None), nodata, "{name} {t}");
            assert_eq!(ask(&mut f, name, t, Some(1232)), nodata, "{name} {t} EDNS");
        }
    }
    // Not the names beside or below, nor `_` names under the non-terminal.
    for name in [
        "x.prod.weave.local.",
        "x.api.eu.prod.weave.local.",
        "us.prod.weave.local.",
        "_http._tcp.prod.weave.local.",
    ] {
        assert_eq!(ask(&mut f, name, RecordType::A, None), nxdomain, "{name}");
    }
    assert_eq!(
        ask(&mut f, "api.eu.prod.weave.local.", RecordType::A, None),
        (ResponseCode::NoError, 1, false)
    );
    // A second name below keeps it; a starting (unanswered) one does not count.
    f.db.add("e2", ip("10.9.0.2"), "db.prod.weave.local")
        .unwrap();
    f.db.add_checked(
        "e3",
        ip("10.9.0.3"),
        "web.us.prod.weave.local",
        None,
        dwara_records::Health::Starting,
    )
    .unwrap();
    assert_eq!(
        ask(&mut f, "us.prod.weave.local.", RecordType::A, None),
        nxdomain
    );
    f.db.remove_all("e1");
    assert_eq!(
        ask(&mut f, "eu.prod.weave.local.", RecordType::A, None),
        nxdomain
    );
    assert_eq!(
        ask(&mut f, "prod.weave.local.", RecordType::A, None),
        nodata
    );
    f.db.remove_all("e2");
    assert_eq!(
        ask(&mut f, "prod.weave.local.", RecordType::A, None),
        nxdomain
    );
    assert_eq!(
        ask(&mut f, "prod.weave.local.", RecordType::MX, None),
        nxdomain
    );
    // It comes back with the check's verdict.
    f.db.set_health("e3", ip("10.9.0.3"), dwara_records::Health::Healthy);
    assert_eq!(
        ask(&mut f, "us.prod.weave.local.", RecordType::TXT, None),
        nodata
    );
    assert_eq!(
        ask(&mut f, "prod.weave.local.", RecordType::A, None),
        nodata
    );
    f.db.verify().unwrap();
}
