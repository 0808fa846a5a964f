//! Replies from the address a query was sent to, on a socket bound to a wildcard.
//!
//! A UDP socket bound to `0.0.0.0` or `[::]` receives datagrams sent to any of the
//! host's addresses, but a plain `send_to` leaves from the address the route to the
//! client picks. A client that asked 127.0.0.2 (or a container that asked the
//! bridge's second address) then gets a reply from another address and drops it.
//! On such a socket the workers ask the kernel for each datagram's destination
//! (`IP_PKTINFO`, `IPV6_RECVPKTINFO`) and send the reply with that address as its
//! source (the same control message on `sendmsg`/`sendmmsg`), as dnsmasq and
//! unbound do. A `[::]` socket that also takes IPv4 gets IPv4-mapped addresses,
//! which Linux accepts back in `IPV6_PKTINFO`.
//!
//! A socket bound to one address needs none of this and does not pay for it.

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use nix::libc;
use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, sendmsg, setsockopt,
    sockopt,
};

/// The address a datagram was sent to, as the source of its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Local {
    /// The local address the kernel picked for the datagram (`ipi_spec_dst`: for a
    /// unicast datagram its destination, for a broadcast one the interface's own).
    V4(Ipv4Addr),
    /// The datagram's destination, and the interface it came in on when the
    /// address is link-local (where the address alone does not name a route).
    V6 { addr: Ipv6Addr, ifindex: u32 },
}

/// A datagram's sender, and where it was sent to when the socket reports that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) addr: SocketAddr,
    pub(crate) local: Option<Local>,
}

/// The address family of a wildcard socket, which decides its control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    pub(crate) fn of(addr: SocketAddr) -> Self {
        match addr {
            SocketAddr::V4(_) => Self::V4,
            SocketAddr::V6(_) => Self::V6,
        }
    }

    /// Room for exactly this family's control message. Exactly: `recvmmsg` leaves
    /// each header's control length at what the kernel last wrote, so a larger
    /// buffer would shrink to this after the first datagram anyway, and `sendmmsg`
    /// hands the kernel the whole buffer, which must hold one message and no more.
    pub(crate) fn cmsg_space(self) -> Vec<u8> {
        match self {
            Self::V4 => nix::cmsg_space!(libc::in_pktinfo),
            Self::V6 => nix::cmsg_space!(libc::in6_pktinfo),
        }
    }
}

/// Asks the kernel to report each datagram's destination on `sock`, which is bound
/// to a wildcard address of `family`.
pub(crate) fn enable(sock: &UdpSocket, family: Family) -> std::io::Result<()> {
    match family {
        Family::V4 => setsockopt(sock, sockopt::Ipv4PacketInfo, &true)?,
        Family::V6 => setsockopt(sock, sockopt::Ipv6RecvPacketInfo, &true)?,
    }
    Ok(())
}

impl Local {
    /// The destination among a received datagram's control messages, if reported.
    pub(crate) fn from_cmsgs(cmsgs: impl Iterator<Item = ControlMessageOwned>) -> Option<Self> {
        for cmsg in cmsgs {
            match cmsg {
                ControlMessageOwned::Ipv4PacketInfo(info) => {
                    let addr = Ipv4Addr::from(u32::from_be(info.ipi_spec_dst.s_addr));
                    return Some(Self::V4(addr));
                }
                ControlMessageOwned::Ipv6PacketInfo(info) => {
                    let addr = Ipv6Addr::from(info.ipi6_addr.s6_addr);
                    let ifindex = if addr.is_unicast_link_local() {
                        info.ipi6_ifindex
                    } else {
                        0
                    };
                    return Some(Self::V6 { addr, ifindex });
                }
                _ => {}
            }
        }
        None
    }

    /// Calls `f` with the control messages that send from this address.
    pub(crate) fn with_cmsgs<R>(
        local: Option<Self>,
        f: impl FnOnce(&[ControlMessage<'_>]) -> R,
    ) -> R {
        match local {
            None => f(&[]),
            Some(Self::V4(addr)) => {
                let info = libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr {
                        s_addr: u32::from(addr).to_be(),
                    },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                };
                f(&[ControlMessage::Ipv4PacketInfo(&info)])
            }
            Some(Self::V6 { addr, ifindex }) => {
                let info = libc::in6_pktinfo {
                    ipi6_addr: libc::in6_addr {
                        s6_addr: addr.octets(),
                    },
                    ipi6_ifindex: ifindex,
                };
                f(&[ControlMessage::Ipv6PacketInfo(&info)])
            }
        }
    }
}

/// Receives one datagram into `buf`: its length, its sender and, when the socket
/// reports it, the address it was sent to. `cmsg_buf` comes from
/// [`Family::cmsg_space`].
pub(crate) fn recv_from(
    sock: &UdpSocket,
    buf: &mut [u8],
    cmsg_buf: &mut [u8],
) -> std::io::Result<(usize, Peer)> {
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(
        sock.as_raw_fd(),
        &mut iov,
        Some(cmsg_buf),
        MsgFlags::empty(),
    )?;
    let addr = msg
        .address
        .as_ref()
        .and_then(super::udp_batch::socket_addr)
        .ok_or_else(|| std::io::Error::other("a datagram without an IP source address"))?;
    let local = msg.cmsgs().ok().and_then(Local::from_cmsgs);
    Ok((msg.bytes, Peer { addr, local }))
}

/// Sends `buf` to `to`, from the address it asked when known (else from the routed
/// address).
pub(crate) fn send_to(sock: &UdpSocket, buf: &[u8], to: Peer) -> std::io::Result<usize> {
    let Peer { addr, local } = to;
    if local.is_none() {
        return sock.send_to(buf, addr);
    }
    let dest = SockaddrStorage::from(addr);
    let iov = [IoSlice::new(buf)];
    Local::with_cmsgs(local, |cmsgs| {
        sendmsg(
            sock.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::empty(),
            Some(&dest),
        )
    })
    .map_err(std::io::Error::from)
}
