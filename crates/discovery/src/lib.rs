#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod refresh;
mod tasks;
#[cfg(feature = "tower")]
pub mod tower;

use std::fmt::Debug;
use std::time::Duration;

use dwara_lb::EndpointSet;

pub use refresh::{Counters, Decision, DiscoveryStats, LastResolution, RefreshPolicy};
pub use tasks::{DiscoverySnapshot, DiscoveryTasks, UpstreamDiscovery};

/// One answer of a source: the endpoints and how long they may be trusted.
///
/// Zero endpoints is a valid answer (e.g. NXDOMAIN): the `min_endpoints` floor of
/// the refresh loop decides what happens to the published set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The endpoints the source found.
    pub endpoints: EndpointSet,
    /// How long the answer is good for (the record TTL), if the source knows.
    pub ttl: Option<Duration>,
}

/// The error of another crate (a DNS resolver, an HTTP client …) kept as the source
/// of a [`DiscoveryError`]: `source()` downcasts to the concrete type.
pub type SourceError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of discovery: failed resolutions, bad configuration, unsupported sources.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// The source could not get an answer (SERVFAIL, REFUSED, I/O …).
    #[error("{source_name}: resolution failed ({kind}): {source}")]
    Resolve {
        /// What was being resolved (the source's description).
        source_name: String,
        /// Short machine label (`timeout`, `servfail`, `refused`, `transport` …).
        kind: &'static str,
        /// The source's own error.
        #[source]
        source: SourceError,
    },
    /// The source gave no answer within the refresh loop's `resolve_timeout`.
    #[error("{source_name}: resolution failed (timeout): no answer within {after:?}")]
    Timeout {
        /// What was being resolved (the source's description).
        source_name: String,
        /// How long the loop waited.
        after: Duration,
    },
    /// A valid configuration, but the source's client could not be started.
    #[error("{source_name}: cannot start the discovery source: {source}")]
    Start {
        /// The source's description.
        source_name: String,
        /// Why it could not start.
        #[source]
        source: SourceError,
    },
    /// A configuration value is invalid.
    #[error("invalid discovery config: {key}: {message}")]
    InvalidConfig {
        /// The offending key within the source's own config block, e.g. `port` (a
        /// caller that nests the block names the path, as `dwara`'s config file does:
        /// `upstreams[0].dns_discovery.port`).
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// The source kind exists in the configuration language but is not implemented.
    #[error(
        "{source_kind} discovery is not supported yet: {missing} is not implemented; use dns_discovery"
    )]
    Unsupported {
        /// The source kind, e.g. `consul`.
        source_kind: &'static str,
        /// What this build lacks, e.g. `watching the Consul catalog`.
        missing: &'static str,
    },
}

impl DiscoveryError {
    /// A failed resolution of `source_name`, keeping `source` (the source's own
    /// error) for callers that walk [`std::error::Error::source`].
    pub fn resolve(
        source_name: impl Into<String>,
        kind: &'static str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Resolve {
            source_name: source_name.into(),
            kind,
            source: Box::new(source),
        }
    }

    /// The short label used in logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Resolve { kind, .. } => kind,
            Self::Timeout { .. } => "timeout",
            Self::Start { .. } => "start",
            Self::InvalidConfig { .. } => "invalid_config",
            Self::Unsupported { .. } => "unsupported",
        }
    }
}

/// A source of endpoints for one upstream.
///
/// Used as `Arc<dyn DiscoverySource>` (hence `async_trait`): the configuration
/// decides at run time which kind backs each upstream. Implementations do one
/// resolution per call and keep no timers; the refresh loop calls them.
#[async_trait::async_trait]
pub trait DiscoverySource: Send + Sync + Debug + 'static {
    /// A short description for logs, e.g. `dns A api.weave.local:8080`.
    fn describe(&self) -> String;

    /// Resolves the endpoints once.
    ///
    /// `Ok` with zero endpoints is an authoritative empty answer; `Err` is a failure
    /// that the loop's `fail_open` policy handles.
    async fn resolve(&self) -> Result<Resolution, DiscoveryError>;

    /// For a *push* source, a receiver marked changed whenever the answer may have
    /// changed: the loop then resolves at once instead of waiting for its next
    /// refresh (which stays as a backstop). `None` (the default): the source is
    /// polled. The value itself is not read, only that it changed.
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}
