//! The replication engine: one task per node between the records database and chitchat.
//!
//! **Publishing.** Changes of this node's own entries (`origin == db.origin()`) come
//! from [`Db::subscribe`]. Each live entry sits in one of `2^bits` buckets by a hash
//! of its identity; each non-empty bucket is one chitchat key (`b<bits>.<index>`)
//! whose value is a [`crate::codec`] bucket carrying the chitchat version the key is
//! set at. Changes are written to chitchat at once, or, within 10 ms of the last
//! write, at the end of those 10 ms together with what came meanwhile; a write sets
//! each bucket it touched once and then [`META_KEY`]. A bucket that empties is a
//! chitchat delete (kept `tombstone_grace`). When a bucket would outgrow
//! [`BUCKET_BYTES`] the count doubles: every entry is set in its new bucket first,
//! then the old keys are deleted (a receiver may still learn of the deletes first;
//! see `Holdings` for why no entry blinks out). A receiver that lags drains its channel and resynchronises from [`Db::entries`].
//! After a batch of changes the node starts a gossip round with up to
//! `push_fanout` live peers at once (all of them in a cluster that small, else as
//! many picked at random), paced per peer by [`crate::pace`] so a burst of changes
//! is carried by a few rounds; the other peers get the change from the periodic
//! rounds.
//!
//! **Applying.** On every key-change notification, live-set change and backstop tick
//! the engine walks chitchat's node states: per node id it adopts one incarnation
//! (the live one with the highest generation, else the highest generation), and for
//! each key whose chitchat version is above what it has seen compares the key's
//! entries with the ones it applied from that key before: entries that arrived are
//! applied into the database under `origin = node id` at the key's chitchat version,
//! entries that left (or a deleted key's) become tombstones at that version (so a
//! delete always outranks the set before it, and a restarted node's entries are never
//! shadowed by its old ones). An entry two keys hold (the moment a bucket count
//! doubles) stays until neither does. The origin is hidden while the incarnation is
//! dead. Adopting a new incarnation first purges the origin; a node chitchat forgets
//! is purged too. Keys of builds before buckets (`n<hex>`, one entry each) are read
//! the same way.
//!
//! No decision reads a clock: versions are chitchat's per-incarnation counters, and
//! liveness is chitchat's failure detector (monotonic time, local to each node).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::{Transport, UdpTransport};
use chitchat::{
    Chitchat, ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ListenerHandle,
    ProtocolVersion, spawn_chitchat,
};
use dwara_records::{Change, ChangeKind, Db, Entry, Health, ServicePort};
use rand::SeedableRng;
use tokio::sync::{Notify, broadcast};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::codec::{BUCKET_OVERHEAD, Bucket, Item, decode_bucket_value, encode_bucket_value};
use crate::config::{ClusterConfig, KeySource};
use crate::datagram::Rejection;
use crate::error::{ClusterError, Result};
use crate::metrics::{Metrics, StateLabel};
use crate::pace::Pacer;
use crate::peers::{PeerInfo, PeerState};
use crate::transport::{KeyReloader, Seal, SealedTransport};

/// Prefix of the keys that carry buckets of entries.
const BUCKET_PREFIX: &str = "b";
/// Prefix of the single-entry keys of builds before buckets (read, never written).
const LEGACY_PREFIX: &str = "n";
/// The most plain bytes one bucket holds before the bucket count doubles: about 60
/// typical entries; in base64 about 11 kB, so several fit in one gossip
/// datagram (65,507 bytes) beside the digest.
pub const BUCKET_BYTES: usize = 8 * 1024;
/// The bucket count stops doubling at `2^MAX_BUCKET_BITS` (16 million buckets: never
/// reached with a fair hash before memory runs out).
const MAX_BUCKET_BITS: u32 = 24;
/// A pass that learns at least this many keys, or this many bytes of values, of a
/// peer asks that peer for more at once instead of waiting for the next round
/// (chitchat sends one datagram of delta per exchange, so a newcomer catches up at
/// network speed, not one datagram a round).
const CATCH_UP_KEYS: usize = 64;
const CATCH_UP_BYTES: usize = 32 * 1024;

