//! Entries travel in buckets: a few chitchat keys per node, growth that never drops an
//! entry on a receiver, entries held by two keys, and the single-entry keys of builds
//! before buckets.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use chitchat::transport::ChannelTransport;
use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ProtocolVersion,
    spawn_chitchat,
};
use dwara_cluster::codec::{Bucket, Item, Record, encode_bucket_value, encode_value};
use dwara_cluster::{DEFAULT_CLUSTER_ID, DEFAULT_GOSSIP_INTERVAL, ValueRejection};
use test_support::wait_until;

use crate::support::*;

fn ip(i: u32) -> IpAddr {
    IpAddr::from([10, 20, (i >> 8) as u8, i as u8])
}

fn id(i: u32) -> String {
    // Container-id sized, so a few thousand entries need many buckets.
    format!("{i:08}{}", "c".repeat(56))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_share_few_keys_and_no_entry_flickers_while_buckets_split() {
    let (_t, nodes) = channel_cluster(2, None).await;
    assert!(all_live(&nodes).await);
    // 3,000 entries in ten bursts, each burst replicated before the next: the bucket
    // count doubles several times with the peer already holding the older buckets.
    // An entry that left the peer and came back, or was applied again, would carry
    // another version there than when it first arrived.
    const TOTAL: u32 = 3000;
    let mut first_seen: HashMap<String, u64> = HashMap::new();
    for burst in 0..10 {
        for i in burst * 300..(burst + 1) * 300 {
            nodes[0]
                .db
                .add(&id(i), ip(i), &format!("h{i}.weave.local"))
                .unwrap();
        }
        let want = ((burst + 1) * 300) as usize;
        assert!(
            wait_until(WAIT, || async { nodes[1].db.len() == want }).await,
            "burst {burst}: peer holds {} of {want}",
            nodes[1].db.len()
        );
        for e in nodes[1].db.entries() {
            let first = *first_seen.entry(e.id.clone()).or_insert(e.version);
            assert!(!e.tombstone, "{e:?} left the peer");
            assert_eq!(e.version, first, "{e:?} was applied again");
        }
    }
    let buckets = metric(nodes[0].cluster(), "dwara_cluster_buckets_published").unwrap();
    assert!(
        (16.0..=f64::from(TOTAL) / 20.0).contains(&buckets),
        "{buckets} keys for {TOTAL} entries"
    );
    assert_eq!(
        metric(nodes[0].cluster(), "dwara_cluster_entries_published"),
        Some(f64::from(TOTAL))
    );
    for i in [0, 1, 1499, TOTAL - 1] {
        assert_eq!(
            nodes[1].db.lookup(&format!("h{i}.weave.local")),
            vec![ip(i)]
        );
    }

    // Two thirds removed: exactly those leave the peer, as tombstones.
    for i in (0..TOTAL).filter(|i| i % 3 != 0) {
        assert_eq!(nodes[0].db.remove_all(&id(i)), 1);
    }
    let left = (TOTAL / 3) as usize;
    assert!(
        wait_until(WAIT, || async { nodes[1].db.len() == left }).await,
        "peer holds {}",
        nodes[1].db.len()
    );
    let tombstones = nodes[1].db.entries().iter().filter(|e| e.tombstone).count();
    assert_eq!(tombstones, TOTAL as usize - left);
    assert!(nodes[1].db.lookup("h3.weave.local") == vec![ip(3)]);
    assert!(nodes[1].db.lookup("h4.weave.local").is_empty());

    // All removed: the peer holds none and the node publishes no key.
    for i in (0..TOTAL).step_by(3) {
        nodes[0].db.remove_all(&id(i));
    }
    assert!(wait_until(WAIT, || async { nodes[1].db.is_empty() }).await);
    assert_eq!(
        metric(nodes[0].cluster(), "dwara_cluster_buckets_published"),
        Some(0.0)
    );
}

/// A chitchat node that is not a dwara engine: the test writes its keys by hand.
struct Raw {
    handle: ChitchatHandle,
}

impl Raw {
    async fn start(transport: &ChannelTransport, addr: std::net::SocketAddr, seed: String) -> Raw {
        let id = ChitchatId::new("raw", 9, addr);
        let config = ChitchatConfig {
            chitchat_id: id.clone(),
            cluster_id: DEFAULT_CLUSTER_ID.to_owned(),
            gossip_interval: DEFAULT_GOSSIP_INTERVAL,
            listen_addr: addr,
            seed_nodes: vec![seed],
            failure_detector_config: FailureDetectorConfig {
                initial_interval: DEFAULT_GOSSIP_INTERVAL,
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: Duration::from_secs(600),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V0,
        };
        let handle = spawn_chitchat(config, Vec::new(), transport).await.unwrap();
        Raw { handle }
    }

    /// One mutation of the raw node's keys, then a marker entry in its own key set
    /// last, so a peer that shows the marker has applied everything before it.
    async fn write(&self, marker: u32, ops: Vec<Op>) {
        self.handle
            .with_chitchat(move |cc| {
                let node = cc.self_node_state();
                let mut ops = ops.clone();
                ops.push(Op::Bucket(
                    format!("bm.{marker}"),
                    vec![item(&format!("marker{marker}"), 200 + marker)],
                ));
                for op in ops {
                    match op {
                        Op::Delete(key) => node.delete(&key),
                        Op::Raw(key, value) => node.set(&key, value),
                        Op::Bucket(key, items) => {
                            let bucket = Bucket {
                                version: node.max_version() + 1,
                                items,
                            };
                            node.set(&key, encode_bucket_value(&bucket));
                        }
                        Op::Record(key, item) => {
                            let record = Record {
                                id: item.id,
                                ip: item.ip,
                                fqdn: item.fqdn,
                                version: node.max_version() + 1,
                            };
                            node.set(&key, encode_value(&record));
                        }
                    }
                }
            })
            .await;
    }
}

#[derive(Clone)]
enum Op {
    Bucket(String, Vec<Item>),
    Record(String, Item),
    Raw(String, String),
    Delete(String),
}

fn item(name: &str, i: u32) -> Item {
    Item {
        id: name.to_owned(),
        ip: ip(i),
        fqdn: format!("{name}.weave.local."),
        service: None,
        health: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_stays_while_any_key_holds_it_and_old_single_entry_keys_are_read() {
    test_support::init_tracing();
    let t = ChannelTransport::default();
    let node = start(&t, "a", chan_addr(0), &[], None).await;
    let raw = Raw::start(&t, chan_addr(1), chan_addr(0).to_string()).await;
    let sees = |name: &str, i: u32| node.db.lookup(&format!("{name}.weave.local")) == vec![ip(i)];
    let shown = |marker: u32| sees(&format!("marker{marker}"), 200 + marker);
    let wait_shown =
        |marker: u32| async move { wait_until(WAIT, || async { shown(marker) }).await };

    // A key of a build before buckets: one record under `n0`.
    raw.write(0, vec![Op::Record("n0".into(), item("alpha", 1))])
        .await;
    assert!(wait_shown(0).await, "{:?}", node.db.entries());
    assert!(sees("alpha", 1));

    // alpha in two buckets as well, beta in one.
    raw.write(
        1,
        vec![
            Op::Bucket("b0.0".into(), vec![item("alpha", 1), item("beta", 2)]),
            Op::Bucket("b1.1".into(), vec![item("alpha", 1)]),
        ],
    )
    .await;
    assert!(wait_shown(1).await);
    assert!(sees("alpha", 1) && sees("beta", 2));

    // Two of its three keys let go of alpha: it stays.
    raw.write(
        2,
        vec![
            Op::Delete("n0".into()),
            Op::Bucket("b0.0".into(), vec![item("beta", 2)]),
        ],
    )
    .await;
    assert!(wait_shown(2).await);
    assert!(sees("alpha", 1), "{:?}", node.db.entries());
    assert!(sees("beta", 2));

    // The last one does: alpha is a tombstone at the delete's version.
    raw.write(3, vec![Op::Delete("b1.1".into())]).await;
    assert!(wait_shown(3).await);
    assert!(node.db.lookup("alpha.weave.local").is_empty());
    let alpha = node
        .db
        .entries()
        .into_iter()
        .find(|e| e.id == "alpha")
        .unwrap();
    assert!(alpha.tombstone && alpha.origin == "raw", "{alpha:?}");

    // Values that do not decode, or carry another version, change nothing and are
    // counted; the bucket they would replace keeps what it held.
    let before = node.cluster().rejected_values(ValueRejection::Malformed);
    let forged = {
        let b = Bucket {
            version: 1,
            items: vec![item("forged", 9)],
        };
        encode_bucket_value(&b)
    };
    raw.write(
        4,
        vec![
            Op::Raw("b0.0".into(), forged),
            Op::Raw("b5.5".into(), "AQI".into()),
        ],
    )
    .await;
    assert!(wait_shown(4).await);
    assert!(node.db.lookup("forged.weave.local").is_empty());
    assert!(sees("beta", 2));
    assert_eq!(node.cluster().rejected_values(ValueRejection::Version), 1);
    assert_eq!(
        node.cluster().rejected_values(ValueRejection::Malformed),
        before + 1
    );
    // beta and the five markers. The peer table is refreshed after the pass that
    // applied the last marker, so it may trail the database by a moment.
    let raw_entries = || {
        node.cluster()
            .peers()
            .iter()
            .find(|p| p.node_id == "raw")
            .map(|p| p.entries)
    };
    let counted = wait_until(WAIT, || async { raw_entries() == Some(6) }).await;
    assert!(counted, "{:?}", node.cluster().peers());
    let live: HashSet<String> = node
        .db
        .entries()
        .into_iter()
        .filter(|e| !e.tombstone)
        .map(|e| e.id)
        .collect();
    assert_eq!(live.len(), 6, "{live:?}");
}

// The peer is cut off longer than the tombstone grace, so the owner has forgotten the
// deletes of its emptied buckets by the heal: the peer's copy is reset, and every
// entry removed meanwhile must still go, and only those.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_during_a_partition_longer_than_the_tombstone_grace_are_not_lost() {
    test_support::init_tracing();
    let t = ChannelTransport::default();
    let mut nodes = Vec::new();
    for (i, name) in ["a", "b"].into_iter().enumerate() {
        let seeds: Vec<String> = if i == 0 {
            vec![]
        } else {
            vec![chan_addr(0).to_string()]
        };
        let mut c = dwara_cluster::ClusterConfig::new(name, chan_addr(i));
        c.peers = seeds;
        c.tombstone_grace = Duration::from_millis(200);
        let db = db(name);
        let cluster = dwara_cluster::Cluster::start_with_transport(c, db.clone(), &t)
            .await
            .unwrap();
        nodes.push(Node {
            name: name.to_owned(),
            addr: chan_addr(i),
            db,
            cluster: Some(cluster),
        });
    }
    assert!(all_live(&nodes).await);
    const N: u32 = 600;
    for i in 0..N {
        nodes[0]
            .db
            .add(&id(i), ip(i), &format!("h{i}.weave.local"))
            .unwrap();
    }
    assert!(wait_until(WAIT, || async { nodes[1].db.len() == N as usize }).await);
    let buckets = metric(nodes[0].cluster(), "dwara_cluster_buckets_published").unwrap();
    assert!(buckets >= 4.0, "{buckets}");

    transport_cut(&t, &nodes, false).await;
    assert!(
        wait_until(WAIT, || async {
            nodes[1]
                .cluster()
                .peers()
                .iter()
                .any(|p| p.node_id == "a" && p.state == dwara_cluster::PeerState::Dead)
        })
        .await
    );
    // Every bucket emptied (deleted, and forgotten after 200 ms), one new entry.
    for i in 0..N {
        nodes[0].db.remove_all(&id(i));
    }
    nodes[0]
        .db
        .add("fresh", ip(N), "fresh.weave.local")
        .unwrap();
    // The grace is a duration, so this waits one: three graces (chitchat collects
    // tombstones in its gossip rounds once they are older than the grace). The reset
    // count below shows the collection did happen before the heal.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let resets = || metric(nodes[1].cluster(), "dwara_cluster_peer_resets_total");
    assert_eq!(resets(), Some(0.0));
    transport_cut(&t, &nodes, true).await;
    assert!(
        wait_until(WAIT, || async {
            nodes[1].db.len() == 1 && nodes[1].db.lookup("fresh.weave.local") == vec![ip(N)]
        })
        .await,
        "peer holds {} live entries: {:?}",
        nodes[1].db.len(),
        nodes[1]
            .db
            .entries()
            .iter()
            .filter(|e| !e.tombstone)
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        metric(nodes[0].cluster(), "dwara_cluster_buckets_published"),
        Some(1.0)
    );
    assert!(resets().unwrap() >= 1.0, "the peer's copy was never reset");
}

async fn transport_cut(t: &ChannelTransport, nodes: &[Node], heal: bool) {
    if heal {
        t.add_link(nodes[0].addr, nodes[1].addr).await;
    } else {
        t.remove_link(nodes[0].addr, nodes[1].addr).await;
    }
}

fn with_service(mut item: Item, service: &str, port: u16) -> Item {
    item.service = Some(dwara_records::ServicePort::parse(service, &port.to_string()).unwrap());
    item
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entrys_service_follows_its_bucket_also_while_two_keys_hold_it() {
    test_support::init_tracing();
    let t = ChannelTransport::default();
    let node = start(&t, "a", chan_addr(0), &[], None).await;
    let raw = Raw::start(&t, chan_addr(1), chan_addr(0).to_string()).await;
    let endpoints = || node.db.lookup_service("_http._tcp.web.weave.local");
    let shown = |marker: u32| {
        node.db.lookup(&format!("marker{marker}.weave.local")) == vec![ip(200 + marker)]
    };
    let web = |port| with_service(item("web", 1), "_http._tcp", port);
    let ep = |port| vec![std::net::SocketAddr::new(ip(1), port)];

    raw.write(0, vec![Op::Bucket("b0.0".into(), vec![web(80)])])
        .await;
    assert!(wait_until(WAIT, || async { shown(0) }).await);
    assert_eq!(endpoints(), ep(80));
    // The same key set again with another port: replaced, not added.
    raw.write(1, vec![Op::Bucket("b0.0".into(), vec![web(8080)])])
        .await;
    assert!(wait_until(WAIT, || async { shown(1) }).await);
    assert_eq!(endpoints(), ep(8080));
    // Moving to another key (as when buckets split) with yet another port, the old
    // key set without it afterwards, and back to the first port: each change shows.
    raw.write(2, vec![Op::Bucket("b1.1".into(), vec![web(81)])])
        .await;
    assert!(wait_until(WAIT, || async { shown(2) }).await);
    assert_eq!(endpoints(), ep(81));
    raw.write(3, vec![Op::Delete("b0.0".into())]).await;
    assert!(wait_until(WAIT, || async { shown(3) }).await);
    assert_eq!(endpoints(), ep(81));
    raw.write(4, vec![Op::Bucket("b1.1".into(), vec![web(80)])])
        .await;
    assert!(wait_until(WAIT, || async { shown(4) }).await);
    assert_eq!(endpoints(), ep(80));
    // Without a service: no SRV, the address stays.
    raw.write(5, vec![Op::Bucket("b1.1".into(), vec![item("web", 1)])])
        .await;
    assert!(wait_until(WAIT, || async { shown(5) }).await);
    assert!(endpoints().is_empty());
    assert_eq!(node.db.lookup("web.weave.local"), vec![ip(1)]);
    let live = node
        .db
        .entries()
        .into_iter()
        .filter(|e| e.id == "web")
        .count();
    assert_eq!(live, 1, "one entry throughout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_replicate_and_a_changed_port_replaces_the_old_one() {
    let (_t, nodes) = channel_cluster(2, None).await;
    assert!(all_live(&nodes).await);
    let http =
        |port: u16| dwara_records::ServicePort::parse("_http._tcp", &port.to_string()).unwrap();
    for i in 0..50 {
        nodes[0]
            .db
            .add_service(
                &id(i),
                ip(i),
                "web.weave.local",
                Some(&http(8000 + i as u16)),
            )
            .unwrap();
    }
    let srv = |n: usize| {
        let mut v = nodes[n].db.lookup_service("_http._tcp.web.weave.local");
        v.sort();
        v
    };
    assert!(
        wait_until(WAIT, || async { srv(1).len() == 50 }).await,
        "{:?}",
        srv(1)
    );
    assert_eq!(srv(1), srv(0));
    nodes[0]
        .db
        .add_service(&id(7), ip(7), "web.weave.local", Some(&http(9999)))
        .unwrap();
    assert!(
        wait_until(WAIT, || async { srv(1) == srv(0) }).await,
        "{:?}",
        srv(1)
    );
    assert!(srv(1).contains(&std::net::SocketAddr::new(ip(7), 9999)));
    assert_eq!(srv(1).len(), 50);
    nodes[0].db.remove_all(&id(7));
    assert!(wait_until(WAIT, || async { srv(1).len() == 49 }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_and_weights_replicate_and_a_changed_weight_replaces_the_old_one() {
    let (_t, nodes) = channel_cluster(2, None).await;
    assert!(all_live(&nodes).await);
    let http = |priority: u16, weight: u16| {
        dwara_records::ServicePort::parse("_http._tcp", "80")
            .unwrap()
            .with_priority(priority)
            .with_weight(weight)
    };
    // Ten at the defaults (format 3 buckets) and ten with weights of their own
    // (format 4), on the same port.
    for i in 0..20 {
        let service = if i < 10 {
            http(0, 1)
        } else {
            http(1, i as u16)
        };
        nodes[0]
            .db
            .add_service(&id(i), ip(i), "web.weave.local", Some(&service))
            .unwrap();
    }
    let srv = |n: usize| {
        let mut v: Vec<_> = nodes[n]
            .db
            .lookup_srv("_http._tcp.web.weave.local")
            .into_iter()
            .map(|t| (t.addr, t.priority, t.weight))
            .collect();
        v.sort();
        v
    };
    assert!(
        wait_until(WAIT, || async { srv(1) == srv(0) && srv(1).len() == 20 }).await,
        "{:?}",
        srv(1)
    );
    assert!(srv(1).contains(&(std::net::SocketAddr::new(ip(12), 80), 1, 12)));
    // Only the weight changes: the entry is replaced on the peer, not doubled.
    nodes[0]
        .db
        .add_service(&id(3), ip(3), "web.weave.local", Some(&http(0, 0)))
        .unwrap();
    assert!(
        wait_until(WAIT, || async { srv(1) == srv(0) }).await,
        "{:?}",
        srv(1)
    );
    assert!(srv(1).contains(&(std::net::SocketAddr::new(ip(3), 80), 0, 0)));
    assert_eq!(srv(1).len(), 20);
}
