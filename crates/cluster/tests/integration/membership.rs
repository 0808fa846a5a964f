//! Partition and heal, restart with a new generation, a peer that goes away.

use test_support::wait_until;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_node_entries_vanish_and_return() {
    let (transport, nodes) = channel_cluster(3, None).await;
    assert!(all_live(&nodes).await);
    nodes[2]
        .db
        .add("c2", "10.0.2.1".parse().unwrap(), "cut.weave.local")
        .unwrap();
    nodes[0]
        .db
        .add("c0", "10.0.0.1".parse().unwrap(), "stay.weave.local")
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            nodes[0].sees("cut.weave.local", "10.0.2.1")
                && nodes[1].sees("cut.weave.local", "10.0.2.1")
                && nodes[2].sees("stay.weave.local", "10.0.0.1")
        })
        .await
    );
    for i in [0, 1] {
        transport.remove_link(nodes[i].addr, nodes[2].addr).await;
    }
    // Hidden on the others (kept stored), and the cut-off node hides theirs.
    assert!(
        wait_until(WAIT, || async {
            !nodes[0].sees("cut.weave.local", "10.0.2.1")
                && !nodes[1].sees("cut.weave.local", "10.0.2.1")
                && !nodes[2].sees("stay.weave.local", "10.0.0.1")
        })
        .await,
        "partitioned entries still served"
    );
    assert!(
        nodes[0]
            .db
            .entries()
            .iter()
            .any(|e| e.id == "c2" && !e.tombstone)
    );
    let peers = nodes[0].cluster().peers();
    assert!(
        peers
            .iter()
            .any(|p| p.node_id == "n2" && p.state == dwara_cluster::PeerState::Dead),
        "{peers:?}"
    );
    assert!(
        nodes[0].sees("stay.weave.local", "10.0.0.1"),
        "own entries must stay"
    );
    // A change made during the partition arrives after the heal.
    nodes[2]
        .db
        .add("c2b", "10.0.2.2".parse().unwrap(), "cut.weave.local")
        .unwrap();
    for i in [0, 1] {
        transport.add_link(nodes[i].addr, nodes[2].addr).await;
    }
    assert!(
        wait_until(WAIT, || async {
            [0, 1].iter().all(|&i| {
                nodes[i].sees("cut.weave.local", "10.0.2.1")
                    && nodes[i].sees("cut.weave.local", "10.0.2.2")
            }) && nodes[2].sees("stay.weave.local", "10.0.0.1")
        })
        .await,
        "entries did not return after the heal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_replaces_its_old_incarnation() {
    let (transport, mut nodes) = channel_cluster(3, None).await;
    assert!(all_live(&nodes).await);
    let b = &nodes[1];
    b.db.add("old", "10.1.0.1".parse().unwrap(), "old.weave.local")
        .unwrap();
    b.db.add("kept", "10.1.0.2".parse().unwrap(), "kept.weave.local")
        .unwrap();
    // Many changes so the old incarnation's versions are well above the new one's.
    for i in 0..20 {
        b.db.add("churn", "10.1.0.3".parse().unwrap(), "churn.weave.local")
            .unwrap();
        if i % 2 == 0 {
            b.db.remove_all("churn");
        }
    }
    assert!(
        wait_until(WAIT, || async {
            nodes[0].sees("old.weave.local", "10.1.0.1")
                && nodes[2].sees("kept.weave.local", "10.1.0.2")
        })
        .await
    );
    let old_generation = nodes[1].cluster().generation();
    nodes[1].stop().await;
    // The same node id comes back with a new generation and a fresh database that
    // still owns one entry (as the Docker reconcile would re-add it) and a new one.
    let fresh = start(&transport, "n1", chan_addr(1), &[chan_addr(0)], None).await;
    assert_ne!(fresh.cluster().generation(), old_generation);
    fresh
        .db
        .add("kept", "10.1.0.2".parse().unwrap(), "kept.weave.local")
        .unwrap();
    fresh
        .db
        .add("new", "10.1.0.4".parse().unwrap(), "new.weave.local")
        .unwrap();
    nodes[1] = fresh;
    for i in [0, 2] {
        assert!(
            wait_until(WAIT, || async {
                let n = &nodes[i];
                !n.sees("old.weave.local", "10.1.0.1")
                    && !n.sees("churn.weave.local", "10.1.0.3")
                    && n.sees("kept.weave.local", "10.1.0.2")
                    && n.sees("new.weave.local", "10.1.0.4")
            })
            .await,
            "node {i}: old incarnation left behind or new entries missing: {:?}",
            nodes[i].db.entries()
        );
        // Nothing of the old incarnation is stored, not even hidden.
        let stale: Vec<_> = nodes[i]
            .db
            .entries()
            .into_iter()
            .filter(|e| e.origin == "n1" && (e.id == "old" || e.id == "churn"))
            .collect();
        assert!(stale.is_empty(), "node {i}: {stale:?}");
    }
    let peers = nodes[0].cluster().peers();
    let row = peers.iter().find(|p| p.node_id == "n1").unwrap();
    assert_eq!(row.generation, nodes[1].cluster().generation());
    assert_eq!(row.entries, 2);
}
