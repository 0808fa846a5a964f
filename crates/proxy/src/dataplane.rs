//! The running upstreams: configuration generations, reload, listeners and status.
//!
//! The running configuration is an immutable [`Generation`] behind an atomic pointer.
//! [`Dataplane::apply`] carries out a reload in three steps: [`crate::plan()`] (pure:
//! what to keep, build, bind, stop), *build* (discovery sources and load balancers,
//! then bind every new listen address; any failure rejects the reload and changes
//! nothing), *commit* (listeners whose address stays keep their socket and are
//! pointed at the new upstream, removed ones stop accepting, the generation is
//! swapped and [`DiscoveryTasks::respawn`] restarts discovery). Connections in flight
//! hold their own snapshot of their upstream and are never cut by a reload.
//!
//! Connections are accepted and forwarded by the L4 workers ([`crate::workers`]):
//! threads of their own, each with a `current_thread` runtime and its own socket per
//! listen address. They start with the first listener; discovery, reload and status
//! run on the caller's runtime.
//!
//! Across reloads an upstream keeps its load balancer (endpoints, in-flight counts,
//! ejections) while its name, policy, ejection settings and discovery target stay the
//! same, and its counters while its name does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use dwara_discovery::{
    DiscoverySnapshot, DiscoverySource, DiscoveryStats, DiscoveryTasks, UpstreamDiscovery,
};
use dwara_discovery_dns::{DnsDiscoveryConfig, DnsSource};
use dwara_lb::UpstreamLb;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::Error;
use crate::config::UpstreamConfig;
use crate::forward::Target;
use crate::plan::{LbPlan, ListenerPlan, UpstreamPlan, plan};
use crate::workers::{self, WorkerStats, Workers};

/// One upstream of a generation.
#[derive(Debug)]
pub struct Upstream {
    /// Its configuration.
    pub config: UpstreamConfig,
    pub(crate) target: Arc<Target>,
    /// Its discovery (load balancer, source, policy, statistics); `None` for an
    /// HTTP upstream with `address:`, whose connections resolve through a DNS cache
    /// instead.
    pub discovery: Option<UpstreamDiscovery>,
}

/// One immutable configuration generation.
#[derive(Debug, Default)]
pub struct Generation {
    /// Increases by one with every applied configuration (the first is 1).
    pub number: u64,
    /// When it was applied.
    pub loaded_at: Option<SystemTime>,
    /// Its upstreams, in configuration order.
    pub upstreams: Vec<Arc<Upstream>>,
}

#[derive(Debug)]
struct Listener {
    target: Arc<ArcSwap<Target>>,
    /// The accepting tasks, one per worker socket.
    accepts: Vec<JoinHandle<()>>,
}

impl Listener {
    /// Stops accepting and waits until the sockets are closed.
    async fn stop(self) {
        for accept in &self.accepts {
            accept.abort();
        }
        for accept in self.accepts {
            // Cancelled, or its worker has stopped: either way the socket is closed.
            let _ = accept.await;
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    tasks: DiscoveryTasks,
    listeners: HashMap<SocketAddr, Listener>,
    /// Started with the first listener.
    workers: Option<Workers>,
}

/// Sources that serve some `dns_discovery` blocks better than polling DNS, e.g. a
/// name server in the same process that can hand over its records directly (see
/// [`Dataplane::set_local_sources`]). The dataplane never knows what they are: the
/// program that composes it does.
pub trait LocalSources: Send + Sync + std::fmt::Debug + 'static {
    /// The source for an upstream with this (validated) block, or `None` to resolve
    /// it over DNS as usual.
    fn source(&self, upstream: &str, dns: &DnsDiscoveryConfig) -> Option<Arc<dyn DiscoverySource>>;
}

/// The running upstreams.
#[derive(Debug)]
pub struct Dataplane {
    current: ArcSwap<Generation>,
    local: OnceLock<Arc<dyn LocalSources>>,
    inner: tokio::sync::Mutex<Inner>,
    connections: TaskTracker,
    worker_stats: Vec<Arc<WorkerStats>>,
    /// Cancelled at shutdown: HTTP client connections finish their request and close.
    http_shutdown: CancellationToken,
}

impl Dataplane {
    /// An empty dataplane (generation 0, no upstreams) with one L4 worker per core.
    pub fn new() -> Arc<Self> {
        Self::with_l4_workers(workers::default_count())
    }

    /// An empty dataplane whose connections are accepted and forwarded by `n`
    /// worker threads (started with the first listener).
    pub fn with_l4_workers(n: NonZeroUsize) -> Arc<Self> {
        Arc::new(Self {
            current: ArcSwap::from_pointee(Generation::default()),
            local: OnceLock::new(),
            inner: tokio::sync::Mutex::new(Inner::default()),
            connections: TaskTracker::new(),
            worker_stats: (0..n.get()).map(|_| Arc::default()).collect(),
            http_shutdown: CancellationToken::new(),
        })
    }

    /// Asks `local` first for every upstream's source, from the next
    /// [`Dataplane::apply`] on; upstreams it declines resolve over DNS. Set once:
    /// returns `false` (and changes nothing) when already set.
    pub fn set_local_sources(&self, local: Arc<dyn LocalSources>) -> bool {
        self.local.set(local).is_ok()
    }

