//! The cluster across processes and hosts: several `dwara serve` gossiping on
//! 127.0.0.x, and in network namespaces joined by a bridge, driven by dig and the
//! HTTP API. Every condition is awaited with a deadline by polling dig.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use test_support::dig::{DigAnswer, parse};

use crate::nameserver::BIN;

/// How long replication, failure detection and recovery may take in a test
/// (they take well under a second on an idle machine; the margin is for load).
pub(crate) const CONVERGE: Duration = Duration::from_secs(10);

/// How one `dwara serve` of a test cluster is started.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) node_id: String,
    pub(crate) dns: SocketAddr,
    pub(crate) http: SocketAddr,
    pub(crate) gossip: SocketAddr,
    pub(crate) peers: Vec<SocketAddr>,
    /// Extra flags (`--gossip-key-file`, `--data-dir`…).
    pub(crate) extra: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// Run inside this network namespace (`ip netns exec`).
    pub(crate) netns: Option<String>,
}

impl Spec {
    /// A node on `ip` with free DNS and HTTP ports and the given gossip port.
    fn loopback(node_id: &str, ip: Ipv4Addr, gossip_port: u16) -> Self {
        Self {
            node_id: node_id.to_owned(),
            dns: SocketAddr::from((ip, 0)),
            http: SocketAddr::from((ip, 0)),
            gossip: SocketAddr::from((ip, gossip_port)),
            peers: Vec::new(),
            extra: Vec::new(),
            env: Vec::new(),
            netns: None,
        }
    }

    pub(crate) fn key_file(mut self, path: &Path) -> Self {
        self.extra.push("--gossip-key-file".into());
        self.extra.push(path.display().to_string());
        self
    }
}

/// A UDP port free on `ip` right now (for a gossip address peers are told before
/// the node starts).
fn free_udp_port(ip: Ipv4Addr) -> u16 {
    let sock = UdpSocket::bind((ip, 0)).unwrap();
    sock.local_addr().unwrap().port()
}

/// `n` specs on 127.0.0.`first`…, each seeded with every other's gossip address.
fn loopback_cluster(first: u8, ids: &[&str]) -> Vec<Spec> {
    let mut specs: Vec<Spec> = ids
        .iter()
        .zip(first..)
        .map(|(id, last)| {
            let ip = Ipv4Addr::new(127, 0, 0, last);
            Spec::loopback(id, ip, free_udp_port(ip))
        })
        .collect();
    let all: Vec<SocketAddr> = specs.iter().map(|s| s.gossip).collect();
    for s in &mut specs {
        s.peers = all.iter().copied().filter(|a| *a != s.gossip).collect();
    }
    specs
}

/// A running `dwara serve` of a test cluster; killed on drop.
pub(crate) struct Node {
    pub(crate) spec: Spec,
    child: Child,
    dns: SocketAddr,
    http: SocketAddr,
    /// The "name server ready" log line.
    ready_line: String,
}

fn field(line: &str, key: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.parse().ok())
}

/// A command, run inside `netns` when one is given.
pub(crate) fn command_in(netns: Option<&str>, program: &str) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    }
}

impl Node {
    pub(crate) fn start(spec: Spec) -> Self {
        let mut cmd = command_in(spec.netns.as_deref(), BIN);
        cmd.args(["serve", "--docker", "off", "--fallback", "127.0.0.1:9"])
            .args(["--node-id", &spec.node_id])
            .args(["--dns-listen", &spec.dns.to_string()])
            .args(["--http-listen", &spec.http.to_string()])
            .args(["--gossip-listen", &spec.gossip.to_string()]);
        for p in &spec.peers {
            cmd.args(["--peer", &p.to_string()]);
        }
        cmd.args(&spec.extra)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("NO_COLOR", "1")
            .env("DWARA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let tag = spec.node_id.clone();
        // Keeps draining stderr for the life of the process.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{tag}] {line}");
                if line.contains("name server ready") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                panic!("{} did not become ready: {e}", spec.node_id);
            }
        };
        let (Some(dns), Some(http)) = (field(&line, "dns="), field(&line, "http=")) else {
            panic!("no addresses in {line:?}");
        };
        Self {
            spec,
            child,
            dns,
            http,
            ready_line: line,
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.spec.node_id
    }

    /// dig's answer for `name A`, or `None` when the node does not answer
    /// (stopped, or unreachable).
    fn dig(&self, name: &str) -> Option<DigAnswer> {
        self.query(name, "A")
    }

