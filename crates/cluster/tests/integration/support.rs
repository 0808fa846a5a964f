//! Test nodes: a records database and a cluster node on a shared transport.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dwara_cluster::{ChannelTransport, Cluster, ClusterConfig, ClusterKey, KeySource, Transport};
use dwara_records::{Db, DbConfig, Domain};

/// How long a test waits for a condition.
pub(crate) const WAIT: Duration = Duration::from_secs(15);

pub(crate) fn db(origin: &str) -> Arc<Db> {
    let mut config = DbConfig::new(Domain::new("weave.local").unwrap());
    config.origin = origin.to_owned();
    Arc::new(Db::new(config))
}

pub(crate) fn config(name: &str, addr: SocketAddr, seeds: &[SocketAddr]) -> ClusterConfig {
    let mut c = ClusterConfig::new(name, addr);
    c.peers = seeds.iter().map(ToString::to_string).collect();
    c
}

pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    pub(crate) db: Arc<Db>,
    pub(crate) cluster: Option<Cluster>,
}

impl Node {
    pub(crate) fn cluster(&self) -> &Cluster {
        self.cluster.as_ref().unwrap()
    }

    pub(crate) fn sees(&self, fqdn: &str, ip: &str) -> bool {
        self.db.lookup(fqdn).contains(&ip.parse().unwrap())
    }

    pub(crate) async fn stop(&mut self) {
        if let Some(c) = self.cluster.take() {
            c.shutdown().await;
        }
    }
}

pub(crate) fn chan_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 20_000 + i as u16))
}

pub(crate) async fn start(
    transport: &dyn Transport,
    name: &str,
    addr: SocketAddr,
    seeds: &[SocketAddr],
    key: Option<&ClusterKey>,
) -> Node {
    let db = db(name);
    start_with_db(transport, name, addr, seeds, key, db).await
}

pub(crate) async fn start_with_db(
    transport: &dyn Transport,
    name: &str,
    addr: SocketAddr,
    seeds: &[SocketAddr],
    key: Option<&ClusterKey>,
    db: Arc<Db>,
) -> Node {
    let mut c = config(name, addr, seeds);
    if let Some(k) = key {
        c.key = KeySource::Key(k.clone());
    }
    let cluster = Cluster::start_with_transport(c, db.clone(), transport)
        .await
        .unwrap();
    Node {
        name: name.to_owned(),
        addr,
        db,
        cluster: Some(cluster),
    }
}

/// `n` nodes named `n0..` on one channel transport, each seeded with node 0.
pub(crate) async fn channel_cluster(
    n: usize,
    key: Option<&ClusterKey>,
) -> (ChannelTransport, Vec<Node>) {
    test_support::init_tracing();
    let transport = ChannelTransport::default();
    let mut nodes = Vec::new();
    for i in 0..n {
        let seeds = if i == 0 { vec![] } else { vec![chan_addr(0)] };
        nodes.push(start(&transport, &format!("n{i}"), chan_addr(i), &seeds, key).await);
    }
    (transport, nodes)
}

/// Waits until every node sees every other as a live peer.
pub(crate) async fn all_live(nodes: &[Node]) -> bool {
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    test_support::wait_until(WAIT, || async {
        nodes.iter().all(|n| {
            let peers = n.cluster().peers();
            names.iter().all(|name| {
                peers
                    .iter()
                    .any(|p| &p.node_id == name && p.state == dwara_cluster::PeerState::Live)
            })
        })
    })
    .await
}

/// The value of one sample in the node's metrics text (`name` with labels, if any).
pub(crate) fn metric(cluster: &Cluster, sample: &str) -> Option<f64> {
    let mut registry = prometheus_client::registry::Registry::default();
    cluster.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines().find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == sample).then(|| value.parse().ok())?
    })
}
