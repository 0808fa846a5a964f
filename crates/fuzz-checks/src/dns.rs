//! DNS request checks against a model of the zone: `dns_udp` (what the answer must
//! be) and `dns_differential` (the fast parser and the hickory-proto path agree).

use std::collections::BTreeSet;
use std::net::IpAddr;

use dwara_nameserver::QueryHandler;
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};

use crate::{BIG_COUNT, WEB_V4, WEB_V6, big_addr, handler};

/// The labels of a name, ASCII-lower-cased, from the root down reversed (as on the
/// wire: `web`, `weave`, `local`).
fn lower_labels(name: &hickory_proto::rr::Name) -> Vec<Vec<u8>> {
    name.iter().map(|l| l.to_ascii_lowercase()).collect()
}

/// What the model zone holds at a (lower-cased) name.
#[derive(Debug, PartialEq, Eq)]
enum Node {
    /// `weave.local.` itself.
    Apex,
    /// A name with addresses.
    Addrs(BTreeSet<IpAddr>),
    /// Below the domain, but nothing there.
    Absent,
    /// Not in the domain.
    Outside,
}

fn node(labels: &[Vec<u8>]) -> Node {
    let n = labels.len();
    if n < 2 || labels[n - 2] != b"weave" || labels[n - 1] != b"local" {
        return Node::Outside;
    }
    match &labels[..n - 2] {
        [] => Node::Apex,
        [one] if one == b"web" => Node::Addrs([WEB_V4.into(), WEB_V6.into()].into()),
        [one] if one == b"big" => Node::Addrs((0..BIG_COUNT).map(|i| big_addr(i).into()).collect()),
        _ => Node::Absent,
    }
}

/// The addresses of `rtype`'s family among `addrs`.
fn family(addrs: &BTreeSet<IpAddr>, rtype: RecordType) -> BTreeSet<IpAddr> {
    addrs
        .iter()
        .filter(|ip| match rtype {
            RecordType::A => ip.is_ipv4(),
            RecordType::AAAA => ip.is_ipv6(),
            _ => false,
        })
        .copied()
        .collect()
}

/// The addresses in an answer section, checking each record's owner, class and TTL.
fn answer_addrs(reply: &Message, ttl: u32) -> Vec<IpAddr> {
    let qname = &reply.queries[0].name();
    reply
        .answers
        .iter()
        .map(|r| {
            assert_eq!(&r.name, *qname, "answer owner differs from the question");
            assert_eq!(r.dns_class, DNSClass::IN);
            assert_eq!(r.ttl, ttl, "answer TTL is not the zone's");
            match &r.data {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(a) => IpAddr::V6(a.0),
                other => panic!("unexpected answer record {other:?}"),
            }
        })
        .collect()
}

