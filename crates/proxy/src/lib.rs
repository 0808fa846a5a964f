#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod build;
mod config;
mod dataplane;
mod early;
mod error;
mod forward;
pub mod headers;
mod http;
mod http_metrics;
mod http_stats;
mod linger;
mod metrics;
mod outbox;
pub mod plan;
mod pool;
mod pump;
mod reverse;
mod tunnel;
mod upload;
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
