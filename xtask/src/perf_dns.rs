//! `cargo xtask perf dns`: dwara's name server vs dnsmasq and unbound under dnsperf.
//!
//! ```text
//! cargo xtask perf dns [--names N] [--rounds R] [--seconds S] [--workers W]
//!                      [--clients C] [--outstanding Q] [--edns] [--rate QPS]
//!                      [--batch N] [--before PATH] [--no-tcp] [--profile DIR]
//!                      [--wildcard] [--dwara PATH]
//! ```
//!
//! 1. Generates one data set: `N` names `hostI.weave.local`, every fifth with three
//!    addresses, the rest with one; and one query file: A lookups of those names,
//!    ~10% PTR lookups of their addresses, ~5% unknown names in the domain.
//! 2. Starts `dwara serve` (release build) and registers every record over HTTP
//!    (one keep-alive connection, sequential requests), timing it; starts dnsmasq
//!    (`--addn-hosts`, `--local=/weave.local/`) and unbound (`local-data`,
//!    `local-data-ptr`, `local-zone: static`) with 1 and 2 threads, all on loopback.
//! 3. Checks that each server gives the same answers to a sample of the queries.
//! 4. Runs `dnsperf -c C -T 1 -q Q -l S` against each server in turn over UDP and
//!    then over TCP (`-m tcp`), `R` rounds interleaved, and prints per server the
//!    median qps, mean and max latency, lost queries, the server's CPU time per
//!    answered query, split into user and system time (`utime` and `stime` from
//!    `/proc/PID/stat` over the round, children included: dnsmasq forks per TCP
//!    connection), the server's context switches per answered query (voluntary:
//!    it slept, involuntary: it was preempted; summed over its threads'
//!    `/proc/PID/task/*/status`), the
//!    client's CPU share (dnsperf's user + system time over the wall time, from this
//!    process's waited-for children times), dwara's ratio to each, and dwara's RSS.
//! 5. Then `R` interleaved rounds at a fixed offered load (`dnsperf -Q QPS -v`,
//!    default 20,000 qps) and prints p50, p99 and p99.9 of the per-query latencies
//!    dnsperf reports. A server whose median UDP throughput was below 1.25 × QPS is
//!    left out of these rounds (it would be measured saturated).
//!
//! `--before PATH` adds a second dwara, `dwara-before`, run from another build of the
//! binary (a copy of an earlier `target/release/dwara`) with the same data and
//! options, so a change is measured before and after in the same interleaved rounds;
//! the closing lines give dwara ÷ dwara-before. `--batch N` passes
//! `--dns-udp-batch N` to both dwaras. `--no-tcp` skips the TCP rounds. `--profile
//! DIR` adds, after the rounds, one UDP round per server under `perf record -g -e
//! cpu-clock -p PID` (`perf` must be installed) and writes `DIR/NAME.perf.data`
//! (read with `perf report -i`). `--wildcard` adds `dwara-wildcard`: the same build
//! bound to `0.0.0.0` (and queried on 127.0.0.1), which asks for every datagram's
//! destination and sends each reply from it; the closing lines give
//! dwara-wildcard ÷ dwara, the cost of that. `--dwara PATH` runs that binary as
//! `dwara` (and `dwara-wildcard`) instead of building the release binary.
//!
//! Everything listens on 127.0.0.1 only.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::perf_util::{
    clock_ticks, context_switches, cpu_split, free_port, median, release_dwara, rss_kib,
};
use anyhow::{Context, bail};

struct Options {
    names: usize,
    rounds: usize,
    seconds: u32,
    workers: Option<usize>,
    clients: u32,
    outstanding: u32,
    edns: bool,
    rate: u32,
    batch: Option<usize>,
    before: Option<PathBuf>,
    dwara: Option<PathBuf>,
    no_tcp: bool,
    profile: Option<PathBuf>,
    wildcard: bool,
}

