//! Timing harness: convergence of a new record on 3, 5 and 10 cluster nodes over real
//! UDP on loopback (median and worst of 20 records), how long a stopped node's
//! entries take to vanish, and how long a new node takes to sync many records.
//!
//! `cargo run --release -p dwara-cluster --example convergence [-- RECORDS_TO_SYNC]`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dwara_cluster::{Cluster, ClusterConfig};
use dwara_records::{Db, DbConfig, Domain};

struct Node {
    db: Arc<Db>,
    cluster: Option<Cluster>,
}

fn free_addr() -> SocketAddr {
    let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    s.local_addr().unwrap()
}

async fn start(name: &str, addr: SocketAddr, seed: Option<SocketAddr>) -> Node {
    let mut config = DbConfig::new(Domain::new("weave.local").unwrap());
    config.origin = name.to_owned();
    let db = Arc::new(Db::new(config));
    let mut c = ClusterConfig::new(name, addr);
    c.peers = seed.iter().map(ToString::to_string).collect();
    let cluster = Cluster::start(c, db.clone()).await.unwrap();
    Node {
        db,
        cluster: Some(cluster),
    }
}

async fn wait(timeout: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    None
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn cluster(n: usize) -> Vec<Node> {
    let mut nodes = Vec::new();
    let first = free_addr();
    for i in 0..n {
        let addr = if i == 0 { first } else { free_addr() };
        let seed = (i > 0).then_some(first);
        nodes.push(start(&format!("n{i}"), addr, seed).await);
    }
    let all_live = wait(Duration::from_secs(30), || {
        nodes.iter().all(|node| {
            node.cluster
                .as_ref()
                .unwrap()
                .peers()
                .iter()
                .filter(|p| p.state == dwara_cluster::PeerState::Live)
                .count()
                == n
        })
    })
    .await;
    assert!(all_live.is_some(), "{n} nodes never all live");
    nodes
}

#[tokio::main]
async fn main() {
    let sync_records: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    for n in [3, 5, 10] {
        let mut nodes = cluster(n).await;
        let mut times = Vec::new();
        for r in 0..20u32 {
            let ip = IpAddr::from([10, 42, n as u8, r as u8]);
            let fqdn = format!("r{r}.weave.local");
            nodes[r as usize % n]
                .db
                .add(&format!("c{r}"), ip, &fqdn)
                .unwrap();
            let t = wait(Duration::from_secs(10), || {
                nodes.iter().all(|node| node.db.lookup(&fqdn).contains(&ip))
            })
            .await
            .expect("record never converged");
            times.push(t);
        }
        times.sort();
        println!(
            "nodes={n:2} convergence of a new record: median {:.1} ms, worst {:.1} ms (20 records)",
            ms(times[times.len() / 2]),
            ms(times[times.len() - 1])
        );
        // A node that stops: its entries vanish elsewhere.
        let victim = nodes.pop().unwrap();
        let ip = IpAddr::from([10, 43, 0, 1]);
        victim.db.add("v", ip, "victim.weave.local").unwrap();
        wait(Duration::from_secs(10), || {
            nodes[0].db.lookup("victim.weave.local").contains(&ip)
        })
        .await
        .unwrap();
        victim.cluster.unwrap().shutdown().await;
        let vanish = wait(Duration::from_secs(30), || {
            nodes
                .iter()
                .all(|node| node.db.lookup("victim.weave.local").is_empty())
        })
        .await;
        println!(
            "nodes={n:2} stopped node's entries vanish after {}",
            vanish.map_or("(never)".to_owned(), |d| format!("{:.0} ms", ms(d)))
        );
        for node in &mut nodes {
            node.cluster.take().unwrap().shutdown().await;
        }
    }
    // A new node syncing many records from a 3-node cluster.
    let nodes = cluster(3).await;
    for i in 0..sync_records {
        let ip = IpAddr::from([10, 50, (i >> 8) as u8, i as u8]);
        nodes[0]
            .db
            .add(&format!("s{i}"), ip, &format!("s{i}.weave.local"))
            .unwrap();
    }
    wait(Duration::from_secs(60), || {
        nodes[1].db.len() == sync_records
    })
    .await
    .unwrap();
    let start_at = Instant::now();
    let seed = nodes[0].cluster.as_ref().unwrap().gossip_addr();
    let newcomer = start("late", free_addr(), Some(seed)).await;
    let synced = wait(Duration::from_secs(120), || {
        newcomer.db.len() == sync_records
    })
    .await;
    println!(
        "new node synced {sync_records} records in {}",
        synced.map_or("(never)".to_owned(), |_| format!(
            "{:.0} ms",
            ms(start_at.elapsed())
        ))
    );
}
