//! Dial-path DNS cache: our hit path against the baselines of the same run.
//!
//! 10,000 names, random access. Hit path: `DnsCache::resolve` on a cached name vs
//! `RwLock<HashMap>` get (std), `moka::sync::Cache::get`, and hickory's own cached
//! `lookup_ip` (a `TokioResolver` with its cache on, pointed at the same in-process
//! test server) — one thread and two threads. Then a miss through the test server and
//! 1,000 concurrent callers on one cold name. Ratios are printed at the end.
//!
//! ```text
//! cargo bench -p dwara-benches --bench dns_cache -- --warm-up-time 1 --measurement-time 3
//! ```

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::Criterion;
use dwara_dns_cache::{DnsCache, DnsCacheConfig, LookupFamily};
use dwara_resolver::{DnsResolver, ResolverConfig};
use futures::StreamExt;
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    NameServerConfig, ResolveHosts, ResolverConfig as HConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use test_support::dns_server::TestDnsServer;

const NAMES: usize = 10_000;
const ACCESSES: usize = 1 << 16;

/// Polls a future that must complete without waiting (a cache hit).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a cache hit must not wait"),
    }
}

struct Fixture {
    rt: tokio::runtime::Runtime,
    server: TestDnsServer,
    names: Vec<String>,
    /// Random indices into `names` (seeded; one sequence per thread offset).
    order: Vec<usize>,
    cache: DnsCache,
    map: Arc<RwLock<HashMap<String, Arc<[IpAddr]>>>>,
    moka: moka::sync::Cache<String, Arc<[IpAddr]>>,
    hickory: TokioResolver,
}

fn resolver(addr: SocketAddr) -> DnsResolver {
    DnsResolver::new(ResolverConfig {
        nameservers: vec![addr],
        timeout: Duration::from_secs(2),
        attempts: 1,
        ..ResolverConfig::default()
    })
    .unwrap()
}

fn hickory_cached(addr: SocketAddr) -> TokioResolver {
    let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
    for conn in &mut ns.connections {
        conn.port = addr.port();
    }
    let mut opts = ResolverOpts::default();
    opts.cache_size = 4 * NAMES as u64;
    opts.use_hosts_file = ResolveHosts::Never;
    TokioResolver::builder_with_config(
        HConfig::from_parts(None, Vec::new(), vec![ns]),
        TokioRuntimeProvider::default(),
    )
    .with_options(opts)
    .build()
    .unwrap()
}

fn fixture() -> Fixture {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(TestDnsServer::start()).unwrap();
    let names: Vec<String> = (0..NAMES).map(|i| format!("host-{i}.svc.test")).collect();
    for (i, name) in names.iter().enumerate() {
        let ip = Ipv4Addr::from(0x0a00_0000 + u32::try_from(i).unwrap());
        server.set_a(&format!("{name}."), &[ip], 3600);
    }
    let mut rng = SmallRng::seed_from_u64(7);
    let order = (0..ACCESSES).map(|_| rng.random_range(0..NAMES)).collect();

    let _guard = rt.enter();
    let cache = DnsCache::new(
        resolver(server.addr()),
        DnsCacheConfig {
            capacity: 2 * NAMES as u64,
            family: LookupFamily::Ipv4,
            ..DnsCacheConfig::default()
        },
    )
    .unwrap();
    let hickory = hickory_cached(server.addr());
    let map = Arc::new(RwLock::new(HashMap::new()));
    let moka = moka::sync::Cache::new(2 * NAMES as u64);
    rt.block_on(async {
        futures::stream::iter(&names)
            .for_each_concurrent(32, |name| {
                let (cache, hickory, map, moka) = (&cache, &hickory, &map, &moka);
                async move {
                    let ips = cache.resolve(name).await.unwrap();
                    map.write().unwrap().insert(name.clone(), ips.clone());
                    moka.insert(name.clone(), ips);
                    hickory.lookup_ip(name.as_str()).await.unwrap();
                }
            })
            .await;
    });
    drop(_guard);
    Fixture {
        rt,
        server,
        names,
        order,
        cache,
        map,
        moka,
        hickory,
    }
}