const USAGE: &str = "usage: cargo xtask perf dns [--names N] [--rounds R] [--seconds S] \
                     [--workers W] [--clients C] [--outstanding Q] [--edns] [--rate QPS] \
                     [--batch N] [--before PATH] [--dwara PATH] [--no-tcp] [--profile DIR] \
                     [--wildcard]";

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        names: 1000,
        rounds: 3,
        seconds: 10,
        workers: None,
        clients: 8,
        outstanding: 100,
        edns: false,
        rate: 20_000,
        batch: None,
        before: None,
        dwara: None,
        no_tcp: false,
        profile: None,
        wildcard: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut text = |name: &str| -> anyhow::Result<&String> {
            it.next().with_context(|| format!("{name} needs a value"))
        };
        if a == "--before" || a == "--dwara" || a == "--profile" {
            let path = Some(PathBuf::from(text(a)?));
            match a.as_str() {
                "--before" => o.before = path,
                "--dwara" => o.dwara = path,
                _ => o.profile = path,
            }
            continue;
        }
        let mut value = |name: &str| -> anyhow::Result<usize> {
            it.next()
                .with_context(|| format!("{name} needs a value"))?
                .parse()
                .with_context(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--names" => o.names = value("--names")?.max(1),
            "--rounds" => o.rounds = value("--rounds")?.max(1),
            "--seconds" => o.seconds = u32::try_from(value("--seconds")?.max(1))?,
            "--workers" => o.workers = Some(value("--workers")?.max(1)),
            "--clients" => o.clients = u32::try_from(value("--clients")?.max(1))?,
            "--outstanding" => o.outstanding = u32::try_from(value("--outstanding")?.max(1))?,
            "--edns" => o.edns = true,
            "--rate" => o.rate = u32::try_from(value("--rate")?.max(1))?,
            "--batch" => o.batch = Some(value("--batch")?.clamp(1, 64)),
            "--no-tcp" => o.no_tcp = true,
            "--wildcard" => o.wildcard = true,
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    Ok(o)
}

/// A tiny deterministic generator (the data set is the same every run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n
    }
}

/// The records: (name, addresses).
fn data_set(n: usize) -> Vec<(String, Vec<Ipv4Addr>)> {
    let mut next = 0u32;
    (0..n)
        .map(|i| {
            let count = if i % 5 == 0 { 3 } else { 1 };
            let addrs = (0..count)
                .map(|_| {
                    next += 1;
                    // 10.0.0.0/8 as data only: nothing is ever sent there.
                    Ipv4Addr::from(0x0a00_0000 + next)
                })
                .collect();
            (format!("host{i}.weave.local"), addrs)
        })
        .collect()
}

fn reverse(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("{}.{}.{}.{}.in-addr.arpa", o[3], o[2], o[1], o[0])
}

/// dnsperf query lines: ~85% A, ~10% PTR, ~5% unknown names.
fn queries(data: &[(String, Vec<Ipv4Addr>)], count: usize) -> Vec<String> {
    let mut rng = Lcg(42);
    (0..count)
        .map(|i| {
            let roll = rng.below(100);
            let (name, addrs) = &data[rng.below(data.len())];
            if roll < 5 {
                format!("nohost{i}.weave.local A")
            } else if roll < 15 {
                format!("{} PTR", reverse(addrs[rng.below(addrs.len())]))
            } else {
                format!("{name} A")
            }
        })
        .collect()
}

/// A server process under test; killed on drop.
struct Server {
    name: String,
    addr: SocketAddr,
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `addr` answers a DNS query over UDP.
fn wait_dns(addr: SocketAddr, child: &mut Child, what: &str) -> anyhow::Result<()> {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    sock.set_read_timeout(Some(Duration::from_millis(100)))?;
    let q = dns_query(0x4242, "probe.weave.local", 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited during startup ({status})");
        }
        sock.send_to(&q, addr)?;
        if let Ok(n) = sock.recv(&mut buf)
            && n >= 2
            && buf[..2] == [0x42, 0x42]
        {
            return Ok(());
        }
    }
    bail!("{what} did not answer on {addr}")
}

fn dns_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    q[..2].copy_from_slice(&id.to_be_bytes());
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, (qtype >> 8) as u8, qtype as u8, 0, 1]);
    q
}

