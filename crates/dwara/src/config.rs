//! The YAML configuration file: the name-server half, the upstreams, or both.
//!
//! Parsing is strict (unknown keys are errors) and validation names the offending
//! key by its path, e.g. `upstreams[0].dns_discovery.port: must be 1..=65535, got 0`.
//! A parsed and validated [`Config`] is immutable; a reload builds a new one. Each
//! section belongs to the component it configures: `upstreams:` entries are
//! [`dwara_proxy::UpstreamConfig`]s, validated by `dwara-proxy`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use dwara_proxy::{EjectionSection, UpstreamConfig};
use serde::Deserialize;

/// Why a configuration file was not accepted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid YAML for a configuration (unknown key, wrong type…).
    #[error("{}", one_line(.source))]
    Parse {
        /// The YAML error (it names the key and the position).
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// A value is out of range or inconsistent; the message starts with its key.
    #[error(transparent)]
    Invalid(#[from] dwara_proxy::Error),
    /// A value of the `nameserver:`, `cluster:` or `docker:` section is invalid.
    #[error("{section}.{key}: {message}")]
    Section {
        /// The section.
        section: &'static str,
        /// The key under it.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

fn one_line(e: &serde_yaml_ng::Error) -> String {
    e.to_string().replace('\n', " ")
}

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
    /// Threads that accept and forward the upstreams' connections, each on its own
    /// socket per listen address (`--l4-workers`; default: one per core). Read at
    /// start; a reload does not change it.
    #[serde(default)]
    pub l4_workers: Option<u16>,
    /// Replication of the name server's records to its peers (needs the name server).
    #[serde(default)]
    pub cluster: Option<ClusterSection>,
    /// The Docker updater (needs the name server).
    #[serde(default)]
    pub docker: Option<DockerSection>,
}

/// `cluster:` — every key optional; command-line flags override them. Gossip runs
/// when `gossip_listen` (or `--gossip-listen`) is set.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// This node's id, unique in the cluster (`--node-id`; default: the host name).
    pub node_id: Option<String>,
    /// UDP gossip listen address (`--gossip-listen`).
    pub gossip_listen: Option<SocketAddr>,
    /// The address peers reach this node at (`--gossip-advertise`).
    pub gossip_advertise: Option<SocketAddr>,
    /// Seed peers, `host:port` (`--peer`).
    #[serde(default)]
    pub peers: Vec<String>,
    /// Only nodes with the same id talk to each other (`--cluster-id`).
    pub cluster_id: Option<String>,
    /// Milliseconds between periodic gossip rounds (`--gossip-interval-ms`).
    pub gossip_interval_ms: Option<u64>,
    /// File holding the base64 cluster key (`--gossip-key-file`).
    pub gossip_key_file: Option<PathBuf>,
    /// Live peers a local change is pushed to at once (`--gossip-push-fanout`,
    /// default 16).
    pub push_fanout: Option<u64>,
    /// Failure detector: phi above which a peer is declared dead (default 8).
    pub phi_threshold: Option<f64>,
    /// Seconds a dead peer is remembered, its entries hidden, before they are
    /// forgotten (default 3600).
    pub dead_node_grace_s: Option<u64>,
}

/// `docker:` — every key optional; command-line flags override them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerSection {
    /// `auto` (on when the socket exists), `on` or `off` (`--docker`).
    pub mode: Option<String>,
    /// The daemon's unix socket (`--docker-socket`).
    pub socket: Option<PathBuf>,
    /// Register addresses of this network only (`--docker-network`).
    pub network: Option<String>,
    /// Which names to register: `hostname`, `name`, `aliases`, comma-separated
    /// (`--docker-names`).
    pub names: Option<String>,
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
    /// Seconds a tombstone is kept before it is forgotten (`--tombstone-grace`).
    pub tombstone_grace_s: Option<u64>,
    /// Where HTTP registrations are stored to survive restarts (`--data-dir`).
    pub data_dir: Option<PathBuf>,
    /// Seconds a DNS/TCP connection may be silent, or take over one message
    /// (`--dns-tcp-idle-timeout`).
    pub dns_tcp_idle_timeout_s: Option<u64>,
    /// Seconds after which a DNS/TCP connection is closed (`--dns-tcp-lifetime`).
    pub dns_tcp_lifetime_s: Option<u64>,
    /// DNS/TCP connections open at once (`--dns-tcp-max-connections`).
    pub dns_tcp_max_connections: Option<u64>,
    /// Seconds an HTTP client may take over a request's headers, then its body
    /// (`--http-read-timeout`).
    pub http_read_timeout_s: Option<u64>,
    /// HTTP connections open at once (`--http-max-connections`).
    pub http_max_connections: Option<u64>,
    /// Largest HTTP request body in bytes (`--http-max-body`).
    pub http_max_body: Option<u64>,
    /// DNS clients allowed besides loopback: CIDR prefixes and/or `local` (the
    /// subnets of this host's interfaces) (`--dns-allow`; default `[local]`).
    #[serde(default)]
    pub dns_allow: Vec<String>,
    /// Clients outside `dns_allow` still get the local domain's answers
    /// (`--dns-allow-local-any`).
    pub dns_allow_local_any: Option<bool>,
    /// DNS/UDP replies per second to one client /24 (IPv6 /56), loopback exempt;
    /// 0: no limit (`--dns-rate-limit`).
    pub dns_rate_limit: Option<u32>,
    /// Every Nth rate-limited query gets an empty truncated reply; 0: none
    /// (`--dns-rate-limit-slip`).
    pub dns_rate_limit_slip: Option<u32>,
    /// File holding the bearer token the HTTP API's writes need (`--http-token-file`).
    pub http_token_file: Option<PathBuf>,
    /// Reads need the token too (`--http-token-reads`).
    pub http_token_reads: Option<bool>,
    /// Serve the HTTP API on a non-loopback address without a token (`--http-insecure`).
    pub http_insecure: Option<bool>,
    /// Whether a name none of whose entries passes its check answers its unhealthy
    /// ones (`--health-fail-open`).
    pub health_fail_open: Option<bool>,
    /// Milliseconds between two checks of a `check=tcp` entry
    /// (`--check-interval-ms`).
    pub check_interval_ms: Option<u64>,
    /// Failed checks in a row that make a `check=tcp` entry unhealthy
    /// (`--check-misses`).
    pub check_misses: Option<u32>,
}

