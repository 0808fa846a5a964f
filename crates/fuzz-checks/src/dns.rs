//! DNS request checks against a model of the zone: `dns_udp` (what the answer must
//! be) and `dns_differential` (the fast parser and the hickory-proto path agree).
//!
//! The model is computed from the fixture's registrations ([`crate::fixture`]) by the
//! rules the README states, written out again here rather than taken from the server:
//! an entry is answered when it is unchecked or healthy, or, when the zone fails open
//! and no entry of its name is, when it is unhealthy (never while starting); a name
//! with no answered entry does not exist; `<service>.<name>` holds one SRV record per
//! (address, port) of the answered entries carrying that service, each targeting
//! `<hex address>.addr.weave.local.`, which answers that address while some name
//! answers it; `addr.weave.local.` exists, empty, and so does `_tcp.<name>` (`_udp`)
//! above a service; any other name below the domain with an answered name below
//! it is an empty non-terminal (NODATA, RFC 8020), and NXDOMAIN otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::OnceLock;

use dwara_nameserver::{Health, HealthFailMode, QueryHandler};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::{fixture, handler};

/// The TTL of every record of the zone, and of its negative answers.
const TTL: u32 = 1;
/// Sizes of records whose owner is a compression pointer: A, AAAA.
const A_LEN: usize = 16;
const AAAA_LEN: usize = 28;

/// The size of an SRV record whose owner is a compression pointer and whose target,
/// written out, is `target`.
fn srv_len(target: &Name) -> usize {
    // Wire form: a length byte per label, the labels, the root's zero byte.
    18 + target.iter().map(|l| 1 + l.len()).sum::<usize>() + 1
}

/// The target name of the instance at `ip`: `<hex address>.addr.weave.local.`,
/// the address's bytes in lower-case hex.
fn target_of(ip: IpAddr) -> Name {
    let hex: String = match ip {
        IpAddr::V4(a) => a.octets().iter().map(|b| format!("{b:02x}")).collect(),
        IpAddr::V6(a) => a.octets().iter().map(|b| format!("{b:02x}")).collect(),
    };
    Name::from_ascii(format!("{hex}.addr.weave.local.")).expect("a valid name")
}

/// The labels of a name, ASCII-lower-cased, from the left (`web`, `weave`, `local`).
fn lower_labels(name: &Name) -> Vec<Vec<u8>> {
    name.iter().map(|l| l.to_ascii_lowercase()).collect()
}

/// What one name of the zone answers.
#[derive(Debug, Default, PartialEq, Eq)]
struct Served {
    /// The addresses of its answered entries.
    addrs: BTreeSet<IpAddr>,
    /// Service (its two labels, `_http` and `_tcp`) → the (address, port) of the
    /// answered entries carrying it.
    services: BTreeMap<(Vec<u8>, Vec<u8>), Offered>,
}

/// The instances, (address, port), of one service of one name.
type Offered = BTreeSet<(IpAddr, u16)>;

/// A name's labels before the domain, lower-case, from the left.
type Labels = Vec<Vec<u8>>;

/// The zone as a client sees it, for one fail mode.
#[derive(Debug)]
struct Zone {
    /// The labels before the domain → what that name answers; names with nothing
    /// answered are left out (they do not exist).
    names: BTreeMap<Labels, Served>,
    /// Reverse name (lower-case labels) → the names answering that address.
    reverse: BTreeMap<Vec<Vec<u8>>, BTreeSet<Labels>>,
    /// SRV target first label (lower-case hex) → the address it answers.
    targets: BTreeMap<Vec<u8>, IpAddr>,
}

/// Whether an entry in `health` is answered on its own merits.
fn passes(health: Health) -> bool {
    matches!(health, Health::Unchecked | Health::Healthy)
}

