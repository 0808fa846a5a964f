//! `DnsResolver` against the in-process test DNS server.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use dwara_resolver::{DnsResolver, NameServerSource, ResolveError, ResolverConfig, SrvTarget};
use test_support::dns_server::{FailureMode, SrvRecord, TestDnsServer};

fn resolver_for(addr: SocketAddr) -> DnsResolver {
    DnsResolver::new(ResolverConfig {
        nameservers: vec![addr],
        timeout: Duration::from_millis(300),
        attempts: 1,
        ..ResolverConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn a_and_aaaa_carry_their_ttls() {
    test_support::init_tracing();
    let server = TestDnsServer::start().await.unwrap();
    server.set_a(
        "api.test.",
        &["10.0.0.2".parse().unwrap(), "10.0.0.1".parse().unwrap()],
        7,
    );
    server.set_aaaa("api.test.", &["fd00::1".parse().unwrap()], 9);
    let r = resolver_for(server.addr());

    let a = r.lookup_a("api.test.").await.unwrap();
    assert_eq!(
        a,
        vec![
            ("10.0.0.1".parse().unwrap(), 7),
            ("10.0.0.2".parse().unwrap(), 7)
        ]
    );
    let aaaa = r.lookup_aaaa("API.test").await.unwrap();
    assert_eq!(aaaa, vec![("fd00::1".parse().unwrap(), 9)]);
    let both = r.lookup_ip("api.test.").await.unwrap();
    assert_eq!(both.len(), 3);
    assert!(both[0].0.is_ipv4() && both[2].0.is_ipv6());
}

#[tokio::test]
async fn hickory_cache_is_off_every_lookup_asks_the_server() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 300);
    let r = resolver_for(server.addr());
    for _ in 0..3 {
        r.lookup_a("api.test.").await.unwrap();
    }
    assert_eq!(server.query_count_for("api.test."), 3);
    server.set_a("api.test.", &["10.0.0.9".parse().unwrap()], 300);
    assert_eq!(
        r.lookup_a("api.test.").await.unwrap(),
        vec![("10.0.0.9".parse::<IpAddr>().unwrap(), 300)]
    );
}

#[tokio::test]
async fn nxdomain_and_nodata_are_answers_not_failures() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_negative_ttl(42);
    server.set_aaaa("v6only.test.", &["fd00::1".parse().unwrap()], 5);
    let r = resolver_for(server.addr());

    let nx = r.lookup_a("missing.test.").await.unwrap_err();
    assert!(
        matches!(nx, ResolveError::NoRecords { nxdomain: true, .. }),
        "{nx:?}"
    );
    assert!(nx.is_no_records());
    assert_eq!(nx.negative_ttl(), Some(42));

    let nodata = r.lookup_a("v6only.test.").await.unwrap_err();
    assert!(
        matches!(
            nodata,
            ResolveError::NoRecords {
                nxdomain: false,
                ..
            }
        ),
        "{nodata:?}"
    );
}

#[tokio::test]
async fn servfail_refused_and_silence_are_failures() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 5);
    let r = resolver_for(server.addr());

    server.set_failure(FailureMode::ServFail);
    let e = r.lookup_a("api.test.").await.unwrap_err();
    assert_eq!(e.kind(), "servfail", "{e:?}");
    assert!(!e.is_no_records());

    server.set_failure(FailureMode::Refused);
    let e = r.lookup_a("api.test.").await.unwrap_err();
    assert_eq!(e.kind(), "refused", "{e:?}");

    server.set_failure(FailureMode::Drop);
    let e = r.lookup_a("api.test.").await.unwrap_err();
    assert_eq!(e.kind(), "timeout", "{e:?}");

    server.set_failure(FailureMode::Answer);
    assert_eq!(r.lookup_a("api.test.").await.unwrap().len(), 1);
}

#[tokio::test]
async fn srv_targets_are_resolved_with_min_ttl_ports_weights_priorities() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_srv(
        "_http._tcp.svc.test.",
        &[
            SrvRecord {
                priority: 10,
                weight: 5,
                port: 8080,
                target: "a.test.".into(),
            },
            SrvRecord {
                priority: 20,
                weight: 1,
                port: 9090,
                target: "b.test.".into(),
            },
            SrvRecord {
                priority: 30,
                weight: 1,
                port: 7070,
                target: "gone.test.".into(),
            },
        ],
        30,
    );
    server.set_a("a.test.", &["10.0.0.1".parse().unwrap()], 10);
    server.set_a("b.test.", &["10.0.0.2".parse().unwrap()], 60);
    server.set_aaaa("b.test.", &["fd00::2".parse().unwrap()], 60);
    let r = resolver_for(server.addr());

    let targets = r.lookup_srv("_http._tcp.svc.test.").await.unwrap();
    assert_eq!(
        targets,
        vec![
            SrvTarget {
                ip: "10.0.0.1".parse().unwrap(),
                port: 8080,
                priority: 10,
                weight: 5,
                ttl: 10
            },
            SrvTarget {
                ip: "10.0.0.2".parse().unwrap(),
                port: 9090,
                priority: 20,
                weight: 1,
                ttl: 30
            },
            SrvTarget {
                ip: "fd00::2".parse().unwrap(),
                port: 9090,
                priority: 20,
                weight: 1,
                ttl: 30
            },
        ]
    );
    // The targets were asked for explicitly.
    assert!(server.query_count_for("a.test.") >= 1);
    assert!(server.query_count_for("gone.test.") >= 1);
}

