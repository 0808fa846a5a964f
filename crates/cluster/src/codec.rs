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
//! bucket   = 0x02 | 0x03 | 0x04                 format version (4: services may
//!                                               carry a priority and weight; 3:
//!                                               items may carry a service; 2: they
//!                                               may not)
//!            varint   bucket version            (LEB128, at most 10 bytes)
//!            varint   item count                (at least 1)
//!            item…                              strictly ascending (id, address,
//!                                               name, service)
//! record   = 0x01                               format version (one entry; older builds)
//!            varint   entry version
//!            item                               (no service)
//! item     = u8       flags                     bit 0: address is IPv6; bit 1 (format
//!                                               3 only): a service follows; bits 2-3
//!                                               (format 3 only): health (0 unchecked,
//!                                               1 starting, 2 healthy, 3 unhealthy);
//!                                               bit 4 (format 4 only, with bit 1):
//!                                               a priority and weight follow;
//!                                               others 0
//!            4 | 16   address bytes
//!            varint   id length, id bytes       (UTF-8, 1..=256 bytes)
//!            varint   fqdn length, fqdn bytes   (UTF-8, 1..=255 bytes)
//!           [u16      port                      (big-endian, 1..=65535)
//!            varint   service length, service   (`_name._tcp|_udp`, checked as the
//!                                                name server checks it)
//!           [u16      priority                  (big-endian; bit 4 only, never
//!            u16      weight                     both the defaults 0 and 1)]]
//! ```
//!
//! An entry's health is an attribute its owner publishes with it, like its service:
//! a bucket holding a checked entry is written in format 3 (so builds before health
//! read every bucket until checks are used), and a receiver applies a health change
//! as a newer version of the entry.
//!
//! Format history: 1 (one entry per key), 2 (buckets), 3 (buckets whose entries may
//! carry a service and port, answered as SRV), 4 (services may carry an SRV
//! priority and weight other than 0 and 1). A node writes the lowest format its
//! bucket needs: 2 when no entry has a service or a check, 3 when no service has a
//! priority or weight of its own, else 4. So nodes of older builds keep reading
//! every bucket until the newer attribute is used; they reject a bucket of a format
//! they do not know (counted as malformed, and the entries in it are not learnt
//! from that node), so upgrade every node before registering ports (format 3) or
//! priorities and weights (format 4). This build reads all four.
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
use std::num::NonZeroU16;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dwara_records::{Health, ServicePort};

/// The format version of a single-entry record (what builds before buckets publish).
pub const RECORD_FORMAT: u8 = 1;
/// The format version of a bucket without services (what builds before services
/// read).
pub const BUCKET_FORMAT: u8 = 2;
/// The format version of a bucket whose items may carry a service.
pub const BUCKET_FORMAT_SERVICES: u8 = 3;
/// The format version of a bucket whose services may carry a priority and weight.
pub const BUCKET_FORMAT_RANKED: u8 = 4;
/// Longest container id a record carries.
pub const MAX_ID_LEN: usize = 256;
/// Longest name a record carries (the DNS limit in text form).
pub const MAX_FQDN_LEN: usize = 255;
/// Longest service an item carries (`_` + 15 + `._tcp`).
pub const MAX_SERVICE_LEN: usize = dwara_records::MAX_SERVICE_NAME + 6;

const ENVELOPE_OPEN: u8 = 0x01;
const FLAG_V6: u8 = 0x01;
const FLAG_SERVICE: u8 = 0x02;
const HEALTH_SHIFT: u8 = 2;
const HEALTH_MASK: u8 = 0x0c;
const FLAG_RANK: u8 = 0x10;

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

/// One entry as a bucket holds it: its identity (id, address, name) and its service.
/// Ordered by id, address, name, service (the order items are encoded in).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    /// The container id.
    pub id: String,
    /// The address.
    pub ip: IpAddr,
    /// The name, lower-case, fully qualified.
    pub fqdn: String,
    /// The service and port the entry is answered with as SRV, if any.
    pub service: Option<ServicePort>,
    /// What the owner's check says.
    pub health: Health,
}

impl Item {
    /// The bytes this item takes in a bucket.
    pub fn encoded_len(&self) -> usize {
        let addr = match self.ip {
            IpAddr::V4(_) => 4,
            IpAddr::V6(_) => 16,
        };
        let service = self.service.as_ref().map_or(0, |s| {
            let rank = if s.has_default_rank() { 0 } else { 4 };
            2 + varint_len(s.service().len() as u64) + s.service().len() + rank
        });
        1 + addr
            + varint_len(self.id.len() as u64)
            + self.id.len()
            + varint_len(self.fqdn.len() as u64)
            + self.fqdn.len()
            + service
    }

    /// The entry's identity, (id, address, name): what stays when its service changes.
    pub fn identity(&self) -> (&str, IpAddr, &str) {
        (&self.id, self.ip, &self.fqdn)
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
                service: None,
                health: Health::Unchecked,
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
    put_item(
        &mut out,
        &Item {
            id: record.id.clone(),
            ip: record.ip,
            fqdn: record.fqdn.clone(),
            service: None,
            health: Health::Unchecked,
        },
    );
    out
}

/// Decodes a record produced by [`encode_record`]. Never panics on any input.
pub fn decode_record(bytes: &[u8]) -> Result<Record, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let version = r.header(RECORD_FORMAT)?;
    let Item { id, ip, fqdn, .. } = r.item(RECORD_FORMAT)?;
    r.end()?;
    Ok(Record {
        id,
        ip,
        fqdn,
        version,
    })
}

