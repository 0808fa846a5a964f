//! The library default leaves no thread behind: the coarse clock's ticker thread
//! runs while a cache (or a config) holds a coarse clock and is joined when the last
//! one is dropped.
//!
//! Its own test binary: every other test's caches would share the same ticker.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use dwara_dns_cache::{COARSE_THREAD_NAME, DnsCache, DnsCacheConfig};
use dwara_resolver::{DnsResolver, ResolverConfig};
use test_support::dns_server::TestDnsServer;

/// The names of this process's threads, from procfs.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|task| {
            let comm = task.unwrap().path().join("comm");
            std::fs::read_to_string(comm)
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .collect()
}

fn clock_threads() -> usize {
    thread_names()
        .iter()
        .filter(|name| name.as_str() == COARSE_THREAD_NAME)
        .count()
}

/// Polls `done` every millisecond for up to five seconds.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

#[test]
fn the_default_clock_thread_stops_with_the_last_cache() {
    let threads_before = thread_names().len();
    assert_eq!(clock_threads(), 0, "a clock thread before any cache");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = TestDnsServer::start().await.unwrap();
        server.set_a("api.test.", &[Ipv4Addr::new(10, 0, 0, 1)], 30);
        let resolver = || {
            DnsResolver::new(ResolverConfig {
                nameservers: vec![server.addr()],
                ..ResolverConfig::default()
            })
            .unwrap()
        };
        let first = DnsCache::new(resolver(), DnsCacheConfig::default()).unwrap();
        let second = DnsCache::new(resolver(), DnsCacheConfig::default()).unwrap();
        first.resolve("api.test").await.unwrap();
        second.resolve("api.test").await.unwrap();
        // One hit each, read on the coarse clock.
        first.resolve("api.test").await.unwrap();
        assert_eq!(first.stats().hits, 1);
        // The thread names itself once it runs (the spawn returns before that).
        assert!(
            eventually(|| clock_threads() == 1),
            "every coarse clock shares one thread: {:?}",
            thread_names()
        );

        drop(first);
        assert_eq!(clock_threads(), 1, "a cache still holds the clock");
        drop(second);
        // The drop joined the thread; procfs may list it a moment longer.
        assert!(
            eventually(|| clock_threads() == 0),
            "the clock thread outlived every cache: {:?}",
            thread_names()
        );
        server.shutdown().await;
    });
    drop(runtime);

    // A new cache after that starts a new thread, which stops again.
    let cache_config = DnsCacheConfig::default();
    // The thread names itself once it runs.
    assert!(eventually(|| clock_threads() == 1));
    drop(cache_config);
    assert!(
        eventually(|| thread_names().len() == threads_before),
        "threads left behind: {:?}",
        thread_names()
    );
    assert_eq!(clock_threads(), 0);
}
