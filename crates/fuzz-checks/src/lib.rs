//! The checks behind dwara's fuzz targets.
//!
//! Each function takes arbitrary bytes, feeds them to one parser we own and panics
//! only when an invariant breaks (a panic inside the parser is a finding too). The
//! cargo-fuzz targets in `fuzz/` are one-line calls into these functions, and
//! `tests/regressions.rs` replays every committed input of `fuzz/regressions/<target>/`
//! through the same functions on every `cargo test`.
//!
//! | target | what it feeds | what it checks |
//! |---|---|---|
//! | `dns_packet` | bytes as a query, UDP and TCP | a decodable response with the query's ID |
//! | `dns_udp` | bytes as a UDP query, to a zone failing open and one failing closed | the answer a model of the zone expects: addresses, SRV records and their additional addresses, PTR, NODATA (empty non-terminals included) and NXDOMAIN, by the entries' services and health |
//! | `dns_tcp` | a byte stream to a live DNS/TCP listener | one answer per frame, in order, as the handler gives it |
//! | `dns_differential` | fast-path queries through the hickory-proto path too | the same response |
//! | `dns_answers` | upstream answers to the DNS discovery source | no endpoint the answers do not justify |
//! | `http_path` | method, path and body to the HTTP API | 2xx/4xx only, the db agrees with the answers |
//! | `cluster_value` | a cluster value and record | decode never panics, encode → decode round-trips |
//! | `cluster_bucket` | a cluster bucket, plain and as a value | decode never panics, items ordered and bounded, encode → decode round-trips at the planned size |
//! | `cluster_datagram` | bytes as a gossip datagram, and as a message to seal | never opens, never panics; sealed parts fit UDP, open once, not when altered or under another key |
//! | `cluster_keyfile` | text as a gossip key file | no panic; 1 to 16 keys that round-trip, in order |
//! | `store_record` | a store key | decode never panics, encode → decode round-trips |
//! | `records_db` | bytes as a sequence of registrations, merges, health changes, removals, hidden origins, purges | after every change the incremental tables match a recompute from scratch (`Db::verify`) |
//! | `docker_event` | JSON as a container inspect answer | only names under the domain, only its addresses |
//! | `config_yaml`, `resolv_conf`, `http_form` | text | no panic, bounded results |
//! | `allow_list` | text as a DNS allow list | entries print back to themselves, one per word; errors are one line |
//! | `http_auth` | bytes as a token file and an `Authorization` value | an accepted token matches itself and survives its header |
//! | `http_headers` | header lines through the HTTP upstreams' rewriting, the first line as `address:` | no hop-by-hop or `Connection`-named header left, nor a `Content-Length` beside `Transfer-Encoding`, the others kept, `X-Forwarded-*` set |
//!
//! ```
//! // A query for web.weave.local A, checked against the model zone.
//! let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
//! q.extend_from_slice(b"\x03web\x05weave\x05local\x00\x00\x01\x00\x01");
//! dwara_fuzz_checks::dns_udp(&q);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![allow(clippy::expect_used, clippy::unwrap_used)] // Panicking is how a check reports.

mod answers;
mod dns;
mod gossip;
mod http;
mod proxy_headers;
mod records;
mod tcp;

pub use answers::dns_answers;
pub use dns::{dns_differential, dns_udp};
pub use gossip::{cluster_datagram, cluster_keyfile};
pub use http::http_path;
pub use proxy_headers::http_headers;
pub use records::{cluster_bucket, cluster_value, docker_event, records_db, store_record};
pub use tcp::dns_tcp;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Mutex, OnceLock};

use dwara_nameserver::{Db, DbConfig, Domain, Health, HealthFailMode, QueryHandler, ServicePort};
use hickory_proto::op::{Message, MessageType};

