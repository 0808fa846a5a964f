//! The DNS listeners: UDP worker threads and a TCP acceptor.
//!
//! UDP is served by `udp_workers` plain threads, each on its own `SO_REUSEPORT` socket
//! bound to the same address (so each has its own receive queue and the kernel spreads
//! clients over them by address hash), each moving up to `udp_batch` datagrams per
//! `recvmmsg` and their replies per `sendmmsg` (see `udp_batch`). With `udp_batch` 1,
//! where the kernel lacks those calls, or where `SO_REUSEPORT` is refused, a worker
//! uses one `recv_from` and one `send_to` per datagram (on clones of one socket when
//! there is no `SO_REUSEPORT`). Plain threads measured faster than a tokio loop for
//! this workload (see `docs/PERFORMANCE.md`), and a worker's packet path allocates
//! nothing (except the per-datagram path on a wildcard address, where nix's
//! `sendmsg` builds each reply's control message in a buffer of its own). Queries
//! that must be forwarded are handed to a tokio task (bounded by a semaphore), which
//! sends the reply on the worker's socket. TCP is a tokio task per
//! connection; TCP answers are never truncated. On a wildcard address (`0.0.0.0`,
//! `[::]`) every UDP reply, forwarded ones included, leaves from the address its
//! query was sent to (see `pktinfo`).
//!
//! # DNS/TCP limits
//!
//! A client that holds a connection open without using it takes a slot from
//! everyone else, so every connection is bounded in time (see [`DnsServerConfig`]):
//!
//! - at most `max_tcp_connections` at once (default 512); more are closed on accept;
//! - between messages, a connection that sends nothing for `tcp_idle_timeout`
//!   (default 10 s) is closed;
//! - a message (its two-byte length and its body) must arrive whole within
//!   `tcp_idle_timeout` of its first byte, so a client that sends one byte just
//!   before each idle timeout is cut after one timeout, not kept forever; writing
//!   a reply has the same bound (a client that never reads);
//! - a connection lives at most `tcp_max_lifetime` (default 120 s): the first
//!   message boundary after that closes it (RFC 7766 lets a server close at any
//!   message boundary). A connection therefore holds its slot at most
//!   `tcp_max_lifetime` + 2 × `tcp_idle_timeout` + the forwarder's deadline.

mod pktinfo;
mod udp_batch;

use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::access::{AllowList, Cidr};
use crate::error::{Error, Result};
use crate::forward::Forwarder;
use crate::guard::{AccessConfig, Guard};
use crate::handler::{Handler, MAX_MESSAGE, Outcome, Transport, Worker, WorkerState, servfail};
use crate::metrics::{Counters, Metrics};
use crate::wire::Rcode;
use dwara_records::Db;
use pktinfo::{Family, Peer};
use udp_batch::UdpBatch;

/// How the DNS listeners are set up.
///
/// The TCP limits hold a connection's slot to at most `tcp_max_lifetime` + 2 ×
/// `tcp_idle_timeout` + the forwarder's deadline: silent for `tcp_idle_timeout`
/// between messages, a message not whole within `tcp_idle_timeout` of its first
/// byte, or a reply not written within it, and the connection is closed; past
/// `tcp_max_lifetime` it is closed at the next message boundary.
#[derive(Debug, Clone)]
pub struct DnsServerConfig {
    /// Where to listen, UDP and TCP (port 0: any free port, the same for both).
    pub listen: SocketAddr,
    /// Number of UDP worker threads (at least 1).
    pub udp_workers: usize,
    /// A TCP connection idle this long between messages is closed, and a message
    /// must arrive whole within this long of its first byte.
    pub tcp_idle_timeout: Duration,
    /// A TCP connection is closed at the first message boundary after this long.
    pub tcp_max_lifetime: Duration,
    /// At most this many TCP connections at once; more are closed on accept.
    pub max_tcp_connections: usize,
    /// At most this many forwarded UDP queries in flight; more get SERVFAIL.
    pub max_forwards_in_flight: usize,
    /// Datagrams a UDP worker receives per `recvmmsg` and answers per `sendmmsg`
    /// (at most 64). 0 or 1: one `recv_from` and one `send_to` per datagram, the
    /// portable path. Default 32 (measured in `docs/PERFORMANCE.md`).
    pub udp_batch: usize,
    /// Receive buffer asked for each DNS/UDP socket, in bytes (`SO_RCVBUF`); 0 keeps
    /// the kernel's default (`net.core.rmem_default`, 208 KiB on most systems). The
    /// kernel grants at most `net.core.rmem_max`. A deeper queue rides out the
    /// moments the workers are off the CPU, which under a flood is what decides
    /// whether a legitimate client's query is dropped by the kernel before the rate
    /// limit ever sees it. Default 4 MiB (measured in `docs/PERFORMANCE.md`).
    pub udp_recv_buffer: usize,
    /// Who may ask, and the UDP rate limit (see [`AccessConfig`]).
    pub access: AccessConfig,
}

