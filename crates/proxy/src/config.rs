//! The `upstreams:` entries of the configuration file and their validation.
//!
//! Parsing is strict (unknown keys are errors, through serde) and validation names the
//! offending key by its path relative to the list, e.g.
//! `upstreams[0].dns_discovery.port: must be 1..=65535, got 0`.
//!
//! An upstream is `protocol: tcp` (the default: L4 forwarding) or `protocol: http`
//! (a reverse proxy that balances each request). The keys that only mean something
//! for HTTP are options here, so that validation can refuse them on a TCP upstream
//! instead of silently ignoring them; [`HttpSettings`] resolves them with their
//! defaults. An HTTP upstream may name `address: HOST:PORT` instead of a discovery
//! block: its connections are then dialled through a DNS cache.

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

/// The most tries `max_tries` may allow for one HTTP request.
pub(crate) const MAX_TRIES: u32 = 10;
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
    /// `tcp` (L4, the default) or `http` (per-request balancing).
    #[serde(default)]
    pub protocol: Protocol,
    /// HTTP only, instead of a discovery block: `HOST:PORT`, resolved through a DNS
    /// cache for every new connection.
    #[serde(default)]
    pub address: Option<String>,
    /// HTTP with `address` only: the name servers that resolve it (default: the
    /// system resolver).
    #[serde(default)]
    pub nameservers: Option<Vec<SocketAddr>>,
    /// HTTP only: how long the response head may take once the request has been
    /// sent whole, its body included (default 30000), else 504.
    #[serde(default)]
    pub response_timeout_ms: Option<u64>,
    /// HTTP only: how long a body may bring no byte (default 60000). A request body
    /// the client stops sending gets 408; one the endpoint stops taking, 504; a
    /// response body the endpoint stops sending is cut off (the client connection is
    /// closed, so the client cannot take it for whole).
    #[serde(default)]
    pub body_timeout_ms: Option<u64>,
    /// HTTP only: largest response head (status line and headers) an endpoint may
    /// send, in bytes (default 65536); larger fails the try, as a malformed answer
    /// does (a `502` when no try is left).
    #[serde(default)]
    pub max_response_header_bytes: Option<usize>,
    /// HTTP only, `consistent_hash` only: the request header whose value is the hash
    /// key (default: the client's IP address).
    #[serde(default)]
    pub hash_header: Option<String>,
    /// HTTP only: tries per request, the first included (default 3).
    #[serde(default)]
    pub max_tries: Option<u32>,
    /// HTTP only: the keep-alive connections kept to each endpoint.
    #[serde(default)]
    pub pool: Option<PoolSection>,
    /// HTTP only: limits of the client side.
    #[serde(default)]
    pub limits: Option<HttpLimitsSection>,
}

/// `protocol:` of an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Bytes are forwarded per connection (L4).
    #[default]
    Tcp,
    /// HTTP/1.1: each request is balanced on its own over pooled connections.
    Http,
}

/// `pool:` of an HTTP upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Idle connections kept per endpoint by each worker (default 64; as nginx's
    /// `keepalive`, per worker).
    #[serde(default = "default_max_idle")]
    pub max_idle_per_endpoint: usize,
    /// An idle connection unused this long is closed, in seconds (default 60).
    #[serde(default = "default_idle_timeout_s")]
    pub idle_timeout_s: u64,
}

fn default_max_idle() -> usize {
    64
}

fn default_idle_timeout_s() -> u64 {
    60
}

impl Default for PoolSection {
    fn default() -> Self {
        Self {
            max_idle_per_endpoint: default_max_idle(),
            idle_timeout_s: default_idle_timeout_s(),
        }
    }
}