/// Found by the `dns_answers` fuzz target: every SRV record cost a lookup of its
/// target, so an answer naming one target in hundreds of records became hundreds of
/// lookups. hickory merges identical questions that are in flight at once, so the
/// server saw two, but every lookup still got and filtered its own copy of the
/// answer (seconds of work when that answer was large too). Now each distinct
/// target is one lookup, whether or not the lookups overlap.
#[tokio::test]
async fn srv_target_named_by_many_records_is_resolved_once() {
    let server = TestDnsServer::start().await.unwrap();
    let records: Vec<SrvRecord> = (0..200)
        .map(|i| SrvRecord {
            priority: 1,
            weight: 1,
            port: 1000 + i,
            // Mixed case: still one name.
            target: if i % 2 == 0 { "a.test." } else { "A.Test." }.into(),
        })
        .collect();
    server.set_srv("_many._tcp.test.", &records, 30);
    server.set_a("a.test.", &["10.0.0.1".parse().unwrap()], 30);
    let r = resolver_for(server.addr());

    let targets = r.lookup_srv("_many._tcp.test.").await.unwrap();
    let ports: Vec<u16> = targets.iter().map(|t| t.port).collect();
    assert_eq!(ports, (1000..1200).collect::<Vec<u16>>());
    // One A and one AAAA question for the one target.
    assert_eq!(server.query_count_for("a.test."), 2);
}

#[tokio::test]
async fn srv_target_without_addresses_is_skipped_and_missing_srv_is_empty_answer() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_srv(
        "_x._tcp.test.",
        &[SrvRecord {
            priority: 1,
            weight: 1,
            port: 1,
            target: "a.test.".into(),
        }],
        30,
    );
    let r = resolver_for(server.addr());
    // No address for the only target: an empty (but successful) answer.
    assert!(r.lookup_srv("_x._tcp.test.").await.unwrap().is_empty());
    assert!(
        r.lookup_srv("_none._tcp.test.")
            .await
            .unwrap_err()
            .is_no_records()
    );
}

#[tokio::test]
async fn invalid_names_are_rejected_before_any_query() {
    let server = TestDnsServer::start().await.unwrap();
    let r = resolver_for(server.addr());
    assert!(matches!(
        r.lookup_a("").await,
        Err(ResolveError::InvalidName { .. })
    ));
    assert!(matches!(
        r.lookup_a("a..b").await,
        Err(ResolveError::InvalidName { .. })
    ));
    assert_eq!(server.query_count(), 0);
}

#[tokio::test]
async fn nameserver_selection_explicit_then_resolv_conf_then_google() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("resolv.conf");
    std::fs::write(&conf, "# test\nnameserver 127.0.0.1\nnameserver ::1\n").unwrap();

    let explicit: SocketAddr = "127.0.0.1:5353".parse().unwrap();
    let r = DnsResolver::new(ResolverConfig {
        nameservers: vec![explicit],
        resolv_conf: conf.clone(),
        ..ResolverConfig::default()
    })
    .unwrap();
    assert_eq!(r.source(), &NameServerSource::Explicit(vec![explicit]));

    let r = DnsResolver::new(ResolverConfig {
        resolv_conf: conf.clone(),
        ..ResolverConfig::default()
    })
    .unwrap();
    assert_eq!(
        r.source(),
        &NameServerSource::ResolvConf(
            conf.clone(),
            vec!["127.0.0.1:53".parse().unwrap(), "[::1]:53".parse().unwrap()]
        )
    );

    let r = DnsResolver::new(ResolverConfig {
        resolv_conf: dir.path().join("missing"),
        ..ResolverConfig::default()
    })
    .unwrap();
    assert_eq!(r.source(), &NameServerSource::Google);
    assert_eq!(r.source().servers(), &dwara_resolver::GOOGLE_NAMESERVERS);

    std::fs::write(&conf, "# no servers here\n").unwrap();
    let r = DnsResolver::new(ResolverConfig {
        resolv_conf: conf,
        ..ResolverConfig::default()
    })
    .unwrap();
    assert_eq!(r.source(), &NameServerSource::Google);
}

/// resolv.conf may name a server on another port (`IP:PORT`, `[IPv6]:PORT`), as the
/// name server's fallback reader always accepted: one grammar for both halves.
#[tokio::test]
async fn resolv_conf_servers_on_other_ports_are_asked() {
    let server = TestDnsServer::start().await.unwrap();
    server.set_a("api.test.", &["10.0.0.9".parse().unwrap()], 5);
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("resolv.conf");
    std::fs::write(
        &conf,
        format!("nameserver {}\nnameserver [::1]:5354\n", server.addr()),
    )
    .unwrap();
    let r = DnsResolver::new(ResolverConfig {
        resolv_conf: conf.clone(),
        timeout: Duration::from_millis(300),
        attempts: 1,
        ..ResolverConfig::default()
    })
    .unwrap();
    assert_eq!(
        r.source(),
        &NameServerSource::ResolvConf(conf, vec![server.addr(), "[::1]:5354".parse().unwrap()])
    );
    let ips: Vec<IpAddr> = r
        .lookup_a("api.test.")
        .await
        .unwrap()
        .into_iter()
        .map(|(ip, _)| ip)
        .collect();
    assert_eq!(ips, ["10.0.0.9".parse::<IpAddr>().unwrap()]);
}
