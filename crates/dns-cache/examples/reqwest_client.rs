//! reqwest dialling through the DNS cache.
//!
//! Self-contained: it starts the in-process test DNS server (`web.test` →
//! 127.0.0.1) and a minimal HTTP/1.1 responder on loopback, then fetches
//! `http://web.test:<port>/` three times; only the first asks DNS.
//!
//! ```text
//! cargo run -p dwara-dns-cache --features reqwest --example reqwest_client
//! ```

#![allow(clippy::print_stdout)]

use std::net::Ipv4Addr;
use std::time::Duration;

use dwara_dns_cache::{DnsCache, DnsCacheConfig, LookupFamily};
use dwara_resolver::{DnsResolver, ResolverConfig};
use test_support::dns_server::TestDnsServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dns = TestDnsServer::start().await?;
    dns.set_a("web.test.", &[Ipv4Addr::LOCALHOST], 30);
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let body = "hello through the cache\n";
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
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
    let client = reqwest::Client::builder()
        .dns_resolver(cache.reqwest_resolver())
        .pool_max_idle_per_host(0)
        .no_proxy()
        .build()?;
    for _ in 0..3 {
        let response = client
            .get(format!("http://web.test:{port}/"))
            .send()
            .await?;
        print!("{} {}", response.status(), response.text().await?);
    }
    println!(
        "DNS queries for web.test: {}; cache: {:?}",
        dns.query_count_for("web.test."),
        cache.stats()
    );
    Ok(())
}
