//! No wall clock takes part: versions are counters, never compared with a time.

use test_support::wait_until;

use dwara_records::Entry;

use crate::support::*;

// Weave stamped entries with wall-clock times and rejected gossip from skewed peers.
// Here node n0's database holds an own entry whose version looks like a timestamp
// ten hours in the future (as a skewed clock would make), n1's a tiny one; both
// replicate, and a later delete of the "future" entry still wins everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_that_look_like_skewed_clocks_do_not_matter() {
    let (_t, nodes) = channel_cluster(2, None).await;
    assert!(all_live(&nodes).await);
    let future_ns: u64 = 1_900_000_000_000_000_000 + 10 * 3600 * 1_000_000_000;
    let applied = nodes[0]
        .db
        .apply(Entry {
            id: "skewed".into(),
            ip: "10.3.0.1".parse().unwrap(),
            fqdn: "skew.weave.local.".into(),
            origin: "n0".into(),
            version: future_ns,
            tombstone: false,
            health: Default::default(),
            service: None,
        })
        .unwrap();
    assert!(applied);
    nodes[1]
        .db
        .add("plain", "10.3.0.2".parse().unwrap(), "skew.weave.local")
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            nodes
                .iter()
                .all(|n| n.db.lookup("skew.weave.local").len() == 2)
        })
        .await
    );
    // The entry on the receiving side carries gossip's version, not the skewed one.
    let remote = nodes[1]
        .db
        .entries()
        .into_iter()
        .find(|e| e.id == "skewed")
        .unwrap();
    assert!(remote.version < 1_000_000, "{remote:?}");
    nodes[0].db.remove_all("skewed");
    assert!(
        wait_until(WAIT, || async {
            nodes
                .iter()
                .all(|n| n.db.lookup("skew.weave.local").len() == 1)
        })
        .await
    );
}

// The process-level check (a node under libfaketime) belongs to the binary's tests;
// this makes sure the crate itself never asks for the wall clock.
#[test]
fn the_crate_never_reads_the_wall_clock() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut stack = vec![src];
    let mut offenders = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for needle in [
                "SystemTime",
                "UNIX_EPOCH",
                "chrono",
                "Utc::now",
                "Local::now",
            ] {
                if text.contains(needle) {
                    offenders.push(format!("{}: {needle}", path.display()));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:?}");
}
