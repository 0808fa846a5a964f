//! The wire encoding of published entries, and its optional AEAD seal.
//!
//! A node publishes its own entries in *buckets*: each entry falls into one bucket by
//! a hash of its identity (id, address, name), and each non-empty bucket is one
//! chitchat key-value holding all its entries. A node holding 12,500 entries publishes
//! a few hundred keys, not 12,500, which is what chitchat's per-round work grows with.
//! Keys are `b` followed by text local to the node's incarnation (`b0.0`, `b8.3f`, …);
//! they carry no meaning to a receiver. Builds before buckets published one entry per
//! key (`n<hex>`, record format 1); receivers still read those. A value is text
//! (chitchat values are strings): URL-safe base64 without padding of an *envelope*:
//!
//! ```text
//! envelope = 0x01 plain                        (open cluster: no key)
//!          | 0x02 nonce[24] ciphertext tag[16]  (sealed: XChaCha20-Poly1305 of `plain`)
//! plain    = bucket | record
//! bucket   = 0x02                               format version
//!            varint   bucket version            (LEB128, at most 10 bytes)
//!            varint   item count                (at least 1)
//!            item…                              strictly ascending (id, address, name)
//! record   = 0x01                               format version (one entry; older builds)
//!            varint   entry version
//!            item
//! item     = u8       flags                     bit 0: address is IPv6; others must be 0
//!            4 | 16   address bytes
//!            varint   id length, id bytes       (UTF-8, 1..=256 bytes)
//!            varint   fqdn length, fqdn bytes   (UTF-8, 1..=255 bytes)
//! ```
//!
//! The version is the chitchat version the key was set at, so a receiver can tell a
//! value was published for that version and not replayed under a newer one. An entry
//! leaves a bucket by the bucket being set again without it; an emptied bucket is a
//! chitchat delete.
//!
//! The associated data of a seal binds the value to where it was published:
//! `"dwara-cluster/1" 0x00 cluster_id 0x00 node_id 0x00 generation(u64 BE) key`, so a
//! sealed value copied to another key, another node or another incarnation does not
//! open. The origin of an entry is never in the value: it is the publishing node.
//!
//! [`decode_record`], [`decode_bucket`], [`open_value`] and [`open_bucket`] are parsers
//! of untrusted bytes: they never panic and reject trailing bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};
use rand::RngCore;

use crate::config::ClusterKey;

/// The format version of a single-entry record (what builds before buckets publish).
pub const RECORD_FORMAT: u8 = 1;
/// The format version of a bucket.
pub const BUCKET_FORMAT: u8 = 2;
/// Longest container id a record carries.
pub const MAX_ID_LEN: usize = 256;
/// Longest name a record carries (the DNS limit in text form).
pub const MAX_FQDN_LEN: usize = 255;

const ENVELOPE_OPEN: u8 = 0x01;
const ENVELOPE_SEALED: u8 = 0x02;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
const AD_LABEL: &[u8] = b"dwara-cluster/1";
const FLAG_V6: u8 = 0x01;

/// One entry as published: what a record carries (the origin is the publisher).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Record {
    /// The container id.
    pub id: String,
    /// The address.
    pub ip: IpAddr,
    /// The name, lower-case, fully qualified.
    pub fqdn: String,
    /// The entry's version in its owner's database.
    pub version: u64,
}

/// One entry's identity: what a bucket holds per entry. Ordered by id, address, name
/// (the order items are encoded in).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    /// The container id.
    pub id: String,
    /// The address.
    pub ip: IpAddr,
    /// The name, lower-case, fully qualified.
    pub fqdn: String,
}

impl Item {
    /// The bytes this item takes in a bucket.
    pub fn encoded_len(&self) -> usize {
        let addr = match self.ip {
            IpAddr::V4(_) => 4,
            IpAddr::V6(_) => 16,
        };
        1 + addr
            + varint_len(self.id.len() as u64)
            + self.id.len()
            + varint_len(self.fqdn.len() as u64)
            + self.fqdn.len()
    }
}

