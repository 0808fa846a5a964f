//! `check=tcp` on HTTP registrations, against real TCP listeners: an entry is
//! answered once a connect succeeds, leaves the answers after two failed ones,
//! comes back when its port listens again; the name fails open (or not) when none
//! passes; `PUT` without the check and `DELETE` stop it. dig asks; the waits follow
//! the database's change watch, with a deadline.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use dwara_nameserver::HealthFailMode;

use crate::support::TestServer;

const INTERVAL: Duration = Duration::from_millis(100);

fn checked_server(fail: HealthFailMode) -> TestServer {
    TestServer::start_with(|c| {
        c.fallback = dwara_nameserver::Fallback::Servers(Vec::new());
        c.checks.interval = INTERVAL;
        c.db.health_fail = fail;
    })
}

fn put(s: &TestServer, id: &str, ip: &str, form: &str) {
    let (status, body) = s.http("PUT", &format!("/name/{id}/{ip}"), Some(form));
    assert_eq!(status, 204, "PUT {id} {ip} {form}: {body}");
}

/// The A answers for `name`, sorted.
fn a(s: &TestServer, name: &str) -> Vec<String> {
    let mut v = s.dig().query(name, "A").unwrap().data("A");
    v.sort();
    v
}

/// Waits until `check` holds, looking again after every change of the database
/// (a verdict is one), for at most 10 s.
fn wait(s: &TestServer, what: &str, mut check: impl FnMut() -> bool) {
    let mut changes = s.db().watch();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        changes.borrow_and_update();
        if check() {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for {what}");
        let _ = s.block_on(async { tokio::time::timeout(left, changes.changed()).await });
    }
}

fn wait_a(s: &TestServer, name: &str, want: &[&str]) {
    wait(s, &format!("{name} A = {want:?}"), || a(s, name) == want);
}

/// `GET /name`: the live entries as JSON.
fn entries(s: &TestServer) -> Vec<serde_json::Value> {
    let (status, body) = s.http("GET", "/name", None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The (health, check) `GET /name` shows for the entry of `id`.
fn state_of(s: &TestServer, id: &str) -> (Option<String>, Option<String>) {
    let e = entries(s)
        .into_iter()
        .find(|e| e["id"] == id)
        .unwrap_or_else(|| panic!("no entry {id}"));
    let text = |k: &str| e.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    (text("health"), text("check"))
}

fn metric(s: &TestServer, line_start: &str) -> f64 {
    let (_, text) = s.http("GET", "/metrics", None);
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in\n{text}"))
}

fn listen(addr: &str) -> TcpListener {
    TcpListener::bind(addr).unwrap()
}

/// A port on `ip` nothing listens on (bound, then closed).
fn closed_port(ip: &str) -> SocketAddr {
    listen(&format!("{ip}:0")).local_addr().unwrap()
}

#[test]
fn a_tcp_check_follows_its_port_and_the_name_fails_open_when_none_passes() {
    let s = checked_server(HealthFailMode::Open);
    let one = listen("127.0.0.1:0");
    let one_addr = one.local_addr().unwrap();
    let two = listen("127.0.0.2:0");
    let two_port = two.local_addr().unwrap().port();

    put(
        &s,
        "c1",
        "127.0.0.1",
        &format!("fqdn=web.weave.local&port={}&check=tcp", one_addr.port()),
    );
    let (health, check) = state_of(&s, "c1");
    assert_eq!(check.as_deref(), Some("tcp"));
    assert!(
        matches!(health.as_deref(), Some("starting" | "healthy")),
        "{health:?}"
    );
    wait_a(&s, "web.weave.local", &["127.0.0.1"]);
    assert_eq!(state_of(&s, "c1").0.as_deref(), Some("healthy"));
    // The SRV answer follows the same verdict.
    let srv = s
        .dig()
        .query(&format!("_{}._tcp.web.weave.local", one_addr.port()), "SRV")
        .unwrap();
    assert_eq!(srv.data("SRV").len(), 1, "{}", srv.raw);

    put(
        &s,
        "c2",
        "127.0.0.2",
        &format!("fqdn=web.weave.local&port={two_port}&check=tcp"),
    );
    wait_a(&s, "web.weave.local", &["127.0.0.1", "127.0.0.2"]);
    // One name's entries, with their checks and verdicts.
    let (status, body) = s.http("GET", "/name?fqdn=WEB.weave.local", None);
    assert_eq!(status, 200, "{body}");
    let web: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(web.len(), 2, "{body}");
    assert!(
        web.iter()
            .all(|e| e["check"] == "tcp" && e["health"] == "healthy"),
        "{body}"
    );
    let (_, body) = s.http("GET", "/name?fqdn=other.weave.local", None);
    assert_eq!(body.trim(), "[]");

    // The first port closes: after two failed connects it is out, the second stays.
    drop(one);
    wait_a(&s, "web.weave.local", &["127.0.0.2"]);
    assert_eq!(state_of(&s, "c1").0.as_deref(), Some("unhealthy"));
    assert_eq!(state_of(&s, "c2").0.as_deref(), Some("healthy"));
    assert!(metric(&s, "dwara_health_checks_total{result=\"fail\"} ") >= 2.0);
    assert!(metric(&s, "dwara_health_checks_total{result=\"pass\"} ") >= 2.0);
    assert_eq!(metric(&s, "dwara_health_checks_running "), 2.0);
    assert_eq!(
        metric(&s, "dwara_records_health{health=\"unhealthy\"} "),
        1.0
    );

    // Both closed: no entry passes, so the name fails open and answers both.
    drop(two);
    wait(&s, "c2 unhealthy", || {
        state_of(&s, "c2").0.as_deref() == Some("unhealthy")
    });
    assert_eq!(a(&s, "web.weave.local"), ["127.0.0.1", "127.0.0.2"]);
    assert_eq!(metric(&s, "dwara_records_names_failing_open "), 1.0);

    // The first port listens again: healthy, and alone in the answers.
    let one = listen(&one_addr.to_string());
    wait_a(&s, "web.weave.local", &["127.0.0.1"]);

    // PUT without the check: unchecked, answered, no check shown.
    put(
        &s,
        "c2",
        "127.0.0.2",
        &format!("fqdn=web.weave.local&port={two_port}"),
    );
    assert_eq!(state_of(&s, "c2"), (None, None));
    assert_eq!(a(&s, "web.weave.local"), ["127.0.0.1", "127.0.0.2"]);
    assert_eq!(metric(&s, "dwara_health_checks_running "), 1.0);

    // DELETE stops the check.
    let (status, body) = s.http("DELETE", "/name/c1/127.0.0.1", None);
    assert_eq!(status, 204, "{body}");
    assert_eq!(metric(&s, "dwara_health_checks_running "), 0.0);
    assert_eq!(a(&s, "web.weave.local"), ["127.0.0.2"]);
    drop(one);
}

#[test]
fn with_fail_open_off_a_name_whose_only_entry_fails_is_not_answered() {
    let s = checked_server(HealthFailMode::Closed);
    let open = listen("127.0.0.1:0");
    let port = open.local_addr().unwrap().port();
    put(
        &s,
        "c1",
        "127.0.0.1",
        &format!("fqdn=api.weave.local&port={port}&check=tcp"),
    );
    wait_a(&s, "api.weave.local", &["127.0.0.1"]);
    drop(open);
    wait(&s, "c1 unhealthy", || {
        state_of(&s, "c1").0.as_deref() == Some("unhealthy")
    });
    // Nothing is served under the name: it is answered as if it had no entries.
    let answer = s.dig().query("api.weave.local", "A").unwrap();
    assert_eq!(answer.status, "NXDOMAIN", "{}", answer.raw);
    assert!(answer.data("A").is_empty(), "{}", answer.raw);

    // Fail open (the default), the same: answered although unhealthy.
    let s = checked_server(HealthFailMode::Open);
    let closed = closed_port("127.0.0.1");
    put(
        &s,
        "c1",
        "127.0.0.1",
        &format!("fqdn=api.weave.local&port={}&check=tcp", closed.port()),
    );
    // Starting (no verdict yet) is never answered; unhealthy alone fails open.
    wait_a(&s, "api.weave.local", &["127.0.0.1"]);
    assert_eq!(state_of(&s, "c1").0.as_deref(), Some("unhealthy"));
}

/// A listener on `ip` whose accept queue is full (nothing accepts; std listens
/// with a backlog of 128): the kernel drops every further SYN, so a connect to it
/// gets no answer at all. Returns the connections that fill the queue, to keep.
fn silent_listener(ip: &str) -> (TcpListener, Vec<TcpStream>) {
    let listener = listen(&format!("{ip}:0"));
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(c) => held.push(c),
            Err(e) => {
                // Not refused (that would be `tcp_abort_on_overflow`): no answer.
                assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
                return (listener, held);
            }
        }
        assert!(held.len() < 10_000, "the accept queue never filled");
    }
}