/// The ranges of the `nameserver:` limits, the same as their flags'.
const NAMESERVER_LIMITS: [(&str, u64, u64); 6] = [
    ("dns_tcp_idle_timeout_s", 1, 3600),
    ("dns_tcp_lifetime_s", 1, 86400),
    ("dns_tcp_max_connections", 1, 1_000_000),
    ("http_read_timeout_s", 1, 3600),
    ("http_max_connections", 1, 1_000_000),
    ("http_max_body", 1, 1 << 30),
];

/// The largest `check_interval_ms` (and `--check-interval-ms`): one day.
pub const MAX_CHECK_INTERVAL_MS: u64 = 86_400_000;
/// The largest `check_misses` (and `--check-misses`).
pub const MAX_CHECK_MISSES: u32 = 1000;

/// The largest `dns_rate_limit_slip` (and `--dns-rate-limit-slip`).
pub const MAX_SLIP: u32 = 100;

impl NameServerSection {
    fn limit(&self, key: &str) -> Option<u64> {
        match key {
            "dns_tcp_idle_timeout_s" => self.dns_tcp_idle_timeout_s,
            "dns_tcp_lifetime_s" => self.dns_tcp_lifetime_s,
            "dns_tcp_max_connections" => self.dns_tcp_max_connections,
            "http_read_timeout_s" => self.http_read_timeout_s,
            "http_max_connections" => self.http_max_connections,
            "http_max_body" => self.http_max_body,
            _ => None,
        }
    }
}

impl Config {
    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|source| ConfigError::Parse { source })?
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        dwara_proxy::validate_upstreams(&self.upstreams)?;
        if self.l4_workers == Some(0) {
            return Err(ConfigError::Invalid(dwara_proxy::Error::InvalidConfig {
                key: "l4_workers".into(),
                message: "must be at least 1 (leave it out for one per core)".into(),
            }));
        }
        if let Some(ns) = &self.nameserver {
            validate_nameserver(ns)?;
        }
        if let Some(c) = &self.cluster {
            validate_cluster(c)?;
        }
        if let Some(d) = &self.docker {
            validate_docker(d)?;
        }
        Ok(())
    }
}

