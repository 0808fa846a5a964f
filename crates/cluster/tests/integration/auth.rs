//! Only nodes holding the cluster key can add names.

use test_support::wait_until;

use dwara_cluster::{ChannelTransport, ClusterKey};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_the_key_cannot_inject_names() {
    test_support::init_tracing();
    let key = ClusterKey::generate();
    let wrong = ClusterKey::generate();
    let t = ChannelTransport::default();
    let seeds = [chan_addr(0)];
    let a = start(&t, "a", chan_addr(0), &[], Some(&key)).await;
    let b = start(&t, "b", chan_addr(1), &seeds, Some(&key)).await;
    let evil = start(&t, "evil", chan_addr(2), &seeds, Some(&wrong)).await;
    let open = start(&t, "open", chan_addr(3), &seeds, None).await;
    a.db.add("ca", "10.0.0.1".parse().unwrap(), "good.weave.local")
        .unwrap();
    b.db.add("cb", "10.0.0.2".parse().unwrap(), "good.weave.local")
        .unwrap();
    evil.db
        .add("x", "6.6.6.6".parse().unwrap(), "good.weave.local")
        .unwrap();
    open.db
        .add("y", "7.7.7.7".parse().unwrap(), "good.weave.local")
        .unwrap();

    // The keyed nodes share their names...
    assert!(
        wait_until(WAIT, || async {
            a.sees("good.weave.local", "10.0.0.2") && b.sees("good.weave.local", "10.0.0.1")
        })
        .await
    );
    // ...and reject (and count) the others' values once gossip delivered them.
    assert!(
        wait_until(WAIT, || async {
            [&a, &b].iter().all(|n| {
                n.cluster().rejected_values("bad_seal") >= 1
                    && n.cluster().rejected_values("unsealed") >= 1
            })
        })
        .await,
        "rejections not counted"
    );
    for n in [&a, &b] {
        assert_eq!(
            n.db.lookup("good.weave.local").len(),
            2,
            "{:?}",
            n.db.entries()
        );
        assert!(
            n.db.entries()
                .iter()
                .all(|e| e.origin != "evil" && e.origin != "open"),
            "{:?}",
            n.db.entries()
        );
    }
    assert_eq!(
        metric(
            a.cluster(),
            "dwara_cluster_rejected_values_total{reason=\"bad_seal\"}"
        ),
        Some(a.cluster().rejected_values("bad_seal") as f64)
    );
    // The key holders' names are not readable without the key either.
    assert!(
        wait_until(WAIT, || async {
            open.cluster().rejected_values("no_key") >= 2
        })
        .await
    );
    assert!(!open.sees("good.weave.local", "10.0.0.1"));
    assert!(!evil.sees("good.weave.local", "10.0.0.1"));
}
