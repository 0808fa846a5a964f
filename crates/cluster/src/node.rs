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
//!
//! The code is split by role: [`handle`] (the [`Cluster`] a caller holds, and
//! starting it), `publish` (this node's entries into buckets and chitchat keys),
//! `receive` (peers' keys into the database) and `event_loop` (the engine's task
//! waiting on all of them, and its periodic log summaries).

use std::collections::HashMap;
use std::sync::Arc;

use chitchat::{Chitchat, ChitchatHandle};
use dwara_records::{Change, Db, Entry, Health};
use tokio::sync::broadcast;

use crate::codec::Item;
use crate::pace::Pacer;

mod event_loop;
pub(crate) mod handle;
mod publish;
mod receive;

pub use handle::Cluster;
pub(crate) use handle::Shared;
use publish::Own;
use receive::Remote;

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
/// change, so an entry no key holds any more is really gone (see [`receive::Holdings`]).
const META_KEY: &str = "m";

fn is_entry_key(key: &str) -> bool {
    key.starts_with(BUCKET_PREFIX) || key.starts_with(LEGACY_PREFIX)
}

/// The replication engine: one task per node (see the module docs).
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
