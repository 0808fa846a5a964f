//! Shared test support for the dwara workspace (not published).
//!
//! - [`dns_server::TestDnsServer`]: an in-process DNS server on hickory-server whose
//!   records, TTLs, failure mode and latency can be changed while a test runs, and
//!   which counts the queries it receives.
//! - [`dnsmasq::Dnsmasq`]: a real dnsmasq on a loopback port serving a hosts file the
//!   test controls.
//! - [`http::request`] / [`http::request_async`]: one request on reqwest to our
//!   HTTP APIs.
//! - [`http_backend::HttpBackend`]: an HTTP server answering with its own address.
//! - [`docker`]: the real Docker engine through its CLI: [`docker::docker`], the
//!   busybox test image [`docker::BUSYBOX_IMAGE`] built once per process, and
//!   [`docker::Scope`], a test's containers and networks removed on drop.
//! - [`liar::LyingDnsServer`]: a raw-UDP DNS server that answers with the [`liar::Lie`]
//!   a test picks (wrong IDs, truncation, compression loops, floods, noise …).
//! - [`netem::Delayer`]: netem's delay and jitter in userspace, for the packets an
//!   iptables `NFQUEUE` rule hands it in a network namespace (kernels without netem).
//! - [`require()`] / [`require_ok`]: a test's prerequisite (Docker, network
//!   namespaces, a tool): skipped with one line under a plain `cargo test`, a failure
//!   under `cargo xtask ci` ([`require::REQUIRE_ALL`]).
//! - [`init_tracing`], [`free_port`], [`wait_until`], [`signal`]: small helpers.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use test_support::dns_server::TestDnsServer;
//! let server = TestDnsServer::start().await?;
//! server.set_a("api.test.", &["10.0.0.1".parse().unwrap()], 30);
//! println!("serving on {}", server.addr());
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod dig;
pub mod dns_server;
pub mod dnsmasq;
pub mod docker;
pub mod http;
pub mod http_backend;
pub mod liar;
pub mod netem;
pub mod require;

pub use require::{require, require_ok};

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::Command;
use std::time::Duration;

/// Installs a test-friendly tracing subscriber once (`RUST_LOG` filters; default warn).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A loopback port that is free for both UDP and TCP at the time of the call.
///
/// Ports come from 20000–32767, below Linux's ephemeral range (32768–60999): a
/// server a test stops and starts again on its port (a dnsmasq restart) cannot lose
/// it to some client socket's ephemeral bind in the meantime. Successive calls in
/// one process walk the range from a random start, so they never repeat a port.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_768;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let _ = NEXT.compare_exchange(
            u32::MAX,
            (seed % u64::from(COUNT)) as u32,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
    for _ in 0..COUNT {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % COUNT) as u16;
        if UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + COUNT);
}

/// `127.0.0.1:<free port>`.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()))
}

/// Polls `check` every 20 ms until it returns true or `timeout` passes.
/// Returns whether the condition was met: tests assert on it.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `SIG<name>` to `pid` with kill(1) (no unsafe code here).
pub fn signal(pid: u32, name: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -{name} {pid} failed")))
    }
}
