//! `cargo xtask perf dns`: dwara's name server vs dnsmasq and unbound under dnsperf.
//!
//! ```text
//! cargo xtask perf dns [--names N] [--rounds R] [--seconds S] [--workers W]
//!                      [--clients C] [--outstanding Q] [--edns]
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
//! 4. Runs `dnsperf -c C -T 1 -q Q -l S` against each server in turn, `R` rounds
//!    interleaved, and prints per server the median qps, mean and max latency, lost
//!    queries, dwara's ratio to each, and dwara's RSS.
//!
//! Everything listens on 127.0.0.1 only.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

struct Options {
    names: usize,
    rounds: usize,
    seconds: u32,
    workers: Option<usize>,
    clients: u32,
    outstanding: u32,
    edns: bool,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        names: 1000,
        rounds: 3,
        seconds: 10,
        workers: None,
        clients: 8,
        outstanding: 100,
        edns: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
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
            other => bail!(
                "unknown argument {other:?}; usage: cargo xtask perf dns [--names N] [--rounds R] \
                 [--seconds S] [--workers W] [--clients C] [--outstanding Q] [--edns]"
            ),
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

fn free_port() -> anyhow::Result<u16> {
    loop {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = udp.local_addr()?.port();
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
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

fn start_dwara(dir: &Path, opts: &Options) -> anyhow::Result<(Server, SocketAddr)> {
    let bin = workspace_root().join("target/release/dwara");
    let port = free_port()?;
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut cmd = Command::new(&bin);
    cmd.args([
        "serve",
        "--dns-listen",
        &addr.to_string(),
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
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    wait_dns(addr, &mut child, "dwara")?;
    Ok((
        Server {
            name: "dwara".into(),
            addr,
            child,
        },
        http,
    ))
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
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
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
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
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

#[derive(Debug, Clone, Copy, Default)]
struct Run {
    qps: f64,
    mean_ms: f64,
    max_ms: f64,
    lost: u64,
}

fn dnsperf(addr: SocketAddr, file: &Path, opts: &Options) -> anyhow::Result<Run> {
    let mut cmd = Command::new("dnsperf");
    cmd.args(["-s", "127.0.0.1", "-p", &addr.port().to_string()])
        .arg("-d")
        .arg(file)
        .args(["-c", &opts.clients.to_string(), "-T", "1"])
        .args([
            "-q",
            &opts.outstanding.to_string(),
            "-l",
            &opts.seconds.to_string(),
        ]);
    if opts.edns {
        cmd.arg("-e");
    }
    let out = cmd.output().context("cannot run dnsperf")?;
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
    let qps = after("Queries per second:")
        .and_then(num)
        .context("no qps in dnsperf output")?;
    let lost = after("Queries lost:")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
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
        .unwrap_or(f64::NAN);
    Ok(Run {
        qps,
        mean_ms: mean * 1000.0,
        max_ms: max * 1000.0,
        lost,
    })
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Runs the comparison.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    crate::cargo(&["build", "--release", "-p", "dwara"])?;
    let dir = std::env::temp_dir().join(format!("dwara-perf-dns-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(&dir, &opts);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(dir: &Path, opts: &Options) -> anyhow::Result<()> {
    std::fs::write(dir.join("empty-resolv.conf"), "")?;
    let data = data_set(opts.names);
    let records: usize = data.iter().map(|(_, a)| a.len()).sum();
    let lines = queries(&data, (opts.names * 4).max(20_000));
    let qfile = dir.join("queries.txt");
    std::fs::write(&qfile, lines.join("\n") + "\n")?;
    println!(
        "perf dns: {} names ({records} records), {} queries in the file, dnsperf -c {} -T 1 -q {} -l {}{}, {} rounds",
        opts.names,
        lines.len(),
        opts.clients,
        opts.outstanding,
        opts.seconds,
        if opts.edns { " -e" } else { "" },
        opts.rounds
    );

    let (dwara, http) = start_dwara(dir, opts)?;
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
    let dnsmasq = start_dnsmasq(dir, &data)?;
    let unbound1 = start_unbound(dir, &data, 1)?;
    let unbound2 = start_unbound(dir, &data, 2)?;
    let servers = [&dwara, &dnsmasq, &unbound1, &unbound2];
    cross_check(&servers, &lines)?;
    println!(
        "answers cross-checked on {} queries: identical rcodes and counts",
        lines.len().min(200)
    );

    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); servers.len()];
    for round in 1..=opts.rounds {
        for (i, s) in servers.iter().enumerate() {
            let r = dnsperf(s.addr, &qfile, opts)?;
            println!(
                "  round {round} {:<11} {:>9.0} qps  mean {:.3} ms  max {:.2} ms  lost {}",
                s.name, r.qps, r.mean_ms, r.max_ms, r.lost
            );
            runs[i].push(r);
        }
    }
    let rss_after = rss_kib(dwara.child.id());

    println!("\nmedian of {} rounds:", opts.rounds);
    println!(
        "  {:<11} {:>9} {:>10} {:>12} {:>10} {:>6} {:>12}",
        "server", "qps", "mean ms", "median max", "worst max", "lost", "dwara/this"
    );
    let dwara_qps = median(runs[0].iter().map(|r| r.qps).collect());
    let mut ratios = Vec::new();
    for (s, rs) in servers.iter().zip(&runs) {
        let qps = median(rs.iter().map(|r| r.qps).collect());
        ratios.push(dwara_qps / qps);
        println!(
            "  {:<11} {:>9.0} {:>10.3} {:>12.2} {:>10.2} {:>6} {:>11.2}x",
            s.name,
            qps,
            median(rs.iter().map(|r| r.mean_ms).collect()),
            median(rs.iter().map(|r| r.max_ms).collect()),
            rs.iter().map(|r| r.max_ms).fold(0.0, f64::max),
            rs.iter().map(|r| r.lost).sum::<u64>(),
            dwara_qps / qps
        );
    }
    let lost: u64 = runs[0].iter().map(|r| r.lost).sum();
    println!(
        "targets (issue 6): dwara/dnsmasq {:.2}x (>= 1.2), dwara/unbound {:.2}x (>= 1.0, vs the faster \
         unbound), dwara lost {lost} (0)",
        ratios[1],
        ratios[2].min(ratios[3]),
    );
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
