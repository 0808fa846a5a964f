#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use serde::{Deserialize, Serialize};

pub use dwara_discovery::DiscoveryError;

/// The `kubernetes` block of an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSliceConfig {
    /// Namespace of the service.
    pub namespace: String,
    /// Service name (EndpointSlices labelled `kubernetes.io/service-name`).
    pub service: String,
    /// Named port to use; the only port when absent.
    #[serde(default)]
    pub port_name: Option<String>,
}

/// RFC 1123 label, as Kubernetes requires for namespaces and service names.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl EndpointSliceConfig {
    /// Checks the fields, then reports that the source is not supported yet.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        for (key, value) in [("namespace", &self.namespace), ("service", &self.service)] {
            if !is_dns_label(value) {
                return Err(DiscoveryError::InvalidConfig {
                    key: key.into(),
                    message: format!("{value:?} is not a valid RFC 1123 label"),
                });
            }
        }
        Err(DiscoveryError::Unsupported {
            source_kind: "kubernetes",
            missing: "watching Kubernetes EndpointSlices",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_configs_are_rejected_as_unsupported_saying_what_is_missing() {
        let c: EndpointSliceConfig =
            serde_yaml_ng::from_str("namespace: prod\nservice: api\nport_name: http\n").unwrap();
        let e = c.validate().unwrap_err();
        assert!(matches!(
            e,
            DiscoveryError::Unsupported {
                source_kind: "kubernetes",
                ..
            }
        ));
        let message = e.to_string();
        assert!(
            message.starts_with("kubernetes discovery is not supported yet"),
            "{message}"
        );
        assert!(
            message.contains("EndpointSlice"),
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
    fn invalid_names_are_reported_first() {
        let c = EndpointSliceConfig {
            namespace: "Prod".into(),
            service: "api".into(),
            port_name: None,
        };
        let e = c.validate().unwrap_err();
        assert!(
            matches!(&e, DiscoveryError::InvalidConfig { key, .. } if key == "namespace"),
            "{e}"
        );
    }
}
