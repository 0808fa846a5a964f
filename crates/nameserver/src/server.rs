//! The DNS listeners: UDP worker threads and a TCP acceptor.
//!
//! UDP is served by `udp_workers` plain threads blocking in `recv_from` on clones of
//! one socket: measured faster than a tokio loop for this workload (see
//! `docs/PERFORMANCE.md`), and a worker's packet path allocates nothing. Queries that
//! must be forwarded are handed to a tokio task (bounded by a semaphore), which sends
//! the reply on the same socket. TCP is a tokio task per connection, with an idle
//! timeout and a connection limit; TCP answers are never truncated.

use std::net::{SocketAddr, TcpListener as StdTcpListener, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::db::Db;
use crate::error::{Error, Result};
use crate::forward::Forwarder;
use crate::handler::{Handler, MAX_MESSAGE, Outcome, Transport, servfail};
use crate::metrics::{Counters, Metrics};
use crate::wire::FastRng;

/// How the DNS listeners are set up.
#[derive(Debug, Clone)]
pub struct DnsServerConfig {
    /// Where to listen, UDP and TCP (port 0: any free port, the same for both).
    pub listen: SocketAddr,
    /// Number of UDP worker threads (at least 1).
    pub udp_workers: usize,
    /// A TCP connection idle this long is closed.
    pub tcp_idle_timeout: Duration,
    /// At most this many TCP connections at once; more are closed on accept.
    pub max_tcp_connections: usize,
    /// At most this many forwarded UDP queries in flight; more get SERVFAIL.
    pub max_forwards_in_flight: usize,
}

impl DnsServerConfig {
    /// Defaults for `listen`: one UDP worker per available core (at most 4).
    pub fn new(listen: SocketAddr) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            listen,
            udp_workers: cores.clamp(1, 4),
            tcp_idle_timeout: Duration::from_secs(10),
            max_tcp_connections: 512,
            max_forwards_in_flight: 1024,
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
}

/// How often idle UDP workers look at the stop flag.
const UDP_POLL: Duration = Duration::from_millis(200);

fn bind_pair(listen: SocketAddr) -> Result<(UdpSocket, StdTcpListener)> {
    let bind_err = |what, source| Error::Bind {
        what,
        addr: listen,
        source,
    };
    if listen.port() != 0 {
        let udp = UdpSocket::bind(listen).map_err(|e| bind_err("DNS/UDP", e))?;
        let tcp = StdTcpListener::bind(listen).map_err(|e| bind_err("DNS/TCP", e))?;
        return Ok((udp, tcp));
    }
    // Port 0: find a port free for both protocols.
    let mut last = None;
    for _ in 0..50 {
        let udp = UdpSocket::bind(listen).map_err(|e| bind_err("DNS/UDP", e))?;
        let port = udp.local_addr().map_err(|e| bind_err("DNS/UDP", e))?.port();
        match StdTcpListener::bind(SocketAddr::new(listen.ip(), port)) {
            Ok(tcp) => return Ok((udp, tcp)),
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
        let (udp, tcp) = bind_pair(config.listen)?;
        let io_err = |context: &str, source| Error::Io {
            context: context.to_owned(),
            source,
        };
        let addr = udp
            .local_addr()
            .map_err(|e| io_err("DNS/UDP local address", e))?;
        udp.set_read_timeout(Some(UDP_POLL))
            .map_err(|e| io_err("setting the DNS/UDP read timeout", e))?;
        tcp.set_nonblocking(true)
            .map_err(|e| io_err("setting DNS/TCP non-blocking", e))?;
        let tcp = TcpListener::from_std(tcp).map_err(|e| io_err("registering DNS/TCP", e))?;
        let handler = Arc::new(Handler::new(db));
        let stop = Arc::new(AtomicBool::new(false));
        let runtime = tokio::runtime::Handle::current();
        let udp = Arc::new(udp);
        let forwards = Arc::new(Semaphore::new(config.max_forwards_in_flight.max(1)));
        let mut workers = Vec::new();
        for i in 0..config.udp_workers.max(1) {
            let sock = udp
                .try_clone()
                .map_err(|e| io_err("cloning the DNS/UDP socket", e))?;
            let ctx = UdpWorker {
                sock,
                reply_sock: udp.clone(),
                handler: handler.clone(),
                counters: metrics.worker_block(),
                shared: metrics.shared().clone(),
                forwarder: forwarder.clone(),
                forwards: forwards.clone(),
                runtime: runtime.clone(),
                stop: stop.clone(),
            };
            let worker = std::thread::Builder::new()
                .name(format!("dwara-dns-udp-{i}"))
                .spawn(move || ctx.run())
                .map_err(|e| io_err("spawning a DNS/UDP worker", e))?;
            workers.push(worker);
        }
        let tcp = tokio::spawn(serve_tcp(
            tcp,
            handler,
            forwarder,
            metrics.shared().clone(),
            config.clone(),
        ));
        tracing::info!(%addr, udp_workers = workers.len(), "DNS server listening (UDP and TCP)");
        Ok(Self {
            addr,
            stop,
            workers,
            tcp,
        })
    }

    /// The address served (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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

struct UdpWorker {
    sock: UdpSocket,
    reply_sock: Arc<UdpSocket>,
    handler: Arc<Handler>,
    counters: Arc<Counters>,
    shared: Arc<Counters>,
    forwarder: Arc<Forwarder>,
    forwards: Arc<Semaphore>,
    runtime: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
}

impl UdpWorker {
    fn run(self) {
        // A UDP datagram larger than the buffer is cut to it; it then parses as
        // garbage and gets FORMERR, as it should.
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut out = vec![0u8; MAX_MESSAGE];
        let mut rng = FastRng::new();
        while !self.stop.load(Ordering::Relaxed) {
            let (n, src) = match self.sock.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                            | std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::ConnectionReset
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "DNS/UDP receive failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let packet = &buf[..n];
            match self
                .handler
                .handle(packet, &mut out, Transport::Udp, &mut rng, &self.counters)
            {
                Outcome::Reply(len) => {
                    let _ = self.sock.send_to(&out[..len], src);
                }
                Outcome::Drop => {}
                Outcome::Forward { qtype } => self.forward(packet, src, qtype, &mut out),
            }
        }
    }

    fn forward(&self, packet: &[u8], src: SocketAddr, qtype: u16, out: &mut [u8]) {
        let Ok(permit) = self.forwards.clone().try_acquire_owned() else {
            // Too many in flight: answer at once rather than queue without bound.
            if let Some(len) = servfail(packet, out) {
                self.counters.record(Some(qtype), 2);
                let _ = self.sock.send_to(&out[..len], src);
            }
            return;
        };
        let query = packet.to_vec();
        let forwarder = self.forwarder.clone();
        let sock = self.reply_sock.clone();
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
            counters.record(Some(qtype), u16::from(reply.get(3).map_or(2, |b| b & 0x0f)));
            // The socket is blocking, but a UDP send only waits when the socket
            // buffer is full, and then only briefly.
            let _ = sock.send_to(&reply, src);
        });
    }
}

async fn serve_tcp(
    listener: TcpListener,
    handler: Arc<Handler>,
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
                let (handler, forwarder, counters) = (handler.clone(), forwarder.clone(), counters.clone());
                let idle = config.tcp_idle_timeout;
                conns.spawn(async move {
                    let _permit = permit;
                    if let Err(e) = serve_tcp_conn(stream, &handler, &forwarder, &counters, idle).await {
                        tracing::trace!(%peer, error = %e, "DNS/TCP connection ended");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_tcp_conn(
    mut stream: TcpStream,
    handler: &Handler,
    forwarder: &Forwarder,
    counters: &Counters,
    idle: Duration,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut rng = FastRng::new();
    let mut query = vec![0u8; MAX_MESSAGE];
    let mut out = vec![0u8; MAX_MESSAGE + 2];
    loop {
        let len = match tokio::time::timeout(idle, stream.read_u16()).await {
            Ok(r) => usize::from(r?),
            Err(_) => return Ok(()),
        };
        tokio::time::timeout(idle, stream.read_exact(&mut query[..len]))
            .await
            .map_err(|_| std::io::ErrorKind::TimedOut)??;
        let packet = &query[..len];
        let reply_len =
            match handler.handle(packet, &mut out[2..], Transport::Tcp, &mut rng, counters) {
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
                    counters.record(Some(qtype), u16::from(out[5] & 0x0f));
                    n
                }
            };
        // reply_len ≤ MAX_MESSAGE.
        out[..2].copy_from_slice(&(reply_len as u16).to_be_bytes());
        stream.write_all(&out[..reply_len + 2]).await?;
    }
}
