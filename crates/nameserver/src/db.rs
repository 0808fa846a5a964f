//! The records database: who registered which address under which name.
//!
//! An [`Entry`] is (container id, address, fqdn, origin node, version, tombstone).
//! The database indexes entries by id, by lower-cased name and by address, and keeps
//! the DNS answer table (see `answers`) in step with every change, rebuilding only
//! the names and addresses the change touches.
//!
//! # Change API
//!
//! This is what replication (cluster) and the Docker updater build on:
//!
//! - [`Db::add`], [`Db::remove`], [`Db::remove_all`]: changes made on this node; the
//!   entries carry [`Db::origin`]. A removal does not forget the entry: it becomes a
//!   *tombstone* with a higher version, so the removal can be replicated.
//! - [`Db::apply`]: merge an entry learnt from elsewhere (another node's entry, or a
//!   tombstone for one of ours). The higher version wins; equal versions keep what
//!   is there.
//! - [`Db::purge_origin`], [`Db::gc_tombstones`]: forget entries for good.
//! - [`Db::set_origin_hidden`]: hide (or show again) every entry of one origin from
//!   DNS answers and lookups without forgetting them (a peer that is down).
//! - [`Db::subscribe`]: a `tokio::sync::broadcast` of every [`Change`]. A receiver
//!   that lags (`RecvError::Lagged`) must resynchronise from [`Db::entries`].
//! - [`Db::generation`]: a counter bumped by every change.
//!
//! Writers are serialised by one mutex; DNS reads never take it (they read the answer
//! table), so registrations and queries do not block each other beyond one shard lock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::answers::Answers;
use crate::error::Result;
use crate::name::{Domain, parse_name, reverse_wire, wire_lower, wire_of_text};

/// The default origin of entries made on this node when none is configured.
pub const DEFAULT_ORIGIN: &str = "local";

/// How a [`Db`] is set up.
#[derive(Debug, Clone)]
pub struct DbConfig {
    /// The domain names are registered under.
    pub domain: Domain,
    /// TTL of A, AAAA and PTR answers, and the negative-caching TTL of the SOA.
    pub ttl: u32,
    /// The name of this node, stamped on the entries it makes.
    pub origin: String,
}

impl DbConfig {
    /// A configuration for `domain` with TTL 1 s and origin [`DEFAULT_ORIGIN`].
    pub fn new(domain: Domain) -> Self {
        Self {
            domain,
            ttl: 1,
            origin: DEFAULT_ORIGIN.to_owned(),
        }
    }
}

/// One registration (or the tombstone of one).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Entry {
    /// Who registered it (a container id).
    pub id: String,
    /// The address.
    pub ip: IpAddr,
    /// The name, lower-case, fully qualified.
    pub fqdn: String,
    /// The node that owns the entry.
    pub origin: String,
    /// Bumped by every change of this entry; the higher version wins a merge.
    pub version: u64,
    /// A removed entry kept so the removal can be replicated.
    pub tombstone: bool,
}

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangeKind {
    /// The entry is live (new, revived, or a newer version learnt by `apply`).
    Added,
    /// The entry became a tombstone.
    Removed,
    /// The entry (live or tombstone) was forgotten.
    Purged,
}

/// One change, as broadcast to [`Db::subscribe`] receivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// What happened.
    pub kind: ChangeKind,
    /// The entry after the change (before it, for `Purged`).
    pub entry: Entry,
}

#[derive(Debug)]
struct Slot {
    id: Arc<str>,
    ip: IpAddr,
    fqdn: Arc<str>,
    origin: Arc<str>,
    version: u64,
    tombstone: bool,
    changed: Instant,
}

