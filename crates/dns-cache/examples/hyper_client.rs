//! hyper-util's HTTP client dialling through the DNS cache.
//!
//! Self-contained: it starts the in-process test DNS server (`web.test` →
//! 127.0.0.1) and a one-route HTTP server on loopback, then fetches
//! `http://web.test:<port>/` three times; only the first asks DNS.
//!
//! ```text
//! cargo run -p dwara-dns-cache --example hyper_client
//! ```

#![allow(clippy::print_stdout)]

use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::time::Duration;

use dwara_dns_cache::{DnsCache, DnsCacheConfig, LookupFamily};
use dwara_resolver::{DnsResolver, ResolverConfig};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use test_support::dns_server::TestDnsServer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A name server that knows web.test, and an HTTP server on loopback.
    let dns = TestDnsServer::start().await?;
    dns.set_a("web.test.", &[Ipv4Addr::LOCALHOST], 30);
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(
                        "hello through the cache\n",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let resolver = DnsResolver::new(ResolverConfig {
        nameservers: vec![dns.addr()],
        timeout: Duration::from_secs(1),
        ..ResolverConfig::default()
    })?;
    let cache = DnsCache::new(
        resolver,
        DnsCacheConfig {
            family: LookupFamily::Ipv4,
            ..DnsCacheConfig::default()
        },
    )?;
    let mut connector = HttpConnector::new_with_resolver(cache.hyper_resolver());
    // Pooled connections would hide the dials; make each request dial.
    connector.set_keepalive(None);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build::<_, Empty<Bytes>>(connector);

    let uri: hyper::Uri = format!("http://web.test:{port}/").parse()?;
    for _ in 0..3 {
        let response = client.get(uri.clone()).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        print!("{status} {}", String::from_utf8_lossy(&body));
    }
    println!(
        "DNS queries for web.test: {}; cache: {:?}",
        dns.query_count_for("web.test."),
        cache.stats()
    );
    Ok(())
}
