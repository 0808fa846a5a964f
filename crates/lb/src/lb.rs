//! `UpstreamLb`: the current endpoint snapshot behind an atomic pointer swap, and the
//! guards that picks hand out.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::hash::hash_key;
use crate::health::{Clock, EjectionConfig, EndpointState, MonotonicClock, Outcome, Shared};
use crate::picker::Picker;
use crate::rng::{Ticket, below};
use crate::{Endpoint, EndpointSet, NoEndpoints, Policy};

/// Policy attempts after an ejected pick before scanning for any healthy endpoint.
const RETRIES: usize = 3;

/// Everything a pick needs, published as one unit: a pick sees the old snapshot or
/// the new one, never a mix.
#[derive(Debug)]
struct Snapshot {
    set: EndpointSet,
    /// `states[i]` belongs to `set.as_slice()[i]`.
    states: Box<[Arc<EndpointState>]>,
    picker: Picker,
}

impl Snapshot {
    fn state_of(&self, addr: SocketAddr) -> Option<&Arc<EndpointState>> {
        self.set.position(addr).map(|i| &self.states[i])
    }
}

/// State only the writer side touches, behind a mutex (never taken by picks).
#[derive(Debug, Default)]
struct Writer {
    /// States of removed endpoints that may still have guards.
    draining: Vec<Weak<EndpointState>>,
}

/// The load balancer of one upstream: the current [`EndpointSet`] plus the pick state
/// of its [`Policy`], published together behind one atomic pointer.
///
/// Share it as `Arc<UpstreamLb>`. Picks take no lock and allocate nothing; they never
/// block on updates and never see half an update. Updates are serialised among
/// themselves.
#[derive(Debug)]
pub struct UpstreamLb {
    current: ArcSwap<Snapshot>,
    ticket: Ticket,
    policy: Policy,
    shared: Arc<Shared>,
    writer: Mutex<Writer>,
}

/// Builds an [`UpstreamLb`] with a fixed seed, passive ejection, or a test clock.
#[derive(Debug)]
#[must_use]
pub struct UpstreamLbBuilder {
    policy: Policy,
    seed: Option<u64>,
    ejection: Option<EjectionConfig>,
    clock: Option<Arc<dyn Clock>>,
    endpoints: EndpointSet,
}

impl UpstreamLbBuilder {
    /// Seeds the random source of the random, P2C, SRV and keyless consistent-hash
    /// picks (default: a random seed). Single-threaded picks from the same seed and
    /// sets repeat exactly.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Turns on passive ejection (default: off; reports only count failures).
    pub fn ejection(mut self, config: EjectionConfig) -> Self {
        self.ejection = Some(config);
        self
    }

    /// The clock for ejection cool-downs (default: [`MonotonicClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The initial endpoint set (default: empty).
    pub fn endpoints(mut self, set: EndpointSet) -> Self {
        self.endpoints = set;
        self
    }

    /// The load balancer.
    pub fn build(self) -> UpstreamLb {
        let shared = Arc::new(Shared::new(
            self.ejection,
            self.clock
                .unwrap_or_else(|| Arc::new(MonotonicClock::new())),
        ));
        let empty = Snapshot {
            set: EndpointSet::empty(),
            states: Box::new([]),
            picker: Picker::build(self.policy, &[]),
        };
        let lb = UpstreamLb {
            current: ArcSwap::from_pointee(empty),
            ticket: Ticket::new(self.seed.unwrap_or_else(rand::random)),
            policy: self.policy,
            shared,
            writer: Mutex::new(Writer::default()),
        };
        lb.update(self.endpoints);
        lb
    }
}

impl UpstreamLb {
    /// A load balancer with `policy`, no endpoints, a random seed and no ejection.
    pub fn new(policy: Policy) -> Self {
        Self::builder(policy).build()
    }

    /// A builder for the other options.
    pub fn builder(policy: Policy) -> UpstreamLbBuilder {
        UpstreamLbBuilder {
            policy,
            seed: None,
            ejection: None,
            clock: None,
            endpoints: EndpointSet::empty(),
        }
    }