/// `limits:` of an HTTP upstream: what one client may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpLimitsSection {
    /// A request's head must arrive whole within this, in milliseconds, of the
    /// connection opening or of the previous response's end: a connection with no
    /// request open that long is closed (an idle keep-alive connection, or a head
    /// too slow), or for HTTP/2 shut down with `GOAWAY` (default 10000).
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line and headers) in bytes; larger gets 431
    /// (default 65536).
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: usize,
    /// Client connections open at once; one more is closed at once (default 10000).
    /// A connection that became a tunnel (an `Upgrade`, e.g. WebSocket) still
    /// counts.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// A tunnel (a connection upgraded to another protocol, e.g. WebSocket)
    /// through which no byte has passed either way for this long is closed, in
    /// seconds (default 3600).
    #[serde(default = "default_tunnel_idle_timeout_s")]
    pub tunnel_idle_timeout_s: u64,
    /// A client connection whose client takes no byte of what is written to it for
    /// this long is closed, in milliseconds (default 60000, as nginx's
    /// `send_timeout`): a client that stops reading does not hold its connection
    /// and the endpoint's forever.
    #[serde(default = "default_send_timeout_ms")]
    pub send_timeout_ms: u64,
}

fn default_header_read_timeout_ms() -> u64 {
    10_000
}

fn default_max_header_bytes() -> usize {
    64 * 1024
}

fn default_max_connections() -> usize {
    10_000
}

fn default_tunnel_idle_timeout_s() -> u64 {
    3600
}

fn default_send_timeout_ms() -> u64 {
    60_000
}

impl Default for HttpLimitsSection {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: default_header_read_timeout_ms(),
            max_header_bytes: default_max_header_bytes(),
            max_connections: default_max_connections(),
            tunnel_idle_timeout_s: default_tunnel_idle_timeout_s(),
            send_timeout_ms: default_send_timeout_ms(),
        }
    }
}

/// The HTTP keys of an upstream with their defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSettings {
    /// See [`UpstreamConfig::response_timeout_ms`].
    pub response_timeout: Duration,
    /// See [`UpstreamConfig::body_timeout_ms`].
    pub body_timeout: Duration,
    /// See [`UpstreamConfig::max_response_header_bytes`].
    pub max_response_header_bytes: usize,
    /// See [`UpstreamConfig::hash_header`] (lower case).
    pub hash_header: Option<http::HeaderName>,
    /// See [`UpstreamConfig::max_tries`] (1 to 10).
    pub max_tries: u32,
    /// See [`PoolSection`].
    pub pool: PoolSection,
    /// See [`HttpLimitsSection`].
    pub limits: HttpLimitsSection,
}

impl UpstreamConfig {
    /// The HTTP settings of a (validated) HTTP upstream; `None` for TCP.
    pub fn http_settings(&self) -> Option<HttpSettings> {
        if self.protocol != Protocol::Http {
            return None;
        }
        Some(HttpSettings {
            response_timeout: Duration::from_millis(self.response_timeout_ms.unwrap_or(30_000)),
            body_timeout: Duration::from_millis(self.body_timeout_ms.unwrap_or(60_000)),
            max_response_header_bytes: self
                .max_response_header_bytes
                .unwrap_or_else(default_max_header_bytes),
            hash_header: self
                .hash_header
                .as_deref()
                .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok()),
            max_tries: self.max_tries.unwrap_or(3),
            pool: self.pool.unwrap_or_default(),
            limits: self.limits.unwrap_or_default(),
        })
    }

    /// `address:` split into host and port (validated: [`split_address`]).
    pub fn address_parts(&self) -> Option<(String, u16)> {
        self.address.as_deref().and_then(|a| split_address(a).ok())
    }
}

