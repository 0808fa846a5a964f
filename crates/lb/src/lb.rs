//! `UpstreamLb`: the current endpoint snapshot behind an atomic pointer swap, the
//! guards that picks hand out, and `LbHandle`, a per-task handle that caches the
//! snapshot.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::hash::hash_key;
use crate::health::{
    EjectionClock, EjectionConfig, EndpointState, MonotonicEjectionClock, Outcome, Shared,
};
use crate::picker::Picker;
use crate::rng::{Draw, LocalTicket, Ticket, below};
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
    /// States of removed endpoints that may still have guards: kept alive here (a
    /// guard's `Weak` does not) until no guard and no old snapshot refers to them.
    draining: Vec<Arc<EndpointState>>,
    /// Superseded snapshots still referenced elsewhere (a handle that has not picked
    /// since, a pick in progress). Holding them here means whoever lets go of one last
    /// only decrements a count: freeing a snapshot (a reference-count decrement per
    /// endpoint, the picker's tables) stays on the writer, off the pick path.
    retired: Vec<Arc<Snapshot>>,
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
    /// Bumped after every publish: how an [`LbHandle`] knows its snapshot is stale.
    version: AtomicU64,
    ticket: Ticket,
    policy: Policy,
    shared: Arc<Shared>,
    writer: Mutex<Writer>,
    /// Tasks awaiting the next publish ([`UpstreamLb::updated`]).
    watchers: Mutex<Vec<Waker>>,
}

/// Builds an [`UpstreamLb`] with a fixed seed, passive ejection, or a test clock.
#[derive(Debug)]
#[must_use]
pub struct UpstreamLbBuilder {
    policy: Policy,
    seed: Option<u64>,
    ejection: Option<EjectionConfig>,
    clock: Option<Arc<dyn EjectionClock>>,
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

