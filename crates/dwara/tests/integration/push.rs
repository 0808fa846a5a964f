//! Upstreams fed by push: `dwara serve` with a name server and upstreams in its
//! domain; the endpoint sets follow `PUT`/`DELETE` with a refresh interval of a
//! day, so no DNS poll could explain what they do.

use std::net::SocketAddr;

use crate::serve::{Backends, Conn, Serve, WAIT, eps, http};

fn yaml(proxy: SocketAddr, port: u16, fail_open: bool, min_endpoints: usize) -> String {
    let dns_listen = test_support::free_addr();
    format!(
        "nameserver:
  domain: weave.local
  dns_listen: {dns_listen}
  fallback: [127.0.0.1:9]
upstreams:
  - name: api
    listen: {proxy}
    connect_timeout_ms: 500
    dns_discovery:
      hostname: api.weave.local
      port: {port}
      refresh_interval_s: 86400
      fail_open: {fail_open}
      min_endpoints: {min_endpoints}
"
    )
}

async fn started(yaml: &str) -> Serve {
    let serve = Serve::spawn(yaml);
    assert!(
        test_support::wait_until(WAIT, || async {
            tokio::net::TcpStream::connect(serve.http).await.is_ok()
        })
        .await,
        "dwara serve did not come up"
    );
    serve
}

async fn put(serve: &Serve, id: &str, ip: &str) {
    let path = format!("/name/{id}/{ip}?fqdn=api.weave.local");
    let (code, body) = http(serve.http, "PUT", &path).await;
    assert_eq!(code, 204, "{body}");
}

async fn delete(serve: &Serve, id: &str) {
    let (code, body) = http(serve.http, "DELETE", &format!("/name/{id}")).await;
    assert_eq!(code, 204, "{body}");
}

/// Waits until upstream 0 has held `n` answers back below its `min_endpoints`.
async fn wait_below_floor(serve: &Serve, n: u64) {
    let ok = test_support::wait_until(WAIT, || async {
        serve.status().await["upstreams"][0]["resolutions"]["below_floor"] == n
    })
    .await;
    assert!(ok, "{}", serve.status().await["upstreams"][0]);
}

#[tokio::test]
async fn an_upstream_in_the_domain_follows_put_and_delete_by_push() {
    let backends = Backends::start(&["127.0.0.2", "127.0.0.3"]).await;
    let proxy = test_support::free_addr();
    let serve = started(&yaml(proxy, backends.port, true, 1)).await;
    let status = serve.status().await;
    let source = status["upstreams"][0]["source"].as_str().unwrap();
    assert!(source.starts_with("db A api.weave.local."), "{source}");
    assert!(source.ends_with("(push)"), "{source}");
    assert!(serve.endpoints().await.is_empty());

    put(&serve, "c1", "127.0.0.2").await;
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert_eq!(Conn::open(proxy).await.unwrap().backend, "127.0.0.2");
    put(&serve, "c2", "127.0.0.3").await;
    // Another family is not this upstream's (record_type A).
    put(&serve, "c3", "fd00::3").await;
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2", "127.0.0.3"]))
        .await;

    delete(&serve, "c1").await;
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.3"]))
        .await;
    assert_eq!(Conn::open(proxy).await.unwrap().backend, "127.0.0.3");

    // The last entry gone is an empty answer: below min_endpoints 1, the set stays,
    // as it would after an NXDOMAIN.
    delete(&serve, "c2").await;
    wait_below_floor(&serve, 1).await;
    assert_eq!(serve.endpoints().await, eps(backends.port, &["127.0.0.3"]));
    // Back again by push, a day before any refresh.
    put(&serve, "c1", "127.0.0.2").await;
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
}

#[tokio::test]
async fn push_keeps_min_endpoints_and_an_empty_database_is_an_answer_not_a_failure() {
    let backends = Backends::start(&["127.0.0.2", "127.0.0.3", "127.0.0.4"]).await;
    let proxy = test_support::free_addr();
    // fail_open false would clear the set on a failure; reading the database never
    // fails, so only the floor decides.
    let serve = started(&yaml(proxy, backends.port, false, 2)).await;
    for (id, ip) in [
        ("c2", "127.0.0.2"),
        ("c3", "127.0.0.3"),
        ("c4", "127.0.0.4"),
    ] {
        put(&serve, id, ip).await;
    }
    let all = eps(backends.port, &["127.0.0.2", "127.0.0.3", "127.0.0.4"]);
    serve.wait_endpoints(&all).await;

    delete(&serve, "c4").await;
    let two = eps(backends.port, &["127.0.0.2", "127.0.0.3"]);
    serve.wait_endpoints(&two).await;
    // One entry is below min_endpoints 2: the two stay.
    delete(&serve, "c3").await;
    wait_below_floor(&serve, 1).await;
    assert_eq!(serve.endpoints().await, two);
    delete(&serve, "c2").await;
    wait_below_floor(&serve, 2).await;
    assert_eq!(serve.endpoints().await, two);
    let counters = &serve.status().await["upstreams"][0]["resolutions"];
    assert_eq!(counters["failures"], 0, "{counters}");
    assert_eq!(counters["cleared"], 0, "{counters}");
    assert!(
        Conn::open(proxy).await.is_some(),
        "the kept set still carries traffic"
    );
}

#[tokio::test]
async fn an_srv_upstream_follows_the_ports_of_the_registrations() {
    let backends = Backends::start(&["127.0.0.2"]).await;
    let proxy = test_support::free_addr();
    let dns_listen = test_support::free_addr();
    let serve = started(&format!(
        "nameserver:
  domain: weave.local
  dns_listen: {dns_listen}
  fallback: [127.0.0.1:9]
upstreams:
  - name: api
    listen: {proxy}
    policy: srv
    dns_discovery:
      hostname: _echo._tcp.api.weave.local
      record_type: SRV
      refresh_interval_s: 86400
"
    ))
    .await;
    let source = serve.status().await["upstreams"][0]["source"].clone();
    assert_eq!(source, "db SRV _echo._tcp.api.weave.local. (push)");
    let port = backends.port;
    let path = format!("/name/c1/127.0.0.2?fqdn=api.weave.local&port={port}&service=_echo._tcp");
    let (code, body) = http(serve.http, "PUT", &path).await;
    assert_eq!(code, 204, "{body}");
    serve.wait_endpoints(&eps(port, &["127.0.0.2"])).await;
    assert_eq!(Conn::open(proxy).await.unwrap().backend, "127.0.0.2");
}
