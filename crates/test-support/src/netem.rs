//! A userspace stand-in for `tc qdisc … netem delay D J`, for kernels built
//! without netem (`CONFIG_NET_SCH_NETEM`).
//!
//! A rule like `iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num 0` hands every
//! packet leaving `eth0` to queue 0 of that network namespace; a [`Delayer`] bound to
//! the queue gives each packet its verdict (accept) only after a delay drawn
//! uniformly from `D ± J`, as netem does. The kernel holds the packet meanwhile: the
//! delayer sees only its id (copy mode `meta`), never its bytes. Loss needs no help:
//! `iptables … -m statistic --mode random --probability P -j DROP` is in the kernel.
//!
//! The delayer speaks nfnetlink_queue (`linux/netfilter/nfnetlink_queue.h`) on a
//! netlink socket opened by its own thread after it entered the namespace
//! (`setns`, which moves only that thread). Packets still held when the delayer
//! stops are accepted at once.
//!
//! ```no_run
//! # fn demo() -> std::io::Result<()> {
//! use std::time::Duration;
//! use test_support::netem::Delayer;
//! let delayer = Delayer::start(
//!     std::path::Path::new("/run/netns/node0"),
//!     0,
//!     Duration::from_millis(50),
//!     Duration::from_millis(20),
//! )?;
//! // … traffic leaving node0's eth0 now takes 30 to 70 ms …
//! println!("{} packets delayed", delayer.delayed());
//! # Ok(()) }
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_META: u8 = 1;
const NF_ACCEPT: u32 = 1;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
const AF_INET: u16 = 2;
/// Packets the kernel may hold for the delayer before it drops new ones.
const QUEUE_MAXLEN: u32 = 16 * 1024;

/// Delays the packets queued to one NFQUEUE of one network namespace. Stops (and
/// lets every held packet go) on drop.
#[derive(Debug)]
pub struct Delayer {
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Stats {
    delayed: AtomicU64,
    overruns: AtomicU64,
}

impl Delayer {
    /// Starts delaying packets of queue `queue` in the namespace whose handle is at
    /// `netns` (`/run/netns/NAME` for `ip netns add NAME`) by `delay ± jitter`.
    /// Fails when the namespace cannot be entered or the queue bound (another
    /// program holds it, or the kernel has no `nfnetlink_queue`).
    pub fn start(netns: &Path, queue: u16, delay: Duration, jitter: Duration) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let netns: PathBuf = netns.to_owned();
        let thread = {
            let stop = stop.clone();
            let stats = stats.clone();
            std::thread::Builder::new()
                .name(format!("netem-{queue}"))
                .spawn(move || {
                    let sock = match open(&netns, queue) {
                        Ok(sock) => {
                            let _ = ready_tx.send(Ok(()));
                            sock
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    run(&sock, queue, delay, jitter, &stop, &stats);
                })?
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                stop,
                stats,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(io::Error::other("delayer thread ended before it was ready")),
        }
    }

    /// Packets delayed so far.
    pub fn delayed(&self) -> u64 {
        self.stats.delayed.load(Ordering::Relaxed)
    }

    /// Times the socket's receive buffer overflowed (those packets are lost, as a
    /// full netem queue loses them).
    pub fn overruns(&self) -> u64 {
        self.stats.overruns.load(Ordering::Relaxed)
    }
}

impl Drop for Delayer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Enters `netns` (this thread only), opens a netlink socket there and binds it to
/// `queue`.
fn open(netns: &Path, queue: u16) -> io::Result<OwnedFd> {
    let ns = std::fs::File::open(netns)?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(io::Error::from)?;
    bind(sock.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(io::Error::from)?;
    // Bursts of gossip come in tens of packets; the default buffer is small.
    let _ = setsockopt(&sock, sockopt::RcvBufForce, &(4 << 20));
    let _ = setsockopt(&sock, sockopt::RcvBuf, &(4 << 20));
    let mut cmd = Vec::new();
    cmd.extend_from_slice(&[NFQNL_CFG_CMD_BIND, 0]);
    cmd.extend_from_slice(&AF_INET.to_be_bytes());
    request(&sock, queue, NFQA_CFG_CMD, &cmd)?;
    let mut params = Vec::new();
    params.extend_from_slice(&0u32.to_be_bytes());
    params.push(NFQNL_COPY_META);
    request(&sock, queue, NFQA_CFG_PARAMS, &params)?;
    request(
        &sock,
        queue,
        NFQA_CFG_QUEUE_MAXLEN,
        &QUEUE_MAXLEN.to_be_bytes(),
    )?;
    Ok(sock)
}

/// A netlink message of the queue subsystem: header, nfgenmsg for `queue`, one
/// attribute.
fn message(msg: u16, flags: u16, queue: u16, attr: u16, payload: &[u8]) -> Vec<u8> {
    let attr_len = 4 + payload.len();
    let padded = attr_len.div_ceil(4) * 4;
    let len = NLMSG_HDRLEN + 4 + padded;
    let mut buf = Vec::with_capacity(len);
    buf.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | msg).to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // seq
    buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel
    buf.extend_from_slice(&[0, 0]); // AF_UNSPEC, NFNETLINK_V0
    buf.extend_from_slice(&queue.to_be_bytes());
    buf.extend_from_slice(&u16::try_from(attr_len).unwrap_or(u16::MAX).to_ne_bytes());
    buf.extend_from_slice(&attr.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(len, 0);
    buf
}

/// Sends one config request and waits for its acknowledgement.
fn request(sock: &OwnedFd, queue: u16, attr: u16, payload: &[u8]) -> io::Result<()> {
    let msg = message(
        NFQNL_MSG_CONFIG,
        NLM_F_REQUEST | NLM_F_ACK,
        queue,
        attr,
        payload,
    );
    send(sock.as_raw_fd(), &msg, MsgFlags::empty()).map_err(io::Error::from)?;
    let mut buf = vec![0u8; 8192];
    loop {
        let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(io::Error::from)?;
        for (kind, body) in messages(&buf[..n]) {
            if kind == NLMSG_ERROR {
                let code = body
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, i32::from_ne_bytes);
                return if code == 0 {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(-code))
                };
            }
        }
    }
}

/// The (type, body) of every netlink message in `buf`.
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = buf
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)? as usize;
        let kind = buf
            .get(4..6)
            .and_then(|b| b.try_into().ok())
            .map(u16::from_ne_bytes)?;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let body = &buf[NLMSG_HDRLEN..len];
        buf = buf.get(len.div_ceil(4) * 4..).unwrap_or_default();
        Some((kind, body))
    })
}

