//! Receiving: peers' keys, as chitchat holds them, applied to the database under
//! the peers' node ids; the view of peers behind `GET /peers`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chitchat::{Chitchat, ChitchatId, NodeState};
use dwara_records::{Db, Entry, Health, ServicePort};

use super::{
    CATCH_UP_BYTES, CATCH_UP_KEYS, Engine, META_KEY, identity_of, is_entry_key, live_entry,
    tombstone_entry,
};
use crate::codec::{Bucket, DecodeError, Item, decode_bucket_value};
use crate::metrics::{Metrics, StateLabel, ValueRejection};
use crate::peers::{PeerInfo, PeerState};

/// What has been applied of one peer (one node id, one adopted incarnation).
#[derive(Debug)]
pub(super) struct Remote {
    id: ChitchatId,
    max_seen: u64,
    last_gc_seen: u64,
    live: bool,
    keys: HashMap<String, KeyState>,
    holdings: Holdings,
}

impl Remote {
    /// Applies one changed key: its entries are acquired, those it no longer has
    /// released; a value that does not decode, or was published for another
    /// version, is rejected and changes nothing.
    fn apply_key(
        &mut self,
        to: &Target<'_>,
        kv: KeyValue,
        opened: Option<Result<Bucket, DecodeError>>,
    ) {
        let version = kv.version;
        let ks = self.keys.entry(kv.key).or_insert(KeyState {
            version: 0,
            items: Vec::new(),
        });
        if ks.version >= version {
            return;
        }
        ks.version = version;
        match opened {
            None => {
                for item in std::mem::take(&mut ks.items) {
                    self.holdings.release(&item, version);
                }
            }
            Some(Ok(bucket)) if bucket.version == version => {
                let before: HashSet<Item> = std::mem::take(&mut ks.items).into_iter().collect();
                let now: HashSet<&Item> = bucket.items.iter().collect();
                for item in &before {
                    if !now.contains(item) {
                        self.holdings.release(item, version);
                    }
                }
                for item in bucket.items {
                    if before.contains(&item) || self.holdings.acquire(to, &item, version) {
                        ks.items.push(item);
                    }
                }
            }
            Some(Ok(bucket)) => {
                tracing::warn!(node_id = %to.node_id, record_version = bucket.version, version, "gossiped value replayed under another version; rejected");
                to.metrics.reject(ValueRejection::Version);
            }
            Some(Err(err)) => {
                tracing::warn!(node_id = %to.node_id, error = %err, "gossiped value rejected");
                to.metrics.reject(ValueRejection::Malformed);
            }
        }
    }

    /// After a full pass: keys the peer no longer has release their entries at
    /// `floor` (the newest version of the peer this node knows of).
    fn forget_absent_keys(&mut self, present: &HashSet<String>, floor: u64) {
        let absent: Vec<String> = self
            .keys
            .keys()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect();
        for key in absent {
            if let Some(ks) = self.keys.remove(&key) {
                for item in ks.items {
                    self.holdings.release(&item, floor);
                }
            }
        }
    }
}

/// One incarnation of a peer as chitchat lists it, and whether it is live.
#[derive(Debug, Clone, Copy)]
struct Incarnation<'a> {
    id: &'a ChitchatId,
    live: bool,
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
pub(super) struct Holdings {
    /// Entries some key holds.
    held: HashMap<Item, Held>,
    /// Entries released by their last key, not yet tombstones.
    pending: HashMap<Item, Pending>,
}

/// An entry some key holds.
#[derive(Debug)]
struct Held {
    /// How many keys hold it.
    keys: u32,
    /// What was applied.
    applied: Attrs,
}

/// An entry no key holds any more, until the copy of its node is complete.
#[derive(Debug)]
struct Pending {
    /// The version it was last released at (its tombstone's version).
    version: u64,
    /// What was applied.
    applied: Attrs,
}

/// What an item carries besides its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Attrs {
    service: Option<ServicePort>,
    health: Health,
}

fn attrs_of(item: &Item) -> Attrs {
    Attrs {
        service: item.service.clone(),
        health: item.health,
    }
}

impl Holdings {
    /// One more key holds `item`; when none did, or with another service, it is
    /// applied live at `version`. False when it could not be applied.
    fn acquire(&mut self, to: &Target<'_>, item: &Item, version: u64) -> bool {
        let id = identity_of(item);
        let attrs = attrs_of(item);
        if let Some(held) = self.held.get_mut(&id) {
            held.keys += 1;
            if held.applied != attrs && to.apply(live_entry(item, to.node_id, version)) {
                held.applied = attrs;
            }
            return true;
        }
        match self.pending.remove(&id) {
            // Released and taken up again unchanged: still live, untouched.
            Some(p) if p.applied == attrs => {}
            previous => {
                if !to.apply(live_entry(item, to.node_id, version)) {
                    if let Some(p) = previous {
                        self.pending.insert(id, p);
                    }
                    return false;
                }
            }
        }
        self.held.insert(
            id,
            Held {
                keys: 1,
                applied: attrs,
            },
        );
        true
    }

    /// One key less holds `item`; after the last it is pending, released at `version`.
    fn release(&mut self, item: &Item, version: u64) {
        let id = identity_of(item);
        let Some(held) = self.held.get_mut(&id) else {
            return;
        };
        held.keys -= 1;
        if held.keys == 0 {
            let Some(Held { applied, .. }) = self.held.remove(&id) else {
                return;
            };
            let at = self
                .pending
                .entry(id)
                .or_insert(Pending { version, applied });
            at.version = at.version.max(version);
        }
    }

