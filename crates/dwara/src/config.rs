//! The YAML configuration file: the name-server half, the upstreams, or both.
//!
//! Parsing is strict (unknown keys are errors) and validation names the offending
//! key by its path, e.g. `upstreams[0].dns_discovery.port: must be 1..=65535, got 0`.
//! A parsed and validated [`Config`] is immutable; a reload builds a new one.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use dwara_discovery::DiscoveryConfig;
use dwara_discovery_consul::ConsulConfig;
use dwara_discovery_k8s::EndpointSliceConfig;
use dwara_lb::Policy;
use serde::{Deserialize, Serialize};

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The name-server half; absent: `dwara serve` runs it only if no upstreams are given.
    #[serde(default)]
    pub nameserver: Option<NameServerSection>,
    /// L4 upstreams that follow discovery.
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
}

/// `nameserver:` — every key optional; command-line flags override them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameServerSection {
    /// The served domain (`--domain`).
    pub domain: Option<String>,
    /// DNS listen address (`--dns-listen`).
    pub dns_listen: Option<SocketAddr>,
    /// HTTP listen address (`--http-listen`).
    pub http_listen: Option<SocketAddr>,
    /// TTL of the domain's answers (`--ttl`).
    pub ttl: Option<u32>,
    /// Fallback servers (`--fallback`).
    #[serde(default)]
    pub fallback: Vec<SocketAddr>,
    /// resolv.conf naming the fallback servers (`--resolv-conf`).
    pub resolv_conf: Option<PathBuf>,
    /// Where HTTP registrations are stored to survive restarts (`--data-dir`).
    pub data_dir: Option<PathBuf>,
}

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
    pub dns_discovery: Option<DiscoveryConfig>,
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
            std::time::Duration::from_secs(self.cool_down_s),
        )
    }
}

