//! `cargo xtask perf cluster`: replication over gossip between `dwara serve`
//! processes (release build), all with the same cluster key.
//!
//! ```text
//! cargo xtask perf cluster [--sizes 3,5,10] [--records 20] [--rounds 3]
//!                          [--sync 10000,50000] [--idle-seconds 10]
//!                          [--baseline PATH] [--sync-rounds 1]
//!                          [--trickle 0,2,20,200|off] [--trickle-seconds 10]
//!                          [--gossip-interval-ms MS]
//! ```
//!
//! `--faults` and `--simulate N,…` (first on the line) run the fault scenarios and
//! the in-process simulation instead; see [`crate::perf_cluster_faults`].
//!
//! Every node runs with dwara's default gossip settings unless
//! `--gossip-interval-ms` is given, which every node then gets.
//!
//! 1. **Convergence.** For each cluster size N (every node on its own 127.0.2.x,
//!    seeded with every other), `--records` times: the clock starts, one node gets
//!    a `PUT /name/…` (round robin), and every node is queried over UDP (raw DNS,
//!    back to back) until each answers the name; the record's time is the last
//!    node's first answer. Median and worst.
//! 2. **Failure detection.** `--rounds` times on the same cluster: SIGSTOP the last
//!    node, time until every other node answers its name NXDOMAIN (vanish); SIGCONT,
//!    time until every other node answers it again (return). Default settings.
//! 3. **Idle gossip.** Each size again, alone in a fresh network namespace on its
//!    loopback (needs root): once every node lists every other live, the bytes and
//!    packets sent on that `lo` during `--idle-seconds` (from `ip -s link`), per
//!    node. That is all of the namespace's traffic (nothing else runs there), IP and
//!    UDP headers included.
//! 4. **Sync.** For each `--sync` K: three nodes hold K records (K/3 registered on
//!    each); a fourth starts seeded with the first, timed from spawn until its
//!    `GET /peers` lists the three live and counts all K entries (so it serves
//!    them), then a sample is checked with DNS. RSS of every node then, and the CPU
//!    time (user + system, `/proc/PID/stat`) the three used from their start until
//!    they held every record. With `--baseline PATH` (another build of `dwara`,
//!    e.g. from an earlier commit) each sync runs `--sync-rounds` times with each
//!    binary, interleaved, and the medians are printed side by side with ratios
//!    (the trickle phase's too).
//! 5. **Trickle.** Then, with the four nodes holding the K records, for each
//!    `--trickle` rate R: `--trickle-seconds` of sequential `PUT`s of new names on
//!    the first node at R per second (0: no writes, the nodes idle), and the CPU
//!    time of all four nodes over that span, as a share of one core and per `PUT`.
//!    This is what a steady stream of container starts costs a cluster of that size.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::perf_util::{clock_ticks, cpu_ticks, free_port, output_of, release_dwara, rss_kib};
use anyhow::{Context, bail};

struct Options {
    sizes: Vec<usize>,
    records: usize,
    rounds: usize,
    sync: Vec<usize>,
    idle_seconds: u64,
    baseline: Option<PathBuf>,
    sync_rounds: usize,
    /// Registration rates (per second) for the trickle phase; empty: skipped.
    trickle: Vec<usize>,
    trickle_seconds: u64,
    /// `--gossip-interval-ms` for every node (default: dwara's).
    gossip_interval_ms: Option<u64>,
}

impl Options {
    /// The flags every node gets beyond the harness's own.
    fn node_args(&self) -> Vec<String> {
        self.gossip_interval_ms
            .map(|ms| vec!["--gossip-interval-ms".to_owned(), ms.to_string()])
            .unwrap_or_default()
    }
}

