//! The cluster under network faults: five `dwara serve` hosts in network namespaces
//! on one bridge, with lossy and slow links, a split with writes on both sides, a
//! one-way cut and a flapping link. Each scenario awaits its outcome with a deadline
//! and prints how long it took (`faults: …` lines, which `cargo xtask perf cluster
//! --faults` collects from a release build).
//!
//! Loss is iptables' `statistic` match on each host's `eth0` ingress; delay is netem's `delay 50ms 20ms` done in
//! userspace by [`test_support::netem::Delayer`] behind an `NFQUEUE` rule, because
//! netem is not in every kernel (it is not in this machine's), on its egress: every
//! datagram between two hosts passes one of each, as with netem on every host's
//! interface. A cut drops what one host receives from
//! another (iptables, by source); a flapping link is the host's bridge port going
//! down and up.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use test_support::netem::Delayer;

use crate::cluster::{Netns, Node, Spec, await_that, command_in, keygen};

/// How long a scenario's outcome may take on a loaded machine (the targets are 2 s).
const DEADLINE: Duration = Duration::from_secs(30);

/// One live entry as `GET /name` lists it: (fqdn, ip, origin).
type Row = (String, String, String);

/// Five (or `n`) hosts, each in its own namespace on one bridge, all seeded with
/// each other, sharing one cluster key. Field order is drop order: the processes go
/// first, then the delayers, then the namespaces.
struct Hosts {
    nodes: Vec<Node>,
    delayers: Vec<Delayer>,
    ns: Netns,
    _dir: tempfile::TempDir,
}

fn gossip(i: usize) -> SocketAddr {
    SocketAddr::from((Netns::addr(i), 7946))
}

impl Hosts {
    /// `None` when namespaces are not permitted here (the test is skipped).
    fn start(n: usize) -> Option<Self> {
        let ns = Netns::required(n)?;
        let dir = tempfile::tempdir().unwrap();
        let key = keygen(dir.path(), "cluster.key");
        let mut hosts = Hosts {
            nodes: Vec::new(),
            delayers: Vec::new(),
            ns,
            _dir: dir,
        };
        for i in 0..n {
            let spec = hosts.spec(i, &key);
            hosts.nodes.push(Node::start(spec));
        }
        hosts.await_all_live();
        Some(hosts)
    }

