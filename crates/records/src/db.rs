//! The records database: who registered which address under which name.
//!
//! An [`Entry`] is (container id, address, fqdn, origin node, version, tombstone),
//! optionally with a [`ServicePort`] (answered as SRV). The identity of an entry is
//! (id, address, fqdn, origin); the service is an attribute: registering the same
//! entry again with another service or port (or none) replaces it.
//! Entries live in the tables the DNS server reads (see `answers`): by lower-cased
//! wire name, with an address index for PTR and, on the writer's side, an id index.
//! A change rewrites only the records and addresses it touches: O(records sharing the
//! touched address) amortised, never O(name) or O(database) (see `edit`), so 100,000
//! registrations stay linear whether they are 100,000 names or instances of one.
//!
//! The change API is documented on [`Db`].
//!
//! Writers are serialised by one mutex; DNS reads never take it (they read the sharded
//! tables), so registrations and queries do not block each other beyond one shard lock.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, watch};

use hickory_proto::rr::Name;

use crate::answers::{NameRef, Rec, Tables};
use crate::error::Result;
use crate::health::{Health, HealthFailMode};
use crate::name::{Domain, parse_name, wire_lower};
use crate::service::ServicePort;
use edit::{Edit, Remote, Upsert};

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
    /// Whether a name none of whose live entries passes its check answers them all.
    pub health_fail: HealthFailMode,
}

