//! Building the HTTP side of an upstream for a new generation ([`http_upstream`])
//! and reporting it ([`status`]).
//!
//! Across a reload an HTTP upstream keeps its counters (same name), its
//! connection limit's permits (same name and limit) and its pool and DNS cache
//! while it keeps its load balancer (same name, policy, ejection and target, see
//! [`crate::plan()`]) with the same pool settings: pooled connections survive a
//! reload that changes nothing about where they go. A new pool gets a sweeper task
//! on the caller's runtime, which ends when the pool is dropped.

use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use dwara_discovery_dns::{RecordType, TargetResolver};
use dwara_dns_cache::{DnsCache, DnsCacheConfig};
use dwara_lb::UpstreamLb;
use dwara_resolver::{DnsResolver, ResolveError, ResolverConfig};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::config::UpstreamConfig;
use crate::dataplane::Generation;
use crate::http_stats::HttpStats;
use crate::plan::{LbPlan, UpstreamPlan};
use crate::pool::{Pool, SWEEP};
use crate::reverse::{Dial, HttpUpstream};

/// How long past its TTL an `address:` answer may be used while DNS fails.
const MAX_STALE: Duration = Duration::from_secs(300);

/// The HTTP side of upstream `i` of the new generation, or `None` for TCP.
pub(crate) fn http_upstream(
    i: usize,
    up: &UpstreamConfig,
    lb: &Arc<UpstreamLb>,
    plan: &UpstreamPlan,
    old: &Generation,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<HttpUpstream>>, Error> {
    let Some(settings) = up.http_settings() else {
        return Ok(None);
    };
    let by_name = plan
        .counters_from
        .and_then(|p| old.upstreams[p].target.http.clone());
    let kept = match plan.lb {
        LbPlan::Keep(p) => old.upstreams[p]
            .target
            .http
            .clone()
            .filter(|h| h.settings.pool == settings.pool),
        LbPlan::New(_) => None,
    };
    let stats = by_name
        .as_ref()
        .map_or_else(|| Arc::new(HttpStats::default()), |h| h.stats.clone());
    let connections = by_name
        .as_ref()
        .filter(|h| h.settings.limits.max_connections == settings.limits.max_connections)
        .map_or_else(
            || Arc::new(Semaphore::new(settings.limits.max_connections)),
            |h| h.connections.clone(),
        );
    let (pool, dial) = match kept {
        Some(h) => (h.pool.clone(), h.dial.clone()),
        None => {
            let pool = Arc::new(Pool::new(
                settings.pool.max_idle_per_endpoint,
                Duration::from_secs(settings.pool.idle_timeout_s),
                Duration::from_millis(up.connect_timeout_ms),
            ));
            let dial = Arc::new(dial(i, up)?);
            let wanted = match *dial {
                Dial::Lb { .. } => Some(Arc::downgrade(lb)),
                Dial::Address { .. } => None,
            };
            tokio::spawn(sweep(Arc::downgrade(&pool), wanted));
            (pool, dial)
        }
    };
    Ok(Some(Arc::new(HttpUpstream {
        settings,
        pool,
        stats,
        dial,
        connections,
        shutdown: shutdown.clone(),
    })))
}

/// Where the endpoints of upstream `i` come from.
fn dial(i: usize, up: &UpstreamConfig) -> Result<Dial, Error> {
    let Some((host, port)) = up.address_parts() else {
        // SRV discovery resolves the targets its answers name without addresses
        // through a cache of the upstream's own, asking its name servers.
        let targets = match &up.dns_discovery {
            Some(dns) if dns.record_type == RecordType::SRV => Some(cache(
                format!("upstreams[{i}].dns_discovery"),
                dns.nameservers.clone(),
            )?),
            _ => None,
        };
        return Ok(Dial::Lb { targets });
    };
    let cache = cache(
        format!("upstreams[{i}].address"),
        up.nameservers.clone().unwrap_or_default(),
    )?;
    Ok(Dial::Address {
        cache,
        host,
        port,
        next: AtomicUsize::new(0),
    })
}

/// A DNS cache over `nameservers` (the system's when empty); `key` names the
/// configuration it is for in errors.
fn cache(key: String, nameservers: Vec<std::net::SocketAddr>) -> Result<DnsCache, Error> {
    let resolver = DnsResolver::new(ResolverConfig {
        nameservers,
        ..ResolverConfig::default()
    })
    .map_err(|e| Error::AddressResolver {
        key: key.clone(),
        source: Box::new(e),
    })?;
    DnsCache::new(
        resolver,
        DnsCacheConfig {
            max_stale: MAX_STALE,
            ..DnsCacheConfig::default()
        },
    )
    .map_err(|e| Error::AddressResolver {
        key,
        source: Box::new(e),
    })
}

/// SRV targets resolved through an upstream's DNS cache: TTL-exact, one lookup
/// in flight per name, an expired answer served while DNS fails. The cache
/// answers without TTLs, so a target's TTL is its SRV record's.
#[derive(Debug)]
pub(crate) struct CachedTargets(pub(crate) DnsCache);

#[async_trait::async_trait]
impl TargetResolver for CachedTargets {
    async fn resolve(&self, host: &str) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
        match self.0.resolve(host).await {
            Ok(ips) => Ok(ips.iter().map(|ip| (*ip, u32::MAX)).collect()),
            Err(e) => Err(e
                .resolve_error()
                .cloned()
                .unwrap_or_else(|| ResolveError::NoRecords {
                    name: host.to_owned(),
                    record_type: dwara_resolver::RecordType::A,
                    nxdomain: false,
                    negative_ttl: None,
                })),
        }
    }
}

/// Closes idle connections of endpoints that left the load balancer's set (every
/// [`SWEEP`]) and those idle too long, until the pool is dropped.
async fn sweep(pool: Weak<Pool>, lb: Option<Weak<UpstreamLb>>) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        match lb.as_ref().map(Weak::upgrade) {
            Some(Some(lb)) => {
                let set = lb.endpoints();
                pool.sweep(|addr| set.contains(addr));
            }
            Some(None) => pool.sweep(|_| false),
            None => pool.sweep(|_| true),
        }
    }
}

/// The `http` part of an upstream's `GET /upstreams` entry.
pub(crate) fn status(h: &HttpUpstream) -> serde_json::Value {
    let s = &h.stats;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let pool: Vec<_> = h
        .pool
        .sizes()
        .into_iter()
        .map(|(addr, sz)| json!({ "endpoint": addr.to_string(), "idle": sz.idle, "busy": sz.busy }))
        .collect();
    let dns = h.dial.cache().map(|cache| {
        let c = cache.stats();
        json!({ "hits": c.hits, "misses": c.misses, "stale_served": c.stale_served })
    });
    json!({
        "requests": {
            "1xx": load(&s.by_class[0]),
            "2xx": load(&s.by_class[1]),
            "3xx": load(&s.by_class[2]),
            "4xx": load(&s.by_class[3]),
            "5xx": load(&s.by_class[4]),
        },
        "retries": load(&s.retries),
        "retry_budget_exhausted": load(&s.budget_exhausted),
        "no_endpoints_503": load(&s.no_endpoints),
        "bad_gateway_502": load(&s.bad_gateway),
        "timeout_504": load(&s.timeouts),
        "connects": load(&s.connects),
        "connect_failures": load(&s.connect_failures),
        "reused": load(&s.reused),
        "client_connections": load(&s.client_connections),
        "client_connections_refused": load(&s.client_refused),
        "pool": pool,
        "dns_cache": dns,
    })
}
