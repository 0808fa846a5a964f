//! Batched UDP I/O for one worker: up to `max` datagrams per `recvmmsg`, their replies
//! in one `sendmmsg` (nix's safe wrappers; no `unsafe` here).
//!
//! A batch owns its buffers: `max` receive slots and `max` reply slots of
//! [`MAX_MESSAGE`] bytes each, so a datagram is never cut and the handler's output
//! contract holds. The slots sit [`STRIDE`] bytes apart (not a multiple of 4 KiB), so
//! the first bytes of successive slots, the only ones a query touches, fall in
//! different cache sets. The buffers are zeroed pages the kernel maps on first touch:
//! a worker's resident memory grows by about one page per slot actually used.
//!
//! `recvmmsg` is called with `MSG_WAITFORONE` on a blocking socket with a read
//! timeout: it waits (up to the timeout) for the first datagram, then takes whatever
//! else is already queued, up to `max`, without waiting. A batch is therefore never
//! held back to fill up; under light load it is one datagram.
//!
//! On a socket bound to a wildcard address the batch also takes each datagram's
//! destination (see `pktinfo`) and sends each reply from it. `sendmmsg` puts the
//! same control messages on every message of a call, so replies go out in runs
//! that share a source address: one call per run, one run in the usual case.

use std::io::{IoSlice, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg,
};

use super::pktinfo::{Family, Local, Peer};
use crate::handler::MAX_MESSAGE;

/// The most datagrams one batch takes (the configured size is clamped to this).
pub(crate) const MAX_BATCH: usize = 64;

/// Distance between two slots: [`MAX_MESSAGE`] rounded up to a cache line, plus one
/// line, so slot `i` starts `64 * i` bytes into a page (mod 4 KiB).
pub(crate) const STRIDE: usize = MAX_MESSAGE.div_ceil(64) * 64 + 64;

/// What became of a batch's replies.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Replies the kernel accepted.
    pub(crate) sent: usize,
    /// Replies given up on (the send failed for that destination).
    pub(crate) failed: usize,
}

/// One worker's batch state. Allocated once; receiving, answering and sending
/// allocate nothing.
pub(crate) struct UdpBatch {
    max: usize,
    recv_headers: MultiHeaders<SockaddrStorage>,
    send_headers: MultiHeaders<SockaddrStorage>,
    /// Headers with room for one source-address control message: on a wildcard
    /// socket (`Some`), for replies whose destination was reported.
    send_headers_local: Option<MultiHeaders<SockaddrStorage>>,
    pktinfo: bool,
    rx: Vec<u8>,
    tx: Vec<u8>,
    rx_len: Vec<usize>,
    rx_addr: Vec<Option<SockaddrStorage>>,
    rx_local: Vec<Option<Local>>,
    tx_len: Vec<usize>,
    tx_addr: Vec<Option<SockaddrStorage>>,
    tx_local: Vec<Option<Local>>,
    received: usize,
    queued: usize,
}

impl std::fmt::Debug for UdpBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpBatch")
            .field("max", &self.max)
            .field("received", &self.received)
            .field("queued", &self.queued)
            .finish_non_exhaustive()
    }
}

impl UdpBatch {
    /// A batch of up to `max` datagrams (clamped to `2..=MAX_BATCH`). `pktinfo`:
    /// the socket is bound to a wildcard address of that family and reports each
    /// datagram's destination (`pktinfo::enable`), which replies are sent from.
    pub(crate) fn new(max: usize, pktinfo: Option<Family>) -> Self {
        let max = max.clamp(2, MAX_BATCH);
        Self {
            max,
            recv_headers: MultiHeaders::preallocate(max, pktinfo.map(Family::cmsg_space)),
            send_headers: MultiHeaders::preallocate(max, None),
            send_headers_local: pktinfo
                .map(|family| MultiHeaders::preallocate(max, Some(family.cmsg_space()))),
            pktinfo: pktinfo.is_some(),
            rx: vec![0; max * STRIDE],
            tx: vec![0; max * STRIDE],
            rx_len: vec![0; max],
            rx_addr: vec![None; max],
            rx_local: vec![None; max],
            tx_len: vec![0; max],
            tx_addr: vec![None; max],
            tx_local: vec![None; max],
            received: 0,
            queued: 0,
        }
    }

    /// Receives up to `max` datagrams: blocks (up to the socket's read timeout) for
    /// the first, then takes only what is already queued. Returns how many.
    pub(crate) fn recv(&mut self, sock: &UdpSocket) -> Result<usize, Errno> {
        self.received = 0;
        self.queued = 0;
        let mut slots = self.rx.chunks_exact_mut(STRIDE);
        let mut iovs: [[IoSliceMut<'_>; 1]; MAX_BATCH] = std::array::from_fn(|_| {
            [IoSliceMut::new(
                slots.next().map_or(&mut [][..], |s| &mut s[..MAX_MESSAGE]),
            )]
        });
        let results = recvmmsg(
            sock.as_raw_fd(),
            &mut self.recv_headers,
            iovs[..self.max].iter_mut(),
            MsgFlags::MSG_WAITFORONE,
            None,
        )?;
        let mut n = 0;
        let slots = self
            .rx_len
            .iter_mut()
            .zip(&mut self.rx_addr)
            .zip(&mut self.rx_local);
        for (msg, ((len, addr), local)) in results.zip(slots) {
            *len = msg.bytes;
            *addr = msg.address;
            // Without the destination (not reported, or cut short) the reply leaves
            // from the routed address, as on a socket without the option.
            *local = if self.pktinfo {
                msg.cmsgs().ok().and_then(Local::from_cmsgs)
            } else {
                None
            };
            n += 1;
        }
        self.received = n;
        Ok(n)
    }

