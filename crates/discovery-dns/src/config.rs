//! The `dns_discovery` configuration block and its validation.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use dwara_discovery::{DiscoveryError, RefreshPolicy};

/// Which records a DNS source asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum RecordType {
    /// IPv4 addresses; the port comes from the configuration.
    #[default]
    #[serde(alias = "a")]
    A,
    /// IPv6 addresses; the port comes from the configuration.
    #[serde(alias = "aaaa")]
    AAAA,
    /// SRV records; ports, weights and priorities come from the records.
    #[serde(alias = "srv")]
    SRV,
}

impl FromStr for RecordType {
    type Err = DiscoveryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_uppercase().as_str() {
            "A" => Ok(Self::A),
            "AAAA" => Ok(Self::AAAA),
            "SRV" => Ok(Self::SRV),
            _ => Err(DiscoveryError::InvalidConfig {
                key: "record_type".into(),
                message: format!("unknown record type {s:?} (expected A, AAAA or SRV)"),
            }),
        }
    }
}

impl std::fmt::Display for RecordType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::A => "A",
            Self::AAAA => "AAAA",
            Self::SRV => "SRV",
        })
    }
}

fn default_refresh() -> u64 {
    30
}
fn default_true() -> bool {
    true
}
fn default_min_endpoints() -> usize {
    1
}

/// The `dns_discovery` block of an upstream.
///
/// ```yaml
/// dns_discovery:
///   hostname: api.weave.local
///   record_type: A          # AAAA | SRV
///   port: 8080              # required for A/AAAA; SRV takes ports from the records
///   refresh_interval_s: 30
///   fail_open: true
///   min_endpoints: 1
///   nameservers: [127.0.0.1:1053]   # optional; default: the system resolver
/// ```
///
/// Numbers are read wide and checked by [`DnsDiscoveryConfig::validate`], so a port of
/// 70000 is reported as a bad port rather than as a YAML type error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsDiscoveryConfig {
    /// The name to resolve.
    pub hostname: String,
    /// A, AAAA or SRV.
    #[serde(default)]
    pub record_type: RecordType,
    /// Port of the endpoints (A/AAAA).
    #[serde(default)]
    pub port: Option<u64>,
    /// Upper bound of the time between resolutions, in seconds.
    #[serde(default = "default_refresh")]
    pub refresh_interval_s: u64,
    /// On a DNS failure keep the last set (true) or clear it (false).
    #[serde(default = "default_true")]
    pub fail_open: bool,
    /// A resolution with fewer endpoints keeps the previous set.
    #[serde(default = "default_min_endpoints")]
    pub min_endpoints: usize,
    /// Name servers to ask (`IP:port`); empty means the system's.
    #[serde(default)]
    pub nameservers: Vec<SocketAddr>,
}

impl DnsDiscoveryConfig {
    /// A config for `hostname` with every default (A records, no port yet).
    pub fn new(hostname: impl Into<String>) -> Self {
        Self {
            hostname: hostname.into(),
            record_type: RecordType::A,
            port: None,
            refresh_interval_s: default_refresh(),
            fail_open: true,
            min_endpoints: default_min_endpoints(),
            nameservers: Vec::new(),
        }
    }