    /// The number of L4 worker threads.
    pub fn l4_workers(&self) -> usize {
        self.worker_stats.len()
    }

    /// The running generation.
    pub fn generation(&self) -> Arc<Generation> {
        self.current.load_full()
    }
    /// Builds upstream `i` of a plan: its load balancer (kept or new), its HTTP side,
    /// its target and its discovery.
    fn build_upstream(
        &self,
        i: usize,
        p: &UpstreamPlan,
        old: &Generation,
    ) -> Result<Arc<Upstream>, Error> {
        let up = &p.config;
        let lb = match p.lb {
            LbPlan::Keep(prev) => old.upstreams[prev].target.lb.clone(),
            LbPlan::New(reason) => {
                if p.counters_from.is_some() {
                    info!(upstream = %up.name, ?reason, "new load balancer: the previous endpoints are dropped");
                }
                let mut lb = UpstreamLb::builder(up.policy);
                if let Some(e) = up.ejection {
                    lb = lb.ejection(e.to_lb());
                }
                Arc::new(lb.build())
            }
        };
        let prev = p.counters_from.map(|i| &old.upstreams[i]);
        let conn_stats = prev.map_or_else(Default::default, |p| p.target.stats.clone());
        let disc_stats = prev.map_or_else(
            || Arc::new(DiscoveryStats::default()),
            |p| {
                p.discovery
                    .as_ref()
                    .map_or_else(Default::default, |d| d.stats.clone())
            },
        );
        let name: Arc<str> = up.name.as_str().into();
        // Asked first: an upstream fed by a local source needs no cache for SRV
        // targets (the source gives addresses).
        let local = up
            .dns_discovery
            .as_ref()
            .and_then(|dns| self.local.get().and_then(|l| l.source(&up.name, dns)));
        let pushed = local.is_some();
        let http = crate::build::http_upstream(i, up, &lb, p, old, &self.http_shutdown, pushed)?;
        let target = Arc::new(Target {
            name: name.clone(),
            policy: up.policy,
            lb: lb.clone(),
            stats: conn_stats,
            connect_timeout: Duration::from_millis(up.connect_timeout_ms),
            http,
        });
        let discovery = match &up.dns_discovery {
            Some(dns) => {
                let key = format!("upstreams[{i}].dns_discovery");
                let source: Arc<dyn DiscoverySource> = match local {
                    Some(source) => source,
                    None => {
                        let mut source = DnsSource::new(dns)
                            .map_err(|source| Error::Discovery { key, source })?;
                        if let Some(targets) =
                            target.http.as_ref().and_then(|h| h.dial.srv_targets())
                        {
                            source = source.with_target_resolver(targets.clone());
                        }
                        Arc::new(source)
                    }
                };
                Some(UpstreamDiscovery {
                    name,
                    lb,
                    source,
                    policy: dns.refresh_policy(),
                    stats: disc_stats,
                })
            }
            // Validation lets only an HTTP upstream with `address:` through
            // without a DNS block (the other blocks are stubs).
            None if up.address.is_some() => None,
            None => {
                return Err(Error::InvalidConfig {
                    key: format!("upstreams[{i}]"),
                    message: "needs a discovery block (dns_discovery)".into(),
                });
            }
        };
        Ok(Arc::new(Upstream {
            config: up.clone(),
            target,
            discovery,
        }))
    }

    /// Applies validated upstreams (see [`crate::validate_upstreams`]) as the next
    /// generation and returns its number. On any error nothing has changed.
    pub async fn apply(&self, config: &[UpstreamConfig]) -> Result<u64, Error> {
        let mut inner = self.inner.lock().await;
        let old = self.current.load_full();
        let number = old.number + 1;
        let old_configs: Vec<UpstreamConfig> =
            old.upstreams.iter().map(|u| u.config.clone()).collect();
        let listening = inner.listeners.keys().copied().collect();
        let plan = plan(&old_configs, &listening, config);

        // Build: sources and load balancers.
        let mut upstreams = Vec::with_capacity(plan.upstreams.len());
        for (i, p) in plan.upstreams.iter().enumerate() {
            upstreams.push(self.build_upstream(i, p, &old)?);
        }

        // Bind every new address before changing anything.
        let binds = plan.upstreams.iter().zip(&upstreams);
        let binds: Vec<_> = binds
            .filter(|(p, _)| p.listener == ListenerPlan::Bind)
            .map(|(_, up)| up.clone())
            .collect();
        if !binds.is_empty() && inner.workers.is_none() {
            let started = Workers::start(&self.worker_stats)
                .await
                .map_err(Error::Workers)?;
            inner.workers = Some(started);
        }
        let mut bound = Vec::new();
        if let Some(workers) = &inner.workers {
            for up in binds {
                let addr = up.config.listen;
                let sockets = workers.bind(addr).map_err(|source| Error::Bind {
                    upstream: up.config.name.clone(),
                    addr,
                    source,
                })?;
                bound.push((up, sockets));
            }
        }

        // Commit: stop removed listeners, retarget kept ones, start new ones.
        for addr in &plan.stop {
            if let Some(listener) = inner.listeners.remove(addr) {
                listener.stop().await;
                info!(listen = %addr, "listener closed: upstream removed");
            }
        }
        for up in &upstreams {
            if let Some(listener) = inner.listeners.get(&up.config.listen) {
                listener.target.store(up.target.clone());
            }
        }
        let mut started = Vec::new();
        if let Some(workers) = &inner.workers {
            for (up, sockets) in bound {
                let target = Arc::new(ArcSwap::new(up.target.clone()));
                let accepts = workers.serve(sockets, &target, &self.connections);
                info!(upstream = %up.config.name, listen = %up.config.listen, policy = %up.config.policy, sockets = accepts.len(), "listening");
                started.push((up.config.listen, Listener { target, accepts }));
            }
        }
        inner.listeners.extend(started);
        let snapshot = DiscoverySnapshot {
            generation: number,
            upstreams: upstreams
                .iter()
                .filter_map(|u| u.discovery.clone())
                .collect(),
        };
        self.current.store(Arc::new(Generation {
            number,
            loaded_at: Some(SystemTime::now()),
            upstreams,
        }));
        inner.tasks.respawn(&snapshot);
        Ok(number)
    }

