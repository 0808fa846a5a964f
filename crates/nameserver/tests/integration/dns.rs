//! Every row of the DNS table, asked with dig (and raw sockets for garbage).

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::time::Duration;

use crate::support::{TestServer, fallback_dnsmasq};

fn web_server() -> (TestServer, test_support::dnsmasq::Dnsmasq) {
    let fallback = fallback_dnsmasq();
    let s = TestServer::start(vec![fallback.addr()]);
    s.put("c1", "10.32.0.1", "web.weave.local");
    s.put("c2", "10.32.0.2", "web.weave.local");
    s.put("c3", "10.32.0.3", "Web.Weave.Local.");
    s.put("c4", "fd00::4", "six.weave.local");
    s.put("c4", "fd00::5", "six.weave.local");
    (s, fallback)
}

#[test]
fn a_and_aaaa_answer_every_address_with_the_querys_case() {
    let (s, _f) = web_server();
    let a = s.dig().query("wEb.WEAVE.local", "A").unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert!(a.has_flag("aa"), "{}", a.raw);
    assert_eq!(
        a.data("A"),
        ["10.32.0.1", "10.32.0.2", "10.32.0.3"],
        "{}",
        a.raw
    );
    for r in &a.answers {
        assert_eq!(r.name, "wEb.WEAVE.local.");
        assert_eq!(r.ttl, 1);
    }
    let aaaa = s.dig().query("six.weave.local", "AAAA").unwrap();
    assert_eq!(aaaa.status, "NOERROR");
    assert!(aaaa.has_flag("aa"));
    assert_eq!(aaaa.data("AAAA"), ["fd00::4", "fd00::5"]);
    // TCP answers the same.
    let tcp = s
        .dig()
        .query_with("web.weave.local", "A", &["+tcp"])
        .unwrap();
    assert_eq!(tcp.data("A").len(), 3);
    // EDNS options (a DNS cookie, as dig sends by default) do not get in the way.
    let cookie = s
        .dig()
        .query_with("web.weave.local", "A", &["+cookie", "+bufsize=1232"])
        .unwrap();
    assert_eq!(cookie.data("A").len(), 3, "{}", cookie.raw);
    assert!(cookie.edns, "OPT echoed: {}", cookie.raw);
}

#[test]
fn addresses_are_shuffled() {
    let (s, _f) = web_server();
    let mut orders = HashSet::new();
    for _ in 0..30 {
        let a = s.dig().query("web.weave.local", "A").unwrap();
        orders.insert(a.answers.iter().map(|r| r.data.clone()).collect::<Vec<_>>());
        if orders.len() >= 3 {
            break;
        }
    }
    assert!(orders.len() >= 3, "only saw {orders:?}");
}

#[test]
fn other_types_on_existing_names_are_nodata_with_soa() {
    let (s, _f) = web_server();
    for (name, rtype) in [
        ("web.weave.local", "MX"),
        ("web.weave.local", "TXT"),
        ("web.weave.local", "ANY"),
        ("web.weave.local", "AAAA"),
        ("six.weave.local", "A"),
    ] {
        let a = s.dig().query(name, rtype).unwrap();
        assert_eq!(a.status, "NOERROR", "{name} {rtype}: {}", a.raw);
        assert!(a.has_flag("aa"), "{}", a.raw);
        assert!(a.answers.is_empty(), "{}", a.raw);
        assert_eq!(a.authority.len(), 1, "{}", a.raw);
        assert_eq!(a.authority[0].rtype, "SOA");
        assert_eq!(a.authority[0].name, "weave.local.");
    }
}