/// The default [`DnsServerConfig::udp_batch`]: a batch only takes datagrams already
/// queued, so the size caps the work per system call, not the wait (see
/// `docs/PERFORMANCE.md` for the measurements behind it).
pub(crate) const DEFAULT_UDP_BATCH: usize = 32;

/// The default [`DnsServerConfig::udp_recv_buffer`]: 4 MiB, what Unbound's
/// documentation suggests for `so-rcvbuf` on a busy server.
pub(crate) const DEFAULT_UDP_RECV_BUFFER: usize = 4 << 20;

/// The default [`DnsServerConfig::tcp_idle_timeout`].
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// The default [`DnsServerConfig::tcp_max_lifetime`].
pub const DEFAULT_TCP_MAX_LIFETIME: Duration = Duration::from_secs(120);
/// The default [`DnsServerConfig::max_tcp_connections`].
pub const DEFAULT_MAX_TCP_CONNECTIONS: usize = 512;

impl DnsServerConfig {
    /// Defaults for `listen`: one UDP worker per available core (at most 4).
    pub fn new(listen: SocketAddr) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            listen,
            udp_workers: cores.clamp(1, 4),
            tcp_idle_timeout: DEFAULT_TCP_IDLE_TIMEOUT,
            tcp_max_lifetime: DEFAULT_TCP_MAX_LIFETIME,
            max_tcp_connections: DEFAULT_MAX_TCP_CONNECTIONS,
            max_forwards_in_flight: 1024,
            udp_batch: DEFAULT_UDP_BATCH,
            udp_recv_buffer: DEFAULT_UDP_RECV_BUFFER,
            access: AccessConfig::default(),
        }
    }
}

/// A running DNS server (UDP and TCP on one address).
#[derive(Debug)]
pub struct DnsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    workers: Vec<std::thread::JoinHandle<()>>,
    tcp: tokio::task::JoinHandle<()>,
    allow_list: Arc<AllowList>,
}

/// Sets up replies from the asked address on the sockets of the wildcard `listen`.
/// `None` where the kernel refuses: replies then leave from the routed address, and
/// the log says what that breaks.
fn wildcard_replies(udp: &[UdpSocket], listen: SocketAddr) -> Option<Family> {
    let family = Family::of(listen);
    for sock in udp {
        if let Err(e) = pktinfo::enable(sock, family) {
            tracing::warn!(
                %listen,
                error = %e,
                "DNS/UDP on a wildcard address without IP_PKTINFO: a reply leaves from the address the route to the client picks, so a client that queried another of this host's addresses drops it; bind a specific address"
            );
            return None;
        }
    }
    tracing::debug!(%listen, "DNS/UDP on a wildcard address: replies leave from the address each query was sent to");
    Some(family)
}

/// How often idle UDP workers look at the stop flag.
const UDP_POLL: Duration = Duration::from_millis(200);

/// The UDP sockets of the workers and the TCP listener, all on one address.
struct Bound {
    /// One socket per worker (`SO_REUSEPORT`), or a single socket the workers share.
    udp: Vec<UdpSocket>,
    tcp: StdTcpListener,
}