#[test]
fn a_connect_that_gets_no_answer_is_a_miss_and_holds_up_no_other_entry() {
    let s = checked_server(HealthFailMode::Open);
    let (silent, _held) = silent_listener("127.0.0.3");
    let open = listen("127.0.0.4:0");
    for (id, ip, port) in [
        ("c1", "127.0.0.3", silent.local_addr().unwrap().port()),
        ("c2", "127.0.0.4", open.local_addr().unwrap().port()),
    ] {
        put(
            &s,
            id,
            ip,
            &format!("fqdn=web.weave.local&port={port}&check=tcp"),
        );
    }
    // Each connect to the silent port times out (half the interval): after two it
    // is unhealthy, and the other entry is answered alone meanwhile.
    wait(&s, "c1 unhealthy", || {
        state_of(&s, "c1").0.as_deref() == Some("unhealthy")
    });
    wait_a(&s, "web.weave.local", &["127.0.0.4"]);
    assert_eq!(state_of(&s, "c2").0.as_deref(), Some("healthy"));
}

#[test]
fn bad_checks_are_refused_with_a_message() {
    let s = checked_server(HealthFailMode::Open);
    for (form, want) in [
        ("fqdn=a.weave.local&check=tcp", "without a port"),
        (
            "fqdn=a.weave.local&port=80&check=http",
            "unknown check \"http\"",
        ),
        (
            "fqdn=a.weave.local&port=80&check=tcp&service=x",
            "invalid service",
        ),
    ] {
        let (status, body) = s.http("PUT", "/name/c1/127.0.0.1", Some(form));
        assert_eq!(status, 400, "{form}: {body}");
        assert!(body.contains(want), "{form}: {body}");
    }
    assert!(entries(&s).is_empty());
    assert_eq!(metric(&s, "dwara_health_checks_running "), 0.0);
}
