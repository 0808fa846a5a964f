//! The one write path of the database: one [`Edit`] to the records of one name.
//!
//! [`Db::edit`] runs four steps, each its own function:
//!
//! 1. Under the name's shard write lock, the edit itself changes the records in
//!    place ([`upsert`], [`tombstone`], [`set_health`], [`forget`]), noting what
//!    changed in an [`Outcome`]. A name's records are a `Vec` with spare capacity, so
//!    a new record is appended without copying the others.
//! 2. Still under that lock, [`serve_pass`] works out which records are answered
//!    (`serve`, `srv_serve`, `srv_addr`). Those flags depend only on the records of
//!    the same address and on whether the name fails open (no visible record passes
//!    its check), so only the groups of the addresses the edit touched are
//!    recomputed; every group is, when the name starts or stops failing open, on a
//!    [`Edit::Refresh`] (an origin hidden or shown) and after a [`Edit::Forget`].
//! 3. After the lock, the address index (PTR), the id index and the counts of
//!    answered descendants (empty non-terminals, see [`crate::answers::Tables`]) are
//!    kept in step: only for the touched addresses, and for the ancestors only when
//!    the name starts or stops being answered.
//! 4. [`Db::publish`] counts the change and broadcasts it.
//!
//! Finding a record, its address's group and whether the name fails open is O(1)
//! for names of [`INDEX_MIN`] records or more, which keep a [`NameIndex`] (positions
//! by address and by id, and the name's [`Counts`]) between edits; smaller names
//! are scanned. So an edit costs O(records sharing the touched address), amortised:
//! registering the 5,000th instance of a service costs about as much as the 1st
//! (see `docs/PERFORMANCE.md`).

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use crate::answers::{NameRef, Rec, Srv};
use crate::health::{Health, HealthFailMode};
use crate::service::ServicePort;

use super::index::{Counts, INDEX_MIN, NameIndex};
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
    /// Addresses whose records changed, or whose served state flipped.
    touched: Vec<IpAddr>,
    /// Ids whose records of this name were forgotten.
    unlinked: Vec<Arc<str>>,
    live_delta: isize,
    /// Change of the number of visible, passing records.
    passing_delta: isize,
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

/// What the records step decided, for the steps after the lock.
struct Decided {
    addrs: Vec<AddrState>,
    /// Ids with no record of the name left.
    gone: Vec<Arc<str>>,
    /// `Some(answered)` when the name started (`true`) or stopped being answered.
    answered: Option<bool>,
}

/// Whether `r` is live, visible and passes its check.
pub(super) fn passing(w: &Writer, r: &Rec) -> bool {
    !r.tombstone && !w.hidden(r.origin) && r.health.passing()
}

/// The counts of a name, by a scan of its records.
fn count(w: &Writer, recs: &[Rec]) -> Counts {
    Counts {
        passing: recs.iter().filter(|r| passing(w, r)).count(),
        served: recs.iter().filter(|r| r.serve).count(),
    }
}

