//! The reqwest adapter makes a real HTTP request to a local server by name
//! (runs with `--features reqwest`).

use std::net::Ipv4Addr;

use dwara_dns_cache::{DnsCache, DnsCacheConfig, LookupFamily};
use test_support::dns_server::TestDnsServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn reqwest_client_dials_by_name_through_the_cache() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("web.test.", &[Ipv4Addr::LOCALHOST], 30);
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });

    let config = DnsCacheConfig {
        family: LookupFamily::Ipv4,
        ..DnsCacheConfig::default()
    };
    let cache = DnsCache::new(crate::resolver_for(dns.addr()), config).unwrap();
    let client = reqwest::Client::builder()
        .dns_resolver(cache.reqwest_resolver())
        .pool_max_idle_per_host(0)
        .no_proxy()
        .build()
        .unwrap();
    for _ in 0..2 {
        let response = client
            .get(format!("http://web.test:{port}/"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::OK);
        assert_eq!(response.text().await.unwrap(), "ok");
    }
    assert_eq!(dns.query_count_for("web.test."), 1);

    let err = client
        .get(format!("http://nowhere.test:{port}/"))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
}