    /// The policy this load balancer picks with.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Publishes `set` (and the policy's state for it) atomically. Returns `false`,
    /// publishing nothing, when `set` equals the current set (weights and priorities
    /// included).
    ///
    /// Endpoints that stay keep their in-flight counts and ejection state; guards on
    /// endpoints that leave keep working and are counted as draining. Picks that start
    /// after `update` returns see only `set`.
    pub fn update(&self, set: EndpointSet) -> bool {
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let prev = self.current.load_full();
        if prev.set == set {
            return false;
        }
        let writer = &mut *writer;
        writer.draining.retain(|w| w.strong_count() > 0);
        let mut added = 0usize;
        let states: Box<[Arc<EndpointState>]> = set
            .iter()
            .map(|e| {
                if let Some(s) = prev.state_of(e.addr) {
                    return Arc::clone(s);
                }
                added += 1;
                // back before its old guards drained: continue its counts
                let revived = writer
                    .draining
                    .iter()
                    .position(|w| w.upgrade().is_some_and(|s| s.addr == e.addr))
                    .and_then(|i| writer.draining.swap_remove(i).upgrade());
                let s =
                    revived.unwrap_or_else(|| Arc::new(EndpointState::new(e.addr, &self.shared)));
                s.removed.store(false, Ordering::Release);
                s
            })
            .collect();
        let mut removed = 0usize;
        for (e, s) in prev.set.iter().zip(prev.states.iter()) {
            if !set.contains(e.addr) {
                removed += 1;
                s.removed.store(true, Ordering::Release);
                writer.draining.push(Arc::downgrade(s));
            }
        }
        let picker = Picker::build(self.policy, set.as_slice());
        let endpoints = set.len();
        self.current.store(Arc::new(Snapshot {
            set,
            states,
            picker,
        }));
        tracing::debug!(policy = %self.policy, endpoints, added, removed, "endpoint set updated");
        true
    }

    /// Publishes the empty set; `false` when it already was empty.
    pub fn clear(&self) -> bool {
        self.update(EndpointSet::empty())
    }

    /// The current endpoint set (cheap: one `Arc` clone).
    pub fn endpoints(&self) -> EndpointSet {
        self.current.load().set.clone()
    }

    /// Picks an endpoint with the policy. Under [`Policy::ConsistentHash`] a pick
    /// without a key uses a random key.
    #[inline]
    pub fn pick(&self) -> Result<PickGuard, NoEndpoints> {
        self.pick_inner(None)
    }

    /// Picks the endpoint for `key` under [`Policy::ConsistentHash`] (the same key
    /// maps to the same endpoint while the set stays, and to the same endpoint on
    /// every process that has the same set); other policies ignore the key.
    #[inline]
    pub fn pick_by_key(&self, key: &[u8]) -> Result<PickGuard, NoEndpoints> {
        let hash = match self.policy {
            Policy::ConsistentHash => Some(hash_key(key)),
            _ => None,
        };
        self.pick_inner(hash)
    }

    #[inline]
    fn pick_inner(&self, key: Option<u64>) -> Result<PickGuard, NoEndpoints> {
        let snap = self.current.load();
        let eps = snap.set.as_slice();
        if eps.is_empty() {
            return Err(NoEndpoints);
        }
        // P2C compares raw reference counts: every current endpoint carries the same
        // snapshot references except for an instant during an update
        let in_flight = |i: usize| Arc::strong_count(&snap.states[i]);
        let i = snap.picker.pick(eps, in_flight, &self.ticket, key, 0);
        let i = if self.shared.any_ejected() && snap.states[i].is_ejected() {
            self.avoid_ejected(&snap, key, i)
        } else {
            i
        };
        Ok(PickGuard::new(eps[i], &snap.states[i]))
    }

    /// The slow path after picking an ejected endpoint: a few more tries with the
    /// policy, then the first healthy endpoint in the policy's order of preference,
    /// else the original pick (every candidate is ejected: ignore ejection).
    #[cold]
    fn avoid_ejected(&self, snap: &Snapshot, key: Option<u64>, first: usize) -> usize {
        let eps = snap.set.as_slice();
        let healthy = |i: usize| !snap.states[i].is_ejected();
        if let Some(groups) = snap.picker.srv_groups() {
            // RFC 2782: the lowest priority group that still has a usable endpoint
            for group in groups {
                let members = group.members();
                if !members.iter().any(|&m| healthy(m as usize)) {
                    continue;
                }
                for _ in 0..RETRIES {
                    let i = Picker::srv_pick_in(group, &self.ticket);
                    if healthy(i) {
                        return i;
                    }
                }
                let start = below(self.ticket.random(), members.len());
                let rotated = members[start..].iter().chain(&members[..start]);
                if let Some(&m) = rotated.into_iter().find(|&&m| healthy(m as usize)) {
                    return m as usize;
                }
            }
            return first;
        }
        let in_flight = |i: usize| snap.states[i].in_flight(0);
        for attempt in 1..=RETRIES {
            let i = snap.picker.pick(eps, in_flight, &self.ticket, key, attempt);
            if healthy(i) {
                return i;
            }
        }
        // deterministic for a key, so one key keeps going to one fallback
        let start = match key {
            Some(h) => below(h, eps.len()),
            None => below(self.ticket.random(), eps.len()),
        };
        (start..eps.len())
            .chain(0..start)
            .find(|&i| healthy(i))
            .unwrap_or(first)
    }