impl Zone {
    fn build(fail: HealthFailMode) -> Self {
        let all = fixture();
        let mut names = BTreeMap::new();
        let first_labels: BTreeSet<&str> = all.iter().map(|e| e.name).collect();
        for name in first_labels {
            let entries: Vec<_> = all.iter().filter(|e| e.name == name).collect();
            let any_passes = entries.iter().any(|e| passes(e.health));
            let fails_open = fail == HealthFailMode::Open && !any_passes;
            let mut served = Served::default();
            for e in entries {
                if !(passes(e.health) || (fails_open && e.health == Health::Unhealthy)) {
                    continue;
                }
                served.addrs.insert(e.ip);
                if let Some((service, port)) = e.service {
                    let (svc, proto) = service.split_once('.').expect("two labels");
                    let key = (svc.as_bytes().to_vec(), proto.as_bytes().to_vec());
                    served.services.entry(key).or_default().insert((e.ip, port));
                }
            }
            if !served.addrs.is_empty() {
                let labels: Labels = name.split('.').map(|l| l.as_bytes().to_vec()).collect();
                names.insert(labels, served);
            }
        }
        let mut reverse: BTreeMap<Vec<Vec<u8>>, BTreeSet<Labels>> = BTreeMap::new();
        let mut targets = BTreeMap::new();
        for (name, served) in &names {
            for ip in &served.addrs {
                reverse
                    .entry(lower_labels(&Name::from(*ip)))
                    .or_default()
                    .insert(name.clone());
                let label = lower_labels(&target_of(*ip)).swap_remove(0);
                targets.insert(label, *ip);
            }
        }
        Self {
            names,
            reverse,
            targets,
        }
    }

    /// The model of the zone served when failing `fail`.
    fn get(fail: HealthFailMode) -> &'static Self {
        static OPEN: OnceLock<Zone> = OnceLock::new();
        static CLOSED: OnceLock<Zone> = OnceLock::new();
        match fail {
            HealthFailMode::Open => OPEN.get_or_init(|| Self::build(fail)),
            HealthFailMode::Closed => CLOSED.get_or_init(|| Self::build(fail)),
        }
    }

    /// What the zone holds at a name (lower-case labels).
    fn node(&self, labels: &[Vec<u8>]) -> Node<'_> {
        let n = labels.len();
        if n < 2 || labels[n - 2] != b"weave" || labels[n - 1] != b"local" {
            return Node::Outside;
        }
        let inner = &labels[..n - 2];
        match self.own_node(inner) {
            // An empty non-terminal: an answered name below it.
            Node::Absent
                if self
                    .names
                    .keys()
                    .any(|k| k.len() > inner.len() && k.ends_with(inner)) =>
            {
                Node::Empty
            }
            node => node,
        }
    }

    /// What the zone holds at a name by its own rules (`inner`: the labels before
    /// the domain), empty non-terminals aside.
    fn own_node(&self, inner: &[Vec<u8>]) -> Node<'_> {
        if let Some(served) = self.names.get(inner) {
            return Node::Name(served);
        }
        match inner {
            [] => Node::Apex,
            [addr] if addr == b"addr" => Node::Empty,
            [hex, addr] if addr == b"addr" => self
                .targets
                .get(hex)
                .map_or(Node::Absent, |ip| Node::Target(*ip)),
            [.., addr] if addr == b"addr" => Node::Absent,
            [svc, proto, name @ ..] if svc.starts_with(b"_") && proto.starts_with(b"_") => self
                .names
                .get(name)
                .and_then(|s| s.services.get(&(svc.clone(), proto.clone())))
                .map_or(Node::Absent, Node::Service),
            [proto, name @ ..] if proto.starts_with(b"_") => match self.names.get(name) {
                Some(s) if s.services.keys().any(|(_, p)| p == proto) => Node::Empty,
                _ => Node::Absent,
            },
            _ => Node::Absent,
        }
    }
}