/// Splits `HOST:PORT` (`[v6]:PORT` for an IPv6 literal). The host is a DNS name
/// or an IP literal, the port 1..=65535.
pub fn split_address(text: &str) -> Result<(String, u16), String> {
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| format!("{text:?} is not HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{text:?}: port {port:?} is not 1..=65535"))?;
    if port == 0 {
        return Err(format!("{text:?}: port 0 cannot be dialled"));
    }
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => {
            v6.parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("{text:?}: {v6:?} is not an IPv6 address"))?;
            v6
        }
        None => host,
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok((host.to_owned(), port));
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!("{text:?}: {host:?} is not a host name"));
    }
    Ok((name.to_ascii_lowercase(), port))
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
        validate_http(up, &at)?;
        let sources = [
            up.dns_discovery.is_some(),
            up.consul.is_some(),
            up.kubernetes.is_some(),
        ]
        .iter()
        .filter(|s| **s)
        .count();
        match (sources, up.address.is_some()) {
            (0, false) => {
                return Err(invalid(
                    at,
                    "needs a discovery block (dns_discovery), or address: with protocol: http",
                ));
            }
            (1, false) | (0, true) => {}
            (_, true) => {
                return Err(invalid(
                    key("address"),
                    "an upstream with address: has no discovery block; pick one",
                ));
            }
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

/// An `address:` upstream has no load balancer: each request takes the DNS
/// cache's addresses in turn, and no address is ejected; `policy` and `ejection`
/// are refused rather than ignored.
fn validate_address_balancing(
    up: &UpstreamConfig,
    key: &dyn Fn(&str) -> String,
) -> Result<(), Error> {
    if up.policy != Policy::RoundRobin {
        return Err(invalid(
            key("policy"),
            "only with a discovery block (with address: each request takes the DNS \
             cache's addresses in turn)",
        ));
    }
    if up.ejection.is_some() {
        return Err(invalid(
            key("ejection"),
            "only with a discovery block (an address: upstream ejects no address)",
        ));
    }
    Ok(())
}

/// The HTTP-only keys: refused on a TCP upstream, range-checked on an HTTP one.
fn validate_http(up: &UpstreamConfig, at: &str) -> Result<(), Error> {
    let key = |k: &str| format!("{at}.{k}");
    if up.protocol == Protocol::Tcp {
        let http_only = [
            ("address", up.address.is_some()),
            ("nameservers", up.nameservers.is_some()),
            ("response_timeout_ms", up.response_timeout_ms.is_some()),
            ("body_timeout_ms", up.body_timeout_ms.is_some()),
            (
                "max_response_header_bytes",
                up.max_response_header_bytes.is_some(),
            ),
            ("hash_header", up.hash_header.is_some()),
            ("max_tries", up.max_tries.is_some()),
            ("pool", up.pool.is_some()),
            ("limits", up.limits.is_some()),
        ];
        if let Some((k, _)) = http_only.iter().find(|(_, set)| *set) {
            return Err(invalid(
                key(k),
                "only for protocol: http (this upstream is tcp)",
            ));
        }
        return Ok(());
    }
    if let Some(address) = &up.address {
        split_address(address).map_err(|m| invalid(key("address"), m))?;
    }
    if up.nameservers.is_some() && up.address.is_none() {
        return Err(invalid(
            key("nameservers"),
            "only with address: (a discovery block has its own nameservers)",
        ));
    }
    for (k, value) in [
        ("response_timeout_ms", up.response_timeout_ms),
        ("body_timeout_ms", up.body_timeout_ms),
    ] {
        if let Some(ms) = value
            && (ms == 0 || ms > 3_600_000)
        {
            return Err(invalid(key(k), format!("must be 1..=3600000, got {ms}")));
        }
    }
    if let Some(n) = up.max_response_header_bytes {
        header_bytes(n, &key("max_response_header_bytes"))?;
    }
    if let Some(h) = &up.hash_header {
        if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
            return Err(invalid(
                key("hash_header"),
                format!("{h:?} is not a header name"),
            ));
        }
        if up.policy != Policy::ConsistentHash {
            return Err(invalid(
                key("hash_header"),
                "only with policy: consistent_hash",
            ));
        }
    }
    if up.address.is_some() {
        validate_address_balancing(up, &key)?;
    }
    if let Some(n) = up.max_tries
        && !(1..=MAX_TRIES).contains(&n)
    {
        return Err(invalid(
            key("max_tries"),
            format!("must be 1..={MAX_TRIES}, got {n}"),
        ));
    }
    if let Some(p) = up.pool {
        if p.max_idle_per_endpoint > 100_000 {
            return Err(invalid(
                key("pool.max_idle_per_endpoint"),
                format!("must be 0..=100000, got {}", p.max_idle_per_endpoint),
            ));
        }
        if p.idle_timeout_s == 0 || p.idle_timeout_s > 86_400 {
            return Err(invalid(
                key("pool.idle_timeout_s"),
                format!("must be 1..=86400, got {}", p.idle_timeout_s),
            ));
        }
    }
    if let Some(l) = up.limits {
        validate_limits(&l, &key)?;
    }
    Ok(())
}

