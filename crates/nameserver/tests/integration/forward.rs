//! Forwarding to fallback servers: order, failover, pass-through, SERVFAIL, resolv.conf.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dwara_nameserver::Fallback;
use test_support::dnsmasq::{Dnsmasq, DnsmasqOptions};

use crate::support::{TestServer, fallback_dnsmasq};

/// A loopback port nobody listens on (UDP sends there get ICMP port unreachable).
fn dead_addr() -> SocketAddr {
    test_support::free_addr()
}

#[test]
fn other_names_are_forwarded_and_answers_pass_through() {
    let f = fallback_dnsmasq();
    let s = TestServer::start(vec![f.addr()]);
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert_eq!(a.data("A"), ["127.0.0.99"]);
    // Unchanged but for the ID: same flags, records and TTLs as asking dnsmasq directly.
    let direct = test_support::dig::Dig::new(f.addr())
        .query("fallback-host.example", "A")
        .unwrap();
    assert_eq!(a.flags, direct.flags, "{}", a.raw);
    assert_eq!(a.answers, direct.answers, "{}", a.raw);
    assert_eq!(a.answers[0].ttl, 30);
    // Upstream NXDOMAIN passes back.
    let a = s.dig().query("x.nx.example", "A").unwrap();
    assert_eq!(a.status, "NXDOMAIN", "{}", a.raw);
    // Over TCP the query is forwarded over TCP.
    let a = s
        .dig()
        .query_with("fallback-host.example", "A", &["+tcp"])
        .unwrap();
    assert_eq!(a.data("A"), ["127.0.0.99"], "{}", a.raw);
    // Upstream refusal (dnsmasq has no upstream for this name) passes back too.
    let a = s.dig().query("unknown.example", "A").unwrap();
    assert_eq!(a.status, "REFUSED", "{}", a.raw);
}

/// A UDP server that answers every query with `rcode` (and nothing else).
fn rcode_server(rcode: u8) -> SocketAddr {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok((n, src)) = sock.recv_from(&mut buf) {
            if n < 12 {
                continue;
            }
            buf[2] |= 0x80;
            buf[3] = (buf[3] & 0xf0) | rcode;
            let _ = sock.send_to(&buf[..n], src);
        }
    });
    addr
}

#[test]
fn upstream_servfail_is_passed_back_not_failed_over() {
    let after = fallback_dnsmasq();
    let s = TestServer::start(vec![rcode_server(2), after.addr()]);
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.status, "SERVFAIL", "an answer is an answer: {}", a.raw);
    let m = s.http("GET", "/metrics", None).1;
    assert!(m.contains("dwara_dns_forward_failures_total 0"), "{m}");
}

#[test]
fn next_server_on_transport_error_in_order() {
    let first = fallback_dnsmasq();
    let second = Dnsmasq::start(DnsmasqOptions {
        hosts: "127.0.0.77 fallback-host.example\n".to_owned(),
        ..Default::default()
    })
    .unwrap();
    let s = TestServer::start(vec![dead_addr(), first.addr(), second.addr()]);
    // The dead one fails, the first live one answers.
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.data("A"), ["127.0.0.99"], "{}", a.raw);
    let a = s
        .dig()
        .query_with("fallback-host.example", "A", &["+tcp"])
        .unwrap();
    assert_eq!(a.data("A"), ["127.0.0.99"], "{}", a.raw);
    drop(first);
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.data("A"), ["127.0.0.77"], "{}", a.raw);
}

#[test]
fn servfail_quickly_when_all_servers_are_down_or_none_configured() {
    let s = TestServer::start(vec![dead_addr(), dead_addr()]);
    let started = Instant::now();
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.status, "SERVFAIL", "{}", a.raw);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let a = s
        .dig()
        .query_with("fallback-host.example", "A", &["+tcp"])
        .unwrap();
    assert_eq!(a.status, "SERVFAIL", "{}", a.raw);

    let none = TestServer::start(Vec::new());
    let a = none.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.status, "SERVFAIL", "{}", a.raw);
    // Local names still answer.
    let a = none.dig().query("nope.weave.local", "A").unwrap();
    assert_eq!(a.status, "NXDOMAIN", "{}", a.raw);
}

#[test]
fn servfail_within_the_deadline_when_a_server_is_silent() {
    // A UDP socket that never answers: the forwarder must time out, not hang.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let s = TestServer::start_with(|c| {
        c.fallback = Fallback::Servers(vec![silent.local_addr().unwrap()]);
        c.forwarder.server_timeout = Duration::from_millis(300);
        c.forwarder.deadline = Duration::from_millis(600);
    });
    let started = Instant::now();
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.status, "SERVFAIL", "{}", a.raw);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn resolv_conf_is_followed_and_our_own_address_dropped() {
    let one = fallback_dnsmasq();
    let two = Dnsmasq::start(DnsmasqOptions {
        hosts: "127.0.0.77 fallback-host.example\n".to_owned(),
        ..Default::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resolv.conf");
    // Our own address is picked before the server starts, so it can be listed.
    let own = test_support::free_addr();
    std::fs::write(
        &path,
        format!("search x\nnameserver {own}\nnameserver {}\n", one.addr()),
    )
    .unwrap();
    let s = TestServer::start_with(|c| {
        c.dns.listen = own;
        c.fallback = Fallback::ResolvConf(path.clone());
        c.resolv_conf_poll = Duration::from_millis(100);
    });
    assert_eq!(*s.server().forwarder().servers(), vec![one.addr()]);
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.data("A"), ["127.0.0.99"], "{}", a.raw);
    // Rewrite the file: the new server is used.
    std::fs::write(&path, format!("nameserver {}\n", two.addr())).unwrap();
    wait_for("the new resolv.conf", || {
        *s.server().forwarder().servers() == vec![two.addr()]
    });
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.data("A"), ["127.0.0.77"], "{}", a.raw);
    // File gone: no servers, SERVFAIL.
    std::fs::remove_file(&path).unwrap();
    wait_for("no servers", || s.server().forwarder().servers().is_empty());
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.status, "SERVFAIL", "{}", a.raw);
}
