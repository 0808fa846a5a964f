//! `dwara serve --data-dir`: registrations survive SIGKILL and restarts; a data dir
//! that is locked, damaged or from a newer dwara is refused with one clear line.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
use test_support::http::request;

use crate::nameserver::{BIN, Serve};

const LISTEN: [&str; 4] = [
    "--dns-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
];

fn serve(data_dir: &Path) -> Serve {
    let dir = data_dir.to_str().unwrap();
    let mut args = LISTEN.to_vec();
    args.extend(["--fallback", "127.0.0.1:9", "--data-dir", dir]);
    Serve::start(&args)
}

/// Runs `dwara serve` on `data_dir` expecting it to refuse to start.
fn refused(data_dir: &Path) -> Output {
    let out = Command::new(BIN)
        .args(["serve", "--docker", "off"])
        .args(LISTEN)
        .args(["--fallback", "127.0.0.1:9", "--data-dir"])
        .arg(data_dir)
        .env("NO_COLOR", "1")
        .env("DWARA_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    out
}

/// The one error line of a refused start.
fn error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("dwara: "))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    lines[0].to_owned()
}

fn put(s: &Serve, id: &str, ip: &str, fqdn: &str) {
    let (status, body) = request(
        s.http,
        "PUT",
        &format!("/name/{id}/{ip}"),
        Some(&format!("fqdn={fqdn}")),
    );
    assert_eq!(status, 204, "PUT {id} {ip} {fqdn}: {body}");
}

fn delete(s: &Serve, path: &str) {
    let (status, body) = request(s.http, "DELETE", path, None);
    assert_eq!(status, 204, "DELETE {path}: {body}");
}

fn a(s: &Serve, name: &str) -> Vec<String> {
    s.dig().query(name, "A").unwrap().data("A")
}

fn kill(s: Serve) {
    let status = s.signal_and_wait("KILL");
    assert!(!status.success());
}

