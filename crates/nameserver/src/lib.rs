#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod access;
mod checks;
mod durable;
mod error;
mod forward;
mod guard;
mod handler;
pub mod http;
mod metrics;
mod rate_limit;
mod resolv;
mod server;
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use access::{AllowEntry, Cidr, RESCAN_EVERY, parse_allow_list};
// The records the server answers from live in `dwara-records`; they are re-exported
// so users of the name server need one dependency.
pub use checks::{
    CheckConfig, CheckKind, DEFAULT_CHECK_INTERVAL, DEFAULT_CHECK_MISSES,
    DEFAULT_MAX_CONCURRENT_CHECKS, Probing,
};
pub use dwara_records::{
    Change, ChangeKind, DEFAULT_ORIGIN, Db, DbConfig, Domain, Entry, Health, HealthFailMode,
    MAX_SERVICE_NAME, Protocol, ServicePort, parse_port, reverse_name,
};
pub use error::{Error, Result};
pub use forward::{Forwarder, ForwarderConfig};
pub use guard::{AccessConfig, LocalNames};
pub use metrics::{Metrics, NameServerCollector};
pub use rate_limit::{DEFAULT_BUCKETS, DEFAULT_RATE_LIMIT_QPS, DEFAULT_SLIP, RateLimit};
pub use resolv::{is_own_address, load_resolv_conf, parse_resolv_conf, spawn_resolv_conf_watcher};
pub use server::{
    DEFAULT_MAX_TCP_CONNECTIONS, DEFAULT_TCP_IDLE_TIMEOUT, DEFAULT_TCP_MAX_LIFETIME, DnsServer,
    DnsServerConfig,
};

/// The per-packet work of the DNS server without sockets: for benchmarks, fuzzing
/// and embedding.
///
/// ```
/// use dwara_nameserver::{Db, DbConfig, Domain, QueryHandler};
///
/// let db = Db::new(DbConfig::new(Domain::new("weave.local").unwrap()));
/// db.add("c1", "10.32.0.1".parse().unwrap(), "web.weave.local").unwrap();
/// let mut handler = QueryHandler::new(&db);
/// // A query for web.weave.local A (id 0x1234, RD).
/// let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
/// q.extend_from_slice(b"\x03web\x05weave\x05local\x00\x00\x01\x00\x01");
/// let answer = handler.answer_udp(&q).unwrap();
/// assert_eq!(&answer[..2], &[0x12, 0x34]);
/// assert_eq!(&answer[answer.len() - 4..], &[10, 32, 0, 1]);
/// ```
#[derive(Debug)]
pub struct QueryHandler {
    handler: handler::Handler,
    state: handler::WorkerState,
    counters: metrics::Counters,
    out: Vec<u8>,
    /// With [`QueryHandler::with_access`]: the allow list and rate limit, and the
    /// flag that stops its interface watcher.
    guard: Option<(guard::Guard, Arc<std::sync::atomic::AtomicBool>)>,
}