    /// dig's answer for `name rtype`, or `None` when the node does not answer.
    fn query(&self, name: &str, rtype: &str) -> Option<DigAnswer> {
        let out = command_in(self.spec.netns.as_deref(), "dig")
            .arg(format!("@{}", self.dns.ip()))
            .args(["-p", &self.dns.port().to_string()])
            .args(["+tries=1", "+time=1", "+nocookie", name, rtype])
            .output()
            .unwrap();
        parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// The sorted A records of `name` when the node answers NOERROR, empty for
    /// NXDOMAIN, `None` when it does not answer or answers otherwise.
    pub(crate) fn addrs(&self, name: &str) -> Option<Vec<String>> {
        let a = self.dig(name)?;
        match a.status.as_str() {
            "NOERROR" => Some(a.data("A")),
            "NXDOMAIN" => Some(Vec::new()),
            _ => None,
        }
    }

    /// The SRV records and additional addresses of `name` (sorted), when the node
    /// answers NOERROR; empty for NXDOMAIN.
    pub(crate) fn srv(&self, name: &str) -> Option<(Vec<String>, Vec<String>)> {
        let out = command_in(self.spec.netns.as_deref(), "dig")
            .arg(format!("@{}", self.dns.ip()))
            .args(["-p", &self.dns.port().to_string()])
            .args(["+tries=1", "+time=1", "+nocookie", name, "SRV"])
            .output()
            .unwrap();
        let a = parse(&String::from_utf8_lossy(&out.stdout))?;
        match a.status.as_str() {
            "NOERROR" => {
                let mut extra: Vec<String> = a.additional.iter().map(|r| r.data.clone()).collect();
                extra.sort();
                Some((a.data("SRV"), extra))
            }
            "NXDOMAIN" => Some((Vec::new(), Vec::new())),
            _ => None,
        }
    }

    /// One HTTP request to the node's API: (status, body).
    pub(crate) fn http(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        if self.spec.netns.is_none() {
            return test_support::http::request(self.http, method, path, body);
        }
        let out = command_in(self.spec.netns.as_deref(), "curl")
            .args(["-s", "-m", "10", "-X", method, "-w", "\n%{http_code}"])
            .args(["-d", body.unwrap_or_default()])
            .arg(format!("http://{}{path}", self.http))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    /// Registers `id ip fqdn` on this node.
    pub(crate) fn add(&self, id: &str, ip: &str, fqdn: &str) {
        let (status, body) = self.http(
            "PUT",
            &format!("/name/{id}/{ip}"),
            Some(&format!("fqdn={fqdn}")),
        );
        assert_eq!(status, 204, "{}: PUT {id} {ip} {fqdn}: {body}", self.id());
    }

    /// The value of the first `/metrics` sample whose line starts with `prefix`.
    fn metric(&self, prefix: &str) -> f64 {
        let (status, text) = self.http("GET", "/metrics", None);
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// `GET /peers`, as (node id, state, entries) of the other nodes.
    pub(crate) fn peers(&self) -> Vec<(String, String, u64)> {
        let (status, body) = self.http("GET", "/peers", None);
        assert_eq!(status, 200, "{body}");
        let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        let mut out: Vec<(String, String, u64)> = rows
            .iter()
            .filter(|r| r["local"] == false)
            .map(|r| {
                (
                    r["node_id"].as_str().unwrap_or_default().to_owned(),
                    r["state"].as_str().unwrap_or_default().to_owned(),
                    r["entries"].as_u64().unwrap_or(u64::MAX),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// The generation `GET /peers` gives for `node_id` (`local` for this node).
    fn generation_of(&self, node_id: &str) -> Option<u64> {
        let (status, body) = self.http("GET", "/peers", None);
        assert_eq!(status, 200, "{body}");
        let rows: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        rows.iter()
            .filter(|r| r["node_id"] == node_id)
            .filter_map(|r| r["generation"].as_u64())
            .max()
    }

    fn signal(&self, sig: &str) {
        test_support::signal(self.child.id(), sig).unwrap();
    }

    /// SIGKILLs the process; its spec, to start it again.
    fn kill(mut self) -> Spec {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.spec.clone()
    }

    /// SIGKILLs the process and starts the same spec with `extra` flags instead.
    fn kill_and_restart(self, extra: Vec<String>) -> Self {
        let mut spec = self.kill();
        spec.extra = extra;
        Node::start(spec)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it holds; fails the test naming `what` after `timeout`.
/// Returns how long it took.
pub(crate) fn await_that(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        if check() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < timeout,
            "not within {timeout:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Awaits every node in `nodes` answering `name` with exactly `want` (empty: NXDOMAIN).
pub(crate) fn await_answer(nodes: &[&Node], name: &str, want: &[&str]) -> Duration {
    let started = Instant::now();
    for n in nodes {
        await_that(
            &format!("{} answers {name} with {want:?}", n.id()),
            CONVERGE,
            || n.addrs(name).is_some_and(|got| got == want),
        );
    }
    started.elapsed()
}

fn peer(id: &str, state: &str, entries: u64) -> (String, String, u64) {
    (id.to_owned(), state.to_owned(), entries)
}

pub(crate) fn keygen(dir: &Path, name: &str) -> PathBuf {
    let out = Command::new(BIN).arg("keygen").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let path = dir.join(name);
    std::fs::write(&path, &out.stdout).unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(&path, perms).unwrap();
    path
}

#[test]
fn three_processes_replicate_fail_over_restart_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "cluster.key");
    let data_dir = dir.path().join("n3-data");
    let mut specs: Vec<Spec> = loopback_cluster(11, &["n1", "n2", "n3"])
        .into_iter()
        .map(|s| s.key_file(&key))
        .collect();
    let durable = {
        let mut extra = specs[2].extra.clone();
        extra.push("--data-dir".into());
        extra.push(data_dir.display().to_string());
        extra
    };
    let keyed = specs[2].extra.clone();
    specs[2].extra = durable.clone();
    let mut it = specs.into_iter().map(Node::start);
    let (n1, n2, mut n3) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());

    // Registered on one, answered by all.
    n1.add("c1", "10.32.1.1", "web1.weave.local");
    n2.add("c2", "10.32.2.1", "web2.weave.local");
    n3.add("c3", "10.32.3.1", "web3.weave.local");
    let took = await_answer(&[&n1, &n2, &n3], "web1.weave.local", &["10.32.1.1"]);
    eprintln!("web1 on every node after {took:?}");
    await_answer(&[&n1, &n2, &n3], "web2.weave.local", &["10.32.2.1"]);
    await_answer(&[&n1, &n2, &n3], "web3.weave.local", &["10.32.3.1"]);
    await_that(
        "n1 lists n2 and n3 live with one entry each",
        CONVERGE,
        || n1.peers() == [peer("n2", "live", 1), peer("n3", "live", 1)],
    );

    // A node deletes only what it owns: 409 naming the owner, nothing removed.
    let (status, body) = n2.http("DELETE", "/name/c1", None);
    assert_eq!(status, 409, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["owners"], serde_json::json!(["n1"]), "{body}");
    let (status, body) = n2.http("DELETE", "/name/c1/10.32.1.1", None);
    assert_eq!(status, 409, "{body}");
    assert_eq!(n2.addrs("web1.weave.local").unwrap(), ["10.32.1.1"]);
    // Matching nothing anywhere stays idempotent.
    assert_eq!(n2.http("DELETE", "/name/nobody", None).0, 204);

    // A frozen node's names vanish from the others and come back when it thaws.
    n2.signal("STOP");
    let vanished = await_answer(&[&n1, &n3], "web2.weave.local", &[]);
    assert_eq!(n1.addrs("web1.weave.local").unwrap(), ["10.32.1.1"]);
    assert_eq!(n3.addrs("web1.weave.local").unwrap(), ["10.32.1.1"]);
    n2.signal("CONT");
    let returned = await_answer(&[&n1, &n3], "web2.weave.local", &["10.32.2.1"]);
    eprintln!("SIGSTOP: web2 gone after {vanished:?}; SIGCONT: back after {returned:?}");
    await_answer(&[&n2], "web3.weave.local", &["10.32.3.1"]);

    // SIGKILL n3 and restart it at once without its data dir: a new incarnation
    // with no entries. The old one's web3 must not be left behind anywhere.
    n3 = n3.kill_and_restart(keyed);
    n3.add("c3b", "10.32.3.2", "web3b.weave.local");
    await_answer(&[&n1, &n2, &n3], "web3b.weave.local", &["10.32.3.2"]);
    await_answer(&[&n1, &n2, &n3], "web3.weave.local", &[]);
    // It caught up with the others.
    await_answer(&[&n3], "web1.weave.local", &["10.32.1.1"]);
    await_answer(&[&n3], "web2.weave.local", &["10.32.2.1"]);

    // Again, now on its data dir: what it still owns (c3) is published again by
    // the new incarnation, and the previous one's c3b is gone.
    n3 = n3.kill_and_restart(durable);
    await_answer(&[&n1, &n2, &n3], "web3.weave.local", &["10.32.3.1"]);
    await_answer(&[&n1, &n2, &n3], "web3b.weave.local", &[]);
    await_answer(&[&n3], "web2.weave.local", &["10.32.2.1"]);
    await_that("n1 sees one n3, live, with one entry", CONVERGE, || {
        let rows: Vec<_> = n1.peers().into_iter().filter(|p| p.0 == "n3").collect();
        rows == [peer("n3", "live", 1)]
    });
    // On its data dir the generation counts the starts (this is the second), so
    // the new incarnation outranks the old one without a clock.
    assert_eq!(n3.generation_of("n3"), Some(2));
    assert_eq!(n1.generation_of("n3"), Some(2));

    // SIGKILL on its data dir and no restart yet: its names go from the others
    // (failure detection)…
    let spec = n3.kill();
    let gone = await_answer(&[&n1, &n2], "web3.weave.local", &[]);
    assert_eq!(n1.addrs("web2.weave.local").unwrap(), ["10.32.2.1"]);
    // …and come back when it restarts from its store, as a newer incarnation.
    n3 = Node::start(spec);
    let back = await_answer(&[&n1, &n2, &n3], "web3.weave.local", &["10.32.3.1"]);
    await_answer(&[&n1, &n2, &n3], "web3b.weave.local", &[]);
    assert_eq!(n1.generation_of("n3"), Some(3));
    eprintln!("SIGKILL with --data-dir: web3 gone after {gone:?}, back {back:?} after the restart");

    // Deleted on the owner: NXDOMAIN everywhere.
    assert_eq!(n1.http("DELETE", "/name/c1", None).0, 204);
    await_answer(&[&n1, &n2, &n3], "web1.weave.local", &[]);
    assert_eq!(n2.addrs("web2.weave.local").unwrap(), ["10.32.2.1"]);
}

/// Awaits every node answering SRV for `name` with one record per `(port, ip)`
/// instance, each targeting its own name, and the `extra` addresses.
fn await_srv(nodes: &[&Node], name: &str, srv: &[(u16, &str)], extra: &[&str]) -> Duration {
    let mut want: Vec<String> = srv
        .iter()
        .map(|(port, ip)| {
            let target = test_support::dig::srv_target(ip.parse().unwrap(), "weave.local");
            format!("0 1 {port} {target}")
        })
        .collect();
    want.sort();
    let started = Instant::now();
    for n in nodes {
        let mut last = None;
        let waited = Instant::now();
        while last.as_ref().is_none_or(|(s, e)| *s != want || e != extra) {
            assert!(
                waited.elapsed() < CONVERGE,
                "not within {CONVERGE:?}: {} answers SRV {name} with {want:?} {extra:?}; \
                 its last answer: {last:?}",
                n.id()
            );
            if last.is_some() {
                std::thread::sleep(Duration::from_millis(20));
            }
            last = n.srv(name);
        }
    }
    started.elapsed()
}

/// Awaits `n` seeing every other node of a cluster of `size` live.
fn await_peers_live(n: &Node, size: usize) {
    await_that(
        &format!("{} sees its {} peers live", n.id(), size - 1),
        CONVERGE,
        || n.peers().iter().filter(|p| p.1 == "live").count() == size - 1,
    );
}

#[test]
fn srv_records_with_ports_are_answered_by_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "cluster.key");
    let mut specs: Vec<Spec> = loopback_cluster(41, &["s1", "s2", "s3"])
        .into_iter()
        .map(|s| s.key_file(&key))
        .collect();
    specs[2].extra.push("--data-dir".into());
    specs[2]
        .extra
        .push(dir.path().join("s3-data").display().to_string());
    // s1 pushes each change to one peer only; the other gets it by gossip.
    specs[0].extra.push("--gossip-push-fanout".into());
    specs[0].extra.push("1".into());
    let mut it = specs.into_iter().map(Node::start);
    let (s1, s2, mut s3) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let put = |n: &Node, id: &str, ip: &str, form: &str| {
        let (status, body) = n.http("PUT", &format!("/name/{id}/{ip}"), Some(form));
        assert_eq!(status, 204, "{}: {body}", n.id());
    };
    put(
        &s1,
        "c1",
        "10.33.0.1",
        "fqdn=api.weave.local&port=8080&service=_http._tcp",
    );
    put(
        &s2,
        "c2",
        "10.33.0.2",
        "fqdn=api.weave.local&port=8080&service=_http._tcp",
    );
    put(
        &s3,
        "c3",
        "fd00::33:3",
        "fqdn=api.weave.local&port=8080&service=_http._tcp",
    );
    put(
        &s3,
        "c4",
        "10.33.0.4",
        "fqdn=dns.weave.local&port=53&service=_dns._udp",
    );
    let all = [&s1, &s2, &s3];
    let took = await_srv(
        &all,
        "_http._tcp.api.weave.local",
        &[
            (8080, "10.33.0.1"),
            (8080, "10.33.0.2"),
            (8080, "fd00::33:3"),
        ],
        &["10.33.0.1", "10.33.0.2", "fd00::33:3"],
    );
    eprintln!("SRV with three nodes' entries on every node after {took:?}");
    // Every node answers every instance's target name with its address.
    let target = test_support::dig::srv_target("fd00::33:3".parse().unwrap(), "weave.local");
    for n in all {
        let a = n.query(&target, "AAAA").unwrap();
        assert_eq!(a.data("AAAA"), ["fd00::33:3"], "{}: {}", n.id(), a.raw);
    }
    await_srv(
        &all,
        "_dns._udp.dns.weave.local",
        &[(53, "10.33.0.4")],
        &["10.33.0.4"],
    );
    // The pushes a change makes go to live peers only: each count below is taken
    // with the pushing node seeing both of its peers live.
    let pushes = |n: &Node| n.metric("dwara_cluster_pushes_total");
    await_peers_live(&s1, 3);
    let s1_pushes = pushes(&s1);
    // A new port replaces the old one everywhere, though s1 pushes each change to
    // one peer only (--gossip-push-fanout 1): the other gets it by gossip.
    put(
        &s1,
        "c1",
        "10.33.0.1",
        "fqdn=api.weave.local&port=9090&service=_http._tcp",
    );
    await_srv(
        &all,
        "_http._tcp.api.weave.local",
        &[
            (9090, "10.33.0.1"),
            (8080, "10.33.0.2"),
            (8080, "fd00::33:3"),
        ],
        &["10.33.0.1", "10.33.0.2", "fd00::33:3"],
    );
    assert_eq!(pushes(&s1) - s1_pushes, 1.0, "s1 pushes to one peer");
    // s2 keeps the default (16): a change of its own goes to both peers.
    await_peers_live(&s2, 3);
    let s2_pushes = pushes(&s2);
    put(
        &s2,
        "c5",
        "10.33.0.5",
        "fqdn=api.weave.local&port=8080&service=_http._tcp",
    );
    await_srv(
        &all,
        "_http._tcp.api.weave.local",
        &[
            (9090, "10.33.0.1"),
            (8080, "10.33.0.2"),
            (8080, "10.33.0.5"),
            (8080, "fd00::33:3"),
        ],
        &["10.33.0.1", "10.33.0.2", "10.33.0.5", "fd00::33:3"],
    );
    assert_eq!(pushes(&s2) - s2_pushes, 2.0, "s2 pushes to both peers");
    assert_eq!(s2.http("DELETE", "/name/c5", None).0, 204);
    await_srv(
        &all,
        "_http._tcp.api.weave.local",
        &[
            (9090, "10.33.0.1"),
            (8080, "10.33.0.2"),
            (8080, "fd00::33:3"),
        ],
        &["10.33.0.1", "10.33.0.2", "fd00::33:3"],
    );
    // The node with a data dir restarts from its store: its services come back.
    let spec = s3.kill();
    await_srv(&[&s1, &s2], "_dns._udp.dns.weave.local", &[], &[]);
    s3 = Node::start(spec);
    let all = [&s1, &s2, &s3];
    await_srv(
        &all,
        "_dns._udp.dns.weave.local",
        &[(53, "10.33.0.4")],
        &["10.33.0.4"],
    );
    await_srv(
        &all,
        "_http._tcp.api.weave.local",
        &[
            (9090, "10.33.0.1"),
            (8080, "10.33.0.2"),
            (8080, "fd00::33:3"),
        ],
        &["10.33.0.1", "10.33.0.2", "fd00::33:3"],
    );
    // Deleted on its owner: gone everywhere, the rest stays.
    assert_eq!(s2.http("DELETE", "/name/c2", None).0, 204);
    await_srv(
        &all,
        "_http._tcp.api.weave.local",
        &[(9090, "10.33.0.1"), (8080, "fd00::33:3")],
        &["10.33.0.1", "fd00::33:3"],
    );
}

#[test]
fn nodes_without_the_key_are_not_heard() {
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "cluster.key");
    let wrong = keygen(dir.path(), "wrong.key");
    // Every node is seeded with every other: the keyed ones gossip at the outsiders
    // and the outsiders at them.
    let mut specs = loopback_cluster(21, &["k1", "k2", "wrong", "open"]);
    specs[0] = specs[0].clone().key_file(&key);
    specs[1] = specs[1].clone().key_file(&key);
    specs[2] = specs[2].clone().key_file(&wrong);
    let mut it = specs.into_iter().map(Node::start);
    let (k1, k2, w, o) = (
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
    );

    w.add("evil1", "10.66.0.1", "evil1.weave.local");
    o.add("evil2", "10.66.0.2", "evil2.weave.local");
    k1.add("good", "10.32.0.7", "good.weave.local");
    // The names are really registered on their nodes.
    await_answer(&[&w], "evil1.weave.local", &["10.66.0.1"]);
    await_answer(&[&o], "evil2.weave.local", &["10.66.0.2"]);
    await_answer(&[&k2], "good.weave.local", &["10.32.0.7"]);

    for k in [&k1, &k2] {
        // Both outsiders' datagrams reach the keyed nodes, and are dropped and counted…
        await_that(
            &format!("{} rejects the wrong key's datagrams", k.id()),
            CONVERGE,
            || k.metric("dwara_cluster_rejected_datagrams_total{reason=\"bad_seal\"}") >= 3.0,
        );
        await_that(
            &format!("{} rejects the open node's datagrams", k.id()),
            CONVERGE,
            || k.metric("dwara_cluster_rejected_datagrams_total{reason=\"malformed\"}") >= 3.0,
        );
        // …so the outsiders are not members and their names are never answered.
        assert_eq!(k.addrs("evil1.weave.local").unwrap(), Vec::<String>::new());
        assert_eq!(k.addrs("evil2.weave.local").unwrap(), Vec::<String>::new());
        assert_eq!(k.addrs("good.weave.local").unwrap(), ["10.32.0.7"]);
        assert_eq!(
            k.metric("dwara_cluster_rejected_datagrams_total{reason=\"replay\"}"),
            0.0
        );
    }
    assert_eq!(k1.peers(), [peer("k2", "live", 0)]);
    assert_eq!(k2.peers(), [peer("k1", "live", 1)]);
    // The outsiders hear nothing of the keyed nodes: the wrong key opens none of their
    // datagrams, and to the open node they are not chitchat messages.
    await_that(
        "the wrong key rejects the keyed nodes' datagrams",
        CONVERGE,
        || w.metric("dwara_cluster_rejected_datagrams_total{reason=\"bad_seal\"}") >= 3.0,
    );
    await_that(
        "the open node drops the keyed nodes' datagrams",
        CONVERGE,
        || o.metric("dwara_cluster_invalid_datagrams_total") >= 3.0,
    );
    assert_eq!(w.metric("dwara_cluster_opened_datagrams_total"), 0.0);
    for outsider in [&w, &o] {
        let peers = outsider.peers();
        assert!(
            peers.iter().all(|p| p.0 != "k1" && p.0 != "k2"),
            "{}: {peers:?}",
            outsider.id()
        );
        assert_eq!(
            outsider.addrs("good.weave.local").unwrap(),
            Vec::<String>::new()
        );
    }
}

/// Seconds since the epoch of a log line's leading RFC 3339 timestamp (GNU date
/// parses it; no date crate needed).
fn log_time(line: &str) -> f64 {
    let stamp = line.split_whitespace().next().unwrap();
    let out = Command::new("date")
        .args(["-u", "-d", stamp, "+%s.%N"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[test]
fn a_node_with_its_wall_clock_hours_off_converges() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} missing: apt-get install -y faketime (cargo xtask tools)"
    );
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "cluster.key");
    let mut specs: Vec<Spec> = loopback_cluster(31, &["t1", "t2", "skewed"])
        .into_iter()
        .map(|s| s.key_file(&key))
        .collect();
    specs[2].env = vec![
        ("LD_PRELOAD".into(), LIBFAKETIME.into()),
        ("FAKETIME".into(), "+3h".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    let mut it = specs.into_iter().map(Node::start);
    let (t1, t2, s) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    // The skewed node really lives three hours ahead (its log's timestamps).
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let skew = log_time(&s.ready_line) - now;
    assert!((skew - 3.0 * 3600.0).abs() < 600.0, "skew {skew} s");
    assert!((log_time(&t1.ready_line) - now).abs() < 600.0);

    // Both ways.
    s.add("cs", "10.32.9.1", "skewed.weave.local");
    t1.add("c1", "10.32.9.2", "plain.weave.local");
    await_answer(&[&t1, &t2, &s], "skewed.weave.local", &["10.32.9.1"]);
    await_answer(&[&t1, &t2, &s], "plain.weave.local", &["10.32.9.2"]);
    // Failure detection and deletes do not care either.
    s.signal("STOP");
    await_answer(&[&t1, &t2], "skewed.weave.local", &[]);
    s.signal("CONT");
    await_answer(&[&t1, &t2], "skewed.weave.local", &["10.32.9.1"]);
    assert_eq!(s.http("DELETE", "/name/cs", None).0, 204);
    assert_eq!(t1.http("DELETE", "/name/c1", None).0, 204);
    await_answer(&[&t1, &t2, &s], "skewed.weave.local", &[]);
    await_answer(&[&t1, &t2, &s], "plain.weave.local", &[]);
}

/// Network namespaces of one test: a hub holding a bridge and one namespace per
/// node, each joined to the bridge by a veth pair. Deleted on drop (declare it
/// before the nodes so they are killed first).
pub(crate) struct Netns {
    hub: String,
    pub(crate) nodes: Vec<String>,
}

pub(crate) fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// `count` namespaces on a bridge, or `None` (after one `SKIP` line) when this
    /// user may not create namespaces; with `DWARA_REQUIRE_ALL=1` that fails the
    /// test instead (see `test_support::require`).
    pub(crate) fn required(count: usize) -> Option<Self> {
        let ns = Self::create(count)
            .unwrap()
            .ok_or("`ip netns add` is not permitted for this user");
        test_support::require_ok("network namespaces", ns)
    }

    /// `Ok(None)` when this user may not create namespaces.
    pub(crate) fn create(count: usize) -> Result<Option<Self>, String> {
        Self::remove_stale();
        // Tests of one binary run in parallel: each set gets its own sequence number
        // after the pid (which `remove_stale` reads).
        static SETS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let set = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("dwc{}-{set}", std::process::id());
        let hub = format!("{tag}-hub");
        if let Err(e) = ip(&["netns", "add", &hub]) {
            if e.contains("Permission denied") || e.contains("not permitted") {
                return Ok(None);
            }
            return Err(e);
        }
        // From here on, whatever fails is cleaned up by the guard.
        let mut ns = Self {
            hub,
            nodes: Vec::new(),
        };
        ip(&["-n", &ns.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &ns.hub, "link", "set", "br0", "up"])?;
        for i in 0..count {
            let name = format!("{tag}-{i}");
            ip(&["netns", "add", &name])?;
            ns.nodes.push(name.clone());
            let port = format!("v{i}");
            ip(&[
                "-n", &ns.hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &name,
            ])?;
            ip(&["-n", &ns.hub, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &ns.hub, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{}/24", Self::addr(i)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &name, "link", "set", "eth0", "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
        }
        Ok(Some(ns))
    }

    /// Namespaces (and their processes) left by a test binary that was killed
    /// before its guards ran: `dwc<pid>-<set>-…` whose pid is gone.
    fn remove_stale() {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            let Some(pid) = name
                .strip_prefix("dwc")
                .and_then(|rest| rest.split('-').next())
            else {
                continue;
            };
            if pid.is_empty() || Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            if let Ok(pids) = Command::new("ip").args(["netns", "pids", name]).output() {
                for p in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", p]).status();
                }
            }
            eprintln!("removing stale network namespace {name}");
            let _ = ip(&["netns", "del", name]);
        }
    }

    pub(crate) fn addr(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, 0, u8::try_from(i + 1).unwrap())
    }

    /// Takes node `i`'s bridge port down or up (its cable pulled or plugged).
    pub(crate) fn set_link(&self, i: usize, state: &str) {
        ip(&["-n", &self.hub, "link", "set", &format!("v{i}"), state]).unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for name in self.nodes.iter().chain([&self.hub]) {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

#[test]
fn hosts_on_a_bridge_partition_and_heal() {
    let Some(ns) = Netns::required(3) else {
        return;
    };
    let gossip = |i| SocketAddr::from((Netns::addr(i), 7946));
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            Node::start(Spec {
                node_id: format!("host{i}"),
                dns: SocketAddr::from((Netns::addr(i), 53)),
                http: SocketAddr::from((Netns::addr(i), 6784)),
                gossip: gossip(i),
                peers: (0..3).filter(|j| *j != i).map(gossip).collect(),
                // The API is on the bridge address, reached by the test without a token.
                extra: vec!["--http-insecure".into()],
                env: Vec::new(),
                netns: Some(ns.nodes[i].clone()),
            })
        })
        .collect();
    let all: Vec<&Node> = nodes.iter().collect();
    for (i, n) in nodes.iter().enumerate() {
        n.add(
            &format!("c{i}"),
            &format!("10.32.7.{i}"),
            &format!("h{i}.weave.local"),
        );
    }
    for i in 0..3 {
        await_answer(
            &all,
            &format!("h{i}.weave.local"),
            &[&format!("10.32.7.{i}")],
        );
    }

    // host1's cable is pulled: its name vanishes on the others, and theirs on it.
    ns.set_link(1, "down");
    let vanished = await_answer(&[&nodes[0], &nodes[2]], "h1.weave.local", &[]);
    await_answer(&[&nodes[1]], "h0.weave.local", &[]);
    assert_eq!(nodes[0].addrs("h2.weave.local").unwrap(), ["10.32.7.2"]);
    // Plugged back in: everything returns everywhere.
    ns.set_link(1, "up");
    let returned = await_answer(&[&nodes[0], &nodes[2]], "h1.weave.local", &["10.32.7.1"]);
    await_answer(&[&nodes[1]], "h0.weave.local", &["10.32.7.0"]);
    await_answer(&[&nodes[1]], "h2.weave.local", &["10.32.7.2"]);
    eprintln!("link down: h1 gone after {vanished:?}; link up: back after {returned:?}");

    // A change made while partitioned reaches the others after the heal.
    ns.set_link(1, "down");
    await_answer(&[&nodes[0]], "h1.weave.local", &[]);
    nodes[1].add("c1b", "10.32.7.11", "h1b.weave.local");
    ns.set_link(1, "up");
    await_answer(&[&nodes[0], &nodes[2]], "h1b.weave.local", &["10.32.7.11"]);
    drop(nodes);
    drop(ns);
}

/// Writes a key file holding `keys` (base64 lines), mode 600, with a comment line.
fn write_keys(path: &Path, keys: &[&str]) {
    let mut text = String::from("# dwara gossip keys: the first seals, all open\n");
    for k in keys {
        text.push_str(k);
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
    let mut perms = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(path, perms).unwrap();
}

/// dig's A records of `name` at `dns`, `None` when there is no NOERROR answer.
fn dig_a(dns: SocketAddr, name: &str) -> Option<Vec<String>> {
    let out = Command::new("dig")
        .arg(format!("@{}", dns.ip()))
        .args(["-p", &dns.port().to_string()])
        .args(["+tries=1", "+time=2", "+nocookie", name, "A"])
        .output()
        .ok()?;
    let a = parse(&String::from_utf8_lossy(&out.stdout))?;
    (a.status == "NOERROR").then(|| a.data("A"))
}

#[test]
fn gossip_keys_rotate_without_downtime() {
    let dir = tempfile::tempdir().unwrap();
    let old = std::fs::read_to_string(keygen(dir.path(), "old.key")).unwrap();
    let new = std::fs::read_to_string(keygen(dir.path(), "new.key")).unwrap();
    let (old, new) = (old.trim(), new.trim());
    // One key file per node, so each step is taken node by node.
    let files: Vec<PathBuf> = (1..=3)
        .map(|i| dir.path().join(format!("n{i}.keys")))
        .collect();
    for f in &files {
        write_keys(f, &[old]);
    }
    let specs = loopback_cluster(31, &["n1", "n2", "n3"]);
    let nodes: Vec<Node> = specs
        .into_iter()
        .zip(&files)
        .map(|(s, f)| Node::start(s.key_file(f)))
        .collect();
    let names = ["r1.weave.local", "r2.weave.local", "r3.weave.local"];
    for (i, (n, name)) in nodes.iter().zip(names).enumerate() {
        n.add(&format!("c{i}"), &format!("10.40.0.{}", i + 1), name);
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    for (i, name) in names.iter().enumerate() {
        await_answer(&refs, name, &[&format!("10.40.0.{}", i + 1)]);
    }

    // Lookups of every name on every node, without a pause (one thread per node),
    // through every step.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lookups: Vec<_> = nodes
        .iter()
        .map(|n| {
            let (stop, at, id) = (stop.clone(), n.dns, n.id().to_owned());
            std::thread::spawn(move || {
                let (mut done, mut failed) = (0u64, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (i, name) in names.iter().enumerate() {
                        let want = vec![format!("10.40.0.{}", i + 1)];
                        let got = dig_a(at, name);
                        if got.as_ref() != Some(&want) {
                            failed.push(format!("{id}: {name} -> {got:?}"));
                        }
                        done += 1;
                    }
                }
                (done, failed)
            })
        })
        .collect();

    let reloads = |n: &Node, result: &str| {
        n.metric(&format!(
            "dwara_cluster_key_reloads_total{{result=\"{result}\"}}"
        ))
    };
    let rejected = |n: &Node| {
        ["malformed", "bad_seal", "replay", "undecodable"]
            .iter()
            .map(|r| {
                n.metric(&format!(
                    "dwara_cluster_rejected_datagrams_total{{reason=\"{r}\"}}"
                ))
            })
            .sum::<f64>()
    };
    // Each node reloads after its file changed: SIGHUP on n1 and n3, POST /reload on n2.
    let step = |keys: &[&str], what: &str| {
        for (i, (n, f)) in nodes.iter().zip(&files).enumerate() {
            let before = reloads(n, "ok");
            write_keys(f, keys);
            if i == 1 {
                let (code, body) = n.http("POST", "/reload", None);
                assert_eq!(code, 200, "{what}: {body}");
                assert!(body.contains("gossip_keys"), "{body}");
            } else {
                n.signal("HUP");
            }
            await_that(
                &format!("{what}: {} reloaded its keys", n.id()),
                CONVERGE,
                || reloads(n, "ok") > before,
            );
            assert_eq!(n.metric("dwara_cluster_gossip_keys"), keys.len() as f64);
            // Between nodes the cluster runs with mixed keyrings: nobody is cut off.
            for m in &nodes {
                let peers = m.peers();
                assert!(
                    peers.len() == 2 && peers.iter().all(|p| p.1 == "live"),
                    "{what}, after {}: {} sees {peers:?}",
                    n.id(),
                    m.id()
                );
                assert_eq!(rejected(m), 0.0, "{what}: {} rejected datagrams", m.id());
            }
        }
    };
    step(&[old, new], "step 1, add the new key everywhere");
    step(&[new, old], "step 2, make it first everywhere");
    // Names registered in the middle travel too.
    nodes[0].add("c9", "10.40.0.9", "mid.weave.local");
    await_answer(&refs, "mid.weave.local", &["10.40.0.9"]);
    step(&[new], "step 3, remove the old key");

    // A file that does not parse keeps the keyring, and says why.
    let before = reloads(&nodes[0], "error");
    std::fs::write(&files[0], "not a key\n").unwrap();
    nodes[0].signal("HUP");
    await_that("the bad file is counted", CONVERGE, || {
        reloads(&nodes[0], "error") > before
    });
    let (code, body) = nodes[0].http("POST", "/reload", None);
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("line 1"), "{body}");
    assert_eq!(nodes[0].metric("dwara_cluster_gossip_keys"), 1.0);
    nodes[0].add("c10", "10.40.0.10", "late.weave.local");
    await_answer(&refs, "late.weave.local", &["10.40.0.10"]);

    // A node with only the old key is not heard any more.
    let mut stale = loopback_cluster(34, &["stale"]).remove(0);
    stale.peers = nodes.iter().map(|n| n.spec.gossip).collect();
    let stale_file = dir.path().join("stale.keys");
    write_keys(&stale_file, &[old]);
    let stale = Node::start(stale.key_file(&stale_file));
    await_that("the old key is rejected", CONVERGE, || {
        nodes
            .iter()
            .all(|n| n.metric("dwara_cluster_rejected_datagrams_total{reason=\"bad_seal\"}") >= 1.0)
    });
    assert!(
        nodes
            .iter()
            .all(|n| n.peers().iter().all(|p| p.0 != "stale"))
    );
    assert!(stale.peers().is_empty(), "{:?}", stale.peers());

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut done, mut failed) = (0, Vec::new());
    for thread in lookups {
        let (d, f) = thread.join().unwrap();
        done += d;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} of {done} lookups failed: {failed:?}",
        failed.len()
    );
    assert!(done >= 9, "only {done} lookups");
    eprintln!("{done} lookups during the rotation, none failed");
}

#[test]
fn a_tcp_check_runs_on_its_owner_and_every_node_answers_its_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "cluster.key");
    let specs: Vec<Spec> = loopback_cluster(61, &["h1", "h2"])
        .into_iter()
        .map(|s| s.key_file(&key))
        .map(|mut s| {
            s.extra.extend(["--check-interval-ms".into(), "100".into()]);
            s
        })
        .collect();
    let mut it = specs.into_iter().map(Node::start);
    let (h1, h2) = (it.next().unwrap(), it.next().unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.63:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (status, body) = h1.http(
        "PUT",
        "/name/c1/127.0.0.63",
        Some(&format!("fqdn=web.weave.local&port={port}&check=tcp")),
    );
    assert_eq!(status, 204, "{body}");
    h1.add("c2", "10.33.0.2", "web.weave.local");
    await_answer(&[&h1, &h2], "web.weave.local", &["10.33.0.2", "127.0.0.63"]);

    // The other node has the verdict, not the check.
    let entry = |n: &Node| {
        let (status, body) = n.http("GET", "/name", None);
        assert_eq!(status, 200, "{body}");
        let entries: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        entries.into_iter().find(|e| e["id"] == "c1").unwrap()
    };
    assert_eq!(entry(&h1)["check"], "tcp");
    assert_eq!(entry(&h2)["health"], "healthy");
    assert!(entry(&h2).get("check").is_none(), "{}", entry(&h2));
    assert_eq!(h2.metric("dwara_health_checks_running "), 0.0);
    assert_eq!(
        h2.metric("dwara_health_checks_total{result=\"pass\"} "),
        0.0
    );
    assert!(h1.metric("dwara_health_checks_total{result=\"pass\"} ") >= 1.0);

    // The port closes: out on every node, the unchecked entry stays.
    drop(listener);
    await_answer(&[&h1, &h2], "web.weave.local", &["10.33.0.2"]);
    assert_eq!(entry(&h2)["health"], "unhealthy");
    assert_eq!(
        h2.metric("dwara_health_checks_total{result=\"fail\"} "),
        0.0
    );
}
