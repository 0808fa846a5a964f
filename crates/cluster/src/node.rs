//! The replication engine: one task per node between the records database and chitchat.
//!
//! **Publishing.** Changes of this node's own entries (`origin == db.origin()`) come
//! from [`Db::subscribe`]. Each live entry is one chitchat key (`n<hex>`) whose value
//! is a [`crate::codec`] record carrying the chitchat version the key is set at; a
//! removal is a chitchat delete (kept `tombstone_grace`). A receiver that lags
//! drains its channel and resynchronises from [`Db::entries`]. After a batch of
//! changes the node starts a gossip round with every live peer at once, paced per
//! peer by [`crate::pace`] so a burst of changes is carried by a few rounds.
//!
//! **Applying.** On every key-change notification, live-set change and backstop tick
//! the engine walks chitchat's node states: per node id it adopts one incarnation
//! (the live one with the highest generation, else the highest generation), applies
//! the keys whose chitchat version is above what it has seen into the database
//! under `origin = node id` at that chitchat version (so a delete always outranks the
//! set before it, and a restarted node's entries are never shadowed by its old
//! ones), and hides the origin while the incarnation is dead. Adopting a new
//! incarnation first purges the origin; a node chitchat forgets is purged too.
//!
//! No decision reads a clock: versions are chitchat's per-incarnation counters, and
//! liveness is chitchat's failure detector (monotonic time, local to each node).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::{Transport, UdpTransport};
use chitchat::{
    Chitchat, ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ListenerHandle,
    ProtocolVersion, spawn_chitchat,
};
use dwara_nameserver::{Change, ChangeKind, Db, Entry};
use tokio::sync::{Notify, broadcast};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::codec::{Binding, Record, open_value, seal_value};
use crate::config::{ClusterConfig, ClusterKey};
use crate::error::{ClusterError, Result};
use crate::metrics::{Metrics, StateLabel};
use crate::pace::Pacer;
use crate::peers::{PeerInfo, PeerState};

/// Prefix of the keys that carry entries.
const ENTRY_PREFIX: &str = "n";
/// A pass that learns at least this many keys of a peer asks that peer for more at
/// once instead of waiting for the next round (chitchat sends one datagram of delta
/// per exchange, so a newcomer catches up at network speed, not one datagram a round).
const CATCH_UP_KEYS: usize = 64;

/// A running cluster node. Dropping it stops replication (as [`Cluster::shutdown`]
/// does, without waiting).
#[derive(Debug)]
pub struct Cluster {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// What the engine shares with the handle, the router and the metrics.
pub(crate) struct Shared {
    pub(crate) node_id: String,
    pub(crate) generation: u64,
    pub(crate) gossip_addr: SocketAddr,
    pub(crate) metrics: Metrics,
    pub(crate) peers: parking_lot::Mutex<Vec<PeerInfo>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("node_id", &self.node_id)
            .field("generation", &self.generation)
            .field("gossip_addr", &self.gossip_addr)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// This node's row and the peers' rows.
    pub(crate) fn peers(&self) -> Vec<PeerInfo> {
        let mut out = vec![PeerInfo {
            node_id: self.node_id.clone(),
            generation: self.generation,
            gossip_addr: self.gossip_addr,
            state: PeerState::Live,
            local: true,
            entries: usize::try_from(self.metrics.keys_published.get()).unwrap_or(0),
        }];
        out.extend(self.peers.lock().iter().cloned());
        out
    }
}

impl Cluster {
    /// Starts replicating `db` over UDP gossip. `db.origin()` must be the node id.
    pub async fn start(config: ClusterConfig, db: Arc<Db>) -> Result<Cluster> {
        Self::start_with_transport(config, db, &UdpTransport).await
    }