/// The format a bucket of `items` is written in: the lowest that carries them.
pub fn bucket_format(items: &[Item]) -> u8 {
    let ranked = |i: &Item| i.service.as_ref().is_some_and(|s| !s.has_default_rank());
    if items.iter().any(ranked) {
        BUCKET_FORMAT_RANKED
    } else if items
        .iter()
        .any(|i| i.service.is_some() || i.health != Health::Unchecked)
    {
        BUCKET_FORMAT_SERVICES
    } else {
        BUCKET_FORMAT
    }
}

/// Encodes a bucket (no envelope) in [`bucket_format`]. Its items must be strictly
/// ascending and at least one, as [`decode_bucket`] requires.
pub fn encode_bucket(bucket: &Bucket) -> Vec<u8> {
    let items: usize = bucket.items.iter().map(Item::encoded_len).sum();
    let mut out = Vec::with_capacity(BUCKET_OVERHEAD + items);
    out.push(bucket_format(&bucket.items));
    put_varint(&mut out, bucket.version);
    put_varint(&mut out, bucket.items.len() as u64);
    for item in &bucket.items {
        put_item(&mut out, item);
    }
    out
}

/// Decodes a bucket produced by [`encode_bucket`]. Never panics on any input.
pub fn decode_bucket(bytes: &[u8]) -> Result<Bucket, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let format = match bytes.first() {
        Some(&f @ (BUCKET_FORMAT_SERVICES | BUCKET_FORMAT_RANKED)) => f,
        _ => BUCKET_FORMAT,
    };
    let version = r.header(format)?;
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
        let item = r.item(format)?;
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

fn put_item(out: &mut Vec<u8>, item: &Item) {
    let service = match &item.service {
        None => 0,
        Some(s) if s.has_default_rank() => FLAG_SERVICE,
        Some(_) => FLAG_SERVICE | FLAG_RANK,
    } | (item.health.code() << HEALTH_SHIFT);
    match item.ip {
        IpAddr::V4(v4) => {
            out.push(service);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(FLAG_V6 | service);
            out.extend_from_slice(&v6.octets());
        }
    }
    put_varint(out, item.id.len() as u64);
    out.extend_from_slice(item.id.as_bytes());
    put_varint(out, item.fqdn.len() as u64);
    out.extend_from_slice(item.fqdn.as_bytes());
    if let Some(s) = &item.service {
        out.extend_from_slice(&s.port().to_be_bytes());
        put_varint(out, s.service().len() as u64);
        out.extend_from_slice(s.service().as_bytes());
        if !s.has_default_rank() {
            out.extend_from_slice(&s.priority().to_be_bytes());
            out.extend_from_slice(&s.weight().to_be_bytes());
        }
    }
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

    /// One item of a value of `format` (only format 3 and 4 items may carry a
    /// service, only format 4 services a priority and weight).
    fn item(&mut self, format: u8) -> Result<Item, DecodeError> {
        let flags = self.u8()?;
        let known = match format {
            BUCKET_FORMAT_RANKED => FLAG_V6 | FLAG_SERVICE | HEALTH_MASK | FLAG_RANK,
            BUCKET_FORMAT_SERVICES => FLAG_V6 | FLAG_SERVICE | HEALTH_MASK,
            _ => FLAG_V6,
        };
        if flags & !known != 0 || (flags & FLAG_RANK != 0 && flags & FLAG_SERVICE == 0) {
            return Err(DecodeError::UnknownFlags(flags));
        }
        let health = Health::from_code((flags & HEALTH_MASK) >> HEALTH_SHIFT)
            .ok_or(DecodeError::UnknownFlags(flags))?;
        let ip = if flags & FLAG_V6 != 0 {
            IpAddr::V6(Ipv6Addr::from(self.array::<16>()?))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.array::<4>()?))
        };
        let id = self.string("id", MAX_ID_LEN)?;
        let fqdn = self.string("fqdn", MAX_FQDN_LEN)?;
        let service = if flags & FLAG_SERVICE != 0 {
            let port = u16::from_be_bytes(self.array::<2>()?);
            let port = NonZeroU16::new(port).ok_or(DecodeError::BadField("port"))?;
            let name = self.string("service", MAX_SERVICE_LEN)?;
            // Only the checked, normalised form: what encodes back byte for byte.
            let service =
                ServicePort::new(&name, port).map_err(|_| DecodeError::BadField("service"))?;
            if service.service() != name {
                return Err(DecodeError::BadField("service"));
            }
            if flags & FLAG_RANK == 0 {
                Some(service)
            } else {
                let priority = u16::from_be_bytes(self.array::<2>()?);
                let weight = u16::from_be_bytes(self.array::<2>()?);
                let ranked = service.with_priority(priority).with_weight(weight);
                // The defaults are written without the flag: one encoding per item.
                if ranked.has_default_rank() {
                    return Err(DecodeError::BadField("priority and weight"));
                }
                Some(ranked)
            }
        } else {
            None
        };
        Ok(Item {
            id,
            ip,
            fqdn,
            service,
            health,
        })
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
