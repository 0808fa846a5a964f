//! SRV records from HTTP registrations with ports, asked with dig: answers, the
//! additional section, NODATA and NXDOMAIN, the JSON views and bad input.

use crate::support::TestServer;

fn put(s: &TestServer, id: &str, ip: &str, form: &str) -> (u16, String) {
    s.http("PUT", &format!("/name/{id}/{ip}"), Some(form))
}

fn services() -> TestServer {
    let s = TestServer::start(Vec::new());
    for (id, ip, form) in [
        (
            "c1",
            "10.32.0.1",
            "fqdn=api.weave.local&port=80&service=_http._tcp",
        ),
        (
            "c2",
            "10.32.0.2",
            "fqdn=api.weave.local&port=80&service=_HTTP._TCP",
        ),
        (
            "c3",
            "fd00::3",
            "fqdn=api.weave.local&port=80&service=_http._tcp",
        ),
        (
            "c4",
            "10.32.0.4",
            "fqdn=api.weave.local&port=5353&service=_dns._udp",
        ),
        ("c5", "10.32.0.5", "fqdn=api.weave.local"),
        ("c6", "10.32.0.6", "fqdn=db.weave.local&port=5432"),
    ] {
        let (status, body) = put(&s, id, ip, form);
        assert_eq!(status, 204, "{id}: {body}");
    }
    s
}

#[test]
fn srv_answers_carry_the_registered_ports() {
    let s = services();
    let a = s.dig().query("_http._tcp.api.weave.local", "SRV").unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert!(a.has_flag("aa"), "{}", a.raw);
    // One SRV record per instance, each targeting a name of its own.
    const T1: &str = "0a200001.addr.weave.local.";
    const T2: &str = "0a200002.addr.weave.local.";
    const T3: &str = "fd000000000000000000000000000003.addr.weave.local.";
    assert_eq!(
        a.data("SRV"),
        [
            format!("0 1 80 {T1}"),
            format!("0 1 80 {T2}"),
            format!("0 1 80 {T3}")
        ],
        "{}",
        a.raw
    );
    // Each target's address is in the additional section.
    let mut extra: Vec<(String, String, String)> = a
        .additional
        .iter()
        .map(|r| (r.name.clone(), r.rtype.clone(), r.data.clone()))
        .collect();
    extra.sort();
    let want = |n: &str, t: &str, ip: &str| (n.to_owned(), t.to_owned(), ip.to_owned());
    assert_eq!(
        extra,
        [
            want(T1, "A", "10.32.0.1"),
            want(T2, "A", "10.32.0.2"),
            want(T3, "AAAA", "fd00::3")
        ],
        "{}",
        a.raw
    );
    // Over TCP the same; the owner echoes the query's case.
    let t = s
        .dig()
        .query_with("_HTTP._tcp.API.weave.local", "SRV", &["+tcp"])
        .unwrap();
    assert_eq!(t.data("SRV"), a.data("SRV"), "{}", t.raw);
    assert_eq!(t.answers[0].name, "_HTTP._tcp.API.weave.local.");
    // Another service of the same name, and a port alone (`_<port>._tcp`).
    let d = s.dig().query("_dns._udp.api.weave.local", "SRV").unwrap();
    assert_eq!(
        d.data("SRV"),
        ["0 1 5353 0a200004.addr.weave.local."],
        "{}",
        d.raw
    );
    let p = s.dig().query("_5432._tcp.db.weave.local", "SRV").unwrap();
    assert_eq!(
        p.data("SRV"),
        ["0 1 5432 0a200006.addr.weave.local."],
        "{}",
        p.raw
    );
    // Each target resolves to its own address, and only of its family.
    for (target, rtype, ip) in [(T1, "A", "10.32.0.1"), (T3, "AAAA", "fd00::3")] {
        let r = s.dig().query(target, rtype).unwrap();
        assert_eq!(r.data(rtype), [ip], "{}", r.raw);
        assert!(r.has_flag("aa"), "{}", r.raw);
    }
    let r = s.dig().query(T1, "AAAA").unwrap();
    assert_eq!(
        (r.status.as_str(), r.answers.len()),
        ("NOERROR", 0),
        "{}",
        r.raw
    );
    // The name itself still resolves to every address.
    assert_eq!(
        s.dig()
            .query("api.weave.local", "A")
            .unwrap()
            .data("A")
            .len(),
        4
    );
}

