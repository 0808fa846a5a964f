//! Building the HTTP side of an upstream for a new generation ([`http_upstream`])
//! and reporting it ([`status`]).
//!
//! Across a reload an HTTP upstream keeps its counters (same name), its
//! connection limit's permits (same name and limit) and its pool and DNS cache
//! while it keeps its load balancer (same name, policy, ejection and target, see
//! [`crate::plan()`]) with the same pool settings and the same feed (DNS, or a
//! local source by push, which needs no cache for SRV targets): pooled
//! connections survive a reload that changes nothing about where they go. A new
//! pool gets a sweeper task on the caller's runtime, which ends when the pool is
//! dropped.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dwara_discovery_dns::{RecordType, TargetResolver};
use dwara_dns_cache::{DnsCache, DnsCacheConfig};
use dwara_lb::{EndpointSet, UpstreamLb};
use dwara_resolver::{DnsResolver, ResolveError, ResolverConfig};
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::Error;
use crate::config::UpstreamConfig;
use crate::dataplane::Generation;
use crate::http_stats::{HttpStats, LATENCY_BOUNDS};
use crate::plan::{LbPlan, UpstreamPlan};
use crate::pool::{Pool, SWEEP};
use crate::reverse::{Answer, Dial, HttpUpstream};

/// How long past its TTL an `address:` answer may be used while DNS fails.
const MAX_STALE: Duration = Duration::from_secs(300);

