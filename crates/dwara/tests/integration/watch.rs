//! `dwara watch --json` following a real dnsmasq, and its argument validation.

use std::process::Stdio;
use std::time::Duration;

use test_support::dnsmasq::{Dnsmasq, DnsmasqOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(20);

struct Watch {
    child: Child,
    lines: mpsc::UnboundedReceiver<serde_json::Value>,
}

impl Watch {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dwara"))
            .arg("watch")
            .args(args)
            .env("DWARA_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let v: serde_json::Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The next printed endpoint set.
    async fn next(&mut self) -> Vec<String> {
        let v = self.next_line().await;
        v["endpoints"]
            .as_array()
            .expect("endpoints array")
            .iter()
            .map(|e| e.as_str().unwrap().to_owned())
            .collect()
    }

    /// The next printed line, checked to describe its change.
    async fn next_line(&mut self) -> serde_json::Value {
        let v = tokio::time::timeout(WAIT, self.lines.recv())
            .await
            .expect("no line printed in time")
            .expect("watch exited");
        // Each line reports the resolution that made the change.
        let decision = v["decision"].as_str().unwrap_or_default();
        assert!(
            decision == "published" || decision == "cleared",
            "line does not describe its change: {v}"
        );
        v
    }

    fn no_pending_line(&mut self) -> bool {
        self.lines.try_recv().is_err()
    }

    async fn stop(mut self) {
        let pid = self.child.id().unwrap();
        test_support::signal(pid, "TERM").unwrap();
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("watch did not exit on SIGTERM")
            .unwrap();
        assert!(status.success(), "{status}");
    }
}

fn set(addrs: &[&str]) -> Vec<String> {
    addrs.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn watch_follows_dnsmasq_changes_outage_and_restart() {
    let mut dnsmasq = Dnsmasq::start(DnsmasqOptions {
        hosts: "10.0.0.2 api.test\n10.0.0.1 api.test\n".into(),
        local_ttl: Some(1),
        extra_args: vec![],
    })
    .unwrap();
    let ns = dnsmasq.addr().to_string();
    let common = [
        "api.test",
        "--port",
        "8080",
        "--refresh",
        "1",
        "--nameserver",
        &ns,
        "--json",
    ];
    let mut open = Watch::spawn(&[&common[..], &["--fail-open"]].concat());
    let mut closed = Watch::spawn(&[&common[..], &["--fail-closed"]].concat());

    // Once at start, sorted.
    let first = set(&["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert_eq!(open.next().await, first);
    assert_eq!(closed.next().await, first);

    // A hosts-file change after SIGHUP reaches the set.
    dnsmasq
        .set_hosts("10.0.0.1 api.test\n10.0.0.3 api.test\n")
        .unwrap();
    let second = set(&["10.0.0.1:8080", "10.0.0.3:8080"]);
    assert_eq!(open.next().await, second);
    assert_eq!(closed.next().await, second);

    // dnsmasq goes away: fail-closed empties, fail-open keeps (prints nothing).
    dnsmasq.stop().unwrap();
    assert_eq!(closed.next().await, Vec::<String>::new());
    assert!(
        open.no_pending_line(),
        "fail-open changed its set while DNS was down"
    );

    // Back, with a new record: both follow.
    dnsmasq.set_hosts("10.0.0.4 api.test\n").unwrap();
    dnsmasq.restart().unwrap();
    let third = set(&["10.0.0.4:8080"]);
    assert_eq!(closed.next().await, third);
    assert_eq!(open.next().await, third);

    open.stop().await;
    closed.stop().await;
}

async fn run_dwara(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dwara"))
        .args(args)
        .env("DWARA_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn bad_watch_arguments_fail_with_one_clear_line() {
    for (args, want) in [
        (vec!["", "--port", "80"], "hostname"),
        (vec!["bad host!", "--port", "80"], "hostname"),
        (vec!["a..b", "--port", "80"], "hostname"),
        (vec!["api.test", "--port", "0"], "port"),
        (vec!["api.test", "--port", "70000"], "port"),
        (vec!["api.test"], "port"),
        (
            vec!["api.test", "--port", "80", "--refresh", "0"],
            "refresh_interval_s",
        ),
        (
            vec!["api.test", "--port", "80", "--type", "mx"],
            "record type",
        ),
    ] {
        let mut full = vec!["watch"];
        full.extend(&args);
        full.extend(["--nameserver", "127.0.0.1:9"]);
        let (ok, stderr) = run_dwara(&full).await;
        assert!(!ok, "{args:?} succeeded");
        let stderr = stderr.trim();
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn bad_config_files_fail_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let up =
        |block: &str| format!("upstreams:\n  - name: api\n    listen: 127.0.0.1:9000\n{block}");
    for (yaml, want) in [
        (
            up("    consul:\n      service: api\n"),
            "consul discovery is not supported yet",
        ),
        (
            up("    dns_discovery:\n      hostname: ''\n      port: 80\n"),
            "hostname",
        ),
        (
            up("    dns_discovery:\n      hostname: a.b\n      port: 0\n"),
            "port",
        ),
        (
            up("    dns_discovery:\n      hostname: a.b\n      port: 99999\n"),
            "port",
        ),
        (
            up(
                "    dns_discovery:\n      hostname: a.b\n      port: 80\n      refresh_interval_s: 0\n",
            ),
            "refresh_interval_s",
        ),
        (
            up("    dns_discovery:\n      hostname: a.b\n      port: 80\n      record_type: TXT\n"),
            "TXT",
        ),
        ("upstreams: [".to_owned(), "config file"),
    ] {
        let path = dir.path().join("dwara.yaml");
        std::fs::write(&path, &yaml).unwrap();
        let (ok, stderr) = run_dwara(&["check", "--config", path.to_str().unwrap()]).await;
        assert!(!ok, "{yaml} was accepted");
        let stderr = stderr.trim();
        assert_eq!(stderr.lines().count(), 1, "{yaml}: {stderr}");
        assert!(stderr.contains(want), "{yaml}: {stderr}");
    }
    let path = dir.path().join("good.yaml");
    std::fs::write(
        &path,
        up("    dns_discovery:\n      hostname: a.b\n      port: 80\n"),
    )
    .unwrap();
    let (ok, stderr) = run_dwara(&["check", "--config", path.to_str().unwrap()]).await;
    assert!(ok, "{stderr}");
}

/// `dwara watch --type srv` gets every instance at its own port from dwara's
/// answers (one record per instance, a target per instance, its address in the
/// additional section), follows a delete, and reads dnsmasq's `--srv-host`
/// answers (targets from its hosts file, which answers REFUSED for their AAAA) with
/// each record's priority and weight.
#[tokio::test]
async fn watch_srv_gets_every_instance_from_dwara_and_from_dnsmasq() {
    let dwara = crate::nameserver::Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ]);
    for (id, ip, port) in [
        ("w1", "10.50.0.1", 8080),
        ("w2", "10.50.0.2", 9090),
        ("w3", "fd00::50:3", 8080),
    ] {
        let form = format!("fqdn=web.weave.local&port={port}&service=_http._tcp");
        let path = format!("/name/{id}/{ip}");
        let (status, body) =
            test_support::http::request_async(dwara.http, "PUT", &path, Some(&form)).await;
        assert_eq!(status, 204, "{body}");
    }
    let ns = dwara.dns.to_string();
    let args = |host: &'static str, ns: &str| {
        let mut v = vec![host.to_owned(), "--type".into(), "srv".into()];
        v.extend(["--refresh".into(), "1".into(), "--json".into()]);
        v.extend(["--nameserver".into(), ns.to_owned()]);
        v
    };
    let a = args("_http._tcp.web.weave.local", &ns);
    let mut watch = Watch::spawn(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        watch.next().await,
        set(&["10.50.0.1:8080", "10.50.0.2:9090", "[fd00::50:3]:8080"])
    );
    let (status, _) =
        test_support::http::request_async(dwara.http, "DELETE", "/name/w2", None).await;
    assert_eq!(status, 204);
    assert_eq!(
        watch.next().await,
        set(&["10.50.0.1:8080", "[fd00::50:3]:8080"])
    );
    watch.stop().await;

    let dnsmasq = Dnsmasq::start(DnsmasqOptions {
        hosts: "10.0.0.1 web1.test\n10.0.0.2 web2.test\n".into(),
        local_ttl: Some(1),
        extra_args: vec![
            "--srv-host=_http._tcp.api.test,web1.test,8080".into(),
            "--srv-host=_http._tcp.api.test,web2.test,9090,0,5".into(),
        ],
    })
    .unwrap();
    let a = args("_http._tcp.api.test", &dnsmasq.addr().to_string());
    let mut watch = Watch::spawn(&a.iter().map(String::as_str).collect::<Vec<_>>());
    // Each endpoint with its record's priority and weight (dnsmasq's default
    // weight is 0; the second record says priority 0, weight 5).
    let line = watch.next_line().await;
    assert_eq!(
        line["srv"],
        serde_json::json!([
            {"addr": "10.0.0.1:8080", "priority": 0, "weight": 0},
            {"addr": "10.0.0.2:9090", "priority": 0, "weight": 5},
        ]),
        "{line}"
    );
    watch.stop().await;
}