/// The key a node sets last in every change of its entries. Its value is only there to
/// change (the version it is set at); what counts is that it is the newest key: a
/// receiver whose copy of the node's state ends with it has every key as of that
/// change, so an entry no key holds any more is really gone (see [`Holdings`]).
const META_KEY: &str = "m";

fn is_entry_key(key: &str) -> bool {
    key.starts_with(BUCKET_PREFIX) || key.starts_with(LEGACY_PREFIX)
}

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
    /// The datagram seal, when the node has a key.
    pub(crate) seal: Option<Arc<Seal>>,
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
    /// With a key every datagram is sealed ([`crate::datagram`]); without one gossip
    /// runs open, as the log says.
    pub async fn start(config: ClusterConfig, db: Arc<Db>) -> Result<Cluster> {
        config.validate()?;
        let metrics = Metrics::default();
        if let KeySource::File(path) = &config.key {
            crate::config::warn_if_readable_by_others(path);
        }
        match config.key.load()? {
            Some(keyring) => {
                let ids = keyring.ids();
                let seal = Arc::new(Seal::new(
                    config.cluster_id.clone(),
                    keyring,
                    config.key.clone(),
                    &metrics,
                ));
                tracing::info!(
                    node_id = %config.node_id,
                    keys = ?ids,
                    "cluster key loaded: every gossip datagram is sealed (XChaCha20-Poly1305) with the first key and opened with any, nodes without a key are not heard"
                );
                let transport = SealedTransport::with_seal(seal.clone());
                Self::start_inner(config, db, &transport, metrics, Some(seal)).await
            }
            None => {
                tracing::warn!(
                    node_id = %config.node_id,
                    "no cluster key: gossip runs open (unauthenticated, unencrypted); anyone reaching the gossip port can join and add, hide or delete names"
                );
                Self::start_inner(config, db, &UdpTransport, metrics, None).await
            }
        }
    }

    /// Starts replicating `db` over `transport` (chitchat's `UdpTransport`, or its
    /// in-process `ChannelTransport` in tests), unsealed: a configured key is an
    /// error, since only [`Cluster::start`]'s transport seals datagrams.
    pub async fn start_with_transport(
        config: ClusterConfig,
        db: Arc<Db>,
        transport: &dyn Transport,
    ) -> Result<Cluster> {
        config.validate()?;
        if config.key != KeySource::Open {
            return Err(ClusterError::InvalidSetting {
                setting: "key",
                reason: "a cluster key seals datagrams only over Cluster::start's UDP transport"
                    .to_owned(),
            });
        }
        Self::start_inner(config, db, transport, Metrics::default(), None).await
    }

    async fn start_inner(
        config: ClusterConfig,
        db: Arc<Db>,
        transport: &dyn Transport,
        metrics: Metrics,
        seal: Option<Arc<Seal>>,
    ) -> Result<Cluster> {
        if db.origin() != config.node_id {
            return Err(ClusterError::OriginMismatch {
                origin: db.origin().to_owned(),
                node_id: config.node_id.clone(),
            });
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
        let (listeners, live_rx) = {
            let cc = chitchat.lock().await;
            let own: Arc<str> = Arc::from(config.node_id.as_str());
            let listeners: Vec<ListenerHandle> = [BUCKET_PREFIX, LEGACY_PREFIX]
                .into_iter()
                .map(|prefix| {
                    let own = own.clone();
                    let n = notify.clone();
                    cc.subscribe_event(prefix, move |ev| {
                        if ev.node.node_id != own {
                            n.notify_one();
                        }
                    })
                })
                .collect();
            (listeners, cc.live_nodes_watcher())
        };
        let shared = Arc::new(Shared {
            node_id: config.node_id.clone(),
            generation,
            gossip_addr: advertise,
            metrics,
            peers: parking_lot::Mutex::new(Vec::new()),
            seal,
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
            changes,
            own: Own::new(),
            remotes: HashMap::new(),
            pacer: Pacer::default(),
            push_fanout: config.push_fanout,
            rng: rand::rngs::SmallRng::from_rng(&mut rand::rng()),
            last_flush: None,
            flush_due: None,
        };
        let backstop = (config.gossip_interval * 10).max(Duration::from_millis(100));
        let task = tokio::spawn(engine.run(notify, live_rx, listeners, cancel.clone(), backstop));
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

    /// How many gossiped values were rejected for `reason` (`malformed`, `version`,
    /// `outside_domain`).
    pub fn rejected_values(&self, reason: &'static str) -> u64 {
        self.shared.metrics.rejected(reason)
    }

    /// What re-reads the key file (SIGHUP, `POST /reload`), when the key comes from
    /// one.
    pub fn key_reloader(&self) -> Option<KeyReloader> {
        self.shared.seal.clone().and_then(KeyReloader::new)
    }

    /// How many gossip datagrams were rejected for `why` (always 0 without a key).
    pub fn rejected_datagrams(&self, why: Rejection) -> u64 {
        self.shared.seal.as_ref().map_or(0, |s| s.rejected(why))
    }

    /// How many gossip datagrams were opened (always 0 without a key).
    pub fn opened_datagrams(&self) -> u64 {
        self.shared.metrics.opened_datagrams.get()
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

/// The identity of a database entry.
fn item_of(e: &Entry) -> Item {
    Item {
        id: e.id.clone(),
        ip: e.ip,
        fqdn: e.fqdn.clone(),
        service: e.service.clone(),
        health: e.health,
    }
}

/// `item` without its service: the key of an entry whatever its service.
fn identity_of(item: &Item) -> Item {
    Item {
        service: None,
        health: Health::Unchecked,
        ..item.clone()
    }
}

/// `item` as a live database entry of `origin` at `version`.
fn live_entry(item: &Item, origin: &str, version: u64) -> Entry {
    Entry {
        id: item.id.clone(),
        ip: item.ip,
        fqdn: item.fqdn.clone(),
        origin: origin.to_owned(),
        version,
        tombstone: false,
        service: item.service.clone(),
        health: item.health,
    }
}

/// `item` as a tombstone of `origin` at `version`.
fn tombstone_entry(item: &Item, origin: &str, version: u64) -> Entry {
    Entry {
        tombstone: true,
        ..live_entry(item, origin, version)
    }
}

fn bucket_key(bits: u32, index: u64) -> String {
    format!("{BUCKET_PREFIX}{bits:x}.{index:x}")
}

/// This node's published entries, in buckets.
#[derive(Debug)]
struct Own {
    /// The bucket count is `2^bits`; it only grows within an incarnation, so a key
    /// name is never reused for another bucket.
    bits: u32,
    hasher: std::hash::RandomState,
    buckets: HashMap<u64, OwnBucket>,
    /// Buckets changed since they were last set.
    dirty: std::collections::BTreeSet<u64>,
    /// Published keys of a smaller bucket count, deleted once the new ones are set.
    retired: Vec<String>,
    live: i64,
}

#[derive(Debug, Default)]
struct OwnBucket {
    items: std::collections::BTreeSet<Item>,
    /// Plain bytes of the bucket when encoded.
    bytes: usize,
    published: bool,
}

impl OwnBucket {
    fn oversized(&self) -> bool {
        self.bytes > BUCKET_BYTES
    }
}

impl Own {
    fn new() -> Self {
        Self {
            bits: 0,
            hasher: std::hash::RandomState::new(),
            buckets: HashMap::new(),
            dirty: std::collections::BTreeSet::new(),
            retired: Vec::new(),
            live: 0,
        }
    }

    /// The bucket of an entry, by its identity: a change of service keeps it there.
    fn index(&self, item: &Item) -> u64 {
        use std::hash::BuildHasher;
        let mask = (1u64 << self.bits) - 1;
        self.hasher.hash_one(item.identity()) & mask
    }

    /// Adds a live entry, replacing one of the same identity with another service.
    /// Returns whether it was new.
    fn insert(&mut self, item: Item) -> bool {
        let index = self.index(&item);
        for old in self.same_identity(&item) {
            if old != item {
                self.remove(&old);
            }
        }
        let bucket = self.buckets.entry(index).or_insert_with(|| OwnBucket {
            bytes: BUCKET_OVERHEAD,
            ..OwnBucket::default()
        });
        let len = item.encoded_len();
        if !bucket.items.insert(item) {
            return false;
        }
        bucket.bytes += len;
        self.dirty.insert(index);
        self.live += 1;
        true
    }

    /// The published items with `item`'s identity (at most one, but for its service).
    fn same_identity(&self, item: &Item) -> Vec<Item> {
        self.buckets
            .get(&self.index(item))
            .map_or_else(Vec::new, |b| {
                b.items
                    .range(identity_of(item)..)
                    .take_while(|i| i.identity() == item.identity())
                    .cloned()
                    .collect()
            })
    }

    /// Removes the entry with `item`'s identity, whatever its service.
    fn remove_identity(&mut self, item: &Item) -> bool {
        let mut removed = false;
        for old in self.same_identity(item) {
            removed |= self.remove(&old);
        }
        removed
    }

    /// Removes an entry (with that service). Returns whether it was there.
    fn remove(&mut self, item: &Item) -> bool {
        let index = self.index(item);
        let Some(bucket) = self.buckets.get_mut(&index) else {
            return false;
        };
        if !bucket.items.remove(item) {
            return false;
        }
        bucket.bytes -= item.encoded_len();
        self.dirty.insert(index);
        self.live -= 1;
        true
    }

    /// Doubles the bucket count until every bucket fits [`BUCKET_BYTES`], when a
    /// changed one does not. Every bucket is then dirty and the old keys retired.
    fn grow_if_needed(&mut self) {
        let changed_oversized = self
            .dirty
            .iter()
            .any(|i| self.buckets.get(i).is_some_and(OwnBucket::oversized));
        if !changed_oversized || self.bits >= MAX_BUCKET_BITS {
            return;
        }
        let old_bits = self.bits;
        let old = std::mem::take(&mut self.buckets);
        let mut items = Vec::with_capacity(usize::try_from(self.live).unwrap_or(0));
        for (index, bucket) in old {
            if bucket.published {
                self.retired.push(bucket_key(old_bits, index));
            }
            items.extend(bucket.items);
        }
        loop {
            self.bits += 1;
            self.buckets.clear();
            self.live = 0;
            for item in &items {
                self.insert(item.clone());
            }
            if self.bits >= MAX_BUCKET_BITS || !self.buckets.values().any(OwnBucket::oversized) {
                break;
            }
        }
        self.dirty = self.buckets.keys().copied().collect();
        tracing::debug!(
            bits = self.bits,
            buckets = self.buckets.len(),
            entries = self.live,
            "own entries spread over twice as many buckets"
        );
    }
}

/// What has been applied of one peer (one node id, one adopted incarnation).
#[derive(Debug)]
struct Remote {
    id: ChitchatId,
    max_seen: u64,
    last_gc_seen: u64,
    live: bool,
    keys: HashMap<String, KeyState>,
    holdings: Holdings,
}

/// A peer's entries applied to the database: how many of its keys hold each, and
/// those no key holds any more but that are not yet tombstones.
///
/// chitchat keeps only a key's newest version, and sends a node's keys in version
/// order, so when an entry moves to another key (the bucket count doubled), and that
/// key is set again afterwards, a receiver learns of the old key's delete before it
/// learns of the new key at all. An entry that loses its last key is therefore only
/// *pending*; it becomes a tombstone once the receiver's copy of the node is complete
/// (it ends with [`META_KEY`]), and stays live, untouched, if a key takes it up again
/// before then.
#[derive(Debug, Default)]
///
/// Entries are counted by identity ([`identity_of`]); the service last applied rides
/// along, so an entry whose service changed (its key set again with the new item,
/// or, while buckets move, two keys briefly holding it with different services) is
/// applied again with the service of the item acquired last.
struct Holdings {
    /// Keys holding each entry, and the attributes (service, health) applied.
    held: HashMap<Item, (u32, Attrs)>,
    /// Released entries, the version they were last released at, and the attributes
    /// applied.
    pending: HashMap<Item, (u64, Attrs)>,
}

/// What an item carries besides its identity: service and health.
type Attrs = (Option<ServicePort>, Health);

fn attrs_of(item: &Item) -> Attrs {
    (item.service.clone(), item.health)
}

impl Holdings {
    /// One more key holds `item`; when none did, or with another service, it is
    /// applied live at `version`. False when it could not be applied.
    fn acquire(&mut self, to: &Target<'_>, item: &Item, version: u64) -> bool {
        let id = identity_of(item);
        let attrs = attrs_of(item);
        if let Some((n, applied)) = self.held.get_mut(&id) {
            *n += 1;
            if *applied != attrs && to.apply(live_entry(item, to.node_id, version)) {
                *applied = attrs;
            }
            return true;
        }
        match self.pending.remove(&id) {
            // Released and taken up again unchanged: still live, untouched.
            Some((_, applied)) if applied == attrs => {}
            previous => {
                if !to.apply(live_entry(item, to.node_id, version)) {
                    if let Some(p) = previous {
                        self.pending.insert(id, p);
                    }
                    return false;
                }
            }
        }
        self.held.insert(id, (1, attrs));
        true
    }

    /// One key less holds `item`; after the last it is pending, released at `version`.
    fn release(&mut self, item: &Item, version: u64) {
        let id = identity_of(item);
        let Some((n, _)) = self.held.get_mut(&id) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            let Some((_, applied)) = self.held.remove(&id) else {
                return;
            };
            let at = self.pending.entry(id).or_insert((version, applied));
            at.0 = at.0.max(version);
        }
    }

    /// The receiver's copy of the node is complete: every pending entry is gone.
    fn settle(&mut self, to: &Target<'_>) {
        for (item, (version, _)) in self.pending.drain() {
            to.apply(tombstone_entry(&item, to.node_id, version));
        }
    }

    /// Entries live in the database from this peer.
    fn len(&self) -> usize {
        self.held.len() + self.pending.len()
    }
}

#[derive(Debug)]
struct KeyState {
    version: u64,
    /// The entries of the key's value that were applied.
    items: Vec<Item>,
}

/// What one sync pass read from chitchat about one peer.
struct NodeWork {
    id: ChitchatId,
    live: bool,
    switch: bool,
    full: bool,
    max_version: u64,
    last_gc_version: u64,
    /// (key, chitchat version, value; `None` for a delete), by version.
    kvs: Vec<(String, u64, Option<String>)>,
    /// Every key present (full passes only).
    present: HashSet<String>,
    /// The copy ends with the node's [`META_KEY`] (or the node sets none).
    complete: bool,
}

struct Engine {
    db: Arc<Db>,
    shared: Arc<Shared>,
    handle: ChitchatHandle,
    chitchat: Arc<tokio::sync::Mutex<Chitchat>>,
    changes: broadcast::Receiver<Change>,
    own: Own,
    remotes: HashMap<Arc<str>, Remote>,
    pacer: Pacer,
    /// How many live peers a change is pushed to.
    push_fanout: usize,
    /// Picks them.
    rng: rand::rngs::SmallRng,
    /// When own entries were last written to chitchat.
    last_flush: Option<tokio::time::Instant>,
    /// When the changes held back since are written (see [`Engine::publish`]).
    flush_due: Option<tokio::time::Instant>,
}

impl Engine {
    async fn run(
        mut self,
        notify: Arc<Notify>,
        mut live_rx: tokio::sync::watch::Receiver<
            std::collections::BTreeMap<ChitchatId, chitchat::NodeState>,
        >,
        listeners: Vec<ListenerHandle>,
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
        let mut rejected_seen = self.rejected_datagrams();
        loop {
            let owed = self.pacer.next_due();
            let flush = self.flush_due;
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                () = sleep_until_owed(flush), if flush.is_some() => self.flush_own().await,
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
                    let rejected = self.rejected_datagrams();
                    if rejected != rejected_seen {
                        let by_reason: Vec<(&str, u64)> = rejected
                            .iter()
                            .zip(&rejected_seen)
                            .zip(Rejection::ALL)
                            .filter(|((now, before), _)| now > before)
                            .map(|((now, before), why)| (why.reason(), now - before))
                            .collect();
                        tracing::warn!(
                            rejected = ?by_reason,
                            every_s = crate::invalid::SUMMARY_EVERY.as_secs(),
                            "gossip datagrams rejected (no key of this node's keyring opens them, replays, or not sealed gossip)"
                        );
                        rejected_seen = rejected;
                    }
                }
            }
        }
        drop(listeners);
        if let Err(err) = self.handle.shutdown().await {
            tracing::warn!(error = %err, "chitchat shutdown failed");
        }
        tracing::info!(node_id = %self.shared.node_id, "cluster gossip stopped");
    }

    /// Rejected datagrams so far, in the order of [`Rejection::ALL`].
    fn rejected_datagrams(&self) -> Vec<u64> {
        let seal = self.shared.seal.as_ref();
        Rejection::ALL
            .iter()
            .map(|why| seal.map_or(0, |s| s.rejected(*why)))
            .collect()
    }

    /// Takes `first` and every change already queued behind it into the own buckets,
    /// and writes them to chitchat and pushes: at once when the last write is at least
    /// [`crate::pace::GAP`] old, else at the end of that gap, together with what comes
    /// in meanwhile. A burst of registrations then encodes each bucket it touches once
    /// per gap instead of once per registration; the pushes are paced the same anyway.
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
        for change in batch {
            if change.entry.origin != self.shared.node_id {
                continue;
            }
            let item = item_of(&change.entry);
            match change.kind {
                ChangeKind::Added => self.own.insert(item),
                _ => self.own.remove_identity(&item),
            };
        }
        let now = tokio::time::Instant::now();
        match self.last_flush {
            Some(last) if now.saturating_duration_since(last) < crate::pace::GAP => {
                self.flush_due.get_or_insert(last + crate::pace::GAP);
            }
            _ => self.flush_own().await,
        }
    }

    /// Drains the change channel and makes the published entries match the database.
    async fn resync_own(&mut self) {
        // Queued changes are older than the snapshot read next.
        while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = self.changes.try_recv() {
        }
        let live: HashSet<Item> = self
            .db
            .entries()
            .iter()
            .filter(|e| e.origin == self.shared.node_id && !e.tombstone)
            .map(item_of)
            .collect();
        let stale: Vec<Item> = self
            .own
            .buckets
            .values()
            .flat_map(|b| b.items.iter())
            .filter(|item| !live.contains(*item))
            .cloned()
            .collect();
        for item in &stale {
            self.own.remove(item);
        }
        for item in live {
            self.own.insert(item);
        }
        self.flush_own().await;
        tracing::debug!(published = self.own.live, "own entries resynchronised");
    }

    /// Sets every changed bucket's key (deletes it when empty), deletes retired keys,
    /// and pushes when chitchat changed.
    async fn flush_own(&mut self) {
        self.flush_due = None;
        if self.own.dirty.is_empty() && self.own.retired.is_empty() {
            return;
        }
        self.last_flush = Some(tokio::time::Instant::now());
        self.own.grow_if_needed();
        let chitchat = self.chitchat.clone();
        let mut cc = chitchat.lock().await;
        let node = cc.self_node_state();
        let bits = self.own.bits;
        for index in std::mem::take(&mut self.own.dirty) {
            let key = bucket_key(bits, index);
            let Some(bucket) = self.own.buckets.get_mut(&index) else {
                continue;
            };
            if bucket.items.is_empty() {
                if bucket.published {
                    node.delete(&key);
                }
                self.own.buckets.remove(&index);
                continue;
            }
            // `set` gives the key the next version of this incarnation; the bucket
            // carries it so a receiver can tell the value was published for it.
            let version = node.max_version() + 1;
            let value = encode_bucket_value(&Bucket {
                version,
                items: bucket.items.iter().cloned().collect(),
            });
            node.set(&key, value);
            if node.get_versioned(&key).map(|v| v.version) != Some(version) {
                tracing::error!(key = %key, version, "published key did not get the expected version");
            }
            bucket.published = true;
        }
        for key in std::mem::take(&mut self.own.retired) {
            node.delete(&key);
        }
        let last = node.max_version() + 1;
        node.set(META_KEY, last.to_string());
        let metrics = &self.shared.metrics;
        metrics.keys_published.set(self.own.live);
        metrics
            .buckets_published
            .set(i64::try_from(self.own.buckets.len()).unwrap_or(i64::MAX));
        self.push(&cc);
    }

    /// Starts a gossip round with up to `push_fanout` live peers so a change spreads
    /// at once (or at the end of the peer's pacing gap, in the round that carries the
    /// whole burst).
    fn push(&mut self, cc: &Chitchat) {
        let me = cc.self_chitchat_id().clone();
        let peers: HashSet<SocketAddr> = cc
            .live_nodes()
            .filter(|id| **id != me)
            .map(|id| id.gossip_advertise_addr)
            .collect();
        self.pacer.retain(|addr| peers.contains(addr));
        let now = tokio::time::Instant::now();
        for addr in push_targets(peers, self.push_fanout, &mut self.rng) {
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
                let mut kvs: Vec<(String, u64, Option<String>)> = state
                    .key_values_including_deleted()
                    .filter(|(k, v)| is_entry_key(k) && (full || v.version > max_seen))
                    .map(|(k, v)| {
                        let value = (!v.is_deleted()).then(|| v.value.clone());
                        (k.to_owned(), v.version, value)
                    })
                    .collect();
                // In the order they were written, not by key: when the bucket count
                // doubles, the new buckets are set before the old ones are deleted, and
                // an entry in both must be taken up before it is let go.
                kvs.sort_unstable_by_key(|(_, version, _)| *version);
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
                    complete: state
                        .get_versioned(META_KEY)
                        .is_none_or(|m| m.version == state.max_version()),
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
            let bytes: usize = w
                .kvs
                .iter()
                .filter_map(|(_, _, v)| v.as_ref())
                .map(String::len)
                .sum();
            if w.live && (w.kvs.len() >= CATCH_UP_KEYS || bytes >= CATCH_UP_BYTES) {
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
                    holdings: Holdings::default(),
                },
            );
        }
        let outcomes: Vec<_> = w
            .kvs
            .iter()
            .map(|(_, _, value)| value.as_deref().map(decode_bucket_value))
            .collect();
        let Some(remote) = self.remotes.get_mut(&node_id) else {
            return;
        };
        let to = Target {
            db: &self.db,
            metrics: &self.shared.metrics,
            node_id: &node_id,
        };
        for ((key, version, _), opened) in w.kvs.into_iter().zip(outcomes) {
            let ks = remote.keys.entry(key).or_insert(KeyState {
                version: 0,
                items: Vec::new(),
            });
            if ks.version >= version {
                continue;
            }
            ks.version = version;
            match opened {
                None => {
                    for item in std::mem::take(&mut ks.items) {
                        remote.holdings.release(&item, version);
                    }
                }
                Some(Ok(bucket)) if bucket.version == version => {
                    let before: HashSet<Item> = std::mem::take(&mut ks.items).into_iter().collect();
                    let now: HashSet<&Item> = bucket.items.iter().collect();
                    for item in &before {
                        if !now.contains(item) {
                            remote.holdings.release(item, version);
                        }
                    }
                    for item in bucket.items {
                        if before.contains(&item) || remote.holdings.acquire(&to, &item, version) {
                            ks.items.push(item);
                        }
                    }
                }
                Some(Ok(bucket)) => {
                    tracing::warn!(node_id = %node_id, record_version = bucket.version, version, "gossiped value replayed under another version; rejected");
                    to.metrics.reject("version");
                }
                Some(Err(err)) => {
                    tracing::warn!(node_id = %node_id, error = %err, "gossiped value rejected");
                    to.metrics.reject(err.reason());
                }
            }
        }
        if w.full && !w.switch {
            to.metrics.peer_resets.inc();
            tracing::info!(
                node_id = %node_id,
                last_gc_version = w.last_gc_version,
                "peer's state reset by gossip (tombstones collected before they reached this node); its entries compared whole"
            );
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
                if let Some(ks) = remote.keys.remove(&key) {
                    for item in ks.items {
                        remote.holdings.release(&item, floor);
                    }
                }
            }
        }
        if w.complete {
            remote.holdings.settle(&to);
        }
        let db = to.db;
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
                entries: r.holdings.len(),
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