impl Drop for QueryHandler {
    fn drop(&mut self) {
        if let Some((_, stop)) = &self.guard {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl QueryHandler {
    /// A handler answering from `db`'s records.
    pub fn new(db: &Db) -> Self {
        Self {
            handler: handler::Handler::new(db),
            state: handler::WorkerState::new(),
            counters: metrics::Counters::default(),
            out: vec![0; handler::MAX_MESSAGE],
            guard: None,
        }
    }

    /// A handler that also applies `access` (allow list, rate limit) to the client
    /// address given with each query, as the server does.
    pub fn with_access(db: &Db, access: &AccessConfig) -> Result<Self> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let guard =
            guard::Guard::start(access, &Metrics::new(), stop.clone()).map_err(|e| Error::Io {
                context: "starting the DNS allow-list watcher".into(),
                source: e,
            })?;
        let mut me = Self::new(db);
        me.guard = Some((guard, stop));
        Ok(me)
    }

    /// The response to `packet` from `client` as the UDP server would send it (after
    /// the allow list and rate limit of [`QueryHandler::with_access`], if given),
    /// or `None` when the server would forward the query or send nothing.
    pub fn answer_udp_from(&mut self, client: std::net::IpAddr, packet: &[u8]) -> Option<&[u8]> {
        let Some((guard, _)) = &self.guard else {
            return self.answer(packet, handler::Transport::Udp);
        };
        let mut worker = handler::Worker {
            handler: &self.handler,
            counters: &self.counters,
            transport: handler::Transport::Udp,
            state: &mut self.state,
        };
        match guard.handle(&mut worker, client, packet, &mut self.out) {
            handler::Outcome::Reply(n) => Some(&self.out[..n]),
            handler::Outcome::Forward { .. } | handler::Outcome::Drop => None,
        }
    }

    /// The response to `packet` as the UDP server would send it, or `None` when the
    /// server would forward the query or send nothing.
    pub fn answer_udp(&mut self, packet: &[u8]) -> Option<&[u8]> {
        self.answer(packet, handler::Transport::Udp)
    }

    /// The same over TCP (no truncation below 64 KiB).
    pub fn answer_tcp(&mut self, packet: &[u8]) -> Option<&[u8]> {
        self.answer(packet, handler::Transport::Tcp)
    }

    fn answer(&mut self, packet: &[u8], transport: handler::Transport) -> Option<&[u8]> {
        let mut worker = handler::Worker {
            handler: &self.handler,
            counters: &self.counters,
            transport,
            state: &mut self.state,
        };
        match worker.handle(packet, &mut self.out) {
            handler::Outcome::Reply(n) => Some(&self.out[..n]),
            handler::Outcome::Forward { .. } | handler::Outcome::Drop => None,
        }
    }
}

/// Where forwarded queries go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fallback {
    /// These servers, in order.
    Servers(Vec<SocketAddr>),
    /// The `nameserver` lines of this resolv.conf, re-read when it changes.
    ResolvConf(PathBuf),
}

/// Everything a [`NameServer`] needs.
#[derive(Debug, Clone)]
pub struct NameServerConfig {
    /// Domain, TTL and origin of the records database.
    pub db: DbConfig,
    /// The DNS listeners.
    pub dns: DnsServerConfig,
    /// The fallback servers.
    pub fallback: Fallback,
    /// Forwarding timeouts.
    pub forwarder: ForwarderConfig,
    /// How often a resolv.conf fallback is re-read.
    pub resolv_conf_poll: Duration,
    /// How long a tombstone is kept before it is forgotten (`--tombstone-grace`).
    pub tombstone_grace: Duration,
    /// Where registrations made over HTTP are stored to survive a restart; `None`:
    /// in memory only.
    pub data_dir: Option<PathBuf>,
    /// How the checks of `check=tcp` registrations run.
    pub checks: CheckConfig,
}

/// The default DNS listen address.
pub const DEFAULT_DNS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1053);
/// The default HTTP listen address (of the binary's listener that serves
/// [`NameServer::router`]).
pub const DEFAULT_HTTP_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 6784);
/// The default tombstone grace: ten minutes.
pub const DEFAULT_TOMBSTONE_GRACE: Duration = Duration::from_secs(600);

impl NameServerConfig {
    /// The defaults of `dwara serve` for `domain`: DNS on 127.0.0.1:1053, TTL 1 s,
    /// fallback servers from `/etc/resolv.conf`, tombstones kept ten minutes.
    pub fn new(domain: Domain) -> Self {
        Self {
            db: DbConfig::new(domain),
            dns: DnsServerConfig::new(DEFAULT_DNS_LISTEN),
            fallback: Fallback::ResolvConf(PathBuf::from("/etc/resolv.conf")),
            forwarder: ForwarderConfig::default(),
            resolv_conf_poll: Duration::from_secs(2),
            tombstone_grace: DEFAULT_TOMBSTONE_GRACE,
            data_dir: None,
            checks: CheckConfig::default(),
        }
    }
}

