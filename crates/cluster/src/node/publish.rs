//! Publishing: this node's own entries, from the database's change stream, into
//! buckets set as chitchat keys, and the pushes that spread a change at once.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use chitchat::Chitchat;
use dwara_records::{Change, ChangeKind};
use tokio::sync::broadcast;

use super::{BUCKET_BYTES, BUCKET_PREFIX, Engine, MAX_BUCKET_BITS, META_KEY, identity_of, item_of};
use crate::codec::{BUCKET_OVERHEAD, Bucket, Item, encode_bucket_value};

fn bucket_key(bits: u32, index: u64) -> String {
    format!("{BUCKET_PREFIX}{bits:x}.{index:x}")
}

/// This node's published entries, in buckets.
#[derive(Debug)]
pub(super) struct Own {
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
    pub(super) fn new() -> Self {
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

impl Engine {
    /// Takes `first` and every change already queued behind it into the own buckets,
    /// and writes them to chitchat and pushes: at once when the last write is at least
    /// [`crate::pace::GAP`] old, else at the end of that gap, together with what comes
    /// in meanwhile. A burst of registrations then encodes each bucket it touches once
    /// per gap instead of once per registration; the pushes are paced the same anyway.
    pub(super) async fn publish(&mut self, first: Change) {
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
    pub(super) async fn resync_own(&mut self) {
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
    pub(super) async fn flush_own(&mut self) {
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
        metrics.entries_published.set(self.own.live);
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
    pub(super) fn send_owed(&mut self) {
        for addr in self.pacer.due(tokio::time::Instant::now()) {
            if self.handle.gossip(addr).is_ok() {
                self.shared.metrics.pushes.inc();
            }
        }
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

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

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