/// One hit-path operation on name `i`.
#[derive(Clone, Copy)]
enum Subject {
    Ours,
    RwLockMap,
    Moka,
    Hickory,
}

impl Subject {
    const ALL: [Subject; 4] = [Self::Ours, Self::RwLockMap, Self::Moka, Self::Hickory];

    fn id(self) -> &'static str {
        match self {
            Self::Ours => "dwara_dns_cache",
            Self::RwLockMap => "rwlock_hashmap",
            Self::Moka => "moka_sync_get",
            Self::Hickory => "hickory_cached_lookup_ip",
        }
    }

    /// Runs `iters` lookups starting at offset `start` of the random order; returns the time.
    fn run(self, fx: &Fixture, iters: u64, start: usize) -> Duration {
        let mut k = start;
        let mut next = || {
            k = (k + 1) & (ACCESSES - 1);
            fx.names[fx.order[k]].as_str()
        };
        match self {
            Self::Ours => {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(ready(fx.cache.resolve(next())).unwrap());
                }
                t.elapsed()
            }
            Self::RwLockMap => {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(fx.map.read().unwrap().get(next()).cloned().unwrap());
                }
                t.elapsed()
            }
            Self::Moka => {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(fx.moka.get(next()).unwrap());
                }
                t.elapsed()
            }
            Self::Hickory => fx.rt.handle().block_on(async {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(fx.hickory.lookup_ip(next()).await.unwrap());
                }
                t.elapsed()
            }),
        }
    }
}

fn hit_paths(c: &mut Criterion, fx: &Fixture) {
    let mut group = c.benchmark_group("dns_cache_hit_1_thread");
    for s in Subject::ALL {
        group.bench_function(s.id(), |b| b.iter_custom(|iters| s.run(fx, iters, 0)));
    }
    group.finish();

    // Two threads, each doing `iters` lookups on its own random sequence; the time
    // is the slower thread's, so equal-to-one-thread means perfect scaling.
    let mut group = c.benchmark_group("dns_cache_hit_2_threads");
    for s in Subject::ALL {
        group.bench_function(s.id(), |b| {
            b.iter_custom(|iters| {
                std::thread::scope(|scope| {
                    let a = scope.spawn(|| s.run(fx, iters, 0));
                    let b = scope.spawn(|| s.run(fx, iters, ACCESSES / 2));
                    a.join().unwrap().max(b.join().unwrap())
                })
            })
        });
    }
    group.finish();
}

fn misses(c: &mut Criterion, fx: &Fixture) {
    let mut group = c.benchmark_group("dns_cache_miss");
    group.bench_function("miss_via_test_server", |b| {
        b.iter_custom(|iters| {
            fx.rt.block_on(async {
                let mut total = Duration::ZERO;
                for i in 0..iters {
                    let name = &fx.names[usize::try_from(i).unwrap() % NAMES];
                    fx.cache.invalidate(name).await;
                    let t = Instant::now();
                    black_box(fx.cache.resolve(name).await.unwrap());
                    total += t.elapsed();
                }
                total
            })
        })
    });
    group.sample_size(20);
    group.bench_function("1000_callers_one_cold_name", |b| {
        b.iter_custom(|iters| {
            fx.rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let name = fx.names[0].as_str();
                    fx.cache.invalidate(name).await;
                    let before = fx.server.query_count_for(name);
                    let t = Instant::now();
                    let answers =
                        futures::future::join_all((0..1000).map(|_| fx.cache.resolve(name))).await;
                    total += t.elapsed();
                    assert!(answers.iter().all(Result::is_ok));
                    assert_eq!(fx.server.query_count_for(name), before + 1, "single flight");
                }
                total
            })
        })
    });
    group.finish();
}

fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // target/<profile>/deps/dns_cache-<hash>
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

/// The mean of one benchmark of this run, from criterion's estimates.json.
fn mean_ns(out: &std::path::Path, group: &str, id: &str) -> Option<f64> {
    let text = std::fs::read_to_string(out.join(group).join(id).join("new/estimates.json")).ok()?;
    let mean = &text[text.find("\"mean\"")?..];
    let at = mean.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let num: String = mean[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    num.parse().ok()
}

fn print_ratios(out: &std::path::Path) {
    println!("\n== dns_cache: means of this run and ratios ==");
    for group in ["dns_cache_hit_1_thread", "dns_cache_hit_2_threads"] {
        let Some(ours) = mean_ns(out, group, Subject::Ours.id()) else {
            continue;
        };
        println!("{group}: dwara_dns_cache {ours:.1} ns");
        for s in [Subject::RwLockMap, Subject::Moka, Subject::Hickory] {
            if let Some(base) = mean_ns(out, group, s.id()) {
                println!(
                    "  {:<26} {base:>9.1} ns   ours/base = {:.2}x   base/ours = {:.1}x",
                    s.id(),
                    ours / base,
                    base / ours
                );
            }
        }
    }
    for s in Subject::ALL {
        if let (Some(one), Some(two)) = (
            mean_ns(out, "dns_cache_hit_1_thread", s.id()),
            mean_ns(out, "dns_cache_hit_2_threads", s.id()),
        ) {
            println!(
                "scaling {:<26} 2-thread/1-thread time per op = {:.2}",
                s.id(),
                two / one
            );
        }
    }
    for id in ["miss_via_test_server", "1000_callers_one_cold_name"] {
        if let Some(m) = mean_ns(out, "dns_cache_miss", id) {
            println!("dns_cache_miss/{id}: {:.1} µs", m / 1000.0);
        }
    }
}

/// Criterion's means move with whatever else the (shared, 2-core) machine runs. This
/// interleaves the subjects in short rounds and keeps each one's fastest and median
/// round, so the ratios compare them under the same load.
fn interleaved(fx: &Fixture) {
    const ROUNDS: usize = 150;
    const OPS: u64 = 20_000;
    let subjects = Subject::ALL;
    for threads in [1usize, 2] {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
        for round in 0..ROUNDS {
            for (i, s) in subjects.iter().enumerate() {
                let ops = if matches!(s, Subject::Hickory) {
                    OPS / 10
                } else {
                    OPS
                };
                let start = (round * 977) % ACCESSES;
                let t = if threads == 1 {
                    s.run(fx, ops, start)
                } else {
                    std::thread::scope(|scope| {
                        let a = scope.spawn(|| s.run(fx, ops, start));
                        let b = scope.spawn(|| s.run(fx, ops, (start + ACCESSES / 2) % ACCESSES));
                        a.join().unwrap().max(b.join().unwrap())
                    })
                };
                per[i].push(t.as_nanos() as f64 / ops as f64);
            }
        }
        let stat = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[0], v[v.len() / 2])
        };
        let stats: Vec<(f64, f64)> = per.iter_mut().map(stat).collect();
        let (ours_min, ours_med) = stats[0];
        println!(
            "interleaved, {threads} thread(s), {ROUNDS} rounds: ns/op per thread (fastest round / median round)"
        );
        for (s, (min, med)) in subjects.iter().zip(&stats) {
            println!(
                "  {:<26} {min:>8.1} / {med:>8.1}   ours/this = {:.2}x / {:.2}x",
                s.id(),
                ours_min / min,
                ours_med / med
            );
        }
    }
}

fn main() {
    let out = target_dir().join("criterion");
    let mut c = Criterion::default()
        .output_directory(&out)
        .configure_from_args();
    let fx = fixture();
    hit_paths(&mut c, &fx);
    misses(&mut c, &fx);
    c.final_summary();
    print_ratios(&out);
    interleaved(&fx);
}
