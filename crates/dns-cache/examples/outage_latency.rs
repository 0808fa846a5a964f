//! What a caller of `DnsCache::resolve` waits during a DNS outage, without and with
//! the client-response timer. A timed harness, not a test: it prints the
//! latency distribution of every configuration and the ratios between them.
//!
//! Per configuration: a fresh in-process test DNS server with 10 names (TTL 1 s), a
//! cache with `max_stale` 300 s and a 5 s stale answer TTL that has resolved them all,
//! then the server goes silent (drops every query) and the answers expire. For the
//! next `SECONDS` (default 20), a new caller arrives every 2 ms on the next name (500
//! lookups/s, the dial path of a busy proxy) and its `resolve` is timed. The resolver
//! is `ResolverConfig::default()`: 2 s timeout, 2 attempts.
//!
//! - `timer off`: `client_response_timeout: None`, no timer: a
//!   caller whose answer expired waits for the resolver's verdict, then gets the stale
//!   answer, and the next caller past the stale answer TTL waits again.
//! - `timer 1.8 s`: the default.
//! - `timer 0`: stale-while-revalidate.
//!
//! ```text
//! cargo run --release -p dwara-dns-cache --example outage_latency [SECONDS]
//! ```

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use dwara_dns_cache::{CacheStats, DnsCache, DnsCacheConfig, LookupFamily};
use dwara_resolver::{DnsResolver, ResolverConfig};
use test_support::dns_server::{FailureMode, TestDnsServer};

const NAMES: usize = 10;
const ARRIVAL: Duration = Duration::from_millis(2);

struct Run {
    label: &'static str,
    /// Caller latencies, sorted.
    latencies: Vec<Duration>,
    upstream: u64,
    stats: CacheStats,
}

impl Run {
    fn pct(&self, p: f64) -> Duration {
        let n = self.latencies.len();
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((n as f64 * p / 100.0) as usize).min(n - 1);
        self.latencies[i]
    }

    fn max(&self) -> Duration {
        self.latencies.last().copied().unwrap_or_default()
    }

    fn mean(&self) -> Duration {
        let total: Duration = self.latencies.iter().sum();
        total / u32::try_from(self.latencies.len()).unwrap()
    }

    fn slow(&self, over: Duration) -> usize {
        self.latencies.iter().filter(|l| **l > over).count()
    }
}

async fn run(label: &'static str, timer: Option<Duration>, seconds: u64) -> Run {
    let server = TestDnsServer::start().await.unwrap();
    let names: Vec<String> = (0..NAMES).map(|i| format!("svc-{i}.outage.test")).collect();
    for (i, name) in names.iter().enumerate() {
        let ip = Ipv4Addr::new(10, 0, 0, u8::try_from(i + 1).unwrap());
        server.set_a(&format!("{name}."), &[ip], 1);
    }
    let resolver = DnsResolver::new(ResolverConfig {
        nameservers: vec![server.addr()],
        ..ResolverConfig::default()
    })
    .unwrap();
    let cache = DnsCache::new(
        resolver,
        DnsCacheConfig {
            family: LookupFamily::Ipv4,
            min_ttl: Duration::from_secs(1),
            max_stale: Duration::from_secs(300),
            stale_answer_ttl: Duration::from_secs(5),
            client_response_timeout: timer,
            refresh_ahead: 0.0,
            ..DnsCacheConfig::default()
        },
    )
    .unwrap();
    for name in &names {
        cache.resolve(name).await.unwrap();
    }
    server.set_failure(FailureMode::Drop);
    tokio::time::sleep(Duration::from_millis(1200)).await; // every answer has expired
    let before = server.query_count();

    let mut tick = tokio::time::interval(ARRIVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut callers = Vec::new();
    let mut k = 0;
    while Instant::now() < end {
        tick.tick().await;
        let (cache, name) = (cache.clone(), names[k % NAMES].clone());
        k += 1;
        callers.push(tokio::spawn(async move {
            let t = Instant::now();
            let answer = cache.resolve(&name).await;
            (answer.is_ok(), t.elapsed())
        }));
    }
    let mut latencies = Vec::with_capacity(callers.len());
    for caller in callers {
        let (ok, latency) = caller.await.unwrap();
        assert!(ok, "{label}: a caller got no answer within max_stale");
        latencies.push(latency);
    }
    latencies.sort();
    Run {
        label,
        latencies,
        upstream: server.query_count() - before,
        stats: cache.stats(),
    }
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.3} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    println!(
        "outage: {NAMES} names, a caller every {ARRIVAL:?} for {seconds} s, upstream silent, \
         resolver 2 s x 2 attempts, max_stale 300 s, stale answer TTL 5 s"
    );
    let runs = [
        run("timer off (before)", None, seconds).await,
        run(
            "timer 1.8 s (default)",
            Some(Duration::from_millis(1800)),
            seconds,
        )
        .await,
        run("timer 0", Some(Duration::ZERO), seconds).await,
    ];
    println!(
        "\n{:<22} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "config", "callers", "p50", "p90", "p99", "p99.9", "max", "mean", ">100 ms", "queries"
    );
    for r in &runs {
        println!(
            "{:<22} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
            r.label,
            r.latencies.len(),
            ms(r.pct(50.0)),
            ms(r.pct(90.0)),
            ms(r.pct(99.0)),
            ms(r.pct(99.9)),
            ms(r.max()),
            ms(r.mean()),
            r.slow(Duration::from_millis(100)),
            r.upstream,
        );
    }
    println!();
    for r in &runs {
        let s = &r.stats;
        println!(
            "{:<22} stale_served {} client_timeouts {} refreshes {} failed {} retries {} \
             misses {} waited {:?} longest {:?}",
            r.label,
            s.stale_served,
            s.client_timeouts,
            s.refreshes,
            s.refreshes_failed,
            s.refresh_retries,
            s.misses,
            s.waited,
            s.longest_wait
        );
    }
    let before = &runs[0];
    println!("\nratios, before / after (higher = the caller waits less after):");
    for after in &runs[1..] {
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        println!(
            "  {:<22} p50 {:>8.1}x  p99 {:>8.1}x  max {:>8.1}x  mean {:>8.1}x  callers over 100 ms {} -> {}",
            after.label,
            ratio(before.pct(50.0), after.pct(50.0)),
            ratio(before.pct(99.0), after.pct(99.0)),
            ratio(before.max(), after.max()),
            ratio(before.mean(), after.mean()),
            before.slow(Duration::from_millis(100)),
            after.slow(Duration::from_millis(100)),
        );
    }
}
