//! Measurements, ignored by default (they print numbers, they assert no timings):
//! `cargo test -p dwara-docker --test integration -- --ignored --nocapture measure`.

use std::time::{Duration, Instant};

use crate::support::*;

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let median = samples[samples.len() / 2];
    let worst = samples[samples.len() - 1];
    println!(
        "{label}: median {median:?}, worst {worst:?} (n = {})",
        samples.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run with --ignored --nocapture"]
async fn measure_register_and_unregister_latency() {
    let Some(h) = Harness::new("mlat") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for i in 0..20 {
        let name = format!("m{i}");
        let host = h.name(&name);
        let fqdn = format!("{host}.weave.local");
        let id = h.run_host(&name, &host).await;
        let t = Instant::now();
        assert!(wait(Duration::from_secs(10), || !h.db.lookup(&fqdn).is_empty()).await);
        up.push(t.elapsed());
        docker_async(&["stop", "-t", "0", &id]).await.unwrap();
        let t = Instant::now();
        assert!(wait(Duration::from_secs(10), || h.db.lookup(&fqdn).is_empty()).await);
        down.push(t.elapsed());
        docker_async(&["rm", "-f", &id]).await.unwrap();
    }
    summary("docker run returned -> name registered", up);
    summary("docker stop returned -> name gone", down);
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement: run with --ignored --nocapture"]
async fn measure_reconcile_with_200_running() {
    let Some(h) = Harness::new("mrec") else {
        return;
    };
    let names: Vec<String> = (0..200).map(|i| format!("r{i}")).collect();
    for chunk in names.chunks(10) {
        futures::future::join_all(chunk.iter().map(|n| {
            let host = h.name(n);
            let h = &h;
            async move { h.run_host(n, &host).await }
        }))
        .await;
    }
    let mut times = Vec::new();
    for _ in 0..5 {
        let db = new_db();
        let t = Instant::now();
        // `start` connects, negotiates and reconciles before it returns.
        let updater = start_updater(db.clone(), SOCKET, |_| {}).await;
        times.push(t.elapsed());
        let ours = names
            .iter()
            .filter(|n| !db.lookup(&format!("{}.weave.local", h.name(n))).is_empty())
            .count();
        assert_eq!(ours, 200);
        updater.shutdown().await;
    }
    summary("start + reconcile with 200 running containers", times);
}
