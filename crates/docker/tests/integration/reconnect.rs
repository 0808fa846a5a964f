//! The daemon going away and coming back, through a socket proxy the test cuts or
//! stalls.

use std::time::Duration;

use dwara_docker::DockerConfig;

use crate::support::*;

const CONVERGE: Duration = Duration::from_secs(20);

/// Each request's timeout here: one request the daemon never answers costs a
/// reconnect attempt this long, well within `CONVERGE` (the default, 30 s, is not).
/// Not much shorter: under load (many tests at once) an inspect of another test's
/// container that is starting or stopping was seen to take up to 4.7 s (such a
/// container is then inspected again; the list or the version check timing out
/// fails the start).
fn short_requests(config: &mut DockerConfig) {
    config.request_timeout = Duration::from_secs(5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_changed_while_cut_is_repaired_after_restore() {
    let Some(h) = Harness::new("cut") else { return };
    let proxy = Proxy::start();
    let updater = start_updater(h.db.clone(), &proxy.path, short_requests).await;
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
    let updater = start_updater(h.db.clone(), &proxy.path, short_requests).await;
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

/// A reconnect attempt whose request the daemon never finishes answering (no answer
/// at all; a head and never its body, which bollard's own timeout does not cover)
/// fails after `request_timeout`, and a later attempt recovers once the daemon
/// answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_is_never_answered_times_out_and_a_later_one_recovers() {
    for (mode, tag) in [(Mode::Silent, "silent"), (Mode::HeadOnly, "head")] {
        let Some(h) = Harness::new(&format!("stuck-{tag}")) else {
            return;
        };
        let proxy = Proxy::start();
        let updater = start_updater(h.db.clone(), &proxy.path, short_requests).await;
        // A registered container shows the event stream is open through the proxy
        // (a stream stalled at its head would just look quiet).
        let early = h.name("early");
        let early_id = h.run_host("early", &early).await;
        let early_ips = container_ips(&early_id).await;
        let early_fqdn = format!("{early}.weave.local");
        assert!(
            wait(CONVERGE, || lookup(&h.db, &early_fqdn) == early_ips).await,
            "{tag}: the first container was not registered"
        );
        // The stream is closed; the reconnect attempts' requests are held.
        proxy.stall(mode);
        assert!(
            proxy.held_at_least(1, CONVERGE).await,
            "{tag}: no reconnect attempt reached the stalled proxy"
        );
        let late = h.name("late");
        let late_id = h.run_host("late", &late).await;
        // The held connections stay held: only the updater's timeout ends them.
        proxy.restore();
        let ips = container_ips(&late_id).await;
        let fqdn = format!("{late}.weave.local");
        assert!(
            wait(CONVERGE, || lookup(&h.db, &fqdn) == ips).await,
            "{tag}: after restore {:?}, want {ips:?}",
            lookup(&h.db, &fqdn)
        );
        updater.shutdown().await;
    }
}

/// A container the daemon never answers an inspect for (wedged) holds back neither
/// the start (`on`: the daemon is reachable, it listed the containers) nor the
/// other containers, at start and after; it is inspected again, counted, and
/// registered once the daemon answers for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_container_holds_back_neither_the_start_nor_the_others() {
    let Some(h) = Harness::new("wedged") else {
        return;
    };
    let (wedged, fine, later) = (h.name("wedged"), h.name("fine"), h.name("later"));
    let wedged_id = h.run_host("wedged", &wedged).await;
    let fine_id = h.run_host("fine", &fine).await;
    let proxy = Proxy::start();
    proxy.wedge(&wedged_id);
    // `on`: this panics if the start fails.
    let updater = start_updater(h.db.clone(), &proxy.path, short_requests).await;
    assert!(
        proxy.held_at_least(1, CONVERGE).await,
        "the wedged container's inspect never reached the proxy"
    );
    let fqdn = |host: &str| format!("{host}.weave.local");
    let fine_ips = container_ips(&fine_id).await;
    assert!(
        wait(CONVERGE, || lookup(&h.db, &fqdn(&fine)) == fine_ips).await,
        "the other container was held back: {:?}, want {fine_ips:?}",
        lookup(&h.db, &fqdn(&fine))
    );
    // The event stream is followed meanwhile.
    let later_id = h.run_host("later", &later).await;
    let later_ips = container_ips(&later_id).await;
    assert!(
        wait(CONVERGE, || lookup(&h.db, &fqdn(&later)) == later_ips).await,
        "a container started after the start was not registered: {:?}, want {later_ips:?}",
        lookup(&h.db, &fqdn(&later))
    );
    // Still wedged: it is tried again (each try ends at the request timeout).
    assert!(
        proxy.held_at_least(2, CONVERGE).await,
        "the wedged container was not inspected again"
    );
    assert!(lookup(&h.db, &fqdn(&wedged)).is_empty());
    assert!(
        wait(CONVERGE, || metric(
            &metrics_text(&updater),
            "dwara_docker_inspect_failures_total"
        ) >= 1.0)
        .await,
        "{}",
        metrics_text(&updater)
    );
    proxy.unwedge();
    let wedged_ips = container_ips(&wedged_id).await;
    assert!(
        wait(CONVERGE, || lookup(&h.db, &fqdn(&wedged)) == wedged_ips).await,
        "the wedged container was not registered once answered: {:?}, want {wedged_ips:?}",
        lookup(&h.db, &fqdn(&wedged))
    );
    updater.shutdown().await;
}
