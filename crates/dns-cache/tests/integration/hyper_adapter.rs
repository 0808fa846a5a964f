//! The hyper-util adapter makes a real HTTP request to a local server by name.

use std::convert::Infallible;
use std::net::Ipv4Addr;

use dwara_dns_cache::{DnsCache, DnsCacheConfig, LookupFamily};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use test_support::dns_server::TestDnsServer;

#[tokio::test]
async fn hyper_client_dials_by_name_through_the_cache() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("web.test.", &[Ipv4Addr::LOCALHOST], 30);
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|req: hyper::Request<_>| async move {
                    let host = req
                        .headers()
                        .get(http::header::HOST)
                        .and_then(|h| h.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(host))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let config = DnsCacheConfig {
        family: LookupFamily::Ipv4,
        ..DnsCacheConfig::default()
    };
    let cache = DnsCache::new(crate::resolver_for(dns.addr()), config).unwrap();
    let mut connector = HttpConnector::new_with_resolver(cache.hyper_resolver());
    connector.set_keepalive(None);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build::<_, Empty<Bytes>>(connector);

    let uri: hyper::Uri = format!("http://web.test:{port}/").parse().unwrap();
    for _ in 0..2 {
        let response = client.get(uri.clone()).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, format!("web.test:{port}").as_bytes());
    }
    assert_eq!(dns.query_count_for("web.test."), 1);
    assert_eq!(cache.stats().hits, 1);

    // An unknown name fails the request with the cache's error.
    dns.set_a("web.test.", &[], 30);
    let err = client
        .get(format!("http://nowhere.test:{port}/").parse().unwrap())
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
}