/// (rcode, answer count) of one query.
fn ask(addr: SocketAddr, name: &str, qtype: u16) -> anyhow::Result<(u8, u16)> {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))?;
    sock.send_to(&dns_query(7, name, qtype), addr)?;
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .with_context(|| format!("no answer from {addr} for {name}"))?;
    if n < 12 {
        bail!("short answer from {addr}");
    }
    Ok((buf[3] & 0x0f, u16::from_be_bytes([buf[6], buf[7]])))
}

/// Starts `bin` as a name server listening on `listen` (127.0.0.1, or the wildcard
/// 0.0.0.0); the returned server's address is the one clients query, on 127.0.0.1.
fn start_dwara(
    dir: &Path,
    name: &str,
    bin: &Path,
    opts: &Options,
    listen: Ipv4Addr,
) -> anyhow::Result<(Server, SocketAddr)> {
    let port = free_port(listen)?;
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut cmd = Command::new(bin);
    cmd.args([
        "serve",
        "--dns-listen",
        &SocketAddr::from((listen, port)).to_string(),
        "--http-listen",
        &http.to_string(),
    ])
    .arg("--resolv-conf")
    .arg(dir.join("empty-resolv.conf"))
    .env("DWARA_LOG", "warn")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if let Some(w) = opts.workers {
        cmd.args(["--dns-workers", &w.to_string()]);
    }
    if let Some(b) = opts.batch {
        cmd.args(["--dns-udp-batch", &b.to_string()]);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    wait_dns(addr, &mut child, name)?;
    Ok((
        Server {
            name: name.into(),
            addr,
            child,
        },
        http,
    ))
}

/// [`start_dwara`], then [`register`] the data set and say how long it took.
fn start_loaded(
    dir: &Path,
    name: &str,
    bin: &Path,
    opts: &Options,
    listen: Ipv4Addr,
    data: &[(String, Vec<Ipv4Addr>)],
) -> anyhow::Result<Server> {
    let (server, http) = start_dwara(dir, name, bin, opts, listen)?;
    let took = register(http, data)?;
    println!(
        "{name} ({} on {listen}): registered in {:.2} s",
        bin.display(),
        took.as_secs_f64()
    );
    Ok(server)
}

/// Registers every record over one keep-alive HTTP connection (reqwest's pool);
/// returns the time taken.
fn register(http: SocketAddr, data: &[(String, Vec<Ipv4Addr>)]) -> anyhow::Result<Duration> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .pool_max_idle_per_host(1)
        .build()?;
    let started = Instant::now();
    for (i, (name, addrs)) in data.iter().enumerate() {
        for ip in addrs {
            let resp = client
                .put(format!("http://{http}/name/c{i}/{ip}"))
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!("fqdn={name}"))
                .send()?;
            if resp.status().as_u16() != 204 {
                bail!("registration of {name} {ip} failed: {}", resp.status());
            }
        }
    }
    Ok(started.elapsed())
}

