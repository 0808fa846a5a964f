//! The sealed gossip datagram: how a chitchat message travels between key holders.
//!
//! With a cluster key every chitchat message is sealed before it leaves the node and
//! opened on arrival (the crate's `transport` module does the sockets). A message is the bytes
//! chitchat serialises (at most [`MAX_PLAIN`]); it travels as one datagram, or as
//! two when sealing would take it past the largest UDP payload ([`MAX_DATAGRAM`]):
//! chitchat fills a reply up to exactly that size, so the seal's [`OVERHEAD`] cannot
//! always be added to one datagram.
//!
//! ```text
//! datagram = u8      format                 (1)
//!            u8      part                   index << 4 | count; count 1 or 2, index < count
//!            u64 LE  sender                 random, one per socket (one per incarnation)
//!            u64 LE  sequence               the sender's datagram counter, from 1
//!            [24]    nonce                  random per datagram
//!            …       ciphertext, tag[16]    XChaCha20-Poly1305 of the message or its part
//! ```
//!
//! The associated data is `"dwara-gossip/1" 0x00 cluster_id 0x00` and the first 18
//! bytes (the header), so a datagram sealed for another cluster id, or with an
//! altered header, does not open. The header is not secret. The parts of one message
//! have consecutive sequence numbers (part `i` at the first part's number plus `i`)
//! and are sealed one by one, so a part is as authentic as a whole message; parts
//! wait to be joined in a small table ([`MAX_PARTIALS`] messages, the oldest dropped
//! first) that only opened parts enter.
//!
//! A [`Keyring`] holds one or more keys: the first seals, every key opens (tried in
//! order), which is what lets a cluster change its key without downtime.
//!
//! **Replays.** An [`Opener`] remembers, per sender (up to [`MAX_SENDERS`], the least
//! recently heard forgotten first), the highest sequence number it accepted and which
//! of the [`REPLAY_WINDOW`] below it it has seen: a datagram already accepted, or
//! older than the window, is refused as a replay. No clock is read. A receiver that
//! has never heard a sender (it started after the datagram was captured, or forgot
//! the sender) accepts each of that sender's captured datagrams once, in increasing
//! order; what such a datagram can then do is what chitchat lets an old message do:
//! heartbeats and key versions at or below what the receiver knows are ignored, and
//! older state learnt by a fresh receiver is replaced by the newer one in the next
//! gossip round with anyone who has it.
//!
//! [`Opener::open`] is a parser of untrusted bytes: it never panics.

use std::collections::{HashMap, VecDeque};

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{KeyInit, Tag, XChaCha20Poly1305, XNonce};
use rand::RngCore;

use crate::config::ClusterKey;

/// The format version of a sealed datagram.
pub const FORMAT: u8 = 1;
/// The largest UDP payload (IPv4; IPv6 allows 20 bytes more) and so the largest
/// datagram sent; chitchat's own limit for a message too.
pub const MAX_DATAGRAM: usize = 65_507;
/// The largest message sealed or opened: what chitchat sends at most.
pub const MAX_PLAIN: usize = MAX_DATAGRAM;
/// Bytes of the header before the nonce.
pub const HEADER_LEN: usize = 18;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
/// What sealing adds to each datagram: header, nonce and tag.
pub const OVERHEAD: usize = HEADER_LEN + NONCE_LEN + TAG_LEN;
/// The largest piece of a message one datagram carries.
pub const MAX_PART: usize = MAX_DATAGRAM - OVERHEAD;
/// Parts a message is split into at most.
pub const MAX_PARTS: usize = 2;
/// Sequence numbers below a sender's highest one that are still accepted once
/// (datagrams reordered on the way).
pub const REPLAY_WINDOW: u64 = 128;
/// Senders an [`Opener`] keeps the replay window of.
pub const MAX_SENDERS: usize = 4096;
/// Messages whose parts an [`Opener`] waits to join.
pub const MAX_PARTIALS: usize = 16;
const AD_LABEL: &[u8] = b"dwara-gossip/1";

/// The keys a node seals and opens gossip with: the first seals, all open.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<ClusterKey>,
    ciphers: Vec<XChaCha20Poly1305>,
}

impl Keyring {
    /// A keyring of `first` (which seals) and `others` (which only open).
    pub fn new(first: ClusterKey, others: Vec<ClusterKey>) -> Self {
        let keys: Vec<ClusterKey> = std::iter::once(first).chain(others).collect();
        let ciphers = keys
            .iter()
            .map(|k| XChaCha20Poly1305::new(k.as_bytes().into()))
            .collect();
        Self { keys, ciphers }
    }

    /// The keys, the sealing one first.
    pub fn keys(&self) -> &[ClusterKey] {
        &self.keys
    }