/// Binds `count` UDP sockets with `SO_REUSEPORT` on `addr`. `Ok(None)`: the option
/// is refused here.
fn bind_reuseport(addr: SocketAddr, count: usize) -> std::io::Result<Option<Vec<UdpSocket>>> {
    let mut socks = Vec::with_capacity(count);
    for _ in 0..count {
        let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if let Err(e) = sock.set_reuse_port(true) {
            tracing::debug!(error = %e, "SO_REUSEPORT refused; the UDP workers share one socket");
            return Ok(None);
        }
        sock.bind(&addr.into())?;
        socks.push(UdpSocket::from(sock));
    }
    Ok(Some(socks))
}

/// Asks for a receive buffer of `bytes` on each socket. The kernel caps the request
/// at `net.core.rmem_max` without an error (and reports back twice what it keeps,
/// its bookkeeping included), so a cap is logged with the sysctl that lifts it: a
/// warning when the size was asked for, at debug for the default (most systems cap
/// it at 208 KiB, and a warning at every start would only be noise).
fn set_recv_buffers(udp: &[UdpSocket], bytes: usize) -> std::io::Result<()> {
    let mut granted = usize::MAX;
    for sock in udp {
        let sock = socket2::SockRef::from(sock);
        sock.set_recv_buffer_size(bytes)?;
        granted = granted.min(sock.recv_buffer_size()? / 2);
    }
    if granted < bytes && bytes != DEFAULT_UDP_RECV_BUFFER {
        tracing::warn!(
            asked = bytes,
            granted,
            "DNS/UDP receive buffer capped by the kernel; raise net.core.rmem_max (sysctl) to get it, a shallow queue drops queries under load"
        );
    } else {
        tracing::debug!(
            asked = bytes,
            granted,
            sockets = udp.len(),
            "DNS/UDP receive buffer set"
        );
    }
    Ok(())
}

/// The DNS/TCP accept queue. The kernel caps it at `net.core.somaxconn` (4096 by
/// default on current kernels); std's 128 drops SYNs when a burst of clients falls
/// back to TCP at once (every truncated answer brings one).
const TCP_BACKLOG: i32 = 4096;

/// A DNS/TCP listener on `addr` (`SO_REUSEADDR`, as std sets it, and a deeper
/// accept queue than std's).
fn bind_tcp(addr: SocketAddr) -> std::io::Result<StdTcpListener> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(TCP_BACKLOG)?;
    Ok(StdTcpListener::from(sock))
}

/// Binds the UDP sockets on the port `probe` holds, after closing it. The probe is a
/// plain socket: its bind failed if anything else held the port, including another
/// program's `SO_REUSEPORT` sockets (which a port-0 bind with the option set could
/// silently share).
fn bind_udp(probe: UdpSocket, workers: usize) -> std::io::Result<Vec<UdpSocket>> {
    let addr = probe.local_addr()?;
    if workers <= 1 {
        return Ok(vec![probe]);
    }
    drop(probe);
    match bind_reuseport(addr, workers)? {
        Some(socks) => Ok(socks),
        None => Ok(vec![UdpSocket::bind(addr)?]),
    }
}

fn bind_all(listen: SocketAddr, workers: usize) -> Result<Bound> {
    let bind_err = |what, source| Error::Bind {
        what,
        addr: listen,
        source,
    };
    if listen.port() != 0 {
        let probe = UdpSocket::bind(listen).map_err(|e| bind_err("DNS/UDP", e))?;
        let tcp = bind_tcp(listen).map_err(|e| bind_err("DNS/TCP", e))?;
        let udp = bind_udp(probe, workers).map_err(|e| bind_err("DNS/UDP", e))?;
        return Ok(Bound { udp, tcp });
    }
    // Port 0: find a port free for both protocols.
    let mut last = None;
    for _ in 0..50 {
        let probe = UdpSocket::bind(listen).map_err(|e| bind_err("DNS/UDP", e))?;
        let port = probe
            .local_addr()
            .map_err(|e| bind_err("DNS/UDP", e))?
            .port();
        let tcp = match bind_tcp(SocketAddr::new(listen.ip(), port)) {
            Ok(tcp) => tcp,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        // Someone may take the port between the probe's close and our binds: retry.
        match bind_udp(probe, workers) {
            Ok(udp) => return Ok(Bound { udp, tcp }),
            Err(e) => last = Some(e),
        }
    }
    Err(bind_err(
        "DNS/TCP",
        last.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()),
    ))
}