fn start_dnsmasq(dir: &Path, data: &[(String, Vec<Ipv4Addr>)]) -> anyhow::Result<Server> {
    let hosts = dir.join("hosts");
    let mut text = String::new();
    for (name, addrs) in data {
        for ip in addrs {
            let _ = writeln!(text, "{ip} {name}");
        }
    }
    std::fs::write(&hosts, text)?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
    let mut child = Command::new("dnsmasq")
        .args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--user=root",
            "--pid-file=",
            "--local=/weave.local/",
            "--local-ttl=1",
            "--log-facility=-",
            "--listen-address=127.0.0.1",
        ])
        .arg(format!("--port={}", addr.port()))
        .arg(format!("--addn-hosts={}", hosts.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start dnsmasq")?;
    wait_dns(addr, &mut child, "dnsmasq")?;
    Ok(Server {
        name: "dnsmasq".into(),
        addr,
        child,
    })
}

fn start_unbound(
    dir: &Path,
    data: &[(String, Vec<Ipv4Addr>)],
    threads: u32,
) -> anyhow::Result<Server> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
    let conf = dir.join(format!("unbound-{threads}.conf"));
    let mut text = format!(
        "server:\n  interface: 127.0.0.1@{port}\n  port: {port}\n  do-daemonize: no\n  username: \"\"\n  \
         chroot: \"\"\n  directory: \"{dir}\"\n  pidfile: \"\"\n  use-syslog: no\n  logfile: \"\"\n  \
         verbosity: 0\n  num-threads: {threads}\n  so-reuseport: yes\n  do-ip6: no\n  \
         access-control: 127.0.0.0/8 allow\n  local-zone: \"weave.local.\" static\n",
        port = addr.port(),
        dir = dir.display()
    );
    for (name, addrs) in data {
        for ip in addrs {
            let _ = writeln!(text, "  local-data: \"{name}. 1 IN A {ip}\"");
            let _ = writeln!(text, "  local-data-ptr: \"{ip} 1 {name}.\"");
        }
    }
    text.push_str("remote-control:\n  control-enable: no\n");
    std::fs::write(&conf, text)?;
    let mut child = Command::new("unbound")
        .arg("-d")
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // unbound logs "start of service" at verbosity 0; wait_dns reports failures.
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start unbound")?;
    wait_dns(addr, &mut child, "unbound")?;
    Ok(Server {
        name: format!("unbound-{threads}t"),
        addr,
        child,
    })
}

/// Same answers from every server on a sample of the query file.
fn cross_check(servers: &[&Server], lines: &[String]) -> anyhow::Result<()> {
    for line in lines.iter().step_by((lines.len() / 200).max(1)) {
        let (name, qtype) = line.split_once(' ').unwrap_or((line, "A"));
        let qtype = if qtype == "PTR" { 12 } else { 1 };
        let want = ask(servers[0].addr, name, qtype)?;
        for s in &servers[1..] {
            let got = ask(s.addr, name, qtype)?;
            if got != want {
                bail!(
                    "{} answers {name} {qtype} with {got:?}, {} with {want:?}",
                    s.name,
                    servers[0].name
                );
            }
        }
    }
    Ok(())
}

/// How dnsperf drives a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// UDP, as fast as the outstanding limit allows.
    Udp,
    /// TCP (`-m tcp`), as fast as the outstanding limit allows.
    Tcp,
    /// UDP at a fixed offered load (`-Q`), with per-query latencies (`-v`).
    Rate(u32),
}

#[derive(Debug, Clone, Default)]
struct Run {
    qps: f64,
    mean_ms: f64,
    max_ms: f64,
    lost: u64,
    completed: u64,
    /// Server CPU (user + system) over the round, seconds.
    server_cpu: f64,
    /// The system-time part of `server_cpu`, seconds.
    server_sys: f64,
    /// The server's context switches over the round (all its threads).
    switches: u64,
    /// dnsperf's CPU (user + system) over the round, seconds.
    client_cpu: f64,
    wall: f64,
    /// Per-query latencies in ms, sorted (rate rounds only).
    latencies: Vec<f64>,
}

impl Run {
    /// Server CPU per answered query, µs.
    fn cpu_us(&self) -> f64 {
        self.server_cpu * 1e6 / self.completed.max(1) as f64
    }

    /// The system-time part of [`Run::cpu_us`], µs.
    fn sys_us(&self) -> f64 {
        self.server_sys * 1e6 / self.completed.max(1) as f64
    }

    /// The user-time part of [`Run::cpu_us`], µs.
    fn user_us(&self) -> f64 {
        self.cpu_us() - self.sys_us()
    }

    /// Server context switches per answered query.
    fn switches_per_query(&self) -> f64 {
        self.switches as f64 / self.completed.max(1) as f64
    }

    /// dnsperf's CPU as a share of one core.
    fn client_share(&self) -> f64 {
        self.client_cpu / self.wall.max(1e-9)
    }

    /// The `q` quantile of the per-query latencies, ms.
    fn quantile(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let rank = (q * self.latencies.len() as f64).ceil() as usize;
        self.latencies[rank.clamp(1, self.latencies.len()) - 1]
    }
}

