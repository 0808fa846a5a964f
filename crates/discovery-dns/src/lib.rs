#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use dwara_discovery::{DiscoveryError, DiscoverySource, Resolution, UpstreamDiscovery};
use dwara_lb::{Endpoint, EndpointSet, UpstreamLb};
use dwara_resolver::{DnsResolver, ResolveError, ResolverConfig};

pub use config::{DnsDiscoveryConfig, RecordType, validate_hostname};

/// Resolves the SRV targets that an answer names without giving their addresses
/// (see [`DnsSource::with_target_resolver`]).
#[async_trait::async_trait]
pub trait TargetResolver: Send + Sync + std::fmt::Debug {
    /// The addresses of `host` with their TTLs in seconds; `ResolveError::NoRecords`
    /// when it has none (the target is then skipped).
    async fn resolve(&self, host: &str) -> Result<Vec<(IpAddr, u32)>, ResolveError>;
}

/// Resolves one host name (A/AAAA with a fixed port, or SRV) into endpoints.
#[derive(Debug, Clone)]
pub struct DnsSource {
    hostname: String,
    record_type: RecordType,
    port: Option<u16>,
    resolver: DnsResolver,
    /// Resolves SRV targets given without addresses, instead of `resolver`.
    targets: Option<Arc<dyn TargetResolver>>,
}

impl DnsSource {
    /// Validates `config` and builds a source with its own resolver (the configured
    /// name servers, else the system's).
    pub fn new(config: &DnsDiscoveryConfig) -> Result<Self, DiscoveryError> {
        config.validate()?;
        let resolver = DnsResolver::new(ResolverConfig {
            nameservers: config.nameservers.clone(),
            ..ResolverConfig::default()
        })
        .map_err(|e| DiscoveryError::Start {
            source_name: describe(config.record_type, &config.hostname, config.port_u16()),
            source: Box::new(e),
        })?;
        Self::with_resolver(config, resolver)
    }

    /// Validates `config` and builds a source over an existing resolver
    /// (`config.nameservers` is then ignored).
    pub fn with_resolver(
        config: &DnsDiscoveryConfig,
        resolver: DnsResolver,
    ) -> Result<Self, DiscoveryError> {
        config.validate()?;
        Ok(Self {
            hostname: config.hostname.clone(),
            record_type: config.record_type,
            port: config.port_u16(),
            resolver,
            targets: None,
        })
    }

    /// The same source, resolving the SRV targets that answers name without their
    /// addresses in the additional section through `targets` (e.g. a DNS cache on
    /// the dial path) rather than with a query of its own per refresh.
    #[must_use]
    pub fn with_target_resolver(mut self, targets: Arc<dyn TargetResolver>) -> Self {
        self.targets = Some(targets);
        self
    }

    fn failure(&self, e: ResolveError) -> DiscoveryError {
        DiscoveryError::resolve(self.describe(), e.kind(), e)
    }
}

/// `dns A api.weave.local:8080`, or `dns SRV _http._tcp.api.local`.
fn describe(record_type: RecordType, hostname: &str, port: Option<u16>) -> String {
    match port {
        Some(port) if record_type != RecordType::SRV => {
            format!("dns {record_type} {hostname}:{port}")
        }
        _ => format!("dns {record_type} {hostname}"),
    }
}

fn min_ttl(ttls: impl Iterator<Item = u32>) -> Option<Duration> {
    ttls.min().map(|t| Duration::from_secs(u64::from(t)))
}

#[async_trait::async_trait]
impl DiscoverySource for DnsSource {
    fn describe(&self) -> String {
        describe(self.record_type, &self.hostname, self.port)
    }

    async fn resolve(&self) -> Result<Resolution, DiscoveryError> {
        let result = match self.record_type {
            RecordType::A | RecordType::AAAA => {
                let port = self.port.unwrap_or_default();
                let answer = if self.record_type == RecordType::A {
                    self.resolver.lookup_a(&self.hostname).await
                } else {
                    self.resolver.lookup_aaaa(&self.hostname).await
                };
                answer.map(|addrs| Resolution {
                    ttl: min_ttl(addrs.iter().map(|(_, ttl)| *ttl)),
                    endpoints: addrs
                        .iter()
                        .map(|(ip, _)| Endpoint::new(SocketAddr::new(*ip, port)))
                        .collect(),
                })
            }
            RecordType::SRV => match &self.targets {
                Some(t) => {
                    self.resolver
                        .lookup_srv_with(
                            &self.hostname,
                            |host| async move { t.resolve(&host).await },
                        )
                        .await
                }
                None => self.resolver.lookup_srv(&self.hostname).await,
            }
            .map(|targets| Resolution {
                ttl: min_ttl(targets.iter().map(|t| t.ttl)),
                endpoints: targets
                    .iter()
                    .map(|t| {
                        Endpoint::new(SocketAddr::new(t.ip, t.port))
                            .with_weight(t.weight)
                            .with_priority(t.priority)
                    })
                    .collect(),
            }),
        };
        match result {
            Ok(res) => Ok(res),
            Err(e @ ResolveError::NoRecords { .. }) => Ok(Resolution {
                endpoints: EndpointSet::empty(),
                ttl: e.negative_ttl().map(|t| Duration::from_secs(u64::from(t))),
            }),
            Err(e) => Err(self.failure(e)),
        }
    }
}

/// Builds the discovery of one upstream from its `dns_discovery` block.
pub fn upstream_discovery(
    name: &str,
    config: &DnsDiscoveryConfig,
    lb: Arc<UpstreamLb>,
) -> Result<UpstreamDiscovery, DiscoveryError> {
    let source = DnsSource::new(config)?;
    Ok(UpstreamDiscovery::new(
        name,
        lb,
        Arc::new(source),
        config.refresh_policy(),
    ))
}