    /// A short public id of each key, the sealing one first, for logs: 8 hex digits
    /// of a tag computed under the key (it tells keys apart, never the key).
    pub fn ids(&self) -> Vec<String> {
        self.ciphers
            .iter()
            .map(|cipher| {
                let mut empty = [0u8; 0];
                match cipher.encrypt_in_place_detached(
                    XNonce::from_slice(&[0u8; NONCE_LEN]),
                    b"dwara-key-id",
                    &mut empty,
                ) {
                    Ok(tag) => tag[..4].iter().map(|b| format!("{b:02x}")).collect(),
                    Err(_) => String::from("?"),
                }
            })
            .collect()
    }

    fn sealing(&self) -> &XChaCha20Poly1305 {
        // `new` always puts one key first.
        &self.ciphers[0]
    }
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({} keys)", self.keys.len())
    }
}

/// Why a datagram was not accepted (the `reason` label of
/// `dwara_cluster_rejected_datagrams_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// Too short, another format, or a part header that makes no sense (a plain
    /// chitchat datagram of a node without a key lands here).
    Malformed,
    /// No key of the keyring opens it: another key, another cluster id, or altered.
    BadSeal,
    /// Already accepted from its sender, or older than the replay window.
    Replay,
    /// It opened, but chitchat could not decode the message inside.
    Undecodable,
}

impl Rejection {
    /// Every reason, for metrics and summaries.
    pub const ALL: [Rejection; 4] = [
        Rejection::Malformed,
        Rejection::BadSeal,
        Rejection::Replay,
        Rejection::Undecodable,
    ];

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed",
            Rejection::BadSeal => "bad_seal",
            Rejection::Replay => "replay",
            Rejection::Undecodable => "undecodable",
        }
    }
}

/// A message longer than [`MAX_PLAIN`] cannot be sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a gossip message of {len} bytes is over the {MAX_PLAIN}-byte limit")]
pub struct TooLong {
    /// The message's length.
    pub len: usize,
}

fn associated_data(cluster_id: &str, header: &[u8]) -> Vec<u8> {
    let mut ad = Vec::with_capacity(AD_LABEL.len() + cluster_id.len() + 2 + header.len());
    ad.extend_from_slice(AD_LABEL);
    ad.push(0);
    ad.extend_from_slice(cluster_id.as_bytes());
    ad.push(0);
    ad.extend_from_slice(header);
    ad
}

/// Seals one sender's messages, numbering its datagrams.
#[derive(Debug)]
pub struct Sealer {
    sender: u64,
    next: u64,
}

impl Sealer {
    /// A sealer for a sender id (random, one per socket).
    pub fn new(sender: u64) -> Self {
        Self { sender, next: 1 }
    }

    /// Seals `message` into one datagram, or two when one would be over
    /// [`MAX_DATAGRAM`], appended to `out`.
    pub fn seal(
        &mut self,
        ring: &Keyring,
        cluster_id: &str,
        message: &[u8],
        out: &mut Vec<Vec<u8>>,
    ) -> Result<(), TooLong> {
        if message.len() > MAX_PLAIN {
            return Err(TooLong { len: message.len() });
        }
        let count = message.len().div_ceil(MAX_PART).max(1);
        let chunk = message.len().div_ceil(count).max(1);
        let mut pieces: Vec<&[u8]> = message.chunks(chunk).collect();
        if pieces.is_empty() {
            pieces.push(&[]);
        }
        let count = pieces.len();
        for (index, piece) in pieces.into_iter().enumerate() {
            let seq = self.next;
            self.next += 1;
            let mut datagram = Vec::with_capacity(OVERHEAD + piece.len());
            datagram.push(FORMAT);
            // `count` is at most `MAX_PARTS` (2), `index` below it: both fit a nibble.
            datagram.push(((index as u8) << 4) | count as u8);
            datagram.extend_from_slice(&self.sender.to_le_bytes());
            datagram.extend_from_slice(&seq.to_le_bytes());
            let mut nonce = [0u8; NONCE_LEN];
            rand::rng().fill_bytes(&mut nonce);
            datagram.extend_from_slice(&nonce);
            let ad = associated_data(cluster_id, &datagram[..HEADER_LEN]);
            let start = datagram.len();
            datagram.extend_from_slice(piece);
            match ring.sealing().encrypt_in_place_detached(
                XNonce::from_slice(&nonce),
                &ad,
                &mut datagram[start..],
            ) {
                Ok(tag) => datagram.extend_from_slice(&tag),
                // Encryption fails only for inputs over 256 GiB; a piece is under 64 KiB.
                Err(_) => return Err(TooLong { len: message.len() }),
            }
            out.push(datagram);
        }
        Ok(())
    }
}

/// What one sender's replay window holds.
#[derive(Debug)]
struct Window {
    /// The highest sequence number accepted.
    top: u64,
    /// Bit `i`: `top - i` was accepted.
    seen: u128,
    /// When it was last used, in accepted datagrams of the [`Opener`] (not a clock).
    touched: u64,
}