    /// Starts replicating `db` over `transport` (chitchat's `UdpTransport`, or its
    /// in-process `ChannelTransport` in tests).
    pub async fn start_with_transport(
        config: ClusterConfig,
        db: Arc<Db>,
        transport: &dyn Transport,
    ) -> Result<Cluster> {
        config.validate()?;
        let key = config.key.load()?;
        if db.origin() != config.node_id {
            return Err(ClusterError::OriginMismatch {
                origin: db.origin().to_owned(),
                node_id: config.node_id.clone(),
            });
        }
        match key {
            Some(_) => {
                tracing::info!(node_id = %config.node_id, "cluster key loaded: gossiped names are sealed and verified")
            }
            None => tracing::warn!(
                node_id = %config.node_id,
                "no cluster key: the cluster runs open, anyone reaching the gossip port can add names"
            ),
        }
        let generation = config.generation_id.unwrap_or_else(rand::random);
        let advertise = config.advertise_addr();
        let chitchat_id = ChitchatId::new(config.node_id.as_str(), generation, advertise);
        let fd = &config.failure_detector;
        let chitchat_config = ChitchatConfig {
            chitchat_id,
            cluster_id: config.cluster_id.clone(),
            gossip_interval: config.gossip_interval,
            listen_addr: config.gossip_listen,
            seed_nodes: config.peers.clone(),
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: fd.phi_threshold,
                sampling_window_size: fd.sampling_window_size,
                max_interval: fd.max_interval,
                // Without this the first detection of a dead peer takes the default 5 s prior.
                initial_interval: config.gossip_interval,
                dead_node_grace_period: fd.dead_node_grace,
            },
            marked_for_deletion_grace_period: config.tombstone_grace,
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        };
        // Subscribe before anything is read so no change falls between the two.
        let changes = db.subscribe();
        // Entries of other origins are from an earlier run; a peer's current ones come
        // back from gossip.
        let foreign: HashSet<String> = db
            .entries()
            .into_iter()
            .filter(|e| e.origin != config.node_id)
            .map(|e| e.origin)
            .collect();
        for origin in foreign {
            db.purge_origin(&origin);
        }
        let handle = spawn_chitchat(chitchat_config, Vec::new(), transport)
            .await
            .map_err(|source| ClusterError::Start {
                addr: config.gossip_listen,
                source: source.into(),
            })?;
        let chitchat = handle.chitchat();
        let notify = Arc::new(Notify::new());
        let (listener, live_rx) = {
            let cc = chitchat.lock().await;
            let own: Arc<str> = Arc::from(config.node_id.as_str());
            let n = notify.clone();
            let listener = cc.subscribe_event(ENTRY_PREFIX, move |ev| {
                if ev.node.node_id != own {
                    n.notify_one();
                }
            });
            (listener, cc.live_nodes_watcher())
        };
        let shared = Arc::new(Shared {
            node_id: config.node_id.clone(),
            generation,
            gossip_addr: advertise,
            metrics: Metrics::default(),
            peers: parking_lot::Mutex::new(Vec::new()),
        });
        tracing::info!(
            node_id = %config.node_id,
            generation,
            listen = %config.gossip_listen,
            advertise = %advertise,
            peers = ?config.peers,
            cluster_id = %config.cluster_id,
            "cluster gossip started"
        );
        let cancel = CancellationToken::new();
        let engine = Engine {
            db,
            shared: shared.clone(),
            handle,
            chitchat,
            key,
            cluster_id: config.cluster_id,
            changes,
            own: Own::default(),
            remotes: HashMap::new(),
            pacer: Pacer::default(),
        };
        let backstop = (config.gossip_interval * 10).max(Duration::from_millis(100));
        let task = tokio::spawn(engine.run(notify, live_rx, listener, cancel.clone(), backstop));
        Ok(Cluster {
            shared,
            cancel,
            task: Some(task),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.shared.node_id
    }

    /// This incarnation's generation.
    pub fn generation(&self) -> u64 {
        self.shared.generation
    }

    /// The advertised gossip address.
    pub fn gossip_addr(&self) -> SocketAddr {
        self.shared.gossip_addr
    }

    /// This node (`local: true`) and every peer known, live or dead, with their
    /// entry counts.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.shared.peers()
    }