#[test]
fn srv_names_have_nodata_and_nxdomain_right() {
    let s = services();
    let check = |name: &str, rtype: &str, status: &str| {
        let a = s.dig().query(name, rtype).unwrap();
        assert_eq!(a.status, status, "{name} {rtype}: {}", a.raw);
        assert!(a.answers.is_empty(), "{name} {rtype}: {}", a.raw);
        assert!(a.has_flag("aa"), "{}", a.raw);
        assert_eq!(a.authority.len(), 1, "SOA in authority: {}", a.raw);
        assert_eq!(a.authority[0].rtype, "SOA");
    };
    // The service name exists: other types are NODATA.
    check("_http._tcp.api.weave.local", "A", "NOERROR");
    check("_http._tcp.api.weave.local", "TXT", "NOERROR");
    // `_tcp.api` is an empty non-terminal: NODATA.
    check("_tcp.api.weave.local", "SRV", "NOERROR");
    check("_udp.api.weave.local", "SRV", "NOERROR");
    // The name exists but has no SRV of its own: NODATA.
    check("api.weave.local", "SRV", "NOERROR");
    // No such service, protocol or name: NXDOMAIN.
    check("_ftp._tcp.api.weave.local", "SRV", "NXDOMAIN");
    check("_http._udp.api.weave.local", "SRV", "NXDOMAIN");
    check("_dns._udp.db.weave.local", "SRV", "NXDOMAIN");
    check("_http._tcp.nope.weave.local", "SRV", "NXDOMAIN");
    // Targets of addresses nobody serves do not exist; `addr` itself is empty.
    check("0a2000ff.addr.weave.local", "A", "NXDOMAIN");
    check("addr.weave.local", "A", "NOERROR");
    // Reverse lookups are unchanged: the registered name.
    let r = s.dig().reverse("10.32.0.1").unwrap();
    assert_eq!(r.data("PTR"), ["api.weave.local."], "{}", r.raw);
    // Deleting the last entry with a service removes its name.
    assert_eq!(s.http("DELETE", "/name/c4", None).0, 204);
    check("_dns._udp.api.weave.local", "SRV", "NXDOMAIN");
    check("_udp.api.weave.local", "SRV", "NXDOMAIN");
}

