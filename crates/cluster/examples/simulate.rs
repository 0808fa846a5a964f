//! Scale by simulation: N cluster nodes (the real [`Cluster`] code, each with its own
//! records database) in one process over chitchat's in-memory `ChannelTransport`
//! (every message serialised and parsed as on UDP, and refused above UDP's 65,507
//! bytes as a real datagram would be).
//!
//! Time is tokio's paused clock: the runtime jumps to the next timer whenever every
//! task waits, so the figures are in simulated time and do not depend on how fast
//! the machine is; a run of 1,000 nodes only takes longer in real time. chitchat's
//! failure detector and gossip timers and this crate's pacing all read tokio's
//! clock, so they see the same simulated time.
//!
//! It measures, for N nodes: the time until every node lists every other live
//! (join from three seeds), the time one new entry takes to reach every node
//! (median and worst of `--changes`) and the bytes one change costs the cluster
//! beyond the idle traffic, bytes and messages per node per second while idle and
//! the largest message, and how long the others take to hide a stopped node's
//! entries (failure detection). The transport has no latency: convergence counts
//! gossip exchanges, and a real network adds its round trips.
//!
//! `cargo run --release -p dwara-cluster --example simulate -- --nodes 100
//! [--interval-ms 100] [--phi 8] [--changes 5] [--idle-s 10]`
//! (`cargo xtask perf cluster --simulate 100,1000` runs it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{ChannelTransport, RecvOutcome, SendOutcome, Socket, Transport};
use dwara_cluster::{Cluster, ClusterConfig, FailureDetectorSettings, PeerState};
use dwara_nameserver::{Db, DbConfig, Domain};
use tokio::time::Instant;

/// chitchat's (and UDP's) largest datagram payload.
const MAX_DATAGRAM: usize = 65_507;

/// A `ChannelTransport` that also records the largest message sent and the sends
/// refused (larger than a datagram).
#[derive(Clone, Default)]
struct Metered {
    inner: ChannelTransport,
    largest: Arc<AtomicUsize>,
    refused: Arc<AtomicU64>,
}

struct MeteredSocket {
    inner: Box<dyn Socket>,
    largest: Arc<AtomicUsize>,
    refused: Arc<AtomicU64>,
}

#[async_trait]
impl Transport for Metered {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        Ok(Box::new(MeteredSocket {
            inner: self.inner.open(listen_addr).await?,
            largest: self.largest.clone(),
            refused: self.refused.clone(),
        }))
    }
}

#[async_trait]
impl Socket for MeteredSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        match self.inner.send(to, envelope).await {
            Ok(out) => {
                self.largest
                    .fetch_max(out.num_bytes_sent, Ordering::Relaxed);
                Ok(out)
            }
            Err(e) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        self.inner.recv().await
    }
}

struct Options {
    nodes: usize,
    interval: Duration,
    phi: f64,
    changes: usize,
    idle: Duration,
}

fn options() -> Options {
    let mut o = Options {
        nodes: 100,
        interval: Duration::from_millis(100),
        phi: 8.0,
        changes: 5,
        idle: Duration::from_secs(10),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().map(String::as_str).unwrap_or_default();
        let bad = || -> ! {
            eprintln!("simulate: bad {flag} {value:?}");
            std::process::exit(2)
        };
        match flag.as_str() {
            "--nodes" => o.nodes = value.parse().unwrap_or_else(|_| bad()),
            "--interval-ms" => {
                o.interval = Duration::from_millis(value.parse().unwrap_or_else(|_| bad()));
            }
            "--phi" => o.phi = value.parse().unwrap_or_else(|_| bad()),
            "--changes" => o.changes = value.parse().unwrap_or_else(|_| bad()),
            "--idle-s" => o.idle = Duration::from_secs(value.parse().unwrap_or_else(|_| bad())),
            _ => bad(),
        }
    }
    if o.nodes < 4 || o.changes == 0 {
        eprintln!("simulate: --nodes must be at least 4, --changes at least 1");
        std::process::exit(2);
    }
    o
}

fn addr(i: usize) -> SocketAddr {
    let ip = Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250 + 1) as u8);
    SocketAddr::from((ip, 7946))
}

struct Node {
    db: Arc<Db>,
    cluster: Option<Cluster>,
}

/// Advances simulated time in `step`s until `f` holds or `limit` passes; the
/// simulated time it took.
async fn until(step: Duration, limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if f() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(step).await;
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("never".to_owned(), |d| {
        format!("{:.0}", d.as_secs_f64() * 1000.0)
    })
}