fn list(v: &str, name: &str) -> anyhow::Result<Vec<usize>> {
    v.split(',')
        .map(|s| s.trim().parse().with_context(|| format!("{name}: {s:?}")))
        .collect()
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        sizes: vec![3, 5, 10],
        records: 20,
        rounds: 3,
        sync: vec![10_000, 50_000],
        idle_seconds: 10,
        baseline: None,
        sync_rounds: 1,
        trickle: vec![0, 2, 20, 200],
        trickle_seconds: 10,
        gossip_interval_ms: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sizes" => o.sizes = list(v, "--sizes")?,
            "--records" => o.records = v.parse().context("--records")?,
            "--rounds" => o.rounds = v.parse().context("--rounds")?,
            "--sync" => o.sync = list(v, "--sync")?,
            "--idle-seconds" => o.idle_seconds = v.parse().context("--idle-seconds")?,
            "--baseline" => o.baseline = Some(PathBuf::from(v)),
            "--sync-rounds" => o.sync_rounds = v.parse().context("--sync-rounds")?,
            "--trickle" if v == "off" => o.trickle.clear(),
            "--trickle" => o.trickle = list(v, "--trickle")?,
            "--trickle-seconds" => o.trickle_seconds = v.parse().context("--trickle-seconds")?,
            "--gossip-interval-ms" => {
                o.gossip_interval_ms = Some(v.parse().context("--gossip-interval-ms")?);
            }
            other => bail!(
                "unknown option {other}; usage: cargo xtask perf cluster [--sizes 3,5,10] \
                 [--records 20] [--rounds 3] [--sync 10000,50000] [--idle-seconds 10] \
                 [--baseline PATH] [--sync-rounds 1] [--trickle 0,2,20,200|off] \
                 [--trickle-seconds 10] [--gossip-interval-ms MS]"
            ),
        }
    }
    if o.sizes.iter().any(|n| *n < 2) || o.records == 0 || o.rounds == 0 || o.sync_rounds == 0 {
        bail!("--sizes must be at least 2, --records, --rounds and --sync-rounds at least 1");
    }
    if o.trickle_seconds == 0 {
        bail!("--trickle-seconds must be at least 1");
    }
    if let Some(b) = &o.baseline
        && !b.is_file()
    {
        bail!("--baseline {}: no such file", b.display());
    }
    Ok(o)
}

/// How one node is started.
#[derive(Clone)]
struct Spec {
    id: String,
    dns: SocketAddr,
    http: SocketAddr,
    gossip: SocketAddr,
    peers: Vec<SocketAddr>,
    netns: Option<String>,
    /// Further `dwara serve` flags (`--gossip-interval-ms`).
    args: Vec<String>,
}

/// A `dwara serve`; killed on drop.
struct Node {
    spec: Spec,
    child: Child,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn specs(subnet: u8, n: usize, args: &[String]) -> anyhow::Result<Vec<Spec>> {
    let mut out = Vec::new();
    for i in 0..n {
        let ip = Ipv4Addr::new(127, 0, subnet, u8::try_from(i + 1)?);
        out.push(Spec {
            id: format!("node{i}"),
            dns: SocketAddr::from((ip, free_port(ip)?)),
            http: SocketAddr::from((ip, free_port(ip)?)),
            gossip: SocketAddr::from((ip, free_port(ip)?)),
            peers: Vec::new(),
            netns: None,
            args: args.to_vec(),
        });
    }
    seed_all(&mut out);
    Ok(out)
}

fn seed_all(specs: &mut [Spec]) {
    let all: Vec<SocketAddr> = specs.iter().map(|s| s.gossip).collect();
    for s in specs {
        s.peers = all.iter().copied().filter(|a| *a != s.gossip).collect();
    }
}

fn start(spec: &Spec, key: &Path) -> anyhow::Result<Node> {
    start_bin(spec, key, &release_dwara())
}

fn start_bin(spec: &Spec, key: &Path, bin: &Path) -> anyhow::Result<Node> {
    let mut cmd = match &spec.netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(["serve", "--docker", "off", "--fallback", "127.0.0.1:9"])
        .args(["--node-id", &spec.id])
        .args(["--dns-listen", &spec.dns.to_string()])
        .args(["--http-listen", &spec.http.to_string()])
        .args(["--gossip-listen", &spec.gossip.to_string()])
        .arg("--gossip-key-file")
        .arg(key);
    for p in &spec.peers {
        cmd.args(["--peer", &p.to_string()]);
    }
    cmd.args(&spec.args);
    let child = cmd
        .env("DWARA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    Ok(Node {
        spec: spec.clone(),
        child,
    })
}

fn client() -> anyhow::Result<reqwest::blocking::Client> {
    Ok(reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?)
}

