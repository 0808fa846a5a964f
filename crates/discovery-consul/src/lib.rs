#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use serde::{Deserialize, Serialize};

pub use dwara_discovery::DiscoveryError;

fn default_true() -> bool {
    true
}

/// The `consul` block of an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsulConfig {
    /// The Consul service name.
    pub service: String,
    /// Datacenter; the agent's own when absent.
    #[serde(default)]
    pub datacenter: Option<String>,
    /// Only instances carrying this tag.
    #[serde(default)]
    pub tag: Option<String>,
    /// Only instances whose health checks pass.
    #[serde(default = "default_true")]
    pub passing_only: bool,
}

impl Default for ConsulConfig {
    fn default() -> Self {
        Self {
            service: String::new(),
            datacenter: None,
            tag: None,
            passing_only: true,
        }
    }
}

impl ConsulConfig {
    /// Checks the fields, then reports that the source is not supported yet.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        if self.service.trim().is_empty() {
            return Err(DiscoveryError::InvalidConfig {
                key: "service".into(),
                message: "must not be empty".into(),
            });
        }
        Err(DiscoveryError::Unsupported {
            source_kind: "consul",
            missing: "watching the Consul catalog",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_config_is_rejected_as_unsupported_saying_what_is_missing() {
        let c: ConsulConfig =
            serde_yaml_ng::from_str("service: api\ndatacenter: dc1\ntag: v2\n").unwrap();
        assert!(c.passing_only);
        let e = c.validate().unwrap_err();
        assert!(matches!(
            e,
            DiscoveryError::Unsupported {
                source_kind: "consul",
                ..
            }
        ));
        let message = e.to_string();
        assert!(
            message.starts_with("consul discovery is not supported yet"),
            "{message}"
        );
        assert!(
            message.contains("Consul catalog"),
            "says what is missing: {message}"
        );
        assert!(
            !message
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| {
                    w.len() >= 2 && w.starts_with('M') && w[1..].bytes().all(|b| b.is_ascii_digit())
                }),
            "names no internal milestone: {message}"
        );
    }

    #[test]
    fn bad_fields_are_reported_first() {
        let e = ConsulConfig::default().validate().unwrap_err();
        assert!(
            matches!(&e, DiscoveryError::InvalidConfig { key, .. } if key == "service"),
            "{e}"
        );
        assert!(serde_yaml_ng::from_str::<ConsulConfig>("service: a\nbogus: 1\n").is_err());
    }
}
