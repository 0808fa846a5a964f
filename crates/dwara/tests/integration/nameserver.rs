//! `dwara serve` as a name server, driven by dig and the HTTP API.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use test_support::dig::Dig;
use test_support::dnsmasq::{Dnsmasq, DnsmasqOptions};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_dwara");

/// A running `dwara serve`; its stderr kept; killed on drop.
pub(crate) struct Serve {
    pub(crate) child: Child,
    pub(crate) dns: SocketAddr,
    pub(crate) http: SocketAddr,
    /// Every stderr line so far.
    pub(crate) log: Arc<Mutex<Vec<String>>>,
}

fn field(line: &str, key: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.parse().ok())
}

impl Serve {
    /// Starts `dwara serve ARGS` (Docker off) and waits for its "name server ready"
    /// line.
    pub(crate) fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--docker", "off"]).args(args);
        Self::spawn(cmd)
    }

    /// Runs `cmd` (a `dwara serve`, perhaps behind a wrapper) and waits (20 s) for
    /// its "name server ready" line; stderr is echoed and kept for the life of the
    /// process.
    pub(crate) fn spawn(cmd: Command) -> Self {
        Self::spawn_within(cmd, Duration::from_secs(20))
    }

    /// [`Serve::spawn`], waiting at most `ready_within` for the ready line.
    pub(crate) fn spawn_within(mut cmd: Command, ready_within: Duration) -> Self {
        let mut child = cmd
            .env("NO_COLOR", "1")
            .env("DWARA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[dwara] {line}");
                let ready = line.contains("name server ready");
                let addrs = (field(&line, "dns="), field(&line, "http="));
                // Kept before the ready line is reported: what it logged before
                // becoming ready is in `log` once `spawn` returns.
                lines.lock().unwrap().push(line);
                if ready {
                    let _ = tx.send(addrs);
                }
            }
        });
        match rx.recv_timeout(ready_within) {
            Ok((Some(dns), Some(http))) => Self {
                child,
                dns,
                http,
                log,
            },
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{cmd:?} did not become ready ({other:?}):\n{}",
                    log.lock().unwrap().join("\n")
                );
            }
        }
    }

    /// The value of the `/metrics` series `series`, `None` when it is absent.
    pub(crate) fn metric(&self, series: &str) -> Option<f64> {
        let (status, body) = test_support::http::request(self.http, "GET", "/metrics", None);
        assert_eq!(status, 200, "{body}");
        body.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
    }

    /// Whether a stderr line so far contains `needle`.
    pub(crate) fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    pub(crate) fn dig(&self) -> Dig {
        Dig::new(self.dns)
    }

    fn api(&self) -> String {
        format!("http://{}", self.http)
    }

    /// `dwara dns ARGS --api <ours>`.
    pub(crate) fn dns(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("dns")
            .args(args)
            .arg("--api")
            .arg(self.api())
            .output()
            .unwrap()
    }

    /// Sends `SIG<sig>` and waits (at most 10 s) for the exit.
    pub(crate) fn signal_and_wait(mut self, sig: &str) -> ExitStatus {
        test_support::signal(self.child.id(), sig).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "dwara serve did not exit after SIG{sig}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn fallback() -> Dnsmasq {
    Dnsmasq::start(DnsmasqOptions {
        hosts: "127.0.0.99 fallback-host.example\n".to_owned(),
        local_ttl: Some(30),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn register_with_the_cli_resolve_with_dig_and_stop_on_sigterm() {
    let f = fallback();
    let fb = f.addr().to_string();
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--fallback",
        &fb,
    ]);
    ok(&s.dns(&["add", "c1", "10.32.0.1", "web.weave.local"]));
    ok(&s.dns(&["add", "c2", "10.32.0.2", "web.weave.local"]));
    ok(&s.dns(&["add", "c2", "fd00::2", "web.weave.local"]));

    let a = s.dig().query("Web.Weave.Local", "A").unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert!(a.has_flag("aa"));
    assert_eq!(a.data("A"), ["10.32.0.1", "10.32.0.2"]);
    assert!(
        a.answers
            .iter()
            .all(|r| r.name == "Web.Weave.Local." && r.ttl == 1),
        "{}",
        a.raw
    );
    assert_eq!(
        s.dig()
            .query("web.weave.local", "AAAA")
            .unwrap()
            .data("AAAA"),
        ["fd00::2"]
    );
    assert_eq!(
        s.dig().reverse("10.32.0.1").unwrap().data("PTR"),
        ["web.weave.local."]
    );

    let mut looked_up: Vec<String> = ok(&s.dns(&["lookup", "web.weave.local"]))
        .lines()
        .map(str::to_owned)
        .collect();
    looked_up.sort();
    assert_eq!(looked_up, ["10.32.0.1", "10.32.0.2", "fd00::2"]);

    // Forwarded to the dnsmasq fallback.
    let a = s.dig().query("fallback-host.example", "A").unwrap();
    assert_eq!(a.data("A"), ["127.0.0.99"], "{}", a.raw);
    assert_eq!(
        s.dig().reverse("127.0.0.99").unwrap().data("PTR"),
        ["fallback-host.example."]
    );

    ok(&s.dns(&["rm", "c1", "10.32.0.1"]));
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().data("A"),
        ["10.32.0.2"]
    );
    ok(&s.dns(&["rm", "c2"]));
    let a = s.dig().query("web.weave.local", "A").unwrap();
    assert_eq!(a.status, "NXDOMAIN", "{}", a.raw);
    let out = s.dns(&["lookup", "web.weave.local"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no records"));

    // Bad input is refused with the API's message, and stores nothing.
    let out = s.dns(&["add", "c3", "10.32.0.3", "web.example.com"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not inside the domain"),
        "{out:?}"
    );
    assert_eq!(
        s.dig().query("web.example.com", "A").unwrap().status,
        "REFUSED",
        "forwarded to dnsmasq, which has no upstream"
    );

    let status = s.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");
}

#[test]
fn dns_add_with_a_port_is_answered_as_srv() {
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ]);
    ok(&s.dns(&[
        "add",
        "c1",
        "10.32.0.1",
        "web.weave.local",
        "--port",
        "8080",
        "--service",
        "_http._tcp",
    ]));
    ok(&s.dns(&[
        "add",
        "c2",
        "10.32.0.2",
        "web.weave.local",
        "--port",
        "8080",
        "--service",
        "_http._tcp",
    ]));
    ok(&s.dns(&["add", "c3", "10.32.0.3", "db.weave.local", "--port", "5432"]));
    let a = s.dig().query("_http._tcp.web.weave.local", "SRV").unwrap();
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    let target = |ip: &str| test_support::dig::srv_target(ip.parse().unwrap(), "weave.local");
    assert_eq!(
        a.data("SRV"),
        [
            format!("0 1 8080 {}", target("10.32.0.1")),
            format!("0 1 8080 {}", target("10.32.0.2"))
        ],
        "{}",
        a.raw
    );
    let mut extra: Vec<&str> = a.additional.iter().map(|r| r.data.as_str()).collect();
    extra.sort_unstable();
    assert_eq!(extra, ["10.32.0.1", "10.32.0.2"], "{}", a.raw);
    let d = s.dig().query("_5432._tcp.db.weave.local", "SRV").unwrap();
    assert_eq!(
        d.data("SRV"),
        [format!("0 1 5432 {}", target("10.32.0.3"))],
        "{}",
        d.raw
    );
    let mut eps: Vec<String> = ok(&s.dns(&["lookup", "_http._tcp.web.weave.local"]))
        .lines()
        .map(str::to_owned)
        .collect();
    eps.sort();
    assert_eq!(eps, ["10.32.0.1:8080", "10.32.0.2:8080"]);
    // Bad values are refused before or by the API, with a message.
    for args in [
        &["add", "c4", "10.32.0.4", "x.weave.local", "--port", "0"][..],
        &[
            "add",
            "c4",
            "10.32.0.4",
            "x.weave.local",
            "--service",
            "_http._tcp",
        ],
        &[
            "add",
            "c4",
            "10.32.0.4",
            "x.weave.local",
            "--port",
            "80",
            "--service",
            "http",
        ],
    ] {
        let out = s.dns(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    assert_eq!(
        s.dig().query("x.weave.local", "A").unwrap().status,
        "NXDOMAIN"
    );
}

#[test]
fn domain_ttl_and_resolv_conf_flags() {
    let f = fallback();
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {}\n", f.addr())).unwrap();
    let s = Serve::start(&[
        "--domain",
        "Example.Internal",
        "--ttl",
        "7",
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--resolv-conf",
        resolv.to_str().unwrap(),
        "--dns-workers",
        "1",
        // One runtime thread serves HTTP and DNS over TCP as well.
        "--worker-threads",
        "1",
    ]);
    ok(&s.dns(&["add", "c1", "10.32.0.1", "db.example.internal"]));
    let a = s.dig().query("db.example.internal", "A").unwrap();
    assert_eq!(a.data("A"), ["10.32.0.1"]);
    assert_eq!(a.answers[0].ttl, 7);
    let a = s.dig().query("nope.example.internal", "A").unwrap();
    assert_eq!(a.status, "NXDOMAIN");
    assert_eq!(a.authority[0].name, "example.internal.");
    // weave.local is just another name now: forwarded.
    assert_eq!(
        s.dig()
            .query("fallback-host.example", "A")
            .unwrap()
            .data("A"),
        ["127.0.0.99"]
    );
    assert!(
        !s.dns(&["add", "c1", "10.32.0.1", "db.weave.local"])
            .status
            .success()
    );
    let tcp = s
        .dig()
        .query_with("db.example.internal", "A", &["+tcp"])
        .unwrap();
    assert_eq!(tcp.data("A"), ["10.32.0.1"]);
    let status = s.signal_and_wait("INT");
    assert!(status.success(), "{status:?}");
    let zero = Command::new(BIN)
        .args(["serve", "--worker-threads", "0"])
        .output()
        .unwrap();
    assert!(!zero.status.success());
    let err = String::from_utf8_lossy(&zero.stderr);
    assert!(err.contains("--worker-threads"), "{err}");
}

#[test]
fn no_arguments_serves_on_the_defaults() {
    // The defaults are fixed ports; this is the one test that uses them.
    let s = Serve::start(&[]);
    assert_eq!(s.dns, "127.0.0.1:1053".parse().unwrap());
    assert_eq!(s.http, "127.0.0.1:6784".parse().unwrap());
    // `dwara dns` defaults to the default API address too.
    let add = Command::new(BIN)
        .args(["dns", "add", "c1", "10.32.0.1", "web.weave.local"])
        .output()
        .unwrap();
    ok(&add);
    let a = s.dig().query("web.weave.local", "A").unwrap();
    assert_eq!(a.data("A"), ["10.32.0.1"], "{}", a.raw);
    let a = s.dig().query("nope.weave.local", "A").unwrap();
    assert_eq!(a.status, "NXDOMAIN", "{}", a.raw);
    let status = s.signal_and_wait("TERM");
    assert!(status.success(), "{status:?}");
}

#[test]
fn bad_flags_exit_with_one_clear_line() {
    for (args, needle) in [
        (&["serve", "--fallback", "nonsense"][..], "IP:PORT"),
        (
            &[
                "serve",
                "--domain",
                "a..b",
                "--dns-listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
            ][..],
            "domain",
        ),
        (
            &["dns", "lookup", "x.weave.local", "--api", "ftp://x"][..],
            "http://",
        ),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Resident set size of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn churn_leaves_no_tombstones_and_flat_memory() {
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--fallback",
        "127.0.0.1:9",
        "--tombstone-grace",
        "1",
    ]);
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let count_all = || -> usize {
        let body = client
            .get(format!("{}/name?tombstones=true", s.api()))
            .send()
            .unwrap()
            .text()
            .unwrap();
        serde_json::from_str::<Vec<serde_json::Value>>(&body)
            .unwrap()
            .len()
    };
    // 20,000 add/delete cycles of distinct names, in 4 batches; after each batch
    // the grace passes and every tombstone must be gone.
    let mut rss = Vec::new();
    for batch in 0..4 {
        // Four clients at once (each its own keep-alive connection).
        std::thread::scope(|scope| {
            for t in 0..4 {
                let client = &client;
                let api = s.api();
                scope.spawn(move || {
                    for i in (t..5_000).step_by(4) {
                        let id = format!("c{batch}-{i}");
                        let put = client
                            .put(format!("{api}/name/{id}/10.40.{}.{}", i / 250, i % 250))
                            .body(format!("fqdn=n{batch}-{i}.weave.local"))
                            .send()
                            .unwrap();
                        assert_eq!(put.status(), 204);
                        let del = client.delete(format!("{api}/name/{id}")).send().unwrap();
                        assert_eq!(del.status(), 204);
                    }
                });
            }
        });
        let deadline = Instant::now() + Duration::from_secs(15);
        while count_all() > 0 {
            assert!(
                Instant::now() < deadline,
                "batch {batch}: tombstones never collected"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        rss.push(rss_kib(s.child.id()));
    }
    eprintln!("RSS after each batch (KiB): {rss:?}");
    // Allocator noise aside, the last batch costs no more memory than the first
    // (20,000 kept tombstones would be several MiB).
    assert!(rss[3] <= rss[0] + 2_048, "RSS grew: {rss:?}");
}

#[test]
fn dns_commands_name_the_url_in_one_line_when_the_server_is_down() {
    // Nothing listens there: connection refused, at once.
    let api = format!("http://{}", test_support::free_addr());
    for args in [
        &["dns", "lookup", "x.weave.local", "--api", &api][..],
        &[
            "dns",
            "add",
            "c1",
            "10.32.0.1",
            "x.weave.local",
            "--api",
            &api,
        ][..],
        &["dns", "rm", "c1", "--api", &api][..],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.trim();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(&api), "{args:?}: {err}");
        assert!(err.contains("cannot connect"), "{args:?}: {err}");
    }
}
