//! Entries spread, deletes spread, a lagging change receiver loses nothing.

use std::time::Duration;

use test_support::wait_until;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_converge_and_deletes_spread() {
    let (_t, nodes) = channel_cluster(3, None).await;
    assert!(all_live(&nodes).await, "nodes never all live");
    for (i, n) in nodes.iter().enumerate() {
        n.db.add(
            &format!("c{i}"),
            format!("10.0.0.{i}").parse().unwrap(),
            "svc.weave.local",
        )
        .unwrap();
    }
    let all = |nodes: &[Node]| {
        nodes
            .iter()
            .all(|n| (0..3).all(|i| n.sees("svc.weave.local", &format!("10.0.0.{i}"))))
    };
    assert!(
        wait_until(WAIT, || async { all(&nodes) }).await,
        "no convergence"
    );
    // Origins are the owners' node ids.
    let e = nodes[0].db.entries();
    assert!(e.iter().any(|e| e.origin == "n1" && e.id == "c1"), "{e:?}");

    // A delete on the owner is gone everywhere; the others' entries stay.
    assert_eq!(nodes[1].db.remove_all("c1"), 1);
    assert!(
        wait_until(WAIT, || async {
            nodes.iter().all(|n| !n.sees("svc.weave.local", "10.0.0.1"))
        })
        .await,
        "delete did not spread"
    );
    assert!(nodes.iter().all(|n| n.sees("svc.weave.local", "10.0.0.2")));

    // Re-adding it revives it everywhere (a later version than the delete).
    nodes[1]
        .db
        .add("c1", "10.0.0.1".parse().unwrap(), "svc.weave.local")
        .unwrap();
    assert!(
        wait_until(WAIT, || async { all(&nodes) }).await,
        "revival did not spread"
    );

    // The peers view counts each node's entries.
    let peers = nodes[0].cluster().peers();
    assert_eq!(peers.len(), 3, "{peers:?}");
    assert!(peers.iter().all(|p| p.entries == 1), "{peers:?}");
    assert_eq!(
        metric(nodes[0].cluster(), "dwara_cluster_keys_published"),
        Some(1.0)
    );
    assert_eq!(
        metric(nodes[0].cluster(), "dwara_cluster_peers{state=\"live\"}"),
        Some(2.0)
    );
}

