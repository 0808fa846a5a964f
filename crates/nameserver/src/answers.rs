//! The precomputed answer table the DNS fast path reads.
//!
//! For every registered name the table holds its A and AAAA resource records already
//! in wire form (owner name as a compression pointer to the question, class IN, the
//! configured TTL); for every registered address it holds the PTR records of its
//! reverse name. Keys are lower-cased wire names, so a query is answered by one hash
//! lookup on the lower-cased question name and a copy.
//!
//! The database rebuilds the entry of exactly the names and addresses a change touches,
//! so a registration costs O(addresses of that name), never O(table). Readers take a
//! shard's read lock for the duration of one lookup and copy; writers hold the write
//! lock of one shard for one map insert.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;

use parking_lot::RwLock;

/// Size of one A record in wire form (pointer, type, class, TTL, length, address).
pub(crate) const A_RR_LEN: usize = 16;
/// Size of one AAAA record in wire form.
pub(crate) const AAAA_RR_LEN: usize = 28;

const SHARDS: usize = 16;

/// The records served for one key.
#[derive(Debug)]
pub(crate) enum Records {
    /// A registered name: its A and AAAA records back to back.
    Name {
        /// `A_RR_LEN`-byte A records.
        a: Box<[u8]>,
        /// `AAAA_RR_LEN`-byte AAAA records.
        aaaa: Box<[u8]>,
    },
    /// A registered address's reverse name: its PTR records back to back, with the
    /// end offset of each (PTR records differ in size).
    Ptr {
        /// PTR records back to back.
        rrs: Box<[u8]>,
        /// End offset of each record in `rrs`.
        ends: Box<[u16]>,
    },
}

type Map = HashMap<Box<[u8]>, Records, foldhash::fast::FixedState>;

/// The table: lower-cased wire name → records.
#[derive(Debug)]
pub(crate) struct Answers {
    shards: Box<[RwLock<Map>]>,
    ttl: u32,
    shard_hasher: foldhash::fast::FixedState,
}

impl Answers {
    /// An empty table whose records carry `ttl`.
    pub(crate) fn new(ttl: u32) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    RwLock::new(Map::with_hasher(foldhash::fast::FixedState::with_seed(
                        0x5eed,
                    )))
                })
                .collect(),
            ttl,
            shard_hasher: foldhash::fast::FixedState::with_seed(0xd4a4),
        }
    }

    fn shard(&self, key: &[u8]) -> &RwLock<Map> {
        let mut h = self.shard_hasher.build_hasher();
        h.write(key);
        // SHARDS is a power of two; the cast keeps the low bits, which is all we use.
        &self.shards[(h.finish() as usize) & (SHARDS - 1)]
    }

    /// Runs `f` on the records of `key` (a lower-cased wire name) under a read lock.
    #[inline]
    pub(crate) fn with<R>(&self, key: &[u8], f: impl FnOnce(Option<&Records>) -> R) -> R {
        let shard = self.shard(key).read();
        f(shard.get(key))
    }

    /// Sets the addresses of the name `wire`; an empty list removes the name.
    pub(crate) fn set_name(&self, wire: &[u8], addrs: &[IpAddr]) {
        if addrs.is_empty() {
            self.shard(wire).write().remove(wire);
            return;
        }
        let mut a = Vec::new();
        let mut aaaa = Vec::new();
        for addr in addrs {
            match addr {
                IpAddr::V4(v4) => {
                    a.extend_from_slice(&rr_head(1, self.ttl, 4));
                    a.extend_from_slice(&v4.octets());
                }
                IpAddr::V6(v6) => {
                    aaaa.extend_from_slice(&rr_head(28, self.ttl, 16));
                    aaaa.extend_from_slice(&v6.octets());
                }
            }
        }
        let records = Records::Name {
            a: a.into_boxed_slice(),
            aaaa: aaaa.into_boxed_slice(),
        };
        self.shard(wire).write().insert(wire.into(), records);
    }

    /// Sets the names (lower-cased wire forms) a reverse name `wire` points to; an
    /// empty list removes it.
    pub(crate) fn set_ptr(&self, wire: &[u8], names: &[&[u8]]) {
        if names.is_empty() {
            self.shard(wire).write().remove(wire);
            return;
        }
        let mut rrs = Vec::new();
        let mut ends = Vec::with_capacity(names.len());
        for name in names {
            // A name is at most 255 bytes, so the length fits in u16; and the whole
            // record set of one address must fit a 64 KiB message to be served at all.
            let Ok(rdlen) = u16::try_from(name.len()) else {
                continue;
            };
            if rrs.len() + 12 + name.len() > 65_000 {
                break;
            }
            rrs.extend_from_slice(&rr_head(12, self.ttl, rdlen));
            rrs.extend_from_slice(name);
            ends.push(rrs.len() as u16);
        }
        let records = Records::Ptr {
            rrs: rrs.into_boxed_slice(),
            ends: ends.into_boxed_slice(),
        };
        self.shard(wire).write().insert(wire.into(), records);
    }

    /// Number of keys (names plus reverse names).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }
}

/// The fixed part of a record whose owner is the question name (pointer to offset 12).
fn rr_head(rtype: u16, ttl: u32, rdlen: u16) -> [u8; 12] {
    let t = rtype.to_be_bytes();
    let ttl = ttl.to_be_bytes();
    let l = rdlen.to_be_bytes();
    [
        0xc0, 0x0c, t[0], t[1], 0, 1, ttl[0], ttl[1], ttl[2], ttl[3], l[0], l[1],
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_built_in_wire_form() {
        let t = Answers::new(7);
        let key = b"\x03foo\x05weave\x05local\x00";
        t.set_name(key, &["10.0.0.1".parse().unwrap(), "::1".parse().unwrap()]);
        t.with(key, |r| match r {
            Some(Records::Name { a, aaaa }) => {
                assert_eq!(
                    &a[..],
                    &[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 7, 0, 4, 10, 0, 0, 1]
                );
                assert_eq!(aaaa.len(), AAAA_RR_LEN);
            }
            other => panic!("{other:?}"),
        });
        t.set_name(key, &[]);
        assert!(t.with(key, |r| r.is_none()));
        assert_eq!(t.len(), 0);
    }
}
