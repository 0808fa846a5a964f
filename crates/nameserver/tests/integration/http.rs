//! Every row of the HTTP table, bad input, and concurrent registrations.

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};

use crate::support::TestServer;

fn entries(s: &TestServer) -> Vec<serde_json::Value> {
    listing(s, "/name")
}

fn listing(s: &TestServer, path: &str) -> Vec<serde_json::Value> {
    let (status, body) = s.http("GET", path, None);
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

#[test]
fn every_row_of_the_api() {
    let s = TestServer::start(Vec::new());
    // PUT: 204, and the name resolves.
    assert_eq!(
        s.http("PUT", "/name/c1/10.32.0.1", Some("fqdn=web.weave.local"))
            .0,
        204
    );
    assert_eq!(
        s.http("PUT", "/name/c2/10.32.0.2", Some("fqdn=web.weave.local."))
            .0,
        204
    );
    assert_eq!(
        s.http("PUT", "/name/c2/fd00::2", Some("fqdn=web.weave.local"))
            .0,
        204
    );
    // fqdn in the query string works too.
    assert_eq!(
        s.http("PUT", "/name/c3/10.32.0.3?fqdn=db.weave.local", None)
            .0,
        204
    );
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().data("A"),
        ["10.32.0.1", "10.32.0.2"]
    );

    // GET /name/<fqdn>: JSON array of IPs; 404 when none.
    let (status, body) = s.http("GET", "/name/web.weave.local", None);
    assert_eq!(status, 200);
    let mut ips: Vec<String> = serde_json::from_str(&body).unwrap();
    ips.sort();
    assert_eq!(ips, ["10.32.0.1", "10.32.0.2", "fd00::2"]);
    assert_eq!(s.http("GET", "/name/nope.weave.local", None).0, 404);

    // GET /name: every entry with id, ip, fqdn, origin, version, tombstone.
    let all = entries(&s);
    assert_eq!(all.len(), 4);
    let e = all.iter().find(|e| e["id"] == "c1").unwrap();
    assert_eq!(e["ip"], "10.32.0.1");
    assert_eq!(e["fqdn"], "web.weave.local.");
    assert_eq!(e["origin"], "local");
    assert_eq!(e["version"], 1);
    assert_eq!(e["tombstone"], false);

    // DELETE /name/<id>/<ip>: tombstone; 204 also when nothing matched.
    assert_eq!(s.http("DELETE", "/name/c1/10.32.0.1", None).0, 204);
    assert_eq!(s.http("DELETE", "/name/c1/10.32.0.1", None).0, 204);
    assert_eq!(listing(&s, "/name?tombstones=true").len(), 4);
    assert_eq!(s.http("DELETE", "/name/nobody/10.9.9.9", None).0, 204);
    // GET /name lists live entries only; ?tombstones=true adds the tombstones.
    assert!(!entries(&s).iter().any(|e| e["id"] == "c1"));
    let e = listing(&s, "/name?tombstones=true")
        .into_iter()
        .find(|e| e["id"] == "c1")
        .unwrap();
    assert_eq!(
        (e["tombstone"].as_bool(), e["version"].as_u64()),
        (Some(true), Some(2))
    );
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().data("A"),
        ["10.32.0.2"]
    );
    // With an fqdn (body or query) only that name goes.
    s.put("c5", "10.32.0.5", "a.weave.local");
    s.put("c5", "10.32.0.5", "b.weave.local");
    assert_eq!(
        s.http("DELETE", "/name/c5/10.32.0.5", Some("fqdn=a.weave.local"))
            .0,
        204
    );
    assert_eq!(s.http("GET", "/name/a.weave.local", None).0, 404);
    assert_eq!(s.http("GET", "/name/b.weave.local", None).0, 200);
    assert_eq!(
        s.http("DELETE", "/name/c5/10.32.0.5?fqdn=b.weave.local", None)
            .0,
        204
    );
    assert_eq!(s.http("GET", "/name/b.weave.local", None).0, 404);

    // DELETE /name/<id>: every record of the id.
    assert_eq!(s.http("DELETE", "/name/c2", None).0, 204);
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().status,
        "NXDOMAIN"
    );
    assert_eq!(
        s.dig().reverse("10.32.0.2").unwrap().status,
        "SERVFAIL",
        "forwarded, no fallback"
    );

    // GET /domain, GET /metrics.
    assert_eq!(
        s.http("GET", "/domain", None),
        (200, "weave.local.\n".to_owned())
    );
    let (status, m) = s.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(m.contains("# TYPE dwara_dns_queries_total counter"), "{m}");
    assert!(m.contains("dwara_records_entries 1"), "{m}");
    assert!(
        m.contains("dwara_http_requests_total{status=\"404\"}"),
        "{m}"
    );
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let s = TestServer::start(Vec::new());
    s.put("c1", "10.32.0.1", "web.weave.local");
    let before = entries(&s);
    for (method, path, body, needle) in [
        (
            "PUT",
            "/name/c1/10.32.0.999",
            Some("fqdn=web.weave.local"),
            "invalid IP",
        ),
        (
            "PUT",
            "/name/c1/not-an-ip",
            Some("fqdn=web.weave.local"),
            "invalid IP",
        ),
        ("PUT", "/name/c1/10.32.0.9", None, "missing fqdn"),
        ("PUT", "/name/c1/10.32.0.9", Some("fqdn="), "missing fqdn"),
        ("PUT", "/name/c1/10.32.0.9", Some("other=1"), "missing fqdn"),
        (
            "PUT",
            "/name/c1/10.32.0.9",
            Some("fqdn=web.example.com"),
            "not inside the domain",
        ),
        (
            "PUT",
            "/name/c1/10.32.0.9",
            Some("fqdn=weave.local"),
            "not inside the domain",
        ),
        (
            "PUT",
            "/name/c1/10.32.0.9",
            Some("fqdn=a..weave.local"),
            "invalid domain name",
        ),
        (
            "PUT",
            "/name/c1/10.32.0.9",
            Some("fqdn=%ff%fe.weave.local"),
            "",
        ),
        ("DELETE", "/name/c1/bogus", None, "invalid IP"),
    ] {
        let (status, msg) = s.http(method, path, body);
        assert_eq!(status, 400, "{method} {path} {body:?}: {msg}");
        assert!(msg.contains(needle), "{method} {path} {body:?}: {msg}");
    }
    let long = format!("fqdn={}.weave.local", "x".repeat(300));
    assert_eq!(s.http("PUT", "/name/c1/10.32.0.9", Some(&long)).0, 400);
    // Unknown paths and methods.
    assert_eq!(s.http("GET", "/nope", None).0, 404);
    assert_eq!(
        s.http("POST", "/name/c1/10.32.0.9", Some("fqdn=x.weave.local"))
            .0,
        405
    );
    assert_eq!(entries(&s), before);
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().data("A"),
        ["10.32.0.1"]
    );
}