/// The `nameserver:` section's values that serde cannot check.
fn validate_nameserver(ns: &NameServerSection) -> Result<(), ConfigError> {
    if ns.ttl == Some(0) {
        // TTL 0 is legal DNS but defeats every cache in front of us; say so.
        tracing::warn!("nameserver.ttl is 0: answers will not be cached by clients");
    }
    if ns.tombstone_grace_s == Some(0) {
        return Err(ConfigError::Section {
            section: "nameserver",
            key: "tombstone_grace_s",
            message: "must be at least 1 second".into(),
        });
    }
    for entry in &ns.dns_allow {
        entry
            .parse::<dwara_nameserver::AllowEntry>()
            .map_err(|e| ConfigError::Section {
                section: "nameserver",
                key: "dns_allow",
                message: e.to_string(),
            })?;
    }
    if let Some(slip) = ns.dns_rate_limit_slip.filter(|s| *s > MAX_SLIP) {
        return Err(ConfigError::Section {
            section: "nameserver",
            key: "dns_rate_limit_slip",
            message: format!("must be 0..={MAX_SLIP}, got {slip}"),
        });
    }
    if ns.http_token_reads == Some(true) && ns.http_token_file.is_none() {
        return Err(ConfigError::Section {
            section: "nameserver",
            key: "http_token_reads",
            message: "needs http_token_file".into(),
        });
    }
    if let Some(v) = ns
        .check_interval_ms
        .filter(|v| !(1..=MAX_CHECK_INTERVAL_MS).contains(v))
    {
        return Err(ConfigError::Section {
            section: "nameserver",
            key: "check_interval_ms",
            message: format!("must be 1..={MAX_CHECK_INTERVAL_MS}, got {v}"),
        });
    }
    if let Some(v) = ns
        .check_misses
        .filter(|v| !(1..=MAX_CHECK_MISSES).contains(v))
    {
        return Err(ConfigError::Section {
            section: "nameserver",
            key: "check_misses",
            message: format!("must be 1..={MAX_CHECK_MISSES}, got {v}"),
        });
    }
    for (key, min, max) in NAMESERVER_LIMITS {
        if let Some(v) = ns.limit(key).filter(|v| !(min..=max).contains(v)) {
            return Err(ConfigError::Section {
                section: "nameserver",
                key,
                message: format!("must be {min}..={max}, got {v}"),
            });
        }
    }
    Ok(())
}

/// The `cluster:` section's values that serde cannot check.
fn validate_cluster(c: &ClusterSection) -> Result<(), ConfigError> {
    if c.gossip_interval_ms == Some(0) {
        return Err(section(
            "cluster",
            "gossip_interval_ms",
            "must be at least 1".into(),
        ));
    }
    if c.push_fanout == Some(0) {
        return Err(section(
            "cluster",
            "push_fanout",
            "must be at least 1 (0 would leave every change to the periodic rounds)".into(),
        ));
    }
    if c.node_id
        .as_deref()
        .is_some_and(|n| n.is_empty() || n.len() > 255)
    {
        return Err(section(
            "cluster",
            "node_id",
            "must be 1 to 255 bytes".into(),
        ));
    }
    if c.phi_threshold.is_some_and(|p| !(p.is_finite() && p > 0.0)) {
        return Err(section(
            "cluster",
            "phi_threshold",
            "must be a positive number".into(),
        ));
    }
    Ok(())
}

/// The `docker:` section's values that serde cannot check.
fn validate_docker(d: &DockerSection) -> Result<(), ConfigError> {
    if let Some(mode) = &d.mode {
        mode.parse::<dwara_docker::DockerMode>()
            .map_err(|e| section("docker", "mode", e.to_string()))?;
    }
    if let Some(names) = &d.names {
        names
            .parse::<dwara_docker::NameSources>()
            .map_err(|e| section("docker", "names", e.to_string()))?;
    }
    Ok(())
}

