//! The wire encoding of published entries.
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
//! envelope = 0x01 plain                        (0x02 was a value sealed by builds
//!                                               before sealed datagrams: rejected)
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
//! The version is the chitchat version the key was set at; a receiver rejects a value
//! whose version is not its key's. An entry leaves a bucket by the bucket being set
//! again without it; an emptied bucket is a chitchat delete. The origin of an entry
//! is never in the value: it is the publishing node.
//!
//! Values are not sealed one by one: with a cluster key every gossip datagram is
//! ([`crate::datagram`]), which covers every value in it and everything else chitchat
//! sends; a per-value seal under the same shared key would add nothing a key holder
//! could not forge, and would have to be redone for every value at each key change.
//!
//! [`decode_record`], [`decode_bucket`], [`decode_value`] and [`decode_bucket_value`]
//! are parsers of untrusted bytes: they never panic and reject trailing bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The format version of a single-entry record (what builds before buckets publish).
pub const RECORD_FORMAT: u8 = 1;
/// The format version of a bucket.
pub const BUCKET_FORMAT: u8 = 2;
/// Longest container id a record carries.
pub const MAX_ID_LEN: usize = 256;
/// Longest name a record carries (the DNS limit in text form).
pub const MAX_FQDN_LEN: usize = 255;

const ENVELOPE_OPEN: u8 = 0x01;
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
}

impl DecodeError {
    /// A short label for metrics: every decode error is `malformed`.
    pub fn reason(&self) -> &'static str {
        "malformed"
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

/// Encodes `record` as a chitchat value.
pub fn encode_value(record: &Record) -> String {
    envelope(&encode_record(record))
}

/// Encodes `bucket` as a chitchat value.
pub fn encode_bucket_value(bucket: &Bucket) -> String {
    envelope(&encode_bucket(bucket))
}

/// Decodes a single-entry chitchat value. Never panics on any input.
pub fn decode_value(value: &str) -> Result<Record, DecodeError> {
    decode_record(&unwrap_envelope(value)?)
}

/// Decodes a chitchat value, a bucket or a single-entry record (as a bucket of one).
/// Never panics on any input.
pub fn decode_bucket_value(value: &str) -> Result<Bucket, DecodeError> {
    decode_plain(&unwrap_envelope(value)?)
}

fn envelope(plain: &[u8]) -> String {
    let mut envelope = Vec::with_capacity(plain.len() + 1);
    envelope.push(ENVELOPE_OPEN);
    envelope.extend_from_slice(plain);
    URL_SAFE_NO_PAD.encode(envelope)
}

/// The plain bytes inside a value's envelope.
fn unwrap_envelope(value: &str) -> Result<Vec<u8>, DecodeError> {
    let mut envelope = URL_SAFE_NO_PAD
        .decode(value)
        .map_err(|_| DecodeError::Base64)?;
    match envelope.first() {
        None => Err(DecodeError::Truncated),
        Some(&ENVELOPE_OPEN) => {
            envelope.remove(0);
            Ok(envelope)
        }
        Some(&other) => Err(DecodeError::UnknownFormat(other)),
    }
}

/// The length of a value (envelope, base64) holding `plain_len` plain bytes.
pub fn value_len(plain_len: usize) -> usize {
    ((1 + plain_len) * 4).div_ceil(3)
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