#[test]
fn five_hundred_concurrent_registrations_all_resolve() {
    let s = TestServer::start(Vec::new());
    let http = s.http;
    let threads: Vec<_> = (0..500)
        .map(|i| {
            std::thread::spawn(move || {
                let (status, body) = test_support::http::request(
                    http,
                    "PUT",
                    &format!("/name/c{i}/10.40.{}.{}", i / 256, i % 256),
                    Some(&format!("fqdn=n{i}.weave.local")),
                );
                assert_eq!(status, 204, "registration {i}: {body}");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(entries(&s).len(), 500);
    // Every name answers its address (hickory-proto client over raw UDP)…
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 512];
    for i in 0..500u16 {
        let mut m = Message::new(i, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(
            Name::from_ascii(format!("n{i}.weave.local.")).unwrap(),
            RecordType::A,
        ));
        sock.send_to(&m.to_vec().unwrap(), s.dns).unwrap();
        let n = sock.recv(&mut buf).unwrap();
        let r = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(r.metadata.id, i);
        let want: IpAddr = format!("10.40.{}.{}", i / 256, i % 256).parse().unwrap();
        let got: Vec<IpAddr> = r
            .answers
            .iter()
            .filter_map(|a| match &a.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect();
        assert_eq!(got, vec![want], "n{i}");
    }
    // …and dig agrees on a few.
    for i in [0, 255, 256, 499] {
        let a = s.dig().query(&format!("n{i}.weave.local"), "A").unwrap();
        assert_eq!(a.data("A"), [format!("10.40.{}.{}", i / 256, i % 256)]);
    }
}

#[test]
fn tombstones_are_forgotten_after_the_grace() {
    let s = TestServer::start_with(|c| {
        c.fallback = dwara_nameserver::Fallback::Servers(Vec::new());
        c.tombstone_grace = GRACE;
    });
    const GRACE: Duration = Duration::from_secs(3);
    let first_delete = Instant::now();
    for i in 0..50 {
        s.put(&format!("c{i}"), "10.32.1.1", &format!("n{i}.weave.local"));
        assert_eq!(s.http("DELETE", &format!("/name/c{i}"), None).0, 204);
    }
    let listed = listing(&s, "/name?tombstones=true").len();
    // On a machine so loaded that the 100 requests took longer than the grace, the
    // first tombstones may already be gone; all 50 are listed otherwise.
    if first_delete.elapsed() < GRACE {
        assert_eq!(listed, 50);
    } else {
        assert!((1..=50).contains(&listed), "{listed} tombstones listed");
    }
    // Collected between one and two checks (1 s each) after the grace.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listing(&s, "/name?tombstones=true").is_empty() {
        assert!(Instant::now() < deadline, "tombstones still listed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(s.db().entries().is_empty());
}

#[test]
fn deletes_touch_only_own_entries_and_name_the_owners_otherwise() {
    let s = TestServer::start(Vec::new());
    let theirs = dwara_nameserver::Entry {
        id: "c9".into(),
        ip: "10.32.9.9".parse().unwrap(),
        fqdn: "peer.weave.local.".into(),
        origin: "peer-b".into(),
        version: 1,
        tombstone: false,
        service: None,
        health: Default::default(),
    };
    s.db().apply(theirs.clone()).unwrap();
    s.db()
        .apply(dwara_nameserver::Entry {
            origin: "peer-a".into(),
            ..theirs.clone()
        })
        .unwrap();
    for path in ["/name/c9", "/name/c9/10.32.9.9"] {
        let (status, body) = s.http("DELETE", path, None);
        assert_eq!(status, 409, "{path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["owners"],
            serde_json::json!(["peer-a", "peer-b"]),
            "{body}"
        );
    }
    assert_eq!(s.db().lookup("peer.weave.local"), [theirs.ip]);
    // Another address of the same id matches nothing anywhere: 204.
    assert_eq!(s.http("DELETE", "/name/c9/10.32.9.8", None).0, 204);
    // Once this node owns one too, the delete removes only its own.
    s.put("c9", "10.32.9.9", "peer.weave.local");
    assert_eq!(s.http("DELETE", "/name/c9", None).0, 204);
    let mut live: Vec<String> = listing(&s, "/name")
        .iter()
        .map(|e| e["origin"].as_str().unwrap().to_owned())
        .collect();
    live.sort();
    assert_eq!(live, ["peer-a", "peer-b"]);
}
