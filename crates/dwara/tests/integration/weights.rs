//! SRV priority and weight end to end: instances registered with `dwara dns add
//! --weight/--priority` on one `dwara serve` (the name server), and another `dwara
//! serve` whose upstreams follow `_http._tcp.<name>` over DNS (`record_type: SRV`,
//! policy `srv`): the weights and priorities reach its endpoints through the DNS
//! answers, and real HTTP requests through its listeners split as RFC 2782 says.
//! Shares are checked against binomial bounds (five standard deviations), never
//! against timings; every wait polls with a deadline.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use test_support::http_backend::HttpBackend;

use crate::nameserver::Serve;

/// How long the proxy may take to follow a change of the answers (a check
/// failing, a refresh of one second).
const FOLLOW: Duration = Duration::from_secs(20);

/// `dwara dns add <id> <backend ip> <fqdn> --port <backend port> --service
/// _http._tcp <extra>` against `ns`.
fn add(ns: &Serve, id: &str, backend: SocketAddr, fqdn: &str, extra: &[&str]) {
    let (ip, port) = (backend.ip().to_string(), backend.port().to_string());
    let mut args = vec![
        "add",
        id,
        &ip,
        fqdn,
        "--port",
        &port,
        "--service",
        "_http._tcp",
    ];
    args.extend_from_slice(extra);
    let out = ns.dns(&args);
    assert!(
        out.status.success(),
        "dwara dns {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `dwara serve` (its own name server for another domain) with one upstream per
/// `(listen, name)`, each following `_http._tcp.<name>` in `ns`'s answers by DNS
/// with policy `srv`, refreshed every second.
fn proxy(ns: &Serve, upstreams: &[(SocketAddr, &str)], dir: &std::path::Path) -> Serve {
    let mut yaml = format!(
        "nameserver:\n  domain: proxy.local\n  dns_listen: {}\n  fallback: [127.0.0.1:9]\nupstreams:\n",
        test_support::free_addr()
    );
    for (i, (listen, name)) in upstreams.iter().enumerate() {
        yaml.push_str(&format!(
            "  - name: u{i}
    listen: {listen}
    policy: srv
    connect_timeout_ms: 500
    dns_discovery:
      hostname: _http._tcp.{name}
      record_type: SRV
      refresh_interval_s: 1
      nameservers: [{dns}]
",
            dns = ns.dns
        ));
    }
    let config = dir.join("proxy.yaml");
    std::fs::write(&config, yaml).unwrap();
    Serve::start(&[
        "--config",
        config.to_str().unwrap(),
        "--http-listen",
        "127.0.0.1:0",
    ])
}

/// Upstream `i`'s endpoints as `/upstreams` shows them: address → (priority, weight).
fn endpoints(proxy: &Serve, i: usize) -> BTreeMap<String, (u64, u64)> {
    let (status, body) = test_support::http::request(proxy.http, "GET", "/upstreams", None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["upstreams"][i]["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let n = |k: &str| e[k].as_u64().unwrap();
            (
                e["addr"].as_str().unwrap().to_owned(),
                (n("priority"), n("weight")),
            )
        })
        .collect()
}

/// Waits until upstream `i`'s endpoints are exactly `want`.
fn await_endpoints(proxy: &Serve, i: usize, want: &[(&HttpBackend, u64, u64)]) {
    let want: BTreeMap<String, (u64, u64)> = want
        .iter()
        .map(|(b, p, w)| (b.addr().to_string(), (*p, *w)))
        .collect();
    let deadline = Instant::now() + FOLLOW;
    loop {
        let got = endpoints(proxy, i);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "upstream {i}: endpoints {got:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many of `n` HTTP requests through `listen` (a new connection each) each
/// backend answered, by its address.
fn split(listen: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut counts = BTreeMap::new();
    for i in 0..n {
        let resp = client
            .get(format!("http://{listen}/"))
            .send()
            .unwrap_or_else(|e| panic!("request {i} through {listen}: {e}"));
        assert_eq!(resp.status(), 200, "request {i} through {listen}");
        *counts
            .entry(resp.text().unwrap().trim().to_owned())
            .or_default() += 1;
    }
    counts
}

/// The band `n·p ± 5·sqrt(n·p·(1-p))`: a binomial count outside it has a chance
/// below one in a million.
pub(crate) fn binomial_band(n: usize, p: f64) -> (usize, usize) {
    let n = n as f64;
    let sd = (n * p * (1.0 - p)).sqrt();
    let low = (n * p - 5.0 * sd).max(0.0).floor() as usize;
    let high = (n * p + 5.0 * sd).ceil() as usize;
    (low, high)
}

/// HTTP backends on 127.0.0.`first`.., each on a port of its own.
fn backends(first: u8, n: u8) -> Vec<HttpBackend> {
    (first..first + n)
        .map(|i| HttpBackend::start(IpAddr::from([127, 0, 0, i])).unwrap())
        .collect()
}

#[test]
fn a_canary_at_weight_1_beside_two_at_9_gets_one_in_19_through_the_srv_policy() {
    let ns = crate::interop::dwara();
    let web = backends(61, 3);
    for (i, (b, weight)) in web.iter().zip(["9", "9", "1"]).enumerate() {
        add(
            &ns,
            &format!("w{i}"),
            b.addr(),
            "web.weave.local",
            &["--weight", weight],
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let listen = test_support::free_addr();
    let proxy = proxy(&ns, &[(listen, "web.weave.local")], dir.path());
    // The weights came through the DNS answers into the proxy's endpoints.
    await_endpoints(
        &proxy,
        0,
        &[(&web[0], 0, 9), (&web[1], 0, 9), (&web[2], 0, 1)],
    );
    const N: usize = 2000;
    let counts = split(listen, N);
    eprintln!("{N} requests, weights 9, 9, 1: {counts:?}");
    assert_eq!(counts.values().sum::<usize>(), N);
    let got = |b: &HttpBackend| counts.get(&b.addr().to_string()).copied().unwrap_or(0);
    // RFC 2782: weight / sum of weights. Equal weights would give each 667.
    let (low, high) = binomial_band(N, 1.0 / 19.0);
    let canary = got(&web[2]);
    assert!(
        (low..=high).contains(&canary),
        "canary {canary} of {N}, want {low}..={high} (1/19): {counts:?}"
    );
    let (low, high) = binomial_band(N, 9.0 / 19.0);
    for b in &web[..2] {
        assert!(
            (low..=high).contains(&got(b)),
            "{} got {} of {N}, want {low}..={high} (9/19): {counts:?}",
            b.addr(),
            got(b)
        );
    }
}

#[test]
fn the_lowest_priority_takes_all_traffic_while_up_then_the_next_one() {
    let ns = crate::interop::dwara();
    let mut ranked = backends(71, 3);
    // Two at priority 0, one at priority 1 with a far larger weight: priority
    // comes first. Checked by the name server, so a stopped one leaves the answers.
    for (i, (b, rank)) in ranked
        .iter()
        .zip([["0", "1"], ["0", "1"], ["1", "100"]])
        .enumerate()
    {
        let extra = ["--priority", rank[0], "--weight", rank[1], "--check", "tcp"];
        add(
            &ns,
            &format!("r{i}"),
            b.addr(),
            "ranked.weave.local",
            &extra,
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let listen = test_support::free_addr();
    let proxy = proxy(&ns, &[(listen, "ranked.weave.local")], dir.path());
    await_endpoints(
        &proxy,
        0,
        &[(&ranked[0], 0, 1), (&ranked[1], 0, 1), (&ranked[2], 1, 100)],
    );
    const N: usize = 400;
    let counts = split(listen, N);
    eprintln!("{N} requests, priorities 0, 0, 1: {counts:?}");
    let got = |c: &BTreeMap<String, usize>, b: &HttpBackend| {
        c.get(&b.addr().to_string()).copied().unwrap_or(0)
    };
    assert_eq!(got(&counts, &ranked[2]), 0, "{counts:?}");
    let (low, high) = binomial_band(N, 0.5);
    for b in &ranked[..2] {
        let n = got(&counts, b);
        assert!((low..=high).contains(&n), "{n} of {N}: {counts:?}");
    }
    // One of priority 0 down: the other takes everything.
    ranked[0].stop();
    await_endpoints(&proxy, 0, &[(&ranked[1], 0, 1), (&ranked[2], 1, 100)]);
    let counts = split(listen, 100);
    assert_eq!(got(&counts, &ranked[1]), 100, "{counts:?}");
    // Both down: priority 1 does.
    ranked[1].stop();
    await_endpoints(&proxy, 0, &[(&ranked[2], 1, 100)]);
    let counts = split(listen, 100);
    assert_eq!(got(&counts, &ranked[2]), 100, "{counts:?}");
}