    /// How many gossiped values were rejected for `reason` (`no_key`, `unsealed`,
    /// `bad_seal`, `malformed`, `version`, `outside_domain`).
    pub fn rejected_values(&self, reason: &'static str) -> u64 {
        self.shared.metrics.rejected(reason)
    }

    /// `GET /peers`: [`Cluster::peers`] as JSON.
    pub fn router(&self) -> axum::Router {
        crate::peers::router(self.shared.clone())
    }

    /// Registers the cluster's metrics.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.shared.metrics.register(registry);
    }

    /// Stops gossip and waits for the engine to finish. Entries already applied stay
    /// in the database.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(err) = task.await
        {
            tracing::warn!(error = %err, "cluster task ended abnormally");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// An entry's identity within one origin.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Ident {
    id: String,
    ip: IpAddr,
    fqdn: String,
}

impl Ident {
    fn of(e: &Entry) -> Self {
        Self {
            id: e.id.clone(),
            ip: e.ip,
            fqdn: e.fqdn.clone(),
        }
    }

    fn live(&self, origin: &str, version: u64) -> Entry {
        Entry {
            id: self.id.clone(),
            ip: self.ip,
            fqdn: self.fqdn.clone(),
            origin: origin.to_owned(),
            version,
            tombstone: false,
        }
    }

    fn tombstone(&self, origin: &str, version: u64) -> Entry {
        Entry {
            tombstone: true,
            ..self.live(origin, version)
        }
    }
}

/// This node's published keys.
#[derive(Debug, Default)]
struct Own {
    slots: HashMap<Ident, Slot>,
    next_key: u64,
    live: i64,
}

#[derive(Debug)]
struct Slot {
    key: String,
    live: bool,
}

/// What has been applied of one peer (one node id, one adopted incarnation).
#[derive(Debug)]
struct Remote {
    id: ChitchatId,
    max_seen: u64,
    last_gc_seen: u64,
    live: bool,
    keys: HashMap<String, KeyState>,
}

#[derive(Debug)]
struct KeyState {
    version: u64,
    /// The entry the key holds, when it holds an applied one.
    ident: Option<Ident>,
}

/// What one sync pass read from chitchat about one peer.
struct NodeWork {
    id: ChitchatId,
    live: bool,
    switch: bool,
    full: bool,
    max_version: u64,
    last_gc_version: u64,
    /// (key, chitchat version, value; `None` for a delete).
    kvs: Vec<(String, u64, Option<String>)>,
    /// Every key present (full passes only).
    present: HashSet<String>,
}

struct Engine {
    db: Arc<Db>,
    shared: Arc<Shared>,
    handle: ChitchatHandle,
    chitchat: Arc<tokio::sync::Mutex<Chitchat>>,
    key: Option<ClusterKey>,
    cluster_id: String,
    changes: broadcast::Receiver<Change>,
    own: Own,
    remotes: HashMap<Arc<str>, Remote>,
    pacer: Pacer,
}

impl Engine {
    async fn run(
        mut self,
        notify: Arc<Notify>,
        mut live_rx: tokio::sync::watch::Receiver<
            std::collections::BTreeMap<ChitchatId, chitchat::NodeState>,
        >,
        listener: ListenerHandle,
        cancel: CancellationToken,
        backstop: Duration,
    ) {
        self.resync_own().await;
        self.sync().await;
        let mut tick = tokio::time::interval(backstop);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut summary = tokio::time::interval(crate::invalid::SUMMARY_EVERY);
        summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut invalid_seen = crate::invalid::invalid_datagrams();
        let mut suppressed_seen = crate::invalid::suppressed_warnings();
        loop {
            let owed = self.pacer.next_due();
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                () = sleep_until_owed(owed), if owed.is_some() => self.send_owed(),
                r = self.changes.recv() => match r {
                    Ok(change) => self.publish(change).await,
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "records db changes lagged; resynchronising from the database");
                        self.shared.metrics.resyncs.inc();
                        self.resync_own().await;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                () = notify.notified() => self.sync().await,
                r = live_rx.changed() => match r {
                    Ok(()) => self.sync().await,
                    Err(_) => break,
                },
                _ = tick.tick() => self.sync().await,
                _ = summary.tick() => {
                    let total = crate::invalid::invalid_datagrams();
                    if total > invalid_seen {
                        tracing::warn!(
                            dropped = total - invalid_seen,
                            total,
                            every_s = crate::invalid::SUMMARY_EVERY.as_secs(),
                            "datagrams on the gossip port that are not chitchat messages dropped (garbage, or another protocol)"
                        );
                        invalid_seen = total;
                    }
                    let suppressed = crate::invalid::suppressed_warnings();
                    if suppressed > suppressed_seen {
                        tracing::warn!(
                            suppressed = suppressed - suppressed_seen,
                            total = suppressed,
                            limit = crate::invalid::WARNINGS_PER_WINDOW,
                            every_s = crate::invalid::SUMMARY_EVERY.as_secs(),
                            "chitchat warnings beyond the limit left out of the log (a misconfigured or hostile peer: see the ones logged)"
                        );
                        suppressed_seen = suppressed;
                    }
                }
            }
        }
        drop(listener);
        if let Err(err) = self.handle.shutdown().await {
            tracing::warn!(error = %err, "chitchat shutdown failed");
        }
        tracing::info!(node_id = %self.shared.node_id, "cluster gossip stopped");
    }

