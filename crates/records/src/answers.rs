//! The tables the DNS fast path reads, which are also where the records live.
//!
//! - `names`: lower-cased wire name → that name's records ([`Rec`]), each flagged
//!   `serve` when it is live, visible (its origin is not hidden) and the first such
//!   record of its address under that name. An A/AAAA answer is the `serve` records of
//!   the family written out as resource records whose owner is a compression pointer
//!   to the question — so the owner echoes the query's case — then shuffled.
//! - A record may carry a service and port ([`Srv`]). An SRV query for
//!   `<service>.<name>` is answered from the records of `<name>` that carry that
//!   service (see [`split_service`]): one SRV record per `srv_serve` record (one
//!   per address and port), each targeting `<hex address>.addr.<domain>`, the
//!   address of each `srv_addr` record in the additional section (an address with
//!   two ports of a service is one record of each); nothing is stored under the
//!   service name, and the target names are answered from the address index.
//! - `v4` / `v6`: address → the names registered for it ([`PtrRef`]), flagged `serve`
//!   when the name has a servable record of that address. A PTR query is answered by
//!   parsing the reverse name into an address and writing those names out.
//! - `descendants`: wire name strictly below the domain → how many names below it
//!   have a `serve` record, kept only while not zero. A name that is absent (or has
//!   no `serve` record) but is counted here is an empty non-terminal: NODATA, not
//!   NXDOMAIN (RFC 8020). The writer changes the counts of a name's ancestors when
//!   the name starts or stops being answered, one shard write per label.
//!
//! Names are shared (`Arc<[u8]>`) between the tables and the writer's indexes, so a
//! name is stored once. Readers take one shard's read lock for one lookup and copy;
//! the writer (serialised by the database's mutex) takes one shard's write lock per
//! change. Memory per record is what bounds a 100,000-name node (see
//! `docs/PERFORMANCE.md`), hence no spare capacity for a name's first records (its
//! list grows one record at a time up to four, then doubles, so adding an instance
//! to a large name is O(1) amortised), address lists as boxed slices, and no second
//! copy of the answers in wire form: writing 16 or 28 bytes per record at query time
//! costs the same as copying them from a prebuilt buffer.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::health::Health;
use crate::service::ServicePort;

/// A name in lower-cased wire form, shared.
pub type NameRef = Arc<[u8]>;

/// Size of one A record in wire form (pointer, type, class, TTL, length, address).
pub const A_RR_LEN: usize = 16;
/// Size of one AAAA record in wire form.
pub const AAAA_RR_LEN: usize = 28;

/// One record of a name (an entry of the database minus its name).
#[derive(Debug, Clone)]
pub struct Rec {
    /// Who registered it (interned: one allocation per container id).
    pub id: Arc<str>,
    /// The address.
    pub ip: IpAddr,
    /// Index into the database's origin table.
    pub origin: u32,
    /// The entry's version (see the database's `Entry::version`).
    pub version: u64,
    /// Seconds since the database was created, at the last change.
    pub changed: u32,
    /// Removed, kept so the removal can be replicated; never served.
    pub tombstone: bool,
    /// What the owner's check says.
    pub health: Health,
    /// Live, visible, first of its address under this name: goes in answers.
    pub serve: bool,
    /// The service and port answered as SRV, if any.
    pub service: Option<Arc<Srv>>,
    /// Live, visible, has a service, first of its (service, address, port) under this
    /// name: its port goes in SRV answers (independently of `serve`, which dedupes
    /// addresses across services).
    pub srv_serve: bool,
    /// `srv_serve` and first of its (service, address) under this name: its address
    /// goes in the additional section of SRV answers (once, whatever its ports).
    pub srv_addr: bool,
}

/// A record's service: what the entry said, and its labels in wire form for the
/// DNS path to compare with a query's first two labels.
#[derive(Debug)]
pub struct Srv {
    /// The service and port as registered.
    pub spec: ServicePort,
    /// `\x05_http\x04_tcp`: lower-case, no root label.
    pub labels: Box<[u8]>,
}

impl Srv {
    pub(crate) fn new(spec: &ServicePort) -> Arc<Self> {
        Arc::new(Self {
            labels: spec.wire_labels(),
            spec: spec.clone(),
        })
    }
}

/// Splits a lower-cased wire name whose first two labels start with `_`
/// (`_http._tcp.web.weave.local.`) into those two labels and the rest.
#[inline]
pub fn split_service(wire: &[u8]) -> Option<(&[u8], &[u8])> {
    let first = usize::from(*wire.first()?);
    if first == 0 || wire.get(1) != Some(&b'_') {
        return None;
    }
    let at = 1 + first;
    let second = usize::from(*wire.get(at)?);
    if second == 0 || wire.get(at + 1) != Some(&b'_') {
        return None;
    }
    let end = at + 1 + second;
    (end < wire.len()).then(|| wire.split_at(end))
}