impl Db {
    /// Applies `edit` to the records of `name`, recomputes what is served, keeps the
    /// address, id and descendant indexes in step and publishes the changes. Returns
    /// how many records changed.
    pub(super) fn edit(&self, w: &mut Writer, name: &NameRef, edit: Edit<'_>) -> usize {
        let now = self.now();
        let is_upsert = matches!(edit, Edit::Upsert(_));
        let mode = self.config.health_fail;
        let mut index = w.indexes.remove(&name[..]);
        let mut out = Outcome::default();
        let decided = self.tables.names.write(&name[..], |map| {
            let recs = map.entry(name.clone()).or_default();
            let decided = edit_records(w, recs, &mut index, edit, mode, now, &mut out);
            if recs.is_empty() {
                map.remove(&name[..]);
            }
            decided
        });
        if let Some(index) = index {
            w.indexes.insert(name.clone(), index);
        }
        if out.changed == 0 && out.touched.is_empty() {
            return 0;
        }
        for a in &decided.addrs {
            self.tables.set_ptr(a.ip, name, a.present, a.served);
        }
        if let Some(answered) = decided.answered {
            let domain = self.config.domain.wire().len();
            self.tables.count_descendant(name, domain, answered);
        }
        update_id_index(w, name, is_upsert, &out.events, &decided.gone);
        w.live = w.live.saturating_add_signed(out.live_delta);
        self.publish(w, name, out.events, out.changed);
        out.changed
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

/// Steps 1 and 2 under the shard lock: the edit, the index, the serve flags of
/// what it touched, the PTR state of the touched addresses.
fn edit_records(
    w: &Writer,
    recs: &mut Vec<Rec>,
    index: &mut Option<NameIndex>,
    edit: Edit<'_>,
    mode: HealthFailMode,
    now: u32,
    out: &mut Outcome,
) -> Decided {
    let before = match index {
        Some(ix) => ix.counts,
        None => count(w, recs),
    };
    let mut full = match edit {
        Edit::Upsert(u) => {
            upsert(w, recs, index, &u, now, out);
            false
        }
        Edit::Tombstone { id, ip, origin } => {
            tombstone(w, recs, index.as_ref(), (id, ip, origin), now, out);
            false
        }
        Edit::Health {
            id,
            ip,
            origin,
            health,
        } => {
            set_health(w, recs, index.as_ref(), (id, ip, origin), health, now, out);
            false
        }
        Edit::Forget(pred) => {
            forget(recs, pred, out);
            *index = None;
            true
        }
        Edit::Refresh => true,
    };
    if index.is_none() && recs.len() >= INDEX_MIN {
        *index = Some(NameIndex::build(recs, before));
    }
    let passing = if full {
        count(w, recs).passing
    } else {
        before.passing.saturating_add_signed(out.passing_delta)
    };
    let fail_open = |passing: usize| mode == HealthFailMode::Open && passing == 0;
    full |= fail_open(before.passing) != fail_open(passing);
    let delta = serve_pass(w, recs, index.as_ref(), fail_open(passing), full, out);
    let served = if full {
        count(w, recs).served
    } else {
        before.served.saturating_add_signed(delta)
    };
    if let Some(ix) = index {
        ix.counts = Counts { passing, served };
    }
    let addrs = out
        .touched
        .iter()
        .map(|&ip| addr_state(recs, index.as_ref(), ip))
        .collect();
    Decided {
        addrs,
        gone: unlinked_ids(recs, std::mem::take(&mut out.unlinked)),
        answered: ((before.served > 0) != (served > 0)).then_some(served > 0),
    }
}

/// The positions worth looking at for an edit: those of an index, or every
/// position of a small name.
enum Candidates<'a> {
    All(std::ops::Range<usize>),
    Indexed(std::slice::Iter<'a, u32>),
}

impl Iterator for Candidates<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            Self::All(range) => range.next(),
            Self::Indexed(it) => it.next().map(|&p| p as usize),
        }
    }
}

/// The candidates for records of `id`, at `ip` when given.
fn candidates<'a>(
    len: usize,
    index: Option<&'a NameIndex>,
    id: &str,
    ip: Option<IpAddr>,
) -> Candidates<'a> {
    match (index, ip) {
        (None, _) => Candidates::All(0..len),
        (Some(ix), Some(ip)) => Candidates::Indexed(ix.of_ip(ip).iter()),
        (Some(ix), None) => Candidates::Indexed(ix.of_id(id).iter()),
    }
}

/// Appends `rec`: small names grow one record at a time (the common name of one
/// record has no spare slot), larger ones double their capacity.
fn push_rec(recs: &mut Vec<Rec>, rec: Rec) {
    if recs.len() == recs.capacity() {
        if recs.len() < 4 {
            recs.reserve_exact(1);
        } else {
            recs.reserve(recs.len());
        }
    }
    recs.push(rec);
}

