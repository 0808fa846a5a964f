//! The upstreams half of `dwara serve`: configuration snapshots, reloads, listeners
//! and their status.
//!
//! The running configuration is an immutable [`Generation`] behind an atomic pointer.
//! A reload parses the file; if it is invalid nothing changes. If it is valid, new
//! listen addresses are bound first (a bind failure rejects the reload, again
//! changing nothing), then listeners whose address stays keep their socket and are
//! pointed at the new upstream, removed ones stop accepting, the generation is
//! swapped and [`DiscoveryTasks::respawn`] restarts discovery. Connections in flight
//! hold their own snapshot of their upstream and are never cut by a reload.
//!
//! Across reloads an upstream keeps its load balancer (endpoints, in-flight counts,
//! ejections) while its name, policy and ejection settings stay the same, and its
//! counters while its name does.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use arc_swap::ArcSwap;
use dwara_discovery::{DiscoverySnapshot, DiscoveryStats, DiscoveryTasks, UpstreamDiscovery};
use dwara_discovery_dns::DnsSource;
use dwara_lb::UpstreamLb;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::proxy::{self, Target};
use dwara::config::{Config, UpstreamConfig};

/// One upstream of a generation.
#[derive(Debug)]
pub(crate) struct Upstream {
    pub(crate) config: UpstreamConfig,
    pub(crate) target: Arc<Target>,
    pub(crate) discovery: UpstreamDiscovery,
}

/// One immutable configuration generation.
#[derive(Debug, Default)]
pub(crate) struct Generation {
    pub(crate) number: u64,
    pub(crate) loaded_at: Option<SystemTime>,
    pub(crate) upstreams: Vec<Arc<Upstream>>,
}

struct Listener {
    target: Arc<ArcSwap<Target>>,
    accept: AbortHandle,
}

#[derive(Default)]
struct Inner {
    tasks: DiscoveryTasks,
    listeners: HashMap<SocketAddr, Listener>,
}

/// The running upstreams.
pub(crate) struct Dataplane {
    config_path: Option<PathBuf>,
    current: ArcSwap<Generation>,
    inner: tokio::sync::Mutex<Inner>,
    connections: TaskTracker,
}

