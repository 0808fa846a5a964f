//! `http_path`: arbitrary requests to the name server's HTTP API, through the same
//! [`axum::Router`] `dwara serve` mounts, with the database checked after each.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use dwara_nameserver::{Domain, Fallback, Health, NameServer, NameServerConfig};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// A running name server (no fallback, no data dir, checks that never connect:
/// `check=tcp` with an arbitrary address sends nothing) and its runtime.
struct Api {
    server: NameServer,
    runtime: tokio::runtime::Runtime,
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut config = NameServerConfig::new(Domain::new("weave.local").unwrap());
        config.dns = dwara_nameserver::DnsServerConfig::new("127.0.0.1:0".parse().unwrap());
        config.dns.udp_workers = 1;
        config.fallback = Fallback::Servers(Vec::new());
        config.checks.probing = dwara_nameserver::Probing::Off;
        // Checkers of entries the reset below removes notice soon and stop.
        config.checks.interval = Duration::from_millis(10);
        let server = runtime.block_on(NameServer::start(config)).unwrap();
        server
            .db()
            .add("seed", "10.40.0.1".parse().unwrap(), "seed.weave.local")
            .unwrap();
        Api { server, runtime }
    })
}

type Live = BTreeSet<(String, IpAddr, String)>;

fn live(server: &NameServer) -> Live {
    server
        .db()
        .entries()
        .into_iter()
        .filter(|e| !e.tombstone)
        .map(|e| (e.id, e.ip, e.fqdn))
        .collect()
}

const METHODS: [Method; 7] = [
    Method::GET,
    Method::PUT,
    Method::DELETE,
    Method::POST,
    Method::HEAD,
    Method::PATCH,
    Method::OPTIONS,
];

/// The first byte picks the method, the bytes up to the first newline are the path
/// and query, the rest is the body. The API answers 2xx or 4xx only (there is no
/// data dir, so nothing can fail to be stored); only a 2xx `PUT` adds (at most one
/// entry, which a lookup then finds unless it is checked: a checked entry starts
/// unanswered) and only a 2xx `DELETE` removes; a 200 lookup is a JSON array of
/// addresses the database has under that name.
pub fn http_path(data: &[u8]) {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(m) % METHODS.len()].clone();
    let (path, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return;
    };
    let uri = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let Ok(request) = Request::builder()
        .method(method.clone())
        .uri(&uri)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(body.to_vec()))
    else {
        return;
    };
    let Api { server, runtime } = api();
    let before = live(server);
    let (status, body) = runtime.block_on(async {
        let response =
            tokio::time::timeout(Duration::from_secs(5), server.router().oneshot(request))
                .await
                .expect("the API did not answer within 5 s")
                .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    });
    let after = live(server);
    assert!(
        status.is_success() || status.is_client_error(),
        "{method} {uri:?}: {status} {body:?}"
    );
    let added: Vec<_> = after.difference(&before).cloned().collect();
    let removed: Vec<_> = before.difference(&after).cloned().collect();
    match (&method, status.is_success()) {
        (&Method::PUT, true) => {
            assert!(removed.is_empty(), "PUT removed {removed:?}");
            assert!(added.len() <= 1, "PUT added {added:?}");
            for (id, ip, fqdn) in &added {
                let health = server
                    .db()
                    .entries()
                    .into_iter()
                    .find(|e| !e.tombstone && (&e.id, &e.ip, &e.fqdn) == (id, ip, fqdn))
                    .map(|e| e.health);
                match health {
                    Some(Health::Unchecked) => assert!(
                        server.db().lookup(fqdn).contains(ip),
                        "{fqdn} {ip} not found"
                    ),
                    Some(Health::Starting) => {}
                    other => panic!("{fqdn} {ip}: a new entry is {other:?}"),
                }
            }
        }
        (&Method::DELETE, true) => assert!(added.is_empty(), "DELETE added {added:?}"),
        _ => assert!(
            added.is_empty() && removed.is_empty(),
            "{method} {uri:?} ({status}) changed the db: +{added:?} -{removed:?}"
        ),
    }
    if method == Method::GET && status == StatusCode::OK && uri.starts_with("/name/") {
        let ips: Vec<String> = serde_json::from_slice(&body).expect("lookup body is JSON");
        for ip in ips {
            let _: IpAddr = ip.parse().expect("lookup answers addresses");
        }
    }
    // Back to the seed state, so inputs do not depend on the ones before.
    for (id, ip, fqdn) in &added {
        server.db().remove(id, Some(*ip), Some(fqdn));
    }
    for (id, ip, fqdn) in &removed {
        server.db().add(id, *ip, fqdn).unwrap();
    }
    // A `check` on the seed made it starting: answered again.
    server
        .db()
        .set_health("seed", "10.40.0.1".parse().unwrap(), Health::Unchecked);
    server.db().gc_tombstones(Duration::ZERO);
}