/// One name registered for an address.
#[derive(Debug, Clone)]
pub struct PtrRef {
    /// The name, in lower-cased wire form.
    pub name: NameRef,
    /// The name has a servable record of this address: goes in PTR answers.
    pub serve: bool,
}

type Hasher = foldhash::fast::FixedState;

const SHARDS: usize = 16;

/// A hash map split into independently locked shards.
#[derive(Debug)]
pub struct Shards<K, V> {
    shards: Box<[RwLock<HashMap<K, V, Hasher>>]>,
    hasher: Hasher,
}

impl<K: Hash + Eq, V> Shards<K, V> {
    fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(HashMap::with_hasher(Hasher::with_seed(0x5eed))))
                .collect(),
            hasher: Hasher::with_seed(0xd4a4),
        }
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> &RwLock<HashMap<K, V, Hasher>> {
        // SHARDS is a power of two; the cast keeps the low bits, all we use.
        &self.shards[(self.hasher.hash_one(key) as usize) & (SHARDS - 1)]
    }

    /// Runs `f` on the value of `key` under the shard's read lock.
    #[inline]
    pub fn read<Q, R>(&self, key: &Q, f: impl FnOnce(Option<&V>) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard(key).read();
        f(shard.get(key))
    }

    /// The stored key equal to `key` (to share its allocation).
    pub(crate) fn key<Q>(&self, key: &Q) -> Option<K>
    where
        K: Borrow<Q> + Clone,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(key)
            .read()
            .get_key_value(key)
            .map(|(k, _)| k.clone())
    }

    /// Runs `f` on the shard holding `key`, under its write lock.
    pub(crate) fn write<Q, R>(&self, key: &Q, f: impl FnOnce(&mut HashMap<K, V, Hasher>) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        f(&mut self.shard(key).write())
    }

    /// Visits every entry, one shard (read-locked) at a time.
    pub fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        for shard in self.shards.iter() {
            for (k, v) in shard.read().iter() {
                f(k, v);
            }
        }
    }

    /// Number of keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }
}

/// The records, as the DNS server reads them.
#[derive(Debug)]
pub struct Tables {
    /// Lower-cased wire name → its records, in registration order (a `Vec` with
    /// spare capacity for names that grow, none for small ones).
    pub names: Shards<NameRef, Vec<Rec>>,
    /// IPv4 address → the names registered for it.
    pub v4: Shards<u32, Box<[PtrRef]>>,
    /// IPv6 address → the names registered for it.
    pub v6: Shards<u128, Box<[PtrRef]>>,
    /// Lower-cased wire name strictly below the domain → how many names below it
    /// have an answered record (absent when none): such a name with no answered
    /// record of its own is an empty non-terminal, NODATA rather than NXDOMAIN
    /// (RFC 8020).
    pub descendants: Shards<Box<[u8]>, u32>,
}

impl Tables {
    pub(crate) fn new() -> Self {
        Self {
            names: Shards::new(),
            v4: Shards::new(),
            v6: Shards::new(),
            descendants: Shards::new(),
        }
    }

    /// Whether a name below `lower` has an answered record.
    #[inline]
    pub fn has_descendants(&self, lower: &[u8]) -> bool {
        self.descendants.read(lower, |n| n.is_some())
    }

    /// Counts `name` (lower-cased wire form) as answered (`answered`) or no longer
    /// in every ancestor of it strictly below the domain, whose wire form is the
    /// last `domain_len` bytes of `name`: one shard write per label.
    pub(crate) fn count_descendant(&self, name: &[u8], domain_len: usize, answered: bool) {
        let mut pos = 0;
        loop {
            pos += 1 + usize::from(name.get(pos).copied().unwrap_or(0));
            if pos >= name.len() || name.len() - pos <= domain_len {
                return;
            }
            let ancestor = &name[pos..];
            self.descendants
                .write(ancestor, |m| match m.get_mut(ancestor) {
                    Some(n) if answered => *n += 1,
                    Some(n) if *n > 1 => *n -= 1,
                    Some(_) => {
                        m.remove(ancestor);
                    }
                    None if answered => {
                        m.insert(ancestor.into(), 1);
                    }
                    None => {}
                });
        }
    }

    /// Runs `f` on the names registered for `ip` under a read lock.
    #[inline]
    pub fn read_addr<R>(&self, ip: IpAddr, f: impl FnOnce(Option<&[PtrRef]>) -> R) -> R {
        match ip {
            IpAddr::V4(v4) => self.v4.read(&u32::from(v4), |v| f(v.map(|b| &b[..]))),
            IpAddr::V6(v6) => self.v6.read(&u128::from(v6), |v| f(v.map(|b| &b[..]))),
        }
    }