    fn with_state<T>(
        &self,
        addr: SocketAddr,
        f: impl FnOnce(&Arc<EndpointState>) -> T,
    ) -> Option<T> {
        let snap = self.current.load();
        snap.state_of(addr).map(f)
    }

    /// Requests in flight to `addr`: its live guards, also after it left the set
    /// (draining).
    pub fn in_flight(&self, addr: SocketAddr) -> usize {
        if let Some(n) = self.with_state(addr, |s| s.in_flight(0)) {
            return n;
        }
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        writer
            .draining
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| s.addr == addr)
            .map(|s| s.in_flight(1))
            .sum()
    }

    /// Requests still in flight to endpoints that have left the set.
    pub fn draining(&self) -> usize {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        writer
            .draining
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| s.in_flight(1))
            .sum()
    }

    /// Reports a request outcome for `addr` (same as on its guard); `false` when
    /// `addr` is not in the current set.
    pub fn report(&self, addr: SocketAddr, outcome: Outcome) -> bool {
        self.with_state(addr, |s| s.report(outcome)).is_some()
    }

    /// Ejects `addr` for `cool_down`, whatever the ejection config; `false` when
    /// `addr` is not in the current set or `cool_down` is zero.
    pub fn eject(&self, addr: SocketAddr, cool_down: Duration) -> bool {
        self.with_state(addr, |s| s.eject_for(cool_down))
            .unwrap_or(false)
    }

    /// Puts `addr` back into rotation and resets its failure streak; `true` when it
    /// was ejected.
    pub fn uneject(&self, addr: SocketAddr) -> bool {
        self.with_state(addr, |s| s.uneject()).unwrap_or(false)
    }

    /// Whether picks currently skip `addr`.
    pub fn is_ejected(&self, addr: SocketAddr) -> bool {
        self.with_state(addr, |s| s.is_ejected()).unwrap_or(false)
    }

    /// A point-in-time view of every endpoint and the draining count.
    pub fn stats(&self) -> LbStats {
        let snap = self.current.load();
        let endpoints = snap
            .set
            .iter()
            .zip(snap.states.iter())
            .map(|(e, s)| EndpointStats {
                endpoint: *e,
                in_flight: s.in_flight(0),
                consecutive_failures: s.consecutive_failures(),
                ejected: s.is_ejected(),
            })
            .collect();
        LbStats {
            policy: self.policy,
            endpoints,
            draining: self.draining(),
        }
    }
}

/// One endpoint's counters, from [`UpstreamLb::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointStats {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Guards alive for it.
    pub in_flight: usize,
    /// Failures reported since the last success (or ejection).
    pub consecutive_failures: u32,
    /// Whether picks currently skip it.
    pub ejected: bool,
}

/// A point-in-time view of an [`UpstreamLb`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LbStats {
    /// The policy.
    pub policy: Policy,
    /// The current endpoints, sorted by address.
    pub endpoints: Vec<EndpointStats>,
    /// Requests still in flight to endpoints that have left the set.
    pub draining: usize,
}

/// A picked endpoint. Holding it counts one request in flight to the endpoint; the
/// count drops when the guard is dropped. The guard owns its endpoint's state (no
/// borrow of the load balancer), so it keeps working after the endpoint is removed
/// from the set while the connection drains.
#[derive(Debug)]
#[must_use = "dropping the guard ends the request's in-flight count at once"]
pub struct PickGuard {
    endpoint: Endpoint,
    state: Arc<EndpointState>,
}

impl PickGuard {
    /// The `Arc` clone is the in-flight +1 (see `EndpointState`); dropping the guard
    /// drops it, the -1.
    #[inline]
    fn new(endpoint: Endpoint, state: &Arc<EndpointState>) -> Self {
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

    /// Whether the endpoint has left the set since (the request is draining).
    pub fn is_draining(&self) -> bool {
        self.state.removed.load(Ordering::Relaxed)
    }

    /// Reports the request's outcome for passive ejection.
    pub fn report(&self, outcome: Outcome) {
        self.state.report(outcome);
    }

    /// Same as `report(Outcome::Success)`.
    pub fn report_success(&self) {
        self.report(Outcome::Success);
    }

    /// Same as `report(Outcome::Failure)`.
    pub fn report_failure(&self) {
        self.report(Outcome::Failure);
    }
}

#[cfg(test)]
mod tests;