#[test]
fn unknown_local_names_are_nxdomain_and_never_forwarded() {
    let (s, _f) = web_server();
    // The fallback knows trap.weave.local: a forwarded query would get its address.
    for rtype in ["A", "AAAA", "TXT"] {
        let a = s.dig().query("trap.weave.local", rtype).unwrap();
        assert_eq!(a.status, "NXDOMAIN", "{}", a.raw);
        assert!(a.has_flag("aa"));
        assert!(a.answers.is_empty());
        assert_eq!(a.authority[0].rtype, "SOA");
    }
    let a = s.dig().query("deep.web.weave.local", "A").unwrap();
    assert_eq!(a.status, "NXDOMAIN", "{}", a.raw);
}

#[test]
fn ptr_of_registered_addresses() {
    let (s, _f) = web_server();
    s.put("c9", "10.32.0.1", "alias.weave.local");
    let a = s.dig().reverse("10.32.0.1").unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert!(a.has_flag("aa"));
    assert_eq!(a.data("PTR"), ["alias.weave.local.", "web.weave.local."]);
    // Any case.
    let a = s.dig().query("2.0.32.10.IN-ADDR.ARPA", "PTR").unwrap();
    assert_eq!(a.data("PTR"), ["web.weave.local."], "{}", a.raw);
    let a = s.dig().reverse("fd00::4").unwrap();
    assert_eq!(a.data("PTR"), ["six.weave.local."], "{}", a.raw);
}

#[test]
fn ptr_of_unknown_addresses_is_forwarded() {
    let (s, _f) = web_server();
    let a = s.dig().reverse("127.0.0.99").unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert_eq!(a.data("PTR"), ["fallback-host.example."]);
}

#[test]
fn truncation_with_fifty_addresses() {
    let (s, _f) = web_server();
    for i in 0..50 {
        s.db()
            .add(
                &format!("big{i}"),
                format!("10.33.0.{i}").parse().unwrap(),
                "big.weave.local",
            )
            .unwrap();
        s.db()
            .add(
                &format!("big{i}"),
                format!("fd00::33:{i:x}").parse().unwrap(),
                "big.weave.local",
            )
            .unwrap();
    }
    // Plain UDP: 512 bytes, TC set, as many as fit.
    let a = s
        .dig()
        .query_with("big.weave.local", "A", &["+noedns", "+ignore"])
        .unwrap();
    assert!(a.has_flag("tc"), "{}", a.raw);
    assert!(!a.answers.is_empty() && a.answers.len() < 50, "{}", a.raw);
    // EDNS 4096: everything fits.
    let a = s
        .dig()
        .query_with("big.weave.local", "A", &["+bufsize=4096", "+ignore"])
        .unwrap();
    assert!(!a.has_flag("tc"), "{}", a.raw);
    assert_eq!(a.answers.len(), 50);
    // AAAA with EDNS 1232 does not fit (50 × 28 bytes)…
    let a = s
        .dig()
        .query_with("big.weave.local", "AAAA", &["+bufsize=1232", "+ignore"])
        .unwrap();
    assert!(a.has_flag("tc"), "{}", a.raw);
    assert!(a.answers.len() < 50);
    // …but TCP is never truncated.
    for rtype in ["A", "AAAA"] {
        let a = s
            .dig()
            .query_with("big.weave.local", rtype, &["+tcp", "+noedns"])
            .unwrap();
        assert!(!a.has_flag("tc"), "{}", a.raw);
        assert_eq!(a.answers.len(), 50, "{}", a.raw);
    }
}