/// The zone every DNS check answers from (`weave.local.`, TTL 1), every entry of
/// [`fixture`] registered in order, failing open or closed as `fail` says.
pub(crate) fn zone_db(fail: HealthFailMode) -> Db {
    let mut config = DbConfig::new(Domain::new(ZONE).expect("static domain"));
    config.health_fail = fail;
    let db = Db::new(config);
    for e in fixture() {
        let service = e
            .service
            .map(|(s, p)| ServicePort::parse(s, &p.to_string()).expect("static service"));
        db.add_checked(
            &e.id,
            e.ip,
            &format!("{}.{ZONE}", e.name),
            service.as_ref(),
            e.health,
        )
        .unwrap();
    }
    db
}

/// The domain of the fixture zone.
pub(crate) const ZONE: &str = "weave.local";

/// One registration of the fixture zone.
#[derive(Debug, Clone)]
pub(crate) struct FixtureEntry {
    pub(crate) id: String,
    pub(crate) ip: IpAddr,
    /// The labels before the domain; the name is `<name>.weave.local.`.
    pub(crate) name: &'static str,
    /// Service and port, answered as SRV.
    pub(crate) service: Option<(&'static str, u16)>,
    pub(crate) health: Health,
}

/// How many addresses `big.weave.local` has.
pub(crate) const BIG_COUNT: u8 = 60;

/// The registrations of the fixture zone, in the order they are made:
///
/// - `web`: one v4 and one v6 address, no service, unchecked;
/// - `big`: [`BIG_COUNT`] v4 addresses (more than fit in 512 bytes) and one v6,
///   each on `_http._tcp` with one of 30 ports (more SRV records than fit in 512
///   bytes, more additional addresses than fit in 1,400);
/// - `api`: `_http._tcp` on ports 80 (two v4 entries) and 8080 (one v6), `_dns._udp`
///   port 53 (v4), one address without a service, before them a starting entry on
///   port 8081 sharing an address with a served one, and after them port 8082 at an
///   address that also has port 80;
/// - `mixed`: one healthy, one unhealthy, one starting entry (all `_http._tcp`, ports
///   80, 81, 82): only the healthy one is answered;
/// - `down`: two unhealthy entries (v4 and v6, port 80) and a starting one (port 81):
///   the unhealthy ones are answered when the zone fails open, nothing otherwise;
/// - `boot`: one starting entry (port 80): never answered;
/// - names of several labels, whose ancestors are empty non-terminals while they
///   are answered: `api.prod` (`_http._tcp` port 80) and `x.y.deep` (unchecked),
///   `db.stage` (starting: `stage` does not exist), `svc.fail` (unhealthy: `fail`
///   exists only when the zone fails open).
pub(crate) fn fixture() -> Vec<FixtureEntry> {
    use Health::{Healthy, Starting, Unchecked, Unhealthy};
    let v4 = |a, b, c, d| IpAddr::V4(Ipv4Addr::new(a, b, c, d));
    let v6 = |a, b| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, a, b));
    let http = Some("_http._tcp");
    let mut all = Vec::new();
    let mut add = |id: &str, ip, name, service: Option<&'static str>, port, health| {
        all.push(FixtureEntry {
            id: id.to_owned(),
            ip,
            name,
            service: service.map(|s| (s, port)),
            health,
        });
    };
    add("c1", v4(10, 32, 0, 1), "web", None, 0, Unchecked);
    add("c2", v6(0, 1), "web", None, 0, Unchecked);
    for i in 0..BIG_COUNT {
        let port = 9000 + u16::from(i % 30);
        add(
            &format!("big{i}"),
            v4(10, 33, 0, i),
            "big",
            http,
            port,
            Unchecked,
        );
    }
    add("big-v6", v6(0x33, 1), "big", http, 9000, Unchecked);
    add("a0", v4(10, 40, 0, 1), "api", http, 8081, Starting);
    add("a1", v4(10, 40, 0, 1), "api", http, 80, Unchecked);
    add("a2", v6(0x40, 2), "api", http, 8080, Unchecked);
    add("a3", v4(10, 40, 0, 3), "api", http, 80, Unchecked);
    add(
        "a4",
        v4(10, 40, 0, 4),
        "api",
        Some("_dns._udp"),
        53,
        Unchecked,
    );
    add("a5", v4(10, 40, 0, 5), "api", None, 0, Unchecked);
    add("a6", v4(10, 40, 0, 3), "api", http, 8082, Unchecked);
    add("m1", v4(10, 41, 0, 1), "mixed", http, 80, Healthy);
    add("m2", v4(10, 41, 0, 2), "mixed", http, 81, Unhealthy);
    add("m3", v6(0x41, 3), "mixed", http, 82, Starting);
    add("d1", v4(10, 42, 0, 1), "down", http, 80, Unhealthy);
    add("d2", v6(0x42, 2), "down", http, 80, Unhealthy);
    add("d3", v4(10, 42, 0, 3), "down", http, 81, Starting);
    add("b1", v4(10, 43, 0, 1), "boot", http, 80, Starting);
    add("p1", v4(10, 44, 0, 1), "api.prod", http, 80, Unchecked);
    add("p2", v4(10, 44, 0, 2), "x.y.deep", None, 0, Unchecked);
    add("p3", v4(10, 44, 0, 3), "db.stage", None, 0, Starting);
    add("p4", v4(10, 44, 0, 4), "svc.fail", None, 0, Unhealthy);
    all
}

