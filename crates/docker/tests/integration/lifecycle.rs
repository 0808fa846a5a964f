//! Containers coming and going: registration, removal, names, races, restarts.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dwara_docker::{
    ApiVersion, DockerConfig, DockerMode, DockerOff, DockerUpdater, Error, Started,
};
use hickory_proto::op::ResponseCode;

use crate::support::*;

/// "Within a second" from the issue.
const SECOND: Duration = Duration::from_secs(1);
/// For multi-step convergence under load.
const CONVERGE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_in_the_domain_answers_within_a_second_and_is_gone_after_stop() {
    let Some(h) = Harness::new("basic") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let host = h.name("web1");
    let fqdn = format!("{host}.weave.local");
    let id = h.run_host("web1", &host).await;
    let t = Instant::now();
    let ips = container_ips(&id).await;
    assert!(
        wait(SECOND.saturating_sub(t.elapsed()), || lookup(&h.db, &fqdn)
            == ips)
        .await,
        "{fqdn} not registered with {ips:?} within a second: {:?}",
        lookup(&h.db, &fqdn)
    );
    // A real DNS answer from the name server's handler.
    let (rcode, answer) = dns_a(&h.db, &fqdn);
    assert_eq!(rcode, ResponseCode::NoError);
    let v4: BTreeSet<_> = ips
        .iter()
        .filter_map(|ip| match ip {
            std::net::IpAddr::V4(v4) => Some(*v4),
            std::net::IpAddr::V6(_) => None,
        })
        .collect();
    assert_eq!(answer.into_iter().collect::<BTreeSet<_>>(), v4);
    // The record id is the full container id.
    assert_eq!(id.len(), 64);
    assert_eq!(updater.registered().get(&id).map(Vec::len), Some(ips.len()));

    docker_async(&["stop", "-t", "0", &id]).await.unwrap();
    assert!(
        wait(SECOND, || dns_a(&h.db, &fqdn).0 == ResponseCode::NXDomain).await,
        "{fqdn} still answers after docker stop"
    );
    assert_eq!(entries_of(&h.db, &id), 0);
    assert!(!updater.registered().contains_key(&id));

    let text = metrics_text(&updater);
    assert!(
        metric(&text, "dwara_docker_events_total{action=\"start\"}") >= 1.0,
        "{text}"
    );
    assert!(
        metric(&text, "dwara_docker_events_total{action=\"die\"}") >= 1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "dwara_docker_reconciles_total"),
        1.0,
        "{text}"
    );
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_outside_the_domain_are_not_registered() {
    let Some(h) = Harness::new("outside") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let other = h.name("other");
    let bare = h.name("bare");
    let inside = h.name("inside");
    let a = h
        .run(
            "other",
            &["--hostname", &other, "--domainname", "example.com"],
            &["sleep", "1000"],
        )
        .await;
    let b = h
        .run("bare", &["--hostname", &bare], &["sleep", "1000"])
        .await;
    // Events apply in order: once the later container is in, the earlier ones were
    // looked at.
    h.run_host("inside", &inside).await;
    assert!(
        wait(CONVERGE, || !lookup(
            &h.db,
            &format!("{inside}.weave.local")
        )
        .is_empty())
        .await
    );
    assert_eq!(entries_of(&h.db, &a), 0);
    assert_eq!(entries_of(&h.db, &b), 0);
    assert!(lookup(&h.db, &format!("{other}.weave.local")).is_empty());
    assert!(lookup(&h.db, &format!("{bare}.weave.local")).is_empty());
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_fifty_ends_with_exactly_the_running_ones() {
    let Some(h) = Harness::new("burst") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let mut ids = Vec::new();
    for chunk in (0..50).collect::<Vec<_>>().chunks(10) {
        let started = futures::future::join_all(chunk.iter().map(|i| {
            let name = format!("c{i}");
            let host = h.name(&name);
            let h = &h;
            async move { h.run_host(&name, &host).await }
        }))
        .await;
        ids.extend(started);
    }
    // Stop every other one, all at once.
    let stopped: Vec<&String> = ids.iter().step_by(2).collect();
    let mut args = vec!["stop", "-t", "0"];
    args.extend(stopped.iter().map(|s| s.as_str()));
    docker_async(&args).await.unwrap();
    let running: BTreeSet<String> = ids.iter().skip(1).step_by(2).cloned().collect();
    let ours = |db: &dwara_records::Db| -> BTreeSet<String> {
        db.entries()
            .into_iter()
            .filter(|e| !e.tombstone && ids.contains(&e.id))
            .map(|e| e.id)
            .collect()
    };
    assert!(
        wait(CONVERGE, || ours(&h.db) == running).await,
        "registered {} of {} running",
        ours(&h.db).len(),
        running.len()
    );
    // Each running one under its own name with its current address.
    for (i, id) in ids.iter().enumerate().skip(1).step_by(2) {
        let fqdn = format!("{}.weave.local", h.name(&format!("c{i}")));
        assert_eq!(lookup(&h.db, &fqdn), container_ips(id).await, "{fqdn}");
    }
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_that_exits_at_once_is_never_left_registered() {
    let Some(h) = Harness::new("quick") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let mut ids = Vec::new();
    for (i, cmd) in [["true"], ["false"], ["sleep 0.05"], ["sleep 0.2"], ["true"]]
        .iter()
        .enumerate()
    {
        let name = format!("q{i}");
        let host = h.name(&name);
        let args = ["--hostname", host.as_str(), "--domainname", "weave.local"];
        ids.push((
            host.clone(),
            h.run(&name, &args, &["sh", "-c", cmd[0]]).await,
        ));
    }
    // Wait until every one has exited, then for a later container to be handled.
    for (_, id) in &ids {
        let exited = wait(CONVERGE, || {
            docker(&["inspect", "-f", "{{.State.Status}}", id]).is_ok_and(|s| s == "exited")
        })
        .await;
        assert!(exited, "{id} did not exit");
    }
    let marker = h.name("marker");
    h.run_host("marker", &marker).await;
    assert!(
        wait(CONVERGE, || !lookup(
            &h.db,
            &format!("{marker}.weave.local")
        )
        .is_empty())
        .await
    );
    for (host, id) in &ids {
        assert_eq!(entries_of(&h.db, id), 0, "{host} left registered");
    }
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_restart_and_a_new_address_end_with_the_current_ip() {
    let Some(h) = Harness::new("restart") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let host = h.name("r");
    let fqdn = format!("{host}.weave.local");
    let id = h.run_host("r", &host).await;
    let first = container_ips(&id).await;
    assert!(wait(CONVERGE, || lookup(&h.db, &fqdn) == first).await);

    docker_async(&["restart", "-t", "0", &id]).await.unwrap();
    let now = container_ips(&id).await;
    assert!(
        wait(CONVERGE, || lookup(&h.db, &fqdn) == now).await,
        "after restart: {:?}, want {now:?}",
        lookup(&h.db, &fqdn)
    );

    // Stop it, let another container take its address, start it again: the late
    // events of the old incarnation must not remove the new one's address.
    docker_async(&["stop", "-t", "0", &id]).await.unwrap();
    h.run("thief", &[], &["sleep", "1000"]).await;
    docker_async(&["start", &id]).await.unwrap();
    let moved = container_ips(&id).await;
    assert!(
        wait(CONVERGE, || lookup(&h.db, &fqdn) == moved).await,
        "after moving: {:?}, want {moved:?} (was {first:?})",
        lookup(&h.db, &fqdn)
    );
    assert_eq!(entries_of(&h.db, &id), moved.len());
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_flapping_ends_registered_with_the_current_ip() {
    let Some(h) = Harness::new("flap") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let host = h.name("f");
    let fqdn = format!("{host}.weave.local");
    // Fails three times (the writable layer keeps the count), then stays up.
    let script = "n=$(cat /count 2>/dev/null || echo 0); echo $((n+1)) > /count; \
                  [ \"$n\" -ge 3 ] && exec sleep 100000; sleep 0.1; exit 1";
    let args = [
        "--hostname",
        host.as_str(),
        "--domainname",
        "weave.local",
        "--restart",
        "on-failure:10",
    ];
    let id = h.run("f", &args, &["sh", "-c", script]).await;
    let up = wait(CONVERGE, || {
        docker(&["inspect", "-f", "{{.State.Status}} {{.RestartCount}}", &id])
            .is_ok_and(|s| s == "running 3")
    })
    .await;
    assert!(up, "the container did not settle after three failures");
    let ips = container_ips(&id).await;
    assert!(!ips.is_empty());
    assert!(
        wait(CONVERGE, || lookup(&h.db, &fqdn) == ips).await,
        "{:?}, want {ips:?}",
        lookup(&h.db, &fqdn)
    );
    assert_eq!(
        entries_of(&h.db, &id),
        ips.len(),
        "no stale address of an earlier run"
    );
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_updater_registers_the_running_ones_and_not_one_stopped_meanwhile() {
    let Some(h) = Harness::new("again") else {
        return;
    };
    let updater = h.updater(|_| {}).await;
    let (keep, gone) = (h.name("keep"), h.name("gone"));
    let keep_id = h.run_host("keep", &keep).await;
    let gone_id = h.run_host("gone", &gone).await;
    assert!(
        wait(CONVERGE, || entries_of(&h.db, &keep_id) > 0
            && entries_of(&h.db, &gone_id) > 0)
        .await
    );
    updater.shutdown().await;
    docker_async(&["stop", "-t", "0", &gone_id]).await.unwrap();

    // A restarted process: a new database, a new updater. `start` returns after the
    // first reconcile, so no waiting.
    let db = new_db();
    let again = start_updater(db.clone(), SOCKET, |_| {}).await;
    assert_eq!(
        lookup(&db, &format!("{keep}.weave.local")),
        container_ips(&keep_id).await
    );
    assert!(lookup(&db, &format!("{gone}.weave.local")).is_empty());
    assert_eq!(entries_of(&db, &gone_id), 0);
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_registered_entries_are_never_touched() {
    let Some(h) = Harness::new("hand") else {
        return;
    };
    let host = h.name("h");
    let id = h.run_host("h", &host).await;
    // By hand, before the updater runs: one under the container's own id (as
    // `weave dns-add` does), one under another id.
    let manual = format!("{host}-manual.weave.local");
    h.db.add(&id, "10.99.0.1".parse().unwrap(), &manual)
        .unwrap();
    h.db.add(
        "by-hand",
        "10.99.0.2".parse().unwrap(),
        "manual.weave.local",
    )
    .unwrap();
    let updater = h.updater(|_| {}).await;
    let fqdn = format!("{host}.weave.local");
    assert_eq!(lookup(&h.db, &fqdn), container_ips(&id).await);
    docker_async(&["stop", "-t", "0", &id]).await.unwrap();
    assert!(wait(CONVERGE, || lookup(&h.db, &fqdn).is_empty()).await);
    // A reconcile (a second updater on the same database) leaves them too.
    let second = start_updater(h.db.clone(), SOCKET, |_| {}).await;
    assert_eq!(
        lookup(&h.db, &manual),
        BTreeSet::from(["10.99.0.1".parse().unwrap()])
    );
    assert_eq!(
        lookup(&h.db, "manual.weave.local"),
        BTreeSet::from(["10.99.0.2".parse().unwrap()])
    );
    second.shutdown().await;
    // Unregistering everything the updater made (other tests' containers are in the
    // domain too) still leaves the hand-made entries.
    updater.shutdown_and_unregister().await;
    assert_eq!(lookup(&h.db, &manual).len(), 1);
    assert_eq!(lookup(&h.db, "manual.weave.local").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_aliases_networks_rename_connect_and_disconnect() {
    let Some(h) = Harness::new("names") else {
        return;
    };
    let front = h.network("front").await;
    let back = h.network("back").await;
    let updater = h
        .updater(|c| c.names = "hostname,name,aliases".parse().unwrap())
        .await;
    let only_front = start_updater(new_db(), SOCKET, |c| {
        c.names = "name".parse().unwrap();
        c.network = Some(front.clone());
    })
    .await;
    let name = h.name("n");
    let alias = h.name("api");
    let id = h
        .run(
            "n",
            &["--network", &front, "--network-alias", &alias],
            &["sleep", "100000"],
        )
        .await;
    let front_ips = container_ips(&id).await;
    let by_name = format!("{name}.weave.local");
    let by_alias = format!("{alias}.weave.local");
    assert!(wait(CONVERGE, || lookup(&h.db, &by_name) == front_ips).await);
    assert_eq!(lookup(&h.db, &by_alias), front_ips);
    // No name from the random hostname (not in the domain), none from the short id.
    assert_eq!(
        entries_of(&h.db, &id),
        2 * front_ips.len(),
        "{:?}",
        updater.registered()
    );

    // Connected to a second network: the name gains that address, the alias does not.
    docker_async(&["network", "connect", &back, &id])
        .await
        .unwrap();
    let all = container_ips(&id).await;
    assert!(all.len() > front_ips.len());
    assert!(
        wait(CONVERGE, || lookup(&h.db, &by_name) == all).await,
        "{:?}",
        lookup(&h.db, &by_name)
    );
    assert_eq!(lookup(&h.db, &by_alias), front_ips);
    // The updater narrowed to `front` keeps only the front address.
    docker_async(&["network", "disconnect", &back, &id])
        .await
        .unwrap();
    assert!(wait(CONVERGE, || lookup(&h.db, &by_name) == front_ips).await);

    // Renamed: the old name goes, the new one comes.
    let renamed = h.name("renamed");
    docker_async(&["rename", &id, &renamed]).await.unwrap();
    let by_new = format!("{renamed}.weave.local");
    assert!(
        wait(CONVERGE, || lookup(&h.db, &by_new) == front_ips
            && lookup(&h.db, &by_name).is_empty())
        .await
    );
    let reg = only_front.registered();
    let recs = reg.get(&id).cloned().unwrap_or_default();
    assert!(
        !recs.is_empty() && recs.iter().all(|(ip, _)| front_ips.contains(ip)),
        "{recs:?}"
    );
    only_front.shutdown().await;
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_supported_api_version_is_enough() {
    let Some(h) = Harness::new("oldest") else {
        return;
    };
    let updater = h
        .updater(|c| c.api_version = Some(ApiVersion::OLDEST))
        .await;
    assert_eq!(updater.api_version(), ApiVersion::OLDEST);
    let host = h.name("o");
    let fqdn = format!("{host}.weave.local");
    let id = h.run_host("o", &host).await;
    let ips = container_ips(&id).await;
    assert!(wait(CONVERGE, || lookup(&h.db, &fqdn) == ips).await);
    docker_async(&["stop", "-t", "0", &id]).await.unwrap();
    assert!(wait(CONVERGE, || lookup(&h.db, &fqdn).is_empty()).await);
    updater.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_negotiated_version_is_the_daemons_and_is_really_sent() {
    let Some(h) = Harness::new("version") else {
        return;
    };
    let daemon: ApiVersion = docker(&["version", "--format", "{{.Server.APIVersion}}"])
        .unwrap()
        .parse()
        .unwrap();
    let updater = h.updater(|_| {}).await;
    assert_eq!(updater.api_version(), daemon.min(ApiVersion::new(1, 53)));
    updater.shutdown().await;
    // The version is on the wire (bollard alone sends none): a version newer than
    // the daemon's is refused by the daemon.
    let mut config = DockerConfig::with_socket(SOCKET);
    config.mode = DockerMode::On;
    config.api_version = Some(ApiVersion::new(daemon.major, daemon.minor + 1));
    let err = DockerUpdater::start(config, new_db()).await.unwrap_err();
    let line = err.to_string();
    assert!(line.contains("too new"), "{line}");
}

#[tokio::test]
async fn no_socket_is_off_in_auto_and_an_error_when_on() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("docker.sock");
    let mut config = DockerConfig::with_socket(&missing);
    let db = new_db();
    match DockerUpdater::start(config.clone(), db.clone())
        .await
        .unwrap()
    {
        Started::Off(DockerOff::NoSocket { socket }) => assert_eq!(socket, missing),
        other => panic!("auto without a socket: {other:?}"),
    }
    config.mode = DockerMode::Off;
    assert!(matches!(
        DockerUpdater::start(config.clone(), db.clone())
            .await
            .unwrap(),
        Started::Off(DockerOff::Disabled)
    ));
    config.mode = DockerMode::On;
    let err = DockerUpdater::start(config.clone(), db.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );

    // A stale socket file nobody listens on: off in auto, an error when on.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let mut config = DockerConfig::with_socket(&stale);
    match DockerUpdater::start(config.clone(), db.clone())
        .await
        .unwrap()
    {
        Started::Off(DockerOff::Unreachable { source }) => {
            assert!(source.to_string().contains("stale.sock"), "{source}");
        }
        other => panic!("auto with a dead socket: {other:?}"),
    }
    config.mode = DockerMode::On;
    let err = DockerUpdater::start(config, Arc::clone(&db))
        .await
        .unwrap_err();
    let line = err.to_string();
    assert!(
        line.starts_with("cannot reach the Docker daemon on ") && line.contains("stale.sock"),
        "{line}"
    );
    assert!(db.is_empty());
}