    fn binding<'a>(&'a self, node_id: &'a str, generation: u64, key: &'a str) -> Binding<'a> {
        Binding {
            cluster_id: &self.cluster_id,
            node_id,
            generation,
            key,
        }
    }

    /// Publishes `first` and every change already queued behind it, then pushes.
    async fn publish(&mut self, first: Change) {
        let mut batch = vec![first];
        let mut lagged = false;
        loop {
            match self.changes.try_recv() {
                Ok(c) => batch.push(c),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    lagged = true;
                    break;
                }
                Err(_) => break,
            }
        }
        if lagged {
            tracing::warn!("records db changes lagged; resynchronising from the database");
            self.shared.metrics.resyncs.inc();
            self.resync_own().await;
            return;
        }
        let chitchat = self.chitchat.clone();
        let mut cc = chitchat.lock().await;
        let mut changed = false;
        for change in batch {
            if change.entry.origin != self.shared.node_id {
                continue;
            }
            let ident = Ident::of(&change.entry);
            changed |= match change.kind {
                ChangeKind::Added => self.own_set(&mut cc, ident),
                ChangeKind::Purged => self.own_unset(&mut cc, &ident, Forget::Yes),
                _ => self.own_unset(&mut cc, &ident, Forget::No),
            };
        }
        self.push(&cc, changed);
    }

    /// Drains the change channel and makes the published keys match the database.
    async fn resync_own(&mut self) {
        // Queued changes are older than the snapshot read next.
        while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = self.changes.try_recv() {
        }
        let mut live = HashSet::new();
        let mut known = HashSet::new();
        for e in self.db.entries() {
            if e.origin != self.shared.node_id {
                continue;
            }
            let ident = Ident::of(&e);
            if !e.tombstone {
                live.insert(ident.clone());
            }
            known.insert(ident);
        }
        let chitchat = self.chitchat.clone();
        let mut cc = chitchat.lock().await;
        let mut changed = false;
        let stale: Vec<(Ident, Forget)> = self
            .own
            .slots
            .iter()
            .filter(|(ident, slot)| {
                !known.contains(*ident) || (slot.live && !live.contains(*ident))
            })
            .map(|(ident, _)| {
                let forget = if known.contains(ident) {
                    Forget::No
                } else {
                    Forget::Yes
                };
                (ident.clone(), forget)
            })
            .collect();
        for (ident, forget) in stale {
            changed |= self.own_unset(&mut cc, &ident, forget);
        }
        for ident in live {
            changed |= self.own_set(&mut cc, ident);
        }
        tracing::debug!(published = self.own.live, "own entries resynchronised");
        self.push(&cc, changed);
    }

    /// Sets the key of a live own entry. Returns whether chitchat changed.
    fn own_set(&mut self, cc: &mut Chitchat, ident: Ident) -> bool {
        let next_key = &mut self.own.next_key;
        let slot = self.own.slots.entry(ident.clone()).or_insert_with(|| {
            let key = format!("{ENTRY_PREFIX}{:x}", *next_key);
            *next_key += 1;
            Slot { key, live: false }
        });
        if slot.live {
            return false;
        }
        let key = slot.key.clone();
        slot.live = true;
        let node = cc.self_node_state();
        // `set` gives the key the next version of this incarnation; the record carries
        // it so a receiver can tell the value was published for that version.
        let version = node.max_version() + 1;
        let record = Record {
            id: ident.id,
            ip: ident.ip,
            fqdn: ident.fqdn,
            version,
        };
        let binding = Binding {
            cluster_id: &self.cluster_id,
            node_id: &self.shared.node_id,
            generation: self.shared.generation,
            key: &key,
        };
        let value = seal_value(&record, self.key.as_ref(), &binding);
        node.set(&key, value);
        if node.get_versioned(&key).map(|v| v.version) != Some(version) {
            tracing::error!(key = %key, version, "published key did not get the expected version");
        }
        self.own.live += 1;
        self.shared.metrics.keys_published.set(self.own.live);
        true
    }

    /// Deletes the key of an own entry if it is live; forgets the slot when asked.
    fn own_unset(&mut self, cc: &mut Chitchat, ident: &Ident, forget: Forget) -> bool {
        let mut changed = false;
        if let Some(slot) = self.own.slots.get_mut(ident)
            && slot.live
        {
            cc.self_node_state().delete(&slot.key);
            slot.live = false;
            self.own.live -= 1;
            self.shared.metrics.keys_published.set(self.own.live);
            changed = true;
        }
        if forget == Forget::Yes {
            self.own.slots.remove(ident);
        }
        changed
    }

    /// Starts a gossip round with every live peer so a change spreads at once (or at
    /// the end of the peer's pacing gap, in the round that carries the whole burst).
    fn push(&mut self, cc: &Chitchat, changed: bool) {
        if !changed {
            return;
        }
        let me = cc.self_chitchat_id().clone();
        let peers: HashSet<SocketAddr> = cc
            .live_nodes()
            .filter(|id| **id != me)
            .map(|id| id.gossip_advertise_addr)
            .collect();
        self.pacer.retain(|addr| peers.contains(addr));
        let now = tokio::time::Instant::now();
        for addr in peers {
            if self.pacer.request(addr, now) && self.handle.gossip(addr).is_ok() {
                self.shared.metrics.pushes.inc();
            }
        }
    }

    /// Starts the rounds the pacer held back and are now due.
    fn send_owed(&mut self) {
        for addr in self.pacer.due(tokio::time::Instant::now()) {
            if self.handle.gossip(addr).is_ok() {
                self.shared.metrics.pushes.inc();
            }
        }
    }

    /// Brings the database in line with chitchat's view of every peer.
    async fn sync(&mut self) {
        let mut work = Vec::new();
        let mut seen: HashSet<Arc<str>> = HashSet::new();
        {
            let cc = self.chitchat.lock().await;
            let live: HashSet<&ChitchatId> = cc.live_nodes().collect();
            let mut best: HashMap<&Arc<str>, (&ChitchatId, bool)> = HashMap::new();
            for id in cc.node_states().keys() {
                if *id.node_id == *self.shared.node_id {
                    continue;
                }
                let is_live = live.contains(id);
                let better = best.get(&id.node_id).is_none_or(|(b, b_live)| {
                    (is_live, id.generation_id) > (*b_live, b.generation_id)
                });
                if better {
                    best.insert(&id.node_id, (id, is_live));
                }
            }
            for (node_id, (id, is_live)) in best {
                seen.insert(node_id.clone());
                let Some(state) = cc.node_state(id) else {
                    continue;
                };
                let remote = self.remotes.get(node_id);
                let switch = remote.is_none_or(|r| r.id != *id);
                let (max_seen, last_gc_seen, was_live) =
                    remote.map_or((0, 0, false), |r| (r.max_seen, r.last_gc_seen, r.live));
                let full = switch
                    || state.max_version() < max_seen
                    || (state.last_gc_version() > max_seen
                        && state.last_gc_version() != last_gc_seen);
                if !full && state.max_version() == max_seen && was_live == is_live {
                    continue;
                }
                let kvs = state
                    .key_values_including_deleted()
                    .filter(|(k, v)| k.starts_with(ENTRY_PREFIX) && (full || v.version > max_seen))
                    .map(|(k, v)| {
                        let value = (!v.is_deleted()).then(|| v.value.clone());
                        (k.to_owned(), v.version, value)
                    })
                    .collect();
                let present = if full {
                    state
                        .key_values_including_deleted()
                        .map(|(k, _)| k.to_owned())
                        .collect()
                } else {
                    HashSet::new()
                };
                work.push(NodeWork {
                    id: id.clone(),
                    live: is_live,
                    switch,
                    full,
                    max_version: state.max_version(),
                    last_gc_version: state.last_gc_version(),
                    kvs,
                    present,
                });
            }
        }
        let gone: Vec<Arc<str>> = self
            .remotes
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect();
        let view_changed = !gone.is_empty() || !work.is_empty();
        for node_id in gone {
            let purged = self.db.purge_origin(&node_id);
            self.remotes.remove(&node_id);
            tracing::info!(node_id = %node_id, purged, "peer forgotten by gossip; its entries purged");
        }
        let mut pull = Vec::new();
        for w in work {
            if w.live && w.kvs.len() >= CATCH_UP_KEYS {
                pull.push(w.id.gossip_advertise_addr);
            }
            self.apply_node(w);
        }
        let now = tokio::time::Instant::now();
        for addr in pull {
            if self.handle.gossip(addr).is_ok() {
                self.pacer.started(addr, now);
                self.shared.metrics.pulls.inc();
            }
        }
        if view_changed {
            self.refresh_view();
        }
    }

    fn apply_node(&mut self, w: NodeWork) {
        let node_id = w.id.node_id.clone();
        if w.switch {
            let purged = self.db.purge_origin(&node_id);
            if let Some(old) = self.remotes.get(&node_id) {
                tracing::info!(
                    node_id = %node_id,
                    old_generation = old.id.generation_id,
                    generation = w.id.generation_id,
                    purged,
                    "peer restarted; old incarnation's entries purged"
                );
            } else {
                tracing::info!(node_id = %node_id, generation = w.id.generation_id, addr = %w.id.gossip_advertise_addr, "peer discovered");
            }
            if w.live {
                self.db.show_origin(&node_id);
            } else {
                self.db.hide_origin(&node_id);
            }
            self.remotes.insert(
                node_id.clone(),
                Remote {
                    id: w.id.clone(),
                    max_seen: 0,
                    last_gc_seen: 0,
                    live: w.live,
                    keys: HashMap::new(),
                },
            );
        }
        let generation = w.id.generation_id;
        let mut outcomes = Vec::with_capacity(w.kvs.len());
        for (key, _, value) in &w.kvs {
            let opened = value.as_deref().map(|v| {
                open_value(
                    v,
                    self.key.as_ref(),
                    &self.binding(&node_id, generation, key),
                )
            });
            outcomes.push(opened);
        }
        let Some(remote) = self.remotes.get_mut(&node_id) else {
            return;
        };
        let db = &self.db;
        let metrics = &self.shared.metrics;
        let apply = |entry: Entry| match db.apply(entry) {
            Ok(true) => {
                metrics.entries_applied.inc();
                true
            }
            Ok(false) => true,
            Err(err) => {
                tracing::debug!(node_id = %node_id, error = %err, "peer entry not applied");
                metrics.reject("outside_domain");
                false
            }
        };
        for ((key, version, _), opened) in w.kvs.into_iter().zip(outcomes) {
            let ks = remote.keys.entry(key).or_insert(KeyState {
                version: 0,
                ident: None,
            });
            if ks.version >= version {
                continue;
            }
            ks.version = version;
            match opened {
                None => {
                    if let Some(old) = ks.ident.take() {
                        apply(old.tombstone(&node_id, version));
                    }
                }
                Some(Ok(record)) if record.version == version => {
                    let ident = Ident {
                        id: record.id,
                        ip: record.ip,
                        fqdn: record.fqdn,
                    };
                    if let Some(old) = ks.ident.take()
                        && old != ident
                    {
                        apply(old.tombstone(&node_id, version));
                    }
                    if apply(ident.live(&node_id, version)) {
                        ks.ident = Some(ident);
                    }
                }
                Some(Ok(record)) => {
                    tracing::warn!(node_id = %node_id, record_version = record.version, version, "gossiped value replayed under another version; rejected");
                    metrics.reject("version");
                }
                Some(Err(err)) => {
                    tracing::warn!(node_id = %node_id, error = %err, "gossiped value rejected");
                    metrics.reject(err.reason());
                }
            }
        }
        if w.full {
            let floor = w.max_version.max(w.last_gc_version);
            let absent: Vec<String> = remote
                .keys
                .keys()
                .filter(|k| !w.present.contains(*k))
                .cloned()
                .collect();
            for key in absent {
                if let Some(KeyState {
                    ident: Some(old), ..
                }) = remote.keys.remove(&key)
                {
                    apply(old.tombstone(&node_id, floor));
                }
            }
        }
        remote.max_seen = w.max_version;
        remote.last_gc_seen = w.last_gc_version;
        if remote.live != w.live {
            remote.live = w.live;
            if w.live {
                db.show_origin(&node_id);
            } else {
                db.hide_origin(&node_id);
            }
            if w.live {
                tracing::info!(node_id = %node_id, "peer is live again; its entries are shown");
            } else {
                tracing::info!(node_id = %node_id, "peer is dead; its entries are hidden");
            }
        }
    }

    fn refresh_view(&self) {
        let mut rows: Vec<PeerInfo> = self
            .remotes
            .values()
            .map(|r| PeerInfo {
                node_id: r.id.node_id.to_string(),
                generation: r.id.generation_id,
                gossip_addr: r.id.gossip_advertise_addr,
                state: if r.live {
                    PeerState::Live
                } else {
                    PeerState::Dead
                },
                local: false,
                entries: r.keys.values().filter(|k| k.ident.is_some()).count(),
            })
            .collect();
        rows.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        let live = rows.iter().filter(|r| r.state == PeerState::Live).count();
        let metrics = &self.shared.metrics;
        let gauge = |state| metrics.peers.get_or_create(&StateLabel { state }).clone();
        gauge("live").set(i64::try_from(live).unwrap_or(i64::MAX));
        gauge("dead").set(i64::try_from(rows.len() - live).unwrap_or(i64::MAX));
        *self.shared.peers.lock() = rows;
    }
}

/// Sleeps until `at` (the select guard keeps `None` from being polled).
async fn sleep_until_owed(at: Option<tokio::time::Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Whether an own slot is dropped after its key is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forget {
    Yes,
    No,
}
