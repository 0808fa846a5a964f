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
//! | `dns_udp` | bytes as a UDP query | the answer a model of the zone expects |
//! | `dns_tcp` | a byte stream to a live DNS/TCP listener | one answer per frame, in order, as the handler gives it |
//! | `dns_differential` | fast-path queries through the hickory-proto path too | the same response |
//! | `dns_answers` | upstream answers to the DNS discovery source | no endpoint the answers do not justify |
//! | `http_path` | method, path and body to the HTTP API | 2xx/4xx only, the db agrees with the answers |
//! | `cluster_value` | a cluster value and record | decode never panics, encode → decode round-trips |
//! | `cluster_bucket` | a cluster bucket, plain and as a value | decode never panics, items ordered and bounded, encode → decode round-trips at the planned size |
//! | `cluster_datagram` | bytes as a gossip datagram, and as a message to seal | never opens, never panics; sealed parts fit UDP, open once, not when altered or under another key |
//! | `cluster_keyfile` | text as a gossip key file | no panic; 1 to 16 keys that round-trip, in order |
//! | `store_record` | a store key | decode never panics, encode → decode round-trips |
//! | `docker_event` | JSON as a container inspect answer | only names under the domain, only its addresses |
//! | `config_yaml`, `resolv_conf`, `http_form` | text | no panic, bounded results |
//! | `allow_list` | text as a DNS allow list | entries print back to themselves, one per word; errors are one line |
//! | `http_auth` | bytes as a token file and an `Authorization` value | an accepted token matches itself and survives its header |
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
mod records;
mod tcp;

pub use answers::dns_answers;
pub use dns::{dns_differential, dns_udp};
pub use gossip::{cluster_datagram, cluster_keyfile};
pub use http::http_path;
pub use records::{cluster_bucket, cluster_value, docker_event, store_record};
pub use tcp::dns_tcp;

use std::sync::{Mutex, OnceLock};

use dwara_nameserver::{Db, DbConfig, Domain, QueryHandler};
use hickory_proto::op::{Message, MessageType};

/// The zone every DNS check answers from (`weave.local.`, TTL 1): `web` with one v4
/// and one v6 address, `big` with [`BIG_COUNT`] v4 addresses (more than fit in 512
/// bytes), and the reverse entries of all of them.
pub(crate) fn zone_db() -> Db {
    let db = Db::new(DbConfig::new(
        Domain::new("weave.local").expect("static domain"),
    ));
    db.add("c1", WEB_V4.into(), "web.weave.local").unwrap();
    db.add("c2", WEB_V6.into(), "web.weave.local").unwrap();
    for i in 0..BIG_COUNT {
        db.add(&format!("big{i}"), big_addr(i).into(), "big.weave.local")
            .unwrap();
    }
    db
}

/// The v4 address of `web.weave.local`.
pub(crate) const WEB_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 32, 0, 1);
/// The v6 address of `web.weave.local`.
pub(crate) const WEB_V6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
/// How many addresses `big.weave.local` has.
pub(crate) const BIG_COUNT: u8 = 60;

/// The `i`th address of `big.weave.local`.
pub(crate) fn big_addr(i: u8) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(10, 33, 0, i)
}

/// One handler over [`zone_db`] for the whole process.
pub(crate) fn handler() -> &'static Mutex<QueryHandler> {
    /// The database kept beside its handler.
    struct Fixture {
        _db: Db,
        handler: Mutex<QueryHandler>,
    }
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    &FIXTURE
        .get_or_init(|| {
            let db = zone_db();
            let handler = Mutex::new(QueryHandler::new(&db));
            Fixture { _db: db, handler }
        })
        .handler
}

/// Any packet: no panic; every reply is a well-formed DNS response to that query
/// (same ID, QR set) that hickory-proto can decode, and a UDP reply to a query
/// without EDNS fits in 512 bytes.
pub fn dns_packet(data: &[u8]) {
    let mut handler = handler().lock().unwrap_or_else(|e| e.into_inner());
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
/// 1–65535, `_name._tcp|_udp`, lower-case), which parses back to itself; a `check`
/// value gives a check only when it names a known kind and there is a port.
pub fn http_form(data: &[u8]) {
    let port = dwara_nameserver::http::form_value(data, "port");
    let service = dwara_nameserver::http::form_value(data, "service");
    let parsed = dwara_nameserver::http::service_param(port.as_deref(), service.as_deref());
    let check = dwara_nameserver::http::form_value(data, "check");
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
        let again = dwara_nameserver::ServicePort::parse(text, &s.port().to_string());
        assert_eq!(again.as_ref().ok(), Some(&s), "{text}");
    }
    if let Some(value) = dwara_nameserver::http::form_value(data, "fqdn") {
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
