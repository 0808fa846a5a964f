//! What the writer keeps between edits about one large name: where its records are,
//! by address and by id, and two counts that the serve rules need.
//!
//! A name of [`INDEX_MIN`] records or more has a [`NameIndex`]; a smaller one is
//! scanned instead, which costs a few comparisons and no memory: most names have one
//! record, and a 100,000-name node is bounded by memory per record (see
//! `docs/PERFORMANCE.md`). Positions index the name's record list in the tables;
//! records are only ever appended, except by a forget, after which the index is
//! rebuilt from the list.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Arc;

use crate::answers::Rec;

/// The hasher of the index maps: fast, and seeded per map because registrations
/// choose the keys.
type FastHash = foldhash::fast::RandomState;

/// Names with at least this many records keep a [`NameIndex`].
pub(super) const INDEX_MIN: usize = 16;

/// A name's live state that decides what it answers: how many of its records are
/// visible and pass their check (none: the name may fail open), and how many are
/// served (none: the name does not exist in DNS, and stops counting as a descendant
/// of its ancestors).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) passing: usize,
    pub(super) served: usize,
}

/// Where a large name's records are, and its [`Counts`].
#[derive(Debug, Default)]
pub(super) struct NameIndex {
    by_ip: HashMap<IpAddr, Positions, FastHash>,
    by_id: HashMap<Arc<str>, Positions, FastHash>,
    pub(super) counts: Counts,
}

/// Positions in a name's record list, ascending. Most keys have one.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Positions {
    One(u32),
    Many(Vec<u32>),
}

impl Positions {
    fn as_slice(&self) -> &[u32] {
        match self {
            Self::One(p) => std::slice::from_ref(p),
            Self::Many(v) => v,
        }
    }

    fn push(&mut self, at: u32) {
        match self {
            Self::One(first) => *self = Self::Many(vec![*first, at]),
            Self::Many(v) => v.push(at),
        }
    }
}

fn push_position<K: Hash + Eq>(map: &mut HashMap<K, Positions, FastHash>, key: K, at: u32) {
    match map.get_mut(&key) {
        Some(p) => p.push(at),
        None => {
            map.insert(key, Positions::One(at));
        }
    }
}

impl NameIndex {
    /// The index of `recs`, whose counts are `counts`.
    pub(super) fn build(recs: &[Rec], counts: Counts) -> Self {
        let mut index = Self {
            counts,
            ..Self::default()
        };
        for (at, r) in recs.iter().enumerate() {
            index.add(r, at);
        }
        index
    }

    /// Notes the record `r` appended at `at`.
    pub(super) fn add(&mut self, r: &Rec, at: usize) {
        // A name's records are counted in u32 (4 billion records of one name would
        // not fit in memory first).
        let at = u32::try_from(at).unwrap_or(u32::MAX);
        push_position(&mut self.by_ip, r.ip, at);
        push_position(&mut self.by_id, r.id.clone(), at);
    }

    /// The positions of the records of `ip`, ascending.
    pub(super) fn of_ip(&self, ip: IpAddr) -> &[u32] {
        self.by_ip.get(&ip).map_or(&[], Positions::as_slice)
    }

    /// The positions of the records of `id`, ascending.
    pub(super) fn of_id(&self, id: &str) -> &[u32] {
        self.by_id.get(id).map_or(&[], Positions::as_slice)
    }

    /// Every address and the positions of its records.
    pub(super) fn groups(&self) -> impl Iterator<Item = (IpAddr, &[u32])> {
        self.by_ip.iter().map(|(ip, p)| (*ip, p.as_slice()))
    }

    /// Whether the positions match a fresh index of `recs` (the counts are not
    /// compared).
    pub(super) fn matches(&self, recs: &[Rec]) -> bool {
        let fresh = Self::build(recs, self.counts);
        fresh.by_ip == self.by_ip && fresh.by_id == self.by_id
    }
}