// A current-thread runtime: the engine cannot run while the test adds 5000 entries
// without yielding, so its receiver (capacity 1024) must lag.
#[tokio::test(flavor = "current_thread")]
async fn a_lagging_change_receiver_resyncs_and_loses_nothing() {
    let (_t, nodes) = channel_cluster(2, None).await;
    assert!(all_live(&nodes).await);
    let ip = |i: u32| std::net::IpAddr::from([10, 9, (i >> 8) as u8, i as u8]);
    for i in 0..5000u32 {
        nodes[0]
            .db
            .add(&format!("c{i}"), ip(i), &format!("h{i}.weave.local"))
            .unwrap();
    }
    // Some removals in the same burst must not be lost either.
    for i in (0..5000u32).step_by(10) {
        nodes[0].db.remove_all(&format!("c{i}"));
    }
    let ok = wait_until(Duration::from_secs(30), || async {
        nodes[1].db.len() == 4500
            && nodes[1].db.lookup("h1.weave.local") == vec![ip(1)]
            && nodes[1].db.lookup("h10.weave.local").is_empty()
    })
    .await;
    assert!(ok, "peer has {} live entries", nodes[1].db.len());
    assert!(
        metric(nodes[0].cluster(), "dwara_cluster_resyncs_total").unwrap_or(0.0) >= 1.0,
        "the receiver never lagged: the test proves nothing"
    );
    assert_eq!(
        metric(nodes[0].cluster(), "dwara_cluster_keys_published"),
        Some(4500.0)
    );
    let peers = nodes[1].cluster().peers();
    assert!(
        peers.iter().any(|p| p.node_id == "n0" && p.entries == 4500),
        "{peers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_route_serves_json() {
    let (_t, nodes) = channel_cluster(2, None).await;
    assert!(all_live(&nodes).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = nodes[0].cluster().router();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let (status, body) = test_support::http::request_async(addr, "GET", "/peers", None).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{body}");
    assert!(
        rows.iter()
            .any(|r| r["node_id"] == "n0" && r["local"] == true)
    );
    assert!(
        rows.iter()
            .any(|r| r["node_id"] == "n1" && r["state"] == "live")
    );
}

/// The owner's health verdicts reach every node: an unhealthy entry leaves the
/// answers everywhere, a healthy one comes back, and a name none of whose entries
/// passes fails open everywhere alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_changes_spread_and_every_node_answers_alike() {
    use dwara_records::Health;

    let (_t, nodes) = channel_cluster(3, None).await;
    assert!(all_live(&nodes).await, "nodes never all live");
    let (a, b) = ("10.0.1.1".parse().unwrap(), "10.0.1.2".parse().unwrap());
    nodes[0]
        .db
        .add_checked("c1", a, "web.weave.local", None, Health::Starting)
        .unwrap();
    nodes[1].db.add("c2", b, "web.weave.local").unwrap();
    let answers = |want: &[&str]| {
        let want: Vec<std::net::IpAddr> = want.iter().map(|s| s.parse().unwrap()).collect();
        nodes.iter().all(|n| {
            let mut got = n.db.lookup("web.weave.local");
            got.sort();
            got == want
        })
    };
    assert!(
        wait_until(WAIT, || async { answers(&["10.0.1.2"]) }).await,
        "a starting entry is answered somewhere"
    );
    nodes[0].db.set_health("c1", a, Health::Healthy);
    assert!(
        wait_until(WAIT, || async { answers(&["10.0.1.1", "10.0.1.2"]) }).await,
        "healthy did not spread"
    );
    nodes[0].db.set_health("c1", a, Health::Unhealthy);
    assert!(
        wait_until(WAIT, || async { answers(&["10.0.1.2"]) }).await,
        "unhealthy did not spread"
    );
    let seen = nodes[2].db.entries();
    let c1 = seen.iter().find(|e| e.id == "c1").unwrap();
    assert_eq!(c1.health, Health::Unhealthy);
    // c2 gone: c1 alone, unhealthy, is answered everywhere (fail open).
    nodes[1].db.remove_all("c2");
    assert!(
        wait_until(WAIT, || async { answers(&["10.0.1.1"]) }).await,
        "the all-unhealthy name did not fail open everywhere"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_pushed_to_push_fanout_peers_and_reaches_the_others_by_gossip() {
    test_support::init_tracing();
    let transport = dwara_cluster::ChannelTransport::default();
    let mut nodes = Vec::new();
    for i in 0..6 {
        let name = format!("n{i}");
        let seeds = if i == 0 { vec![] } else { vec![chan_addr(0)] };
        let mut c = config(&name, chan_addr(i), &seeds);
        // n0 pushes to one peer; the others keep the default (every peer of 6).
        if i == 0 {
            c.push_fanout = 1;
        }
        let db = db(&name);
        let cluster = dwara_cluster::Cluster::start_with_transport(c, db.clone(), &transport)
            .await
            .unwrap();
        nodes.push(Node {
            name,
            addr: chan_addr(i),
            db,
            cluster: Some(cluster),
        });
    }
    assert!(all_live(&nodes).await, "nodes never all live");
    let pushes = |n: &Node| metric(n.cluster(), "dwara_cluster_pushes_total").unwrap_or(0.0);
    assert_eq!(pushes(&nodes[0]), 0.0);

    nodes[0]
        .db
        .add("a", "10.0.1.1".parse().unwrap(), "a.weave.local")
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            nodes.iter().all(|n| n.sees("a.weave.local", "10.0.1.1"))
        })
        .await,
        "a change pushed to one peer did not reach the other four"
    );
    assert_eq!(pushes(&nodes[0]), 1.0, "push_fanout 1");

    nodes[1]
        .db
        .add("b", "10.0.1.2".parse().unwrap(), "b.weave.local")
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            nodes.iter().all(|n| n.sees("b.weave.local", "10.0.1.2"))
        })
        .await,
        "no convergence"
    );
    assert_eq!(
        pushes(&nodes[1]),
        5.0,
        "the default pushes to every peer of 6"
    );
}