/// A bucket as published: entries under one key, set at one chitchat version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// The chitchat version the bucket's key is set at.
    pub version: u64,
    /// The entries, strictly ascending and at least one.
    pub items: Vec<Item>,
}

impl From<Record> for Bucket {
    fn from(r: Record) -> Self {
        Bucket {
            version: r.version,
            items: vec![Item {
                id: r.id,
                ip: r.ip,
                fqdn: r.fqdn,
            }],
        }
    }
}

/// Bytes a bucket takes besides its items, at most: format, two varints.
pub const BUCKET_OVERHEAD: usize = 1 + 10 + 10;

/// Why bytes are not a record or a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended inside a field.
    #[error("truncated record")]
    Truncated,
    /// The record or envelope has a format this build does not know.
    #[error("unknown format {0}")]
    UnknownFormat(u8),
    /// Flag bits this build does not know are set.
    #[error("unknown flags {0:#04x}")]
    UnknownFlags(u8),
    /// A varint is longer than 10 bytes or overflows u64.
    #[error("bad varint")]
    BadVarint,
    /// A string is empty, too long or not UTF-8.
    #[error("bad {0} field")]
    BadField(&'static str),
    /// Bytes follow the record.
    #[error("trailing bytes after record")]
    Trailing,
    /// A bucket holds no item, or items out of order or repeated.
    #[error("bucket items empty, out of order or repeated")]
    BadOrder,
    /// The value is not URL-safe base64.
    #[error("value is not base64")]
    Base64,
    /// A sealed value arrived but this node has no key.
    #[error("sealed value but no cluster key configured")]
    SealedWithoutKey,
    /// An open value arrived but this node requires sealed ones.
    #[error("unsealed value but a cluster key is configured")]
    Unsealed,
    /// The seal does not verify: another key, or the value was altered or moved.
    #[error("seal does not verify")]
    BadSeal,
}

impl DecodeError {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::SealedWithoutKey => "no_key",
            DecodeError::Unsealed => "unsealed",
            DecodeError::BadSeal => "bad_seal",
            _ => "malformed",
        }
    }
}

/// Encodes a record (no envelope).
pub fn encode_record(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + record.id.len() + record.fqdn.len());
    out.push(RECORD_FORMAT);
    put_varint(&mut out, record.version);
    put_item(&mut out, &record.ip, &record.id, &record.fqdn);
    out
}

/// Decodes a record produced by [`encode_record`]. Never panics on any input.
pub fn decode_record(bytes: &[u8]) -> Result<Record, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let version = r.header(RECORD_FORMAT)?;
    let Item { id, ip, fqdn } = r.item()?;
    r.end()?;
    Ok(Record {
        id,
        ip,
        fqdn,
        version,
    })
}

/// Encodes a bucket (no envelope). Its items must be strictly ascending and at least
/// one, as [`decode_bucket`] requires.
pub fn encode_bucket(bucket: &Bucket) -> Vec<u8> {
    let items: usize = bucket.items.iter().map(Item::encoded_len).sum();
    let mut out = Vec::with_capacity(BUCKET_OVERHEAD + items);
    out.push(BUCKET_FORMAT);
    put_varint(&mut out, bucket.version);
    put_varint(&mut out, bucket.items.len() as u64);
    for item in &bucket.items {
        put_item(&mut out, &item.ip, &item.id, &item.fqdn);
    }
    out
}

/// Decodes a bucket produced by [`encode_bucket`]. Never panics on any input.
pub fn decode_bucket(bytes: &[u8]) -> Result<Bucket, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let version = r.header(BUCKET_FORMAT)?;
    let count = r.varint()?;
    if count == 0 {
        return Err(DecodeError::BadOrder);
    }
    // Every item takes at least 7 bytes, so a count the input cannot hold is
    // rejected before anything is allocated for it.
    let count = usize::try_from(count).map_err(|_| DecodeError::Truncated)?;
    if count > bytes.len() / 7 {
        return Err(DecodeError::Truncated);
    }
    let mut items: Vec<Item> = Vec::with_capacity(count);
    for _ in 0..count {
        let item = r.item()?;
        if items.last().is_some_and(|last| *last >= item) {
            return Err(DecodeError::BadOrder);
        }
        items.push(item);
    }
    r.end()?;
    Ok(Bucket { version, items })
}