impl Slot {
    fn to_entry(&self) -> Entry {
        Entry {
            id: self.id.to_string(),
            ip: self.ip,
            fqdn: self.fqdn.to_string(),
            origin: self.origin.to_string(),
            version: self.version,
            tombstone: self.tombstone,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    by_id: HashMap<Arc<str>, Vec<u32>, foldhash::fast::RandomState>,
    by_name: HashMap<Arc<str>, Vec<u32>, foldhash::fast::RandomState>,
    by_addr: HashMap<IpAddr, Vec<u32>, foldhash::fast::RandomState>,
    /// Interned origin names, and whether their entries are hidden.
    origins: HashMap<Arc<str>, bool, foldhash::fast::RandomState>,
    live: usize,
    generation: u64,
}

impl State {
    fn slot(&self, idx: u32) -> Option<&Slot> {
        self.slots.get(idx as usize).and_then(Option::as_ref)
    }

    fn visible(&self, slot: &Slot) -> bool {
        !slot.tombstone && !self.origins.get(&*slot.origin).copied().unwrap_or(false)
    }

    fn find(&self, origin: &str, id: &str, ip: IpAddr, fqdn: &str) -> Option<u32> {
        self.by_id.get(id)?.iter().copied().find(|&i| {
            self.slot(i)
                .is_some_and(|s| s.ip == ip && &*s.fqdn == fqdn && &*s.origin == origin)
        })
    }

    fn intern_origin(&mut self, origin: &str) -> Arc<str> {
        if let Some((k, _)) = self.origins.get_key_value(origin) {
            return k.clone();
        }
        let k: Arc<str> = origin.into();
        self.origins.insert(k.clone(), false);
        k
    }

    fn insert(
        &mut self,
        id: &str,
        ip: IpAddr,
        fqdn: &str,
        origin: &str,
        version: u64,
        tombstone: bool,
    ) -> u32 {
        let origin = self.intern_origin(origin);
        let id: Arc<str> = match self.by_id.get_key_value(id) {
            Some((k, _)) => k.clone(),
            None => id.into(),
        };
        let fqdn: Arc<str> = match self.by_name.get_key_value(fqdn) {
            Some((k, _)) => k.clone(),
            None => fqdn.into(),
        };
        let slot = Slot {
            id: id.clone(),
            ip,
            fqdn: fqdn.clone(),
            origin,
            version,
            tombstone,
            changed: Instant::now(),
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        self.by_id.entry(id).or_default().push(idx);
        self.by_name.entry(fqdn).or_default().push(idx);
        self.by_addr.entry(ip).or_default().push(idx);
        if !tombstone {
            self.live += 1;
        }
        idx
    }

    fn forget(&mut self, idx: u32) -> Option<Slot> {
        let slot = self.slots.get_mut(idx as usize)?.take()?;
        fn unlink<K, Q>(
            map: &mut HashMap<K, Vec<u32>, foldhash::fast::RandomState>,
            key: &Q,
            idx: u32,
        ) where
            K: std::hash::Hash + Eq + std::borrow::Borrow<Q>,
            Q: std::hash::Hash + Eq + ?Sized,
        {
            if let Some(v) = map.get_mut(key) {
                v.retain(|&i| i != idx);
                if v.is_empty() {
                    map.remove(key);
                }
            }
        }
        unlink(&mut self.by_id, &*slot.id, idx);
        unlink(&mut self.by_name, &*slot.fqdn, idx);
        unlink(&mut self.by_addr, &slot.ip, idx);
        self.free.push(idx);
        if !slot.tombstone {
            self.live -= 1;
        }
        Some(slot)
    }
}

/// The records database. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Db {
    config: DbConfig,
    answers: Arc<Answers>,
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

/// Names and addresses whose answers a change invalidated.
#[derive(Default)]
struct Dirty {
    names: Vec<Arc<str>>,
    addrs: Vec<IpAddr>,
    changes: Vec<Change>,
}

impl Dirty {
    fn touch(&mut self, slot: &Slot, kind: ChangeKind, want_changes: bool) {
        if !self.names.contains(&slot.fqdn) {
            self.names.push(slot.fqdn.clone());
        }
        if !self.addrs.contains(&slot.ip) {
            self.addrs.push(slot.ip);
        }
        if want_changes {
            self.changes.push(Change {
                kind,
                entry: slot.to_entry(),
            });
        }
    }
}

impl Db {
    /// An empty database.
    pub fn new(config: DbConfig) -> Self {
        let (changes, _) = broadcast::channel(1024);
        Self {
            answers: Arc::new(Answers::new(config.ttl)),
            config,
            state: Mutex::new(State::default()),
            changes,
        }
    }

    /// The served domain.
    pub fn domain(&self) -> &Domain {
        &self.config.domain
    }

    /// This node's origin name.
    pub fn origin(&self) -> &str {
        &self.config.origin
    }

    /// The TTL of answers.
    pub fn ttl(&self) -> u32 {
        self.config.ttl
    }

    pub(crate) fn answers(&self) -> &Arc<Answers> {
        &self.answers
    }

    /// Registers `ip` under `fqdn` for container `id`, owned by this node.
    ///
    /// Returns whether anything changed (`false` when that exact entry is already
    /// live). Re-adding a removed entry revives its tombstone with a higher version.
    /// Fails if `fqdn` is not a valid name strictly inside the domain.
    pub fn add(&self, id: &str, ip: IpAddr, fqdn: &str) -> Result<bool> {
        let fqdn = self.config.domain.normalize_member(fqdn)?;
        let origin = self.config.origin.as_str();
        let mut dirty = Dirty::default();
        let want = self.changes.receiver_count() > 0;
        let mut st = self.state.lock();
        match st.find(origin, id, ip, &fqdn) {
            Some(idx) => {
                let Some(slot) = st.slots[idx as usize].as_mut() else {
                    return Ok(false);
                };
                if !slot.tombstone {
                    return Ok(false);
                }
                slot.tombstone = false;
                slot.version += 1;
                slot.changed = Instant::now();
                st.live += 1;
                if let Some(slot) = st.slot(idx) {
                    dirty.touch(slot, ChangeKind::Added, want);
                }
            }
            None => {
                let idx = st.insert(id, ip, &fqdn, origin, 1, false);
                if let Some(slot) = st.slot(idx) {
                    dirty.touch(slot, ChangeKind::Added, want);
                }
            }
        }
        self.finish(&mut st, dirty);
        Ok(true)
    }

    /// Tombstones this node's live entries of container `id`, narrowed to one address
    /// and/or one name when given. Returns how many entries were removed (0 is fine).
    pub fn remove(&self, id: &str, ip: Option<IpAddr>, fqdn: Option<&str>) -> usize {
        let fqdn = match fqdn {
            Some(f) => match parse_name(f) {
                Ok(n) => Some(n.to_ascii()),
                // An unparsable name matches nothing.
                Err(_) => return 0,
            },
            None => None,
        };
        let origin = self.config.origin.as_str();
        let want = self.changes.receiver_count() > 0;
        let mut dirty = Dirty::default();
        let mut st = self.state.lock();
        let Some(candidates) = st.by_id.get(id).cloned() else {
            return 0;
        };
        let now = Instant::now();
        let mut removed = 0;
        for idx in candidates {
            let Some(slot) = st.slots.get_mut(idx as usize).and_then(Option::as_mut) else {
                continue;
            };
            if slot.tombstone
                || &*slot.origin != origin
                || ip.is_some_and(|ip| ip != slot.ip)
                || fqdn.as_deref().is_some_and(|f| f != &*slot.fqdn)
            {
                continue;
            }
            slot.tombstone = true;
            slot.version += 1;
            slot.changed = now;
            removed += 1;
            st.live -= 1;
            if let Some(slot) = st.slot(idx) {
                dirty.touch(slot, ChangeKind::Removed, want);
            }
        }
        self.finish(&mut st, dirty);
        removed
    }

    /// Tombstones every live entry of container `id` owned by this node.
    pub fn remove_all(&self, id: &str) -> usize {
        self.remove(id, None, None)
    }

    /// Merges an entry learnt from elsewhere (replication): inserted when unknown,
    /// replaces the known one when its version is higher, ignored otherwise.
    /// Returns whether anything changed. Fails if the name is not inside the domain.
    pub fn apply(&self, entry: Entry) -> Result<bool> {
        let fqdn = self.config.domain.normalize_member(&entry.fqdn)?;
        let want = self.changes.receiver_count() > 0;
        let mut dirty = Dirty::default();
        let mut st = self.state.lock();
        match st.find(&entry.origin, &entry.id, entry.ip, &fqdn) {
            Some(idx) => {
                let Some(slot) = st.slots[idx as usize].as_mut() else {
                    return Ok(false);
                };
                if entry.version <= slot.version {
                    return Ok(false);
                }
                let was_tombstone = slot.tombstone;
                slot.version = entry.version;
                slot.tombstone = entry.tombstone;
                slot.changed = Instant::now();
                match (was_tombstone, entry.tombstone) {
                    (true, false) => st.live += 1,
                    (false, true) => st.live -= 1,
                    _ => {}
                }
                let kind = if entry.tombstone {
                    ChangeKind::Removed
                } else {
                    ChangeKind::Added
                };
                if let Some(slot) = st.slot(idx) {
                    dirty.touch(slot, kind, want);
                }
            }
            None => {
                let idx = st.insert(
                    &entry.id,
                    entry.ip,
                    &fqdn,
                    &entry.origin,
                    entry.version,
                    entry.tombstone,
                );
                let kind = if entry.tombstone {
                    ChangeKind::Removed
                } else {
                    ChangeKind::Added
                };
                if let Some(slot) = st.slot(idx) {
                    dirty.touch(slot, kind, want);
                }
            }
        }
        self.finish(&mut st, dirty);
        Ok(true)
    }

    /// Forgets every entry (live or tombstone) owned by `origin`. Returns how many.
    pub fn purge_origin(&self, origin: &str) -> usize {
        let want = self.changes.receiver_count() > 0;
        let mut dirty = Dirty::default();
        let mut st = self.state.lock();
        let victims: Vec<u32> = st
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| &*s.origin == origin))
            .map(|(i, _)| i as u32)
            .collect();
        for &idx in &victims {
            if let Some(slot) = st.forget(idx) {
                dirty.touch(&slot, ChangeKind::Purged, want);
            }
        }
        st.origins.remove(origin);
        self.finish(&mut st, dirty);
        victims.len()
    }

    /// Forgets tombstones that have not changed for `max_age`. Returns how many.
    pub fn gc_tombstones(&self, max_age: Duration) -> usize {
        let want = self.changes.receiver_count() > 0;
        let mut dirty = Dirty::default();
        let mut st = self.state.lock();
        let now = Instant::now();
        let victims: Vec<u32> = st
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.as_ref().is_some_and(|s| {
                    s.tombstone && now.saturating_duration_since(s.changed) >= max_age
                })
            })
            .map(|(i, _)| i as u32)
            .collect();
        for &idx in &victims {
            if let Some(slot) = st.forget(idx) {
                dirty.touch(&slot, ChangeKind::Purged, want);
            }
        }
        // Tombstones serve no answers: only the change events matter.
        dirty.names.clear();
        dirty.addrs.clear();
        self.finish(&mut st, dirty);
        victims.len()
    }

    /// Hides (or shows again) the entries of `origin` in DNS answers and lookups,
    /// keeping them stored. Used for peers that are down.
    pub fn set_origin_hidden(&self, origin: &str, hidden: bool) {
        let mut dirty = Dirty::default();
        let mut st = self.state.lock();
        let key = st.intern_origin(origin);
        if st.origins.insert(key, hidden) == Some(hidden) {
            return;
        }
        for slot in st.slots.iter().flatten() {
            if &*slot.origin == origin {
                dirty.touch(slot, ChangeKind::Added, false);
            }
        }
        self.finish(&mut st, dirty);
    }

    /// The visible addresses registered under `fqdn` (any case, dot optional),
    /// in registration order, without duplicates.
    pub fn lookup(&self, fqdn: &str) -> Vec<IpAddr> {
        let Ok(name) = parse_name(fqdn) else {
            return Vec::new();
        };
        let st = self.state.lock();
        addrs_of(&st, &name.to_ascii())
    }

    /// The visible names registered for `ip`, without duplicates.
    pub fn lookup_addr(&self, ip: IpAddr) -> Vec<String> {
        let st = self.state.lock();
        names_of(&st, ip)
            .into_iter()
            .map(|n| n.to_string())
            .collect()
    }

    /// Every stored entry, tombstones included, in no particular order.
    pub fn entries(&self) -> Vec<Entry> {
        let st = self.state.lock();
        st.slots.iter().flatten().map(Slot::to_entry).collect()
    }

    /// Number of live (not tombstoned) entries, hidden ones included.
    pub fn len(&self) -> usize {
        self.state.lock().live
    }

    /// Whether there is no live entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bumped by every change; two equal readings mean nothing changed in between.
    pub fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// Subscribes to every future change. See the module docs for lagging receivers.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Rebuilds the answers of everything `dirty` touched and publishes its changes.
    fn finish(&self, st: &mut State, dirty: Dirty) {
        if dirty.names.is_empty() && dirty.addrs.is_empty() && dirty.changes.is_empty() {
            return;
        }
        st.generation += 1;
        for name in &dirty.names {
            let Some(wire) = wire_of_text(name) else {
                continue;
            };
            self.answers.set_name(&wire, &addrs_of(st, name));
        }
        for &ip in &dirty.addrs {
            let names: Vec<Vec<u8>> = names_of(st, ip)
                .iter()
                .filter_map(|n| parse_name(n).ok().map(|n| wire_lower(&n)))
                .collect();
            let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
            self.answers.set_ptr(&reverse_wire(ip), &refs);
        }
        for change in dirty.changes {
            tracing::debug!(
                kind = ?change.kind,
                id = %change.entry.id,
                ip = %change.entry.ip,
                fqdn = %change.entry.fqdn,
                origin = %change.entry.origin,
                version = change.entry.version,
                "records db change"
            );
            // No receiver is fine: nobody is listening.
            let _ = self.changes.send(change);
        }
    }
}

fn addrs_of(st: &State, fqdn: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for &idx in st.by_name.get(fqdn).map(Vec::as_slice).unwrap_or_default() {
        if let Some(slot) = st.slot(idx)
            && st.visible(slot)
            && !out.contains(&slot.ip)
        {
            out.push(slot.ip);
        }
    }
    out
}

fn names_of(st: &State, ip: IpAddr) -> Vec<Arc<str>> {
    let mut out: Vec<Arc<str>> = Vec::new();
    for &idx in st.by_addr.get(&ip).map(Vec::as_slice).unwrap_or_default() {
        if let Some(slot) = st.slot(idx)
            && st.visible(slot)
            && !out.contains(&slot.fqdn)
        {
            out.push(slot.fqdn.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests;