fn raw_udp(s: &TestServer, packet: &[u8]) -> Option<Vec<u8>> {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    sock.send_to(packet, s.dns).unwrap();
    let mut buf = [0u8; 4096];
    sock.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

#[test]
fn garbage_and_oversized_packets_do_not_stop_answers() {
    let (s, _f) = web_server();
    // Too short for a header: no answer.
    assert_eq!(raw_udp(&s, &[1, 2, 3]), None);
    // A header then garbage: FORMERR with the same ID.
    let r = raw_udp(
        &s,
        &[0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0x01],
    )
    .unwrap();
    assert_eq!(&r[..2], &[0xab, 0xcd]);
    assert_eq!(r[3] & 0x0f, 1, "FORMERR");
    // Two questions: FORMERR.
    let mut two = vec![0, 7, 1, 0, 0, 2, 0, 0, 0, 0, 0, 0];
    for _ in 0..2 {
        two.extend_from_slice(b"\x03web\x05weave\x05local\x00\x00\x01\x00\x01");
    }
    let r = raw_udp(&s, &two).unwrap();
    assert_eq!(r[3] & 0x0f, 1, "FORMERR for two questions");
    // Oversized datagrams and random bytes.
    let mut junk = vec![0u8; 60_000];
    for (i, b) in junk.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(&junk, s.dns).unwrap();
    for len in [12, 13, 50, 511, 512, 513, 4096, 9000] {
        sock.send_to(&junk[..len], s.dns).unwrap();
    }
    // TCP: garbage in a frame, then a frame longer than what follows, then close.
    let mut t = TcpStream::connect(s.dns).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    t.write_all(&[0, 14, 0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xfe])
        .unwrap();
    let mut hdr = [0u8; 2];
    t.read_exact(&mut hdr).unwrap();
    let mut r = vec![0u8; usize::from(u16::from_be_bytes(hdr))];
    t.read_exact(&mut r).unwrap();
    assert_eq!(r[3] & 0x0f, 1, "FORMERR over TCP");
    t.write_all(&[0xff, 0xff, 1, 2, 3]).unwrap();
    drop(t);
    let mut t = TcpStream::connect(s.dns).unwrap();
    t.write_all(&junk[..20_000]).unwrap();
    drop(t);
    // Still answering, both transports.
    let a = s.dig().query("web.weave.local", "A").unwrap();
    assert_eq!(a.data("A").len(), 3, "{}", a.raw);
    let a = s
        .dig()
        .query_with("web.weave.local", "A", &["+tcp"])
        .unwrap();
    assert_eq!(a.data("A").len(), 3, "{}", a.raw);
    let metrics = s.http("GET", "/metrics", None).1;
    assert!(metrics.contains("rcode=\"FORMERR\""), "{metrics}");
}

#[test]
fn metrics_count_queries_by_type_and_rcode() {
    let (s, _f) = web_server();
    s.dig().query("web.weave.local", "A").unwrap();
    s.dig().query("nope.weave.local", "AAAA").unwrap();
    s.dig().query("fallback-host.example", "A").unwrap();
    let (status, m) = s.http("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        m.contains("dwara_dns_queries_total{qtype=\"A\",rcode=\"NOERROR\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("dwara_dns_queries_total{qtype=\"AAAA\",rcode=\"NXDOMAIN\"} 1"),
        "{m}"
    );
    assert!(m.contains("dwara_dns_forwarded_total 1"), "{m}");
    assert!(m.contains("dwara_records_entries 5"), "{m}");
    assert!(
        m.contains("dwara_http_requests_total{status=\"204\"} 5"),
        "{m}"
    );
}

#[test]
fn a_dropped_server_stops_answering() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut config = dwara_nameserver::NameServerConfig::new(
        dwara_nameserver::Domain::new("weave.local").unwrap(),
    );
    config.dns.listen = "127.0.0.1:0".parse().unwrap();
    config.fallback = dwara_nameserver::Fallback::Servers(Vec::new());
    let server = rt
        .block_on(dwara_nameserver::NameServer::start(config))
        .unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(server.dns_addr()).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let query = b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01x\x05weave\x05local\x00\x00\x01\x00\x01";
    let mut buf = [0u8; 512];
    sock.send(query).unwrap();
    assert!(sock.recv(&mut buf).is_ok(), "answers while running");
    drop(server);
    // The workers notice within their poll interval and close the socket: the port
    // then refuses (ICMP port unreachable on the connected socket).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let _ = sock.send(query);
        match sock.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ => assert!(
                std::time::Instant::now() < deadline,
                "still answering after drop"
            ),
        }
    }
}
