//! Scale by simulation: N cluster nodes (the real [`Cluster`] code, each with its own
//! records database) in one process over an in-memory network: every message is
//! serialised and parsed as on UDP (by chitchat's own codec), refused above UDP's
//! 65,507 bytes, and dropped when the receiver's queue would exceed a socket
//! receive buffer (`--rcvbuf`, default 212,992 bytes: Linux's default).
//!
//! Time is tokio's paused clock: the runtime jumps to the next timer whenever every
//! task waits, so the figures are in simulated time and do not depend on how fast
//! the machine is; a run of 1,000 nodes only takes longer in real time. chitchat's
//! failure detector and gossip timers and this crate's pacing all read tokio's
//! clock, so they see the same simulated time. Node starts are spread over one
//! gossip interval, so their rounds do not all fall on the same instant.
//!
//! It measures, for N nodes: the time until every node lists every other live
//! (join from three seeds, after the last node started), the time one new entry
//! takes to reach every node (median and worst of `--changes`) and the bytes one
//! change costs the cluster beyond the idle traffic, bytes and messages per node per
//! second while idle and the largest message, and how long the others take to hide a
//! stopped node's entries (failure detection). The network has no latency:
//! convergence counts gossip exchanges, and a real network adds its round trips.
//!
//! The failure detector keeps `--window` heartbeat intervals per peer (default 100;
//! dwara's default is 1,000): chitchat's phi is the time since the last heartbeat
//! over their mean, so the window only sets how long the mean remembers, while
//! 1,000 intervals of 8 bytes for each of N² pairs would be 8 GB at 1,000 nodes.
//!
//! `cargo run --release -p dwara-cluster --example simulate -- --nodes 100
//! [--interval-ms 100] [--phi 8] [--push-fanout 16|all] [--changes 5] [--idle-s 10]
//! [--window 100] [--rcvbuf 212992]`
//! (`cargo xtask perf cluster --simulate 100,1000` runs it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{ChannelTransport, RecvOutcome, SendOutcome, Socket, Transport};
use dwara_cluster::{
    Cluster, ClusterConfig, DEFAULT_PUSH_FANOUT, FailureDetectorSettings, PeerState,
};
use dwara_records::{Db, DbConfig, Domain};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// chitchat's (and UDP's) largest datagram payload.
const MAX_DATAGRAM: usize = 65_507;

/// The network: per address a queue of datagrams, bounded in bytes as a UDP socket's
/// receive buffer is (a datagram that does not fit is dropped, as the kernel drops
/// it). Every message is serialised and parsed again on the way by a private
/// `ChannelTransport` socket of the sender (chitchat's own codec: it is not public
/// otherwise), which also gives its size; chitchat's `ChannelTransport` itself
/// bounds its queues at 100 messages whatever their size, which at 1,000 nodes
/// (44 kB messages) holds 20 times what a default socket buffer does.
#[derive(Clone)]
struct Net {
    queues: Arc<Mutex<HashMap<SocketAddr, Inbox>>>,
    stats: Arc<Stats>,
    rcvbuf: usize,
}

#[derive(Clone)]
struct Inbox {
    tx: mpsc::UnboundedSender<RecvOutcome>,
    queued: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Stats {
    bytes: AtomicU64,
    messages: AtomicU64,
    largest: AtomicUsize,
    /// Larger than a datagram: not sent.
    refused: AtomicU64,
    /// The receiver's buffer was full.
    dropped: AtomicU64,
}

impl Stats {
    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    fn messages(&self) -> u64 {
        self.messages.load(Ordering::Relaxed)
    }
}

struct NetSocket {
    addr: SocketAddr,
    net: Net,
    rx: mpsc::UnboundedReceiver<RecvOutcome>,
    queued: Arc<AtomicUsize>,
    /// Serialises and parses each message sent (to itself).
    codec: Box<dyn Socket>,
}

#[async_trait]
impl Transport for Net {
    async fn open(&self, addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let inbox = Inbox {
            tx,
            queued: queued.clone(),
        };
        if self.queues.lock().unwrap().insert(addr, inbox).is_some() {
            anyhow::bail!("{addr} is already open");
        }
        let codec = ChannelTransport::with_mtu(MAX_DATAGRAM).open(addr).await?;
        Ok(Box::new(NetSocket {
            addr,
            net: self.clone(),
            rx,
            queued,
            codec,
        }))
    }
}

#[async_trait]
impl Socket for NetSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.addr)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let stats = &self.net.stats;
        if let Err(err) = self.codec.send(self.addr, envelope).await {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(err);
        }
        let mut parsed = self.codec.recv().await?;
        let len = parsed.num_bytes_received;
        parsed.from_addr = self.addr;
        stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
        stats.messages.fetch_add(1, Ordering::Relaxed);
        stats.largest.fetch_max(len, Ordering::Relaxed);
        let inbox = self.net.queues.lock().unwrap().get(&to).cloned();
        if let Some(inbox) = inbox {
            if inbox.queued.load(Ordering::Relaxed) + len > self.net.rcvbuf {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            } else if inbox.tx.send(parsed).is_ok() {
                inbox.queued.fetch_add(len, Ordering::Relaxed);
            }
        }
        Ok(SendOutcome {
            num_bytes_sent: len,
        })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        let Some(received) = self.rx.recv().await else {
            anyhow::bail!("{} closed", self.addr);
        };
        self.queued
            .fetch_sub(received.num_bytes_received, Ordering::Relaxed);
        Ok(received)
    }
}