/// Adds, revives, replaces or merges one record.
fn upsert(
    w: &Writer,
    recs: &mut Vec<Rec>,
    index: &mut Option<NameIndex>,
    u: &Upsert<'_>,
    now: u32,
    out: &mut Outcome,
) {
    let same = |r: &Rec| r.origin == u.origin && r.ip == u.ip && &*r.id == u.id;
    let pos = candidates(recs.len(), index.as_ref(), u.id, Some(u.ip)).find(|&p| same(&recs[p]));
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
            let was = passing(w, r);
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
            out.passing_delta += isize::from(passing(w, r)) - isize::from(was);
            p
        }
        None => {
            out.live_delta += isize::from(!tombstone);
            let rec = Rec {
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
            };
            out.passing_delta += isize::from(passing(w, &rec));
            push_rec(recs, rec);
            let at = recs.len() - 1;
            if let Some(ix) = index {
                ix.add(&recs[at], at);
            }
            at
        }
    };
    let kind = if tombstone {
        ChangeKind::Removed
    } else {
        ChangeKind::Added
    };
    out.record(kind, &recs[at]);
}

/// Tombstones the live records of (id, origin), narrowed to an address when given.
fn tombstone(
    w: &Writer,
    recs: &mut [Rec],
    index: Option<&NameIndex>,
    (id, ip, origin): (&str, Option<IpAddr>, u32),
    now: u32,
    out: &mut Outcome,
) {
    for p in candidates(recs.len(), index, id, ip) {
        let r = &mut recs[p];
        if r.tombstone || r.origin != origin || &*r.id != id || ip.is_some_and(|ip| ip != r.ip) {
            continue;
        }
        out.passing_delta -= isize::from(passing(w, r));
        r.tombstone = true;
        r.version += 1;
        r.changed = now;
        out.live_delta -= 1;
        out.record(ChangeKind::Removed, r);
    }
}

/// Sets the health of the live records of (id, ip, origin) that differ.
fn set_health(
    w: &Writer,
    recs: &mut [Rec],
    index: Option<&NameIndex>,
    (id, ip, origin): (&str, IpAddr, u32),
    health: Health,
    now: u32,
    out: &mut Outcome,
) {
    for p in candidates(recs.len(), index, id, Some(ip)) {
        let r = &mut recs[p];
        if r.tombstone || r.origin != origin || r.ip != ip || &*r.id != id || r.health == health {
            continue;
        }
        let was = passing(w, r);
        r.health = health;
        r.version += 1;
        r.changed = now;
        out.passing_delta += isize::from(passing(w, r)) - isize::from(was);
        out.record(ChangeKind::Added, r);
    }
}

/// Forgets the records matching `pred` (the caller rebuilds the index and runs a
/// full serve pass).
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
    if recs.capacity() > 2 * recs.len() {
        recs.shrink_to_fit();
    }
}

/// The positions of the records of `ip`, ascending: from the index, or (small
/// names) by a scan.
fn group<'a>(recs: &[Rec], index: Option<&'a NameIndex>, ip: IpAddr) -> Group<'a> {
    if let Some(ix) = index {
        return Group::Indexed(ix.of_ip(ip));
    }
    let mut found = [0u32; INDEX_MIN];
    let mut n = 0;
    for (p, _) in recs.iter().enumerate().filter(|(_, r)| r.ip == ip) {
        if n == INDEX_MIN {
            // Only a name without its index could get here; it is still right.
            let all = recs.iter().enumerate().filter(|(_, r)| r.ip == ip);
            return Group::Many(all.map(|(p, _)| p as u32).collect());
        }
        found[n] = p as u32;
        n += 1;
    }
    Group::Scanned(found, n)
}

/// The positions of one address's records.
enum Group<'a> {
    Indexed(&'a [u32]),
    /// A small name's, found by a scan, without allocating.
    Scanned([u32; INDEX_MIN], usize),
    Many(Vec<u32>),
}

impl Group<'_> {
    fn as_slice(&self) -> &[u32] {
        match self {
            Self::Indexed(s) => s,
            Self::Scanned(a, n) => &a[..*n],
            Self::Many(v) => v,
        }
    }
}