impl Window {
    fn is_fresh(&self, seq: u64) -> bool {
        if seq > self.top {
            return true;
        }
        let behind = self.top - seq;
        behind < REPLAY_WINDOW && self.seen & (1u128 << behind) == 0
    }

    fn accept(&mut self, seq: u64) {
        if seq > self.top {
            let shift = seq - self.top;
            self.seen = if shift >= REPLAY_WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.seen |= 1;
            self.top = seq;
        } else {
            self.seen |= 1u128 << (self.top - seq);
        }
    }
}

/// A message whose parts are not all in yet.
#[derive(Debug)]
struct Partial {
    sender: u64,
    first: u64,
    parts: Vec<Option<Vec<u8>>>,
}

/// Opens datagrams, remembering what it accepted (replays) and parts of messages.
#[derive(Debug, Default)]
pub struct Opener {
    senders: HashMap<u64, Window>,
    partials: VecDeque<Partial>,
    accepted: u64,
}

impl Opener {
    /// A fresh opener: it has heard no sender yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens one datagram: `Ok(Some(message))` when it completes a message,
    /// `Ok(None)` when it is a part and the message waits for the other.
    pub fn open(
        &mut self,
        ring: &Keyring,
        cluster_id: &str,
        datagram: &[u8],
    ) -> Result<Option<Vec<u8>>, Rejection> {
        if datagram.len() < OVERHEAD || datagram.len() > MAX_DATAGRAM || datagram[0] != FORMAT {
            return Err(Rejection::Malformed);
        }
        let count = usize::from(datagram[1] & 0x0f);
        let index = usize::from(datagram[1] >> 4);
        if count == 0 || count > MAX_PARTS || index >= count {
            return Err(Rejection::Malformed);
        }
        let (header, rest) = datagram.split_at(HEADER_LEN);
        let sender =
            u64::from_le_bytes(header[2..10].try_into().map_err(|_| Rejection::Malformed)?);
        let seq = u64::from_le_bytes(
            header[10..18]
                .try_into()
                .map_err(|_| Rejection::Malformed)?,
        );
        // The parts of a message are numbered from its first part's number.
        let first = seq.checked_sub(index as u64).ok_or(Rejection::Malformed)?;
        if self.senders.get(&sender).is_some_and(|w| !w.is_fresh(seq)) {
            return Err(Rejection::Replay);
        }
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let (ciphertext, tag) = sealed.split_at(sealed.len() - TAG_LEN);
        let ad = associated_data(cluster_id, header);
        let mut plain = Vec::with_capacity(ciphertext.len());
        let opened = ring.ciphers.iter().any(|cipher| {
            plain.clear();
            plain.extend_from_slice(ciphertext);
            cipher
                .decrypt_in_place_detached(
                    XNonce::from_slice(nonce),
                    &ad,
                    &mut plain,
                    Tag::from_slice(tag),
                )
                .is_ok()
        });
        if !opened {
            return Err(Rejection::BadSeal);
        }
        self.remember(sender, seq);
        if count == 1 {
            return Ok(Some(plain));
        }
        self.join(sender, first, count, index, plain)
    }

    fn remember(&mut self, sender: u64, seq: u64) {
        self.accepted += 1;
        let touched = self.accepted;
        if !self.senders.contains_key(&sender)
            && self.senders.len() >= MAX_SENDERS
            && let Some(oldest) = self
                .senders
                .iter()
                .min_by_key(|(_, w)| w.touched)
                .map(|(s, _)| *s)
        {
            self.senders.remove(&oldest);
        }
        let window = self.senders.entry(sender).or_insert(Window {
            top: seq,
            seen: 0,
            touched,
        });
        window.accept(seq);
        window.touched = touched;
    }

    fn join(
        &mut self,
        sender: u64,
        first: u64,
        count: usize,
        index: usize,
        piece: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Rejection> {
        let at = self
            .partials
            .iter()
            .position(|p| p.sender == sender && p.first == first && p.parts.len() == count);
        let at = match at {
            Some(at) => at,
            None => {
                if self.partials.len() >= MAX_PARTIALS {
                    self.partials.pop_front();
                }
                self.partials.push_back(Partial {
                    sender,
                    first,
                    parts: vec![None; count],
                });
                self.partials.len() - 1
            }
        };
        let partial = &mut self.partials[at];
        partial.parts[index] = Some(piece);
        if partial.parts.iter().any(Option::is_none) {
            return Ok(None);
        }
        let Some(partial) = self.partials.remove(at) else {
            return Ok(None);
        };
        let message: Vec<u8> = partial.parts.into_iter().flatten().flatten().collect();
        if message.len() > MAX_PLAIN {
            // Only a key holder can seal parts this long; chitchat never sends them.
            return Err(Rejection::Malformed);
        }
        Ok(Some(message))
    }
}

#[cfg(test)]
mod tests;