impl Config {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("config file {}", path.display()))
    }

    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        let mut names = HashSet::new();
        let mut listens = HashSet::new();
        for (i, up) in self.upstreams.iter().enumerate() {
            let at = format!("upstreams[{i}]");
            if up.name.trim().is_empty() {
                bail!("{at}.name: must not be empty");
            }
            if !names.insert(up.name.as_str()) {
                bail!("{at}.name: duplicate upstream name {:?}", up.name);
            }
            if up.listen.port() == 0 {
                bail!("{at}.listen: port 0 is not a fixed listen address");
            }
            if up.connect_timeout_ms == 0 || up.connect_timeout_ms > 600_000 {
                bail!(
                    "{at}.connect_timeout_ms: must be 1..=600000, got {}",
                    up.connect_timeout_ms
                );
            }
            if let Some(e) = up.ejection {
                if e.consecutive_failures == 0 {
                    bail!(
                        "{at}.ejection.consecutive_failures: must be at least 1 \
                         (leave out the ejection block to turn ejection off)"
                    );
                }
                if e.cool_down_s == 0 || e.cool_down_s > 86_400 {
                    bail!(
                        "{at}.ejection.cool_down_s: must be 1..=86400, got {}",
                        e.cool_down_s
                    );
                }
            }
            if !listens.insert(up.listen) {
                bail!("{at}.listen: {} is used by another upstream", up.listen);
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
                0 => bail!("{at}: needs a discovery block (dns_discovery)"),
                1 => {}
                _ => bail!("{at}: has more than one discovery block; pick one"),
            }
            let key_error = |block: &str, e: dwara_discovery::DiscoveryError| match e {
                dwara_discovery::DiscoveryError::InvalidConfig { key, message } => {
                    anyhow::anyhow!("{at}.{block}.{key}: {message}")
                }
                other => anyhow::anyhow!("{at}.{block}: {other}"),
            };
            if let Some(dns) = &up.dns_discovery {
                dns.validate().map_err(|e| key_error("dns_discovery", e))?;
            }
            if let Some(consul) = &up.consul {
                consul.validate().map_err(|e| key_error("consul", e))?;
            }
            if let Some(k8s) = &up.kubernetes {
                k8s.validate().map_err(|e| key_error("kubernetes", e))?;
            }
        }
        if let Some(ns) = &self.nameserver
            && ns.ttl == Some(0)
        {
            // TTL 0 is legal DNS but defeats every cache in front of us; say so.
            tracing::warn!("nameserver.ttl is 0: answers will not be cached by clients");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> String {
        format!("{:#}", Config::parse(yaml).unwrap_err())
    }

    const GOOD: &str = "
nameserver:
  domain: weave.local
  dns_listen: 127.0.0.1:1053
upstreams:
  - name: api
    listen: 127.0.0.1:9000
    policy: p2c
    dns_discovery:
      hostname: api.weave.local
      record_type: A
      port: 8080
      refresh_interval_s: 5
      fail_open: false
      min_endpoints: 2
      nameservers: [127.0.0.1:1053]
  - name: srv
    listen: 127.0.0.1:9001
    dns_discovery:
      hostname: _api._tcp.weave.local
      record_type: SRV
";

    #[test]
    fn a_full_config_parses() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.upstreams.len(), 2);
        assert_eq!(c.upstreams[0].policy, Policy::P2c);
        assert_eq!(c.upstreams[1].policy, Policy::RoundRobin);
        let dns = c.upstreams[0].dns_discovery.as_ref().unwrap();
        assert_eq!(dns.min_endpoints, 2);
        assert!(!dns.fail_open);
        assert_eq!(c.nameserver.unwrap().domain.as_deref(), Some("weave.local"));
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn the_readme_example_is_valid() {
        let readme = include_str!("../../../README.md");
        let section = &readme[readme.find("## L4 upstreams").unwrap()..];
        let start = section.find("```yaml\n").unwrap() + "```yaml\n".len();
        let end = start + section[start..].find("```").unwrap();
        let c = Config::parse(&section[start..end]).unwrap();
        let e = c.upstreams[0].ejection.unwrap();
        assert_eq!((e.consecutive_failures, e.cool_down_s), (5, 30));
    }

    #[test]
    fn errors_name_the_key() {
        let up =
            |block: &str| format!("upstreams:\n  - name: api\n    listen: 127.0.0.1:9000\n{block}");
        for (yaml, want) in [
            (
                up("    dns_discovery:\n      hostname: ''\n      port: 80\n"),
                "upstreams[0].dns_discovery.hostname",
            ),
            (
                up("    dns_discovery:\n      hostname: 'a b'\n      port: 80\n"),
                "upstreams[0].dns_discovery.hostname",
            ),
            (
                up("    dns_discovery:\n      hostname: a.b\n      port: 0\n"),
                "upstreams[0].dns_discovery.port",
            ),
            (
                up("    dns_discovery:\n      hostname: a.b\n      port: 65536\n"),
                "upstreams[0].dns_discovery.port",
            ),
            (
                up(
                    "    dns_discovery:\n      hostname: a.b\n      port: 80\n      refresh_interval_s: 0\n",
                ),
                "refresh_interval_s",
            ),
            (
                up(
                    "    dns_discovery:\n      hostname: a.b\n      port: 80\n      record_type: MX\n",
                ),
                "MX",
            ),
            (
                up("    dns_discovery:\n      hostname: a.b\n      port: 80\n      bogus: 1\n"),
                "bogus",
            ),
            (
                up(
                    "    ejection:\n      consecutive_failures: 0\n    dns_discovery:\n      hostname: a.b\n      port: 80\n",
                ),
                "upstreams[0].ejection.consecutive_failures: must be at least 1",
            ),
            (
                up(
                    "    ejection:\n      cool_down_s: 0\n    dns_discovery:\n      hostname: a.b\n      port: 80\n",
                ),
                "upstreams[0].ejection.cool_down_s: must be 1..=86400, got 0",
            ),
            (
                up(
                    "    ejection:\n      after: 3\n    dns_discovery:\n      hostname: a.b\n      port: 80\n",
                ),
                "after",
            ),
            (
                up("    consul:\n      service: ''\n"),
                "upstreams[0].consul.service: must not be empty",
            ),
            (
                up("    kubernetes:\n      namespace: Prod\n      service: b\n"),
                "upstreams[0].kubernetes.namespace: \"Prod\" is not a valid RFC 1123 label",
            ),
            (
                up("    consul:\n      service: api\n"),
                "consul discovery is not supported yet",
            ),
            (
                up("    kubernetes:\n      namespace: a\n      service: b\n"),
                "kubernetes discovery is not supported yet",
            ),
            (up(""), "needs a discovery block"),
            (
                up(
                    "    policy: fastest\n    dns_discovery:\n      hostname: a.b\n      port: 80\n",
                ),
                "fastest",
            ),
            ("nameserver:\n  domian: x\n".to_owned(), "domian"),
            ("upstream: []\n".to_owned(), "upstream"),
        ] {
            let e = err(&yaml);
            assert!(e.contains(want), "{yaml}\n=> {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn duplicate_names_and_listeners_are_rejected() {
        let dup = "upstreams:
  - name: a
    listen: 127.0.0.1:9000
    dns_discovery: {hostname: a.b, port: 80}
  - name: a
    listen: 127.0.0.1:9001
    dns_discovery: {hostname: a.b, port: 80}
";
        assert!(err(dup).contains("duplicate upstream name"));
        let dup = dup.replace(
            "name: a\n    listen: 127.0.0.1:9001",
            "name: b\n    listen: 127.0.0.1:9000",
        );
        assert!(err(&dup).contains("used by another upstream"));
    }
}
