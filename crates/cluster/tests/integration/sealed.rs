//! Sealed gossip over real UDP on loopback: keyed nodes, outsiders beside them, and
//! hostile datagrams on the gossip port.

use std::net::SocketAddr;

use dwara_cluster::datagram::{Keyring, Rejection, Sealer};
use dwara_cluster::{Cluster, ClusterKey, KeySource, PeerState};
use test_support::{free_port, wait_until};

use crate::support::*;

fn addr(host: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, host], free_port()))
}

async fn start_udp(name: &str, addr: SocketAddr, seeds: &[SocketAddr], key: KeySource) -> Node {
    let db = db(name);
    let mut c = config(name, addr, seeds);
    c.key = key;
    let cluster = Cluster::start(c, db.clone()).await.unwrap();
    Node {
        name: name.to_owned(),
        addr,
        db,
        cluster: Some(cluster),
    }
}

fn knows(node: &Node, name: &str) -> bool {
    node.cluster().peers().iter().any(|p| p.node_id == name)
}

fn rejected_total(node: &Node) -> u64 {
    Rejection::ALL
        .iter()
        .map(|why| node.cluster().rejected_datagrams(*why))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_the_key_are_not_heard() {
    test_support::init_tracing();
    let key = ClusterKey::generate();
    let a_addr = addr(21);
    let mut a = start_udp("a", a_addr, &[], KeySource::Key(key.clone())).await;
    let mut b = start_udp("b", addr(22), &[a_addr], KeySource::Key(key.clone())).await;
    let keyed = [a, b];
    assert!(all_live(&keyed).await, "keyed nodes never met");
    [a, b] = keyed;
    a.db.add("c1", "10.8.0.1".parse().unwrap(), "web.weave.local")
        .unwrap();
    assert!(wait_until(WAIT, || async { b.sees("web.weave.local", "10.8.0.1") }).await);

    // One node with another key, one with none, both seeded with `a`.
    let mut wrong = start_udp(
        "wrong",
        addr(23),
        &[a_addr],
        KeySource::Key(ClusterKey::generate()),
    )
    .await;
    let mut open = start_udp("open", addr(24), &[a_addr], KeySource::Open).await;
    wrong
        .db
        .add("x1", "10.8.0.66".parse().unwrap(), "web.weave.local")
        .unwrap();
    open.db
        .add("x2", "10.8.0.67".parse().unwrap(), "evil.weave.local")
        .unwrap();
    // Both gossip at `a` every round; wait until `a` has rejected both kinds a few times.
    assert!(
        wait_until(WAIT, || async {
            a.cluster().rejected_datagrams(Rejection::BadSeal) >= 5
                && a.cluster().rejected_datagrams(Rejection::Malformed) >= 5
        })
        .await,
        "a never rejected the outsiders' datagrams"
    );
    // Meanwhile the keyed nodes keep working.
    b.db.add("c2", "10.8.0.2".parse().unwrap(), "api.weave.local")
        .unwrap();
    assert!(wait_until(WAIT, || async { a.sees("api.weave.local", "10.8.0.2") }).await);
    for node in [&a, &b] {
        assert!(
            !knows(node, "wrong") && !knows(node, "open"),
            "{}",
            node.name
        );
        assert_eq!(
            node.db.lookup("web.weave.local"),
            vec!["10.8.0.1".parse::<std::net::IpAddr>().unwrap()]
        );
        assert!(node.db.lookup("evil.weave.local").is_empty());
        assert_eq!(node.cluster().rejected_datagrams(Rejection::Replay), 0);
        assert_eq!(node.cluster().rejected_datagrams(Rejection::Undecodable), 0);
    }
    assert!(
        b.cluster()
            .peers()
            .iter()
            .all(|p| p.state == PeerState::Live)
    );
    // The outsiders heard nothing either: not one datagram opened for the wrong key.
    assert_eq!(wrong.cluster().opened_datagrams(), 0);
    assert!(!knows(&wrong, "a") && !knows(&open, "a"));
    assert!(wrong.db.lookup("api.weave.local").is_empty());
    assert!(open.db.lookup("api.weave.local").is_empty());
    assert_eq!(
        metric(
            a.cluster(),
            "dwara_cluster_rejected_datagrams_total{reason=\"bad_seal\"}"
        ),
        Some(a.cluster().rejected_datagrams(Rejection::BadSeal) as f64)
    );
    for n in [&mut a, &mut b, &mut wrong, &mut open] {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_of_many_datagrams_replicates_sealed() {
    test_support::init_tracing();
    let key = ClusterKey::generate();
    let a_addr = addr(31);
    let mut a = start_udp("a", a_addr, &[], KeySource::Key(key.clone())).await;
    // Many datagrams' worth (chitchat fills each up to the UDP limit; the unit tests
    // of the transport take messages at the limit through it).
    let n = 4000u32;
    for i in 0..n {
        let ip = std::net::Ipv4Addr::from(0x0a10_0000 + i);
        a.db.add(
            &format!("container-{i:05}"),
            ip.into(),
            &format!("svc{i}.weave.local"),
        )
        .unwrap();
    }
    let mut b = start_udp("b", addr(32), &[a_addr], KeySource::Key(key.clone())).await;
    assert!(
        wait_until(WAIT, || async { b.db.entries().len() == n as usize }).await,
        "b has {} of {n} entries",
        b.db.entries().len()
    );
    assert_eq!(rejected_total(&a) + rejected_total(&b), 0);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_datagrams_are_rejected_and_counted() {
    test_support::init_tracing();
    let key = ClusterKey::generate();
    let a_addr = addr(41);
    let mut a = start_udp("a", a_addr, &[], KeySource::Key(key.clone())).await;
    let mut b = start_udp("b", addr(42), &[a_addr], KeySource::Key(key.clone())).await;
    let pair = [a, b];
    assert!(all_live(&pair).await);
    [a, b] = pair;
    let before = |why| a.cluster().rejected_datagrams(why);
    let (malformed, bad_seal) = (before(Rejection::Malformed), before(Rejection::BadSeal));

    let attacker = tokio::net::UdpSocket::bind("127.0.0.43:0").await.unwrap();
    let ring = Keyring::new(key.clone(), Vec::new());
    let mut sealer = Sealer::new(0xbad);
    let mut sealed = Vec::new();
    // Opens, but is not a chitchat message (only a key holder can send it).
    sealer
        .seal(&ring, "dwara", b"not chitchat", &mut sealed)
        .unwrap();
    let valid = sealed.remove(0);
    let mut tampered = valid.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let mut other_cluster = Vec::new();
    Sealer::new(1)
        .seal(&ring, "elsewhere", b"x", &mut other_cluster)
        .unwrap();
    for datagram in [
        &b"garbage"[..],
        &valid[..valid.len() / 2],
        &[][..],
        &tampered[..],
        &other_cluster[0][..],
        &valid[..],
        &valid[..],
    ] {
        attacker.send_to(datagram, a_addr).await.unwrap();
    }
    assert!(
        wait_until(WAIT, || async {
            a.cluster().rejected_datagrams(Rejection::Malformed) >= malformed + 3
                && a.cluster().rejected_datagrams(Rejection::BadSeal) >= bad_seal + 2
                && a.cluster().rejected_datagrams(Rejection::Undecodable) == 1
                && a.cluster().rejected_datagrams(Rejection::Replay) == 1
        })
        .await,
        "rejections: {:?}",
        Rejection::ALL.map(|w| (w.reason(), a.cluster().rejected_datagrams(w)))
    );
    // Gossip goes on.
    b.db.add("c", "10.9.0.1".parse().unwrap(), "after.weave.local")
        .unwrap();
    assert!(wait_until(WAIT, || async { a.sees("after.weave.local", "10.9.0.1") }).await);
    assert!(
        a.cluster()
            .peers()
            .iter()
            .all(|p| p.state == PeerState::Live)
    );
    a.stop().await;
    b.stop().await;
}
