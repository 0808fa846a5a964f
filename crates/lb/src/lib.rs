//! Endpoint sets and load-balancing policies with atomic live updates.
//!
//! Discovery publishes an [`EndpointSet`] into an [`UpstreamLb`]; the proxy picks an
//! endpoint per connection or request. The set and the policy's pick state live in
//! one snapshot behind an atomic pointer swap, so picks never block on updates and
//! never see half an update. A pick returns a [`PickGuard`] that counts the request
//! in flight and keeps working after its endpoint has been removed.
//!
//! ```
//! use std::sync::Arc;
//! use dwara_lb::{Endpoint, EndpointSet, NoEndpoints, Policy, UpstreamLb};
//!
//! let lb = Arc::new(UpstreamLb::new(Policy::RoundRobin));
//! assert_eq!(lb.pick().unwrap_err(), NoEndpoints);
//!
//! let set: EndpointSet = ["10.0.0.1:8080", "10.0.0.2:8080"]
//!     .iter()
//!     .map(|a| Endpoint::new(a.parse().unwrap()))
//!     .collect();
//! assert!(lb.update(set.clone()));
//! assert!(!lb.update(set), "an unchanged set publishes nothing");
//!
//! let guard = lb.pick().unwrap();
//! println!("connect to {}", guard.addr());
//! ```

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
pub use health::{Clock, EjectionConfig, ManualClock, MonotonicClock, Outcome};
pub use lb::{EndpointStats, LbStats, PickGuard, UpstreamLb, UpstreamLbBuilder};
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