/// One dnsperf round against `server`; with `profile`, the server runs under
/// `perf record` for the round, writing that file.
fn dnsperf(
    server: &Server,
    file: &Path,
    opts: &Options,
    mode: Mode,
    ticks: f64,
    profile: Option<&Path>,
) -> anyhow::Result<Run> {
    let mut cmd = Command::new("dnsperf");
    cmd.args(["-s", "127.0.0.1", "-p", &server.addr.port().to_string()])
        .arg("-d")
        .arg(file)
        .args(["-c", &opts.clients.to_string(), "-T", "1"])
        .args([
            "-q",
            &opts.outstanding.to_string(),
            "-l",
            &opts.seconds.to_string(),
        ]);
    match mode {
        Mode::Udp => {}
        Mode::Tcp => {
            cmd.args(["-m", "tcp"]);
        }
        Mode::Rate(qps) => {
            cmd.args(["-Q", &qps.to_string(), "-v"]);
        }
    }
    if opts.edns {
        cmd.arg("-e");
    }
    let pid = server.child.id().to_string();
    let mut recorder = match profile {
        Some(path) => Some(
            Command::new("perf")
                .args(["record", "-q", "-g", "-e", "cpu-clock", "-p", &pid, "-o"])
                .arg(path)
                .args(["--", "sleep", &opts.seconds.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("cannot run perf record")?,
        ),
        None => None,
    };
    let switches_before = context_switches(server.child.id()).unwrap_or(0);
    let server_before = cpu_split(&pid).context("cannot read the server's /proc stat")?;
    let client_before = cpu_split("self").context("cannot read /proc/self/stat")?;
    let started = Instant::now();
    let out = cmd.output().context("cannot run dnsperf")?;
    let wall = started.elapsed().as_secs_f64();
    let server_after = cpu_split(&pid).context("cannot read the server's /proc stat")?;
    let client_after = cpu_split("self").context("cannot read /proc/self/stat")?;
    let switches_after = context_switches(server.child.id()).unwrap_or(0);
    if let Some(mut perf) = recorder.take() {
        let status = perf.wait()?;
        if !status.success() {
            bail!("perf record failed for {} ({status})", server.name);
        }
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "dnsperf failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let after = |key: &str| -> Option<&str> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(str::trim)
    };
    let num = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_digit() && c != '.')
            .parse::<f64>()
            .ok()
    };
    let count = |key: &str| -> u64 {
        after(key)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let qps = after("Queries per second:")
        .and_then(num)
        .context("no qps in dnsperf output")?;
    // "Average Latency (s):  0.000123 (min 0.000010, max 0.004567)"
    let lat = after("Average Latency (s):").unwrap_or_default();
    let mean = lat
        .split_whitespace()
        .next()
        .and_then(num)
        .unwrap_or(f64::NAN);
    let max = lat
        .split("max")
        .nth(1)
        .and_then(|s| num(s.trim_end_matches(')')))
        // dnsperf prints an uninitialised max when a TCP run ends with lost queries.
        .filter(|m| *m < 3600.0)
        .unwrap_or(f64::NAN);
    // -v: "> NOERROR host1.weave.local A 0.000123" per answered query.
    let mut latencies: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("> "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|s| s * 1000.0)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let user = |c: &crate::perf_util::CpuSplit| c.user + c.child_user;
    let sys = |c: &crate::perf_util::CpuSplit| c.sys + c.child_sys;
    let server_sys = sys(&server_after).saturating_sub(sys(&server_before));
    let server_ticks = user(&server_after).saturating_sub(user(&server_before)) + server_sys;
    let client_ticks = (client_after.child_user + client_after.child_sys)
        .saturating_sub(client_before.child_user + client_before.child_sys);
    Ok(Run {
        qps,
        mean_ms: mean * 1000.0,
        max_ms: max * 1000.0,
        lost: count("Queries lost:"),
        completed: count("Queries completed:"),
        server_cpu: server_ticks as f64 / ticks,
        server_sys: server_sys as f64 / ticks,
        switches: switches_after.saturating_sub(switches_before),
        client_cpu: client_ticks as f64 / ticks,
        wall,
        latencies,
    })
}

/// Runs the comparison.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    if opts.dwara.is_none() {
        crate::cargo(&["build", "--release", "-p", "dwara"])?;
    }
    crate::perf_util::in_scratch_dir("perf-dns", |dir| run_in(dir, &opts))
}