/// A bound on a request or response head, in bytes, range-checked.
fn header_bytes(n: usize, key: &str) -> Result<(), Error> {
    if (1024..=1024 * 1024).contains(&n) {
        Ok(())
    } else {
        Err(invalid(
            key.to_owned(),
            format!("must be 1024..=1048576, got {n}"),
        ))
    }
}

/// `limits:` of an HTTP upstream, range-checked.
fn validate_limits(l: &HttpLimitsSection, key: &dyn Fn(&str) -> String) -> Result<(), Error> {
    if l.header_read_timeout_ms == 0 || l.header_read_timeout_ms > 600_000 {
        return Err(invalid(
            key("limits.header_read_timeout_ms"),
            format!("must be 1..=600000, got {}", l.header_read_timeout_ms),
        ));
    }
    header_bytes(l.max_header_bytes, &key("limits.max_header_bytes"))?;
    if l.max_connections == 0 {
        return Err(invalid(key("limits.max_connections"), "must be at least 1"));
    }
    if l.send_timeout_ms == 0 || l.send_timeout_ms > 3_600_000 {
        return Err(invalid(
            key("limits.send_timeout_ms"),
            format!("must be 1..=3600000, got {}", l.send_timeout_ms),
        ));
    }
    if l.tunnel_idle_timeout_s == 0 || l.tunnel_idle_timeout_s > 604_800 {
        return Err(invalid(
            key("limits.tunnel_idle_timeout_s"),
            format!("must be 1..=604800, got {}", l.tunnel_idle_timeout_s),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Result<(), String> {
        let ups: Vec<UpstreamConfig> = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        validate_upstreams(&ups).map_err(|e| e.to_string())
    }

    #[test]
    fn addresses_split_or_say_why_not() {
        assert_eq!(split_address("Web.Local:80"), Ok(("web.local".into(), 80)));
        assert_eq!(
            split_address("10.0.0.1:8080"),
            Ok(("10.0.0.1".into(), 8080))
        );
        assert_eq!(split_address("[::1]:8080"), Ok(("::1".into(), 8080)));
        for bad in [
            "web",
            "web:0",
            "web:99999",
            ":80",
            "-a.b:80",
            "a..b:80",
            "[zz]:80",
            "a b:80",
        ] {
            assert!(split_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn http_keys_are_checked_with_their_paths() {
        let base = "- {name: a, listen: 127.0.0.1:9000, ";
        let ok =
            format!("{base}protocol: http, address: web.local:80, nameservers: [127.0.0.1:53]}}");
        assert_eq!(check(&ok), Ok(()));
        let ok = format!("{base}protocol: http, address: web.local:80, policy: round_robin}}");
        assert_eq!(check(&ok), Ok(()));
        let cases = [
            (
                "address: web.local:80}",
                "upstreams[0].address: only for protocol: http",
            ),
            (
                "response_timeout_ms: 5, dns_discovery: {hostname: a.b, port: 1}}",
                "upstreams[0].response_timeout_ms: only for protocol: http",
            ),
            (
                "protocol: http, address: web}",
                "upstreams[0].address: \"web\" is not HOST:PORT",
            ),
            (
                "protocol: http, address: a:1, dns_discovery: {hostname: a.b, port: 1}}",
                "upstreams[0].address: an upstream with address: has no discovery block",
            ),
            (
                "protocol: http, nameservers: [127.0.0.1:53], dns_discovery: {hostname: a.b, port: 1}}",
                "upstreams[0].nameservers: only with address:",
            ),
            (
                "protocol: http, address: a:1, response_timeout_ms: 0}",
                "upstreams[0].response_timeout_ms: must be 1..=3600000, got 0",
            ),
            (
                "body_timeout_ms: 5, dns_discovery: {hostname: a.b, port: 1}}",
                "upstreams[0].body_timeout_ms: only for protocol: http",
            ),
            (
                "protocol: http, address: a:1, body_timeout_ms: 3600001}",
                "upstreams[0].body_timeout_ms: must be 1..=3600000, got 3600001",
            ),
            (
                "max_response_header_bytes: 4096, dns_discovery: {hostname: a.b, port: 1}}",
                "upstreams[0].max_response_header_bytes: only for protocol: http",
            ),
            (
                "protocol: http, address: a:1, max_response_header_bytes: 1023}",
                "upstreams[0].max_response_header_bytes: must be 1024..=1048576, got 1023",
            ),
            (
                "protocol: http, address: a:1, hash_header: x-user}",
                "upstreams[0].hash_header: only with policy: consistent_hash",
            ),
            (
                "protocol: http, address: a:1, policy: consistent_hash, hash_header: x-user}",
                "upstreams[0].policy: only with a discovery block",
            ),
            (
                "protocol: http, address: a:1, policy: p2c}",
                "upstreams[0].policy: only with a discovery block",
            ),
            (
                "protocol: http, address: a:1, ejection: {consecutive_failures: 3}}",
                "upstreams[0].ejection: only with a discovery block",
            ),
            (
                "protocol: http, address: a:1, max_tries: 0}",
                "upstreams[0].max_tries: must be 1..=10",
            ),
            (
                "protocol: http, address: a:1, pool: {idle_timeout_s: 0}}",
                "upstreams[0].pool.idle_timeout_s: must be 1..=86400",
            ),
            (
                "protocol: http, address: a:1, limits: {max_header_bytes: 10}}",
                "upstreams[0].limits.max_header_bytes: must be 1024..=1048576",
            ),
            (
                "protocol: http, address: a:1, limits: {tunnel_idle_timeout_s: 0}}",
                "upstreams[0].limits.tunnel_idle_timeout_s: must be 1..=604800, got 0",
            ),
            (
                "protocol: http, address: a:1, limits: {send_timeout_ms: 0}}",
                "upstreams[0].limits.send_timeout_ms: must be 1..=3600000, got 0",
            ),
        ];
        for (tail, want) in cases {
            let got = check(&format!("{base}{tail}")).unwrap_err();
            assert!(got.starts_with(want), "{tail}: {got}");
        }
    }

    #[test]
    fn http_settings_fill_in_the_defaults() {
        let ups: Vec<UpstreamConfig> = serde_yaml_ng::from_str(
            "- {name: a, listen: 127.0.0.1:9000, protocol: http, policy: consistent_hash, hash_header: X-User, dns_discovery: {hostname: a.b, port: 1}}
- {name: b, listen: 127.0.0.1:9001, protocol: http, address: a:1}",
        )
        .unwrap();
        let s = ups[0].http_settings().unwrap();
        assert_eq!(s.response_timeout, Duration::from_secs(30));
        assert_eq!(s.max_tries, 3);
        assert_eq!(s.hash_header.unwrap().as_str(), "x-user");
        assert_eq!(s.pool, PoolSection::default());
        assert_eq!(s.limits.tunnel_idle_timeout_s, 3600);
        assert_eq!(s.limits.send_timeout_ms, 60_000);
        assert_eq!(s.body_timeout, Duration::from_secs(60));
        assert_eq!(ups[1].address_parts(), Some(("a".into(), 1)));
    }
}