/// What the model zone holds at a (lower-cased) name.
#[derive(Debug, PartialEq, Eq)]
enum Node<'a> {
    /// `weave.local.` itself.
    Apex,
    /// A name with answered entries.
    Name(&'a Served),
    /// `<service>.<name>`: an SRV record per instance (address, port), targeting
    /// the address's target name, whose address is an additional record.
    Service(&'a Offered),
    /// `<hex address>.addr.<domain>`: an SRV target, answering this address.
    Target(IpAddr),
    /// `_tcp.<name>` or `_udp.<name>` above a service, `addr.<domain>`, or a name
    /// with an answered name below it: exists, holds nothing.
    Empty,
    /// Below the domain, but nothing there.
    Absent,
    /// Not in the domain.
    Outside,
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

/// Whether two names have the same labels, byte for byte (case included).
fn same_labels<'a>(name: &Name, labels: impl IntoIterator<Item = &'a [u8]>) -> bool {
    name.iter().eq(labels)
}

/// Checks a record's owner (exactly `owner`, case included), class and TTL.
fn check_head(r: &Record, owner: &Name, what: &str) {
    assert!(
        same_labels(&r.name, owner.iter()),
        "{what} owner {} is not {owner}",
        r.name
    );
    assert_eq!(r.dns_class, DNSClass::IN, "{what} class");
    assert_eq!(r.ttl, TTL, "{what} TTL is not the zone's");
}

/// The addresses among `records`, each checked for owner, class and TTL, with no
/// duplicates; A and AAAA apart.
fn addresses(records: &[Record], owner: &Name, what: &str) -> [BTreeSet<IpAddr>; 2] {
    let mut out = [BTreeSet::new(), BTreeSet::new()];
    for r in records {
        check_head(r, owner, what);
        let (i, ip) = match &r.data {
            RData::A(a) => (0, IpAddr::V4(a.0)),
            RData::AAAA(a) => (1, IpAddr::V6(a.0)),
            other => panic!("unexpected {what} record {other:?}"),
        };
        assert!(out[i].insert(ip), "duplicate {what} record {ip}");
    }
    out
}

/// NXDOMAIN or NODATA: `rcode`, authoritative, no records but the zone's SOA in the
/// authority section.
fn check_negative(reply: &Message, rcode: ResponseCode) {
    assert_eq!(reply.metadata.response_code, rcode);
    assert!(
        reply.metadata.authoritative,
        "negative answer not authoritative"
    );
    assert!(!reply.metadata.truncation, "negative answer truncated");
    assert!(
        reply.answers.is_empty() && reply.additionals.is_empty(),
        "records in a negative answer"
    );
    assert_eq!(reply.authorities.len(), 1, "no SOA in a negative answer");
    let soa = &reply.authorities[0];
    assert_eq!(soa.record_type(), RecordType::SOA);
    assert_eq!(lower_labels(&soa.name), [&b"weave"[..], b"local"]);
    assert_eq!(soa.ttl, TTL, "SOA TTL");
}

/// A positive answer: NOERROR, authoritative, nothing in the authority section.
fn check_positive(reply: &Message) {
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
    assert!(reply.metadata.authoritative, "answer not authoritative");
    assert!(
        reply.authorities.is_empty(),
        "authority records in an answer"
    );
}

/// How many records of `size` bytes fit after `base` bytes in a `limit`-byte reply.
fn room(limit: usize, base: usize, size: usize) -> usize {
    limit.saturating_sub(base) / size
}

/// The UDP payload a query allows: 512 without EDNS, its size clamped to 512–4096.
fn udp_limit(query: &Message) -> usize {
    match &query.edns {
        None => 512,
        Some(e) => usize::from(e.max_payload().clamp(512, 4096)),
    }
}

/// Any bytes as a UDP query, to a zone that fails open and to one that fails
/// closed; every answer is the one the model of that zone expects: the header
/// echoes ID, opcode and RD, the question is echoed byte for byte, and for names in
/// the zone the rcode, AA, TC and every record are exactly what the records and their
/// health say (A/AAAA, SRV with its additional addresses, PTR, NODATA and NXDOMAIN
/// with the SOA, as many records as fit and TC exactly when some do not); names
/// outside the zone are never answered from it, and a query is left unanswered
/// (forwarded) only when it is not for the zone.
pub fn dns_udp(data: &[u8]) {
    for fail in [HealthFailMode::Open, HealthFailMode::Closed] {
        let mut guard = handler(fail).lock().unwrap_or_else(|e| e.into_inner());
        let reply = guard.answer_udp(data).map(<[u8]>::to_vec);
        drop(guard);
        let zone = Zone::get(fail);
        match reply {
            Some(reply) => check_udp(data, &reply, zone),
            None => check_silence(data, zone),
        }
    }
}

/// No answer: only for what has no header or is a response (dropped) and for
/// queries the zone does not answer (forwarded).
fn check_silence(data: &[u8], zone: &Zone) {
    if data.len() < 12 || data[2] & 0x80 != 0 {
        return;
    }
    let query = Message::from_vec(data)
        .unwrap_or_else(|e| panic!("an undecodable query ({e}) not answered FORMERR"));
    assert!(
        query.metadata.op_code == OpCode::Query && query.queries.len() == 1,
        "a query the server must refuse was not answered"
    );
    assert!(
        query.edns.as_ref().is_none_or(|e| e.version() == 0),
        "EDNS version > 0 not answered BADVERS"
    );
    let q = &query.queries[0];
    let labels = lower_labels(q.name());
    assert_eq!(
        zone.node(&labels),
        Node::Outside,
        "a query for {} {} in the zone not answered",
        q.name(),
        q.query_type()
    );
    if q.query_type() == RecordType::PTR && matches!(q.query_class(), DNSClass::IN | DNSClass::ANY)
    {
        assert!(
            !zone.reverse.contains_key(&labels),
            "PTR {} of an answered address not answered",
            q.name()
        );
    }
}

/// One reply to `data` against the model.
fn check_udp(data: &[u8], reply: &[u8], zone: &Zone) {
    if let Some((query, decoded)) = check_envelope(data, reply) {
        check_in_zone(&query, &decoded, reply.len(), zone);
    }
}

/// The parts of a reply that do not depend on the zone: the header echoes the
/// query; an undecodable query gets a bare FORMERR, a non-query NOTIMP or FORMERR,
/// an EDNS version above 0 BADVERS; the question and EDNS are echoed; the reply
/// fits the UDP limit. Returns the query and the reply when the answer itself is
/// still to be checked.
fn check_envelope(data: &[u8], reply: &[u8]) -> Option<(Message, Message)> {
    assert!(reply.len() >= 12, "reply shorter than a header");
    assert_eq!(reply[..2], data[..2], "reply ID differs");
    assert_eq!(reply[2] & 0x79, data[2] & 0x79, "opcode or RD not echoed");
    let decoded = Message::from_vec(reply)
        .unwrap_or_else(|e| panic!("reply does not decode ({e}): {reply:02x?}"));
    assert_eq!(decoded.metadata.message_type, MessageType::Response);
    let Ok(query) = Message::from_vec(data) else {
        // Undecodable: a bare FORMERR.
        assert_eq!(decoded.metadata.response_code, ResponseCode::FormErr);
        assert!(decoded.answers.is_empty() && decoded.queries.is_empty());
        return None;
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
        return None;
    }
    let limit = udp_limit(&query);
    assert!(
        reply.len() <= limit,
        "UDP reply of {} > {limit}",
        reply.len()
    );
    if decoded.metadata.response_code == ResponseCode::FormErr && decoded.queries.is_empty() {
        // A question hickory-proto reads but the server does not take (a name over
        // 255 bytes in wire form, say): refused as malformed, which is allowed.
        assert!(decoded.answers.is_empty());
        return None;
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
        return None;
    }
    Some((query, decoded))
}

/// The answer to the query's one question (a `reply_len`-byte reply) against what
/// the zone holds at its name: REFUSED for other classes, PTR answers outside the
/// zone, NXDOMAIN, NODATA, the apex's SOA, addresses, a target's address, SRV.
fn check_in_zone(query: &Message, decoded: &Message, reply_len: usize, zone: &Zone) {
    let limit = udp_limit(query);
    let q = &query.queries[0];
    let qname = q.name();
    let qtype = q.query_type();
    let labels = lower_labels(qname);
    let node = zone.node(&labels);
    if !matches!(q.query_class(), DNSClass::IN | DNSClass::ANY) {
        assert_ne!(
            node,
            Node::Outside,
            "foreign class outside the zone answered"
        );
        assert_eq!(decoded.metadata.response_code, ResponseCode::Refused);
        return;
    }
    match node {
        Node::Outside => check_ptr(decoded, qname, qtype, zone.reverse.get(&labels)),
        Node::Absent => check_negative(decoded, ResponseCode::NXDomain),
        Node::Empty => check_negative(decoded, ResponseCode::NoError),
        Node::Apex if qtype == RecordType::SOA => {
            check_positive(decoded);
            assert_eq!(decoded.answers.len(), 1);
            let soa = &decoded.answers[0];
            check_head(soa, qname, "SOA");
            assert_eq!(soa.record_type(), RecordType::SOA);
            assert!(decoded.additionals.is_empty() && !decoded.metadata.truncation);
        }
        Node::Apex => check_negative(decoded, ResponseCode::NoError),
        Node::Name(served) => {
            check_addresses(decoded, reply_len, limit, qname, qtype, &served.addrs);
        }
        Node::Target(ip) => check_target(decoded, qname, qtype, ip),
        Node::Service(_) if qtype != RecordType::SRV => {
            check_negative(decoded, ResponseCode::NoError);
        }
        Node::Service(instances) => {
            check_positive(decoded);
            check_srv(decoded, reply_len, limit, qname, instances);
        }
    }
}

/// A query outside the zone that was answered: only PTR for an answered address
/// (`want`: the names answering it), every name once, nothing else, never TC.
fn check_ptr(decoded: &Message, qname: &Name, qtype: RecordType, want: Option<&BTreeSet<Labels>>) {
    assert_eq!(qtype, RecordType::PTR, "outside name answered");
    let want = want.unwrap_or_else(|| panic!("PTR {qname} of no answered address answered"));
    check_positive(decoded);
    assert!(decoded.additionals.is_empty(), "additional records to PTR");
    let mut got = BTreeSet::new();
    for r in &decoded.answers {
        check_head(r, qname, "PTR");
        let RData::PTR(ptr) = &r.data else {
            panic!("non-PTR answer {r:?}");
        };
        let mut target = lower_labels(&ptr.0);
        let at = target.len().checked_sub(2);
        let domain = at.map(|at| target.split_off(at));
        assert!(
            domain.is_some_and(|d| d == [&b"weave"[..], b"local"]),
            "PTR to {} outside the zone",
            ptr.0
        );
        assert!(got.insert(target), "duplicate PTR {}", ptr.0);
    }
    assert_eq!(&got, want, "PTR answers differ from the answered names");
    assert!(!decoded.metadata.truncation, "PTR answer truncated");
}

/// An A or AAAA answer (or NODATA) for a name answering `addrs`: the addresses of
/// the asked family, as many as fit, TC exactly when some are missing.
fn check_addresses(
    decoded: &Message,
    reply_len: usize,
    limit: usize,
    qname: &Name,
    qtype: RecordType,
    addrs: &BTreeSet<IpAddr>,
) {
    let want = family(addrs, qtype);
    if want.is_empty() {
        check_negative(decoded, ResponseCode::NoError);
        return;
    }
    check_positive(decoded);
    assert!(
        decoded.additionals.is_empty(),
        "additional records to A/AAAA"
    );
    let [v4, v6] = addresses(&decoded.answers, qname, "answer");
    let (got, size) = if qtype == RecordType::A {
        assert!(v6.is_empty(), "AAAA answering A");
        (v4, A_LEN)
    } else {
        assert!(v4.is_empty(), "A answering AAAA");
        (v6, AAAA_LEN)
    };
    assert!(got.is_subset(&want), "answers {got:?} not in {want:?}");
    let base = reply_len - got.len() * size;
    assert_eq!(
        got.len(),
        want.len().min(room(limit, base, size)),
        "not as many answers as fit"
    );
    assert_eq!(
        decoded.metadata.truncation,
        got.len() < want.len(),
        "TC does not say whether answers are missing"
    );
}

/// An SRV target's answer: its one address to its family's type, NODATA to others.
fn check_target(decoded: &Message, qname: &Name, qtype: RecordType, ip: IpAddr) {
    let want = BTreeSet::from([ip]);
    if family(&want, qtype).is_empty() {
        check_negative(decoded, ResponseCode::NoError);
        return;
    }
    check_positive(decoded);
    assert!(!decoded.metadata.truncation, "a target's answer truncated");
    assert!(
        decoded.additionals.is_empty(),
        "additional records to a target"
    );
    let [v4, v6] = addresses(&decoded.answers, qname, "target answer");
    let got: BTreeSet<IpAddr> = v4.union(&v6).copied().collect();
    assert_eq!(got, want, "target {qname} answers another address");
}

/// An SRV answer to `qname` (`reply_len` bytes for a query allowing `limit`) against
/// the service's `instances`: one record per instance, priority 0, weight 1, its
/// target written for its address; as many as fit, TC exactly when some are
/// missing (then no additional records); else each answered target's address in
/// the additional section, A records then AAAA records, as many as fit.
fn check_srv(decoded: &Message, reply_len: usize, limit: usize, qname: &Name, instances: &Offered) {
    let tc = decoded.metadata.truncation;
    let mut got = BTreeSet::new();
    for r in &decoded.answers {
        check_head(r, qname, "SRV");
        let RData::SRV(srv) = &r.data else {
            panic!("non-SRV answer {r:?}");
        };
        assert_eq!((srv.priority, srv.weight), (0, 1), "SRV priority, weight");
        let instance = instances
            .iter()
            .find(|(ip, port)| *port == srv.port && target_of(*ip).eq_case(&srv.target))
            .unwrap_or_else(|| panic!("SRV {} {} is no instance", srv.port, srv.target));
        assert!(got.insert(*instance), "two SRV records of {instance:?}");
    }
    let left = limit.saturating_sub(reply_len);
    let missing = instances.difference(&got);
    let largest_missing = missing.map(|(ip, _)| srv_len(&target_of(*ip))).max();
    assert_eq!(
        tc,
        largest_missing.is_some(),
        "TC does not say whether SRV records are missing"
    );
    if let Some(size) = largest_missing {
        assert!(left < size, "an SRV record that fits is missing");
        assert!(
            decoded.additionals.is_empty(),
            "additional records in a truncated SRV answer"
        );
        return;
    }
    // The additional section: the answered targets' addresses, A then AAAA; a cut
    // here never sets TC.
    let mut extra = [BTreeSet::new(), BTreeSet::new()];
    for r in &decoded.additionals {
        let (i, ip) = match &r.data {
            RData::A(a) => (0, IpAddr::V4(a.0)),
            RData::AAAA(a) => (1, IpAddr::V6(a.0)),
            other => panic!("unexpected additional record {other:?}"),
        };
        assert!(
            r.name.eq_case(&target_of(ip)),
            "additional {ip} owned by {}",
            r.name
        );
        assert_eq!(
            (r.dns_class, r.ttl),
            (DNSClass::IN, TTL),
            "additional class, TTL"
        );
        assert!(extra[i].insert(ip), "duplicate additional record {ip}");
    }
    let addrs: BTreeSet<IpAddr> = got.iter().map(|(ip, _)| *ip).collect();
    let (want4, want6) = (
        family(&addrs, RecordType::A),
        family(&addrs, RecordType::AAAA),
    );
    let [v4, v6] = extra;
    assert!(v4.is_subset(&want4), "additional {v4:?} not in {want4:?}");
    assert!(v6.is_subset(&want6), "additional {v6:?} not in {want6:?}");
    if v4.len() < want4.len() {
        assert!(
            left < A_LEN && v6.is_empty(),
            "an A record that fits is missing"
        );
    } else if v6.len() < want6.len() {
        assert!(left < AAAA_LEN, "an AAAA record that fits is missing");
    }
}

/// The parts of a response that must not depend on the parser: header flags and
/// counts, the question, the answer records as a set (the order is shuffled) unless
/// truncated (then only their number: each path picks its own subset), authority
/// and additional records as sets; when the reply to a query allowing `limit` bytes
/// has no room for one more AAAA record, the additional addresses may be a subset
/// (SRV answers cut them without TC), and only their number per type counts.
pub(crate) fn comparable(
    reply: &[u8],
    limit: usize,
) -> (Vec<u8>, String, Vec<Record>, Vec<String>, String) {
    let m = Message::from_vec(reply)
        .unwrap_or_else(|e| panic!("reply does not decode ({e}): {reply:02x?}"));
    let mut answers = m.answers.clone();
    answers.sort_by_key(|r| format!("{r}"));
    if m.metadata.truncation {
        answers.clear();
    }
    let may_be_cut = reply.len() + AAAA_LEN > limit;
    let mut others: Vec<String> = m.authorities.iter().map(|r| format!("{r}")).collect();
    let mut additionals: Vec<String> = m
        .additionals
        .iter()
        .map(|r| match r.record_type() {
            // Each SRV target has its own name: a cut keeps different owners on
            // each path, but as many of each type.
            RecordType::A | RecordType::AAAA if may_be_cut => {
                format!("{} {}", r.ttl, r.record_type())
            }
            _ => format!("{r}"),
        })
        .collect();
    additionals.sort();
    others.push(String::new());
    others.extend(additionals);
    let questions = format!("{:?}", m.queries);
    let edns = format!("{:?}", m.edns);
    let mut head = reply[2..12].to_vec();
    if m.metadata.truncation {
        // Records of different sizes (SRV targets of IPv4 and IPv6 instances): how
        // many fit depends on which were picked.
        head[4..6].fill(0);
    }
    head.extend_from_slice(&reply[..2]);
    (head, questions, answers, others, edns)
}

/// Any bytes; when the hand-written parser takes them (the fast path), the
/// hickory-proto path must give the same response: same ID, flags, rcode and
/// counts, same question, same answer set, same authority, additional records and
/// EDNS.
pub fn dns_differential(data: &[u8]) {
    if !QueryHandler::takes_fast_path(data) {
        return;
    }
    let limit = Message::from_vec(data).map_or(512, |q| udp_limit(&q));
    let mut guard = handler(HealthFailMode::Open)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let fast = guard.answer_udp(data).map(<[u8]>::to_vec);
    let slow = guard.answer_udp_slow(data).map(<[u8]>::to_vec);
    drop(guard);
    match (fast, slow) {
        (None, None) => {}
        (Some(fast), Some(slow)) => {
            let (f, s) = (comparable(&fast, limit), comparable(&slow, limit));
            assert_eq!(
                f, s,
                "fast and slow answers differ\nfast {fast:02x?}\nslow {slow:02x?}"
            );
        }
        (fast, slow) => panic!("one path answers, the other does not: {fast:02x?} vs {slow:02x?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> Vec<Vec<u8>> {
        lower_labels(&text.parse::<Name>().unwrap())
    }

    fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn instances(list: &[(&str, u16)]) -> Offered {
        list.iter()
            .map(|(ip, port)| (ip.parse().unwrap(), *port))
            .collect()
    }

    /// Queries for the fixture's empty non-terminals, names beside them and below
    /// them, of every kind, get the answers the model expects (NODATA above an
    /// answered name, NXDOMAIN elsewhere), from zones failing open and closed.
    #[test]
    fn empty_non_terminals_are_answered_as_the_model_says() {
        use hickory_proto::op::Query;
        for text in [
            "prod.weave.local.",
            "PROD.weave.local.",
            "y.deep.weave.local.",
            "deep.weave.local.",
            "stage.weave.local.",
            "fail.weave.local.",
            "z.api.prod.weave.local.",
            "_tcp.prod.weave.local.",
            "api.prod.weave.local.",
        ] {
            for rtype in [
                RecordType::A,
                RecordType::AAAA,
                RecordType::MX,
                RecordType::SRV,
                RecordType::SOA,
            ] {
                let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
                m.add_query(Query::query(text.parse().unwrap(), rtype));
                dns_udp(&m.to_vec().unwrap());
            }
        }
    }

    /// The model's rules on the fixture, spelled out by hand.
    #[test]
    fn the_model_answers_what_the_readme_says() {
        let open = Zone::get(HealthFailMode::Open);
        let closed = Zone::get(HealthFailMode::Closed);
        let addrs = |z: &Zone, n: &str| match z.node(&name(n)) {
            Node::Name(s) => s.addrs.clone(),
            other => panic!("{n}: {other:?}"),
        };
        for z in [open, closed] {
            assert_eq!(
                addrs(z, "API.weave.local."),
                ips(&[
                    "10.40.0.1",
                    "10.40.0.3",
                    "10.40.0.4",
                    "10.40.0.5",
                    "fd00::40:2"
                ])
            );
            assert_eq!(addrs(z, "mixed.weave.local."), ips(&["10.41.0.1"]));
            assert_eq!(z.node(&name("boot.weave.local.")), Node::Absent);
            assert_eq!(z.node(&name("_http._tcp.boot.weave.local.")), Node::Absent);
            assert_eq!(z.node(&name("_tcp.api.weave.local.")), Node::Empty);
            assert_eq!(z.node(&name("_udp.api.weave.local.")), Node::Empty);
            assert_eq!(z.node(&name("_http.api.weave.local.")), Node::Absent);
            assert_eq!(z.node(&name("_http._udp.api.weave.local.")), Node::Absent);
            assert_eq!(z.node(&name("x._http._tcp.api.weave.local.")), Node::Absent);
            assert_eq!(
                z.node(&name("_HTTP._tcp.api.weave.local.")),
                Node::Service(&instances(&[
                    ("10.40.0.1", 80),
                    ("10.40.0.3", 80),
                    ("10.40.0.3", 8082),
                    ("fd00::40:2", 8080)
                ]))
            );
            assert_eq!(
                z.node(&name("_dns._udp.api.weave.local.")),
                Node::Service(&instances(&[("10.40.0.4", 53)]))
            );
            assert_eq!(
                z.node(&name("_http._tcp.mixed.weave.local.")),
                Node::Service(&instances(&[("10.41.0.1", 80)]))
            );
            // Targets: of answered addresses only; `addr` itself is empty.
            assert_eq!(
                z.node(&name("0A280001.addr.weave.local.")),
                Node::Target("10.40.0.1".parse().unwrap())
            );
            assert_eq!(
                z.node(&name("fd000000000000000000000000400002.addr.weave.local.")),
                Node::Target("fd00::40:2".parse().unwrap())
            );
            assert_eq!(z.node(&name("addr.weave.local.")), Node::Empty);
            assert_eq!(z.node(&name("0a2b0001.addr.weave.local.")), Node::Absent);
            assert_eq!(z.node(&name("x.0a280001.addr.weave.local.")), Node::Absent);
            assert!(z.reverse.contains_key(&name("1.0.41.10.in-addr.arpa.")));
            assert!(!z.reverse.contains_key(&name("2.0.41.10.in-addr.arpa.")));
            assert!(!z.reverse.contains_key(&name("1.0.43.10.in-addr.arpa.")));
        }
        assert_eq!(
            addrs(open, "down.weave.local."),
            ips(&["10.42.0.1", "fd00::42:2"])
        );
        assert_eq!(
            open.node(&name("_http._tcp.down.weave.local.")),
            Node::Service(&instances(&[("10.42.0.1", 80), ("fd00::42:2", 80)]))
        );
        assert_eq!(closed.node(&name("down.weave.local.")), Node::Absent);
        // Empty non-terminals: above an answered name only.
        for z in [open, closed] {
            for ent in [
                "prod.weave.local.",
                "Y.deep.weave.local.",
                "deep.weave.local.",
            ] {
                assert_eq!(z.node(&name(ent)), Node::Empty, "{ent}");
            }
            for absent in [
                "stage.weave.local.",
                "db.stage.weave.local.",
                "z.api.prod.weave.local.",
                "y.weave.local.",
                "_tcp.prod.weave.local.",
            ] {
                assert_eq!(z.node(&name(absent)), Node::Absent, "{absent}");
            }
            assert_eq!(
                z.node(&name("_http._tcp.api.prod.weave.local.")),
                Node::Service(&instances(&[("10.44.0.1", 80)]))
            );
        }
        assert_eq!(open.node(&name("fail.weave.local.")), Node::Empty);
        assert_eq!(closed.node(&name("fail.weave.local.")), Node::Absent);
        assert_eq!(closed.node(&name("_tcp.down.weave.local.")), Node::Absent);
        assert!(
            !closed
                .reverse
                .contains_key(&name("1.0.42.10.in-addr.arpa."))
        );
    }
}