impl Drop for NetSocket {
    fn drop(&mut self) {
        self.net.queues.lock().unwrap().remove(&self.addr);
    }
}

struct Options {
    nodes: usize,
    interval: Duration,
    phi: f64,
    changes: usize,
    idle: Duration,
    window: usize,
    rcvbuf: usize,
    push_fanout: usize,
}

fn options() -> Options {
    let mut o = Options {
        nodes: 100,
        interval: Duration::from_millis(100),
        phi: 8.0,
        changes: 5,
        idle: Duration::from_secs(10),
        window: 100,
        rcvbuf: 212_992,
        push_fanout: DEFAULT_PUSH_FANOUT,
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
            "--window" => o.window = value.parse().unwrap_or_else(|_| bad()),
            "--rcvbuf" => o.rcvbuf = value.parse().unwrap_or_else(|_| bad()),
            "--push-fanout" if value == "all" => o.push_fanout = usize::MAX,
            "--push-fanout" => o.push_fanout = value.parse().unwrap_or_else(|_| bad()),
            _ => bad(),
        }
    }
    if o.nodes < 4 || o.changes == 0 || o.window == 0 || o.rcvbuf < MAX_DATAGRAM {
        eprintln!(
            "simulate: --nodes must be at least 4, --changes and --window at least 1, --rcvbuf at least {MAX_DATAGRAM}"
        );
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
    let transport = Net {
        queues: Arc::default(),
        stats: Arc::default(),
        rcvbuf: o.rcvbuf,
    };
    let stats = transport.stats.clone();
    let real = std::time::Instant::now();
    let mut nodes = Vec::with_capacity(n);
    let seeds: Vec<String> = (0..3).map(|i| addr(i).to_string()).collect();
    // Node i starts i/n of an interval after the first, so the gossip rounds of the
    // nodes are spread over the interval as on independent hosts instead of all
    // falling on the same instant.
    let t0 = Instant::now();
    for i in 0..n {
        tokio::time::sleep_until(t0 + o.interval.mul_f64(i as f64 / n as f64)).await;
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
        c.push_fanout = o.push_fanout;
        c.failure_detector = FailureDetectorSettings {
            phi_threshold: o.phi,
            sampling_window_size: o.window,
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
    // Every simulated second, how far the join is (on stderr): a join that does not
    // complete (a phi threshold too low for the cluster's size keeps declaring live
    // peers dead) shows here instead of in silence.
    let mut checks = 0u32;
    let joined = until(Duration::from_millis(250), limit, || {
        let live: Vec<usize> = nodes
            .iter()
            .map(|node| {
                node.cluster
                    .as_ref()
                    .unwrap()
                    .peers()
                    .iter()
                    .filter(|p| p.state == PeerState::Live)
                    .count()
            })
            .collect();
        checks += 1;
        if checks.is_multiple_of(4) {
            eprintln!(
                "nodes={n} joining t={}s: {} of {n} nodes list all {n} live, the fewest list {}",
                checks / 4,
                live.iter().filter(|l| **l == n).count(),
                live.iter().min().copied().unwrap_or(0),
            );
        }
        live.iter().all(|l| *l == n)
    })
    .await;
    println!(
        "nodes={n} interval_ms={} phi={} push_fanout={} window={} rcvbuf={} join_ms={} dropped={}",
        o.interval.as_millis(),
        o.phi,
        if o.push_fanout == usize::MAX {
            "all".to_owned()
        } else {
            o.push_fanout.to_string()
        },
        o.window,
        o.rcvbuf,
        ms(joined),
        stats.dropped.load(Ordering::Relaxed),
    );
    eprintln!(
        "nodes={n} joined after {:.1} s real",
        real.elapsed().as_secs_f64()
    );

    // Convergence of one change, on nodes spread over the cluster.
    let mut times = Vec::new();
    let before = (stats.bytes(), stats.messages());
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
    let after = (stats.bytes(), stats.messages());
    // What the changes cost beyond the idle traffic of the same span (measured next).
    let change_bytes = after.0 - before.0;
    let change_span = spent.elapsed();
    times.sort();
    println!(
        "nodes={n} change_on_every_node_ms median={} worst={} dropped={}",
        ms(Some(times[times.len() / 2])),
        ms(times.last().copied()),
        stats.dropped.load(Ordering::Relaxed),
    );

    // Idle: what the heartbeats and anti-entropy cost.
    let before = (stats.bytes(), stats.messages());
    let started = Instant::now();
    tokio::time::sleep(o.idle).await;
    let after = (stats.bytes(), stats.messages());
    let secs = started.elapsed().as_secs_f64();
    let per_node = |total: u64| total as f64 / n as f64 / secs;
    println!(
        "nodes={n} idle bytes_per_node_per_s={:.0} messages_per_node_per_s={:.1} largest_message_bytes={} refused_oversized={} dropped={}",
        per_node(after.0 - before.0),
        per_node(after.1 - before.1),
        stats.largest.load(Ordering::Relaxed),
        stats.refused.load(Ordering::Relaxed),
        stats.dropped.load(Ordering::Relaxed),
    );
    let idle_rate = (after.0 - before.0) as f64 / secs;
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