    /// Checks every value; the error names the offending key.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        let bad = |key: &str, message: String| DiscoveryError::InvalidConfig {
            key: key.to_owned(),
            message,
        };
        validate_hostname(&self.hostname).map_err(|m| bad("hostname", m))?;
        match (self.record_type, self.port) {
            (_, Some(p)) if p == 0 || p > 65535 => {
                return Err(bad("port", format!("must be 1..=65535, got {p}")));
            }
            (RecordType::A | RecordType::AAAA, None) => {
                return Err(bad(
                    "port",
                    format!("is required for record_type {}", self.record_type),
                ));
            }
            _ => {}
        }
        if self.refresh_interval_s == 0 {
            return Err(bad(
                "refresh_interval_s",
                "must be at least 1 second".to_owned(),
            ));
        }
        if self.refresh_interval_s > 86_400 {
            return Err(bad(
                "refresh_interval_s",
                format!(
                    "must be at most 86400 (one day), got {}",
                    self.refresh_interval_s
                ),
            ));
        }
        for ns in &self.nameservers {
            if ns.port() == 0 {
                return Err(bad("nameservers", format!("{ns}: port 0")));
            }
        }
        Ok(())
    }

    /// The validated port (A/AAAA), `None` for SRV without a port.
    pub fn port_u16(&self) -> Option<u16> {
        self.port.and_then(|p| u16::try_from(p).ok())
    }

    /// The refresh policy these settings describe.
    pub fn refresh_policy(&self) -> RefreshPolicy {
        RefreshPolicy {
            refresh_interval: Duration::from_secs(self.refresh_interval_s.max(1)),
            fail_open: self.fail_open,
            min_endpoints: self.min_endpoints,
            ..RefreshPolicy::default()
        }
    }
}

/// Checks a DNS host name: non-empty, at most 253 characters, labels of 1–63
/// letters, digits, `-` or `_` (SRV names), not starting or ending with `-`.
/// One trailing dot (absolute name) is allowed.
pub fn validate_hostname(name: &str) -> Result<(), String> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if trimmed.len() > 253 {
        return Err(format!("{name:?} is longer than 253 characters"));
    }
    for label in trimmed.split('.') {
        if label.is_empty() {
            return Err(format!("{name:?} has an empty label"));
        }
        if label.len() > 63 {
            return Err(format!("{name:?} has a label longer than 63 characters"));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!("{name:?} contains {c:?}"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("{name:?} has a label starting or ending with '-'"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(yaml: &str) -> Result<DnsDiscoveryConfig, String> {
        let c: DnsDiscoveryConfig = serde_yaml_ng::from_str(yaml).map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn defaults_match_the_design() {
        let c = cfg("hostname: api.weave.local\nport: 8080\n").unwrap();
        assert_eq!(c.record_type, RecordType::A);
        assert_eq!(c.refresh_interval_s, 30);
        assert!(c.fail_open);
        assert_eq!(c.min_endpoints, 1);
        assert!(c.nameservers.is_empty());
    }

    #[test]
    fn srv_needs_no_port_but_a_does() {
        cfg("hostname: _http._tcp.api.local\nrecord_type: SRV\n").unwrap();
        let e = cfg("hostname: api.local\n").unwrap_err();
        assert!(e.contains("port") && e.contains("required"), "{e}");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (yaml, key) in [
            ("hostname: ''\nport: 1\n", "hostname"),
            ("hostname: 'a..b'\nport: 1\n", "hostname"),
            ("hostname: 'bad host'\nport: 1\n", "hostname"),
            ("hostname: a.b\nport: 0\n", "port"),
            ("hostname: a.b\nport: 70000\n", "port"),
            (
                "hostname: a.b\nport: 80\nrefresh_interval_s: 0\n",
                "refresh_interval_s",
            ),
        ] {
            let e = cfg(yaml).unwrap_err();
            assert!(e.contains(key), "{yaml:?}: {e}");
        }
        let e = cfg("hostname: a.b\nport: 80\nrecord_type: MX\n").unwrap_err();
        assert!(e.contains("record_type") || e.contains("MX"), "{e}");
        let e = cfg("hostname: a.b\nport: 80\nrefresh: 3\n").unwrap_err();
        assert!(e.contains("refresh"), "{e}");
    }

    #[test]
    fn record_type_parses_any_case() {
        assert_eq!("srv".parse::<RecordType>().unwrap(), RecordType::SRV);
        assert_eq!("AAAA".parse::<RecordType>().unwrap(), RecordType::AAAA);
        assert!("mx".parse::<RecordType>().is_err());
    }
}
