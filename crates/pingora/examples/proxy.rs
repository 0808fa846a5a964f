//! A Pingora HTTP proxy whose upstreams follow DNS through `dwara-pingora`.
//!
//! ```text
//! cargo run --example proxy -- LISTEN NAMESERVER TYPE HOSTNAME [PORT]
//! cargo run --example proxy -- 127.0.0.1:6188 127.0.0.1:1053 SRV _http._tcp.api.weave.local
//! cargo run --example proxy -- 127.0.0.1:6188 127.0.0.1:1053 A api.weave.local 8080
//! ```
//!
//! Pingora re-reads the backends every 100 ms here (`update_frequency`); each
//! request goes to the next backend in round-robin order.

#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dwara_discovery_dns::DnsDiscoveryConfig;
use dwara_pingora::DwaraDiscovery;
use pingora_core::server::Server;
use pingora_core::services::background::background_service;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_load_balancing::selection::RoundRobin;
use pingora_load_balancing::{Backends, LoadBalancer};
use pingora_proxy::{ProxyHttp, Session};

/// The proxy: every request goes to a backend the load balancer selects.
struct Proxy(Arc<LoadBalancer<RoundRobin>>);

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora_core::Result<Box<HttpPeer>> {
        let backend = self.0.select(b"", 256).ok_or_else(|| {
            pingora_core::Error::explain(
                pingora_core::ErrorType::ConnectNoRoute,
                "no backend: DNS has none yet",
            )
        })?;
        Ok(Box::new(HttpPeer::new(backend, false, String::new())))
    }
}

fn config_from_args() -> Result<(String, DnsDiscoveryConfig), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, nameserver, record_type, hostname, rest @ ..] = args.as_slice() else {
        return Err("usage: proxy LISTEN NAMESERVER A|AAAA|SRV HOSTNAME [PORT]".to_owned());
    };
    let mut config = DnsDiscoveryConfig::new(hostname.as_str());
    config.record_type = record_type.parse().map_err(|e| format!("{e}"))?;
    config.nameservers = vec![
        nameserver
            .parse()
            .map_err(|e| format!("nameserver {nameserver}: {e}"))?,
    ];
    if let Some(port) = rest.first() {
        config.port = Some(port.parse().map_err(|e| format!("port {port}: {e}"))?);
    }
    Ok((listen.clone(), config))
}

fn main() {
    let (listen, config) = match config_from_args() {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let discovery = match DwaraDiscovery::dns(&config) {
        Ok(discovery) => discovery,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut server = match Server::new(None) {
        Ok(server) => server,
        Err(e) => {
            eprintln!("cannot start the Pingora server: {e}");
            std::process::exit(1);
        }
    };
    server.bootstrap();

    let mut upstreams =
        LoadBalancer::<RoundRobin>::from_backends(Backends::new(Box::new(discovery)));
    upstreams.update_frequency = Some(Duration::from_millis(100));
    let background = background_service("dwara discovery", upstreams);
    let mut proxy =
        pingora_proxy::http_proxy_service(&server.configuration, Proxy(background.task()));
    proxy.add_tcp(&listen);
    server.add_service(background);
    server.add_service(proxy);
    println!("proxy listening on {listen}");
    server.run_forever();
}