    /// The receiver's copy of the node is complete: every pending entry is gone.
    fn settle(&mut self, to: &Target<'_>) {
        for (item, p) in self.pending.drain() {
            to.apply(tombstone_entry(&item, to.node_id, p.version));
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

/// One key of a peer as chitchat holds it.
#[derive(Debug)]
struct KeyValue {
    key: String,
    /// The chitchat version it was set (or deleted) at.
    version: u64,
    /// `None` for a delete.
    value: Option<String>,
}

/// What one sync pass read from chitchat about one peer.
struct NodeWork {
    id: ChitchatId,
    live: bool,
    switch: bool,
    full: bool,
    max_version: u64,
    last_gc_version: u64,
    /// The keys that changed, by version.
    kvs: Vec<KeyValue>,
    /// Every key present (full passes only).
    present: HashSet<String>,
    /// The copy ends with the node's [`META_KEY`] (or the node sets none).
    complete: bool,
}

impl Engine {
    /// Brings the database in line with chitchat's view of every peer.
    pub(super) async fn sync(&mut self) {
        let (work, seen) = {
            let cc = self.chitchat.lock().await;
            self.read_peers(&cc)
        };
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
                .filter_map(|kv| kv.value.as_ref())
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

    /// What changed of every peer since the last pass, and every peer's node id
    /// chitchat still knows.
    fn read_peers(&self, cc: &Chitchat) -> (Vec<NodeWork>, HashSet<Arc<str>>) {
        let live: HashSet<&ChitchatId> = cc.live_nodes().collect();
        // Per node id, the incarnation adopted: the live one with the highest
        // generation, else the highest generation.
        let mut best: HashMap<&Arc<str>, Incarnation<'_>> = HashMap::new();
        for id in cc.node_states().keys() {
            if *id.node_id == *self.shared.node_id {
                continue;
            }
            let candidate = Incarnation {
                id,
                live: live.contains(id),
            };
            let better = best
                .get(&id.node_id)
                .is_none_or(|b| (candidate.live, id.generation_id) > (b.live, b.id.generation_id));
            if better {
                best.insert(&id.node_id, candidate);
            }
        }
        let seen = best.keys().map(|n| (*n).clone()).collect();
        let work = best
            .into_values()
            .filter_map(|inc| {
                let state = cc.node_state(inc.id)?;
                self.node_work(inc, state)
            })
            .collect();
        (work, seen)
    }

    /// What to apply of one peer's state, or `None` when nothing changed.
    fn node_work(&self, inc: Incarnation<'_>, state: &NodeState) -> Option<NodeWork> {
        let remote = self.remotes.get(&inc.id.node_id);
        let switch = remote.is_none_or(|r| r.id != *inc.id);
        let (max_seen, last_gc_seen, was_live) =
            remote.map_or((0, 0, false), |r| (r.max_seen, r.last_gc_seen, r.live));
        let full = switch
            || state.max_version() < max_seen
            || (state.last_gc_version() > max_seen && state.last_gc_version() != last_gc_seen);
        if !full && state.max_version() == max_seen && was_live == inc.live {
            return None;
        }
        let mut kvs: Vec<KeyValue> = state
            .key_values_including_deleted()
            .filter(|(k, v)| is_entry_key(k) && (full || v.version > max_seen))
            .map(|(k, v)| KeyValue {
                key: k.to_owned(),
                version: v.version,
                value: (!v.is_deleted()).then(|| v.value.clone()),
            })
            .collect();
        // In the order they were written, not by key: when the bucket count
        // doubles, the new buckets are set before the old ones are deleted, and
        // an entry in both must be taken up before it is let go.
        kvs.sort_unstable_by_key(|kv| kv.version);
        let present = if full {
            state
                .key_values_including_deleted()
                .map(|(k, _)| k.to_owned())
                .collect()
        } else {
            HashSet::new()
        };
        Some(NodeWork {
            id: inc.id.clone(),
            live: inc.live,
            switch,
            full,
            max_version: state.max_version(),
            last_gc_version: state.last_gc_version(),
            complete: state
                .get_versioned(META_KEY)
                .is_none_or(|m| m.version == state.max_version()),
            kvs,
            present,
        })
    }

    /// Adopts a peer's new incarnation: purges the old one's entries and starts over.
    fn adopt(&mut self, w: &NodeWork) {
        let node_id = &w.id.node_id;
        let purged = self.db.purge_origin(node_id);
        if let Some(old) = self.remotes.get(node_id) {
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
            self.db.show_origin(node_id);
        } else {
            self.db.hide_origin(node_id);
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

    fn apply_node(&mut self, w: NodeWork) {
        let node_id = w.id.node_id.clone();
        if w.switch {
            self.adopt(&w);
        }
        let Some(remote) = self.remotes.get_mut(&node_id) else {
            return;
        };
        let to = Target {
            db: &self.db,
            metrics: &self.shared.metrics,
            node_id: &node_id,
        };
        for kv in w.kvs {
            let opened = kv.value.as_deref().map(decode_bucket_value);
            remote.apply_key(&to, kv, opened);
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
            remote.forget_absent_keys(&w.present, w.max_version.max(w.last_gc_version));
        }
        if w.complete {
            remote.holdings.settle(&to);
        }
        remote.max_seen = w.max_version;
        remote.last_gc_seen = w.last_gc_version;
        if remote.live != w.live {
            remote.live = w.live;
            if w.live {
                to.db.show_origin(&node_id);
                tracing::info!(node_id = %node_id, "peer is live again; its entries are shown");
            } else {
                to.db.hide_origin(&node_id);
                tracing::info!(node_id = %node_id, "peer is dead; its entries are hidden");
            }
        }
    }

    pub(super) fn refresh_view(&self) {
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
                self.metrics.reject(ValueRejection::OutsideDomain);
                false
            }
        }
    }
}