/// Decodes either plain form, a bucket or a single-entry record (as a bucket of one).
pub fn decode_plain(bytes: &[u8]) -> Result<Bucket, DecodeError> {
    match bytes.first() {
        Some(&RECORD_FORMAT) => decode_record(bytes).map(Bucket::from),
        _ => decode_bucket(bytes),
    }
}

/// Where a value is published: what its seal is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The cluster id.
    pub cluster_id: &'a str,
    /// The publishing node's id.
    pub node_id: &'a str,
    /// The publishing node's generation (incarnation).
    pub generation: u64,
    /// The chitchat key.
    pub key: &'a str,
}

impl Binding<'_> {
    fn associated_data(&self) -> Vec<u8> {
        let mut ad = Vec::with_capacity(
            AD_LABEL.len() + self.cluster_id.len() + self.node_id.len() + self.key.len() + 12,
        );
        ad.extend_from_slice(AD_LABEL);
        ad.push(0);
        ad.extend_from_slice(self.cluster_id.as_bytes());
        ad.push(0);
        ad.extend_from_slice(self.node_id.as_bytes());
        ad.push(0);
        ad.extend_from_slice(&self.generation.to_be_bytes());
        ad.extend_from_slice(self.key.as_bytes());
        ad
    }
}

/// Encodes `record` as a chitchat value: sealed when `key` is given, open otherwise.
pub fn seal_value(record: &Record, key: Option<&ClusterKey>, binding: &Binding<'_>) -> String {
    seal_plain(&encode_record(record), key, binding)
}

/// Encodes `bucket` as a chitchat value: sealed when `key` is given, open otherwise.
pub fn seal_bucket(bucket: &Bucket, key: Option<&ClusterKey>, binding: &Binding<'_>) -> String {
    seal_plain(&encode_bucket(bucket), key, binding)
}

/// Decodes a single-entry chitchat value published under `binding`. With a `key`,
/// only values sealed with that key for that binding open; without one, only open
/// values do. Never panics on any input.
pub fn open_value(
    value: &str,
    key: Option<&ClusterKey>,
    binding: &Binding<'_>,
) -> Result<Record, DecodeError> {
    decode_record(&open_plain(value, key, binding)?)
}

/// Decodes a chitchat value published under `binding`, a bucket or a single-entry
/// record (as a bucket of one), under the same rule as [`open_value`]. Never panics
/// on any input.
pub fn open_bucket(
    value: &str,
    key: Option<&ClusterKey>,
    binding: &Binding<'_>,
) -> Result<Bucket, DecodeError> {
    decode_plain(&open_plain(value, key, binding)?)
}

fn seal_plain(plain: &[u8], key: Option<&ClusterKey>, binding: &Binding<'_>) -> String {
    let mut envelope = Vec::with_capacity(plain.len() + 1 + NONCE_LEN + TAG_LEN);
    match key {
        None => {
            envelope.push(ENVELOPE_OPEN);
            envelope.extend_from_slice(plain);
        }
        Some(key) => {
            let cipher = XChaCha20Poly1305::new(key.as_bytes().into());
            let mut nonce = [0u8; NONCE_LEN];
            rand::rng().fill_bytes(&mut nonce);
            let ad = binding.associated_data();
            let payload = Payload {
                msg: plain,
                aad: &ad,
            };
            envelope.push(ENVELOPE_SEALED);
            envelope.extend_from_slice(&nonce);
            match cipher.encrypt(XNonce::from_slice(&nonce), payload) {
                Ok(sealed) => envelope.extend_from_slice(&sealed),
                // Encryption fails only for inputs over 256 GiB; a value is small.
                Err(_) => envelope.truncate(0),
            }
        }
    }
    URL_SAFE_NO_PAD.encode(envelope)
}