#[test]
fn http_shows_ports_and_rejects_bad_ones() {
    let s = services();
    // GET /name/<service>.<fqdn>: the endpoints.
    let (status, body) = s.http("GET", "/name/_http._tcp.api.weave.local", None);
    assert_eq!(status, 200);
    let mut eps: Vec<String> = serde_json::from_str(&body).unwrap();
    eps.sort();
    assert_eq!(eps, ["10.32.0.1:80", "10.32.0.2:80", "[fd00::3]:80"]);
    // GET /name/<fqdn> is still the array of addresses.
    let (_, body) = s.http("GET", "/name/db.weave.local", None);
    assert_eq!(body.trim(), r#"["10.32.0.6"]"#);
    // GET /name: service and port beside the other fields, only when set.
    let (_, body) = s.http("GET", "/name", None);
    let all: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let c1 = all.iter().find(|e| e["id"] == "c1").unwrap();
    assert_eq!(
        (c1["service"].as_str(), c1["port"].as_u64()),
        (Some("_http._tcp"), Some(80))
    );
    let c5 = all.iter().find(|e| e["id"] == "c5").unwrap();
    assert!(
        c5.get("port").is_none() && c5.get("service").is_none(),
        "{c5}"
    );
    // A new PUT replaces the port.
    assert_eq!(
        put(
            &s,
            "c1",
            "10.32.0.1",
            "fqdn=api.weave.local&port=8080&service=_http._tcp"
        )
        .0,
        204
    );
    let a = s.dig().query("_http._tcp.api.weave.local", "SRV").unwrap();
    assert_eq!(
        a.data("SRV"),
        [
            "0 1 80 0a200002.addr.weave.local.",
            "0 1 80 fd000000000000000000000000000003.addr.weave.local.",
            "0 1 8080 0a200001.addr.weave.local."
        ]
    );
    // Bad input: 400 naming the problem; nothing changes.
    for (form, needle) in [
        ("fqdn=addr.weave.local", "reserved"),
        ("fqdn=0a200001.ADDR.weave.local&port=80", "reserved"),
        ("fqdn=x.weave.local&port=0", "invalid port"),
        ("fqdn=x.weave.local&port=65536", "invalid port"),
        ("fqdn=x.weave.local&port=http", "invalid port"),
        ("fqdn=x.weave.local&port=80&service=http", "invalid service"),
        (
            "fqdn=x.weave.local&port=80&service=_http._sctp",
            "_tcp or _udp",
        ),
        (
            "fqdn=x.weave.local&port=80&service=_http._tcp.x",
            "_tcp or _udp",
        ),
        (
            "fqdn=x.weave.local&port=80&service=_a_b._tcp",
            "letters, digits and hyphens",
        ),
        (
            "fqdn=x.weave.local&port=80&service=_sixteen-letters1._tcp",
            "1 to 15",
        ),
        ("fqdn=x.weave.local&service=_http._tcp", "without a port"),
    ] {
        let (status, body) = put(&s, "bad", "10.9.9.9", form);
        assert_eq!(status, 400, "{form}: {body}");
        assert!(body.contains(needle), "{form}: {body}");
    }
    assert_eq!(s.http("GET", "/name/x.weave.local", None).0, 404);
}

#[test]
fn priority_and_weight_are_answered_listed_and_checked() {
    let s = services();
    // Two more instances of api's `_http._tcp`: a canary at weight 0 and a
    // fallback at priority 10, weight 65535.
    for (id, ip, extra) in [
        ("c7", "10.32.0.7", "&weight=0"),
        ("c8", "10.32.0.8", "&priority=10&weight=65535"),
    ] {
        let form = format!("fqdn=api.weave.local&port=81&service=_http._tcp{extra}");
        let (status, body) = put(&s, id, ip, &form);
        assert_eq!(status, 204, "{id}: {body}");
    }
    // The default instances still answer 0 1; the others their own.
    let a = s.dig().query("_http._tcp.api.weave.local", "SRV").unwrap();
    assert_eq!(
        a.data("SRV"),
        [
            "0 0 81 0a200007.addr.weave.local.",
            "0 1 80 0a200001.addr.weave.local.",
            "0 1 80 0a200002.addr.weave.local.",
            "0 1 80 fd000000000000000000000000000003.addr.weave.local.",
            "10 65535 81 0a200008.addr.weave.local.",
        ],
        "{}",
        a.raw
    );
    // GET /name lists priority and weight beside the port, defaults included.
    let (_, body) = s.http("GET", "/name?fqdn=api.weave.local", None);
    let all: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let rank = |id: &str| {
        let e = all.iter().find(|e| e["id"] == id).unwrap();
        (
            e["port"].as_u64(),
            e["priority"].as_u64(),
            e["weight"].as_u64(),
        )
    };
    assert_eq!(rank("c1"), (Some(80), Some(0), Some(1)), "{body}");
    assert_eq!(rank("c7"), (Some(81), Some(0), Some(0)), "{body}");
    assert_eq!(rank("c8"), (Some(81), Some(10), Some(65535)), "{body}");
    let c5 = all.iter().find(|e| e["id"] == "c5").unwrap();
    assert!(
        c5.get("weight").is_none() && c5.get("priority").is_none(),
        "{c5}"
    );
    // A new PUT without them puts the defaults back.
    let form = "fqdn=api.weave.local&port=81&service=_http._tcp";
    assert_eq!(put(&s, "c8", "10.32.0.8", form).0, 204);
    let a = s.dig().query("_http._tcp.api.weave.local", "SRV").unwrap();
    assert!(
        a.data("SRV")
            .contains(&"0 1 81 0a200008.addr.weave.local.".to_owned()),
        "{}",
        a.raw
    );
    // Bad values: 400 naming the parameter and the value; nothing changes.
    for (form, needle) in [
        ("port=80&weight=65536", "invalid weight \"65536\""),
        ("port=80&weight=-1", "invalid weight \"-1\""),
        ("port=80&weight=heavy", "invalid weight \"heavy\""),
        ("port=80&priority=65536", "invalid priority \"65536\""),
        ("port=80&priority=1e3", "invalid priority \"1e3\""),
        ("weight=9", "weight \"9\" given without a port"),
        ("priority=1", "priority \"1\" given without a port"),
        ("priority=1&weight=9", "priority \"1\" given without a port"),
    ] {
        let form = format!("fqdn=x.weave.local&{form}");
        let (status, body) = put(&s, "bad", "10.9.9.9", &form);
        assert_eq!(status, 400, "{form}: {body}");
        assert!(body.contains(needle), "{form}: {body}");
    }
    assert_eq!(s.http("GET", "/name/x.weave.local", None).0, 404);
}
