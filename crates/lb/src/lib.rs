#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod endpoint;
mod hash;
mod health;
mod lb;
mod picker;
mod policy;
mod rng;

pub use endpoint::{Endpoint, EndpointSet};
pub use health::{
    EjectionClock, EjectionConfig, ManualEjectionClock, MonotonicEjectionClock, Outcome,
};
pub use lb::{EndpointStats, LbHandle, LbStats, PickGuard, Updated, UpstreamLb, UpstreamLbBuilder};
pub use policy::Policy;

/// A pick on an upstream whose endpoint set is empty.
#[derive(thiserror::Error, Debug, Clone, Copy, PartialEq, Eq)]
#[error("upstream has no endpoints")]
pub struct NoEndpoints;

/// Errors of this crate.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A policy name that is none of `round_robin`, `random`, `p2c`, `srv`,
    /// `consistent_hash`.
    #[error(
        "unknown load-balancing policy {0:?} (expected round_robin, random, p2c, srv or consistent_hash)"
    )]
    UnknownPolicy(String),
    /// A pick on an empty endpoint set.
    #[error(transparent)]
    NoEndpoints(#[from] NoEndpoints),
}