/// The plain bytes inside a value's envelope, opened under `key` for `binding`.
fn open_plain(
    value: &str,
    key: Option<&ClusterKey>,
    binding: &Binding<'_>,
) -> Result<Vec<u8>, DecodeError> {
    let envelope = URL_SAFE_NO_PAD
        .decode(value)
        .map_err(|_| DecodeError::Base64)?;
    let (&kind, rest) = envelope.split_first().ok_or(DecodeError::Truncated)?;
    match (kind, key) {
        (ENVELOPE_OPEN, None) => Ok(rest.to_vec()),
        (ENVELOPE_OPEN, Some(_)) => Err(DecodeError::Unsealed),
        (ENVELOPE_SEALED, None) => Err(DecodeError::SealedWithoutKey),
        (ENVELOPE_SEALED, Some(key)) => {
            if rest.len() < NONCE_LEN + TAG_LEN {
                return Err(DecodeError::Truncated);
            }
            let (nonce, sealed) = rest.split_at(NONCE_LEN);
            let cipher = XChaCha20Poly1305::new(key.as_bytes().into());
            let ad = binding.associated_data();
            cipher
                .decrypt(
                    XNonce::from_slice(nonce),
                    Payload {
                        msg: sealed,
                        aad: &ad,
                    },
                )
                .map_err(|_| DecodeError::BadSeal)
        }
        (other, _) => Err(DecodeError::UnknownFormat(other)),
    }
}

/// The length of a value (envelope, base64) holding `plain_len` plain bytes, sealed
/// with `key` or open without one.
pub fn value_len(plain_len: usize, key: Option<&ClusterKey>) -> usize {
    let seal = key.map_or(0, |_| NONCE_LEN + TAG_LEN);
    let envelope = 1 + plain_len + seal;
    (envelope * 4).div_ceil(3)
}

fn put_item(out: &mut Vec<u8>, ip: &IpAddr, id: &str, fqdn: &str) {
    match ip {
        IpAddr::V4(v4) => {
            out.push(0);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(FLAG_V6);
            out.extend_from_slice(&v6.octets());
        }
    }
    put_varint(out, id.len() as u64);
    out.extend_from_slice(id.as_bytes());
    put_varint(out, fqdn.len() as u64);
    out.extend_from_slice(fqdn.as_bytes());
}

fn varint_len(v: u64) -> usize {
    (64 - v.max(1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = *self.bytes.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self
            .bytes
            .get(self.pos..end)
            .ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            let part = u64::from(b & 0x7f);
            // The tenth byte may only carry the top bit of a u64.
            if i == 9 && part > 1 {
                return Err(DecodeError::BadVarint);
            }
            v |= part << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::BadVarint)
    }

    /// The format byte, which must be `format`, and the version after it.
    fn header(&mut self, format: u8) -> Result<u64, DecodeError> {
        let found = self.u8()?;
        if found != format {
            return Err(DecodeError::UnknownFormat(found));
        }
        self.varint()
    }

    fn item(&mut self) -> Result<Item, DecodeError> {
        let flags = self.u8()?;
        if flags & !FLAG_V6 != 0 {
            return Err(DecodeError::UnknownFlags(flags));
        }
        let ip = if flags & FLAG_V6 != 0 {
            IpAddr::V6(Ipv6Addr::from(self.array::<16>()?))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.array::<4>()?))
        };
        let id = self.string("id", MAX_ID_LEN)?;
        let fqdn = self.string("fqdn", MAX_FQDN_LEN)?;
        Ok(Item { id, ip, fqdn })
    }

    fn end(&self) -> Result<(), DecodeError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(DecodeError::Trailing)
        }
    }

    fn string(&mut self, field: &'static str, max: usize) -> Result<String, DecodeError> {
        let len = self.varint()?;
        let len = usize::try_from(len).map_err(|_| DecodeError::BadField(field))?;
        if len == 0 || len > max {
            return Err(DecodeError::BadField(field));
        }
        let s = self.take(len)?;
        std::str::from_utf8(s)
            .map(str::to_owned)
            .map_err(|_| DecodeError::BadField(field))
    }
}

#[cfg(test)]
mod tests;