fn run_in(dir: &Path, opts: &Options) -> anyhow::Result<()> {
    std::fs::write(dir.join("empty-resolv.conf"), "")?;
    let data = data_set(opts.names);
    let records: usize = data.iter().map(|(_, a)| a.len()).sum();
    let lines = queries(&data, (opts.names * 4).max(20_000));
    let qfile = dir.join("queries.txt");
    std::fs::write(&qfile, lines.join("\n") + "\n")?;
    println!(
        "perf dns: {} names ({records} records), {} queries in the file, dnsperf -c {} -T 1 -q {} -l {}{}, \
         {} rounds of UDP{} and -Q {}{}",
        opts.names,
        lines.len(),
        opts.clients,
        opts.outstanding,
        opts.seconds,
        if opts.edns { " -e" } else { "" },
        opts.rounds,
        if opts.no_tcp { "" } else { ", TCP" },
        opts.rate,
        opts.batch
            .map(|b| format!(", dwara --dns-udp-batch {b}"))
            .unwrap_or_default()
    );

    let bin = opts.dwara.clone().unwrap_or_else(release_dwara);
    let (dwara, http) = start_dwara(dir, "dwara", &bin, opts, Ipv4Addr::LOCALHOST)?;
    let rss_before = rss_kib(dwara.child.id());
    let took = register(http, &data)?;
    let rss_loaded = rss_kib(dwara.child.id());
    println!(
        "dwara: {records} registrations over HTTP (keep-alive, sequential) in {:.2} s ({:.0}/s); \
         RSS {} KiB empty, {} KiB loaded",
        took.as_secs_f64(),
        records as f64 / took.as_secs_f64(),
        rss_before.unwrap_or(0),
        rss_loaded.unwrap_or(0)
    );
    let before = match &opts.before {
        Some(bin) => Some(start_loaded(
            dir,
            "dwara-before",
            bin,
            opts,
            Ipv4Addr::LOCALHOST,
            &data,
        )?),
        None => None,
    };
    let wildcard = if opts.wildcard {
        Some(start_loaded(
            dir,
            "dwara-wildcard",
            &bin,
            opts,
            Ipv4Addr::UNSPECIFIED,
            &data,
        )?)
    } else {
        None
    };
    let dnsmasq = start_dnsmasq(dir, &data)?;
    let unbound1 = start_unbound(dir, &data, 1)?;
    let unbound2 = start_unbound(dir, &data, 2)?;
    // 0 dwara, 1 dnsmasq, 2 unbound 1 thread, 3 unbound 2 threads, then
    // dwara-before and dwara-wildcard when asked for.
    let mut servers = vec![&dwara, &dnsmasq, &unbound1, &unbound2];
    servers.extend(before.as_ref());
    servers.extend(wildcard.as_ref());
    let wild = wildcard.as_ref().map(|_| servers.len() - 1);
    cross_check(&servers, &lines)?;
    println!(
        "answers cross-checked on {} queries: identical rcodes and counts",
        lines.len().min(200)
    );

    let ticks = clock_ticks();
    let mut udp: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
    let mut tcp: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
    let modes: &[Mode] = if opts.no_tcp {
        &[Mode::Udp]
    } else {
        &[Mode::Udp, Mode::Tcp]
    };
    for round in 1..=opts.rounds {
        for &mode in modes {
            let runs = if mode == Mode::Tcp {
                &mut tcp
            } else {
                &mut udp
            };
            for (i, s) in servers.iter().enumerate() {
                let r = dnsperf(s, &qfile, opts, mode, ticks, None)?;
                println!(
                    "  round {round} {:<4} {:<14} {:>9.0} qps  mean {:.3} ms  max {:.2} ms  lost {}  \
                     server {:.2} us/query (user {:.2} sys {:.2}) {:.2} cs/query  client {:.0}% of a core",
                    if mode == Mode::Tcp { "tcp" } else { "udp" },
                    s.name,
                    r.qps,
                    r.mean_ms,
                    r.max_ms,
                    r.lost,
                    r.cpu_us(),
                    r.user_us(),
                    r.sys_us(),
                    r.switches_per_query(),
                    r.client_share() * 100.0
                );
                runs[i].push(r);
            }
        }
    }
    // Fixed-load rounds, for the servers that sustain well above that load.
    let keep: Vec<bool> = udp
        .iter()
        .map(|rs| median(rs.iter().map(|r| r.qps).collect()) >= 1.25 * f64::from(opts.rate))
        .collect();
    let mut rate: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
    for round in 1..=opts.rounds {
        for (i, s) in servers.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            let r = dnsperf(s, &qfile, opts, Mode::Rate(opts.rate), ticks, None)?;
            println!(
                "  round {round} -Q {} {:<14} {:>9.0} qps  p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  \
                 lost {}  server {:.2} us/query (user {:.2} sys {:.2}) {:.2} cs/query",
                opts.rate,
                s.name,
                r.qps,
                r.quantile(0.5),
                r.quantile(0.99),
                r.quantile(0.999),
                r.lost,
                r.cpu_us(),
                r.user_us(),
                r.sys_us(),
                r.switches_per_query()
            );
            rate[i].push(r);
        }
    }
    let rss_after = rss_kib(dwara.child.id());
    if let Some(pdir) = &opts.profile {
        std::fs::create_dir_all(pdir)?;
        println!("\nprofiled UDP rounds (perf record -g -e cpu-clock; not in the medians):");
        for s in &servers {
            let file = pdir.join(format!("{}.perf.data", s.name));
            let r = dnsperf(s, &qfile, opts, Mode::Udp, ticks, Some(&file))?;
            println!(
                "  {:<14} {:>9.0} qps  server {:.2} us/query (user {:.2} sys {:.2})  {}",
                s.name,
                r.qps,
                r.cpu_us(),
                r.user_us(),
                r.sys_us(),
                file.display()
            );
        }
    }

    let med = |rs: &[Run], f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
    let table = |title: &str, runs: &[Vec<Run>]| -> Vec<(f64, f64)> {
        println!("\n{title}, median of {} rounds:", opts.rounds);
        println!(
            "  {:<14} {:>9} {:>9} {:>12} {:>10} {:>6} {:>11} {:>8} {:>8} {:>7} {:>12} {:>11}",
            "server",
            "qps",
            "mean ms",
            "median max",
            "worst max",
            "lost",
            "server us/q",
            "user",
            "sys",
            "cs/q",
            "client core",
            "dwara/this"
        );
        let dwara_qps = med(&runs[0], &|r| r.qps);
        let mut out = Vec::new();
        for (s, rs) in servers.iter().zip(runs) {
            let qps = med(rs, &|r| r.qps);
            let cpu = med(rs, &|r| r.cpu_us());
            println!(
                "  {:<14} {:>9.0} {:>9.3} {:>12.2} {:>10.2} {:>6} {:>11.2} {:>8.2} {:>8.2} {:>7.2} {:>11.0}% {:>10.2}x",
                s.name,
                qps,
                med(rs, &|r| r.mean_ms),
                med(rs, &|r| r.max_ms),
                rs.iter().map(|r| r.max_ms).fold(0.0, f64::max),
                rs.iter().map(|r| r.lost).sum::<u64>(),
                cpu,
                med(rs, &|r| r.user_us()),
                med(rs, &|r| r.sys_us()),
                med(rs, &|r| r.switches_per_query()),
                med(rs, &|r| r.client_share()) * 100.0,
                dwara_qps / qps
            );
            out.push((qps, cpu));
        }
        out
    };
    let u = table("UDP", &udp);
    let t = if opts.no_tcp {
        vec![(f64::NAN, f64::NAN); servers.len()]
    } else {
        table("TCP (dnsperf -m tcp)", &tcp)
    };
    println!(
        "\nfixed load: dnsperf -Q {} -v (per-query latencies), median of {} rounds:",
        opts.rate, opts.rounds
    );
    println!(
        "  {:<14} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>11} {:>8} {:>8} {:>7}",
        "server",
        "qps",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "lost",
        "server us/q",
        "user",
        "sys",
        "cs/q"
    );
    let mut p99 = vec![f64::NAN; servers.len()];
    for (i, (s, rs)) in servers.iter().zip(&rate).enumerate() {
        if rs.is_empty() {
            println!(
                "  {:<14} left out: saturates at {:.0} qps (< 1.25 x {})",
                s.name, u[i].0, opts.rate
            );
            continue;
        }
        p99[i] = med(rs, &|r| r.quantile(0.99));
        println!(
            "  {:<14} {:>9.0} {:>9.3} {:>9.3} {:>9.3} {:>9.2} {:>6} {:>11.2} {:>8.2} {:>8.2} {:>7.2}",
            s.name,
            med(rs, &|r| r.qps),
            med(rs, &|r| r.quantile(0.5)),
            p99[i],
            med(rs, &|r| r.quantile(0.999)),
            med(rs, &|r| r.max_ms),
            rs.iter().map(|r| r.lost).sum::<u64>(),
            med(rs, &|r| r.cpu_us()),
            med(rs, &|r| r.user_us()),
            med(rs, &|r| r.sys_us()),
            med(rs, &|r| r.switches_per_query()),
        );
    }
    let lost: u64 = udp[0]
        .iter()
        .chain(&tcp[0])
        .chain(&rate[0])
        .map(|r| r.lost)
        .sum();
    println!(
        "\ntargets (issue 14): qps dwara/unbound-2t {:.2}x (>= 1.25), dwara/dnsmasq {:.2}x (>= 1.8); \
         CPU per query dwara/unbound {:.2}x (<= 0.6, vs the leaner unbound); p99 dwara {:.3} ms vs unbound {:.3} ms \
         (<=); TCP qps dwara/unbound {:.2}x (>= 1.0, vs the faster unbound); dwara lost {lost} (0)",
        u[0].0 / u[3].0,
        u[0].0 / u[1].0,
        u[0].1 / u[2].1.min(u[3].1),
        p99[0],
        p99[2].min(p99[3]),
        t[0].0 / t[2].0.max(t[3].0),
    );
    if before.is_some() {
        println!(
            "dwara / dwara-before: UDP qps {:.2}x, UDP CPU per query {:.2}x, p99 at -Q {} {:.3} vs {:.3} ms, \
             TCP qps {:.2}x, TCP CPU per query {:.2}x",
            u[0].0 / u[4].0,
            u[0].1 / u[4].1,
            opts.rate,
            p99[0],
            p99[4],
            t[0].0 / t[4].0,
            t[0].1 / t[4].1,
        );
    }
    if let Some(w) = wild {
        let tcp = if opts.no_tcp {
            String::new()
        } else {
            format!(", TCP qps {:.2}x", t[w].0 / t[0].0)
        };
        println!(
            "dwara-wildcard / dwara: UDP qps {:.2}x, UDP CPU per query {:.2}x, p99 at -Q {} {:.3} vs {:.3} ms{tcp}",
            u[w].0 / u[0].0,
            u[w].1 / u[0].1,
            opts.rate,
            p99[w],
            p99[0],
        );
    }
    if opts.names >= 100_000 {
        println!(
            "targets at {} names: registration {:.1} s (<= 20 s for 100,000), RSS {:.1} MiB (<= 64)",
            opts.names,
            took.as_secs_f64(),
            rss_after.unwrap_or(0) as f64 / 1024.0
        );
    }
    println!(
        "dwara RSS after the runs: {} KiB ({:.1} MiB)",
        rss_after.unwrap_or(0),
        rss_after.unwrap_or(0) as f64 / 1024.0
    );
    Ok(())
}
