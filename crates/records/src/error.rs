//! The one error type of `dwara-records`.

/// What input the records database rejected, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A domain name could not be parsed (bad label, too long, empty…).
    #[error("invalid domain name {name:?}: {reason}")]
    InvalidName {
        /// The name as given.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A name to register lies outside the served domain.
    #[error("{name:?} is not inside the domain {domain:?}")]
    OutsideDomain {
        /// The name as given.
        name: String,
        /// The served domain.
        domain: String,
    },
    /// A service name is not of the form `_name._tcp` or `_name._udp`.
    #[error("invalid service {input:?}: {reason}")]
    InvalidService {
        /// The text as given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A port is not a number from 1 to 65535.
    #[error("invalid port {input:?}: want a number from 1 to 65535")]
    InvalidPort {
        /// The text as given.
        input: String,
    },
    /// An SRV priority is not a number from 0 to 65535.
    #[error("invalid priority {input:?}: want a number from 0 to 65535 (RFC 2782)")]
    InvalidPriority {
        /// The text as given.
        input: String,
    },
    /// An SRV weight is not a number from 0 to 65535.
    #[error("invalid weight {input:?}: want a number from 0 to 65535 (RFC 2782)")]
    InvalidWeight {
        /// The text as given.
        input: String,
    },
    /// A priority or weight was given without a port: they belong to a service.
    #[error(
        "{field} {value:?} given without a port (form value port=1..65535): priority and weight belong to the SRV record of a service"
    )]
    RankWithoutPort {
        /// `priority` or `weight`.
        field: &'static str,
        /// The value as given.
        value: String,
    },
    /// A service was given without a port.
    #[error("service {service:?} given without a port (form value port=1..65535)")]
    ServiceWithoutPort {
        /// The service as given.
        service: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