#[test]
fn registrations_and_deletes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    put(&s, "c1", "10.32.0.1", "web.weave.local");
    put(&s, "c2", "10.32.0.2", "Web.Weave.Local.");
    put(&s, "c2", "fd00::2", "web.weave.local");
    put(&s, "c3", "10.32.0.3", "db.weave.local");
    put(&s, "c3", "10.32.0.4", "db.weave.local");
    put(&s, "c4", "10.32.0.5", "cache.weave.local");
    kill(s);

    // Restarted with the config file's data_dir naming the same directory.
    let etc = tempfile::tempdir().unwrap();
    let config = etc.path().join("dwara.yaml");
    std::fs::write(
        &config,
        format!(
            "nameserver:\n  dns_listen: 127.0.0.1:0\n  http_listen: 127.0.0.1:0\n  \
             fallback: [127.0.0.1:9]\n  data_dir: {}\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let s = Serve::start(&["--config", config.to_str().unwrap()]);
    assert_eq!(a(&s, "web.weave.local"), ["10.32.0.1", "10.32.0.2"]);
    assert_eq!(
        s.dig()
            .query("web.weave.local", "AAAA")
            .unwrap()
            .data("AAAA"),
        ["fd00::2"]
    );
    assert_eq!(a(&s, "db.weave.local"), ["10.32.0.3", "10.32.0.4"]);
    assert_eq!(a(&s, "cache.weave.local"), ["10.32.0.5"]);
    assert_eq!(
        s.dig().reverse("10.32.0.3").unwrap().data("PTR"),
        ["db.weave.local."]
    );
    // The ids came back too: deletes by id and by id and address work.
    delete(&s, "/name/c2");
    delete(&s, "/name/c3/10.32.0.3");
    delete(&s, "/name/c4/10.32.0.5?fqdn=CACHE.weave.local");
    assert_eq!(a(&s, "web.weave.local"), ["10.32.0.1"]);
    assert_eq!(a(&s, "db.weave.local"), ["10.32.0.4"]);
    assert_eq!(
        s.dig().query("cache.weave.local", "A").unwrap().status,
        "NXDOMAIN"
    );
    kill(s);

    // Deleted names stay deleted.
    let s = Serve::start(&["--config", config.to_str().unwrap()]);
    assert_eq!(a(&s, "web.weave.local"), ["10.32.0.1"]);
    assert!(
        s.dig()
            .query("web.weave.local", "AAAA")
            .unwrap()
            .data("AAAA")
            .is_empty()
    );
    assert_eq!(a(&s, "db.weave.local"), ["10.32.0.4"]);
    assert_eq!(
        s.dig().query("cache.weave.local", "A").unwrap().status,
        "NXDOMAIN"
    );
    let status = s.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");
}

/// The store file in the data dir.
const STORE_FILE: &str = "registrations.redb";

/// One PUT on its own connection; `None` when the server is gone.
fn try_put(addr: SocketAddr, id: &str, ip: &str, fqdn: &str) -> Option<u16> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .ok()?;
    let resp = client
        .put(format!("http://{addr}/name/{id}/{ip}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("fqdn={fqdn}"))
        .send()
        .ok()?;
    Some(resp.status().as_u16())
}

#[test]
fn sigkill_during_concurrent_registrations_loses_no_acknowledged_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    let addr = s.http;
    let acked = Mutex::new(Vec::new());
    let count = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..50 {
            let (acked, count) = (&acked, &count);
            scope.spawn(move || {
                for i in 0..20 {
                    let n = t * 20 + i;
                    let id = format!("c{n}");
                    let ip = format!("10.1.{}.{}", n / 250, n % 250 + 1);
                    let fqdn = format!("n{n}.weave.local");
                    match try_put(addr, &id, &ip, &fqdn) {
                        Some(204) => {
                            acked.lock().unwrap().push((id, ip, fqdn));
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(other) => panic!("PUT {id}: {other}"),
                        None => return,
                    }
                }
            });
        }
        // Kill once a good part of the 1,000 has been acknowledged.
        let deadline = Instant::now() + Duration::from_secs(60);
        while count.load(Ordering::Relaxed) < 300 {
            assert!(Instant::now() < deadline, "registrations too slow");
            std::thread::yield_now();
        }
        test_support::signal(s.child.id(), "KILL").unwrap();
    });
    let acked = acked.into_inner().unwrap();
    drop(s);
    assert!(acked.len() >= 300, "{}", acked.len());
    eprintln!("{} of 1000 acknowledged before SIGKILL", acked.len());

    let s = serve(dir.path());
    let (status, body) = request(s.http, "GET", "/name", None);
    assert_eq!(status, 200);
    let entries: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let have: std::collections::HashSet<(String, String, String)> = entries
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_owned(),
                e["ip"].as_str().unwrap().to_owned(),
                e["fqdn"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (id, ip, fqdn) in &acked {
        assert!(
            have.contains(&(id.clone(), ip.clone(), format!("{fqdn}."))),
            "acknowledged {id} {ip} {fqdn} is lost"
        );
    }
    // And DNS answers them.
    for (_, ip, fqdn) in acked.iter().step_by(37) {
        assert_eq!(a(&s, fqdn), std::slice::from_ref(ip));
    }
}

#[test]
fn a_second_dwara_on_one_data_dir_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let first = serve(dir.path());
    put(&first, "c1", "10.32.0.1", "web.weave.local");
    let out = refused(dir.path());
    let line = error_line(&out);
    assert!(
        line.contains(&dir.path().display().to_string()) && line.contains("in use"),
        "{line}"
    );
    // The first one is unharmed.
    assert_eq!(a(&first, "web.weave.local"), ["10.32.0.1"]);
    put(&first, "c2", "10.32.0.2", "web.weave.local");
    let status = first.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");
    let s = serve(dir.path());
    assert_eq!(a(&s, "web.weave.local"), ["10.32.0.1", "10.32.0.2"]);
}

#[test]
fn a_damaged_store_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    for i in 0..50 {
        put(
            &s,
            &format!("c{i}"),
            &format!("10.0.0.{i}"),
            "web.weave.local",
        );
    }
    kill(s);
    let file = dir.path().join(STORE_FILE);
    let good = std::fs::read(&file).unwrap();
    let damaged: [(&str, Vec<u8>); 3] = [
        ("truncated", good[..good.len() / 2].to_vec()),
        ("garbage", b"not a database at all\n".repeat(100)),
        ("empty", Vec::new()),
    ];
    for (what, bytes) in damaged {
        std::fs::write(&file, &bytes).unwrap();
        let out = refused(dir.path());
        let line = error_line(&out);
        assert!(
            line.contains(&file.display().to_string()) && line.contains("damaged"),
            "{what}: {line}"
        );
        assert!(
            std::fs::read(&file).unwrap() == bytes,
            "{what}: file changed"
        );
    }
    // The intact file is still good.
    std::fs::write(&file, &good).unwrap();
    let s = serve(dir.path());
    assert_eq!(a(&s, "web.weave.local").len(), 50);
}