/// The peers a change is pushed to: all of `peers` when there are at most `fanout`,
/// else `fanout` of them picked at random.
fn push_targets(
    peers: HashSet<SocketAddr>,
    fanout: usize,
    rng: &mut impl rand::Rng,
) -> Vec<SocketAddr> {
    use rand::seq::IteratorRandom;
    if peers.len() <= fanout {
        peers.into_iter().collect()
    } else {
        peers.into_iter().choose_multiple(rng, fanout)
    }
}

/// Sleeps until `at` (the select guard keeps `None` from being polled).
async fn sleep_until_owed(at: Option<tokio::time::Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Where a peer's entries are applied.
struct Target<'a> {
    db: &'a Db,
    metrics: &'a Metrics,
    node_id: &'a str,
}

impl Target<'_> {
    /// Applies `entry`. False when the database refuses it (outside the domain).
    fn apply(&self, entry: Entry) -> bool {
        match self.db.apply(entry) {
            Ok(true) => {
                self.metrics.entries_applied.inc();
                true
            }
            Ok(false) => true,
            Err(err) => {
                tracing::debug!(node_id = %self.node_id, error = %err, "peer entry not applied");
                self.metrics.reject("outside_domain");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: u16) -> HashSet<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, 0, 1], 7000 + i)))
            .collect()
    }

    #[test]
    fn a_change_is_pushed_to_every_peer_up_to_the_fanout() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut all = push_targets(peers(16), 16, &mut rng);
        all.sort();
        let mut expected: Vec<_> = peers(16).into_iter().collect();
        expected.sort();
        assert_eq!(all, expected);
        assert_eq!(push_targets(peers(5), usize::MAX, &mut rng).len(), 5);
        assert!(push_targets(peers(5), 0, &mut rng).is_empty());
    }

    #[test]
    fn beyond_the_fanout_a_change_is_pushed_to_that_many_distinct_peers_picked_at_random() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let pool = peers(1000);
        let first = push_targets(pool.clone(), 16, &mut rng);
        let distinct: HashSet<_> = first.iter().collect();
        assert_eq!(distinct.len(), 16);
        assert!(first.iter().all(|p| pool.contains(p)));
        let second = push_targets(pool, 16, &mut rng);
        assert_ne!(first, second, "the same 16 of 1,000 peers twice");
    }
}
