#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod clock;
mod config;
mod entry;
mod error;
mod front;
#[cfg(feature = "hyper-util")]
mod hyper_resolver;
mod name;
mod refresh;
#[cfg(feature = "reqwest")]
mod reqwest_resolver;
mod stats;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dwara_resolver::{DnsResolver, ResolveError};
use moka::notification::RemovalCause;
use moka::ops::compute::Op;
use moka::policy::EvictionPolicy;
use tracing::{debug, warn};

pub use clock::{COARSE_THREAD_NAME, COARSE_TICK, Clock, ManualClock};
pub use config::{DnsCacheConfig, LookupFamily};
pub use error::DnsCacheError;
#[cfg(feature = "hyper-util")]
pub use hyper_resolver::HyperResolver;
#[cfg(feature = "reqwest")]
pub use reqwest_resolver::ReqwestResolver;
pub use stats::CacheStats;

use entry::{Answer, Entry};
use front::FrontMap;
use refresh::Flights;
use stats::Stats;

/// A TTL DNS cache in front of a [`DnsResolver`]. Cheap to clone (clones share the cache).
#[derive(Clone)]
pub struct DnsCache {
    inner: Arc<Inner>,
}

struct Inner {
    resolver: DnsResolver,
    config: DnsCacheConfig,
    store: moka::future::Cache<String, Arc<Entry>>,
    front: Arc<FrontMap>,
    stats: Arc<Stats>,
    flights: Flights,
}

impl std::fmt::Debug for DnsCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsCache")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// moka keeps an entry for as long as anything could use it: its TTL plus the
/// serve-stale window. Freshness itself is decided on the cache's clock.
struct KeepFor;

impl moka::Expiry<String, Arc<Entry>> for KeepFor {
    fn expire_after_create(
        &self,
        _key: &String,
        value: &Arc<Entry>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(value.keep_for)
    }

    fn expire_after_update(
        &self,
        _key: &String,
        value: &Arc<Entry>,
        _updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.keep_for)
    }
}

type Addrs = Result<Arc<[IpAddr]>, DnsCacheError>;

impl DnsCache {
    /// Builds a cache over `resolver` (which should have hickory's own cache off, as
    /// [`DnsResolver`] does).
    pub fn new(resolver: DnsResolver, config: DnsCacheConfig) -> Result<Self, DnsCacheError> {
        config.validate()?;
        let front = Arc::new(FrontMap::new(config.capacity, config.clock.clone()));
        let stats = Arc::new(Stats::default());
        let (listener_front, listener_stats) = (front.clone(), stats.clone());
        let store = moka::future::Cache::builder()
            .max_capacity(config.capacity)
            // LRU, not TinyLFU: a new name must always be admitted, or its misses
            // would never be cached (and never coalesced) until it looked popular.
            .eviction_policy(EvictionPolicy::lru())
            .expire_after(KeepFor)
            .eviction_listener(move |key: Arc<String>, entry: Arc<Entry>, cause| {
                listener_front.remove_if(&key, &entry);
                if cause == RemovalCause::Size {
                    Stats::bump(&listener_stats.evictions);
                    debug!(host = %key, "evicted (capacity)");
                }
            })
            .build();
        Ok(Self {
            inner: Arc::new(Inner {
                resolver,
                config,
                store,
                front,
                stats,
                flights: Flights::default(),
            }),
        })
    }

    /// The addresses of `host`, from the cache when fresh, else from the upstream.
    ///
    /// An IP literal or `localhost` is answered without DNS. A cached NXDOMAIN/NODATA
    /// is returned as an error for which [`DnsCacheError::is_no_records`] holds.
    pub async fn resolve(&self, host: &str) -> Addrs {
        // Keys are normalised, so a raw name that matches is already normalised: try
        // it as given first and only pay for normalising when that misses.
        if let Some(answer) = self.hit(host) {
            return answer;
        }
        let key = name::normalise(host);
        if let std::borrow::Cow::Owned(key) = &key
            && let Some(answer) = self.hit(key)
        {
            return answer;
        }
        if let Some(ips) = name::bypass(&key) {
            Stats::bump(&self.inner.stats.bypassed);
            return Ok(ips);
        }
        // Boxed: the miss path's state (moka, the resolver) is kilobytes, and an
        // unboxed `resolve` future would copy all of it on every hit.
        Box::pin(self.miss(key.into_owned())).await
    }

