//! Upstreams fed by push: `dwara serve` with a name server and upstreams in its
//! domain; the endpoint sets follow `PUT`/`DELETE`, and a Docker container's
//! health, with a refresh interval of a day, so no DNS poll could explain what they
//! do. The Docker test is skipped, with the reason printed, only when no engine is
//! reachable; its containers are labelled with this process's pid and removed on
//! the way out.

use std::net::SocketAddr;

use test_support::docker::{
    BUSYBOX_IMAGE, HEALTHY_WHILE_OK, Scope, busybox_image, docker, engine_reachable,
};

use crate::serve::{Backends, Conn, Serve, WAIT, eps, http};

/// A name server for `domain` and upstream `api` on `proxy` with `fields` (indented
/// by four), discovering by `discovery` (the `dns_discovery` fields, indented by six)
/// with a refresh interval of a day.
fn config(domain: &str, proxy: SocketAddr, fields: &str, discovery: &str) -> String {
    let dns_listen = test_support::free_addr();
    format!(
        "nameserver:
  domain: {domain}
  dns_listen: {dns_listen}
  fallback: [127.0.0.1:9]
upstreams:
  - name: api
    listen: {proxy}
{fields}    dns_discovery:
      refresh_interval_s: 86400
{discovery}"
    )
}

/// Upstream `api` following `api.<domain>` (record type A) at `port`.
fn a_config(
    domain: &str,
    proxy: SocketAddr,
    port: u16,
    fail_open: bool,
    min_endpoints: usize,
) -> String {
    config(
        domain,
        proxy,
        "    connect_timeout_ms: 500\n",
        &format!(
            "      hostname: api.{domain}
      port: {port}
      fail_open: {fail_open}
      min_endpoints: {min_endpoints}
"
        ),
    )
}

fn yaml(proxy: SocketAddr, port: u16, fail_open: bool, min_endpoints: usize) -> String {
    a_config("weave.local", proxy, port, fail_open, min_endpoints)
}

/// `dwara serve` with `extra` flags, once its HTTP API answers.
async fn started_with(yaml: &str, extra: &[&str]) -> Serve {
    let serve = Serve::spawn_with(yaml, extra);
    assert!(
        test_support::wait_until(WAIT, || async {
            tokio::net::TcpStream::connect(serve.http).await.is_ok()
        })
        .await,
        "dwara serve did not come up"
    );
    serve
}

async fn started(yaml: &str) -> Serve {
    started_with(yaml, &[]).await
}

/// `PUT /name/<id>/<ip>?fqdn=<fqdn><query>`.
async fn put_name(serve: &Serve, id: &str, ip: &str, fqdn: &str, query: &str) {
    let path = format!("/name/{id}/{ip}?fqdn={fqdn}{query}");
    let (code, body) = http(serve.http, "PUT", &path).await;
    assert_eq!(code, 204, "{body}");
}

async fn put(serve: &Serve, id: &str, ip: &str) {
    put_name(serve, id, ip, "api.weave.local", "").await;
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
    let serve = started(&config(
        "weave.local",
        proxy,
        "    policy: srv\n",
        "      hostname: _echo._tcp.api.weave.local\n      record_type: SRV\n",
    ))
    .await;
    let source = serve.status().await["upstreams"][0]["source"].clone();
    assert_eq!(source, "db SRV _echo._tcp.api.weave.local. (push)");
    let port = backends.port;
    let query = format!("&port={port}&service=_echo._tcp");
    put_name(&serve, "c1", "127.0.0.2", "api.weave.local", &query).await;
    serve.wait_endpoints(&eps(port, &["127.0.0.2"])).await;
    assert_eq!(Conn::open(proxy).await.unwrap().backend, "127.0.0.2");
}

#[tokio::test]
async fn an_http_srv_upstream_fed_by_push_has_no_dns_cache() {
    // The records database gives addresses, never target host names: there is
    // nothing for a cache to resolve.
    let backend =
        test_support::http_backend::HttpBackend::start("127.0.0.2".parse().unwrap()).unwrap();
    let port = backend.addr().port();
    let proxy = test_support::free_addr();
    let serve = started(&config(
        "weave.local",
        proxy,
        "    protocol: http\n",
        "      hostname: _http._tcp.api.weave.local\n      record_type: SRV\n",
    ))
    .await;
    let query = format!("&port={port}&service=_http._tcp");
    put_name(&serve, "c1", "127.0.0.2", "api.weave.local", &query).await;
    serve.wait_endpoints(&eps(port, &["127.0.0.2"])).await;
    let listening = test_support::wait_until(WAIT, || async {
        tokio::net::TcpStream::connect(proxy).await.is_ok()
    })
    .await;
    assert!(listening, "nothing listens on {proxy}");
    let answer = http(proxy, "GET", "/").await;
    assert_eq!(answer, (200, format!("127.0.0.2:{port}\n")));
    let status = serve.status().await;
    let up = &status["upstreams"][0];
    assert_eq!(up["source"], "db SRV _http._tcp.api.weave.local. (push)");
    assert_eq!(up["http"]["requests"]["2xx"], 1, "{status}");
    assert!(up["http"]["dns_cache"].is_null(), "{status}");
}

/// The container's IPv4 address (its only network: the default bridge).
fn ipv4(id: &str) -> String {
    let f = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}";
    docker(&["inspect", "-f", f, id]).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn an_unhealthy_container_leaves_an_upstream_fed_by_push_and_comes_back_when_healthy() {
    if !test_support::require("a Docker engine", engine_reachable()) {
        return;
    }
    busybox_image().expect("build the busybox test image");
    // A domain of its own: no other process following the engine answers it.
    let domain = "pushtest.local";
    let scope = Scope::with_pid_label(format!("dwp-health-{}", std::process::id()));
    let proxy = test_support::free_addr();
    let serve = started_with(&a_config(domain, proxy, 8080, true, 1), &["--docker", "on"]).await;
    let source = serve.status().await["upstreams"][0]["source"].clone();
    assert_eq!(source, "db A api.pushtest.local.:8080 (push)");
    // A healthy entry beside the container, so the container's leaving is an answer
    // without it (alone, an unhealthy entry is answered: the name fails open).
    put_name(&serve, "anchor", "127.0.0.3", &format!("api.{domain}"), "").await;
    let anchor = eps(8080, &["127.0.0.3"]);
    serve.wait_endpoints(&anchor).await;

    let on_name = ["--hostname", "api", "--domainname", domain];
    let cmd = ["sh", "-c", "touch /ok; exec sleep 100000"];
    let id = scope
        .run(
            "checked",
            &[&on_name[..], &HEALTHY_WHILE_OK[..]].concat(),
            BUSYBOX_IMAGE,
            &cmd,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let ip = ipv4(&id);
    // Sorted by address, as the upstream lists them.
    let mut both = eps(8080, &["127.0.0.3", &ip]);
    both.sort_by_key(|a| a.parse::<SocketAddr>().unwrap());
    // `starting` is not answered; healthy is.
    serve.wait_endpoints(&both).await;

    docker(&["exec", &id, "rm", "/ok"]).unwrap_or_else(|e| panic!("{e}"));
    serve.wait_endpoints(&anchor).await;
    docker(&["exec", &id, "touch", "/ok"]).unwrap_or_else(|e| panic!("{e}"));
    serve.wait_endpoints(&both).await;
    let counters = &serve.status().await["upstreams"][0]["resolutions"];
    assert_eq!(counters["below_floor"], 0, "{counters}");
}
