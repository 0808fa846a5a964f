//! The L4 workers: threads that each run a tokio `current_thread` runtime and own
//! one listening socket per listen address, nginx/Envoy style.
//!
//! Every listen address is bound once per worker with `SO_REUSEPORT`, so the kernel
//! spreads incoming connections over the workers' sockets and a connection is
//! accepted, picked, connected and forwarded on one thread, with no cross-thread
//! wake-up. Before binding, an address is probed with a plain bind (no
//! `SO_REUSEPORT`): if anything listens there already, even another process that
//! also uses `SO_REUSEPORT`, the bind fails as it would without it. Where
//! `SO_REUSEPORT` cannot be set, the address gets one socket, accepted on the first
//! worker, which hands its connections to the workers in turn.
//!
//! The listening sockets have `TCP_NODELAY` set, which accepted sockets inherit.
//! Each worker keeps one timer pending (a sleep of half a second, over and over),
//! so that arming a connection's connect timeout does not wake its driver.
//! The workers start with the first listener and stop when [`Workers`] is dropped:
//! their runtimes then drop whatever connections are still open.

use std::io;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::forward::{self, Target};
use crate::reverse;

/// Pending connections per listening socket.
const BACKLOG: i32 = 1024;

/// The number of L4 workers when none is configured: one per core.
pub(crate) fn default_count() -> NonZeroUsize {
    std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

/// The counters of one worker, on a cache line of its own (each worker writes
/// only its own).
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct WorkerStats {
    /// Client connections this worker accepted (or was handed) and forwarded.
    pub(crate) accepted: AtomicU64,
}

/// One running worker thread.
#[derive(Debug)]
struct Worker {
    handle: Handle,
    stats: Arc<WorkerStats>,
    /// Dropping it ends the thread's runtime.
    _stop: oneshot::Sender<()>,
}

/// The running workers.
#[derive(Debug)]
pub(crate) struct Workers {
    workers: Arc<[Worker]>,
}

/// The sockets of one listen address, registered with their workers' runtimes.
#[derive(Debug)]
pub(crate) enum Bound {
    /// One socket per worker (`SO_REUSEPORT`), in worker order.
    PerWorker(Vec<TcpListener>),
    /// One socket, registered with the first worker.
    Shared(TcpListener),
}

impl Workers {
    /// Starts one thread per entry of `stats`, each running a `current_thread`
    /// runtime.
    pub(crate) async fn start(stats: &[Arc<WorkerStats>]) -> io::Result<Self> {
        let mut workers = Vec::with_capacity(stats.len());
        for (i, stats) in stats.iter().enumerate() {
            let (stop, stopped) = oneshot::channel::<()>();
            let (ready, started) = oneshot::channel();
            std::thread::Builder::new()
                .name(format!("dwara-l4-{i}"))
                .spawn(move || {
                    crate::outbox::enable();
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .on_thread_park(crate::outbox::send_all)
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(rt.handle().clone()));
                    rt.block_on(async {
                        tokio::select! {
                            _ = stopped => {}
                            () = keep_a_timer() => {}
                        }
                    });
                    // What the last turn left is sent before the runtime drops the
                    // connections.
                    crate::outbox::send_all();
                })?;
            let handle = started
                .await
                .map_err(|_| io::Error::other("an L4 worker thread ended while starting"))??;
            workers.push(Worker {
                handle,
                stats: stats.clone(),
                _stop: stop,
            });
        }
        info!(workers = workers.len(), "L4 workers started");
        Ok(Self {
            workers: workers.into(),
        })
    }

    /// Binds `addr` for every worker (or once, without `SO_REUSEPORT`). Nothing is
    /// accepted until [`Workers::serve`].
    pub(crate) fn bind(&self, addr: SocketAddr) -> io::Result<Bound> {
        if addr.port() != 0 {
            // Fails if anything listens there, SO_REUSEPORT or not.
            let probe = socket(addr)?;
            probe.bind(&addr.into())?;
        }
        let first = socket(addr)?;
        if let Err(e) = first.set_reuse_port(true) {
            warn!(listen = %addr, error = %e, "SO_REUSEPORT unavailable: one listening socket, its connections handed to the L4 workers in turn");
            let listener = self.listen(&self.workers[0], first, addr)?;
            return Ok(Bound::Shared(listener));
        }
        let first = self.listen(&self.workers[0], first, addr)?;
        // With port 0 the first socket chose the port the others join.
        let addr = first.local_addr()?;
        let mut listeners = vec![first];
        for worker in &self.workers[1..] {
            let s = socket(addr)?;
            s.set_reuse_port(true)?;
            listeners.push(self.listen(worker, s, addr)?);
        }
        Ok(Bound::PerWorker(listeners))
    }

    fn listen(&self, worker: &Worker, s: Socket, addr: SocketAddr) -> io::Result<TcpListener> {
        s.bind(&addr.into())?;
        s.listen(BACKLOG)?;
        let _runtime = worker.handle.enter();
        TcpListener::from_std(s.into())
    }

    /// Starts accepting on `bound`, each socket on its worker; connections go to
    /// `target` (re-read per connection) and are tracked by `tracker`.
    pub(crate) fn serve(
        &self,
        bound: Bound,
        target: &Arc<ArcSwap<Target>>,
        tracker: &TaskTracker,
    ) -> Vec<JoinHandle<()>> {
        match bound {
            Bound::PerWorker(listeners) => listeners
                .into_iter()
                .zip(self.workers.iter())
                .map(|(listener, worker)| {
                    let run = RunOn::Here(worker.stats.clone());
                    worker
                        .handle
                        .spawn(accept_loop(listener, target.clone(), tracker.clone(), run))
                })
                .collect(),
            Bound::Shared(listener) => {
                let run = RunOn::InTurn(self.workers.clone());
                vec![self.workers[0].handle.spawn(accept_loop(
                    listener,
                    target.clone(),
                    tracker.clone(),
                    run,
                ))]
            }
        }
    }
}

