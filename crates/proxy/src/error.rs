//! The one error type of `dwara-proxy`.

use std::net::SocketAddr;

/// What went wrong in the dataplane, and with which input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value is invalid; `key` is its path (`upstreams[0].listen`).
    #[error("{key}: {message}")]
    InvalidConfig {
        /// Path of the offending key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A discovery block was rejected by its source (e.g. a stub that is not
    /// supported yet).
    #[error("{key}: {source}")]
    Discovery {
        /// Path of the discovery block.
        key: String,
        /// The source's error.
        #[source]
        source: dwara_discovery::DiscoveryError,
    },
    /// A listen address could not be bound.
    #[error("upstream {upstream:?}: cannot listen on {addr}: {source}")]
    Bind {
        /// The upstream.
        upstream: String,
        /// The address.
        addr: SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The L4 worker threads could not be started.
    #[error("cannot start the L4 worker threads: {0}")]
    Workers(#[source] std::io::Error),
    /// The resolver or DNS cache of an `address:` upstream could not be built.
    #[error("{key}: cannot build its resolver: {source}")]
    AddressResolver {
        /// Path of the `address` key.
        key: String,
        /// The resolver's or cache's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