/// `GET /peers` of a node: (live peers, entries of all peers, own entries); `None`
/// while it does not answer.
fn peers(client: &reqwest::blocking::Client, node: &Node) -> Option<(usize, u64, u64)> {
    let body = match &node.spec.netns {
        None => client
            .get(format!("http://{}/peers", node.spec.http))
            .send()
            .ok()?
            .text()
            .ok()?,
        Some(ns) => {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "curl", "-s", "-m", "2"])
                .arg(format!("http://{}/peers", node.spec.http))
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let rows: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
    let mut live = 0;
    let mut entries = 0;
    let mut own = 0;
    for r in &rows {
        let n = r["entries"].as_u64().unwrap_or(0);
        if r["local"] == true {
            own = n;
        } else {
            entries += n;
            if r["state"] == "live" {
                live += 1;
            }
        }
    }
    Some((live, entries, own))
}

/// Polls until `check` holds, at most `timeout`; returns the time it took.
fn await_that(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if check()? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!("not within {timeout:?}: {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn await_mesh(client: &reqwest::blocking::Client, nodes: &[Node]) -> anyhow::Result<Duration> {
    let want = nodes.len() - 1;
    await_that(
        "every node lists every other live",
        Duration::from_secs(60),
        || {
            Ok(nodes
                .iter()
                .all(|n| peers(client, n).is_some_and(|p| p.0 == want)))
        },
    )
}

/// A DNS A query for `name` with id `id`.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = vec![0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    q[..2].copy_from_slice(&id.to_be_bytes());
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).unwrap_or(63));
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Raw DNS probes, one socket per node.
struct Prober {
    socks: Vec<(UdpSocket, SocketAddr)>,
    next_id: u16,
}

/// What a probe saw.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Answered,
    NxDomain,
    Other,
}

impl Prober {
    fn new(nodes: &[Node]) -> anyhow::Result<Self> {
        let mut socks = Vec::new();
        for n in nodes {
            let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            socks.push((s, n.spec.dns));
        }
        Ok(Self { socks, next_id: 1 })
    }

    fn probe(&mut self, node: usize, name: &str) -> anyhow::Result<Seen> {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let (sock, addr) = &self.socks[node];
        sock.send_to(&query(id, name), addr)?;
        let mut buf = [0u8; 1500];
        loop {
            let Ok(n) = sock.recv(&mut buf) else {
                return Ok(Seen::Other);
            };
            if n < 12 || buf[..2] != id.to_be_bytes() {
                continue; // a late answer to an earlier probe
            }
            let ancount = u16::from_be_bytes([buf[6], buf[7]]);
            return Ok(match buf[3] & 0x0f {
                0 if ancount > 0 => Seen::Answered,
                3 => Seen::NxDomain,
                _ => Seen::Other,
            });
        }
    }

    /// Probes every node in `nodes` back to back until each has shown `want` once;
    /// returns when the last did, measured from `since`.
    fn until_all(
        &mut self,
        nodes: &[usize],
        name: &str,
        want: &Seen,
        since: Instant,
    ) -> anyhow::Result<Duration> {
        let mut pending: BTreeSet<usize> = nodes.iter().copied().collect();
        while !pending.is_empty() {
            if since.elapsed() > Duration::from_secs(30) {
                bail!("{name}: nodes {pending:?} never showed {want:?}");
            }
            let mut done = Vec::new();
            for &i in &pending {
                if self.probe(i, name)? == *want {
                    done.push(i);
                }
            }
            for i in done {
                pending.remove(&i);
            }
        }
        Ok(since.elapsed())
    }
}

fn put(
    client: &reqwest::blocking::Client,
    node: &Node,
    id: &str,
    ip: Ipv4Addr,
    fqdn: &str,
) -> anyhow::Result<()> {
    let resp = client
        .put(format!("http://{}/name/{id}/{ip}", node.spec.http))
        .body(format!("fqdn={fqdn}"))
        .send()?;
    if resp.status().as_u16() != 204 {
        bail!(
            "PUT {id} {ip} {fqdn} on {}: {}",
            node.spec.id,
            resp.status()
        );
    }
    Ok(())
}