impl DbConfig {
    /// A configuration for `domain` with TTL 1 s and origin [`DEFAULT_ORIGIN`].
    pub fn new(domain: Domain) -> Self {
        Self {
            domain,
            ttl: 1,
            origin: DEFAULT_ORIGIN.to_owned(),
            health_fail: HealthFailMode::Open,
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
    /// The service and port answered as SRV at `<service>.<fqdn>`, if any. In JSON
    /// its fields, `service`, `port`, `priority` and `weight`, sit beside the others
    /// (absent when none; priority and weight read as 0 and 1 when absent).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServicePort>,
    /// What the owner's check says (absent in JSON when there is no check).
    #[serde(default, skip_serializing_if = "Health::is_unchecked")]
    pub health: Health,
}

/// One SRV record of a service as [`Db::lookup_srv`] gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrvEndpoint {
    /// The instance's address and the service's port.
    pub addr: SocketAddr,
    /// RFC 2782 priority (lower is preferred).
    pub priority: u16,
    /// RFC 2782 weight within the priority.
    pub weight: u16,
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

/// What the writer keeps beside the tables.
#[derive(Debug, Default)]
struct Writer {
    /// Names that have records of an id (any origin, any state).
    by_id: HashMap<Arc<str>, Box<[NameRef]>, foldhash::fast::RandomState>,
    /// Interned origin names and whether their records are hidden; a record's
    /// `origin` is an index into it.
    origins: Vec<Origin>,
    /// Positions and counts of the names of [`index::INDEX_MIN`] records or more.
    indexes: HashMap<NameRef, index::NameIndex, foldhash::fast::RandomState>,
    live: usize,
    generation: u64,
}

/// One origin (node) of entries.
#[derive(Debug)]
struct Origin {
    name: Arc<str>,
    hidden: bool,
}

impl Writer {
    fn origin_index(&mut self, origin: &str) -> u32 {
        if let Some(i) = self.find_origin(origin) {
            return i;
        }
        self.origins.push(Origin {
            name: origin.into(),
            hidden: false,
        });
        (self.origins.len() - 1) as u32
    }

    fn find_origin(&self, origin: &str) -> Option<u32> {
        self.origins
            .iter()
            .position(|o| &*o.name == origin)
            .map(|i| i as u32)
    }

    fn hidden(&self, origin: u32) -> bool {
        self.origins.get(origin as usize).is_some_and(|o| o.hidden)
    }

    fn origin_name(&self, origin: u32) -> &str {
        self.origins.get(origin as usize).map_or("", |o| &o.name)
    }

    fn intern_id(&self, id: &str) -> Arc<str> {
        match self.by_id.get_key_value(id) {
            Some((k, _)) => k.clone(),
            None => id.into(),
        }
    }

    fn link_id(&mut self, id: &Arc<str>, name: &NameRef) {
        let names = self.by_id.entry(id.clone()).or_default();
        if !names.iter().any(|n| n == name) {
            let mut v = names.to_vec();
            v.push(name.clone());
            *names = v.into_boxed_slice();
        }
    }

    fn unlink_id(&mut self, id: &str, name: &NameRef) {
        if let Some(names) = self.by_id.get_mut(id) {
            let v: Vec<NameRef> = names.iter().filter(|n| *n != name).cloned().collect();
            if v.is_empty() {
                self.by_id.remove(id);
            } else {
                *names = v.into_boxed_slice();
            }
        }
    }
}

/// The records database. Cheap to share behind an `Arc`; every method takes `&self`.
///
/// # Change API (what replication and the Docker updater build on)
///
/// - [`Db::add`], [`Db::remove`], [`Db::remove_all`]: changes made on this node; the
///   entries carry [`Db::origin`]. A removal does not forget the entry: it becomes a
///   *tombstone* with a higher version, so the removal can be replicated.
/// - [`Db::apply`]: merge an entry learnt from elsewhere (another node's entry, or a
///   tombstone for one of ours). The higher version wins; equal versions keep what
///   is there.
/// - [`Db::purge_origin`], [`Db::gc_tombstones`]: forget entries for good.
/// - [`Db::hide_origin`], [`Db::show_origin`]: hide (or show again) every entry of one origin from
///   DNS answers and lookups without forgetting them (a peer that is down).
/// - [`Db::subscribe`]: a `tokio::sync::broadcast` of every [`Change`]. A receiver
///   that lags (`RecvError::Lagged`) must resynchronise from [`Db::entries`].
/// - [`Db::generation`]: a counter bumped by every change; [`Db::watch`] is the same
///   counter as a `tokio::sync::watch`, for readers that follow what is served (a
///   proxy's upstream fed by push) rather than every change.
///
/// Changes to one entry are broadcast in the order they happen. A subscriber that
/// replicates this node's own entries filters on `entry.origin == db.origin()`.
#[derive(Debug)]
pub struct Db {
    config: DbConfig,
    tables: Arc<Tables>,
    writer: Mutex<Writer>,
    changes: broadcast::Sender<Change>,
    /// The generation, for [`Db::watch`] receivers.
    served: watch::Sender<u64>,
    epoch: Instant,
}

/// Whether an origin's entries are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Visibility {
    Shown,
    Hidden,
}

impl Db {
    /// An empty database.
    pub fn new(config: DbConfig) -> Self {
        let (changes, _) = broadcast::channel(1024);
        let mut writer = Writer::default();
        writer.origin_index(&config.origin);
        Self {
            tables: Arc::new(Tables::new()),
            config,
            writer: Mutex::new(writer),
            changes,
            served: watch::Sender::new(0),
            epoch: Instant::now(),
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

    /// The tables the DNS fast path reads (see [`crate::answers`]); only the
    /// database writes them.
    pub fn tables(&self) -> &Arc<Tables> {
        &self.tables
    }

    fn now(&self) -> u32 {
        u32::try_from(self.epoch.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    /// The shared wire name for `wire` (the table's key when the name exists).
    fn name_ref(&self, wire: &[u8]) -> NameRef {
        self.tables.names.key(wire).unwrap_or_else(|| wire.into())
    }

    /// Registers `ip` under `fqdn` for container `id`, owned by this node, without a
    /// service (one it had is dropped): [`Db::add_service`] with `None`.
    pub fn add(&self, id: &str, ip: IpAddr, fqdn: &str) -> Result<bool> {
        self.add_service(id, ip, fqdn, None)
    }

    /// Registers `ip` under `fqdn` for container `id`, owned by this node, with the
    /// service and port answered as SRV at `<service>.<fqdn>` when given: a new (or
    /// revived) entry is unchecked ([`Db::add_checked`] with [`Health::Unchecked`]).
    pub fn add_service(
        &self,
        id: &str,
        ip: IpAddr,
        fqdn: &str,
        service: Option<&ServicePort>,
    ) -> Result<bool> {
        self.add_checked(id, ip, fqdn, service, Health::Unchecked)
    }

    /// Registers `ip` under `fqdn` for container `id`, owned by this node, with the
    /// service and port answered as SRV at `<service>.<fqdn>` when given, for an entry
    /// whose owner checks it: a new (or revived) entry starts in `health` (e.g.
    /// [`Health::Starting`], so it is not answered before its first verdict); a live
    /// one keeps its health (see [`Db::set_health`]).
    ///
    /// Returns whether anything changed (`false` when that exact entry, service
    /// included, is already live). Re-adding a live entry with another service (or
    /// none) replaces it with a higher version; re-adding a removed entry revives its
    /// tombstone with a higher version. Fails if `fqdn` is not a valid name strictly
    /// inside the domain.
    pub fn add_checked(
        &self,
        id: &str,
        ip: IpAddr,
        fqdn: &str,
        service: Option<&ServicePort>,
        health: Health,
    ) -> Result<bool> {
        let wire = self.config.domain.member_wire(fqdn)?;
        let mut w = self.writer.lock();
        let name = self.name_ref(&wire);
        Ok(self.edit(
            &mut w,
            &name,
            Edit::Upsert(Upsert {
                id,
                ip,
                service,
                origin: 0,
                health,
                remote: None,
            }),
        ) > 0)
    }

    /// Tombstones this node's live entries of container `id`, narrowed to one address
    /// and/or one name when given. Returns how many entries were removed (0 is fine).
    pub fn remove(&self, id: &str, ip: Option<IpAddr>, fqdn: Option<&str>) -> usize {
        let only = match fqdn {
            Some(f) => match parse_name(f) {
                Ok(n) => Some(wire_lower(&n)),
                // An unparsable name matches nothing.
                Err(_) => return 0,
            },
            None => None,
        };
        let mut w = self.writer.lock();
        let Some(names) = w.by_id.get(id).cloned() else {
            return 0;
        };
        names
            .iter()
            .filter(|n| only.as_deref().is_none_or(|o| &n[..] == o))
            .map(|name| self.edit(&mut w, name, Edit::Tombstone { id, ip, origin: 0 }))
            .sum()
    }

    /// Sets the health of this node's live entries of container `id` at `ip` (every
    /// name). Each entry whose health changes gets a new version (so the change is
    /// replicated) and is answered or not accordingly. Returns how many changed.
    pub fn set_health(&self, id: &str, ip: IpAddr, health: Health) -> usize {
        let mut w = self.writer.lock();
        let Some(names) = w.by_id.get(id).cloned() else {
            return 0;
        };
        let edit = || Edit::Health {
            id,
            ip,
            origin: 0,
            health,
        };
        names
            .iter()
            .map(|name| self.edit(&mut w, name, edit()))
            .sum()
    }

    /// The health of this node's live entry of container `id` at `ip` under the
    /// name `wire` (lower-cased wire form); `None` when there is no such live entry.
    pub fn local_health(&self, id: &str, ip: IpAddr, wire: &[u8]) -> Option<Health> {
        self.tables.names.read(wire, |recs| {
            recs.into_iter()
                .flatten()
                .find(|r| !r.tombstone && r.origin == 0 && r.ip == ip && &*r.id == id)
                .map(|r| r.health)
        })
    }

    /// [`Db::set_health`] narrowed to one name, `wire` (lower-cased wire form): the
    /// health of one entry, as its own check sees it. Returns how many changed.
    pub fn set_entry_health(&self, id: &str, ip: IpAddr, wire: &[u8], health: Health) -> usize {
        let mut w = self.writer.lock();
        let name = self.name_ref(wire);
        self.edit(
            &mut w,
            &name,
            Edit::Health {
                id,
                ip,
                origin: 0,
                health,
            },
        )
    }

    /// How many live, visible entries are in each health state, in the order of
    /// [`Health::ALL`], and how many names fail open (no entry passes, all answered).
    pub fn health_counts(&self) -> ([usize; 4], usize) {
        let w = self.writer.lock();
        let mut counts = [0usize; 4];
        let mut failing_open = 0;
        self.tables.names.for_each(|_, recs| {
            let mut live = 0;
            let mut passing = 0;
            let mut served = 0;
            for r in recs.iter().filter(|r| !r.tombstone && !w.hidden(r.origin)) {
                counts[usize::from(r.health.code())] += 1;
                live += 1;
                passing += usize::from(r.health.passing());
                served += usize::from(r.serve);
            }
            if live > 0 && passing == 0 && served > 0 {
                failing_open += 1;
            }
        });
        (counts, failing_open)
    }

    /// Tombstones every live entry of container `id` owned by this node.
    pub fn remove_all(&self, id: &str) -> usize {
        self.remove(id, None, None)
    }

    /// The origins (nodes) owning a live entry of container `id`, narrowed like
    /// [`Db::remove`], sorted and without duplicates. Used to tell a delete that
    /// matches only other nodes' entries from one that matches nothing.
    pub fn live_origins(&self, id: &str, ip: Option<IpAddr>, fqdn: Option<&str>) -> Vec<String> {
        let only = match fqdn {
            Some(f) => match parse_name(f) {
                Ok(n) => Some(wire_lower(&n)),
                Err(_) => return Vec::new(),
            },
            None => None,
        };
        let w = self.writer.lock();
        let Some(names) = w.by_id.get(id) else {
            return Vec::new();
        };
        let mut origins: Vec<String> = Vec::new();
        for name in names
            .iter()
            .filter(|n| only.as_deref().is_none_or(|o| &n[..] == o))
        {
            // A large name's index gives the records of the id without a scan.
            let index = w.indexes.get(&name[..]);
            self.tables.names.read(&name[..], |recs| {
                let recs = recs.map_or(&[][..], |r| &r[..]);
                let mut check = |r: &Rec| {
                    if !r.tombstone && &*r.id == id && ip.is_none_or(|ip| ip == r.ip) {
                        origins.push(w.origin_name(r.origin).to_owned());
                    }
                };
                match index {
                    Some(ix) => ix
                        .of_id(id)
                        .iter()
                        .filter_map(|&p| recs.get(p as usize))
                        .for_each(&mut check),
                    None => recs.iter().for_each(check),
                }
            });
        }
        origins.sort_unstable();
        origins.dedup();
        origins
    }

    /// Merges an entry learnt from elsewhere (replication): inserted when unknown,
    /// replaces the known one when its version is higher, ignored otherwise.
    /// Returns whether anything changed. Fails if the name is not inside the domain.
    pub fn apply(&self, entry: Entry) -> Result<bool> {
        let wire = self.config.domain.member_wire(&entry.fqdn)?;
        let mut w = self.writer.lock();
        let origin = w.origin_index(&entry.origin);
        let name = self.name_ref(&wire);
        let edit = Edit::Upsert(Upsert {
            id: &entry.id,
            ip: entry.ip,
            service: entry.service.as_ref(),
            origin,
            health: entry.health,
            remote: Some(Remote {
                version: entry.version,
                tombstone: entry.tombstone,
            }),
        });
        Ok(self.edit(&mut w, &name, edit) > 0)
    }

    /// Forgets every entry (live or tombstone) owned by `origin`. Returns how many.
    pub fn purge_origin(&self, origin: &str) -> usize {
        let mut w = self.writer.lock();
        let Some(o) = w.find_origin(origin) else {
            return 0;
        };
        let pred = move |r: &Rec| r.origin == o;
        let names = self.names_where(&pred);
        names
            .iter()
            .map(|n| self.edit(&mut w, n, Edit::Forget(&pred)))
            .sum()
    }

    /// Forgets tombstones that have not changed for `max_age`. Returns how many.
    pub fn gc_tombstones(&self, max_age: Duration) -> usize {
        let mut w = self.writer.lock();
        let now = self.now();
        let max_age = u32::try_from(max_age.as_secs()).unwrap_or(u32::MAX);
        // Ages are whole seconds since the database started.
        let pred = move |r: &Rec| r.tombstone && now.saturating_sub(r.changed) >= max_age;
        let names = self.names_where(&pred);
        names
            .iter()
            .map(|n| self.edit(&mut w, n, Edit::Forget(&pred)))
            .sum()
    }

    /// Hides the entries of `origin` from DNS answers and lookups, keeping them
    /// stored. Used for peers that are down.
    pub fn hide_origin(&self, origin: &str) {
        self.set_origin_visibility(origin, Visibility::Hidden);
    }

    /// Shows the entries of `origin` again after [`Db::hide_origin`].
    pub fn show_origin(&self, origin: &str) {
        self.set_origin_visibility(origin, Visibility::Shown);
    }

    fn set_origin_visibility(&self, origin: &str, visibility: Visibility) {
        let hidden = visibility == Visibility::Hidden;
        let mut w = self.writer.lock();
        let o = w.origin_index(origin);
        if w.origins[o as usize].hidden == hidden {
            return;
        }
        w.origins[o as usize].hidden = hidden;
        let pred = move |r: &Rec| r.origin == o;
        for name in self.names_where(&pred) {
            self.edit(&mut w, &name, Edit::Refresh);
        }
        self.bump(&mut w);
    }

    /// Counts one change and tells [`Db::watch`] receivers. Called under the writer
    /// lock, so receivers see generations in order; with none it is a store and an
    /// uncontended lock.
    fn bump(&self, w: &mut Writer) {
        w.generation += 1;
        self.served.send_replace(w.generation);
    }

    /// The visible addresses registered under `fqdn` (any case, dot optional),
    /// in registration order, without duplicates.
    pub fn lookup(&self, fqdn: &str) -> Vec<IpAddr> {
        let Ok(name) = parse_name(fqdn) else {
            return Vec::new();
        };
        let wire = wire_lower(&name);
        self.tables.names.read(&wire[..], |recs| {
            recs.map(|r| r.iter().filter(|r| r.serve).map(|r| r.ip).collect())
                .unwrap_or_default()
        })
    }

    /// The endpoints of a service name `<service>.<fqdn>` (e.g.
    /// `_http._tcp.web.weave.local`): the visible addresses of `fqdn` registered with
    /// that service, each with its port, in registration order, without duplicates.
    /// Empty for any other name.
    pub fn lookup_service(&self, name: &str) -> Vec<SocketAddr> {
        // `srv_serve` marks the first record of each (service, address, port), so
        // the SRV endpoints have no duplicates.
        self.lookup_srv(name).into_iter().map(|e| e.addr).collect()
    }

    /// The SRV records of a service name `<service>.<fqdn>`, as the name server
    /// answers them: one per (address, port) of the answered entries of `fqdn` with
    /// that service, in registration order, with the priority and weight of the
    /// entry each is answered from. Empty for any other name.
    pub fn lookup_srv(&self, name: &str) -> Vec<SrvEndpoint> {
        let Ok(name) = parse_name(name) else {
            return Vec::new();
        };
        let wire = wire_lower(&name);
        let Some((labels, base)) = crate::answers::split_service(&wire) else {
            return Vec::new();
        };
        self.tables.names.read(base, |recs| {
            recs.into_iter()
                .flatten()
                .filter(|r| r.srv_serve)
                .filter_map(|r| {
                    let srv = r.service.as_ref().filter(|s| &*s.labels == labels)?;
                    Some(SrvEndpoint {
                        addr: SocketAddr::new(r.ip, srv.spec.port()),
                        priority: srv.spec.priority(),
                        weight: srv.spec.weight(),
                    })
                })
                .collect()
        })
    }

    /// The visible names registered for `ip`, without duplicates.
    pub fn lookup_addr(&self, ip: IpAddr) -> Vec<String> {
        self.tables
            .addr_refs(ip)
            .iter()
            .filter(|p| p.serve)
            .map(|p| text_of_wire(&p.name))
            .collect()
    }

    /// Every stored entry, tombstones included, in no particular order.
    pub fn entries(&self) -> Vec<Entry> {
        let w = self.writer.lock();
        let mut out = Vec::new();
        self.tables.names.for_each(|name, recs| {
            let fqdn = text_of_wire(name);
            out.extend(recs.iter().map(|r| entry_of(&w, &fqdn, r)));
        });
        out
    }

    /// Number of live (not tombstoned) entries, hidden ones included.
    pub fn len(&self) -> usize {
        self.writer.lock().live
    }

    /// Whether there is no live entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bumped by every change; two equal readings mean nothing changed in between.
    pub fn generation(&self) -> u64 {
        self.writer.lock().generation
    }

    /// A receiver of [`Db::generation`], marked changed after every change of the
    /// database, hiding and showing origins included. Changes are coalesced: a reader
    /// that wakes reads the current state (e.g. [`Db::lookup`]) and has missed
    /// nothing, so it never needs to resynchronise.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.served.subscribe()
    }

    /// Subscribes to every future change. A receiver that lags resynchronises from
    /// [`Db::entries`].
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Names having a record that matches `pred`.
    fn names_where(&self, pred: &dyn Fn(&Rec) -> bool) -> Vec<NameRef> {
        let mut names = Vec::new();
        self.tables.names.for_each(|name, recs| {
            if recs.iter().any(pred) {
                names.push(name.clone());
            }
        });
        names
    }
}

fn entry_of(w: &Writer, fqdn: &str, r: &Rec) -> Entry {
    Entry {
        id: r.id.to_string(),
        ip: r.ip,
        fqdn: fqdn.to_owned(),
        origin: w.origin_name(r.origin).to_owned(),
        version: r.version,
        tombstone: r.tombstone,
        service: r.service.as_ref().map(|s| s.spec.clone()),
        health: r.health,
    }
}

/// The text form (lower-case, trailing dot, escaped where needed) of a wire name.
fn text_of_wire(wire: &[u8]) -> String {
    let mut labels = Vec::new();
    let mut pos = 0;
    while let Some(&len) = wire.get(pos) {
        if len == 0 {
            break;
        }
        let end = (pos + 1 + usize::from(len)).min(wire.len());
        labels.push(&wire[pos + 1..end]);
        pos = end;
    }
    match Name::from_labels(labels) {
        Ok(n) => n.to_ascii(),
        Err(_) => String::from_utf8_lossy(wire).into_owned(),
    }
}

mod check;
mod edit;
mod index;

pub use check::Inconsistency;
#[cfg(test)]
mod tests;