/// The HTTP side of upstream `i` of the new generation, or `None` for TCP;
/// `pushed` when its discovery follows a local source instead of DNS.
pub(crate) fn http_upstream(
    i: usize,
    up: &UpstreamConfig,
    lb: &Arc<UpstreamLb>,
    plan: &UpstreamPlan,
    old: &Generation,
    shutdown: &CancellationToken,
    pushed: bool,
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
            .filter(|h| {
                h.settings.pool == settings.pool
                    && h.settings.max_response_header_bytes == settings.max_response_header_bytes
            })
            // A dial path with an SRV targets' cache only while DNS feeds it.
            .filter(|h| h.dial.srv_targets().is_some() == wants_targets(up, pushed)),
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
            let dial = Arc::new(dial(i, up, pushed)?);
            let wanted = match &*dial {
                Dial::Lb { targets } => {
                    Wanted::InSet(Arc::downgrade(lb), targets.as_ref().map(Arc::downgrade))
                }
                Dial::Address { .. } => Wanted::InAnswer(Arc::downgrade(&dial)),
            };
            tokio::spawn(sweep(Arc::downgrade(&pool), wanted, SWEEP));
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

/// Where the endpoints of upstream `i` come from; `pushed` when its discovery
/// follows a local source instead of DNS.
fn dial(i: usize, up: &UpstreamConfig, pushed: bool) -> Result<Dial, Error> {
    let Some((host, port)) = up.address_parts() else {
        // SRV discovery by DNS resolves the targets its answers name without
        // addresses through a cache of the upstream's own, asking its name
        // servers. A local source gives addresses, never host names: no cache.
        let targets = match &up.dns_discovery {
            Some(dns) if wants_targets(up, pushed) => Some(Arc::new(SrvTargets::new(cache(
                format!("upstreams[{i}].dns_discovery"),
                dns.nameservers.clone(),
            )?))),
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
        answer: Answer::default(),
    })
}

/// Whether upstream `up` resolves SRV targets through a cache of its own: with
/// SRV discovery by DNS (`pushed` when a local source feeds it instead).
fn wants_targets(up: &UpstreamConfig, pushed: bool) -> bool {
    let srv = up
        .dns_discovery
        .as_ref()
        .is_some_and(|dns| dns.record_type == RecordType::SRV);
    srv && !pushed && up.address.is_none()
}

/// A DNS cache over `nameservers` (the system's when empty); `key` names the
/// configuration it is for in errors.
fn cache(key: String, nameservers: Vec<SocketAddr>) -> Result<DnsCache, Error> {
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

/// How long an address resolved from an SRV target is remembered while it is not
/// among the load balancer's endpoints: long enough to cover the time between
/// discovery resolving it and the load balancer taking its answer (each target
/// of an answer is resolved in turn, each lookup bounded by the resolver's
/// timeouts), short enough that addresses left behind by churn go soon.
const HOST_GRACE: Duration = Duration::from_secs(60);

/// The SRV targets of an upstream with SRV discovery by DNS, resolved through the
/// upstream's DNS cache: TTL-exact, one lookup in flight per name, an expired
/// answer served while DNS fails. The cache answers without TTLs, so a target's
/// TTL is its SRV record's.
///
/// Each address so resolved is remembered with its host, so that a new connection
/// to it can resolve the host again ([`current`](Self::current)): the load
/// balancer holds the addresses of discovery's last refresh, which with a long SRV
/// TTL can be much older than the host's own short one. Addresses that are not
/// the load balancer's are forgotten after [`HOST_GRACE`] by the pool's sweeper
/// ([`prune`](Self::prune)), so churn cannot grow the map.
#[derive(Debug)]
pub(crate) struct SrvTargets {
    pub(crate) cache: DnsCache,
    /// By address: the host it was last resolved from, and when. By IP only: the
    /// resolver asks for a host without its SRV port.
    hosts: Mutex<HashMap<IpAddr, (Arc<str>, Instant), foldhash::fast::RandomState>>,
    /// Turns through a moved host's addresses, one per new connection.
    next: AtomicUsize,
}

impl SrvTargets {
    pub(crate) fn new(cache: DnsCache) -> Self {
        Self {
            cache,
            hosts: Mutex::new(HashMap::default()),
            next: AtomicUsize::new(0),
        }
    }

    /// Where a new connection to `addr`, an endpoint of the load balancer, goes:
    /// `addr` itself unless it was resolved from an SRV target host that the DNS
    /// cache now finds elsewhere, then one of the host's current addresses at the
    /// same port. When the host cannot be resolved now (DNS down with nothing
    /// stale to serve, or the name gone) `addr` is dialled as discovery left it:
    /// its next refresh decides.
    pub(crate) async fn current(&self, addr: SocketAddr) -> SocketAddr {
        let host = self.hosts.lock().get(&addr.ip()).map(|(h, _)| h.clone());
        let Some(host) = host else {
            return addr;
        };
        let ips = match self.cache.resolve(&host).await {
            Ok(ips) if !ips.is_empty() => ips,
            Ok(_) => return addr,
            Err(e) => {
                debug!(endpoint = %addr, target = %host, error = %e, "SRV target not resolved again; dialling the endpoint discovery gave");
                return addr;
            }
        };
        if ips.contains(&addr.ip()) {
            return addr;
        }
        let ip = ips[self.next.fetch_add(1, Ordering::Relaxed) % ips.len()];
        let moved = SocketAddr::new(ip, addr.port());
        debug!(endpoint = %addr, target = %host, dialled = %moved, "SRV target moved since discovery's last refresh; dialling its current address");
        moved
    }

    /// Forgets the addresses that are not among `endpoints` and were last resolved
    /// more than `grace` ago ([`HOST_GRACE`] but in tests).
    fn prune(&self, endpoints: &EndpointSet, grace: Duration) {
        let mut hosts = self.hosts.lock();
        if hosts.is_empty() {
            return;
        }
        hosts.retain(|ip, (_, seen)| {
            seen.elapsed() < grace || endpoints.iter().any(|e| e.addr.ip() == *ip)
        });
    }
}

#[async_trait::async_trait]
impl TargetResolver for SrvTargets {
    async fn resolve(&self, host: &str) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
        match self.cache.resolve(host).await {
            Ok(ips) => {
                let name: Arc<str> = host.into();
                let now = Instant::now();
                let mut hosts = self.hosts.lock();
                for ip in ips.iter() {
                    hosts.insert(*ip, (name.clone(), now));
                }
                Ok(ips.iter().map(|ip| (*ip, u32::MAX)).collect())
            }
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

/// Which endpoints' connections a pool keeps.
enum Wanted {
    /// Those of the load balancer's set; the SRV targets' addresses are pruned
    /// to it.
    InSet(Weak<UpstreamLb>, Option<Weak<SrvTargets>>),
    /// Those of the latest answer of an `address:` upstream.
    InAnswer(Weak<Dial>),
}

/// Why the sweeper runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    /// Its period: everything is swept.
    Tick,
    /// The endpoints changed: the idle connections of those that left are
    /// closed at once.
    Changed,
}

impl Wanted {
    /// Closes the idle connections `pool` should not keep (on a [`Wake::Tick`]
    /// also those idle too long or closed by their endpoint) and prunes the SRV
    /// targets' addresses. The version of the set or answer it went by comes
    /// back, for [`changed`](Self::changed).
    fn apply(&self, pool: &Pool, wake: Wake) -> Option<u64> {
        let close = |wanted: &dyn Fn(SocketAddr) -> bool| match wake {
            Wake::Tick => pool.sweep(wanted),
            Wake::Changed => pool.close_left(wanted),
        };
        match self {
            Self::InSet(lb, targets) => {
                let Some(lb) = lb.upgrade() else {
                    close(&|_| false);
                    return None;
                };
                // The version first: a set published after it wakes the sweeper.
                let version = lb.version();
                let set = lb.endpoints();
                close(&|addr| set.contains(addr));
                if let Some(targets) = targets.as_ref().and_then(Weak::upgrade) {
                    targets.prune(&set, HOST_GRACE);
                }
                Some(version)
            }
            Self::InAnswer(dial) => {
                match dial.upgrade() {
                    Some(dial) => close(&|addr| dial.in_answer(addr)),
                    None => close(&|_| false),
                }
                None
            }
        }
    }

    /// Completes when the endpoints change: a set published after `version`, or
    /// a new answer of an `address:` upstream. Never when they are gone (the
    /// pool goes with them, and the next tick ends the sweeper).
    async fn changed(&self, version: Option<u64>) {
        match self {
            Self::InSet(lb, _) => match (lb.upgrade(), version) {
                (Some(lb), Some(v)) => lb.updated(v).await,
                _ => std::future::pending().await,
            },
            Self::InAnswer(dial) => match dial.upgrade().as_deref() {
                Some(Dial::Address { answer, .. }) => answer.changed().await,
                _ => std::future::pending().await,
            },
        }
    }
}

/// Until the pool is dropped: every `period` closes the idle connections of
/// endpoints no longer wanted, those idle too long and those their endpoint
/// closed, and prunes the SRV targets' addresses; as soon as the endpoints change
/// closes those of the endpoints that left (drain: busy ones finish first).
async fn sweep(pool: Weak<Pool>, wanted: Wanted, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick completes at once.
    tick.tick().await;
    let mut wake = Wake::Tick;
    loop {
        let Some(strong) = pool.upgrade() else { return };
        let version = wanted.apply(&strong, wake);
        drop(strong);
        // The tick first: endpoints changing without pause cannot starve the
        // full sweep (which closes what left too).
        wake = tokio::select! {
            biased;
            _ = tick.tick() => Wake::Tick,
            () = wanted.changed(version) => Wake::Changed,
        };
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
    // Cumulative, as Prometheus' buckets are: each counts the requests answered
    // within its bound.
    let mut within = 0;
    let buckets: Vec<_> = s
        .latency
        .iter()
        .zip(
            LATENCY_BOUNDS
                .iter()
                .map(|b| json!(b))
                .chain([json!("+Inf")]),
        )
        .map(|(n, le)| {
            within += load(n);
            json!({ "le": le, "count": within })
        })
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
        "client_timeout_408": load(&s.client_timeouts),
        "bad_request_400": load(&s.bad_requests),
        "not_implemented_501": load(&s.not_implemented),
        "response_body_timeouts": load(&s.body_timeouts),
        "client_send_timeouts": load(&s.send_timeouts),
        "cancelled": load(&s.cancelled),
        "upgrades": load(&s.upgrades),
        "tunnels": load(&s.tunnels),
        "connects": load(&s.connects),
        "connect_failures": load(&s.connect_failures),
        "reused": load(&s.reused),
        "client_connections": load(&s.client_connections),
        "client_connections_refused": load(&s.client_refused),
        "pool": pool,
        "dns_cache": dns,
        "latency": {
            "buckets": buckets,
            "count": within,
            "sum_seconds": load(&s.latency_sum_us) as f64 / 1e6,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use dwara_lb::Endpoint;
    use test_support::dns_server::TestDnsServer;

    use super::*;

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, last)
    }

    fn at(last: u8, port: u16) -> SocketAddr {
        SocketAddr::new(ip(last).into(), port)
    }

    async fn targets(dns: &TestDnsServer) -> SrvTargets {
        SrvTargets::new(cache("test".into(), vec![dns.addr()]).unwrap())
    }

    #[tokio::test]
    async fn a_new_connection_goes_where_the_target_host_is_now() {
        let dns = TestDnsServer::start().await.unwrap();
        dns.set_a("a.hosts.test", &[ip(2)], 1);
        let t = targets(&dns).await;
        let got = t.resolve("a.hosts.test").await.unwrap();
        assert_eq!(got, [(IpAddr::from(ip(2)), u32::MAX)]);
        // Still there: the endpoint itself. Not from a target: left alone.
        assert_eq!(t.current(at(2, 8080)).await, at(2, 8080));
        assert_eq!(t.current(at(9, 8080)).await, at(9, 8080));

        dns.set_a("a.hosts.test", &[ip(3), ip(4)], 1);
        let moved = test_support::wait_until(Duration::from_secs(10), || async {
            t.current(at(2, 8080)).await != at(2, 8080)
        })
        .await;
        assert!(moved, "the cache never saw the new answer");
        // The host's current addresses in turn, at the endpoint's port.
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4 {
            seen.insert(t.current(at(2, 8080)).await);
        }
        assert_eq!(seen, [at(3, 8080), at(4, 8080)].into_iter().collect());
        assert!(t.cache.stats().hits >= 4, "{:?}", t.cache.stats());
    }

    #[tokio::test]
    async fn addresses_outside_the_set_are_forgotten_after_the_grace() {
        let dns = TestDnsServer::start().await.unwrap();
        dns.set_a("a.hosts.test", &[ip(2)], 30);
        dns.set_a("b.hosts.test", &[ip(3)], 30);
        let t = targets(&dns).await;
        t.resolve("a.hosts.test").await.unwrap();
        t.resolve("b.hosts.test").await.unwrap();
        let set: EndpointSet = [Endpoint::new(at(2, 80))].into_iter().collect();
        // Within the grace both stay (the load balancer may not have taken the
        // answer yet).
        t.prune(&set, Duration::from_secs(60));
        assert_eq!(t.hosts.lock().len(), 2);
        // Past it, only the load balancer's.
        t.prune(&set, Duration::ZERO);
        let left: Vec<IpAddr> = t.hosts.lock().keys().copied().collect();
        assert_eq!(left, [IpAddr::from(ip(2))]);
        t.prune(&EndpointSet::empty(), Duration::ZERO);
        assert!(t.hosts.lock().is_empty());
    }

    /// An idle pooled connection to a listener of its own, and that listener's
    /// side of it.
    async fn idle_connection(pool: &Arc<Pool>) -> (SocketAddr, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = HttpStats::default();
        let (conn, accepted) = tokio::join!(pool.connect(addr, &stats, 8192), listener.accept());
        let mut conn = conn.unwrap();
        // Polled once, as a request's task would: hyper's half then takes requests.
        std::future::poll_fn(|cx| {
            assert!(conn.driver.poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        let keep = true;
        pool.checkin(conn, keep);
        (addr, accepted.unwrap().0)
    }

    /// Whether the listener's side of a connection sees it closed within 10 s.
    async fn closed(peer: &mut tokio::net::TcpStream) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 16];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), peer.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    fn idle(pool: &Pool) -> std::collections::BTreeSet<SocketAddr> {
        pool.sizes()
            .into_iter()
            .filter(|(_, s)| s.idle > 0)
            .map(|(a, _)| a)
            .collect()
    }

    /// A pool of a minute's idle timeout, swept only hourly: whatever closes
    /// within the tests' 10 s is the sweeper acting on a change.
    fn hourly_pool() -> Arc<Pool> {
        Arc::new(Pool::new(
            4,
            Duration::from_secs(60),
            Duration::from_secs(5),
        ))
    }

    const HOURLY: Duration = Duration::from_secs(3600);

    /// Awaits the sweeper's first sweep, the one it makes as it starts.
    async fn first_sweep(pool: &Pool) {
        let swept =
            test_support::wait_until(Duration::from_secs(10), || async { pool.sweeps() > 0 }).await;
        assert!(swept, "the sweeper never swept");
    }

    #[tokio::test]
    async fn idle_connections_to_an_endpoint_that_leaves_the_set_close_as_it_leaves() {
        let pool = hourly_pool();
        let (a, mut peer_a) = idle_connection(&pool).await;
        let (b, mut peer_b) = idle_connection(&pool).await;
        let lb = Arc::new(UpstreamLb::new(dwara_lb::Policy::RoundRobin));
        lb.update([Endpoint::new(a), Endpoint::new(b)].into_iter().collect());
        let wanted = Wanted::InSet(Arc::downgrade(&lb), None);
        let sweeper = tokio::spawn(sweep(Arc::downgrade(&pool), wanted, HOURLY));
        // The first sweep (at once) keeps both.
        first_sweep(&pool).await;
        assert_eq!(idle(&pool), [a, b].into());
        lb.update([Endpoint::new(a)].into_iter().collect());
        assert!(
            closed(&mut peer_b).await,
            "the idle connection to {b} stayed"
        );
        assert_eq!(idle(&pool), [a].into());
        // Back, and gone again: the sweeper follows each change.
        let (c, mut peer_c) = idle_connection(&pool).await;
        lb.update([Endpoint::new(a), Endpoint::new(c)].into_iter().collect());
        lb.update([Endpoint::new(c)].into_iter().collect());
        assert!(
            closed(&mut peer_a).await,
            "the idle connection to {a} stayed"
        );
        assert_eq!(idle(&pool), [c].into());
        assert!(!closed_now(&mut peer_c), "the connection to {c} was closed");
        // The pool dropped: the sweeper ends at its next wake-up.
        drop(pool);
        lb.clear();
        tokio::time::timeout(Duration::from_secs(10), sweeper)
            .await
            .expect("the sweeper outlived its pool")
            .unwrap();
    }

    #[tokio::test]
    async fn idle_connections_to_an_address_the_answer_dropped_close_as_it_changes() {
        let dns = TestDnsServer::start().await.unwrap();
        let pool = hourly_pool();
        let (a, mut peer_a) = idle_connection(&pool).await;
        let dial = Arc::new(Dial::Address {
            cache: cache("test".into(), vec![dns.addr()]).unwrap(),
            host: "web.test".into(),
            port: a.port(),
            next: AtomicUsize::new(0),
            answer: Answer::default(),
        });
        let Dial::Address { answer, .. } = &*dial else {
            unreachable!()
        };
        answer.note(&[a.ip()]);
        let wanted = Wanted::InAnswer(Arc::downgrade(&dial));
        tokio::spawn(sweep(Arc::downgrade(&pool), wanted, HOURLY));
        first_sweep(&pool).await;
        assert_eq!(idle(&pool), [a].into());
        answer.note(&[IpAddr::from(ip(9))]);
        assert!(
            closed(&mut peer_a).await,
            "the idle connection to {a} stayed"
        );
        assert!(idle(&pool).is_empty());
    }

    /// Whether the connection is closed already (nothing waited for).
    fn closed_now(peer: &mut tokio::net::TcpStream) -> bool {
        let mut buf = [0u8; 16];
        matches!(peer.try_read(&mut buf), Ok(0))
    }
}
