//! Shared test support for the dwara workspace (not published).
//!
//! - [`dns_server::TestDnsServer`]: an in-process DNS server on hickory-server whose
//!   records, TTLs, failure mode and latency can be changed while a test runs, and
//!   which counts the queries it receives.
//! - [`dnsmasq::Dnsmasq`]: a real dnsmasq on a loopback port serving a hosts file the
//!   test controls.
//! - [`http::request`] / [`http::request_async`]: one request on reqwest to our
//!   HTTP APIs.
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
pub mod http;

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
pub fn free_port() -> u16 {
    loop {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind udp on loopback");
        let port = udp.local_addr().expect("local addr").port();
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return port;
        }
    }
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