async fn simulate(o: Options) {
    let n = o.nodes;
    let transport = Metered {
        inner: ChannelTransport::with_mtu(MAX_DATAGRAM),
        ..Metered::default()
    };
    let real = std::time::Instant::now();
    let mut nodes = Vec::with_capacity(n);
    let seeds: Vec<String> = (0..3).map(|i| addr(i).to_string()).collect();
    for i in 0..n {
        let name = format!("n{i}");
        let mut dbc = DbConfig::new(Domain::new("weave.local").unwrap());
        dbc.origin = name.clone();
        let db = Arc::new(Db::new(dbc));
        let mut c = ClusterConfig::new(&name, addr(i));
        c.peers = seeds
            .iter()
            .filter(|s| **s != addr(i).to_string())
            .cloned()
            .collect();
        c.gossip_interval = o.interval;
        c.failure_detector = FailureDetectorSettings {
            phi_threshold: o.phi,
            ..FailureDetectorSettings::default()
        };
        c.generation_id = Some(1);
        let cluster = Cluster::start_with_transport(c, db.clone(), &transport)
            .await
            .unwrap();
        nodes.push(Node {
            db,
            cluster: Some(cluster),
        });
    }
    let limit = Duration::from_secs(600);
    let joined = until(Duration::from_millis(250), limit, || {
        nodes.iter().all(|node| {
            node.cluster
                .as_ref()
                .unwrap()
                .peers()
                .iter()
                .filter(|p| p.state == PeerState::Live)
                .count()
                == n
        })
    })
    .await;
    println!(
        "nodes={n} interval_ms={} phi={} join_ms={}",
        o.interval.as_millis(),
        o.phi,
        ms(joined)
    );

    // Convergence of one change, on nodes spread over the cluster.
    let mut times = Vec::new();
    let before = transport.inner.statistics();
    let spent = Instant::now();
    for k in 0..o.changes {
        let origin = (k * 7919) % n;
        let ip = IpAddr::from([10, 200, (k >> 8) as u8, k as u8]);
        let fqdn = format!("change{k}.weave.local");
        nodes[origin].db.add(&format!("c{k}"), ip, &fqdn).unwrap();
        let took = until(Duration::from_millis(1), limit, || {
            nodes.iter().all(|node| node.db.lookup(&fqdn).contains(&ip))
        })
        .await;
        times.push(took.unwrap_or(limit));
    }
    let after = transport.inner.statistics();
    // What the changes cost beyond the idle traffic of the same span (measured next).
    let change_bytes = after.num_bytes_total - before.num_bytes_total;
    let change_span = spent.elapsed();
    times.sort();
    println!(
        "nodes={n} change_on_every_node_ms median={} worst={}",
        ms(Some(times[times.len() / 2])),
        ms(times.last().copied())
    );

    // Idle: what the heartbeats and anti-entropy cost.
    let before = transport.inner.statistics();
    let started = Instant::now();
    tokio::time::sleep(o.idle).await;
    let after = transport.inner.statistics();
    let secs = started.elapsed().as_secs_f64();
    let per_node = |total: u64| total as f64 / n as f64 / secs;
    println!(
        "nodes={n} idle bytes_per_node_per_s={:.0} messages_per_node_per_s={:.1} largest_message_bytes={} refused_oversized={}",
        per_node(after.num_bytes_total - before.num_bytes_total),
        per_node(after.num_messages_total - before.num_messages_total),
        transport.largest.load(Ordering::Relaxed),
        transport.refused.load(Ordering::Relaxed),
    );
    let idle_rate = (after.num_bytes_total - before.num_bytes_total) as f64 / secs;
    let extra = change_bytes as f64 - idle_rate * change_span.as_secs_f64();
    println!(
        "nodes={n} bytes_per_change_cluster_wide={:.0} (beyond idle)",
        (extra / o.changes as f64).max(0.0)
    );

    // Failure detection: the last node stops; the others hide its entry.
    let victim = nodes.pop().unwrap();
    let ip = IpAddr::from([10, 201, 0, 1]);
    victim.db.add("victim", ip, "victim.weave.local").unwrap();
    until(Duration::from_millis(1), limit, || {
        nodes
            .iter()
            .all(|node| node.db.lookup("victim.weave.local").contains(&ip))
    })
    .await;
    victim.cluster.unwrap().shutdown().await;
    let mut first = None;
    let started = Instant::now();
    let hidden = until(Duration::from_millis(10), limit, || {
        let count = nodes
            .iter()
            .filter(|node| node.db.lookup("victim.weave.local").is_empty())
            .count();
        if count > 0 && first.is_none() {
            first = Some(started.elapsed());
        }
        count == nodes.len()
    })
    .await;
    println!(
        "nodes={n} stopped_node_hidden_ms first={} all={}",
        ms(first),
        ms(hidden)
    );
    println!("nodes={n} real_time_s={:.1}", real.elapsed().as_secs_f64());
    for node in &mut nodes {
        if let Some(c) = node.cluster.take() {
            c.shutdown().await;
        }
    }
}

fn main() {
    let o = options();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(simulate(o));
}