    /// The clock for ejection cool-downs (default: [`MonotonicEjectionClock`]).
    pub fn clock(mut self, clock: Arc<dyn EjectionClock>) -> Self {
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
                .unwrap_or_else(|| Arc::new(MonotonicEjectionClock::new())),
        ));
        let empty = Snapshot {
            set: EndpointSet::empty(),
            states: Box::new([]),
            picker: Picker::build(self.policy, &[]),
        };
        let lb = UpstreamLb {
            current: ArcSwap::from_pointee(empty),
            version: AtomicU64::new(0),
            ticket: Ticket::new(self.seed.unwrap_or_else(rand::random)),
            policy: self.policy,
            shared,
            writer: Mutex::new(Writer::default()),
            watchers: Mutex::new(Vec::new()),
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
                    .position(|s| s.addr == e.addr)
                    .map(|i| writer.draining.swap_remove(i));
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
                writer.draining.push(Arc::clone(s));
            }
        }
        let picker = Picker::build(self.policy, set.as_slice());
        let endpoints = set.len();
        let old = self.current.swap(Arc::new(Snapshot {
            set,
            states,
            picker,
        }));
        self.version.fetch_add(1, Ordering::Release);
        // After the bump: a watcher that saw the old version under this lock is
        // in the list, one that takes the lock after sees the new version.
        let watchers =
            std::mem::take(&mut *self.watchers.lock().unwrap_or_else(PoisonError::into_inner));
        watchers.into_iter().for_each(Waker::wake);
        drop(prev);
        writer.retired.push(old);
        writer.retired.retain(|s| Arc::strong_count(s) > 1);
        // keep what a guard or an old snapshot (a pick in progress, a handle) still
        // refers to; an ejected state dropped here leaves the ejection count
        writer
            .draining
            .retain(|s| Arc::strong_count(s) > 1 || s.in_flight() > 0);
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

    /// A count of the sets published so far, bumped by every [`update`] that
    /// changed the set. Read it before [`endpoints`], then await
    /// [`updated`]`(version)` to learn of any set published since.
    ///
    /// [`update`]: Self::update
    /// [`endpoints`]: Self::endpoints
    /// [`updated`]: Self::updated
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Completes once a set newer than `version` (a value [`version`] returned)
    /// has been published: at once if one already has. For a task that acts on
    /// a change of the set as it happens, such as closing pooled connections to
    /// endpoints that left. Runtime-agnostic: it wakes the task that polled it.
    ///
    /// [`version`]: Self::version
    pub fn updated(&self, version: u64) -> Updated<'_> {
        Updated { lb: self, version }
    }

    /// Picks an endpoint with the policy. Under [`Policy::ConsistentHash`] a pick
    /// without a key uses a random key.
    #[inline]
    pub fn pick(&self) -> Result<PickGuard, NoEndpoints> {
        let snap = self.current.load();
        let i = self.choose(&snap, None, &mut &self.ticket)?;
        Ok(PickGuard::new(&snap, i))
    }

    /// Picks the endpoint for `key` under [`Policy::ConsistentHash`] (the same key
    /// maps to the same endpoint while the set stays, and to the same endpoint on
    /// every process that has the same set); other policies ignore the key.
    #[inline]
    pub fn pick_by_key(&self, key: &[u8]) -> Result<PickGuard, NoEndpoints> {
        let snap = self.current.load();
        let i = self.choose(&snap, self.key_hash(key), &mut &self.ticket)?;
        Ok(PickGuard::new(&snap, i))
    }

    /// Picks like [`pick_by_key`](Self::pick_by_key), but not one of `exclude`
    /// (the endpoints a request has already tried) while another is left. After
    /// the key's own endpoint come its alternatives, in the order the key falls
    /// back through when its endpoint is ejected (the same for the same key, so a
    /// retried request of one key goes where the key's other requests go while
    /// its endpoint fails), healthy ones before ejected ones. When every endpoint
    /// is excluded, the key's own pick. Under a policy other than
    /// [`Policy::ConsistentHash`] the key is ignored and the policy picks again.
    pub fn pick_by_key_excluding(
        &self,
        key: &[u8],
        exclude: &[SocketAddr],
    ) -> Result<PickGuard, NoEndpoints> {
        let snap = self.current.load();
        let key = self.key_hash(key);
        let mut draw = &self.ticket;
        let first = self.choose(&snap, key, &mut draw)?;
        let eps = snap.set.as_slice();
        let open = |i: usize| !exclude.contains(&eps[i].addr);
        if open(first) {
            return Ok(PickGuard::new(&snap, first));
        }
        let healthy = |i: usize| !snap.states[i].is_ejected();
        let i = Self::alternative(&snap, key, &mut draw, |i| open(i) && healthy(i))
            .or_else(|| Self::alternative(&snap, key, &mut draw, open))
            .unwrap_or(first);
        Ok(PickGuard::new(&snap, i))
    }

    /// Picks like [`pick`](Self::pick) but returns only the endpoint: nothing is
    /// counted in flight, so P2C and [`in_flight`](Self::in_flight) do not see the
    /// request and there is no guard to report an outcome on (use
    /// [`report`](Self::report)). For callers that send one datagram or track load
    /// themselves.
    #[inline]
    pub fn pick_endpoint(&self) -> Result<Endpoint, NoEndpoints> {
        let snap = self.current.load();
        let i = self.choose(&snap, None, &mut &self.ticket)?;
        Ok(snap.set.as_slice()[i])
    }

    /// [`pick_by_key`](Self::pick_by_key) without the guard, as
    /// [`pick_endpoint`](Self::pick_endpoint).
    #[inline]
    pub fn pick_endpoint_by_key(&self, key: &[u8]) -> Result<Endpoint, NoEndpoints> {
        let snap = self.current.load();
        let i = self.choose(&snap, self.key_hash(key), &mut &self.ticket)?;
        Ok(snap.set.as_slice()[i])
    }

    /// A handle for one task or thread that picks often: it caches the current
    /// snapshot (a pick checks a version counter instead of taking an `arc-swap`
    /// load) and
    /// keeps its own round-robin position and random sequence (no shared counter), as
    /// Envoy gives each worker its own load balancer. See [`LbHandle`].
    pub fn handle(self: &Arc<Self>) -> LbHandle {
        // the version first: the snapshot loaded after it is at least that new
        let version = self.version.load(Ordering::Acquire);
        LbHandle {
            version,
            snapshot: self.current.load_full(),
            lb: Arc::clone(self),
            draw: LocalTicket::from_shared(&self.ticket),
        }
    }

    #[inline]
    fn key_hash(&self, key: &[u8]) -> Option<u64> {
        match self.policy {
            Policy::ConsistentHash => Some(hash_key(key)),
            _ => None,
        }
    }

    /// The policy's choice in `snap`, an index into its set, avoiding ejected
    /// endpoints. Always inlined: the pick methods are thin wrappers around it, and a
    /// call per pick costs as much as the round-robin policy itself.
    #[inline(always)]
    fn choose(
        &self,
        snap: &Snapshot,
        key: Option<u64>,
        draw: &mut impl Draw,
    ) -> Result<usize, NoEndpoints> {
        let eps = snap.set.as_slice();
        if eps.is_empty() {
            return Err(NoEndpoints);
        }
        let in_flight = |i: usize| snap.states[i].in_flight();
        let i = snap.picker.pick(eps, in_flight, draw, key, 0);
        Ok(
            if self.shared.any_ejected() && snap.states[i].is_ejected() {
                self.avoid_ejected(snap, key, i, draw)
            } else {
                i
            },
        )
    }

    /// The slow path after picking an ejected endpoint: a few more tries with the
    /// policy, then the first healthy endpoint in the policy's order of preference,
    /// else the original pick (every candidate is ejected: ignore ejection).
    #[cold]
    fn avoid_ejected(
        &self,
        snap: &Snapshot,
        key: Option<u64>,
        first: usize,
        draw: &mut impl Draw,
    ) -> usize {
        let healthy = |i: usize| !snap.states[i].is_ejected();
        if let Some(groups) = snap.picker.srv_groups() {
            // RFC 2782: the lowest priority group that still has a usable endpoint
            for group in groups {
                let members = group.members();
                if !members.iter().any(|&m| healthy(m as usize)) {
                    continue;
                }
                for _ in 0..RETRIES {
                    let i = Picker::srv_pick_in(group, draw);
                    if healthy(i) {
                        return i;
                    }
                }
                let start = below(draw.random(), members.len());
                let rotated = members[start..].iter().chain(&members[..start]);
                if let Some(&m) = rotated.into_iter().find(|&&m| healthy(m as usize)) {
                    return m as usize;
                }
            }
            return first;
        }
        Self::alternative(snap, key, draw, healthy).unwrap_or(first)
    }

    /// The first `wanted` endpoint among the policy's alternatives for `key` (a
    /// few more attempts), then among all endpoints from a start deterministic
    /// for a key, so that one key keeps going to one fallback.
    fn alternative(
        snap: &Snapshot,
        key: Option<u64>,
        draw: &mut impl Draw,
        wanted: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let eps = snap.set.as_slice();
        let in_flight = |i: usize| snap.states[i].in_flight();
        for attempt in 1..=RETRIES {
            let i = snap.picker.pick(eps, in_flight, draw, key, attempt);
            if wanted(i) {
                return Some(i);
            }
        }
        let start = match key {
            Some(h) => below(h, eps.len()),
            None => below(draw.random(), eps.len()),
        };
        (start..eps.len()).chain(0..start).find(|&i| wanted(i))
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
        if let Some(n) = self.with_state(addr, |s| s.in_flight()) {
            return n;
        }
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        writer
            .draining
            .iter()
            .filter(|s| s.addr == addr)
            .map(|s| s.in_flight())
            .sum()
    }

    /// Requests still in flight to endpoints that have left the set.
    pub fn draining(&self) -> usize {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        writer.draining.iter().map(|s| s.in_flight()).sum()
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
                in_flight: s.in_flight(),
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
/// count drops when the guard is dropped. The guard refers to its endpoint's state
/// (no borrow of the load balancer), so it keeps working after the endpoint is
/// removed from the set while the connection drains. It even outlives the load
/// balancer: the endpoint is still there, [`is_draining`](Self::is_draining) is
/// `true` and reports go nowhere.
#[derive(Debug)]
#[must_use = "dropping the guard ends the request's in-flight count at once"]
pub struct PickGuard {
    endpoint: Endpoint,
    /// Counted by the state's weak count; the load balancer keeps the state alive
    /// while any guard is.
    state: Weak<EndpointState>,
}

impl PickGuard {
    /// A guard on endpoint `i` of `snap`. The `Weak` is the in-flight +1 (see
    /// `EndpointState`); dropping the guard drops it, the -1.
    #[inline]
    fn new(snap: &Snapshot, i: usize) -> Self {
        Self {
            endpoint: snap.set.as_slice()[i],
            state: Arc::downgrade(&snap.states[i]),
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
        self.state
            .upgrade()
            .is_none_or(|s| s.removed.load(Ordering::Relaxed))
    }

    /// Reports the request's outcome for passive ejection.
    pub fn report(&self, outcome: Outcome) {
        // the load balancer keeps the state alive while a guard is: this upgrade
        // fails only once the load balancer itself is gone, with nothing to eject
        if let Some(s) = self.state.upgrade() {
            s.report(outcome);
        }
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

/// A per-task (or per-thread) handle on an [`UpstreamLb`], from
/// [`UpstreamLb::handle`], for code that picks often: a proxy worker, a connection
/// pool, a datagram forwarder.
///
/// - It caches the current snapshot: a pick checks that the load balancer's version
///   (bumped by every publish) is still the cached one, a plain load, instead of
///   taking an `arc-swap` load, and reloads when it changed. So, as with
///   [`UpstreamLb::pick`], a pick that starts after [`UpstreamLb::update`] has
///   returned sees only the new set.
/// - It has its own round-robin position and random sequence, so a pick takes no
///   shared atomic counter. Round robin is then per handle, as in Envoy, where each
///   worker has its own load balancer: every handle cycles through the whole set
///   from its own starting point, so each endpoint's share stays even across handles
///   (to within one pick per handle per cycle). A seeded load balancer gives its
///   handles seeds of their own, in the order they are created.
///
/// Picks take `&mut self`: clone the handle (or call `handle()` again) for each task.
/// Until its next pick a handle keeps its last snapshot alive, and with it the states
/// of endpoints that have left the set; in-flight counts, draining and P2C are not
/// affected by that.
#[derive(Debug)]
pub struct LbHandle {
    version: u64,
    snapshot: Arc<Snapshot>,
    lb: Arc<UpstreamLb>,
    draw: LocalTicket,
}

impl Clone for LbHandle {
    /// Another handle on the same load balancer, with its own position and random
    /// sequence (a copy would pick in lockstep with this one).
    fn clone(&self) -> Self {
        self.lb.handle()
    }
}

impl LbHandle {
    /// The load balancer this handle picks from.
    pub fn lb(&self) -> &Arc<UpstreamLb> {
        &self.lb
    }

    /// [`UpstreamLb::pick`] through the cached snapshot.
    #[inline]
    pub fn pick(&mut self) -> Result<PickGuard, NoEndpoints> {
        let i = self.choose(None)?;
        Ok(PickGuard::new(&self.snapshot, i))
    }

    /// [`UpstreamLb::pick_by_key`] through the cached snapshot.
    #[inline]
    pub fn pick_by_key(&mut self, key: &[u8]) -> Result<PickGuard, NoEndpoints> {
        let i = self.choose(self.lb.key_hash(key))?;
        Ok(PickGuard::new(&self.snapshot, i))
    }

    /// [`UpstreamLb::pick_endpoint`] (nothing counted in flight) through the cached
    /// snapshot. The endpoint is borrowed from the snapshot, as a slice round robin
    /// would return it; copy it (`*h.pick_endpoint()?`) to keep it.
    #[inline]
    pub fn pick_endpoint(&mut self) -> Result<&Endpoint, NoEndpoints> {
        let i = self.choose(None)?;
        Ok(&self.snapshot.set.as_slice()[i])
    }

    /// [`UpstreamLb::pick_endpoint_by_key`] through the cached snapshot.
    #[inline]
    pub fn pick_endpoint_by_key(&mut self, key: &[u8]) -> Result<&Endpoint, NoEndpoints> {
        let i = self.choose(self.lb.key_hash(key))?;
        Ok(&self.snapshot.set.as_slice()[i])
    }

    /// The policy's choice in the current snapshot (reloaded first if stale).
    #[inline(always)]
    fn choose(&mut self, key: Option<u64>) -> Result<usize, NoEndpoints> {
        if self.lb.version.load(Ordering::Acquire) != self.version {
            self.reload();
        }
        self.lb.choose(&self.snapshot, key, &mut self.draw)
    }

    /// Takes the current snapshot (off the common path: once per update).
    #[cold]
    #[inline(never)]
    fn reload(&mut self) {
        self.version = self.lb.version.load(Ordering::Acquire);
        self.snapshot = self.lb.current.load_full();
    }
}

/// The future of [`UpstreamLb::updated`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Updated<'a> {
    lb: &'a UpstreamLb,
    version: u64,
}

impl Future for Updated<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let lb = self.lb;
        if lb.version.load(Ordering::Acquire) != self.version {
            return Poll::Ready(());
        }
        let mut watchers = lb.watchers.lock().unwrap_or_else(PoisonError::into_inner);
        // Again under the lock, which `update` takes after its bump.
        if lb.version.load(Ordering::Acquire) != self.version {
            return Poll::Ready(());
        }
        if !watchers.iter().any(|w| w.will_wake(cx.waker())) {
            watchers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests;
