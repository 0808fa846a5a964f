//! The dataplane of `dwara serve`: L4 and HTTP upstreams whose endpoints follow
//! discovery.
//!
//! - [`UpstreamConfig`] / [`validate_upstreams`]: the `upstreams:` entries of the
//!   configuration file, strictly parsed, errors naming their key.
//! - [`plan()`]: reload as a pure function of the running upstreams, the bound
//!   addresses and the new configuration (unit-tested without sockets).
//! - [`Dataplane`]: carries plans out (build, bind, commit), owns the listeners and
//!   the discovery tasks, forwards connections (pick, connect with retries, copy
//!   both ways) on its L4 worker threads ([`Dataplane::with_l4_workers`]: each a
//!   `current_thread` runtime with its own `SO_REUSEPORT` socket per listen
//!   address, one per core by default), drains on shutdown, and reports its status
//!   ([`Dataplane::router`]: `GET /upstreams`) and metrics
//!   ([`Dataplane::register_metrics`]). It owns no HTTP listener.
//! - `protocol: http` upstreams ([`Protocol::Http`]) are served on the same
//!   workers as a reverse proxy: hyper's HTTP/1.1 server on the client side, each
//!   request picked and sent over a per-endpoint pool of keep-alive connections,
//!   with retries, a retry budget and 503/502/504 made here; an `address:` upstream
//!   dials through a `dwara-dns-cache` `DnsCache`. [`headers`] is its header
//!   rewriting.
//! - [`LocalSources`]: lets the composing program serve some upstreams from a
//!   source of its own instead of DNS (`dwara serve`: its name server's records,
//!   by push), via [`Dataplane::set_local_sources`].
//!
//! # Example
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let upstreams: Vec<dwara_proxy::UpstreamConfig> = serde_yaml_ng::from_str(
//!     "- {name: api, listen: 127.0.0.1:9000, dns_discovery: {hostname: api.weave.local, port: 8080}}",
//! )?;
//! dwara_proxy::validate_upstreams(&upstreams)?;
//! let dataplane = dwara_proxy::Dataplane::new();
//! dataplane.apply(&upstreams).await?; // generation 1: listening on 127.0.0.1:9000
//! let routes = dataplane.router(); // GET /upstreams, for the caller's HTTP listener
//! # drop(routes);
//! dataplane.shutdown(std::time::Duration::from_secs(10)).await;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod build;
mod config;
mod dataplane;
mod error;
mod forward;
pub mod headers;
mod http;
mod http_metrics;
mod http_stats;
mod metrics;
pub mod plan;
mod pool;
mod pump;
mod reverse;
mod workers;

use std::sync::Arc;

pub use config::{
    EjectionSection, HttpLimitsSection, HttpSettings, PoolSection, Protocol, UpstreamConfig,
    split_address, validate_upstreams,
};
pub use dataplane::{Dataplane, Generation, LocalSources, Upstream};
pub use error::Error;
pub use plan::plan;

impl Dataplane {
    /// `GET /upstreams`: every upstream's endpoints, generation and last resolution.
    pub fn router(self: &Arc<Self>) -> axum::Router {
        http::router(self.clone())
    }

    /// Registers the dataplane's metrics (per-upstream connections, bytes, endpoints,
    /// picks, resolutions; the configuration generation).
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        registry.register_collector(Box::new(metrics::DataplaneCollector {
            dataplane: self.clone(),
        }));
    }
}