#[test]
fn a_store_of_a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    put(&s, "c1", "10.32.0.1", "web.weave.local");
    let status = s.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");
    let file = dir.path().join(STORE_FILE);
    const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
    {
        let db = redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert("format", 99).unwrap();
        txn.commit().unwrap();
    }
    let out = refused(dir.path());
    let line = error_line(&out);
    assert!(
        line.contains("format 99") && line.contains("newer"),
        "{line}"
    );
    // Nothing was overwritten: the registration is still in the file.
    let db = redb::Database::open(&file).unwrap();
    let read = db.begin_read().unwrap();
    let regs: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("registrations");
    assert_eq!(read.open_table(regs).unwrap().len().unwrap(), 1);
    assert_eq!(
        read.open_table(META)
            .unwrap()
            .get("format")
            .unwrap()
            .unwrap()
            .value(),
        99
    );
}

/// A plain name server starts with one INFO line that says what runs (DNS, HTTP,
/// data dir, cluster, Docker, fallback servers) and nothing else at INFO.
#[test]
fn the_start_is_one_line_that_says_what_runs_and_memory_only() {
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--docker", "off"])
        .args(LISTEN)
        .args(["--fallback", "127.0.0.1:9"]);
    let s = Serve::spawn(cmd);
    let log = s.log.lock().unwrap();
    let upto_ready: Vec<&String> = log
        .iter()
        .take_while(|l| !l.contains("name server ready"))
        .chain(
            log.iter()
                .filter(|l| l.contains("name server ready"))
                .take(1),
        )
        .collect();
    let info: Vec<&&String> = upto_ready.iter().filter(|l| l.contains(" INFO ")).collect();
    assert_eq!(info.len(), 1, "one INFO line at start, got {info:#?}");
    let ready = info[0];
    for field in [
        "dns=127.0.0.1:",
        "http=127.0.0.1:",
        "domain=weave.local.",
        "dns_allow=loopback,",
        "rate_limit=",
        "data_dir=none (registrations live in memory only",
        "cluster=off",
        "docker=Docker updater disabled",
        "fallback=127.0.0.1:9",
        "upstreams=0",
    ] {
        assert!(ready.contains(field), "{field:?} missing from {ready}");
    }
}

/// `dwara serve --data-dir DIR` whose files may not grow past `max_bytes`
/// (`prlimit --fsize`, with SIGXFSZ ignored so a write fails with EFBIG instead).
fn serve_with_file_size_limit(data_dir: &Path, max_bytes: u64) -> Serve {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"trap "" XFSZ; exec prlimit --fsize="$0" -- "$@""#)
        .arg(max_bytes.to_string())
        .arg(BIN)
        .args(["serve", "--docker", "off"])
        .args(LISTEN)
        .args(["--fallback", "127.0.0.1:9", "--data-dir"])
        .arg(data_dir);
    Serve::spawn(cmd)
}

#[test]
fn a_registration_the_disk_refuses_gets_500_and_acknowledged_ones_survive() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve_with_file_size_limit(dir.path(), 150_000);
    let mut acked = 0;
    let failure = loop {
        assert!(acked < 20_000, "the file size limit never hit");
        let (status, body) = request(
            s.http,
            "PUT",
            &format!("/name/c{acked}/10.0.{}.{}", acked / 250, acked % 250 + 1),
            Some(&format!("fqdn=n{acked}.weave.local")),
        );
        match status {
            204 => acked += 1,
            _ => break (status, body),
        }
    };
    assert_eq!(failure.0, 500, "{failure:?}");
    assert!(
        failure.1.contains("not stored") && failure.1.contains("File too large"),
        "{failure:?}"
    );
    // The store's counters say the same: every acknowledged write committed, the
    // refused one failed.
    let (status, metrics) = request(s.http, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let value = |series: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in /metrics"))
            .round() as u64
    };
    assert_eq!(
        value("dwara_store_writes_total{result=\"committed\"}"),
        acked as u64
    );
    assert_eq!(value("dwara_store_writes_total{result=\"failed\"}"), 1);
    assert_eq!(value("dwara_store_batches_total{result=\"failed\"}"), 1);
    assert!(metrics.contains("dwara_store_commit_seconds_total"));
    kill(s);
    let s = serve(dir.path());
    let (status, body) = request(s.http, "GET", "/name", None);
    assert_eq!(status, 200);
    let entries: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(
        entries.len(),
        acked,
        "every acknowledged registration, no more"
    );
    assert_eq!(a(&s, &format!("n{}.weave.local", acked - 1)).len(), 1);
}

