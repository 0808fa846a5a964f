//! The in-process server under test and its HTTP helper.
//!
//! The name server owns no HTTP listener, so the test serves its router (and a
//! `/metrics` over a registry it registered into) the way the binary does.

use std::net::SocketAddr;
use std::sync::Arc;

use dwara_nameserver::{Db, Domain, Fallback, NameServer, NameServerConfig};
use test_support::dig::Dig;
use test_support::dnsmasq::{Dnsmasq, DnsmasqOptions};

/// A name server on its own runtime (so tests can block on dig), on free loopback
/// ports.
pub(crate) struct TestServer {
    rt: tokio::runtime::Runtime,
    server: Option<NameServer>,
    http_stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub(crate) dns: SocketAddr,
    pub(crate) http: SocketAddr,
}

impl TestServer {
    pub(crate) fn start(fallback: Vec<SocketAddr>) -> Self {
        Self::start_with(|c| c.fallback = Fallback::Servers(fallback))
    }

    pub(crate) fn start_with(tweak: impl FnOnce(&mut NameServerConfig)) -> Self {
        test_support::init_tracing();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut config = NameServerConfig::new(Domain::new("weave.local").unwrap());
        config.dns.listen = "127.0.0.1:0".parse().unwrap();
        config.dns.udp_workers = 2;
        config.fallback = Fallback::Servers(Vec::new());
        tweak(&mut config);
        let server = rt.block_on(NameServer::start(config)).unwrap();
        let mut registry = prometheus_client::registry::Registry::default();
        server.register_metrics(&mut registry);
        let registry = Arc::new(registry);
        let router = server.router().route(
            "/metrics",
            axum::routing::get(move || async move {
                let mut text = String::new();
                prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
                text
            }),
        );
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let http = listener.local_addr().unwrap();
        let (http_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Self {
            dns: server.dns_addr(),
            http,
            server: Some(server),
            http_stop: Some(http_stop),
            rt,
        }
    }

    pub(crate) fn dig(&self) -> Dig {
        Dig::new(self.dns)
    }

    pub(crate) fn db(&self) -> &Arc<Db> {
        self.server.as_ref().unwrap().db()
    }

    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub(crate) fn server(&self) -> &NameServer {
        self.server.as_ref().unwrap()
    }

    pub(crate) fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        test_support::http::request(self.http, method, path, body)
    }

    pub(crate) fn put(&self, id: &str, ip: &str, fqdn: &str) {
        let (status, body) = self.http(
            "PUT",
            &format!("/name/{id}/{ip}"),
            Some(&format!("fqdn={fqdn}")),
        );
        assert_eq!(status, 204, "PUT {id} {ip} {fqdn}: {body}");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.http_stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            self.rt.block_on(server.shutdown());
        }
    }
}

/// A dnsmasq fallback that knows `fallback-host.example` (127.0.0.99, also its PTR),
/// answers NXDOMAIN for `*.nx.example`, and — as a trap — also knows
/// `trap.weave.local` (which must never be forwarded).
pub(crate) fn fallback_dnsmasq() -> Dnsmasq {
    Dnsmasq::start(DnsmasqOptions {
        hosts: "127.0.0.99 fallback-host.example\n127.0.0.98 trap.weave.local\n".to_owned(),
        local_ttl: Some(30),
        extra_args: vec!["--address=/nx.example/".to_owned()],
    })
    .unwrap()
}
