//! The `upstreams:` entries of the configuration file and their validation.
//!
//! Parsing is strict (unknown keys are errors, through serde) and validation names the
//! offending key by its path relative to the list, e.g.
//! `upstreams[0].dns_discovery.port: must be 1..=65535, got 0`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use dwara_discovery::DiscoveryError;
use dwara_discovery_consul::ConsulConfig;
use dwara_discovery_dns::DnsDiscoveryConfig;
use dwara_discovery_k8s::EndpointSliceConfig;
use dwara_lb::Policy;
use serde::{Deserialize, Serialize};

use crate::Error;

/// One entry of `upstreams:`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Unique name (logs, metrics, status).
    pub name: String,
    /// TCP listen address.
    pub listen: SocketAddr,
    /// Load-balancing policy.
    #[serde(default)]
    pub policy: Policy,
    /// DNS discovery.
    #[serde(default)]
    pub dns_discovery: Option<DnsDiscoveryConfig>,
    /// Consul discovery (not supported yet: rejected by validation).
    #[serde(default)]
    pub consul: Option<ConsulConfig>,
    /// Kubernetes EndpointSlice discovery (not supported yet: rejected by validation).
    #[serde(default)]
    pub kubernetes: Option<EndpointSliceConfig>,
    /// Timeout of one connection attempt to an endpoint, in milliseconds.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Passive ejection of endpoints that keep failing to connect; off when absent.
    #[serde(default)]
    pub ejection: Option<EjectionSection>,
}

fn default_connect_timeout_ms() -> u64 {
    2000
}

/// `ejection:` of an upstream: after `consecutive_failures` failed connection
/// attempts in a row to one endpoint, picks skip it for `cool_down_s` seconds (unless
/// every endpoint is ejected). Defaults are Envoy's outlier-detection ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EjectionSection {
    /// Failures in a row that eject an endpoint (default 5).
    #[serde(default = "default_consecutive_failures")]
    pub consecutive_failures: u32,
    /// How long an ejected endpoint is skipped, in seconds (default 30).
    #[serde(default = "default_cool_down_s")]
    pub cool_down_s: u64,
}

fn default_consecutive_failures() -> u32 {
    5
}

fn default_cool_down_s() -> u64 {
    30
}

impl EjectionSection {
    /// The load balancer's form of it.
    pub fn to_lb(self) -> dwara_lb::EjectionConfig {
        dwara_lb::EjectionConfig::new(
            self.consecutive_failures,
            Duration::from_secs(self.cool_down_s),
        )
    }
}

fn invalid(key: String, message: impl Into<String>) -> Error {
    Error::InvalidConfig {
        key,
        message: message.into(),
    }
}

/// Checks every upstream and the list as a whole (unique names and listen
/// addresses). The first problem is returned, its key a path such as
/// `upstreams[1].listen`.
pub fn validate_upstreams(upstreams: &[UpstreamConfig]) -> Result<(), Error> {
    let mut names = HashSet::new();
    let mut listens = HashSet::new();
    for (i, up) in upstreams.iter().enumerate() {
        let at = format!("upstreams[{i}]");
        let key = |k: &str| format!("{at}.{k}");
        if up.name.trim().is_empty() {
            return Err(invalid(key("name"), "must not be empty"));
        }
        if !names.insert(up.name.as_str()) {
            return Err(invalid(
                key("name"),
                format!("duplicate upstream name {:?}", up.name),
            ));
        }
        if up.listen.port() == 0 {
            return Err(invalid(
                key("listen"),
                "port 0 is not a fixed listen address",
            ));
        }
        if up.connect_timeout_ms == 0 || up.connect_timeout_ms > 600_000 {
            return Err(invalid(
                key("connect_timeout_ms"),
                format!("must be 1..=600000, got {}", up.connect_timeout_ms),
            ));
        }
        if let Some(e) = up.ejection {
            if e.consecutive_failures == 0 {
                return Err(invalid(
                    key("ejection.consecutive_failures"),
                    "must be at least 1 (leave out the ejection block to turn ejection off)",
                ));
            }
            if e.cool_down_s == 0 || e.cool_down_s > 86_400 {
                return Err(invalid(
                    key("ejection.cool_down_s"),
                    format!("must be 1..=86400, got {}", e.cool_down_s),
                ));
            }
        }
        if !listens.insert(up.listen) {
            return Err(invalid(
                key("listen"),
                format!("{} is used by another upstream", up.listen),
            ));
        }
        let sources = [
            up.dns_discovery.is_some(),
            up.consul.is_some(),
            up.kubernetes.is_some(),
        ]
        .iter()
        .filter(|s| **s)
        .count();
        match sources {
            0 => return Err(invalid(at, "needs a discovery block (dns_discovery)")),
            1 => {}
            _ => {
                return Err(invalid(at, "has more than one discovery block; pick one"));
            }
        }
        let in_block = |block: &str, e: DiscoveryError| match e {
            DiscoveryError::InvalidConfig { key: k, message } => {
                invalid(format!("{at}.{block}.{k}"), message)
            }
            other => Error::Discovery {
                key: format!("{at}.{block}"),
                source: other,
            },
        };
        if let Some(dns) = &up.dns_discovery {
            dns.validate().map_err(|e| in_block("dns_discovery", e))?;
        }
        if let Some(consul) = &up.consul {
            consul.validate().map_err(|e| in_block("consul", e))?;
        }
        if let Some(k8s) = &up.kubernetes {
            k8s.validate().map_err(|e| in_block("kubernetes", e))?;
        }
    }
    Ok(())
}
