//! Endpoint sets and load-balancing policies with atomic live updates.
//!
//! Discovery publishes an [`EndpointSet`] into an [`UpstreamLb`]; the proxy picks an
//! endpoint per connection or request. The set and the policy's pick state live in
//! one snapshot behind an atomic pointer swap, so picks never block on updates and
//! never see half an update. A pick returns a [`PickGuard`] that counts the request
//! in flight and keeps working after its endpoint has been removed.
//!
//! Code that picks often (a worker's request loop, a datagram forwarder) takes an
//! [`LbHandle`] of its own ([`UpstreamLb::handle`]): it caches the snapshot and has
//! its own round-robin position and random sequence, as Envoy gives each worker its
//! own load balancer, so a pick takes no shared atomic operation.
//! [`LbHandle::pick_endpoint`] also skips the in-flight count, for callers that do
//! not need it; a round-robin pick then costs about what a bare atomic counter over
//! a slice does.
//!
//! Policies ([`Policy`]):
//! - `round_robin`: in order; smooth weighted round robin (nginx) when weights differ;
//! - `random`: uniform, or weighted by an alias table;
//! - `p2c`: two random endpoints, the one with fewer requests in flight per unit of
//!   weight wins (Envoy's least request);
//! - `srv`: RFC 2782, the lowest priority group that has endpoints, weighted within;
//! - `consistent_hash`: a Ketama-style ring with an O(1) bucket index, keyed by the
//!   caller ([`UpstreamLb::pick_by_key`]). A ring rather than Maglev because when 1
//!   of N endpoints leaves only its own ~1/N of the keys move; Maglev with a
//!   65,537-slot table moved 1.6× that at N = 100 and 7× at N = 1,000.
//!
//! Randomness comes from a seedable lock-free generator
//! ([`UpstreamLbBuilder::seed`]); passive ejection ([`EjectionConfig`],
//! [`PickGuard::report`]) and its clock ([`EjectionClock`], [`ManualEjectionClock`])
//! are injectable, so tests are deterministic. (The ejection clock measures elapsed
//! time for cool-downs; `dwara-dns-cache`'s `Clock` hands out instants for TTLs.)
//!
//! # How in-flight counting works
//!
//! Each endpoint has a state object kept by address, so its counts survive updates.
//! Snapshots hold strong references to the states; a [`PickGuard`] holds a `Weak`,
//! and the in-flight count of an endpoint *is* its state's weak count, exact however
//! many old snapshots are alive. Removed endpoints' states stay on the writer's
//! draining list while guards or old snapshots refer to them, and their guards count
//! as draining. Snapshots replaced while a handle or a pick in progress still holds
//! them are retired to the writer, which frees them at a later publish, never on the
//! pick path. An [`LbHandle`] revalidates its cached snapshot with one load of a
//! version counter bumped after every publish.
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
//! guard.report_success(); // optional: feeds passive ejection
//! drop(guard); // the request is over: in flight -1
//! ```
//!
//! A handle per worker:
//!
//! ```
//! use std::sync::Arc;
//! use dwara_lb::{Endpoint, Policy, UpstreamLb};
//!
//! let lb = Arc::new(UpstreamLb::new(Policy::RoundRobin));
//! lb.update([Endpoint::new("10.0.0.1:53".parse().unwrap())].into_iter().collect());
//! let mut handle = lb.handle(); // one per task or thread; `Clone` makes another
//! let guard = handle.pick().unwrap(); // counted, as `lb.pick()`
//! let next_hop = *handle.pick_endpoint().unwrap(); // not counted
//! assert_eq!(guard.addr(), next_hop.addr);
//! ```
//!
//! With passive ejection and a fixed seed:
//!
//! ```
//! use std::time::Duration;
//! use dwara_lb::{EjectionConfig, Policy, UpstreamLb};
//!
//! let lb = UpstreamLb::builder(Policy::P2c)
//!     .seed(7)
//!     .ejection(EjectionConfig::new(5, Duration::from_secs(30)))
//!     .build();
//! # let _ = lb;
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
pub use health::{
    EjectionClock, EjectionConfig, ManualEjectionClock, MonotonicEjectionClock, Outcome,
};
pub use lb::{EndpointStats, LbHandle, LbStats, PickGuard, UpstreamLb, UpstreamLbBuilder};
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
