//! `EndpointDiscover` feeding `tower::balance::p2c::Balance`: real TCP requests to
//! real backends follow an SRV answer of the in-process test DNS server as it changes.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dwara_discovery::tower::EndpointDiscover;
use dwara_discovery::{RefreshPolicy, UpstreamDiscovery};
use dwara_discovery_dns::{DnsDiscoveryConfig, DnsSource, RecordType};
use dwara_lb::{Policy, UpstreamLb};
use dwara_resolver::{DnsResolver, ResolverConfig};
use test_support::dns_server::{SrvRecord, TestDnsServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::balance::p2c::Balance;
use tower::load::{CompleteOnResponse, PendingRequests};
use tower::{BoxError, Service, ServiceExt};

const SRV_NAME: &str = "_echo._tcp.svc.test.";
const WAIT: Duration = Duration::from_secs(10);

/// A backend that answers every connection with its name, then closes it.
async fn backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = stream.write_all(name.as_bytes()).await;
            });
        }
    });
    addr
}

/// One request: connect to the endpoint and read its name.
async fn ask(addr: SocketAddr) -> Result<String, BoxError> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    Ok(reply)
}

fn srv(backends: &[(&str, SocketAddr)]) -> Vec<SrvRecord> {
    backends
        .iter()
        .map(|(name, addr)| SrvRecord {
            priority: 0,
            weight: 1,
            port: addr.port(),
            target: format!("{name}.svc.test."),
        })
        .collect()
}

/// One request through the balancer.
async fn request<S>(balance: &mut S) -> String
where
    S: Service<(), Response = String, Error = BoxError>,
{
    balance.ready().await.unwrap().call(()).await.unwrap()
}

/// Sends requests until `done` holds for the names answered so far, failing after
/// [`WAIT`]. Returns every answer in order.
async fn until<S>(balance: &mut S, done: impl Fn(&HashSet<String>) -> bool) -> Vec<String>
where
    S: Service<(), Response = String, Error = BoxError>,
{
    let deadline = Instant::now() + WAIT;
    let mut answers = Vec::new();
    let mut seen = HashSet::new();
    while !done(&seen) {
        assert!(Instant::now() < deadline, "gave up after {answers:?}");
        let reply = request(balance).await;
        seen.insert(reply.clone());
        answers.push(reply);
    }
    answers
}

#[tokio::test]
async fn p2c_balance_follows_srv_changes_with_real_requests() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    let backends = [
        ("one", backend("one").await),
        ("two", backend("two").await),
        ("three", backend("three").await),
    ];
    for (name, _) in &backends {
        dns.set_a(&format!("{name}.svc.test."), &[Ipv4Addr::LOCALHOST], 1);
    }
    dns.set_srv(SRV_NAME, &srv(&backends[..2]), 1);

    let resolver = DnsResolver::new(ResolverConfig {
        nameservers: vec![dns.addr()],
        timeout: Duration::from_millis(500),
        attempts: 1,
        ..ResolverConfig::default()
    })
    .unwrap();
    let mut config = DnsDiscoveryConfig::new(SRV_NAME.trim_end_matches('.'));
    config.record_type = RecordType::SRV;
    let source = Arc::new(DnsSource::with_resolver(&config, resolver).unwrap());
    let policy = RefreshPolicy {
        min_refresh: Duration::from_millis(100),
        jitter: 0.0,
        ..RefreshPolicy::default()
    };
    let lb = Arc::new(UpstreamLb::new(Policy::RoundRobin));
    let discovery = UpstreamDiscovery::new("echo", lb, source, policy);
    let discover = EndpointDiscover::spawn(discovery, |endpoint| {
        let addr = endpoint.addr;
        PendingRequests::new(
            tower::service_fn(move |()| ask(addr)),
            CompleteOnResponse::default(),
        )
    });
    let mut balance = Balance::new(discover);

    // Both advertised backends serve; the third is never asked.
    let answers = until(&mut balance, |seen| seen.len() == 2).await;
    assert!(!answers.iter().any(|a| a == "three"), "{answers:?}");
    assert_eq!(balance.len(), 2);

    // "one" leaves the answer and "three" joins. The removal is reported before the
    // insertion and the balancer takes both in one poll: once "three" has answered,
    // "one" never answers again.
    dns.set_srv(SRV_NAME, &srv(&backends[1..]), 1);
    until(&mut balance, |seen| seen.contains("three")).await;
    let mut after = Vec::new();
    for _ in 0..40 {
        after.push(request(&mut balance).await);
    }
    assert!(
        !after.iter().any(|a| a == "one"),
        "a removed endpoint still served: {after:?}"
    );
    assert!(after.iter().any(|a| a == "two") && after.iter().any(|a| a == "three"));
    assert_eq!(balance.len(), 2);
    dns.shutdown().await;
}
