//! [`ResolveError`]: what can go wrong with a lookup, split the way callers decide.
//!
//! The split that matters: [`ResolveError::NoRecords`] is an *answer* (the server
//! said the name or the type does not exist), everything else is a *failure* (we do
//! not know the answer). Discovery keeps or clears endpoints on failures by policy,
//! and treats an empty answer as zero endpoints.
//!
//! Failures keep hickory's error as their [`source`](std::error::Error::source)
//! (an `Arc<NetError>`, so the error stays cheap to clone).

use std::sync::Arc;

use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RecordType;

/// A failed lookup.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The name is not a valid DNS name.
    #[error("invalid DNS name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// Authoritative empty answer: NXDOMAIN, or NODATA (the name exists without records of this type).
    #[error("{name} has no {record_type} records ({})", if *.nxdomain { "NXDOMAIN" } else { "NODATA" })]
    NoRecords {
        /// The queried name.
        name: String,
        /// The queried type.
        record_type: RecordType,
        /// NXDOMAIN (the name does not exist) rather than NODATA.
        nxdomain: bool,
        /// Negative-caching TTL from the SOA, when the server sent one.
        negative_ttl: Option<u32>,
    },
    /// No server answered in time.
    #[error("DNS query for {name} ({record_type}) timed out")]
    Timeout {
        /// The queried name.
        name: String,
        /// The queried type.
        record_type: RecordType,
    },
    /// A server answered with an error code (SERVFAIL, REFUSED, …).
    #[error("DNS server answered {code} for {name} ({record_type})")]
    ServerError {
        /// The queried name.
        name: String,
        /// The queried type.
        record_type: RecordType,
        /// The response code.
        code: ResponseCode,
    },
    /// Network or protocol failure talking to the servers.
    #[error("DNS query for {name} ({record_type}) failed: {source}")]
    Transport {
        /// The queried name.
        name: String,
        /// The queried type.
        record_type: RecordType,
        /// What the transport reported (shared: the error is cloned to every
        /// caller waiting on the same lookup).
        #[source]
        source: Arc<NetError>,
    },
    /// The resolver could not be built.
    #[error("cannot build the DNS resolver: {0}")]
    Config(#[source] Arc<NetError>),
}

impl ResolveError {
    /// Whether this is an authoritative empty answer rather than a failure.
    pub fn is_no_records(&self) -> bool {
        matches!(self, Self::NoRecords { .. })
    }

    /// The negative TTL of an empty answer, when the server gave one.
    pub fn negative_ttl(&self) -> Option<u32> {
        match self {
            Self::NoRecords { negative_ttl, .. } => *negative_ttl,
            _ => None,
        }
    }

    /// A short label for logs and metrics: `no_records`, `timeout`, `servfail`,
    /// `refused`, `server_error`, `transport`, `invalid_name`, `config`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidName { .. } => "invalid_name",
            Self::NoRecords { .. } => "no_records",
            Self::Timeout { .. } => "timeout",
            Self::ServerError {
                code: ResponseCode::ServFail,
                ..
            } => "servfail",
            Self::ServerError {
                code: ResponseCode::Refused,
                ..
            } => "refused",
            Self::ServerError { .. } => "server_error",
            Self::Transport { .. } => "transport",
            Self::Config(_) => "config",
        }
    }

    pub(crate) fn from_net(name: &str, record_type: RecordType, err: NetError) -> Self {
        let name = name.to_owned();
        match err {
            NetError::Dns(DnsError::NoRecordsFound(nr)) => {
                let nxdomain = nr.response_code == ResponseCode::NXDomain;
                let negative_ttl = nr
                    .negative_ttl
                    .or_else(|| nr.soa.as_ref().map(|soa| soa.ttl.min(soa.data.minimum)));
                Self::NoRecords {
                    name,
                    record_type,
                    nxdomain,
                    negative_ttl,
                }
            }
            NetError::Dns(DnsError::ResponseCode(code)) => Self::ServerError {
                name,
                record_type,
                code,
            },
            NetError::Timeout => Self::Timeout { name, record_type },
            other => {
                let message = other.to_string();
                // The name-server pool folds per-server timeouts into a message.
                if message.contains("timed out") || message.contains("timeout") {
                    Self::Timeout { name, record_type }
                } else {
                    Self::Transport {
                        name,
                        record_type,
                        source: Arc::new(other),
                    }
                }
            }
        }
    }
}
