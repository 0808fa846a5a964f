//! Forwarding of everything that is not ours to the fallback servers.
//!
//! Servers are tried in order; a transport error (refused, reset, closed) or a
//! server's timeout moves on to the next one. Whatever a server answers — NXDOMAIN
//! and SERVFAIL included — is passed back unchanged but for the ID: the query goes
//! out with a fresh random ID, and replies that do not match it and the question, or
//! are not a whole DNS message (cut short, garbage), are ignored while waiting. When
//! every server fails, or none is configured, the caller answers SERVFAIL; every
//! attempt is bounded by a per-server timeout and an overall deadline.
//!
//! Two more changes keep replies within RFC 8906 §8 whatever the fallback server
//! does: the header's reserved Z bit is cleared, and when the query set the DO bit
//! and the reply has an OPT record without it, the bit is set, so every reply to a
//! DO query echoes it (RFC 3225). A reply without OPT is left so: the server does not
//! do EDNS.
//!
//! The server list can be swapped at any time ([`Forwarder::set_servers`]), which is
//! how `/etc/resolv.conf` changes are followed (see `resolv`).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hickory_proto::op::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{Instant, timeout_at};

use crate::handler::Transport;
use crate::wire::{HEADER_LEN, dnssec_ok, opt_flags_at, question_span};

/// How forwarding behaves.
#[derive(Debug, Clone)]
pub struct ForwarderConfig {
    /// How long to wait for one server.
    pub server_timeout: Duration,
    /// How long to try all servers together before giving up.
    pub deadline: Duration,
}

impl Default for ForwarderConfig {
    fn default() -> Self {
        Self {
            server_timeout: Duration::from_millis(1500),
            deadline: Duration::from_secs(3),
        }
    }
}

/// Forwards queries to an ordered list of fallback servers.
#[derive(Debug)]
pub struct Forwarder {
    servers: ArcSwap<Vec<SocketAddr>>,
    config: ForwarderConfig,
}

impl Forwarder {
    /// A forwarder to `servers`, in order.
    pub fn new(servers: Vec<SocketAddr>, config: ForwarderConfig) -> Self {
        Self {
            servers: ArcSwap::from_pointee(servers),
            config,
        }
    }

    /// The current servers.
    pub fn servers(&self) -> Arc<Vec<SocketAddr>> {
        self.servers.load_full()
    }

    /// Replaces the servers; queries in flight finish with the old list.
    pub fn set_servers(&self, servers: Vec<SocketAddr>) {
        self.servers.store(Arc::new(servers));
    }

    /// Forwards `query` over UDP and returns the first server's reply with the
    /// query's ID, or `None` when no server answered in time.
    pub async fn forward_udp(&self, query: &[u8]) -> Option<Vec<u8>> {
        self.forward(query, Transport::Udp).await
    }

    /// Forwards `query` over TCP (for queries that came over TCP), as
    /// [`forward_udp`](Self::forward_udp) does over UDP.
    pub async fn forward_tcp(&self, query: &[u8]) -> Option<Vec<u8>> {
        self.forward(query, Transport::Tcp).await
    }

    async fn forward(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        if query.len() < HEADER_LEN {
            return None;
        }
        let servers = self.servers.load_full();
        let deadline = Instant::now() + self.config.deadline;
        for &server in servers.iter() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let until = deadline.min(now + self.config.server_timeout);
            let id: u16 = rand::random();
            let mut out = query.to_vec();
            out[..2].copy_from_slice(&id.to_be_bytes());
            let result = match transport {
                Transport::Udp => timeout_at(until, exchange_udp(server, &out)).await,
                Transport::Tcp => timeout_at(until, exchange_tcp(server, &out)).await,
            };
            match result {
                Ok(Ok(mut reply)) => {
                    reply[..2].copy_from_slice(&query[..2]);
                    // The reserved Z bit must be zero in a reply.
                    reply[3] &= !0x40;
                    echo_dnssec_ok(query, &mut reply);
                    return Some(reply);
                }
                Ok(Err(e)) => {
                    tracing::debug!(%server, error = %e, "fallback server failed, trying the next")
                }
                Err(_) => tracing::debug!(%server, "fallback server timed out, trying the next"),
            }
        }
        None
    }
}

/// Sets the reply's DO bit when the query set it and the reply's OPT lacks it.
fn echo_dnssec_ok(query: &[u8], reply: &mut [u8]) {
    if dnssec_ok(query)
        && let Some(at) = opt_flags_at(reply)
        && let Some(flags) = reply.get_mut(at)
    {
        *flags |= 0x80;
    }
}

/// Whether `reply` answers `query`: same ID, a response, same question ignoring
/// case, and a whole DNS message (a reply cut short inside its records would
/// otherwise be passed on to the client as it is).
fn matches(query: &[u8], reply: &[u8]) -> bool {
    if reply.len() < HEADER_LEN || reply[..2] != query[..2] || reply[2] & 0x80 == 0 {
        return false;
    }
    let same_question = match question_span(query) {
        Some((end, _)) => reply
            .get(HEADER_LEN..end)
            .is_some_and(|r| r.eq_ignore_ascii_case(&query[HEADER_LEN..end])),
        // A question we cannot delimit: the ID has to do.
        None => true,
    };
    same_question && Message::from_vec(reply).is_ok()
}

fn unspecified_for(server: SocketAddr) -> SocketAddr {
    match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

async fn exchange_udp(server: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let sock = UdpSocket::bind(unspecified_for(server)).await?;
    sock.connect(server).await?;
    sock.send(query).await?;
    let mut buf = vec![0u8; 65_535];
    loop {
        let n = sock.recv(&mut buf).await?;
        if matches(query, &buf[..n]) {
            buf.truncate(n);
            return Ok(buf);
        }
        tracing::debug!(%server, "ignoring a reply that does not match the query");
    }
}

async fn exchange_tcp(server: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(server).await?;
    stream.set_nodelay(true)?;
    let len = u16::try_from(query.len()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    let mut msg = Vec::with_capacity(query.len() + 2);
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(query);
    stream.write_all(&msg).await?;
    loop {
        let len = usize::from(stream.read_u16().await?);
        let mut buf = vec![0u8; len];
        stream.read_exact(&mut buf).await?;
        if matches(query, &buf) {
            return Ok(buf);
        }
    }
}