    /// Sets `name`'s entry for `ip`: present (answered or not), or absent. Changes
    /// the address's list in place when the name is in it already.
    pub(crate) fn set_ptr(&self, ip: IpAddr, name: &NameRef, present: bool, serve: bool) {
        fn put<K: Hash + Eq + Copy>(
            s: &Shards<K, Box<[PtrRef]>>,
            k: K,
            name: &NameRef,
            present: bool,
            serve: bool,
        ) {
            s.write(&k, |m| {
                let refs = m.get_mut(&k);
                let at = refs
                    .as_ref()
                    .and_then(|refs| refs.iter().position(|p| p.name == *name));
                match (refs, at) {
                    (Some(refs), Some(i)) if present => refs[i].serve = serve,
                    (Some(refs), Some(i)) => {
                        let mut v = std::mem::take(refs).into_vec();
                        v.remove(i);
                        if v.is_empty() {
                            m.remove(&k);
                        } else {
                            *refs = v.into_boxed_slice();
                        }
                    }
                    (refs, None) if present => {
                        let new = PtrRef {
                            name: name.clone(),
                            serve,
                        };
                        match refs {
                            Some(refs) => {
                                let mut v = std::mem::take(refs).into_vec();
                                v.push(new);
                                *refs = v.into_boxed_slice();
                            }
                            None => {
                                m.insert(k, Box::new([new]));
                            }
                        }
                    }
                    _ => {}
                }
            });
        }
        match ip {
            IpAddr::V4(v4) => put(&self.v4, u32::from(v4), name, present, serve),
            IpAddr::V6(v6) => put(&self.v6, u128::from(v6), name, present, serve),
        }
    }

    /// The names registered for `ip` (a copy).
    pub fn addr_refs(&self, ip: IpAddr) -> Vec<PtrRef> {
        self.read_addr(ip, |r| r.map(<[PtrRef]>::to_vec).unwrap_or_default())
    }
}

/// Writes the fixed part of a record whose owner is the question (pointer to 12).
#[inline]
pub fn write_rr_head(out: &mut [u8], rtype: u16, ttl: u32, rdlen: u16) {
    let t = rtype.to_be_bytes();
    let ttl = ttl.to_be_bytes();
    let l = rdlen.to_be_bytes();
    out[..12].copy_from_slice(&[
        0xc0, 0x0c, t[0], t[1], 0, 1, ttl[0], ttl[1], ttl[2], ttl[3], l[0], l[1],
    ]);
}

/// Parses a lower-cased wire reverse name (`d.c.b.a.in-addr.arpa.`, 32 nibbles
/// `.ip6.arpa.`) into its address; `None` for anything else (partial or
/// non-canonical names are not ours).
pub fn parse_reverse(wire: &[u8]) -> Option<IpAddr> {
    const V4_SUFFIX: &[u8] = b"\x07in-addr\x04arpa\x00";
    const V6_SUFFIX: &[u8] = b"\x03ip6\x04arpa\x00";
    if let Some(head) = wire.strip_suffix(V4_SUFFIX) {
        let mut octets = [0u8; 4];
        let mut pos = 0;
        for i in (0..4).rev() {
            let len = usize::from(*head.get(pos)?);
            let label = head.get(pos + 1..pos + 1 + len)?;
            if len == 0
                || len > 3
                || (len > 1 && label[0] == b'0')
                || !label.iter().all(u8::is_ascii_digit)
            {
                return None;
            }
            let v = label
                .iter()
                .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
            octets[i] = u8::try_from(v).ok()?;
            pos += 1 + len;
        }
        return (pos == head.len()).then(|| IpAddr::from(octets));
    }
    let head = wire.strip_suffix(V6_SUFFIX)?;
    if head.len() != 64 {
        return None;
    }
    let mut v: u128 = 0;
    for pair in head.chunks_exact(2).rev() {
        if pair[0] != 1 {
            return None;
        }
        let nibble = match pair[1] {
            d @ b'0'..=b'9' => d - b'0',
            h @ b'a'..=b'f' => h - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | u128::from(nibble);
    }
    Some(IpAddr::from(v.to_be_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::reverse_wire;

    #[test]
    fn reverse_names_round_trip() {
        for ip in [
            "10.1.2.3",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "2001:db8::ff00:42:8329",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(parse_reverse(&reverse_wire(ip)), Some(ip), "{ip}");
        }
        for bad in [
            &b"\x013\x012\x0110\x07in-addr\x04arpa\x00"[..],
            b"\x0201\x012\x011\x0110\x07in-addr\x04arpa\x00",
            b"\x03256\x012\x011\x0110\x07in-addr\x04arpa\x00",
            b"\x01a\x012\x011\x0110\x07in-addr\x04arpa\x00",
            b"\x07in-addr\x04arpa\x00",
            b"\x011\x03ip6\x04arpa\x00",
            b"\x03foo\x00",
        ] {
            assert_eq!(parse_reverse(bad), None, "{bad:?}");
        }
    }
}
