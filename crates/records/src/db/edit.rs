//! The one write path of the database: one [`Edit`] to the records of one name.
//!
//! [`Db::edit`] runs four steps, each its own function:
//!
//! 1. Under the name's shard write lock, the edit itself changes the records
//!    ([`upsert`], [`tombstone`], [`set_health`], [`forget`]), noting what changed in an
//!    [`Outcome`].
//! 2. Still under that lock, [`mark_served`] works out in one pass over the name's
//!    records which of them are answered (`serve`, `srv_serve`, `srv_addr`) and the
//!    state of every address of the name for the PTR index ([`AddrState`]).
//! 3. After the lock, [`Db::update_addr_index`] and [`update_id_index`] keep the
//!    address and id indexes in step.
//! 4. [`Db::publish`] counts the change and broadcasts it.
//!
//! Every step is O(records of the name): an edit never rescans the records before
//! each record, so registering the 5,000th instance of a service costs about as much
//! as registering the 1st plus one pass over 5,000 records (see `docs/PERFORMANCE.md`).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::answers::{NameRef, PtrRef, Rec, Srv};
use crate::health::{Health, HealthFailMode};
use crate::service::ServicePort;

use super::{Change, ChangeKind, Db, Writer, entry_of, text_of_wire};

/// The hasher of the per-edit sets: fast, and seeded per set because registrations
/// choose the keys.
type FastHash = foldhash::fast::RandomState;

/// What to do to the records of one name.
pub(super) enum Edit<'a> {
    /// Add or revive (local origin) / merge (`apply`) one record.
    Upsert(Upsert<'a>),
    /// Set the health of the live records of `id` at `ip` owned by `origin`.
    Health {
        id: &'a str,
        ip: IpAddr,
        origin: u32,
        health: Health,
    },
    /// Tombstone the live records of `id` owned by `origin` (narrowed to `ip`).
    Tombstone {
        id: &'a str,
        ip: Option<IpAddr>,
        origin: u32,
    },
    /// Forget the records matching a predicate.
    Forget(&'a dyn Fn(&Rec) -> bool),
    /// Only recompute what is served (visibility changed).
    Refresh,
}

/// One record to add, revive or merge.
pub(super) struct Upsert<'a> {
    pub(super) id: &'a str,
    pub(super) ip: IpAddr,
    pub(super) service: Option<&'a ServicePort>,
    pub(super) origin: u32,
    /// A local add: the health of a new (or revived) entry. A merge: the entry's.
    pub(super) health: Health,
    /// `None`: a local add (version bumped as needed); `Some`: a merge.
    pub(super) remote: Option<Remote>,
}

/// The version and state of an entry learnt from elsewhere.
#[derive(Debug, Clone, Copy)]
pub(super) struct Remote {
    pub(super) version: u64,
    pub(super) tombstone: bool,
}

/// One change of a record, broadcast after the edit.
struct Event {
    kind: ChangeKind,
    rec: Rec,
}

/// What an edit did, gathered under the shard lock and applied to the indexes after.
#[derive(Default)]
struct Outcome {
    events: Vec<Event>,
    /// Addresses whose PTR entry for this name may have changed.
    touched: Vec<IpAddr>,
    /// Ids whose records of this name were forgotten.
    unlinked: Vec<Arc<str>>,
    live_delta: isize,
    changed: usize,
}

impl Outcome {
    fn record(&mut self, kind: ChangeKind, rec: &Rec) {
        self.changed += 1;
        self.touched.push(rec.ip);
        self.events.push(Event {
            kind,
            rec: rec.clone(),
        });
    }
}

/// Whether a name has records of an address, and whether one of them is answered:
/// the name's PTR entry for that address.
#[derive(Debug, Clone, Copy)]
struct AddrState {
    ip: IpAddr,
    present: bool,
    served: bool,
}

/// What the serve pass decided for one record.
#[derive(Debug, Clone, Copy, Default)]
struct Served {
    serve: bool,
    srv_serve: bool,
    srv_addr: bool,
}