    fn spec(&self, i: usize, key: &Path) -> Spec {
        let n = self.ns.nodes.len();
        Spec {
            node_id: format!("f{i}"),
            dns: SocketAddr::from((Netns::addr(i), 53)),
            http: SocketAddr::from((Netns::addr(i), 6784)),
            gossip: gossip(i),
            peers: (0..n).filter(|j| *j != i).map(gossip).collect(),
            // The API is on the bridge address, reached by the test without a token.
            extra: vec!["--http-insecure".into()],
            env: Vec::new(),
            netns: Some(self.ns.nodes[i].clone()),
        }
        .key_file(key)
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Runs `program args` in host `i`'s namespace; fails the test if it fails.
    fn run(&self, i: usize, program: &str, args: &[&str]) {
        let out = command_in(Some(&self.ns.nodes[i]), program)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// Every link `loss_percent` lossy and `delay ± jitter` slow: the loss where a
    /// host receives (a sender never learns of it, as on a wire), the delay where it
    /// sends.
    fn degrade(&mut self, loss_percent: u32, delay: Duration, jitter: Duration) {
        let probability = format!("{:.2}", f64::from(loss_percent) / 100.0);
        for i in 0..self.len() {
            let drop = ["-A", "INPUT", "-i", "eth0", "-m", "statistic", "--mode"];
            let mut drop: Vec<&str> = drop.to_vec();
            drop.extend([
                "random",
                "--probability",
                probability.as_str(),
                "-j",
                "DROP",
            ]);
            self.run(i, "iptables", &drop);
            let queue = [
                "-A",
                "OUTPUT",
                "-o",
                "eth0",
                "-j",
                "NFQUEUE",
                "--queue-num",
                "0",
            ];
            self.run(i, "iptables", &queue);
            let handle = format!("/run/netns/{}", self.ns.nodes[i]);
            let delayer = Delayer::start(Path::new(&handle), 0, delay, jitter)
                .unwrap_or_else(|e| panic!("delayer in {handle}: {e}"));
            self.delayers.push(delayer);
        }
    }

    /// Datagrams from host `from` to host `to` are dropped where `to` receives
    /// them (`to` no longer hears `from`; the other way is untouched).
    fn cut(&self, from: usize, to: usize) {
        let src = Netns::addr(from).to_string();
        self.run(to, "iptables", &["-I", "INPUT", "-s", &src, "-j", "DROP"]);
    }

    fn uncut(&self, from: usize, to: usize) {
        let src = Netns::addr(from).to_string();
        self.run(to, "iptables", &["-D", "INPUT", "-s", &src, "-j", "DROP"]);
    }

    /// Awaits every host listing every other one live.
    fn await_all_live(&self) -> Duration {
        let n = self.len();
        let started = Instant::now();
        for node in &self.nodes {
            await_that(
                &format!("{} lists {} live peers", node.id(), n - 1),
                DEADLINE,
                || {
                    let peers = node.peers();
                    peers.len() == n - 1 && peers.iter().all(|p| p.1 == "live")
                },
            );
        }
        started.elapsed()
    }

    /// Registers every `(id, ip, fqdn)` on host `i` in one curl run (one connection).
    fn register(&self, i: usize, rows: &[(String, String, String)]) -> Child {
        let node = &self.nodes[i];
        let mut cmd = command_in(node.spec.netns.as_deref(), "curl");
        for (n, (id, ip, fqdn)) in rows.iter().enumerate() {
            if n > 0 {
                cmd.arg("--next");
            }
            cmd.args(["-s", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}\n"])
                .args(["-X", "PUT", "-d", &format!("fqdn={fqdn}")])
                .arg(format!("http://{}/name/{id}/{ip}", node.spec.http));
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        cmd.spawn().unwrap()
    }

    /// Deletes `DELETE /name/<id>` on host `i`.
    fn delete(&self, i: usize, id: &str) {
        let (status, body) = self.nodes[i].http("DELETE", &format!("/name/{id}"), None);
        assert_eq!(status, 204, "{}: DELETE {id}: {body}", self.nodes[i].id());
    }

    /// Host `i`'s live entries, hidden ones included (`None` if it did not answer).
    fn rows(&self, i: usize) -> Option<BTreeSet<Row>> {
        let (status, body) = self.nodes[i].http("GET", "/name", None);
        if status != 200 {
            return None;
        }
        let rows: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
        Some(
            rows.iter()
                .map(|r| {
                    let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                    (s("fqdn"), s("ip"), s("origin"))
                })
                .collect(),
        )
    }

    /// Awaits every host holding exactly `want` and listing every other host live
    /// (so it serves all of it). Returns how long it took; on timeout, fails naming
    /// what differs.
    fn await_exactly(&self, what: &str, want: &BTreeSet<Row>) -> Duration {
        let started = Instant::now();
        let mut pending: Vec<usize> = (0..self.len()).collect();
        loop {
            pending.retain(|i| self.rows(*i).as_ref() != Some(want));
            if pending.is_empty() {
                break;
            }
            if started.elapsed() > DEADLINE {
                let i = pending[0];
                let got = self.rows(i).unwrap_or_default();
                panic!(
                    "{what}: {} not exact after {DEADLINE:?}; missing {:?}; extra {:?}",
                    self.nodes[i].id(),
                    want.difference(&got).take(5).collect::<Vec<_>>(),
                    got.difference(want).take(5).collect::<Vec<_>>()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.await_all_live();
        started.elapsed()
    }

    /// Datagrams the loss rules of [`Hosts::degrade`] dropped, over every host.
    fn dropped(&self) -> u64 {
        (0..self.len())
            .map(|i| {
                let out = command_in(Some(&self.ns.nodes[i]), "iptables")
                    .args(["-L", "INPUT", "-n", "-v", "-x"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| l.contains("statistic"))
                    .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    }
}

/// `(id, ip, fqdn)` of registration `k` of host `i` (`round` tells batches apart).
fn entry(i: usize, round: usize, k: usize) -> (String, String, String) {
    (
        format!("c{i}-{round}-{k}"),
        format!("10.{}.{}.{}", 40 + i, round, k + 1),
        format!("h{i}-{round}-{k}.weave.local"),
    )
}

fn row(i: usize, e: &(String, String, String)) -> Row {
    (format!("{}.", e.2), e.1.clone(), format!("f{i}"))
}

/// Waits for a curl run of [`Hosts::register`]; every request must have got 204.
fn await_registered(child: Child, count: usize) {
    let out = child.wait_with_output().unwrap();
    let codes = String::from_utf8_lossy(&out.stdout);
    let ok = codes.lines().filter(|c| *c == "204").count();
    assert_eq!(ok, count, "registration answers: {codes}");
}

#[test]
fn registrations_reach_every_host_over_lossy_slow_links() {
    let Some(mut hosts) = Hosts::start(5) else {
        return;
    };
    // What one check of every host costs here (the resolution of the figures).
    let floor = hosts.await_exactly("nothing registered", &BTreeSet::new());
    hosts.degrade(30, Duration::from_millis(50), Duration::from_millis(20));
    let n = hosts.len();
    let per_host = 100 / n;
    let batches: Vec<Vec<_>> = (0..n)
        .map(|i| (0..per_host).map(|k| entry(i, 0, k)).collect())
        .collect();
    let want: BTreeSet<Row> = batches
        .iter()
        .enumerate()
        .flat_map(|(i, b)| b.iter().map(move |e| row(i, e)))
        .collect();
    let started = Instant::now();
    let runs: Vec<Child> = (0..n).map(|i| hosts.register(i, &batches[i])).collect();
    for run in runs {
        await_registered(run, per_host);
    }
    let acknowledged = started.elapsed();
    hosts.await_exactly("100 registrations over lossy links", &want);
    let everywhere = started.elapsed();
    let delayed: u64 = hosts.delayers.iter().map(Delayer::delayed).sum();
    let overruns: u64 = hosts.delayers.iter().map(Delayer::overruns).sum();
    let dropped = hosts.dropped();
    assert!(delayed > 0, "no packet went through the delayers");
    assert!(dropped > 0, "the loss rules dropped nothing");
    eprintln!(
        "faults: lossy links (30% loss, 50±20 ms): {} registrations on {n} hosts acknowledged \
         after {acknowledged:?}, on every host after {everywhere:?} \
         ({delayed} packets delayed, {dropped} dropped, {overruns} delayer overruns; \
         checking already converged hosts takes {floor:?})",
        want.len()
    );
}

#[test]
fn a_split_hides_the_other_side_and_heals_to_the_exact_union() {
    let Some(hosts) = Hosts::start(5) else {
        return;
    };
    let n = hosts.len();
    let (left, right): (Vec<usize>, Vec<usize>) = (0..n).partition(|i| *i < 2);
    // Before: three names each, everywhere.
    let mut want: BTreeSet<Row> = BTreeSet::new();
    let runs: Vec<Child> = (0..n)
        .map(|i| {
            let batch: Vec<_> = (0..3).map(|k| entry(i, 0, k)).collect();
            want.extend(batch.iter().map(|e| row(i, e)));
            hosts.register(i, &batch)
        })
        .collect();
    for run in runs {
        await_registered(run, 3);
    }
    hosts.await_exactly("before the split", &want);
    let floor = hosts.await_exactly("before the split, again", &want);

    for &l in &left {
        for &r in &right {
            hosts.cut(l, r);
            hosts.cut(r, l);
        }
    }
    // Writes on both sides: two new names each, and each deletes one of its own.
    for i in 0..n {
        let batch: Vec<_> = (0..2).map(|k| entry(i, 1, k)).collect();
        await_registered(hosts.register(i, &batch), 2);
        want.extend(batch.iter().map(|e| row(i, e)));
        let gone = entry(i, 0, 0);
        hosts.delete(i, &gone.0);
        want.remove(&row(i, &gone));
    }
    // Each side hides the other side's names (the last ones, which the other side
    // may or may not have heard of) and answers its own side's new ones.
    let split_started = Instant::now();
    for (mine, theirs) in [(&left, &right), (&right, &left)] {
        for &i in mine {
            let node = &hosts.nodes[i];
            for &j in theirs {
                let name = entry(j, 0, 1).2;
                await_that(
                    &format!("{} hides {name} during the split", node.id()),
                    DEADLINE,
                    || node.addrs(&name).is_some_and(|a| a.is_empty()),
                );
            }
            for &j in mine {
                let e = entry(j, 1, 0);
                await_that(
                    &format!("{} answers {} during the split", node.id(), e.2),
                    DEADLINE,
                    || node.addrs(&e.2).is_some_and(|a| a == [e.1.clone()]),
                );
            }
        }
    }
    eprintln!(
        "faults: split 2|3: each side hides the other after {:?}",
        split_started.elapsed()
    );

    for &l in &left {
        for &r in &right {
            hosts.uncut(l, r);
            hosts.uncut(r, l);
        }
    }
    let healed = hosts.await_exactly("after the heal", &want);
    // Visible again, not only held: one name of the other side answers everywhere.
    for node in &hosts.nodes {
        for j in [0, n - 1] {
            let e = entry(j, 1, 1);
            await_that(&format!("{} answers {}", node.id(), e.2), DEADLINE, || {
                node.addrs(&e.2).is_some_and(|a| a == [e.1.clone()])
            });
        }
    }
    eprintln!(
        "faults: split 2|3 healed: exact union ({} entries) on every host after {healed:?} \
         (checking already converged hosts takes {floor:?})",
        want.len()
    );
}

#[test]
fn a_one_way_cut_and_a_flapping_link_leave_no_ghosts() {
    let Some(hosts) = Hosts::start(5) else {
        return;
    };
    let n = hosts.len();
    let mut want: BTreeSet<Row> = BTreeSet::new();
    for i in 0..n {
        let batch: Vec<_> = (0..2).map(|k| entry(i, 0, k)).collect();
        await_registered(hosts.register(i, &batch), 2);
        want.extend(batch.iter().map(|e| row(i, e)));
    }
    hosts.await_exactly("before the faults", &want);

    // f0 hears f1, f1 does not hear f0 (what f0 sends f1 is dropped); f4's link flaps every second for 20 s while
    // every host adds a name and deletes an older one of its own each second.
    hosts.cut(0, 1);
    let flapping = 4;
    for second in 0..20 {
        let state = if second % 2 == 0 { "down" } else { "up" };
        hosts.ns.set_link(flapping, state);
        let tick = Instant::now();
        for i in 0..n {
            let e = entry(i, 1, second);
            await_registered(hosts.register(i, std::slice::from_ref(&e)), 1);
            want.insert(row(i, &e));
            if second >= 2 {
                let old = entry(i, 1, second - 2);
                hosts.delete(i, &old.0);
                want.remove(&row(i, &old));
            }
        }
        // The scenario is time-driven: the link changes state once a second.
        std::thread::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed()));
    }
    hosts.ns.set_link(flapping, "up");
    // With the one-way cut still in place, f1 learns f0's state through the others.
    let converged = hosts.await_exactly("after the flapping, one-way cut in place", &want);
    hosts.uncut(0, 1);
    let healed = hosts.await_exactly("after the one-way cut healed", &want);
    eprintln!(
        "faults: one-way cut + 20 s flapping link: exact union ({} entries) on every host \
         {converged:?} after the link settled (cut still in place); checking them again after \
         the cut healed (nothing left to converge) takes {healed:?}",
        want.len()
    );
}