    /// The addresses with a listener accepting.
    pub async fn listening(&self) -> Vec<SocketAddr> {
        let mut addrs: Vec<SocketAddr> =
            self.inner.lock().await.listeners.keys().copied().collect();
        addrs.sort_unstable();
        addrs
    }

    /// Stops accepting, stops discovery, and waits up to `drain` for connections in
    /// flight to finish.
    pub async fn shutdown(&self, drain: Duration) {
        let mut inner = self.inner.lock().await;
        for (_, listener) in inner.listeners.drain() {
            listener.stop().await;
        }
        inner.tasks.shutdown().await;
        self.http_shutdown.cancel();
        self.connections.close();
        let open = self.connections.len();
        if open > 0 {
            info!(connections = open, deadline = ?drain, "draining connections");
        }
        if tokio::time::timeout(drain, self.connections.wait())
            .await
            .is_err()
        {
            warn!(
                connections = self.connections.len(),
                "drain deadline passed; closing the remaining connections"
            );
        }
        // Their runtimes drop what is still open.
        inner.workers = None;
    }

    /// `GET /upstreams`: every upstream's endpoints, generation and last resolution.
    pub fn status_json(&self) -> serde_json::Value {
        let generation = self.generation();
        let upstreams: Vec<_> = generation
            .upstreams
            .iter()
            .map(|up| {
                let lb = up.target.lb.stats();
                let stats = &up.target.stats;
                let endpoints: Vec<_> = lb
                    .endpoints
                    .iter()
                    .map(|e| {
                        json!({
                            "addr": e.endpoint.addr.to_string(),
                            "weight": e.endpoint.weight,
                            "priority": e.endpoint.priority,
                            "in_flight": e.in_flight,
                            "ejected": e.ejected,
                        })
                    })
                    .collect();
                json!({
                    "name": up.config.name,
                    "listen": up.config.listen.to_string(),
                    "policy": up.config.policy.to_string(),
                    "ejection": up.config.ejection,
                    "generation": generation.number,
                    "protocol": up.config.protocol,
                    "source": up.discovery.as_ref().map_or_else(
                        || format!("address {}", up.config.address.as_deref().unwrap_or_default()),
                        |d| d.source.describe(),
                    ),
                    "endpoints": endpoints,
                    "draining": lb.draining,
                    "last_resolution": up.discovery.as_ref().and_then(|d| d.stats.last()),
                    "resolutions": up.discovery.as_ref().map(|d| d.stats.counters()),
                    "http": up.target.http.as_ref().map(|h| crate::build::status(h)),
                    "connections": {
                        "accepted": stats.accepted.load(Ordering::Relaxed),
                        "active": stats.active.load(Ordering::Relaxed),
                        "no_endpoints": stats.no_endpoints.load(Ordering::Relaxed),
                        "connect_failures": stats.connect_failures.load(Ordering::Relaxed),
                        "failed": stats.failed.load(Ordering::Relaxed),
                        "bytes_to_upstream": stats.bytes_to_upstream.load(Ordering::Relaxed),
                        "bytes_to_client": stats.bytes_to_client.load(Ordering::Relaxed),
                    },
                })
            })
            .collect();
        json!({
            "generation": generation.number,
            "loaded_at_unix_ms": generation.loaded_at.and_then(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64)
            }),
            "upstreams": upstreams,
            "l4_workers": self
                .worker_stats
                .iter()
                .map(|w| json!({ "accepted": w.accepted.load(Ordering::Relaxed) }))
                .collect::<Vec<_>>(),
        })
    }

    /// Connections accepted by each L4 worker, in worker order.
    pub(crate) fn worker_accepted(&self) -> impl Iterator<Item = u64> + '_ {
        self.worker_stats
            .iter()
            .map(|w| w.accepted.load(Ordering::Relaxed))
    }
}