impl DnsServer {
    /// Binds UDP and TCP on `config.listen` and starts serving `db`'s records,
    /// forwarding the rest with `forwarder`. Must be called within a tokio runtime.
    pub async fn start(
        config: DnsServerConfig,
        db: &Db,
        forwarder: Arc<Forwarder>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let worker_count = config.udp_workers.max(1);
        let Bound { udp, tcp } = bind_all(config.listen, worker_count)?;
        let pktinfo = if config.listen.ip().is_unspecified() {
            wildcard_replies(&udp, config.listen)
        } else {
            None
        };
        let io_err = |context: &str, source| Error::Io {
            context: context.to_owned(),
            source,
        };
        let addr = tcp
            .local_addr()
            .map_err(|e| io_err("DNS/TCP local address", e))?;
        prepare_udp(&udp, config.udp_recv_buffer)?;
        let sockets = if udp.len() == worker_count {
            "one SO_REUSEPORT socket each"
        } else {
            "one shared socket"
        };
        tcp.set_nonblocking(true)
            .map_err(|e| io_err("setting DNS/TCP non-blocking", e))?;
        let tcp = TcpListener::from_std(tcp).map_err(|e| io_err("registering DNS/TCP", e))?;
        let handler = Arc::new(Handler::new(db));
        let stop = Arc::new(AtomicBool::new(false));
        let guard = Arc::new(
            Guard::start(&config.access, &metrics, stop.clone())
                .map_err(|e| io_err("starting the DNS allow-list watcher", e))?,
        );
        let runtime = tokio::runtime::Handle::current();
        let udp: Vec<Arc<UdpSocket>> = udp.into_iter().map(Arc::new).collect();
        let forwards = Arc::new(Semaphore::new(config.max_forwards_in_flight.max(1)));
        let batch = match config.udp_batch {
            0 | 1 => None,
            n => Some(n.min(udp_batch::MAX_BATCH)),
        };
        let workers = spawn_udp_workers(&udp, worker_count, |sock| UdpWorker {
            sock,
            batch,
            pktinfo,
            handler: handler.clone(),
            guard: guard.clone(),
            counters: metrics.worker_block(),
            shared: metrics.shared().clone(),
            forwarder: forwarder.clone(),
            forwards: forwards.clone(),
            runtime: runtime.clone(),
            stop: stop.clone(),
        })?;
        let allow_list = guard.allow_list().clone();
        let tcp = tokio::spawn(serve_tcp(
            tcp,
            handler,
            guard,
            forwarder,
            metrics.shared().clone(),
            config.clone(),
        ));
        // `dwara serve` sums the start up in one line; the details are for debugging.
        tracing::debug!(
            %addr,
            udp_workers = workers.len(),
            udp_batch = batch.unwrap_or(1),
            sockets,
            "DNS server listening (UDP and TCP)"
        );
        Ok(Self {
            addr,
            stop,
            workers,
            tcp,
            allow_list,
        })
    }

    /// The address served (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The client prefixes allowed right now besides loopback (the interface
    /// subnets as last read, with `local`).
    pub fn allowed(&self) -> Vec<Cidr> {
        self.allow_list.cidrs()
    }

    /// Stops both listeners and waits for the UDP workers to finish.
    pub async fn shutdown(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tcp.abort();
        let workers = std::mem::take(&mut self.workers);
        let _ = tokio::task::spawn_blocking(move || {
            for w in workers {
                let _ = w.join();
            }
        })
        .await;
        tracing::debug!(addr = %self.addr, "DNS server stopped");
    }
}