/// The PTR state of `ip` for this name.
fn addr_state(recs: &[Rec], index: Option<&NameIndex>, ip: IpAddr) -> AddrState {
    let g = group(recs, index, ip);
    let g = g.as_slice();
    AddrState {
        ip,
        present: !g.is_empty(),
        served: g.iter().any(|&p| recs[p as usize].serve),
    }
}

/// Recomputes the serve flags of the touched addresses' groups, or of every group
/// when `full`; adds to `out.touched` the addresses whose served state flipped.
/// Returns the change of the number of served records.
fn serve_pass(
    w: &Writer,
    recs: &mut [Rec],
    index: Option<&NameIndex>,
    fail_open: bool,
    full: bool,
    out: &mut Outcome,
) -> isize {
    let mut delta = 0;
    if full {
        let mut flipped = Vec::new();
        match index {
            Some(ix) => {
                for (ip, positions) in ix.groups() {
                    let g = serve_group(w, recs, positions, fail_open);
                    delta += g.delta;
                    if g.flipped {
                        flipped.push(ip);
                    }
                }
            }
            None => {
                for i in 0..recs.len() {
                    let ip = recs[i].ip;
                    if recs[..i].iter().any(|r| r.ip == ip) {
                        continue;
                    }
                    let g = group(recs, None, ip);
                    let g = serve_group(w, recs, g.as_slice(), fail_open);
                    delta += g.delta;
                    if g.flipped {
                        flipped.push(ip);
                    }
                }
            }
        }
        out.touched.extend(flipped);
    }
    out.touched.sort_unstable();
    out.touched.dedup();
    if !full {
        for &ip in &out.touched {
            let g = group(recs, index, ip);
            delta += serve_group(w, recs, g.as_slice(), fail_open).delta;
        }
    }
    delta
}

/// What recomputing one address's group changed.
struct GroupOutcome {
    /// Change of the number of served records.
    delta: isize,
    /// Whether the address went from served to not, or back.
    flipped: bool,
}

/// Works out the serve flags of the records of one address (`positions`,
/// ascending): a record is answered when it is live, visible and passing its check
/// (or unhealthy while the name fails open), and the first such record of the
/// address; its port goes in SRV answers when it is the first of its (service,
/// port), and its address in their additional section when also the first of its
/// service: one address may offer a service on several ports (two containers
/// sharing a network namespace).
fn serve_group(w: &Writer, recs: &mut [Rec], positions: &[u32], fail_open: bool) -> GroupOutcome {
    let (mut any, mut was_any, mut delta) = (false, false, 0);
    for (k, &p) in positions.iter().enumerate() {
        let r = &recs[p as usize];
        let servable = !r.tombstone
            && !w.hidden(r.origin)
            && (r.health.passing() || (fail_open && r.health == Health::Unhealthy));
        let serve = servable && !any;
        any |= serve;
        was_any |= r.serve;
        let (srv_serve, srv_addr) = match r.service.as_ref().filter(|_| servable) {
            None => (false, false),
            Some(srv) => srv_flags(recs, &positions[..k], srv),
        };
        let r = &mut recs[p as usize];
        delta += isize::from(serve) - isize::from(r.serve);
        r.serve = serve;
        r.srv_serve = srv_serve;
        r.srv_addr = srv_addr;
    }
    GroupOutcome {
        delta,
        flipped: any != was_any,
    }
}

/// The SRV flags of a servable record with service `srv`, given the records of its
/// address before it (whose flags are already worked out): an earlier `srv_serve`
/// record of the same (service, port) means one was servable first.
fn srv_flags(recs: &[Rec], earlier: &[u32], srv: &Srv) -> (bool, bool) {
    let same = |p: u32, port: bool| {
        let o = &recs[p as usize];
        o.service
            .as_ref()
            .is_some_and(|s| s.labels == srv.labels && (!port || s.spec.port() == srv.spec.port()))
    };
    let srv_serve = !earlier
        .iter()
        .any(|&p| recs[p as usize].srv_serve && same(p, true));
    let srv_addr = srv_serve
        && !earlier
            .iter()
            .any(|&p| recs[p as usize].srv_addr && same(p, false));
    (srv_serve, srv_addr)
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
