//! The daemon going away and coming back, through a socket proxy the test cuts.

use std::time::Duration;

use crate::support::*;

const CONVERGE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_changed_while_cut_is_repaired_after_restore() {
    let Some(h) = Harness::new("cut") else { return };
    let proxy = Proxy::start();
    let updater = start_updater(h.db.clone(), &proxy.path, |_| {}).await;
    let (old, new) = (h.name("old"), h.name("new"));
    let old_id = h.run_host("old", &old).await;
    let old_fqdn = format!("{old}.weave.local");
    let new_fqdn = format!("{new}.weave.local");
    assert!(wait(CONVERGE, || !lookup(&h.db, &old_fqdn).is_empty()).await);

    proxy.cut();
    // While cut (the CLI uses the real socket): one starts, one stops.
    let new_id = h.run_host("new", &new).await;
    docker_async(&["stop", "-t", "0", &old_id]).await.unwrap();
    // Nothing can be seen while cut: the entries are as they were.
    assert!(lookup(&h.db, &new_fqdn).is_empty());
    assert!(!lookup(&h.db, &old_fqdn).is_empty());

    proxy.restore();
    let ips = container_ips(&new_id).await;
    assert!(
        wait(CONVERGE, || lookup(&h.db, &new_fqdn) == ips
            && lookup(&h.db, &old_fqdn).is_empty())
        .await,
        "after restore: new {:?} (want {ips:?}), old {:?}",
        lookup(&h.db, &new_fqdn),
        lookup(&h.db, &old_fqdn)
    );
    // The counters are bumped around the repair; wait for them as well.
    let counted = |text: &str| {
        metric(text, "dwara_docker_reconnects_total") >= 1.0
            && metric(text, "dwara_docker_reconciles_total") >= 2.0
            && metric(
                text,
                "dwara_docker_reconcile_repairs_total{change=\"removed\"}",
            ) >= 1.0
    };
    assert!(
        wait(CONVERGE, || counted(&metrics_text(&updater))).await,
        "{}",
        metrics_text(&updater)
    );
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_outage_backs_off_and_still_recovers() {
    let Some(h) = Harness::new("outage") else {
        return;
    };
    let proxy = Proxy::start();
    let updater = start_updater(h.db.clone(), &proxy.path, |_| {}).await;
    proxy.cut();
    let host = h.name("late");
    let fqdn = format!("{host}.weave.local");
    let id = h.run_host("late", &host).await;
    // Several failed attempts at the capped backoff (400 ms here)…
    let mut sub = h.db.subscribe();
    let quiet = tokio::time::timeout(Duration::from_millis(1500), sub.recv()).await;
    assert!(quiet.is_err(), "a change while cut: {quiet:?}");
    // …then the daemon is back.
    proxy.restore();
    let ips = container_ips(&id).await;
    assert!(wait(CONVERGE, || lookup(&h.db, &fqdn) == ips).await);
    updater.shutdown().await;
}
