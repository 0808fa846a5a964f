//! The example Pingora proxy as a real process, its backends found through
//! `DwaraDiscovery` in the in-process test DNS server: real HTTP requests follow
//! an SRV answer as it changes.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use test_support::dns_server::{SrvRecord, TestDnsServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SRV_NAME: &str = "_http._tcp.api.test.";
const WAIT: Duration = Duration::from_secs(20);

/// An HTTP backend answering every request with its name, one request per connection.
async fn backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            });
        }
    });
    addr
}

fn srv(backends: &[(&str, SocketAddr)]) -> Vec<SrvRecord> {
    backends
        .iter()
        .map(|(name, addr)| SrvRecord {
            priority: 0,
            weight: 1,
            port: addr.port(),
            target: format!("{name}.api.test."),
        })
        .collect()
}

/// One request through the proxy: the body (the backend's name), or the status line.
async fn get(proxy: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect(proxy).await.ok()?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: api.test\r\nconnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

/// Requests until `done` holds for the names answered so far; panics after [`WAIT`].
async fn until(proxy: SocketAddr, done: impl Fn(&HashSet<String>) -> bool) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    let mut answers = Vec::new();
    let mut seen = HashSet::new();
    while !done(&seen) {
        assert!(Instant::now() < deadline, "gave up after {answers:?}");
        match get(proxy).await {
            Some(name) => {
                seen.insert(name.clone());
                answers.push(name);
            }
            // Not listening yet, or no backend yet.
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    answers
}

/// The example, built by `cargo test` beside this test's executable.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    profile_dir.join("examples").join("proxy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pingora_proxy_follows_srv_changes_with_real_requests() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    let backends = [
        ("one", backend("one").await),
        ("two", backend("two").await),
        ("three", backend("three").await),
    ];
    for (name, _) in &backends {
        dns.set_a(&format!("{name}.api.test."), &[Ipv4Addr::LOCALHOST], 1);
    }
    dns.set_srv(SRV_NAME, &srv(&backends[..2]), 1);

    let proxy = test_support::free_addr();
    let mut child = tokio::process::Command::new(example_binary())
        .args([
            proxy.to_string(),
            dns.addr().to_string(),
            "SRV".to_owned(),
            SRV_NAME.trim_end_matches('.').to_owned(),
        ])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the proxy example runs (cargo test builds it)");

    // Both advertised backends serve; the third is never asked.
    let answers = until(proxy, |seen| seen.len() == 2).await;
    assert!(!answers.iter().any(|a| a == "three"), "{answers:?}");

    // "one" leaves the answer, "three" joins: Pingora's next update swaps them.
    dns.set_srv(SRV_NAME, &srv(&backends[1..]), 1);
    until(proxy, |seen| seen.contains("three")).await;
    let mut after = Vec::new();
    for _ in 0..20 {
        after.push(get(proxy).await.expect("a request through the proxy"));
    }
    assert!(
        !after.iter().any(|a| a == "one"),
        "a removed backend still served: {after:?}"
    );
    assert!(after.iter().any(|a| a == "two") && after.iter().any(|a| a == "three"));

    // DNS fails: fail_open keeps the backends serving.
    dns.set_failure(test_support::dns_server::FailureMode::ServFail);
    let served = dns.query_count();
    let deadline = Instant::now() + WAIT;
    while dns.query_count() < served + 3 {
        assert!(Instant::now() < deadline, "the proxy stopped asking DNS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..10 {
        let name = get(proxy).await.expect("served while DNS fails");
        assert!(name == "two" || name == "three", "{name}");
    }
    child.kill().await.unwrap();
    dns.shutdown().await;
}