impl Db {
    /// Applies `edit` to the records of `name`, recomputes what is served, keeps the
    /// address and id indexes in step and publishes the changes. Returns how many
    /// records changed.
    pub(super) fn edit(&self, w: &mut Writer, name: &NameRef, edit: Edit<'_>) -> usize {
        let now = self.now();
        let is_upsert = matches!(edit, Edit::Upsert(_));
        let mut out = Outcome::default();
        let (addrs, gone) = self.tables.names.write(&name[..], |map| {
            let mut recs: Vec<Rec> = map
                .get_mut(&name[..])
                .map(|b| std::mem::take(b).into_vec())
                .unwrap_or_default();
            match edit {
                Edit::Upsert(u) => upsert(w, &mut recs, &u, now, &mut out),
                Edit::Tombstone { id, ip, origin } => {
                    tombstone(&mut recs, id, ip, origin, now, &mut out);
                }
                Edit::Health {
                    id,
                    ip,
                    origin,
                    health,
                } => set_health(&mut recs, id, ip, origin, health, now, &mut out),
                Edit::Forget(pred) => forget(&mut recs, pred, &mut out),
                Edit::Refresh => out.touched.extend(recs.iter().map(|r| r.ip)),
            }
            let fail = self.config.health_fail;
            let addrs = mark_served(w, &mut recs, fail, &mut out.touched);
            let gone = unlinked_ids(&recs, std::mem::take(&mut out.unlinked));
            if recs.is_empty() {
                map.remove(&name[..]);
            } else {
                map.insert(name.clone(), recs.into_boxed_slice());
            }
            (addrs, gone)
        });
        if out.changed == 0 && out.touched.is_empty() {
            return 0;
        }
        self.update_addr_index(name, &addrs);
        update_id_index(w, name, is_upsert, &out.events, &gone);
        w.live = w.live.saturating_add_signed(out.live_delta);
        self.publish(w, name, out.events, out.changed);
        out.changed
    }

    /// The address index: this name's membership and servability for every
    /// address the edit touched.
    fn update_addr_index(&self, name: &NameRef, addrs: &[AddrState]) {
        for a in addrs {
            let mut refs = self.tables.addr_refs(a.ip);
            match refs.iter().position(|p| p.name == *name) {
                Some(i) if a.present => refs[i].serve = a.served,
                Some(i) => {
                    refs.remove(i);
                }
                None if a.present => refs.push(PtrRef {
                    name: name.clone(),
                    serve: a.served,
                }),
                None => {}
            }
            self.tables.set_addr(a.ip, refs);
        }
    }

    /// Counts the change (when a record changed) and broadcasts its events to
    /// subscribers and the debug log.
    fn publish(&self, w: &mut Writer, name: &NameRef, events: Vec<Event>, changed: usize) {
        if changed > 0 {
            self.bump(w);
        }
        let want = self.changes.receiver_count() > 0;
        if !want && !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let fqdn = text_of_wire(name);
        for Event { kind, rec } in events {
            let entry = entry_of(w, &fqdn, &rec);
            tracing::debug!(
                kind = ?kind,
                id = %entry.id,
                ip = %entry.ip,
                fqdn = %entry.fqdn,
                origin = %entry.origin,
                version = entry.version,
                "records db change"
            );
            // No receiver is fine: nobody is listening.
            let _ = self.changes.send(Change { kind, entry });
        }
    }
}

/// Adds, revives, replaces or merges one record.
fn upsert(w: &Writer, recs: &mut Vec<Rec>, u: &Upsert<'_>, now: u32, out: &mut Outcome) {
    let pos = recs
        .iter()
        .position(|r| r.origin == u.origin && r.ip == u.ip && &*r.id == u.id);
    let same_service = |r: &Rec| r.service.as_ref().map(|s| &s.spec) == u.service;
    let (version, tombstone) = match (pos.map(|p| &recs[p]), u.remote) {
        // A local add of what is live already changes nothing.
        (Some(r), None) if !r.tombstone && same_service(r) => return,
        (Some(r), None) => (r.version + 1, false),
        (None, None) => (1, false),
        // A merge of an older or equal version keeps what is there.
        (Some(r), Some(remote)) if remote.version <= r.version => return,
        (_, Some(remote)) => (remote.version, remote.tombstone),
    };
    let at = match pos {
        Some(p) => {
            let r = &mut recs[p];
            out.live_delta += isize::from(r.tombstone) - isize::from(tombstone);
            // A revived local entry starts over; a merge takes the owner's word; a
            // live local one keeps its verdict.
            if r.tombstone || u.remote.is_some() {
                r.health = u.health;
            }
            r.version = version;
            r.tombstone = tombstone;
            r.changed = now;
            if !same_service(r) {
                r.service = u.service.map(Srv::new);
            }
            p
        }
        None => {
            out.live_delta += isize::from(!tombstone);
            recs.push(Rec {
                id: w.intern_id(u.id),
                ip: u.ip,
                origin: u.origin,
                version,
                changed: now,
                tombstone,
                health: u.health,
                serve: false,
                service: u.service.map(Srv::new),
                srv_serve: false,
                srv_addr: false,
            });
            recs.len() - 1
        }
    };
    let kind = if tombstone {
        ChangeKind::Removed
    } else {
        ChangeKind::Added
    };
    out.record(kind, &recs[at]);
}