    /// Calls `answer(packet, peer, out)` for every datagram received; when it
    /// returns `Some(len)`, `out[..len]` is queued as the reply to `peer` (from the
    /// address the datagram was sent to, when known). `out` holds [`MAX_MESSAGE`]
    /// bytes; when `answer` returns `None` the slot is reused.
    pub(crate) fn answer(
        &mut self,
        mut answer: impl FnMut(&[u8], Option<Peer>, &mut [u8]) -> Option<usize>,
    ) {
        let mut queued = 0;
        let mut out_slots = self.tx.chunks_exact_mut(STRIDE);
        let mut out = out_slots.next();
        let received = self
            .rx
            .chunks_exact(STRIDE)
            .zip(&self.rx_len)
            .zip(self.rx_addr.iter().zip(&self.rx_local));
        for ((slot, &len), (addr, &local)) in received.take(self.received) {
            let Some(buf) = out.as_deref_mut() else {
                break;
            };
            let packet = &slot[..len.min(MAX_MESSAGE)];
            let peer = addr
                .as_ref()
                .and_then(socket_addr)
                .map(|addr| Peer { addr, local });
            let Some(reply) = answer(packet, peer, &mut buf[..MAX_MESSAGE]) else {
                continue;
            };
            // A reply without an address to send it to (never for UDP) is dropped.
            if addr.is_none() {
                continue;
            }
            self.tx_len[queued] = reply.min(MAX_MESSAGE);
            self.tx_addr[queued] = *addr;
            self.tx_local[queued] = local;
            queued += 1;
            out = out_slots.next();
        }
        self.queued = queued;
    }

    /// Sends the queued replies with as few `sendmmsg` calls as the kernel allows
    /// (one per run of replies from the same source address). A destination the
    /// kernel refuses is skipped, so this always finishes. Where `sendmmsg` itself
    /// is missing (`ENOSYS`), sends them one by one.
    pub(crate) fn send(&mut self, sock: &UdpSocket) -> Sent {
        let mut done = Sent::default();
        let mut start = 0;
        while start < self.queued {
            let local = self.tx_local[start];
            let end = self.tx_local[start..self.queued]
                .iter()
                .position(|l| *l != local)
                .map_or(self.queued, |n| start + n);
            let mut replies = self
                .tx
                .chunks_exact(STRIDE)
                .zip(&self.tx_len)
                .skip(start)
                .take(end - start);
            let iovs: [[IoSlice<'_>; 1]; MAX_BATCH] = std::array::from_fn(|_| {
                [IoSlice::new(
                    replies.next().map_or(&[][..], |(slot, &len)| &slot[..len]),
                )]
            });
            let count = end - start;
            // A control message only goes with the headers that have room for it
            // (nix asserts that room): without them, the routed source.
            let (headers, local) = match (local, self.send_headers_local.as_mut()) {
                (Some(local), Some(headers)) => (headers, Some(local)),
                _ => (&mut self.send_headers, None),
            };
            let addrs = &self.tx_addr[start..end];
            let result = Local::with_cmsgs(local, |cmsgs: &[ControlMessage<'_>]| {
                sendmmsg(
                    sock.as_raw_fd(),
                    headers,
                    &iovs[..count],
                    addrs,
                    cmsgs,
                    MsgFlags::empty(),
                )
                .map(|results| results.count())
            });
            match result {
                // Each item is one message the kernel took.
                Ok(sent) => match sent {
                    // Not expected (the kernel reports an error instead); skip one so
                    // the loop always ends.
                    0 => {
                        done.failed += 1;
                        start += 1;
                    }
                    n => {
                        done.sent += n;
                        start += n;
                    }
                },
                Err(Errno::EINTR) => {}
                Err(Errno::ENOSYS) => {
                    let rest = self.send_each(sock, start);
                    done.sent += rest.sent;
                    done.failed += rest.failed;
                    break;
                }
                // The first message's destination was refused: skip it.
                Err(e) => {
                    tracing::trace!(error = %e, "DNS/UDP reply not sent");
                    done.failed += 1;
                    start += 1;
                }
            }
        }
        self.queued = 0;
        done
    }

    /// Sends queued replies from `start` with one `send_to` each.
    fn send_each(&self, sock: &UdpSocket, start: usize) -> Sent {
        let mut done = Sent::default();
        let replies = self
            .tx
            .chunks_exact(STRIDE)
            .zip(&self.tx_len)
            .zip(&self.tx_addr);
        for (((slot, &len), addr), &local) in
            replies.zip(&self.tx_local).take(self.queued).skip(start)
        {
            let peer = addr
                .as_ref()
                .and_then(socket_addr)
                .map(|addr| Peer { addr, local });
            match peer {
                Some(to) if super::pktinfo::send_to(sock, &slot[..len], to).is_ok() => {
                    done.sent += 1;
                }
                _ => done.failed += 1,
            }
        }
        done
    }
}

/// A received peer address as a std address (UDP gives IPv4 or IPv6 only).
pub(super) fn socket_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    addr.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

#[cfg(test)]
mod tests;