fn signal(node: &Node, sig: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(node.child.id().to_string())
        .status()?;
    if !status.success() {
        bail!("kill -{sig} {} failed", node.child.id());
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// (median, worst) in ms.
fn stats(v: &[Duration]) -> (f64, f64) {
    let mut v: Vec<f64> = v.iter().copied().map(ms).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    (v[v.len() / 2], v[v.len() - 1])
}

struct SizeRow {
    nodes: usize,
    converge: (f64, f64),
    vanish: (f64, f64),
    back: (f64, f64),
    idle: Option<(f64, f64)>,
}

fn convergence_and_failure(
    n: usize,
    subnet: u8,
    key: &Path,
    opts: &Options,
) -> anyhow::Result<SizeRow> {
    let client = client()?;
    let nodes = specs(subnet, n, &opts.node_args())?
        .iter()
        .map(|s| start(s, key))
        .collect::<anyhow::Result<Vec<Node>>>()?;
    let mesh = await_mesh(&client, &nodes)?;
    println!(
        "  {n} nodes: every node lists every other live {:.0} ms after the start",
        ms(mesh)
    );
    let mut prober = Prober::new(&nodes)?;
    let everyone: Vec<usize> = (0..n).collect();

    let mut conv = Vec::new();
    for r in 0..opts.records {
        let name = format!("conv{n}-{r}.weave.local");
        let ip = Ipv4Addr::new(10, 51, u8::try_from(n % 256)?, u8::try_from(r % 250)?);
        let started = Instant::now();
        put(&client, &nodes[r % n], &format!("conv{r}"), ip, &name)?;
        conv.push(prober.until_all(&everyone, &name, &Seen::Answered, started)?);
    }

    let victim = n - 1;
    let others: Vec<usize> = (0..victim).collect();
    let name = format!("victim{n}.weave.local");
    let started = Instant::now();
    put(
        &client,
        &nodes[victim],
        "victim",
        Ipv4Addr::new(10, 52, 0, 1),
        &name,
    )?;
    prober.until_all(&everyone, &name, &Seen::Answered, started)?;
    let (mut vanish, mut back) = (Vec::new(), Vec::new());
    for _ in 0..opts.rounds {
        signal(&nodes[victim], "STOP")?;
        let stopped = Instant::now();
        let gone = prober.until_all(&others, &name, &Seen::NxDomain, stopped);
        signal(&nodes[victim], "CONT")?;
        vanish.push(gone?);
        let resumed = Instant::now();
        back.push(prober.until_all(&others, &name, &Seen::Answered, resumed)?);
        // The victim must see everyone live again before the next round.
        await_mesh(&client, &nodes)?;
    }
    Ok(SizeRow {
        nodes: n,
        converge: stats(&conv),
        vanish: stats(&vanish),
        back: stats(&back),
        idle: None,
    })
}

/// Network namespace for the idle measurement; deleted on drop.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip_cmd(args: &[&str]) -> anyhow::Result<String> {
    output_of("ip", args)
}

/// (tx bytes, tx packets) of `lo` in `ns`.
fn lo_tx(ns: &str) -> anyhow::Result<(u64, u64)> {
    let json = ip_cmd(&["-n", ns, "-s", "-j", "link", "show", "lo"])?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    let tx = &v[0]["stats64"]["tx"];
    match (tx["bytes"].as_u64(), tx["packets"].as_u64()) {
        (Some(b), Some(p)) => Ok((b, p)),
        _ => bail!("no tx counters for lo in {ns}: {json}"),
    }
}

/// Idle gossip per node: (bytes/s, packets/s), or `None` without netns rights.
fn idle_traffic(
    n: usize,
    key: &Path,
    seconds: u64,
    args: &[String],
) -> anyhow::Result<Option<(f64, f64)>> {
    let name = format!("dwperf{}-{n}", std::process::id());
    if let Err(e) = ip_cmd(&["netns", "add", &name]) {
        println!("  idle traffic not measured: {e:#}");
        return Ok(None);
    }
    let ns = Netns(name);
    ip_cmd(&["-n", &ns.0, "link", "set", "lo", "up"])?;
    let lo = Ipv4Addr::LOCALHOST;
    let mut specs: Vec<Spec> = (0..n)
        .map(|i| {
            let port = |base: u16| SocketAddr::from((lo, base + u16::try_from(i).unwrap_or(0)));
            Spec {
                id: format!("node{i}"),
                dns: port(20_000),
                http: port(21_000),
                gossip: port(22_000),
                peers: Vec::new(),
                netns: Some(ns.0.clone()),
                args: args.to_vec(),
            }
        })
        .collect();
    seed_all(&mut specs);
    let nodes = specs
        .iter()
        .map(|s| start(s, key))
        .collect::<anyhow::Result<Vec<Node>>>()?;
    let client = client()?;
    await_mesh(&client, &nodes)?;
    let (b0, p0) = lo_tx(&ns.0)?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let (b1, p1) = lo_tx(&ns.0)?;
    let secs = t0.elapsed().as_secs_f64();
    drop(nodes);
    let per = |d: u64| d as f64 / secs / n as f64;
    Ok(Some((per(b1 - b0), per(p1 - p0))))
}

struct SyncRow {
    records: usize,
    spread: Duration,
    sync: Duration,
    rss: Vec<f64>,
    /// CPU seconds the three holders used from their start until they held every record.
    cpu: f64,
    trickle: Vec<TrickleRow>,
}

/// Registrations at a steady rate on one node of four that hold the sync's records.
#[derive(Clone, Copy)]
struct TrickleRow {
    rate: usize,
    registered: usize,
    /// CPU seconds of all four nodes over the phase.
    cpu: f64,
    wall: Duration,
}

impl TrickleRow {
    /// The nodes' CPU over the phase, as a share of one core.
    fn core_share(&self) -> f64 {
        self.cpu / self.wall.as_secs_f64()
    }
}

/// User + system seconds `nodes` have used since they started (`/proc/PID/stat`).
fn cpu_seconds(nodes: &[Node]) -> anyhow::Result<f64> {
    let ticks = clock_ticks();
    let mut sum = 0.0;
    for n in nodes {
        let (own, _) =
            cpu_ticks(&n.child.id().to_string()).context("cannot read a node's /proc stat")?;
        sum += own as f64 / ticks;
    }
    Ok(sum)
}

/// For each rate, `seconds` of `PUT`s to `nodes[0]` at that rate (sequential, paced
/// from the phase's start); the CPU all of `nodes` used meanwhile. Rate 0 measures
/// the nodes idle. Names `t{rate}-{i}` are new, so every `PUT` adds an entry.
fn trickle(
    client: &reqwest::blocking::Client,
    nodes: &[Node],
    rates: &[usize],
    seconds: u64,
) -> anyhow::Result<Vec<TrickleRow>> {
    let span = Duration::from_secs(seconds);
    let mut rows = Vec::new();
    for (r, &rate) in rates.iter().enumerate() {
        let before = cpu_seconds(nodes)?;
        let started = Instant::now();
        let mut registered = 0usize;
        while started.elapsed() < span {
            if rate == 0 {
                std::thread::sleep(span);
                break;
            }
            let j = u32::try_from(registered)?;
            let ip = Ipv4Addr::from(0x0b00_0000 + (u32::try_from(r)? << 20) + j);
            put(
                client,
                &nodes[0],
                &format!("t{rate}-{j}"),
                ip,
                &format!("t{rate}-{j}.weave.local"),
            )?;
            registered += 1;
            let due = started + Duration::from_secs_f64(registered as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let wall = started.elapsed();
        rows.push(TrickleRow {
            rate,
            registered,
            cpu: cpu_seconds(nodes)? - before,
            wall,
        });
    }
    Ok(rows)
}

fn sync_run(
    k: usize,
    subnet: u8,
    key: &Path,
    bin: &Path,
    opts: &Options,
) -> anyhow::Result<SyncRow> {
    let mut all = specs(subnet, 4, &opts.node_args())?;
    // The newcomer knows only the first node; the others do not know it.
    let newcomer_addr = all[3].gossip;
    for s in &mut all[..3] {
        s.peers.retain(|p| *p != newcomer_addr);
    }
    all[3].peers = vec![all[0].gossip];
    let nodes = all[..3]
        .iter()
        .map(|s| start_bin(s, key, bin))
        .collect::<anyhow::Result<Vec<Node>>>()?;
    let client = client()?;
    await_mesh(&client, &nodes)?;
    let started = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let handles: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(t, node)| {
                let client = &client;
                scope.spawn(move || -> anyhow::Result<()> {
                    for j in (t..k).step_by(3) {
                        let ip = Ipv4Addr::from(0x0a80_0000 + u32::try_from(j)?);
                        put(
                            client,
                            node,
                            &format!("s{j}"),
                            ip,
                            &format!("s{j}.weave.local"),
                        )?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a registration thread panicked"))??;
        }
        Ok(())
    })?;
    let want = u64::try_from(k)?;
    await_that(
        "the three nodes hold every record",
        Duration::from_secs(120),
        || {
            Ok(nodes
                .iter()
                .all(|n| peers(&client, n).is_some_and(|(_, e, own)| e + own == want)))
        },
    )?;
    let spread = started.elapsed();
    let cpu = cpu_seconds(&nodes)?;
    println!(
        "  {k} records registered on 3 nodes (K/3 each, sequential per node) and held by all 3 after {:.2} s",
        spread.as_secs_f64()
    );

    let spawned = Instant::now();
    let newcomer = start_bin(&all[3], key, bin)?;
    await_that(
        "the new node holds every record and sees their owners live",
        Duration::from_secs(120),
        || Ok(peers(&client, &newcomer).is_some_and(|(live, e, _)| live == 3 && e == want)),
    )?;
    let sync = spawned.elapsed();
    let mut nodes = nodes;
    nodes.push(newcomer);
    let mut prober = Prober::new(&nodes)?;
    for j in (0..k).step_by((k / 50).max(1)) {
        if prober.probe(3, &format!("s{j}.weave.local"))? != Seen::Answered {
            bail!("the new node does not answer s{j}.weave.local");
        }
    }
    let rss = nodes
        .iter()
        .map(|n| rss_kib(n.child.id()).map_or(f64::NAN, |kib| kib as f64 / 1024.0))
        .collect();
    let trickle = trickle(&client, &nodes, &opts.trickle, opts.trickle_seconds)?;
    Ok(SyncRow {
        records: k,
        spread,
        sync,
        rss,
        cpu,
        trickle,
    })
}

/// The row of medians of several runs of one sync size.
fn median_row(mut rows: Vec<SyncRow>) -> SyncRow {
    let mid = rows.len() / 2;
    let median = |rows: &mut Vec<SyncRow>, key: fn(&SyncRow) -> f64| {
        rows.sort_by(|a, b| key(a).total_cmp(&key(b)));
        key(&rows[mid])
    };
    let spread = median(&mut rows, |r| r.spread.as_secs_f64());
    let cpu = median(&mut rows, |r| r.cpu);
    let sync = median(&mut rows, |r| r.sync.as_secs_f64());
    // RSS of the run with the median new-node sync (sorted last).
    let row = rows.swap_remove(mid);
    SyncRow {
        spread: Duration::from_secs_f64(spread),
        cpu,
        sync: Duration::from_secs_f64(sync),
        ..row
    }
}

fn print_syncs(label: &str, syncs: &[SyncRow]) {
    println!("  {label}:");
    println!(
        "  {:>8} {:>16} {:>14} {:>12} {:>28}",
        "records", "held by 3 after", "holders' CPU", "new node", "RSS per node MiB (4 nodes)"
    );
    for s in syncs {
        let rss: Vec<String> = s.rss.iter().map(|m| format!("{m:.1}")).collect();
        println!(
            "  {:>8} {:>14.2} s {:>12.2} s {:>10.2} s {:>28}",
            s.records,
            s.spread.as_secs_f64(),
            s.cpu,
            s.sync.as_secs_f64(),
            rss.join(" ")
        );
    }
    if syncs.iter().all(|s| s.trickle.is_empty()) {
        return;
    }
    println!(
        "  registrations at a steady rate on one of the 4 nodes holding the records \
         (CPU of all 4 nodes):"
    );
    println!(
        "  {:>8} {:>10} {:>12} {:>16} {:>18}",
        "records", "rate /s", "registered", "CPU % of a core", "CPU ms per PUT"
    );
    for s in syncs {
        for t in &s.trickle {
            let per_put = if t.registered == 0 {
                "-".to_owned()
            } else {
                format!("{:.2}", t.cpu / t.registered as f64 * 1e3)
            };
            println!(
                "  {:>8} {:>10} {:>12} {:>15.0}% {:>18}",
                s.records,
                t.rate,
                t.registered,
                t.core_share() * 100.0,
                per_put
            );
        }
    }
}

/// Runs the benchmark.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    match args.split_first() {
        Some((flag, [])) if flag == "--faults" => return crate::perf_cluster_faults::faults(),
        Some((flag, rest)) if flag == "--simulate" => {
            let (sizes, rest) = rest
                .split_first()
                .context("--simulate needs sizes (100,1000)")?;
            return crate::perf_cluster_faults::simulate(sizes, rest);
        }
        _ => {}
    }
    let opts = parse_args(args)?;
    crate::cargo(&["build", "--release", "-p", "dwara"])?;
    crate::perf_util::in_scratch_dir("perf-cluster", |dir| run_in(dir, &opts))
}

fn run_in(dir: &Path, opts: &Options) -> anyhow::Result<()> {
    let out = Command::new(release_dwara()).arg("keygen").output()?;
    if !out.status.success() {
        bail!("dwara keygen failed");
    }
    let key = dir.join("cluster.key");
    std::fs::write(&key, &out.stdout)?;
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let gossip = match opts.gossip_interval_ms {
        Some(ms) => format!("gossip every {ms} ms, phi 8"),
        None => "default gossip settings (100 ms interval, phi 8)".to_owned(),
    };
    println!(
        "perf cluster: sizes {:?}, {} records each, {} SIGSTOP rounds, sync of {:?}, {gossip}, sealed values",
        opts.sizes, opts.records, opts.rounds, opts.sync
    );
    let mut rows = Vec::new();
    for (i, &n) in opts.sizes.iter().enumerate() {
        let mut row = convergence_and_failure(n, 2 + u8::try_from(i)?, &key, opts)?;
        row.idle = idle_traffic(n, &key, opts.idle_seconds, &opts.node_args())?;
        rows.push(row);
    }
    let current = release_dwara();
    let mut syncs = Vec::new();
    let mut baseline_syncs = Vec::new();
    for (i, &k) in opts.sync.iter().enumerate() {
        let subnet = 20 + u8::try_from(i)?;
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..opts.sync_rounds {
            ours.push(sync_run(k, subnet, &key, &current, opts)?);
            if let Some(b) = &opts.baseline {
                theirs.push(sync_run(k, subnet, &key, b, opts)?);
            }
        }
        syncs.push(median_row(ours));
        if !theirs.is_empty() {
            baseline_syncs.push(median_row(theirs));
        }
    }

    println!(
        "\nconvergence (PUT on one node -> every node answers; {} records), failure detection ({} rounds), idle gossip ({} s, per node, lo of a netns, headers included):",
        opts.records, opts.rounds, opts.idle_seconds
    );
    println!(
        "  {:>5} {:>12} {:>11} {:>12} {:>11} {:>12} {:>11} {:>12} {:>10}",
        "nodes",
        "conv median",
        "conv worst",
        "vanish med",
        "vanish max",
        "return med",
        "return max",
        "idle B/s",
        "idle pkt/s"
    );
    for r in &rows {
        let (b, p) = r.idle.unwrap_or((f64::NAN, f64::NAN));
        println!(
            "  {:>5} {:>9.1} ms {:>8.1} ms {:>9.0} ms {:>8.0} ms {:>9.0} ms {:>8.0} ms {:>12.0} {:>10.1}",
            r.nodes, r.converge.0, r.converge.1, r.vanish.0, r.vanish.1, r.back.0, r.back.1, b, p
        );
    }
    println!(
        "\nsync of a new node (spawn -> GET /peers counts every record; 3 nodes hold them; median of {} round(s)):",
        opts.sync_rounds
    );
    print_syncs("this build", &syncs);
    if let Some(b) = &opts.baseline {
        print_syncs(&format!("baseline {}", b.display()), &baseline_syncs);
        println!("  ratios, this build / baseline (below 1 is better):");
        for (s, b) in syncs.iter().zip(&baseline_syncs) {
            println!(
                "  {:>8} records: held by 3 {:.2}x, new node {:.2}x, holders' CPU {:.2}x",
                s.records,
                s.spread.as_secs_f64() / b.spread.as_secs_f64(),
                s.sync.as_secs_f64() / b.sync.as_secs_f64(),
                s.cpu / b.cpu
            );
            for (t, bt) in s.trickle.iter().zip(&b.trickle) {
                println!(
                    "  {:>8} records, {:>4} PUT/s: CPU of the 4 nodes {:.2}x",
                    s.records,
                    t.rate,
                    t.core_share() / bt.core_share()
                );
            }
        }
    }
    if let Some(r) = rows.iter().find(|r| r.nodes == 10) {
        println!(
            "\ntargets (issue 15): 10 nodes converge median {:.1} ms (<= 100), worst {:.1} ms (<= 500); \
             vanish worst {:.0} ms (<= 2000), return worst {:.0} ms (<= 2000)",
            r.converge.0, r.converge.1, r.vanish.1, r.back.1
        );
    }
    if let Some(s) = syncs.iter().find(|s| s.records == 50_000) {
        println!(
            "targets (issue 15): 50k records sync {:.2} s (<= 3)",
            s.sync.as_secs_f64()
        );
    }
    Ok(())
}
