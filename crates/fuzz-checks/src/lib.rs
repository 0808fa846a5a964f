//! The checks behind dwara's fuzz targets.
//!
//! Each function takes arbitrary bytes, feeds them to one parser we own and panics
//! only when an invariant breaks (a panic inside the parser is a finding too). The
//! cargo-fuzz targets in `fuzz/` are one-line calls into these functions, and
//! `tests/regressions.rs` replays every committed input of `fuzz/regressions/<target>/`
//! through the same functions on every `cargo test`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![allow(clippy::expect_used, clippy::unwrap_used)] // Panicking is how a check reports.

use std::sync::{Mutex, OnceLock};

use dwara_nameserver::{Db, DbConfig, Domain, QueryHandler};
use hickory_proto::op::{Message, MessageType};

/// The database the DNS checks answer from: v4 and v6 names, one name with enough
/// addresses to need truncation, reverse entries.
fn handler() -> &'static Mutex<QueryHandler> {
    /// One database for the whole process, kept beside its handler.
    struct Fixture {
        _db: Db,
        handler: Mutex<QueryHandler>,
    }
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    &FIXTURE
        .get_or_init(|| {
            let db = Db::new(DbConfig::new(
                Domain::new("weave.local").expect("static domain"),
            ));
            db.add("c1", "10.32.0.1".parse().unwrap(), "web.weave.local")
                .unwrap();
            db.add("c2", "fd00::1".parse().unwrap(), "web.weave.local")
                .unwrap();
            for i in 0..60u8 {
                db.add(
                    &format!("big{i}"),
                    format!("10.33.0.{i}").parse().unwrap(),
                    "big.weave.local",
                )
                .unwrap();
            }
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
pub fn http_form(data: &[u8]) {
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