/// Any bytes as a UDP query; every answer is the one the zone model expects:
/// the header echoes ID, opcode and RD, the question is echoed byte for byte, and
/// for names in the zone the rcode, AA, TC and the answer records are exactly what
/// the records say (a truncated answer is a subset without duplicates); names
/// outside the zone are never answered from it.
pub fn dns_udp(data: &[u8]) {
    let mut guard = handler().lock().unwrap_or_else(|e| e.into_inner());
    let Some(reply) = guard.answer_udp(data) else {
        return;
    };
    let reply = reply.to_vec();
    drop(guard);
    assert!(reply.len() >= 12, "reply shorter than a header");
    assert_eq!(reply[..2], data[..2], "reply ID differs");
    assert_eq!(reply[2] & 0x79, data[2] & 0x79, "opcode or RD not echoed");
    let decoded = Message::from_vec(&reply)
        .unwrap_or_else(|e| panic!("reply does not decode ({e}): {reply:02x?}"));
    assert_eq!(decoded.metadata.message_type, MessageType::Response);
    let Ok(query) = Message::from_vec(data) else {
        // Undecodable: a bare FORMERR.
        assert_eq!(decoded.metadata.response_code, ResponseCode::FormErr);
        assert!(decoded.answers.is_empty() && decoded.queries.is_empty());
        return;
    };
    assert_ne!(
        query.metadata.message_type,
        MessageType::Response,
        "a response was answered"
    );
    if query.metadata.op_code != OpCode::Query || query.queries.len() != 1 {
        assert!(decoded.answers.is_empty(), "answers to a non-query");
        assert!(matches!(
            decoded.metadata.response_code,
            ResponseCode::NotImp | ResponseCode::FormErr
        ));
        return;
    }
    let limit = match &query.edns {
        None => 512,
        Some(e) => usize::from(e.max_payload().clamp(512, 4096)),
    };
    assert!(
        reply.len() <= limit,
        "UDP reply of {} > {limit}",
        reply.len()
    );
    if decoded.metadata.response_code == ResponseCode::FormErr && decoded.queries.is_empty() {
        // A question hickory-proto reads but the server does not take (a name over
        // 255 bytes in wire form, say): refused as malformed, which is allowed.
        assert!(decoded.answers.is_empty());
        return;
    }
    let q = &query.queries[0];
    assert_eq!(decoded.queries.len(), 1, "question not echoed");
    let echoed = &decoded.queries[0];
    assert!(echoed.name().eq_case(q.name()), "question name changed");
    assert_eq!(
        (echoed.query_type(), echoed.query_class()),
        (q.query_type(), q.query_class())
    );
    assert_eq!(
        decoded.edns.is_some(),
        query.edns.is_some(),
        "EDNS not mirrored"
    );
    if query.edns.as_ref().is_some_and(|e| e.version() > 0) {
        // Code 16 is BADVERS and BADSIG both; hickory-proto decodes it as BADSIG.
        assert_eq!(
            u16::from(decoded.metadata.response_code),
            u16::from(ResponseCode::BADVERS),
            "EDNS version > 0 not answered BADVERS"
        );
        return;
    }
    let labels = lower_labels(q.name());
    let zone = node(&labels);
    let rcode = decoded.metadata.response_code;
    if !matches!(q.query_class(), DNSClass::IN | DNSClass::ANY) {
        assert_ne!(
            zone,
            Node::Outside,
            "foreign class outside the zone answered"
        );
        assert_eq!(rcode, ResponseCode::Refused);
        return;
    }
    let ttl = 1;
    match zone {
        Node::Outside => {
            // Only reverse names are answered outside the zone.
            assert_eq!(q.query_type(), RecordType::PTR, "outside name answered");
            assert_eq!(rcode, ResponseCode::NoError);
            for r in &decoded.answers {
                let RData::PTR(ptr) = &r.data else {
                    panic!("non-PTR answer {r:?}");
                };
                let target = lower_labels(&ptr.0);
                assert!(
                    matches!(node(&target), Node::Addrs(_)),
                    "PTR to an unknown name {}",
                    ptr.0
                );
            }
        }
        Node::Absent => {
            assert_eq!(rcode, ResponseCode::NXDomain);
            assert!(decoded.answers.is_empty());
            assert!(decoded.metadata.authoritative);
            assert_eq!(decoded.authorities.len(), 1, "no SOA with NXDOMAIN");
        }
        Node::Apex => {
            assert_eq!(rcode, ResponseCode::NoError);
            if q.query_type() == RecordType::SOA {
                assert_eq!(decoded.answers.len(), 1);
                assert_eq!(decoded.answers[0].record_type(), RecordType::SOA);
            } else {
                assert!(decoded.answers.is_empty());
            }
        }
        Node::Addrs(addrs) => {
            assert_eq!(rcode, ResponseCode::NoError);
            assert!(decoded.metadata.authoritative);
            let want = family(&addrs, q.query_type());
            let got = answer_addrs(&decoded, ttl);
            let unique: BTreeSet<IpAddr> = got.iter().copied().collect();
            assert_eq!(unique.len(), got.len(), "duplicate answers");
            assert!(unique.is_subset(&want), "answers {got:?} not in {want:?}");
            if want.is_empty() {
                assert_eq!(decoded.authorities.len(), 1, "NODATA without SOA");
            } else {
                assert!(!got.is_empty(), "no answer fits");
            }
            assert_eq!(
                decoded.metadata.truncation,
                unique.len() < want.len(),
                "TC does not say whether answers are missing"
            );
        }
    }
}

/// The parts of a response that must not depend on the parser: header flags and
/// counts, the question, the answer records as a set (the order is shuffled) unless
/// truncated (then only their number: each path picks its own subset), authority
/// and additional records.
pub(crate) fn comparable(reply: &[u8]) -> (Vec<u8>, String, Vec<Record>, Vec<Record>, String) {
    let m = Message::from_vec(reply)
        .unwrap_or_else(|e| panic!("reply does not decode ({e}): {reply:02x?}"));
    let mut answers = m.answers.clone();
    answers.sort_by_key(|r| format!("{r}"));
    if m.metadata.truncation {
        answers.clear();
    }
    let questions = format!("{:?}", m.queries);
    let edns = format!("{:?}", m.edns);
    let mut head = reply[2..12].to_vec();
    head.extend_from_slice(&reply[..2]);
    (
        head,
        questions,
        answers,
        [m.authorities.clone(), m.additionals.clone()].concat(),
        edns,
    )
}

/// Any bytes; when the hand-written parser takes them (the fast path), the
/// hickory-proto path must give the same response: same ID, flags, rcode and
/// counts, same question, same answer set, same authority and EDNS.
pub fn dns_differential(data: &[u8]) {
    if !QueryHandler::takes_fast_path(data) {
        return;
    }
    let mut guard = handler().lock().unwrap_or_else(|e| e.into_inner());
    let fast = guard.answer_udp(data).map(<[u8]>::to_vec);
    let slow = guard.answer_udp_slow(data).map(<[u8]>::to_vec);
    drop(guard);
    match (fast, slow) {
        (None, None) => {}
        (Some(fast), Some(slow)) => {
            let (f, s) = (comparable(&fast), comparable(&slow));
            assert_eq!(
                f, s,
                "fast and slow answers differ\nfast {fast:02x?}\nslow {slow:02x?}"
            );
        }
        (fast, slow) => panic!("one path answers, the other does not: {fast:02x?} vs {slow:02x?}"),
    }
}