/// Keeps one timer pending on the worker, due within a second. tokio wakes its
/// driver (an `eventfd` write and one more event) whenever a new timer is due
/// before every pending one; with this one pending, a connect timeout (2 s by
/// default) never is, so starting one costs no system call.
async fn keep_a_timer() {
    loop {
        tokio::time::sleep(KEEP_TIMER).await;
    }
}

const KEEP_TIMER: Duration = Duration::from_millis(500);

/// A fresh socket for `addr`: non-blocking, `SO_REUSEADDR` (a restart binds despite
/// connections in `TIME_WAIT`), `TCP_NODELAY` (inherited by accepted sockets).
fn socket(addr: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_tcp_nodelay(true)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Where an accepting task runs its connections.
enum RunOn {
    /// On its own worker.
    Here(Arc<WorkerStats>),
    /// On every worker in turn (the one-socket fallback).
    InTurn(Arc<[Worker]>),
}

async fn accept_loop(
    listener: TcpListener,
    target: Arc<ArcSwap<Target>>,
    tracker: TaskTracker,
    run: RunOn,
) {
    let mut turn = 0usize;
    let current = target;
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                let target = current.load_full();
                match &run {
                    RunOn::Here(stats) => {
                        stats.accepted.fetch_add(1, Ordering::Relaxed);
                        spawn_connection(&tracker, socket, peer, target, current.clone());
                    }
                    RunOn::InTurn(workers) => {
                        let worker = &workers[turn % workers.len()];
                        turn = turn.wrapping_add(1);
                        // Registered with the worker that runs it.
                        let socket = match socket.into_std() {
                            Ok(s) => s,
                            Err(e) => {
                                warn!(error = %e, "cannot hand a connection to a worker");
                                continue;
                            }
                        };
                        worker.stats.accepted.fetch_add(1, Ordering::Relaxed);
                        let (current, spawner) = (current.clone(), tracker.clone());
                        tracker.spawn_on(
                            async move {
                                match TcpStream::from_std(socket) {
                                    Ok(s) => spawn_connection(&spawner, s, peer, target, current),
                                    Err(e) => warn!(error = %e, "cannot register a connection"),
                                }
                            },
                            &worker.handle,
                        );
                    }
                }
            }
            Err(e) => {
                // EMFILE and friends: back off a little instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Spawns, on the current runtime, the task that serves one accepted connection
/// by its upstream's protocol: bytes (L4) or HTTP. Each protocol's future is a
/// task of its own type: tokio moves a task's whole future as it spawns it and
/// as it ends, and one type for both would be as large as the larger of the two.
fn spawn_connection(
    tracker: &TaskTracker,
    socket: TcpStream,
    peer: SocketAddr,
    target: Arc<Target>,
    current: Arc<ArcSwap<Target>>,
) {
    if target.http.is_some() {
        tracker.spawn(reverse::serve(socket, peer, target, current));
    } else {
        tracker.spawn(forward::handle(socket, peer, target));
    }
}