/// Polls `check` (every 50 ms, at most 10 s): the process's state is seen only
/// through dig and its API.
fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The (health, check) `GET /name` shows for the entry of `id`.
fn health_of(s: &Serve, id: &str) -> (Option<String>, Option<String>) {
    let (status, body) = request(s.http, "GET", "/name", None);
    assert_eq!(status, 200, "{body}");
    let entries: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let e = entries
        .iter()
        .find(|e| e["id"] == id)
        .unwrap_or_else(|| panic!("no entry {id} in {body}"));
    let text = |k: &str| e.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    (text("health"), text("check"))
}

#[test]
fn a_tcp_check_is_stored_and_runs_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let checked = |dir: &str| {
        let mut args = LISTEN.to_vec();
        args.extend(["--fallback", "127.0.0.1:9", "--data-dir", dir]);
        args.extend(["--check-interval-ms", "100", "--health-fail-open", "false"]);
        Serve::start(&args)
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let s = checked(data_dir);
    let add = s.dns(&[
        "add",
        "c1",
        "127.0.0.1",
        "web.weave.local",
        "--port",
        &port,
        "--check",
        "tcp",
    ]);
    assert!(add.status.success(), "{add:?}");
    put(&s, "c2", "10.32.0.2", "db.weave.local");
    wait_for("web healthy", || a(&s, "web.weave.local") == ["127.0.0.1"]);
    assert_eq!(
        health_of(&s, "c1"),
        (Some("healthy".to_owned()), Some("tcp".to_owned()))
    );
    assert!(s.logged("health check verdict changed"));
    kill(s);

    // Restarted: the check came back with the registration and runs again.
    let s = checked(data_dir);
    assert_eq!(health_of(&s, "c1").1.as_deref(), Some("tcp"));
    assert_eq!(health_of(&s, "c2"), (None, None));
    assert_eq!(a(&s, "db.weave.local"), ["10.32.0.2"]);
    wait_for("web healthy again", || {
        a(&s, "web.weave.local") == ["127.0.0.1"]
    });
    assert_eq!(s.metric("dwara_health_checks_running "), Some(1.0));
    drop(listener);
    wait_for("web unhealthy", || {
        health_of(&s, "c1").0.as_deref() == Some("unhealthy")
    });
    // Fail open is off: the name's only entry fails, so nothing is answered.
    assert!(a(&s, "web.weave.local").is_empty());

    // The check is removed by a PUT without it, and that is stored too.
    let (status, body) = request(
        s.http,
        "PUT",
        "/name/c1/127.0.0.1",
        Some(&format!("fqdn=web.weave.local&port={port}")),
    );
    assert_eq!(status, 204, "{body}");
    assert_eq!(a(&s, "web.weave.local"), ["127.0.0.1"]);
    kill(s);
    let s = checked(data_dir);
    assert_eq!(health_of(&s, "c1"), (None, None));
    assert_eq!(a(&s, "web.weave.local"), ["127.0.0.1"]);
    assert_eq!(s.metric("dwara_health_checks_running "), Some(0.0));
}

/// A priority and weight are stored and answered again after SIGKILL, beside a row
/// written the way builds before priorities and weights wrote it (value version 1:
/// port and service only), which loads with the defaults 0 and 1.
#[test]
fn priorities_and_weights_survive_sigkill_beside_rows_of_earlier_builds() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(dir.path());
    let add = s.dns(&[
        "add",
        "c1",
        "10.32.0.1",
        "web.weave.local",
        "--port",
        "80",
        "--service",
        "_http._tcp",
        "--priority",
        "1",
        "--weight",
        "9",
    ]);
    assert!(add.status.success(), "{add:?}");
    let status = s.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");
    // The row of an earlier build, byte for byte: record version 1, id "c2",
    // 10.32.0.2, the fqdn; value version 1, port 80, the service.
    let key = [
        &b"\x01\x00\x00\x00\x02c2\x04\x0a\x20\x00\x02"[..],
        b"web.weave.local.",
    ]
    .concat();
    {
        let db = redb::Database::open(dir.path().join(STORE_FILE)).unwrap();
        let txn = db.begin_write().unwrap();
        let regs: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("registrations");
        txn.open_table(regs)
            .unwrap()
            .insert(&key[..], &b"\x01\x00\x50_http._tcp"[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let s = serve(dir.path());
    let want = [
        "0 1 80 0a200002.addr.weave.local.",
        "1 9 80 0a200001.addr.weave.local.",
    ];
    let srv = s.dig().query("_http._tcp.web.weave.local", "SRV").unwrap();
    assert_eq!(srv.data("SRV"), want, "{}", srv.raw);
    kill(s);
    let s = serve(dir.path());
    let srv = s.dig().query("_http._tcp.web.weave.local", "SRV").unwrap();
    assert_eq!(srv.data("SRV"), want, "{}", srv.raw);
}