/// Tombstones the live records of `id` owned by `origin`, narrowed to `ip`.
fn tombstone(
    recs: &mut [Rec],
    id: &str,
    ip: Option<IpAddr>,
    origin: u32,
    now: u32,
    out: &mut Outcome,
) {
    for r in recs.iter_mut().filter(|r| {
        !r.tombstone && r.origin == origin && &*r.id == id && ip.is_none_or(|ip| ip == r.ip)
    }) {
        r.tombstone = true;
        r.version += 1;
        r.changed = now;
        out.live_delta -= 1;
        out.record(ChangeKind::Removed, r);
    }
}

/// Sets the health of the live records of (id, ip, origin) that differ.
fn set_health(
    recs: &mut [Rec],
    id: &str,
    ip: IpAddr,
    origin: u32,
    health: Health,
    now: u32,
    out: &mut Outcome,
) {
    for r in recs.iter_mut().filter(|r| {
        !r.tombstone && r.origin == origin && r.ip == ip && &*r.id == id && r.health != health
    }) {
        r.health = health;
        r.version += 1;
        r.changed = now;
        out.record(ChangeKind::Added, r);
    }
}

/// Forgets the records matching `pred`.
fn forget(recs: &mut Vec<Rec>, pred: &dyn Fn(&Rec) -> bool, out: &mut Outcome) {
    recs.retain(|r| {
        if !pred(r) {
            return true;
        }
        out.live_delta -= isize::from(!r.tombstone);
        out.unlinked.push(r.id.clone());
        out.record(ChangeKind::Purged, r);
        false
    });
}

/// Works out what is served, in one pass: a record is answered when it is live,
/// visible and passing its check (or every live one when none passes and the name
/// fails open), and the first such record of its address; its port goes in SRV
/// answers when it is the first of its (service, address, port), and its address in
/// their additional section when also the first of its (service, address): one
/// address may offer a service on several ports (two containers sharing a network
/// namespace).
///
/// Adds to `touched` the addresses whose `serve` flipped (a name that starts or stops
/// failing open changes records the edit did not touch), and returns the PTR state
/// of every touched address.
fn mark_served(
    w: &Writer,
    recs: &mut [Rec],
    mode: HealthFailMode,
    touched: &mut Vec<IpAddr>,
) -> Vec<AddrState> {
    let visible = |r: &Rec| !r.tombstone && !w.hidden(r.origin);
    let fail_open =
        mode == HealthFailMode::Open && !recs.iter().any(|r| visible(r) && r.health.passing());
    // Address → whether one of its records is served (present: has a record).
    let mut addrs: HashMap<IpAddr, bool, FastHash> =
        HashMap::with_capacity_and_hasher(recs.len(), FastHash::default());
    let mut srv_ports: HashSet<(&[u8], IpAddr, u16), FastHash> = HashSet::default();
    let mut srv_addrs: HashSet<(&[u8], IpAddr), FastHash> = HashSet::default();
    let mut served = Vec::with_capacity(recs.len());
    for r in recs.iter() {
        let servable =
            visible(r) && (r.health.passing() || (fail_open && r.health == Health::Unhealthy));
        let addr_served = addrs.entry(r.ip).or_insert(false);
        let mut s = Served {
            serve: servable && !*addr_served,
            ..Served::default()
        };
        *addr_served |= s.serve;
        if let Some(srv) = r.service.as_ref().filter(|_| servable) {
            s.srv_serve = srv_ports.insert((&*srv.labels, r.ip, srv.spec.port()));
            s.srv_addr = s.srv_serve && srv_addrs.insert((&*srv.labels, r.ip));
        }
        served.push(s);
    }
    for (r, s) in recs.iter_mut().zip(&served) {
        if r.serve != s.serve {
            touched.push(r.ip);
        }
        r.serve = s.serve;
        r.srv_serve = s.srv_serve;
        r.srv_addr = s.srv_addr;
    }
    touched.sort_unstable();
    touched.dedup();
    touched
        .iter()
        .map(|&ip| AddrState {
            ip,
            present: addrs.contains_key(&ip),
            served: addrs.get(&ip).copied().unwrap_or(false),
        })
        .collect()
}

/// Of the ids whose records of a name were forgotten, those with none left.
fn unlinked_ids(recs: &[Rec], unlinked: Vec<Arc<str>>) -> Vec<Arc<str>> {
    if unlinked.is_empty() {
        return unlinked;
    }
    let left: HashSet<&str, FastHash> = recs.iter().map(|r| &*r.id).collect();
    let mut gone: Vec<Arc<str>> = unlinked
        .into_iter()
        .filter(|id| !left.contains(&**id))
        .collect();
    gone.sort_unstable();
    gone.dedup();
    gone
}

/// The id index: a name is linked to every id with a record of it.
fn update_id_index(
    w: &mut Writer,
    name: &NameRef,
    is_upsert: bool,
    events: &[Event],
    gone: &[Arc<str>],
) {
    if is_upsert {
        for e in events {
            w.link_id(&e.rec.id, name);
        }
    }
    for id in gone {
        w.unlink_id(id, name);
    }
}