/// One handler over [`zone_db`] per fail mode, for the whole process.
pub(crate) fn handler(fail: HealthFailMode) -> &'static Mutex<QueryHandler> {
    /// The database kept beside its handler.
    struct Fixture {
        _db: Db,
        handler: Mutex<QueryHandler>,
    }
    static OPEN: OnceLock<Fixture> = OnceLock::new();
    static CLOSED: OnceLock<Fixture> = OnceLock::new();
    let cell = match fail {
        HealthFailMode::Open => &OPEN,
        HealthFailMode::Closed => &CLOSED,
    };
    &cell
        .get_or_init(|| {
            let db = zone_db(fail);
            let handler = Mutex::new(QueryHandler::new(&db));
            Fixture { _db: db, handler }
        })
        .handler
}

/// Any packet: no panic; every reply is a well-formed DNS response to that query
/// (same ID, QR set) that hickory-proto can decode, and a UDP reply to a query
/// without EDNS fits in 512 bytes.
pub fn dns_packet(data: &[u8]) {
    let mut handler = handler(HealthFailMode::Open)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let query = Message::from_vec(data).ok();
    for tcp in [false, true] {
        let reply = if tcp {
            handler.answer_tcp(data)
        } else {
            handler.answer_udp(data)
        };
        let Some(reply) = reply else { continue };
        assert!(reply.len() >= 12, "reply shorter than a header");
        assert_eq!(reply[..2], data[..2], "reply ID differs from the query's");
        let decoded = Message::from_vec(reply)
            .unwrap_or_else(|e| panic!("reply does not decode ({e}): {reply:02x?}"));
        assert_eq!(decoded.metadata.message_type, MessageType::Response);
        if !tcp && query.as_ref().is_some_and(|q| q.edns.is_none()) {
            assert!(
                reply.len() <= 512,
                "UDP reply of {} bytes without EDNS",
                reply.len()
            );
        }
    }
}

/// Any bytes as a YAML config file: `Config::parse` returns `Ok` or an error whose
/// message is one line; it never panics.
pub fn config_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = dwara::config::Config::parse(text) {
        let msg = format!("{e:#}");
        assert!(!msg.is_empty());
    }
    let _ = Domain::new(text);
}

/// Any text as resolv.conf: no panic, and only addresses from `nameserver` lines.
pub fn resolv_conf(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let servers = dwara_nameserver::parse_resolv_conf(&text);
    assert!(servers.len() <= text.matches("nameserver").count());
}