/// The packet id of a queued-packet message body (nfgenmsg, then attributes).
fn packet_id(body: &[u8]) -> Option<u32> {
    let mut attrs = body.get(4..)?;
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFQA_PACKET_HDR {
            return attrs
                .get(4..8)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_be_bytes);
        }
        attrs = attrs.get(len.div_ceil(4) * 4..).unwrap_or_default();
    }
    None
}

fn accept(sock: &OwnedFd, queue: u16, id: u32) {
    let mut verdict = Vec::with_capacity(8);
    verdict.extend_from_slice(&NF_ACCEPT.to_be_bytes());
    verdict.extend_from_slice(&id.to_be_bytes());
    let msg = message(
        NFQNL_MSG_VERDICT,
        NLM_F_REQUEST,
        queue,
        NFQA_VERDICT_HDR,
        &verdict,
    );
    let _ = send(sock.as_raw_fd(), &msg, MsgFlags::empty());
}

/// xorshift64*: the delays need spread, not quality.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

fn run(
    sock: &OwnedFd,
    queue: u16,
    delay: Duration,
    jitter: Duration,
    stop: &AtomicBool,
    stats: &Stats,
) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed ^ u64::from(queue));
    let low = delay.saturating_sub(jitter);
    let spread = u64::try_from((delay + jitter - low).as_micros()).unwrap_or(u64::MAX);
    let mut held: BinaryHeap<Reverse<(Instant, u32)>> = BinaryHeap::new();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while let Some(Reverse((due, id))) = held.peek().copied() {
            if due > now {
                break;
            }
            held.pop();
            accept(sock, queue, id);
        }
        let wait = held
            .peek()
            .map_or(Duration::from_millis(20), |Reverse((due, _))| {
                due.saturating_duration_since(now)
            })
            .clamp(Duration::from_micros(200), Duration::from_millis(20));
        let usec = i64::try_from(wait.as_micros()).unwrap_or(20_000);
        let _ = setsockopt(sock, sockopt::ReceiveTimeout, &TimeVal::new(0, usec as _));
        match recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => {
                let now = Instant::now();
                for (kind, body) in messages(&buf[..n]) {
                    if kind != ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET) {
                        continue;
                    }
                    if let Some(id) = packet_id(body) {
                        let extra = Duration::from_micros(rng.below(spread));
                        held.push(Reverse((now + low + extra, id)));
                        stats.delayed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Err(Errno::ENOBUFS) => {
                stats.overruns.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }
    for Reverse((_, id)) in held {
        accept(sock, queue, id);
    }
}
