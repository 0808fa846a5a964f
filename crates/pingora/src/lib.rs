#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use dwara_discovery::refresh::{Decision, decide};
use dwara_discovery::{DiscoveryError, DiscoverySource, RefreshPolicy};
use dwara_discovery_dns::{DnsDiscoveryConfig, DnsSource};
use dwara_lb::{Endpoint, EndpointSet};
use parking_lot::Mutex;
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_load_balancing::Backend;
use pingora_load_balancing::discovery::ServiceDiscovery;
use tracing::{debug, info, warn};

/// A [`ServiceDiscovery`] for `pingora-load-balancing` that asks a dwara
/// [`DiscoverySource`] each time Pingora updates its backends.
///
/// Every [`discover`](ServiceDiscovery::discover) resolves once (bounded by the
/// policy's `resolve_timeout`) and applies the policy the way `dwara serve` does: an
/// answer below `min_endpoints` keeps the previous backends, a failure keeps them
/// with `fail_open` and empties them without it. It never returns an error, so
/// Pingora always takes the answer. SRV weights become backend weights.
#[derive(Debug)]
pub struct DwaraDiscovery {
    source: Arc<dyn DiscoverySource>,
    policy: RefreshPolicy,
    /// The set handed to Pingora last: what a failure or a short answer keeps.
    published: Mutex<EndpointSet>,
}

impl DwaraDiscovery {
    /// Discovery from any dwara source, with `policy`'s `fail_open`,
    /// `min_endpoints` and `resolve_timeout` (its timing fields do not apply: Pingora
    /// calls [`discover`](ServiceDiscovery::discover) every `update_frequency`).
    pub fn new(source: Arc<dyn DiscoverySource>, policy: RefreshPolicy) -> Self {
        Self {
            source,
            policy,
            published: Mutex::new(EndpointSet::empty()),
        }
    }

    /// Discovery from DNS: the `dns_discovery` block's host, record type (A, AAAA
    /// or SRV), port, name servers, `fail_open` and `min_endpoints`.
    pub fn dns(config: &DnsDiscoveryConfig) -> Result<Self, DiscoveryError> {
        let source = DnsSource::new(config)?;
        Ok(Self::new(Arc::new(source), config.refresh_policy()))
    }

    /// The endpoints handed to Pingora last.
    pub fn endpoints(&self) -> EndpointSet {
        self.published.lock().clone()
    }

    async fn resolve(&self) -> Result<dwara_discovery::Resolution, DiscoveryError> {
        match tokio::time::timeout(self.policy.resolve_timeout, self.source.resolve()).await {
            Ok(result) => result,
            Err(_) => Err(DiscoveryError::Timeout {
                source_name: self.source.describe(),
                after: self.policy.resolve_timeout,
            }),
        }
    }
}

fn backend(endpoint: &Endpoint) -> Backend {
    Backend {
        addr: SocketAddr::Inet(endpoint.addr),
        // Weight 0 (allowed by SRV) would take the backend out of Pingora's rotation;
        // dwara's policies treat it as 1 as well.
        weight: usize::from(endpoint.weight.max(1)),
        ext: Default::default(),
    }
}

#[async_trait]
impl ServiceDiscovery for DwaraDiscovery {
    async fn discover(&self) -> pingora_error::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let result = self.resolve().await;
        let mut published = self.published.lock();
        let decision = decide(&self.policy, &published, &result);
        let source = self.source.describe();
        match (&decision, &result) {
            (Decision::Publish(set), _) => {
                info!(%source, endpoints = set.len(), "pingora backends updated");
                *published = set.clone();
            }
            (Decision::Clear, Err(e)) => {
                warn!(%source, error = %e, "discovery failing and fail_open is false: no backends until it recovers");
                *published = EndpointSet::empty();
            }
            (Decision::KeepOnFailure, Err(e)) => {
                warn!(%source, error = %e, kept = published.len(), "discovery failed: keeping the backends");
            }
            (Decision::KeepBelowFloor, Ok(answer)) => {
                warn!(%source, got = answer.endpoints.len(), min_endpoints = self.policy.min_endpoints, kept = published.len(), "answer below min_endpoints: keeping the backends");
            }
            _ => debug!(%source, decision = decision.label(), "pingora backends"),
        }
        let backends = published.iter().map(backend).collect();
        // No health verdicts of our own: Pingora's health checks, if set, decide.
        Ok((backends, HashMap::new()))
    }
}