    /// [`resolve`](Self::resolve), paired with `port`: ready to dial.
    pub async fn resolve_socket_addrs(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, DnsCacheError> {
        let ips = self.resolve(host).await?;
        Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
    }

    /// Forgets `host`: the next lookup asks the upstream.
    pub async fn invalidate(&self, host: &str) {
        let key = name::normalise(host);
        self.inner.store.invalidate(key.as_ref()).await;
        self.inner.front.remove(&key);
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> CacheStats {
        self.inner.stats.snapshot()
    }

    /// Names held by moka (approximate until [`run_pending_tasks`](Self::run_pending_tasks)).
    pub fn entry_count(&self) -> u64 {
        self.inner.store.entry_count()
    }

    /// Names on the hit path; never more than moka holds once its pending work has run.
    pub fn front_len(&self) -> usize {
        self.inner.front.len()
    }

    /// Runs moka's pending maintenance (evictions, expirations) now.
    pub async fn run_pending_tasks(&self) {
        self.inner.store.run_pending_tasks().await;
    }

    /// Names with a background refresh running now (at most one each).
    pub fn refreshes_running(&self) -> usize {
        self.inner.flights.len()
    }

    /// The configuration the cache was built with.
    pub fn config(&self) -> &DnsCacheConfig {
        &self.inner.config
    }

    /// The hit path: `Some` when the front map has a fresh entry.
    #[inline]
    fn hit(&self, key: &str) -> Option<Addrs> {
        let inner = &*self.inner;
        let now = inner.config.clock.ticks();
        inner
            .front
            .with(key, |hot| {
                if now >= hot.fresh_until {
                    return None;
                }
                if now >= hot.refresh_at {
                    self.refresh_ahead(key, &hot.entry);
                }
                if hot.stale {
                    inner.stats.stale_served();
                } else {
                    inner.stats.hit();
                }
                Some(match &hot.addrs {
                    Some(addrs) => Ok(addrs.clone()),
                    None => answer_of(key, &hot.entry),
                })
            })
            .flatten()
    }

    /// Joins or starts the background refresh of `entry` (refresh-ahead), once per entry.
    fn refresh_ahead(&self, key: &str, entry: &Arc<Entry>) {
        // Read first: once a refresh runs, later hits must not write the shared flag.
        if entry.refreshing.load(Ordering::Relaxed) {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if entry.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        debug!(host = %key, "refresh-ahead");
        let _joined = self.join_flight(key, entry);
    }

    /// The slow path: no fresh entry on the hit path. Its time is the caller's wait.
    async fn miss(&self, key: String) -> Addrs {
        let started = Instant::now();
        let answer = self.miss_inner(key).await;
        self.inner.stats.waited(started.elapsed());
        answer
    }

    async fn miss_inner(&self, key: String) -> Addrs {
        let inner = &*self.inner;
        Stats::bump(&inner.stats.misses);
        let now = inner.config.clock.now();
        let mut expired = None;
        if let Some(entry) = inner.store.get(key.as_str()).await {
            if entry.is_fresh(now) {
                // moka has it and the front map does not yet (a concurrent publish).
                self.publish(&key, &entry).await;
                if entry.stale {
                    inner.stats.stale_served();
                }
                return answer_of(&key, &entry);
            }
            if let Some(timer) = inner.config.client_response_timeout
                && entry.is_stale_servable(now)
            {
                return self.ride_out(&key, entry, timer).await;
            }
            // Expired on our clock: drop exactly this entry so the loader runs; keep
            // it aside for serve-stale.
            inner
                .store
                .entry_by_ref(key.as_str())
                .and_compute_with(|cur| {
                    let op = match cur {
                        Some(cur) if Arc::ptr_eq(cur.value(), &entry) => Op::Remove,
                        _ => Op::Nop,
                    };
                    std::future::ready(op)
                })
                .await;
            expired = Some(entry);
        }
        self.load_through(key, expired).await
    }

    /// Waits on moka's single-flight loader for `key` (one upstream query for all
    /// concurrent callers); `expired` may be served stale if that query fails.
    async fn load_through(&self, key: String, expired: Option<Arc<Entry>>) -> Addrs {
        let inner = &*self.inner;
        let ran = AtomicBool::new(false);
        let loaded = inner
            .store
            .try_get_with_by_ref(key.as_str(), async {
                ran.store(true, Ordering::Relaxed);
                self.load(&key, expired).await
            })
            .await;
        if !ran.load(Ordering::Relaxed) {
            Stats::bump(&inner.stats.coalesced);
        }
        match loaded {
            Ok(entry) => {
                self.publish(&key, &entry).await;
                if entry.stale {
                    inner.stats.stale_served();
                }
                answer_of(&key, &entry)
            }
            Err(e) => Err(DnsCacheError::Resolve {
                host: key,
                source: ResolveError::clone(&e),
            }),
        }
    }

    /// The single-flight loader: one upstream query, turned into an entry. A
    /// failure is not an entry (nothing is cached) unless an expired answer may be
    /// served stale.
    async fn load(
        &self,
        key: &str,
        expired: Option<Arc<Entry>>,
    ) -> Result<Arc<Entry>, ResolveError> {
        let inner = &*self.inner;
        Stats::bump(&inner.stats.upstream_queries);
        debug!(host = %key, "cache miss: querying upstream");
        let result = self.query(key).await;
        let now = inner.config.clock.now();
        match result {
            Ok(records) => Ok(Arc::new(Entry::positive(&records, now, &inner.config))),
            Err(e) if e.is_no_records() => {
                debug!(host = %key, negative_ttl = ?e.negative_ttl(), "caching negative answer");
                Ok(Arc::new(Entry::negative(e, now, &inner.config)))
            }
            Err(e) => {
                let stale = expired.as_deref().and_then(|prev| {
                    Entry::stale_copy(prev, now, &inner.config).map(|s| (prev, s))
                });
                if let Some((prev, stale)) = stale {
                    warn!(
                        host = %key,
                        error = %e,
                        kind = e.kind(),
                        expired_for = ?now.saturating_duration_since(prev.fresh_until),
                        "upstream failed; serving the expired answer (RFC 8767)"
                    );
                    return Ok(Arc::new(stale));
                }
                warn!(host = %key, error = %e, kind = e.kind(), "upstream lookup failed");
                Err(e)
            }
        }
    }

    async fn query(&self, key: &str) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
        let resolver = &self.inner.resolver;
        match self.inner.config.family {
            LookupFamily::Ipv4 => resolver.lookup_a(key).await,
            LookupFamily::Ipv6 => resolver.lookup_aaaa(key).await,
            LookupFamily::Both => resolver.lookup_ip(key).await,
        }
    }

    /// Puts `entry` on the hit path, unless moka no longer holds it.
    async fn publish(&self, key: &str, entry: &Arc<Entry>) {
        let front = &self.inner.front;
        if front.holds(key, entry) {
            return;
        }
        front.insert(key, entry);
        // Replaced or evicted between moka's insert and ours: the listener may have
        // run before our insert, so withdraw it here.
        let current = self.inner.store.get(key).await;
        if !current.is_some_and(|c| Arc::ptr_eq(&c, entry)) {
            front.remove_if(key, entry);
        }
    }
}

fn answer_of(key: &str, entry: &Entry) -> Addrs {
    match &entry.answer {
        Answer::Addrs(ips) => Ok(ips.clone()),
        Answer::NoRecords(e) => Err(DnsCacheError::Resolve {
            host: key.to_owned(),
            source: e.clone(),
        }),
    }
}