/// A running name server: database, DNS listeners, forwarder, resolv.conf watcher,
/// health checks and tombstone collector. Its HTTP API is a [`Router`](axum::Router) for the caller to
/// serve.
#[derive(Debug)]
pub struct NameServer {
    db: Arc<Db>,
    metrics: Arc<Metrics>,
    forwarder: Arc<Forwarder>,
    dns: DnsServer,
    durable: Option<Arc<durable::Durable>>,
    checks: checks::Checks,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl NameServer {
    /// Starts everything with an empty database.
    pub async fn start(config: NameServerConfig) -> Result<Self> {
        let db = Arc::new(Db::new(config.db.clone()));
        let metrics = Arc::new(Metrics::new());
        let checks = checks::Checks::new(db.clone(), config.checks.clone(), metrics.clone())?;
        // Loaded before anything listens, so DNS never answers without them.
        let durable = match &config.data_dir {
            Some(dir) => Some(Arc::new(durable::Durable::open(dir, &checks).await?)),
            None => {
                tracing::debug!("no data dir: registrations live in memory only");
                None
            }
        };
        let forwarder = Arc::new(Forwarder::new(Vec::new(), config.forwarder.clone()));
        let dns =
            DnsServer::start(config.dns.clone(), &db, forwarder.clone(), metrics.clone()).await?;
        let dns_addr = dns.local_addr();
        let mut tasks = Vec::new();
        match &config.fallback {
            Fallback::Servers(servers) => {
                forwarder.set_servers(
                    servers
                        .iter()
                        .copied()
                        .filter(|s| !is_own_address(*s, dns_addr))
                        .collect(),
                );
            }
            Fallback::ResolvConf(path) => {
                forwarder.set_servers(load_resolv_conf(path, dns_addr));
                tasks.push(spawn_resolv_conf_watcher(
                    path.clone(),
                    dns_addr,
                    forwarder.clone(),
                    config.resolv_conf_poll,
                ));
            }
        }
        tracing::debug!(servers = ?forwarder.servers(), "fallback servers");
        tasks.push(spawn_tombstone_gc(db.clone(), config.tombstone_grace));
        Ok(Self {
            db,
            metrics,
            forwarder,
            dns,
            durable,
            checks,
            tasks,
        })
    }

    /// With a data dir: how many times it has been opened, this start included
    /// ([`dwara_store::Store::incarnation`]); `None` when registrations live in
    /// memory only.
    pub fn incarnation(&self) -> Option<u64> {
        self.durable.as_ref().map(|d| d.incarnation())
    }

    /// The data dir registrations are stored in; `None` when they live in memory
    /// only.
    pub fn data_dir(&self) -> Option<&std::path::Path> {
        self.durable.as_ref().map(|d| d.dir())
    }

    /// The records database.
    pub fn db(&self) -> &Arc<Db> {
        &self.db
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The forwarder (its server list can be changed at run time).
    pub fn forwarder(&self) -> &Arc<Forwarder> {
        &self.forwarder
    }

    /// The DNS address (UDP and TCP).
    pub fn dns_addr(&self) -> SocketAddr {
        self.dns.local_addr()
    }

    /// The DNS clients allowed right now besides loopback (see
    /// [`DnsServer::allowed`]).
    pub fn dns_allowed(&self) -> Vec<Cidr> {
        self.dns.allowed()
    }

    /// The HTTP API's routes (see [`http`]), for the caller's listener.
    pub fn router(&self) -> axum::Router {
        http::router(http::ApiState {
            db: self.db.clone(),
            metrics: self.metrics.clone(),
            durable: self.durable.clone(),
            checks: self.checks.clone(),
        })
    }

    /// Registers the name server's metrics (see [`NameServerCollector`]).
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(
            NameServerCollector::new(self.metrics.clone(), self.db.clone())
                .with_durable(self.durable.clone()),
        ));
    }

    /// Stops the DNS listeners, the health checks and the background tasks.
    pub async fn shutdown(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.checks.stop_all();
        self.dns.shutdown().await;
        tracing::info!("name server stopped");
    }
}

/// Forgets tombstones older than `grace`, checking a few times per grace period
/// (at least every minute, at most every second): a deleted entry is gone from the
/// database between `grace` and `grace` + one check after its delete.
fn spawn_tombstone_gc(db: Arc<Db>, grace: Duration) -> tokio::task::JoinHandle<()> {
    let every = (grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let forgotten = db.gc_tombstones(grace);
            if forgotten > 0 {
                tracing::debug!(forgotten, grace = ?grace, "tombstones collected");
            }
        }
    })
}