/// A `ConfigError` for `key` of `section`.
fn section(section: &'static str, key: &'static str, message: String) -> ConfigError {
    ConfigError::Section {
        section,
        key,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dwara_lb::Policy;

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
        assert_eq!(c.l4_workers, None);
        assert_eq!(Config::parse("l4_workers: 3").unwrap().l4_workers, Some(3));
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
        assert_eq!(c.l4_workers, Some(2));
    }

    #[test]
    fn the_readme_http_example_is_valid() {
        let readme = include_str!("../../../README.md");
        let section = &readme[readme.find("## HTTP upstreams").unwrap()..];
        let start = section.find("```yaml\n").unwrap() + "```yaml\n".len();
        let end = start + section[start..].find("```").unwrap();
        let c = Config::parse(&section[start..end]).unwrap();
        assert_eq!(c.upstreams[0].protocol, dwara_proxy::Protocol::Http);
        let limits = c.upstreams[0].limits.unwrap();
        assert_eq!(limits.tunnel_idle_timeout_s, 3600);
        assert_eq!(limits.send_timeout_ms, 60_000);
        assert_eq!(
            c.upstreams[0].http_settings().unwrap().body_timeout,
            std::time::Duration::from_secs(60)
        );
        assert_eq!(
            c.upstreams[1].address_parts(),
            Some(("api.weave.local".to_owned(), 8080))
        );
    }

    #[test]
    fn the_guard_keys_parse() {
        let c = Config::parse(
            "nameserver:
  dns_allow: [local, 10.0.0.0/8, 'fd00::/8']
  dns_allow_local_any: true
  dns_rate_limit: 500
  dns_rate_limit_slip: 3
  http_token_file: /etc/dwara/token
  http_token_reads: true
  http_insecure: false
  check_interval_ms: 250
  check_misses: 3
",
        )
        .unwrap();
        let ns = c.nameserver.unwrap();
        assert_eq!(
            (ns.check_interval_ms, ns.check_misses),
            (Some(250), Some(3))
        );
        assert_eq!(ns.dns_allow, ["local", "10.0.0.0/8", "fd00::/8"]);
        assert_eq!(ns.dns_rate_limit, Some(500));
        assert_eq!(ns.dns_rate_limit_slip, Some(3));
        assert_eq!(ns.http_token_reads, Some(true));
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
            (
                "cluster:\n  push_fanout: 0\n".to_owned(),
                "cluster.push_fanout: must be at least 1",
            ),
            (
                "nameserver:\n  dns_tcp_idle_timeout_s: 0\n".to_owned(),
                "nameserver.dns_tcp_idle_timeout_s: must be 1..=3600, got 0",
            ),
            (
                "nameserver:\n  http_max_body: 2000000000\n".to_owned(),
                "nameserver.http_max_body: must be 1..=1073741824, got 2000000000",
            ),
            (
                "nameserver:\n  http_max_connections: 0\n".to_owned(),
                "nameserver.http_max_connections: must be 1..=1000000, got 0",
            ),
            (
                "nameserver:\n  dns_allow: [local, 10.0.0.0/33]\n".to_owned(),
                "nameserver.dns_allow: invalid CIDR \"10.0.0.0/33\": an IPv4 prefix length is at most 32",
            ),
            (
                "nameserver:\n  dns_allow: 10.0.0.0/8\n".to_owned(),
                "dns_allow",
            ),
            (
                "nameserver:\n  dns_rate_limit_slip: 101\n".to_owned(),
                "nameserver.dns_rate_limit_slip: must be 0..=100, got 101",
            ),
            (
                "nameserver:\n  http_token_reads: true\n".to_owned(),
                "nameserver.http_token_reads: needs http_token_file",
            ),
            (
                "nameserver:\n  check_interval_ms: 0\n".to_owned(),
                "nameserver.check_interval_ms: must be 1..=86400000, got 0",
            ),
            (
                "nameserver:\n  check_misses: 0\n".to_owned(),
                "nameserver.check_misses: must be 1..=1000, got 0",
            ),
            ("upstream: []\n".to_owned(), "upstream"),
            (
                "l4_workers: 0\n".to_owned(),
                "l4_workers: must be at least 1",
            ),
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
