//! The one error type of `dwara-nameserver`.

use std::io;
use std::net::SocketAddr;

/// What went wrong in the name server, and with which input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An IP address could not be parsed.
    #[error("invalid IP address {input:?}")]
    InvalidAddress {
        /// The text as given.
        input: String,
    },
    /// A client prefix of the allow list could not be parsed.
    #[error("invalid CIDR {input:?}: {reason}")]
    InvalidCidr {
        /// The text as given (at most 64 characters of it).
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A check of a kind this build does not run.
    #[error("unknown check {input:?}: the only check is tcp (form value check=tcp)")]
    UnknownCheck {
        /// The check as given.
        input: String,
    },
    /// A check was given without a port to check.
    #[error("check {check:?} given without a port to check (form value port=1..65535)")]
    CheckWithoutPort {
        /// The check as given.
        check: String,
    },
    /// A socket could not be bound.
    #[error("cannot bind {what} on {addr}: {source}")]
    Bind {
        /// Which listener (`"DNS/UDP"`, `"DNS/TCP"`, `"HTTP"`).
        what: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's error.
        source: io::Error,
    },
    /// A name, service or port the records database rejected.
    #[error(transparent)]
    Records(#[from] dwara_records::Error),
    /// The registration store (`--data-dir`) could not be opened or read.
    #[error(transparent)]
    Store(#[from] dwara_store::StoreError),
    /// Any other I/O failure, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The operating system's error.
        source: io::Error,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
