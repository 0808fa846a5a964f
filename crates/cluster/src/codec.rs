//! The wire encoding of one published entry, and its optional AEAD seal.
//!
//! A node publishes each of its own entries as one chitchat key-value. The key is
//! `n` followed by a lower-case hex counter local to the node's incarnation (`n0`,
//! `n1`, …); it carries no meaning. The value is text (chitchat values are strings):
//! URL-safe base64 without padding of an *envelope*:
//!
//! ```text
//! envelope = 0x01 record                       (open cluster: no key)
//!          | 0x02 nonce[24] ciphertext tag[16]  (sealed: XChaCha20-Poly1305 of `record`)
//! record   = 0x01                               format version
//!            varint   entry version             (LEB128, at most 10 bytes)
//!            u8       flags                     bit 0: address is IPv6; others must be 0
//!            4 | 16   address bytes
//!            varint   id length, id bytes       (UTF-8, 1..=256 bytes)
//!            varint   fqdn length, fqdn bytes   (UTF-8, 1..=255 bytes)
//! ```
//!
//! The associated data of a seal binds the value to where it was published:
//! `"dwara-cluster/1" 0x00 cluster_id 0x00 node_id 0x00 generation(u64 BE) key`, so a
//! sealed value copied to another key, another node or another incarnation does not
//! open. The origin of an entry is never in the record: it is the publishing node.
//!
//! [`decode_record`] and [`open_value`] are parsers of untrusted bytes: they never
//! panic and reject trailing bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};
use rand::RngCore;

use crate::config::ClusterKey;

/// The current format version of a record.
pub const RECORD_FORMAT: u8 = 1;
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
    match record.ip {
        IpAddr::V4(v4) => {
            out.push(0);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(FLAG_V6);
            out.extend_from_slice(&v6.octets());
        }
    }
    put_varint(&mut out, record.id.len() as u64);
    out.extend_from_slice(record.id.as_bytes());
    put_varint(&mut out, record.fqdn.len() as u64);
    out.extend_from_slice(record.fqdn.as_bytes());
    out
}

/// Decodes a record produced by [`encode_record`]. Never panics on any input.
pub fn decode_record(bytes: &[u8]) -> Result<Record, DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    let format = r.u8()?;
    if format != RECORD_FORMAT {
        return Err(DecodeError::UnknownFormat(format));
    }
    let version = r.varint()?;
    let flags = r.u8()?;
    if flags & !FLAG_V6 != 0 {
        return Err(DecodeError::UnknownFlags(flags));
    }
    let ip = if flags & FLAG_V6 != 0 {
        let b: [u8; 16] = r.array()?;
        IpAddr::V6(Ipv6Addr::from(b))
    } else {
        let b: [u8; 4] = r.array()?;
        IpAddr::V4(Ipv4Addr::from(b))
    };
    let id = r.string("id", MAX_ID_LEN)?;
    let fqdn = r.string("fqdn", MAX_FQDN_LEN)?;
    if r.pos != bytes.len() {
        return Err(DecodeError::Trailing);
    }
    Ok(Record {
        id,
        ip,
        fqdn,
        version,
    })
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
    let plain = encode_record(record);
    let mut envelope = Vec::with_capacity(plain.len() + 1 + NONCE_LEN + TAG_LEN);
    match key {
        None => {
            envelope.push(ENVELOPE_OPEN);
            envelope.extend_from_slice(&plain);
        }
        Some(key) => {
            let cipher = XChaCha20Poly1305::new(key.as_bytes().into());
            let mut nonce = [0u8; NONCE_LEN];
            rand::rng().fill_bytes(&mut nonce);
            let ad = binding.associated_data();
            let payload = Payload {
                msg: &plain,
                aad: &ad,
            };
            envelope.push(ENVELOPE_SEALED);
            envelope.extend_from_slice(&nonce);
            match cipher.encrypt(XNonce::from_slice(&nonce), payload) {
                Ok(sealed) => envelope.extend_from_slice(&sealed),
                // Encryption fails only for inputs over 256 GiB; a record is tiny.
                Err(_) => envelope.truncate(0),
            }
        }
    }
    URL_SAFE_NO_PAD.encode(envelope)
}

/// Decodes a chitchat value published under `binding`. With a `key`, only values
/// sealed with that key for that binding open; without one, only open values do.
/// Never panics on any input.
pub fn open_value(
    value: &str,
    key: Option<&ClusterKey>,
    binding: &Binding<'_>,
) -> Result<Record, DecodeError> {
    let envelope = URL_SAFE_NO_PAD
        .decode(value)
        .map_err(|_| DecodeError::Base64)?;
    let (&kind, rest) = envelope.split_first().ok_or(DecodeError::Truncated)?;
    match (kind, key) {
        (ENVELOPE_OPEN, None) => decode_record(rest),
        (ENVELOPE_OPEN, Some(_)) => Err(DecodeError::Unsealed),
        (ENVELOPE_SEALED, None) => Err(DecodeError::SealedWithoutKey),
        (ENVELOPE_SEALED, Some(key)) => {
            if rest.len() < NONCE_LEN + TAG_LEN {
                return Err(DecodeError::Truncated);
            }
            let (nonce, sealed) = rest.split_at(NONCE_LEN);
            let cipher = XChaCha20Poly1305::new(key.as_bytes().into());
            let ad = binding.associated_data();
            let plain = cipher
                .decrypt(
                    XNonce::from_slice(nonce),
                    Payload {
                        msg: sealed,
                        aad: &ad,
                    },
                )
                .map_err(|_| DecodeError::BadSeal)?;
            decode_record(&plain)
        }
        (other, _) => Err(DecodeError::UnknownFormat(other)),
    }
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
