//! Running on a real host: the DNS allow list and rate limit, queried with dig from
//! other network namespaces on a bridge, with a real dnsmasq upstream whose query
//! log shows what was forwarded; and the HTTP API's bearer token, driven by curl
//! and `dwara dns`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use test_support::dig::{DigAnswer, parse};

use crate::cluster::{Netns, ip};
use crate::nameserver::{BIN, Serve};

const PATIENCE: Duration = Duration::from_secs(10);

/// `program ARGS` inside network namespace `ns`.
fn in_ns(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// dig from namespace `ns` (from source address `from` when given) to the server;
/// `None` when nothing answered.
fn try_dig_from(ns: &str, from: Option<&str>, server: &str, args: &[&str]) -> Option<DigAnswer> {
    let mut c = in_ns(ns, "dig");
    c.arg(format!("@{server}"));
    if let Some(from) = from {
        c.args(["-b", from]);
    }
    let out = c
        .args(["+tries=1", "+time=2", "+nocookie"])
        .args(args)
        .output()
        .unwrap();
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// [`try_dig_from`] that must get an answer.
fn dig_from(ns: &str, from: Option<&str>, server: &str, args: &[&str]) -> DigAnswer {
    try_dig_from(ns, from, server, args)
        .unwrap_or_else(|| panic!("no answer from {server} to {args:?}"))
}

/// A dnsmasq inside `ns` on 127.0.0.1:5353 that answers `*.up.test` with
/// 192.0.2.55 and logs every query it gets to a file.
struct Upstream {
    child: std::process::Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Upstream {
    fn start(ns: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("queries.log");
        let child = in_ns(ns, "dnsmasq")
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--port=5353",
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--address=/up.test/192.0.2.55",
                "--log-queries",
            ])
            .arg(format!("--log-facility={}", log.display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .spawn()
            .unwrap();
        let me = Self {
            child,
            log,
            _dir: dir,
        };
        // Answering: a query of our own shows up in its log.
        await_that("the upstream answers", || {
            try_dig_from(ns, None, "127.0.0.1", &["-p", "5353", "ready.up.test"])
                .is_some_and(|a| a.status == "NOERROR")
                && me.saw("ready.up.test")
        });
        me
    }

    /// Whether dnsmasq was asked `name` (its log has a `query[…] name` line).
    fn saw(&self, name: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("query[") && l.contains(&format!(" {name} ")))
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn await_that(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `dwara serve` in namespace `ns` on `dns_ip` port 53 (HTTP on the namespace's
/// loopback), forwarding to the [`Upstream`] there.
fn serve_in(ns: &str, dns_ip: &str, args: &[&str]) -> Serve {
    let mut cmd = in_ns(ns, BIN);
    cmd.args(["serve", "--docker", "off", "--fallback", "127.0.0.1:5353"])
        .args(["--dns-listen", &format!("{dns_ip}:53")])
        .args(["--http-listen", "127.0.0.1:6784"])
        .args(args);
    Serve::spawn(cmd)
}

/// An HTTP request with curl inside `ns`: (status, headers and body).
fn curl_in(ns: Option<&str>, args: &[&str]) -> (u16, String) {
    let mut c = match ns {
        Some(ns) => in_ns(ns, "curl"),
        None => Command::new("curl"),
    };
    let out = c
        .args(["-s", "-i", "-m", "10", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// The value of `/metrics` series `series` of a server whose API is on `ns`'s
/// loopback.
/// `PUT`s the name `web.weave.local` with curl (in `ns`, else here) to `url`, with
/// the given extra headers; the status and the response.
fn put_web(ns: Option<&str>, headers: &[&str], url: &str) -> (u16, String) {
    let mut args = vec!["-X", "PUT", "-d", "fqdn=web.weave.local"];
    for h in headers {
        args.extend(["-H", h]);
    }
    args.push(url);
    curl_in(ns, &args)
}

fn metric_in(ns: &str, series: &str) -> f64 {
    let (status, body) = curl_in(Some(ns), &["http://127.0.0.1:6784/metrics"]);
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[test]
fn outside_the_allow_list_every_name_is_refused_and_nothing_is_forwarded() {
    let Some(ns) = Netns::required(3) else {
        return;
    };
    let (server, allowed, outsider) = (&ns.nodes[0], &ns.nodes[1], &ns.nodes[2]);
    let up = Upstream::start(server);
    let ip0 = Netns::addr(0).to_string();
    let s = serve_in(
        server,
        &ip0,
        &["--dns-allow", &format!("{}/32", Netns::addr(1))],
    );
    let (status, _) = put_web(Some(server), &[], "http://127.0.0.1:6784/name/c1/10.32.0.9");
    assert_eq!(status, 204);

    // The allowed client gets both halves.
    let a = dig_from(allowed, None, &ip0, &["web.weave.local"]);
    assert_eq!(a.data("A"), ["10.32.0.9"], "{}", a.raw);
    let a = dig_from(allowed, None, &ip0, &["first.up.test"]);
    assert_eq!(a.data("A"), ["192.0.2.55"], "{}", a.raw);

    // The outsider gets REFUSED for everything, over UDP and TCP.
    for args in [
        &["out.up.test"][..],
        &["+tcp", "out-tcp.up.test"],
        &["web.weave.local"],
        &["-x", "10.32.0.9"],
    ] {
        let a = dig_from(outsider, None, &ip0, args);
        assert_eq!(a.status, "REFUSED", "{args:?}: {}", a.raw);
        assert!(a.answers.is_empty(), "{}", a.raw);
    }
    // A later query of the allowed client reaches the upstream; the outsider's
    // never did.
    let a = dig_from(allowed, None, &ip0, &["after.up.test"]);
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    await_that("the upstream logs after.up.test", || {
        up.saw("after.up.test")
    });
    assert!(up.saw("first.up.test"));
    assert!(!up.saw("out.up.test"), "a refused query was forwarded");
    assert!(!up.saw("out-tcp.up.test"), "a refused query was forwarded");
    assert_eq!(
        metric_in(
            server,
            "dwara_dns_refused_total{reason=\"client_not_allowed\"}"
        ),
        4.0
    );
    assert_eq!(
        metric_in(
            server,
            "dwara_dns_refused_total{reason=\"forward_not_allowed\"}"
        ),
        0.0
    );
    drop(s);
    drop(up);
    drop(ns);
}

#[test]
fn local_any_answers_the_domain_to_anyone_but_forwards_only_for_the_allowed() {
    let Some(ns) = Netns::required(3) else {
        return;
    };
    let (server, allowed, outsider) = (&ns.nodes[0], &ns.nodes[1], &ns.nodes[2]);
    let up = Upstream::start(server);
    let ip0 = Netns::addr(0).to_string();
    let s = serve_in(
        server,
        &ip0,
        &[
            "--dns-allow",
            &format!("{}/32", Netns::addr(1)),
            "--dns-allow-local-any",
        ],
    );
    let (status, _) = put_web(Some(server), &[], "http://127.0.0.1:6784/name/c1/10.32.0.9");
    assert_eq!(status, 204);
    let a = dig_from(outsider, None, &ip0, &["web.weave.local"]);
    assert_eq!(a.data("A"), ["10.32.0.9"], "{}", a.raw);
    let a = dig_from(outsider, None, &ip0, &["nothere.weave.local"]);
    assert_eq!(a.status, "NXDOMAIN", "{}", a.raw);
    let a = dig_from(outsider, None, &ip0, &["-x", "10.32.0.9"]);
    assert_eq!(a.data("PTR"), ["web.weave.local."], "{}", a.raw);
    for args in [&["out.up.test"][..], &["+tcp", "out-tcp.up.test"]] {
        let a = dig_from(outsider, None, &ip0, args);
        assert_eq!(a.status, "REFUSED", "{args:?}: {}", a.raw);
    }
    let a = dig_from(allowed, None, &ip0, &["after.up.test"]);
    assert_eq!(a.data("A"), ["192.0.2.55"], "{}", a.raw);
    await_that("the upstream logs after.up.test", || {
        up.saw("after.up.test")
    });
    assert!(!up.saw("out.up.test") && !up.saw("out-tcp.up.test"));
    assert_eq!(
        metric_in(
            server,
            "dwara_dns_refused_total{reason=\"forward_not_allowed\"}"
        ),
        2.0
    );
    drop(s);
    drop(up);
    drop(ns);
}

#[test]
fn by_default_the_subnets_of_the_hosts_interfaces_are_allowed_as_they_change() {
    let Some(ns) = Netns::required(2) else {
        return;
    };
    let (server, client) = (&ns.nodes[0], &ns.nodes[1]);
    // The client also has an address in a subnet the server has no interface in
    // (yet); the server can reach it over the bridge.
    ip(&["-n", client, "addr", "add", "10.98.0.2/24", "dev", "eth0"]).unwrap();
    ip(&["-n", server, "route", "add", "10.98.0.0/24", "dev", "eth0"]).unwrap();
    let up = Upstream::start(server);
    let ip0 = Netns::addr(0).to_string();
    let s = serve_in(server, &ip0, &[]);
    assert!(
        s.logged("dns_allow=loopback,"),
        "the start-up line names the allowed clients"
    );

    let a = dig_from(client, None, &ip0, &["same-subnet.up.test"]);
    assert_eq!(a.data("A"), ["192.0.2.55"], "{}", a.raw);
    let a = dig_from(client, Some("10.98.0.2"), &ip0, &["other-subnet.up.test"]);
    assert_eq!(a.status, "REFUSED", "{}", a.raw);

    // The server gets an address in that subnet: it is allowed from then on.
    ip(&["-n", server, "addr", "add", "10.98.0.1/24", "dev", "eth0"]).unwrap();
    let started = Instant::now();
    await_that("the new subnet is allowed", || {
        dig_from(client, Some("10.98.0.2"), &ip0, &["later.up.test"]).status == "NOERROR"
    });
    eprintln!("new interface subnet allowed after {:?}", started.elapsed());
    await_that("the upstream logs later.up.test", || {
        up.saw("later.up.test")
    });
    assert!(!up.saw("other-subnet.up.test"));
    drop(s);
    drop(up);
    drop(ns);
}

#[test]
fn over_the_rate_limit_udp_replies_are_truncated_and_tcp_still_answers() {
    let Some(ns) = Netns::required(2) else {
        return;
    };
    let (server, client) = (&ns.nodes[0], &ns.nodes[1]);
    let up = Upstream::start(server);
    let ip0 = Netns::addr(0).to_string();
    let s = serve_in(
        server,
        "0.0.0.0",
        &["--dns-rate-limit", "1", "--dns-rate-limit-slip", "1"],
    );
    // Ten queries in one dig: at one reply per second, most are over the limit
    // and get an empty truncated reply (dig +ignore keeps it instead of retrying).
    let mut args = vec!["+ignore".to_owned()];
    args.extend((0..10).map(|i| format!("n{i}.up.test")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = in_ns(client, "dig")
        .arg(format!("@{ip0}"))
        .args(["+tries=1", "+time=2", "+nocookie"])
        .args(&args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let truncated = text.matches("flags: qr tc rd ra;").count();
    let answered = text.matches("ANSWER: 1,").count();
    assert!(truncated >= 5, "{truncated} truncated:\n{text}");
    assert_eq!(truncated + answered, 10, "{text}");
    assert!(
        !text.contains("tc rd ra; QUERY: 1, ANSWER: 1"),
        "a truncated reply carried records:\n{text}"
    );
    // Without +ignore dig retries a truncated reply over TCP, never limited.
    for i in 0..3 {
        let a = dig_from(client, None, &ip0, &[&format!("viatcp{i}.up.test")]);
        assert_eq!(a.data("A"), ["192.0.2.55"], "{}", a.raw);
    }
    assert!(metric_in(server, "dwara_dns_rate_limited_total{action=\"slipped\"}") >= 5.0);
    // Loopback is never limited (the server listens on the wildcard address).
    for i in 0..20 {
        let a = dig_from(
            server,
            None,
            "127.0.0.1",
            &["+ignore", &format!("lo{i}.up.test")],
        );
        assert!(!a.has_flag("tc"), "{}", a.raw);
        assert_eq!(a.data("A"), ["192.0.2.55"], "{}", a.raw);
    }
    drop(s);
    drop(up);
    drop(ns);
}

/// A token file with mode 600 in `dir`.
fn token_file(dir: &Path, token: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

const TOKEN: &str = "s3cr3t-token-0123456789abcdef";

fn names(s: &Serve) -> String {
    test_support::http::request(s.http, "GET", "/name", None).1
}

#[test]
fn writes_without_the_token_get_401_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(dir.path(), TOKEN);
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--fallback",
        "127.0.0.1:9",
        "--http-token-file",
        file.to_str().unwrap(),
    ]);
    let url = |path: &str| format!("http://{}{path}", s.http);
    let bearer = format!("Authorization: Bearer {TOKEN}");

    let (status, text) = put_web(None, &[], &url("/name/c1/10.32.0.1"));
    assert_eq!(status, 401, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("www-authenticate: bearer realm=\"dwara\""),
        "{text}"
    );
    assert_eq!(names(&s), "[]");
    let (status, text) = put_web(
        None,
        &["Authorization: Bearer wrong-token-0123456789"],
        &url("/name/c1/10.32.0.1"),
    );
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("error=\"invalid_token\""), "{text}");
    let (status, text) = put_web(
        None,
        &[&format!("Authorization: Basic {TOKEN}")],
        &url("/name/c1/10.32.0.1"),
    );
    assert_eq!(status, 401, "{text}");
    assert_eq!(names(&s), "[]");
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().status,
        "NXDOMAIN"
    );

    let (status, text) = put_web(None, &[&bearer], &url("/name/c1/10.32.0.1"));
    assert_eq!(status, 204, "{text}");
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().data("A"),
        ["10.32.0.1"]
    );
    // Reads stay open.
    let (status, text) = curl_in(None, &[&url("/name/web.weave.local")]);
    assert_eq!(status, 200, "{text}");
    // DELETE and POST /reload need it too.
    for args in [
        &["-X", "DELETE", &url("/name/c1/10.32.0.1")][..],
        &["-X", "DELETE", &url("/name/c1")],
        &["-X", "POST", &url("/reload")],
    ] {
        let (status, text) = curl_in(None, args);
        assert_eq!(status, 401, "{args:?}: {text}");
    }
    assert_eq!(
        s.dig().query("web.weave.local", "A").unwrap().data("A"),
        ["10.32.0.1"],
        "a refused DELETE removed the record"
    );
    let (status, _) = curl_in(None, &["-X", "DELETE", "-H", &bearer, &url("/name/c1")]);
    assert_eq!(status, 204);
    assert_eq!(
        s.metric("dwara_http_unauthorized_total{reason=\"missing\"}"),
        Some(5.0)
    );
    assert_eq!(
        s.metric("dwara_http_unauthorized_total{reason=\"wrong\"}"),
        Some(1.0)
    );

    // `dwara dns` takes the token from DWARA_TOKEN or --token-file.
    let api = url("");
    let dns = |env: Option<&str>, extra: &[&str]| {
        let mut c = Command::new(BIN);
        c.args([
            "dns",
            "add",
            "c2",
            "10.32.0.2",
            "cli.weave.local",
            "--api",
            &api,
        ])
        .args(extra)
        .env_remove("DWARA_TOKEN");
        if let Some(token) = env {
            c.env("DWARA_TOKEN", token);
        }
        c.output().unwrap()
    };
    let out = dns(None, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401"), "{err}");
    assert_eq!(
        s.dig().query("cli.weave.local", "A").unwrap().status,
        "NXDOMAIN"
    );
    let out = dns(Some(TOKEN), &[]);
    assert!(out.status.success(), "{out:?}");
    let out = dns(Some("x"), &["--token-file", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "--token-file wins over DWARA_TOKEN: {out:?}"
    );
    assert_eq!(
        s.dig().query("cli.weave.local", "A").unwrap().data("A"),
        ["10.32.0.2"]
    );
}

#[test]
fn with_token_reads_every_request_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = token_file(dir.path(), TOKEN);
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--fallback",
        "127.0.0.1:9",
        "--http-token-file",
        file.to_str().unwrap(),
        "--http-token-reads",
    ]);
    for path in ["/name", "/metrics", "/domain"] {
        let (status, text) = curl_in(None, &[&format!("http://{}{path}", s.http)]);
        assert_eq!(status, 401, "{path}: {text}");
        let (status, text) = curl_in(
            None,
            &[
                "-H",
                &format!("Authorization: Bearer {TOKEN}"),
                &format!("http://{}{path}", s.http),
            ],
        );
        assert_eq!(status, 200, "{path}: {text}");
    }
}

/// `dwara serve ARGS` that is expected to exit at once: its output.
fn serve_fails(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(["serve", "--docker", "off", "--dns-listen", "127.0.0.1:0"])
        .args(args)
        .env("DWARA_LOG", "off")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dwara serve {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_public_api_without_a_token_or_a_bad_token_file_refuses_to_start() {
    let out = serve_fails(&["--http-listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("0.0.0.0:0")
            && err.contains("--http-token-file")
            && err.contains("--http-insecure"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let short = dir.path().join("short");
    std::fs::write(&short, "abc\n").unwrap();
    let missing = dir.path().join("missing");
    for (file, want) in [
        (&empty, "is empty"),
        (&short, "shorter than 16"),
        (&missing, "cannot read the HTTP token file"),
    ] {
        let out = serve_fails(&[
            "--http-listen",
            "127.0.0.1:0",
            "--http-token-file",
            file.to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(want) && err.contains(file.to_str().unwrap()),
            "{err}"
        );
    }

    // --http-insecure accepts the risk; a token file is enough on its own.
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "0.0.0.0:0",
        "--fallback",
        "127.0.0.1:9",
        "--http-insecure",
    ]);
    assert!(s.logged("--http-insecure"));
    drop(s);
    let file = token_file(dir.path(), TOKEN);
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "0.0.0.0:0",
        "--fallback",
        "127.0.0.1:9",
        "--http-token-file",
        file.to_str().unwrap(),
    ]);
    drop(s);
}
