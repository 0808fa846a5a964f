//! [`DnsCacheError`]: why [`DnsCache::resolve`](crate::DnsCache::resolve) has no addresses.

use dwara_resolver::ResolveError;

/// Why a lookup through the cache produced no addresses.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DnsCacheError {
    /// The upstream lookup failed, or (cached) the name has no addresses.
    ///
    /// [`DnsCacheError::is_no_records`] tells an authoritative empty answer (which is
    /// cached for the negative TTL) from a failure (which is never cached).
    #[error("resolving {host}: {source}")]
    Resolve {
        /// The host as normalised by the cache (lower case, no trailing dot).
        host: String,
        /// What the resolver reported.
        #[source]
        source: ResolveError,
    },
    /// The cache configuration is inconsistent.
    #[error("invalid DNS cache configuration: {0}")]
    Config(String),
}

impl DnsCacheError {
    /// Whether this is an authoritative empty answer (NXDOMAIN or NODATA).
    pub fn is_no_records(&self) -> bool {
        matches!(self, Self::Resolve { source, .. } if source.is_no_records())
    }

    /// The resolver's error, when the error came from a lookup.
    pub fn resolve_error(&self) -> Option<&ResolveError> {
        match self {
            Self::Resolve { source, .. } => Some(source),
            Self::Config(_) => None,
        }
    }
}