impl Dataplane {
    /// An empty dataplane; `config_path` is what reloads read.
    pub(crate) fn new(config_path: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            config_path,
            current: ArcSwap::from_pointee(Generation::default()),
            inner: tokio::sync::Mutex::new(Inner::default()),
            connections: TaskTracker::new(),
        })
    }

    /// The running generation.
    pub(crate) fn generation(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Re-reads the config file and applies it; on any error the old generation keeps
    /// running and the error is returned (and logged).
    pub(crate) async fn reload(self: &Arc<Self>) -> anyhow::Result<u64> {
        let Some(path) = &self.config_path else {
            anyhow::bail!("no --config file to reload");
        };
        let result = match Config::load(path) {
            Ok(config) => self.apply(&config).await,
            Err(e) => Err(e),
        };
        match &result {
            Ok(n) => info!(generation = n, path = %path.display(), "configuration reloaded"),
            Err(e) => {
                error!(error = %format!("{e:#}"), path = %path.display(), "reload rejected; the previous configuration keeps running")
            }
        }
        result
    }

    /// Applies a validated configuration as the next generation.
    pub(crate) async fn apply(self: &Arc<Self>, config: &Config) -> anyhow::Result<u64> {
        let mut inner = self.inner.lock().await;
        let old = self.current.load_full();
        let number = old.number + 1;

        let mut upstreams = Vec::with_capacity(config.upstreams.len());
        for up in &config.upstreams {
            let prev = old.upstreams.iter().find(|p| p.config.name == up.name);
            let lb = prev
                .filter(|p| p.config.policy == up.policy && p.config.ejection == up.ejection)
                .map(|p| p.target.lb.clone())
                .unwrap_or_else(|| {
                    let mut lb = UpstreamLb::builder(up.policy);
                    if let Some(e) = up.ejection {
                        lb = lb.ejection(e.to_lb());
                    }
                    Arc::new(lb.build())
                });
            let conn_stats = prev.map_or_else(Default::default, |p| p.target.stats.clone());
            let disc_stats = prev.map_or_else(
                || Arc::new(DiscoveryStats::default()),
                |p| p.discovery.stats.clone(),
            );
            // Validation guaranteed a dns_discovery block (the others are stubs that
            // fail validation).
            let dns = up
                .dns_discovery
                .as_ref()
                .with_context(|| format!("upstream {:?}: no dns_discovery block", up.name))?;
            let source = DnsSource::new(dns)
                .with_context(|| format!("upstream {:?}: discovery", up.name))?;
            let name: Arc<str> = up.name.as_str().into();
            let target = Arc::new(Target {
                name: name.clone(),
                policy: up.policy,
                lb: lb.clone(),
                stats: conn_stats,
                connect_timeout: Duration::from_millis(up.connect_timeout_ms),
            });
            let discovery = UpstreamDiscovery {
                name,
                lb,
                source: Arc::new(source),
                policy: dns.refresh_policy(),
                stats: disc_stats,
            };
            upstreams.push(Arc::new(Upstream {
                config: up.clone(),
                target,
                discovery,
            }));
        }

        // Bind every new address before changing anything.
        let mut bound = Vec::new();
        for up in &upstreams {
            let addr = up.config.listen;
            if !inner.listeners.contains_key(&addr) {
                let listener = TcpListener::bind(addr).await.with_context(|| {
                    format!("upstream {:?}: cannot listen on {addr}", up.config.name)
                })?;
                bound.push((up.clone(), listener));
            }
        }

        // Commit: retarget kept listeners, stop removed ones, start new ones.
        inner.listeners.retain(|addr, listener| {
            match upstreams.iter().find(|u| u.config.listen == *addr) {
                Some(up) => {
                    listener.target.store(up.target.clone());
                    true
                }
                None => {
                    listener.accept.abort();
                    info!(listen = %addr, "listener closed: upstream removed");
                    false
                }
            }
        });
        for (up, listener) in bound {
            let target = Arc::new(ArcSwap::new(up.target.clone()));
            let accept = tokio::spawn(accept_loop(
                listener,
                target.clone(),
                self.connections.clone(),
            ))
            .abort_handle();
            info!(upstream = %up.config.name, listen = %up.config.listen, policy = %up.config.policy, "listening");
            inner
                .listeners
                .insert(up.config.listen, Listener { target, accept });
        }
        let snapshot = DiscoverySnapshot {
            generation: number,
            upstreams: upstreams.iter().map(|u| u.discovery.clone()).collect(),
        };
        self.current.store(Arc::new(Generation {
            number,
            loaded_at: Some(SystemTime::now()),
            upstreams,
        }));
        inner.tasks.respawn(&snapshot);
        Ok(number)
    }

    /// Stops accepting, stops discovery, and waits up to `drain` for connections in
    /// flight to finish.
    pub(crate) async fn shutdown(&self, drain: Duration) {
        let mut inner = self.inner.lock().await;
        for (_, listener) in inner.listeners.drain() {
            listener.accept.abort();
        }
        inner.tasks.shutdown().await;
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
    }

    /// `GET /upstreams`: every upstream's endpoints, generation and last resolution.
    pub(crate) fn status_json(&self) -> serde_json::Value {
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
                    "source": up.discovery.source.describe(),
                    "endpoints": endpoints,
                    "draining": lb.draining,
                    "last_resolution": up.discovery.stats.last(),
                    "resolutions": up.discovery.stats.counters(),
                    "connections": {
                        "accepted": stats.accepted.load(Ordering::Relaxed),
                        "active": stats.active.load(Ordering::Relaxed),
                        "no_endpoints": stats.no_endpoints.load(Ordering::Relaxed),
                        "connect_failures": stats.connect_failures.load(Ordering::Relaxed),
                        "failed": stats.failed.load(Ordering::Relaxed),
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
        })
    }

    /// Prometheus text for the upstreams.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let generation = self.generation();
        let _ = writeln!(out, "# TYPE dwara_config_generation gauge");
        let _ = writeln!(out, "dwara_config_generation {}", generation.number);
        type Row<'a> = (&'a str, &'a str, fn(&Upstream) -> u64);
        let rows: [Row<'_>; 9] = [
            ("dwara_upstream_connections_total", "counter", |u| {
                u.target.stats.accepted.load(Ordering::Relaxed)
            }),
            ("dwara_upstream_connections_active", "gauge", |u| {
                u.target.stats.active.load(Ordering::Relaxed)
            }),
            ("dwara_upstream_no_endpoints_total", "counter", |u| {
                u.target.stats.no_endpoints.load(Ordering::Relaxed)
            }),
            ("dwara_upstream_connect_failures_total", "counter", |u| {
                u.target.stats.connect_failures.load(Ordering::Relaxed)
            }),
            ("dwara_upstream_bytes_to_upstream_total", "counter", |u| {
                u.target.stats.bytes_to_upstream.load(Ordering::Relaxed)
            }),
            ("dwara_upstream_bytes_to_client_total", "counter", |u| {
                u.target.stats.bytes_to_client.load(Ordering::Relaxed)
            }),
            ("dwara_upstream_endpoints", "gauge", |u| {
                u.target.lb.endpoints().len() as u64
            }),
            ("dwara_upstream_endpoint_updates_total", "counter", |u| {
                u.discovery.stats.counters().updates
            }),
            ("dwara_upstream_endpoints_ejected", "gauge", |u| {
                let stats = u.target.lb.stats();
                stats.endpoints.iter().filter(|e| e.ejected).count() as u64
            }),
        ];
        for (name, kind, get) in rows {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for up in &generation.upstreams {
                let _ = writeln!(out, "{name}{{upstream=\"{}\"}} {}", up.config.name, get(up));
            }
        }
        let _ = writeln!(out, "# TYPE dwara_upstream_picks_total counter");
        for up in &generation.upstreams {
            for (addr, n) in up.target.stats.picks.lock().iter() {
                let _ = writeln!(
                    out,
                    "dwara_upstream_picks_total{{upstream=\"{}\",endpoint=\"{addr}\"}} {n}",
                    up.config.name
                );
            }
        }
        let _ = writeln!(out, "# TYPE dwara_discovery_resolutions_total counter");
        for up in &generation.upstreams {
            let c = up.discovery.stats.counters();
            for (outcome, n) in [
                ("ok", c.answers - c.empty_answers),
                ("empty", c.empty_answers),
                ("failure", c.failures),
            ] {
                let _ = writeln!(
                    out,
                    "dwara_discovery_resolutions_total{{upstream=\"{}\",outcome=\"{outcome}\"}} {n}",
                    up.config.name
                );
            }
        }
    }
}

async fn accept_loop(listener: TcpListener, target: Arc<ArcSwap<Target>>, tracker: TaskTracker) {
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                let target = target.load_full();
                tracker.spawn(proxy::handle(socket, peer, target));
            }
            Err(e) => {
                // EMFILE and friends: back off a little instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