impl Drop for DnsServer {
    /// A server dropped without [`DnsServer::shutdown`] still stops: the UDP workers
    /// see the flag within their poll interval and exit on their own.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tcp.abort();
    }
}
/// The UDP sockets' read timeout (the workers' stop poll) and, when asked, their
/// receive queue.
fn prepare_udp(udp: &[UdpSocket], recv_buffer: usize) -> Result<()> {
    for sock in udp {
        sock.set_read_timeout(Some(UDP_POLL))
            .map_err(|source| Error::Io {
                context: "setting the DNS/UDP read timeout".to_owned(),
                source,
            })?;
    }
    if recv_buffer > 0 {
        set_recv_buffers(udp, recv_buffer).map_err(|source| Error::Io {
            context: "setting the DNS/UDP receive buffer".to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// Starts `count` UDP worker threads, each on its own `SO_REUSEPORT` socket when
/// there is one per worker, else on a clone of a shared one; `worker` builds each
/// worker's context around its socket.
fn spawn_udp_workers(
    udp: &[Arc<UdpSocket>],
    count: usize,
    worker: impl Fn(Arc<UdpSocket>) -> UdpWorker,
) -> Result<Vec<std::thread::JoinHandle<()>>> {
    let io_err = |context: &str, source| Error::Io {
        context: context.to_owned(),
        source,
    };
    let mut workers = Vec::with_capacity(count);
    for i in 0..count {
        let own = &udp[i % udp.len()];
        let sock = if udp.len() == count {
            own.clone()
        } else {
            let clone = own
                .try_clone()
                .map_err(|e| io_err("cloning the DNS/UDP socket", e))?;
            Arc::new(clone)
        };
        let ctx = worker(sock);
        let handle = std::thread::Builder::new()
            .name(format!("dwara-dns-udp-{i}"))
            .spawn(move || ctx.run())
            .map_err(|e| io_err("spawning a DNS/UDP worker", e))?;
        workers.push(handle);
    }
    Ok(workers)
}

struct UdpWorker {
    /// This worker's socket (its own with `SO_REUSEPORT`, else a clone of the shared
    /// one); forwarded replies go out on it too.
    sock: Arc<UdpSocket>,
    /// `Some(n)`: up to `n` datagrams per system call.
    batch: Option<usize>,
    /// `Some`: the socket is bound to a wildcard address of this family and reports
    /// each datagram's destination, which its reply is sent from.
    pktinfo: Option<Family>,
    handler: Arc<Handler>,
    guard: Arc<Guard>,
    counters: Arc<Counters>,
    shared: Arc<Counters>,
    forwarder: Arc<Forwarder>,
    forwards: Arc<Semaphore>,
    runtime: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
}

/// Whether a receive error is part of normal operation: the poll timeout, a signal,
/// or an ICMP error left on the socket by an earlier send.
fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
            | std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
    )
}

impl UdpWorker {
    fn run(self) {
        let mut state = WorkerState::new();
        if let Some(max) = self.batch {
            let mut batch = UdpBatch::new(max, self.pktinfo);
            if self.run_batched(&mut batch, &mut state).is_break() {
                return;
            }
            tracing::warn!(
                "recvmmsg is not available here; DNS/UDP falls back to one recv_from per datagram"
            );
        }
        self.run_per_datagram(&mut state);
    }

    /// Serves in batches until stopped (`Break`) or until `recvmmsg` turns out to be
    /// missing (`Continue`: use the per-datagram path).
    fn run_batched(&self, batch: &mut UdpBatch, state: &mut WorkerState) -> ControlFlow<()> {
        let mut worker = self.worker(state);
        while !self.stop.load(Ordering::Relaxed) {
            match batch.recv(&self.sock) {
                Ok(_) => {}
                Err(Errno::ENOSYS) => return ControlFlow::Continue(()),
                Err(e) if is_transient(&std::io::Error::from(e)) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "DNS/UDP receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
            batch.answer(|packet, peer, out| {
                self.counters.udp_request(packet.len());
                // Every received datagram has a sender address.
                let peer = peer?;
                match self.guard.handle(&mut worker, peer.addr.ip(), packet, out) {
                    Outcome::Reply(len) => {
                        self.counters.udp_reply(len);
                        Some(len)
                    }
                    Outcome::Drop => None,
                    Outcome::Forward { qtype } => {
                        self.forward(packet, peer, qtype, out);
                        None
                    }
                }
            });
            batch.send(&self.sock);
        }
        ControlFlow::Break(())
    }

    /// Serves one datagram per `recv_from` / `send_to` until stopped.
    fn run_per_datagram(&self, state: &mut WorkerState) {
        let mut worker = self.worker(state);
        // A UDP datagram larger than the buffer is cut to it; it then parses as
        // garbage and gets FORMERR, as it should.
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut out = vec![0u8; MAX_MESSAGE];
        let mut cmsg_buf = self.pktinfo.map(Family::cmsg_space);
        while !self.stop.load(Ordering::Relaxed) {
            let received = match cmsg_buf.as_deref_mut() {
                Some(cmsg_buf) => pktinfo::recv_from(&self.sock, &mut buf, cmsg_buf),
                None => self
                    .sock
                    .recv_from(&mut buf)
                    .map(|(n, addr)| (n, Peer { addr, local: None })),
            };
            let (n, src) = match received {
                Ok(x) => x,
                Err(e) if is_transient(&e) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "DNS/UDP receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let packet = &buf[..n];
            self.counters.udp_request(n);
            match self
                .guard
                .handle(&mut worker, src.addr.ip(), packet, &mut out)
            {
                Outcome::Reply(len) => {
                    self.counters.udp_reply(len);
                    let _ = pktinfo::send_to(&self.sock, &out[..len], src);
                }
                Outcome::Drop => {}
                Outcome::Forward { qtype } => self.forward(packet, src, qtype, &mut out),
            }
        }
    }

    /// This worker's answering context over `state`.
    fn worker<'a>(&'a self, state: &'a mut WorkerState) -> Worker<'a> {
        Worker {
            handler: &self.handler,
            counters: &self.counters,
            transport: Transport::Udp,
            state,
        }
    }

    fn forward(&self, packet: &[u8], src: Peer, qtype: u16, out: &mut [u8]) {
        let Ok(permit) = self.forwards.clone().try_acquire_owned() else {
            // Too many in flight: answer at once rather than queue without bound.
            if let Some(len) = servfail(packet, out) {
                self.counters.record(Some(qtype), Rcode::SERVFAIL.code());
                self.counters.udp_reply(len);
                let _ = pktinfo::send_to(&self.sock, &out[..len], src);
            }
            return;
        };
        let query = packet.to_vec();
        let forwarder = self.forwarder.clone();
        let sock = self.sock.clone();
        let counters = self.shared.clone();
        self.runtime.spawn(async move {
            let _permit = permit;
            counters.forwarded();
            let reply = match forwarder.forward_udp(&query).await {
                Some(reply) => reply,
                None => {
                    counters.forward_failed();
                    let mut out = vec![0u8; 512];
                    let Some(len) = servfail(&query, &mut out) else {
                        return;
                    };
                    out.truncate(len);
                    out
                }
            };
            let rc = Rcode::of(&reply).unwrap_or(Rcode::SERVFAIL);
            counters.record(Some(qtype), rc.code());
            counters.udp_reply(reply.len());
            // The socket is blocking, but a UDP send only waits when the socket
            // buffer is full, and then only briefly.
            let _ = pktinfo::send_to(&sock, &reply, src);
        });
    }
}

async fn serve_tcp(
    listener: TcpListener,
    handler: Arc<Handler>,
    guard: Arc<Guard>,
    forwarder: Arc<Forwarder>,
    counters: Arc<Counters>,
    config: DnsServerConfig,
) {
    let limit = Arc::new(Semaphore::new(config.max_tcp_connections.max(1)));
    // Dropping the set (when this task is aborted) aborts every connection.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!(error = %e, "DNS/TCP accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "too many DNS/TCP connections; closing");
                    continue;
                };
                let (handler, guard, forwarder, counters) = (handler.clone(), guard.clone(), forwarder.clone(), counters.clone());
                let limits = TcpLimits {
                    idle: config.tcp_idle_timeout,
                    lifetime: config.tcp_max_lifetime,
                };
                conns.spawn(async move {
                    let _permit = permit;
                    let served = Served { handler: &handler, guard: &guard, forwarder: &forwarder, counters: &counters };
                    if let Err(e) = serve_tcp_conn(stream, peer, served, limits).await {
                        tracing::trace!(%peer, error = %e, "DNS/TCP connection ended");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// The time bounds of one DNS/TCP connection (see the module docs).
#[derive(Debug, Clone, Copy)]
struct TcpLimits {
    idle: Duration,
    lifetime: Duration,
}

/// Why a connection stopped waiting for its next message.
enum NextFrame {
    /// A whole message of this length is in the query buffer.
    Frame(usize),
    /// Idle, past its lifetime, or closed by the client: close quietly.
    Close,
}

/// Reads the next length-prefixed message into `query`: the first byte may take
/// `limits.idle` (less when the lifetime ends sooner), the rest of the message must
/// follow within `limits.idle` of that first byte.
async fn read_frame(
    stream: &mut BufReader<TcpStream>,
    query: &mut [u8],
    limits: TcpLimits,
    end_of_life: Instant,
) -> std::io::Result<NextFrame> {
    let now = Instant::now();
    if now >= end_of_life {
        return Ok(NextFrame::Close);
    }
    let first =
        match tokio::time::timeout_at(end_of_life.min(now + limits.idle), stream.read_u8()).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Ok(NextFrame::Close);
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(NextFrame::Close),
        };
    let frame_deadline = Instant::now() + limits.idle;
    let rest = async {
        let low = stream.read_u8().await?;
        let len = usize::from(u16::from_be_bytes([first, low]));
        stream.read_exact(&mut query[..len]).await?;
        Ok::<_, std::io::Error>(len)
    };
    match tokio::time::timeout_at(frame_deadline, rest).await {
        Ok(len) => Ok(NextFrame::Frame(len?)),
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// What one DNS/TCP connection answers with.
#[derive(Clone, Copy)]
struct Served<'a> {
    handler: &'a Handler,
    guard: &'a Guard,
    forwarder: &'a Forwarder,
    counters: &'a Counters,
}

async fn serve_tcp_conn(
    stream: TcpStream,
    peer: SocketAddr,
    served: Served<'_>,
    limits: TcpLimits,
) -> std::io::Result<()> {
    let Served {
        handler,
        guard,
        forwarder,
        counters,
    } = served;
    stream.set_nodelay(true)?;
    let end_of_life = Instant::now() + limits.lifetime;
    // Buffered: a client that sends several messages in one write costs one read.
    let mut stream = BufReader::new(stream);
    let mut state = WorkerState::new();
    let mut worker = Worker {
        handler,
        counters,
        transport: Transport::Tcp,
        state: &mut state,
    };
    let mut query = vec![0u8; MAX_MESSAGE];
    let mut out = vec![0u8; MAX_MESSAGE + 2];
    loop {
        let len = match read_frame(&mut stream, &mut query, limits, end_of_life).await? {
            NextFrame::Frame(len) => len,
            NextFrame::Close => return Ok(()),
        };
        let packet = &query[..len];
        let reply_len = match guard.handle(&mut worker, peer.ip(), packet, &mut out[2..]) {
            Outcome::Reply(n) => n,
            Outcome::Drop => continue,
            Outcome::Forward { qtype } => {
                counters.forwarded();
                let n = match forwarder.forward_tcp(packet).await {
                    Some(reply) if reply.len() <= MAX_MESSAGE => {
                        out[2..2 + reply.len()].copy_from_slice(&reply);
                        reply.len()
                    }
                    _ => {
                        counters.forward_failed();
                        match servfail(packet, &mut out[2..]) {
                            Some(n) => n,
                            None => continue,
                        }
                    }
                };
                let rc = Rcode::of(&out[2..]).unwrap_or(Rcode::SERVFAIL);
                counters.record(Some(qtype), rc.code());
                n
            }
        };
        // reply_len ≤ MAX_MESSAGE.
        out[..2].copy_from_slice(&(reply_len as u16).to_be_bytes());
        // A client that does not read its replies must not hold the slot either.
        tokio::time::timeout(limits.idle, stream.write_all(&out[..reply_len + 2]))
            .await
            .map_err(|_| std::io::ErrorKind::TimedOut)??;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receive_buffer_asked_for_is_what_the_socket_gets() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = socket2::SockRef::from(&sock).recv_buffer_size().unwrap();
        // Below every default net.core.rmem_max (208 KiB), so never capped, and
        // unlike the default: the kernel reports twice what it keeps.
        let asked = 100 * 1024;
        set_recv_buffers(std::slice::from_ref(&sock), asked).unwrap();
        let after = socket2::SockRef::from(&sock).recv_buffer_size().unwrap();
        assert_eq!(after, 2 * asked, "was {before}");
        assert_ne!(after, before);
    }
}