/// Any bytes as an HTTP form body: no panic, and a decoded value is never longer than
/// the body it came from (decoding only shrinks, up to UTF-8 replacement characters).
/// The `port` and `service` values give a service only in the checked form (port
/// 1–65535, `_name._tcp|_udp`, lower-case), which parses back to itself, with the
/// `priority` and `weight` values when given (0 and 1 when not) and never without
/// a port; a `check` value gives a check only when it names a known kind and there
/// is a port.
pub fn http_form(data: &[u8]) {
    use dwara_nameserver::http::{ServiceForm, form_value, service_param};
    let [port, service, priority, weight] =
        ["port", "service", "priority", "weight"].map(|key| form_value(data, key));
    let parsed = service_param(ServiceForm {
        port: port.as_deref(),
        service: service.as_deref(),
        priority: priority.as_deref(),
        weight: weight.as_deref(),
    });
    if port.is_none() && (priority.is_some() || weight.is_some()) {
        assert!(parsed.is_err(), "a priority or weight without a port");
    }
    let check = form_value(data, "check");
    let with_check = dwara_nameserver::http::check_param(
        check.as_deref(),
        parsed.as_ref().ok().and_then(Option::as_ref),
    );
    match (&with_check, &check) {
        // A check is accepted only with a port, and only a known kind.
        (Ok(Some(kind)), Some(text)) => {
            assert!(matches!(parsed, Ok(Some(_))), "{text:?} without a port");
            assert!(text.trim().eq_ignore_ascii_case(kind.as_str()), "{text:?}");
        }
        (Ok(Some(_)), None) => panic!("a check from no check value"),
        (Ok(None), c) => assert!(c.is_none(), "{c:?} ignored"),
        (Err(e), _) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
    if let Ok(Some(s)) = parsed {
        assert!(s.port() >= 1);
        let text = s.service();
        assert_eq!(text, text.to_ascii_lowercase());
        assert!(text.starts_with('_') && (text.ends_with("._tcp") || text.ends_with("._udp")));
        let given = |value: Option<&String>, default: u16| {
            value.map_or(default, |v| {
                v.trim().parse::<u16>().expect("an accepted value")
            })
        };
        assert_eq!(s.priority(), given(priority.as_ref(), 0), "{priority:?}");
        assert_eq!(s.weight(), given(weight.as_ref(), 1), "{weight:?}");
        let again = ServicePort::parse(text, &s.port().to_string())
            .map(|a| a.with_priority(s.priority()).with_weight(s.weight()));
        assert_eq!(again.as_ref().ok(), Some(&s), "{text}");
    }
    if let Some(value) = form_value(data, "fqdn") {
        let replaced = value.matches('\u{FFFD}').count();
        assert!(
            value.len() <= data.len() + 2 * replaced,
            "decoded {} bytes from {}",
            value.len(),
            data.len()
        );
    }
}

/// Any text as a DNS allow list (`--dns-allow`, `dns_allow:`): no panic; every
/// entry parsed prints back to text that parses to the same entry, there are no
/// more entries than words, a prefix holds its own network address, and an error
/// is one line.
pub fn allow_list(data: &[u8]) {
    use dwara_nameserver::{AllowEntry, Cidr, parse_allow_list};
    let text = String::from_utf8_lossy(data);
    let _ = text.parse::<Cidr>();
    match parse_allow_list(&text) {
        Ok(entries) => {
            let words = text
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|w| !w.is_empty())
                .count();
            assert_eq!(entries.len(), words);
            for e in entries {
                let again: AllowEntry = e.to_string().parse().expect("printed entry parses");
                assert_eq!(again, e);
                if let AllowEntry::Cidr(c) = e {
                    assert!(c.contains(c.addr()), "{c} does not hold its address");
                }
            }
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
}

/// Any bytes as an HTTP token file and as an `Authorization` header value: no
/// panic; an accepted token matches itself, its header carries it back, and a
/// bearer token found in a header is a non-empty word of printable ASCII.
pub fn http_auth(data: &[u8]) {
    use dwara::auth::{Token, bearer};
    if let Ok(token) = Token::parse(data) {
        let trimmed = data.trim_ascii();
        assert!(token.matches(trimmed));
        let header = token.header_value();
        assert_eq!(bearer(header.as_bytes()), Some(trimmed));
        assert!(!token.matches(&trimmed[1..]));
    }
    if let Some(found) = bearer(data) {
        assert!(!found.is_empty() && found.iter().all(u8::is_ascii_graphic));
        if let Ok(token) = Token::parse(found) {
            assert!(token.matches(found));
        }
    }
}
