//! `cargo xtask perf l4`: dwara's L4 upstreams vs HAProxy and nginx `stream`.
//!
//! ```text
//! cargo xtask perf l4 [--rounds R] [--seconds S] [--idle N] [--threads T]
//!                     [--proxies dwara,dwara-1t,haproxy-1t,haproxy-2t,nginx-stream]
//!                     [--before PATH] [--dwara PATH]
//! ```
//!
//! 1. Installs nginx-light, nginx's stream module, HAProxy and wrk when missing.
//! 2. Starts one backend, nginx (one worker, `return 200` for `/tiny`, a 1 MiB static
//!    file for `/1m`, keep-alive without a request limit), and in front of it:
//!    `dwara serve` (release build) whose upstream follows `backend.perf.local`
//!    through dwara's own name server (the name is registered over its HTTP API),
//!    once with its defaults (`dwara`, an L4 worker thread per core) and once with
//!    `--l4-workers 1 --worker-threads 1` (`dwara-1t`: one thread forwards, the
//!    pairing for HAProxy's `nbthread 1`),
//!    HAProxy (`mode tcp`, `option splice-auto`, the server resolved through dwara's
//!    name server with `resolvers`) with `nbthread 1` and with `nbthread 2`, and
//!    nginx `stream` (one worker, `proxy_pass` to the backend address).
//! 3. RSS per 1,000 idle connections: on each fresh proxy, opens `N` connections
//!    (default 1,000) that send nothing, and compares the proxy's RSS (master and
//!    workers summed) with and without them.
//! 4. `R` interleaved rounds (default 5) of three wrk loads of `S` seconds each
//!    (default 5), every proxy in every round: keep-alive requests (32 connections,
//!    a 3-byte body), a new connection per request (32 connections, `Connection:
//!    close`), 1 MiB bodies (8 connections). Each run records the rate, the proxy's
//!    CPU (user + system from `/proc/PID/stat`, its worker processes included) per
//!    request, connection or MiB, wrk's p99 latency (`--latency`) and its errors.
//! 5. Prints the medians per load and proxy and the ratios dwara ÷ HAProxy.
//!
//! `--before PATH` adds a second dwara, `dwara-before`, run from another build of
//! the binary (a copy of an earlier `target/release/dwara`): a change to the
//! forwarding path is then measured before and after in the same rounds. `--dwara
//! PATH` runs that binary as `dwara` instead of building the release binary.
//!
//! Everything listens on 127.0.0.1 only; the configurations live in a temporary
//! directory that is removed at the end.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::perf_util::{clock_ticks, free_port, median, parse_flags, release_dwara, rss_kib};
use anyhow::{Context, bail};

const USAGE: &str = "usage: cargo xtask perf l4 [--rounds R] [--seconds S] [--idle N] \
                     [--threads T] [--proxies dwara,dwara-1t,haproxy-1t,haproxy-2t,nginx-stream] \
                     [--before PATH] [--dwara PATH]";
const ALL_PROXIES: &[&str] = &[
    "dwara",
    "dwara-1t",
    "haproxy-1t",
    "haproxy-2t",
    "nginx-stream",
];
const BODY: usize = 1 << 20;

#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) rounds: usize,
    pub(crate) seconds: u32,
    pub(crate) idle: usize,
    pub(crate) threads: u32,
    pub(crate) proxies: Vec<String>,
    pub(crate) before: Option<PathBuf>,
    pub(crate) dwara: Option<PathBuf>,
    /// The proxy under test on CPU 0, wrk and the backend on the others
    /// ([`Pinning`]); `None`: wherever the scheduler puts them.
    pub(crate) pin: Option<Pinning>,
    /// The process that keeps the proxies' CPU busy at idle priority (`perf http
    /// --keep-busy`): the time it takes counts as idle in [`Run::idle`].
    pub(crate) spinner: Option<u32>,
}

/// Where `--pin` puts the processes of a run: each proxy on a core of its own, the
/// client and the backend on the rest, so no round depends on where the scheduler
/// happened to place the three (which moves the rate by ±10% from round to round on
/// two cores, a proxy sharing a core with wrk or the backend being preempted by them).
#[derive(Debug, Clone)]
pub(crate) struct Pinning {
    /// `taskset -c` list for the proxies.
    pub(crate) proxy: String,
    /// `taskset -c` list for wrk and the backend.
    pub(crate) rest: String,
}

impl Pinning {
    /// CPU 0 for the proxy and 1..n for the rest; an error on a machine with one CPU.
    pub(crate) fn new() -> anyhow::Result<Self> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            bail!("--pin needs at least 2 CPUs, this machine lets us use {cpus}");
        }
        let rest = if cpus == 2 {
            "1".to_owned()
        } else {
            format!("1-{}", cpus - 1)
        };
        Ok(Self {
            proxy: "0".to_owned(),
            rest,
        })
    }
}

/// A CPU quota for the proxies (`perf http --quota`): a cgroup of the `cpu`
/// controller whose processes together get `percent`% of one CPU per period of
/// 10 ms, so that the proxy, not wrk and the backend, bounds the rate, and the
/// rates compare what each proxy serves with the same CPU. cgroup v2
/// (`cpu.max`) or v1 (`cpu.cfs_quota_us`); removed on drop, once the processes in
/// it have ended.
#[derive(Debug)]
pub(crate) struct Quota {
    dir: PathBuf,
}

impl Quota {
    /// The period of the quota, µs.
    const PERIOD_US: u32 = 10_000;

    pub(crate) fn new(percent: u32) -> anyhow::Result<Self> {
        let name = format!("xtask-perf-{}", std::process::id());
        let budget = Self::PERIOD_US / 100 * percent;
        let period = Self::PERIOD_US.to_string();
        let (dir, files) = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            // The root enables the controller for its children; refused when it
            // cannot, which writing `cpu.max` then tells.
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu");
            let max = format!("{budget} {period}");
            (
                Path::new("/sys/fs/cgroup").join(name),
                vec![("cpu.max", max)],
            )
        } else {
            let files = vec![
                ("cpu.cfs_period_us", period),
                ("cpu.cfs_quota_us", budget.to_string()),
            ];
            (Path::new("/sys/fs/cgroup/cpu").join(name), files)
        };
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "--quota needs root and the cgroup cpu controller (v2 at /sys/fs/cgroup, \
                 v1 at /sys/fs/cgroup/cpu): mkdir {}",
                dir.display()
            )
        })?;
        let quota = Self { dir };
        for (file, value) in files {
            let path = quota.dir.join(file);
            std::fs::write(&path, value)
                .with_context(|| format!("--quota: writing {}", path.display()))?;
        }
        Ok(quota)
    }
}

impl Drop for Quota {
    fn drop(&mut self) {
        // The processes were stopped before; a dying one keeps the cgroup busy a
        // moment longer.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let f = parse_flags(
        args,
        &[
            "--rounds",
            "--seconds",
            "--idle",
            "--threads",
            "--proxies",
            "--before",
            "--dwara",
        ],
        USAGE,
    )?;
    let proxies: Vec<String> = match f.text("--proxies") {
        Some(list) => list.split(',').map(str::to_owned).collect(),
        None => ALL_PROXIES.iter().map(|p| (*p).to_owned()).collect(),
    };
    if let Some(bad) = proxies.iter().find(|p| !ALL_PROXIES.contains(&p.as_str())) {
        bail!("unknown proxy {bad:?}; known: {}", ALL_PROXIES.join(","));
    }
    if !proxies.iter().any(|p| p == "dwara") {
        bail!("--proxies must include dwara (the ratios are dwara's)");
    }
    Ok(Options {
        rounds: f.count("--rounds", 5)?,
        seconds: f.count("--seconds", 5)?,
        idle: f.count("--idle", 1000)?,
        threads: f.count("--threads", 1)?,
        proxies,
        before: f.path("--before"),
        dwara: f.path("--dwara"),
        pin: None,
        spinner: None,
    })
}

/// A process under test; killed on drop.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    stderr: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first, so nginx's master stops its workers: a SIGKILLed master
        // leaves them running, with every file they inherited (quiet.sh's lock).
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub(crate) fn spawn(name: &str, dir: &Path, cmd: &mut Command) -> anyhow::Result<Self> {
        let stderr = dir.join(format!("{name}.stderr"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("cannot start {name} ({cmd:?})"))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            stderr,
        })
    }

    /// Waits until `GET /tiny` through `port` answers 200.
    pub(crate) fn wait_http(&mut self, port: u16) -> anyhow::Result<()> {
        self.wait_answer(port, "HTTP/1.1 200")
    }

    /// Waits until the answer to `GET /tiny` through `port` starts with `status`.
    pub(crate) fn wait_answer(&mut self, port: u16, status: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited during startup ({status}): {}",
                    self.name,
                    std::fs::read_to_string(&self.stderr)
                        .unwrap_or_default()
                        .trim()
                );
            }
            if get_tiny(port).is_ok_and(|head| head.starts_with(status)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "{} did not answer on port {port}: {}",
            self.name,
            std::fs::read_to_string(&self.stderr)
                .unwrap_or_default()
                .trim()
        )
    }

    /// User + system clock ticks of the process and its children (nginx workers).
    pub(crate) fn cpu_ticks(&self) -> u64 {
        tree(self.child.id())
            .iter()
            .filter_map(|pid| stat_fields(*pid))
            .map(|f| f.utime + f.stime)
            .sum()
    }

    /// Puts every thread of the process and of its children on the CPUs `cpus`
    /// (a `taskset -c` list).
    pub(crate) fn pin(&self, cpus: &str) -> anyhow::Result<()> {
        for pid in tree(self.child.id()) {
            let out = Command::new("taskset")
                .args(["-a", "-p", "-c", cpus, &pid.to_string()])
                .output()
                .context("cannot run taskset (util-linux)")?;
            if !out.status.success() {
                bail!(
                    "taskset -a -p -c {cpus} {pid} ({}) failed: {}",
                    self.name,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(())
    }

    /// Puts the process and its children (every thread) under `quota`.
    pub(crate) fn limit(&self, quota: &Quota) -> anyhow::Result<()> {
        for pid in tree(self.child.id()) {
            std::fs::write(quota.dir.join("cgroup.procs"), pid.to_string()).with_context(|| {
                format!(
                    "--quota: moving {} ({pid}) into {}",
                    self.name,
                    quota.dir.display()
                )
            })?;
        }
        Ok(())
    }

    /// Involuntary context switches of the process and its children (every thread).
    pub(crate) fn preemptions(&self) -> u64 {
        tree(self.child.id())
            .iter()
            .map(|pid| crate::perf_util::preemptions(*pid))
            .sum()
    }

    /// Resident memory of the process and its children, KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        tree(self.child.id())
            .iter()
            .filter_map(|pid| rss_kib(*pid))
            .sum()
    }
}

fn get_tiny(port: u16) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(1),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(b"GET /tiny HTTP/1.1\r\nHost: perf\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

struct Stat {
    ppid: u32,
    utime: u64,
    stime: u64,
    /// The scheduling policy (`SCHED_IDLE` is 5), where the kernel gives it.
    policy: Option<u32>,
}

/// `/proc/PID/stat` fields 4, 14, 15 and 41 (the name in parentheses may hold
/// spaces, so count after it).
fn stat_fields(pid: u32) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        utime: f.get(11)?.parse().ok()?,
        stime: f.get(12)?.parse().ok()?,
        policy: f.get(38).and_then(|p| p.parse().ok()),
    })
}

/// Whether `pid` runs under the scheduling policy `SCHED_IDLE`.
pub(crate) fn runs_at_idle_priority(pid: u32) -> bool {
    const SCHED_IDLE: u32 = 5;
    stat_fields(pid).and_then(|s| s.policy) == Some(SCHED_IDLE)
}

/// `pid` and its direct children.
fn tree(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            if let Some(child) = entry.file_name().to_str().and_then(|n| n.parse().ok())
                && stat_fields(child).is_some_and(|s| s.ppid == pid)
            {
                out.push(child);
            }
        }
    }
    out
}

/// nginx in the foreground with `conf`, its prefix (logs, temp files) in `dir`.
pub(crate) fn spawn_nginx(name: &str, dir: &Path, conf: &Path) -> anyhow::Result<Proc> {
    Proc::spawn(
        name,
        dir,
        Command::new("nginx").arg("-p").arg(dir).arg("-c").arg(conf),
    )
}

pub(crate) fn local(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

pub(crate) fn nginx_head(dir: &Path, name: &str) -> String {
    // Run as root (no user switch) so the worker reads the temporary directory.
    format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\nuser root;\n\
         pid {dir}/{name}.pid;\nerror_log {dir}/{name}.log warn;\n\
         worker_rlimit_nofile 20000;\nevents {{ worker_connections 9000; }}\n",
        dir = dir.display()
    )
}

pub(crate) fn start_backend(dir: &Path) -> anyhow::Result<(Proc, u16)> {
    let www = dir.join("www");
    std::fs::create_dir_all(&www)?;
    std::fs::write(www.join("1m"), vec![b'x'; BODY])?;
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let conf = dir.join("backend.conf");
    std::fs::write(
        &conf,
        format!(
            "{head}http {{\n  access_log off;\n  default_type application/octet-stream;\n  \
             sendfile on;\n  tcp_nopush on;\n  tcp_nodelay on;\n  keepalive_requests 1000000000;\n  \
             keepalive_timeout 300s;\n  server {{\n    listen {addr};\n    root {www};\n    \
             location = /tiny {{ return 200 \"ok\\n\"; }}\n  }}\n}}\n",
            head = nginx_head(dir, "backend"),
            addr = local(port),
            www = www.display()
        ),
    )?;
    let mut p = spawn_nginx("backend", dir, &conf)?;
    p.wait_http(port)?;
    Ok((p, port))
}

/// A proxy under test: its process and its listening port.
pub(crate) struct Proxy {
    pub(crate) proc: Proc,
    pub(crate) port: u16,
    /// A port of the same process whose route has nothing to route to (its
    /// answers are the proxy's own 503s), for [`Load::NoEndpoints`].
    pub(crate) empty: Option<u16>,
}

/// `dwara serve` from `bin`, named `name`, with its own name server on `dns`.
pub(crate) fn start_dwara(
    dir: &Path,
    name: &str,
    bin: &Path,
    backend: u16,
    dns: u16,
    one_thread: bool,
) -> anyhow::Result<Proxy> {
    start_dwara_with(dir, name, bin, (backend, dns), one_thread, false)
}

/// [`start_dwara`], its upstream `protocol: http` when `http` is set, with a
/// second HTTP upstream `empty` beside it (on [`Proxy::empty`]) that follows a
/// name without addresses, so it has nothing to route to.
pub(crate) fn start_dwara_with(
    dir: &Path,
    name: &str,
    bin: &Path,
    ports: (u16, u16),
    one_thread: bool,
    http_upstreams: bool,
) -> anyhow::Result<Proxy> {
    start_dwara_under(&[], dir, name, bin, ports, one_thread, http_upstreams)
}

/// [`start_dwara_with`], run by the command line `wrapper` when it is not empty
/// (`valgrind --tool=callgrind …`: the wrapper's process is dwara's).
pub(crate) fn start_dwara_under(
    wrapper: &[String],
    dir: &Path,
    name: &str,
    bin: &Path,
    (backend, dns): (u16, u16),
    one_thread: bool,
    http_upstreams: bool,
) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let http = free_port(Ipv4Addr::LOCALHOST)?;
    let empty = if http_upstreams {
        Some(free_port(Ipv4Addr::LOCALHOST)?)
    } else {
        None
    };
    let upstream = |name: &str, listen: u16, host: &str| {
        format!(
            "  - name: {name}\n    listen: {listen}\n{protocol}    dns_discovery:\n      \
             hostname: {host}.perf.local\n      port: {backend}\n      refresh_interval_s: 1\n      \
             nameservers: [{dns}]\n",
            listen = local(listen),
            protocol = if http_upstreams {
                "    protocol: http\n"
            } else {
                ""
            },
            dns = local(dns),
        )
    };
    let mut upstreams = upstream("backend", port, "backend");
    if let Some(empty) = empty {
        upstreams.push_str(&upstream("empty", empty, "empty"));
    }
    let conf = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &conf,
        format!(
            "nameserver:\n  domain: perf.local\n  dns_listen: {dns}\n  ttl: 1\n  fallback: [127.0.0.1:9]\n\
             upstreams:\n{upstreams}",
            dns = local(dns),
        ),
    )?;
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(["serve", "--docker", "off", "--config"])
        .arg(&conf)
        .args(["--http-listen", &local(http)])
        .env("DWARA_LOG", "warn");
    if one_thread {
        cmd.args(["--l4-workers", "1", "--worker-threads", "1"]);
    }
    let mut proc = Proc::spawn(name, dir, &mut cmd)?;
    // The upstream's only endpoint comes from dwara's own name server.
    register_backend(&mut proc, name, http)?;
    proc.wait_http(port)?;
    if let Some(empty) = empty {
        proc.wait_answer(empty, "HTTP/1.1 503")?;
    }
    Ok(Proxy { proc, port, empty })
}

/// Registers `backend.perf.local` at 127.0.0.1 in the name server of `proc`, a
/// `dwara serve` starting up with its HTTP API on `http`, once that API answers
/// (within 60 s).
pub(crate) fn register_backend(proc: &mut Proc, name: &str, http: u16) -> anyhow::Result<()> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .no_proxy()
        .build()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = proc.child.try_wait()? {
            bail!("{name} exited during startup ({status})");
        }
        let put = client
            .put(format!("http://{}/name/backend/127.0.0.1", local(http)))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("fqdn=backend.perf.local")
            .send();
        match put {
            Ok(r) if r.status().as_u16() == 204 => return Ok(()),
            Ok(r) => bail!("registering backend.perf.local failed: {}", r.status()),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e).with_context(|| format!("{name}'s HTTP API did not answer")),
        }
    }
}

fn start_haproxy(dir: &Path, backend: u16, dns: u16, threads: u32) -> anyhow::Result<Proxy> {
    let name = format!("haproxy-{threads}t");
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let conf = dir.join(format!("{name}.cfg"));
    std::fs::write(
        &conf,
        format!(
            "global\n  nbthread {threads}\n  maxconn 4000\n\
             defaults\n  mode tcp\n  option splice-auto\n  timeout connect 5s\n  \
             timeout client 300s\n  timeout server 300s\n\
             resolvers dwara\n  nameserver dwara {dns}\n  hold valid 1s\n\
             frontend f\n  bind {listen}\n  default_backend b\n\
             backend b\n  server s1 backend.perf.local:{backend} resolvers dwara \
             resolve-prefer ipv4 init-addr none\n",
            dns = local(dns),
            listen = local(port),
        ),
    )?;
    let mut proc = Proc::spawn(
        &name,
        dir,
        Command::new("haproxy").arg("-db").arg("-f").arg(&conf),
    )?;
    proc.wait_http(port)?;
    Ok(Proxy {
        proc,
        port,
        empty: None,
    })
}

fn start_nginx_stream(dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let conf = dir.join("nginx-stream.conf");
    std::fs::write(
        &conf,
        format!(
            "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n{head}\
             stream {{\n  server {{\n    listen {listen};\n    proxy_pass {backend};\n  }}\n}}\n",
            head = nginx_head(dir, "nginx-stream"),
            listen = local(port),
            backend = local(backend),
        ),
    )?;
    let mut proc = spawn_nginx("nginx-stream", dir, &conf)?;
    proc.wait_http(port)?;
    Ok(Proxy {
        proc,
        port,
        empty: None,
    })
}

/// One of the wrk loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Load {
    KeepAlive,
    NewConnection,
    Bodies,
    /// One keep-alive connection to a route with nothing to route to: every
    /// answer is the proxy's own 503, and with one request at a time the
    /// latencies are the proxy's time to make it (plus the client's round trip).
    NoEndpoints,
    /// Keep-alive requests on 16 connections, for `perf http-instructions`: under
    /// callgrind, 32 connections batch differently from run to run, and the
    /// instructions per request of one build differ by about 1% (16: 0.5%).
    Counted,
    /// A new connection per request on 16 connections, for `perf
    /// http-instructions --new-connections`.
    CountedConnections,
}

impl Load {
    /// The loads of `perf l4`.
    pub(crate) const ALL: [Load; 3] = [Load::KeepAlive, Load::NewConnection, Load::Bodies];

    pub(crate) fn title(self) -> &'static str {
        match self {
            Load::KeepAlive => "keep-alive requests, 32 conns, tiny body",
            Load::NewConnection => "a new connection per request, 32 conns",
            Load::Bodies => "1 MiB bodies, 8 conns",
            Load::NoEndpoints => "503 with nothing to route to, 1 keep-alive conn",
            Load::Counted => "keep-alive requests, 16 conns, tiny body",
            Load::CountedConnections => "a new connection per request, 16 conns",
        }
    }

    /// The unit of work of a rate and of the CPU per unit.
    pub(crate) fn unit(self) -> &'static str {
        match self {
            Load::KeepAlive | Load::Counted => "req",
            Load::NewConnection | Load::CountedConnections => "conn",
            Load::Bodies => "MiB",
            Load::NoEndpoints => "503",
        }
    }

    fn args(self) -> Vec<&'static str> {
        match self {
            Load::KeepAlive => vec!["-c", "32", "/tiny"],
            Load::NewConnection => vec!["-c", "32", "-H", "Connection: close", "/tiny"],
            Load::Bodies => vec!["-c", "8", "/1m"],
            Load::NoEndpoints => vec!["-c", "1", "/tiny"],
            Load::Counted => vec!["-c", "16", "/tiny"],
            Load::CountedConnections => vec!["-c", "16", "-H", "Connection: close", "/tiny"],
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Run {
    /// Units of work wrk counted.
    pub(crate) units: f64,
    /// Units of work per second.
    pub(crate) rate: f64,
    /// Proxy CPU per unit, µs.
    pub(crate) cpu_us: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) errors: u64,
    /// The backend's CPU per unit, µs (its workers included).
    pub(crate) backend_us: f64,
    /// wrk's CPU per unit, µs.
    pub(crate) client_us: f64,
    /// The share of the machine's CPU time (every core) that was idle during the run.
    pub(crate) idle: f64,
    /// The proxy's involuntary context switches per 1,000 units: how often the
    /// scheduler gave its CPU to another process (wrk or the backend, woken by it)
    /// while it still had work.
    pub(crate) preempted: f64,
}

/// (idle, total) clock ticks of every core since boot: the first line of
/// `/proc/stat` (idle counts `iowait` too).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    (idle, f.iter().sum())
}

/// CPU ticks of this process's waited-for children (wrk, once it has been waited for).
fn children_ticks() -> u64 {
    crate::perf_util::cpu_ticks("self").map_or(0, |(_, children)| children)
}

/// "12.34MB" (wrk's binary units) in bytes.
fn bytes(s: &str) -> Option<f64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let scale = match unit {
        "" | "B" => 1.0,
        "KB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        "TB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n.parse::<f64>().ok()? * scale)
}

/// "1.23ms" in milliseconds.
fn millis(s: &str) -> Option<f64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let scale = match unit {
        "us" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        "h" => 3600e3,
        _ => return None,
    };
    Some(n.parse::<f64>().ok()? * scale)
}

pub(crate) fn wrk(
    proxy: &Proxy,
    backend: &Proc,
    load: Load,
    opts: &Options,
    ticks: f64,
) -> anyhow::Result<Run> {
    let mut args = load.args();
    let path = args.pop().unwrap_or("/tiny");
    let port = match load {
        Load::NoEndpoints => proxy
            .empty
            .with_context(|| format!("{} has no route without endpoints", proxy.proc.name))?,
        _ => proxy.port,
    };
    let url = format!("http://{}{path}", local(port));
    let before = proxy.proc.cpu_ticks();
    let preempted_before = proxy.proc.preemptions();
    let backend_before = backend.cpu_ticks();
    let client_before = children_ticks();
    let spinner_ticks = || {
        opts.spinner
            .and_then(|pid| crate::perf_util::cpu_ticks(&pid.to_string()))
            .map_or(0, |(own, _)| own)
    };
    let spinner_before = spinner_ticks();
    let machine_before = machine_ticks();
    let mut cmd = match &opts.pin {
        Some(pin) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &pin.rest, "wrk"]);
            c
        }
        None => Command::new("wrk"),
    };
    let out = cmd
        .args(["--latency", "-t", &opts.threads.to_string()])
        .args(["-d", &format!("{}s", opts.seconds)])
        .args(&args)
        .arg(&url)
        .output()
        .context("cannot run wrk")?;
    let after = proxy.proc.cpu_ticks();
    let preempted = proxy.proc.preemptions().saturating_sub(preempted_before);
    let backend_cpu = backend.cpu_ticks().saturating_sub(backend_before) as f64 / ticks;
    let client_cpu = children_ticks().saturating_sub(client_before) as f64 / ticks;
    let machine_after = machine_ticks();
    // The spinner's time is time the core would otherwise have been idle.
    let spun = spinner_ticks().saturating_sub(spinner_before);
    let idle = (machine_after.0.saturating_sub(machine_before.0) + spun) as f64
        / (machine_after.1.saturating_sub(machine_before.1) as f64).max(1.0);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("wrk failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    }
    // "  123456 requests in 5.00s, 12.34MB read"
    let summary = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .context("no request count in wrk's output")?;
    let words: Vec<&str> = summary.split_whitespace().collect();
    let requests: f64 = words.first().and_then(|w| w.parse().ok()).unwrap_or(0.0);
    let secs = words
        .get(3)
        .and_then(|w| w.trim_end_matches(',').strip_suffix('s'))
        .and_then(|w| w.parse::<f64>().ok())
        .context("no duration in wrk's output")?;
    let read = words.get(4).and_then(|w| bytes(w)).unwrap_or(0.0);
    let units = match load {
        Load::Bodies => read / (1024.0 * 1024.0),
        Load::KeepAlive
        | Load::NewConnection
        | Load::NoEndpoints
        | Load::Counted
        | Load::CountedConnections => requests,
    };
    let percentile = |p: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(p))
            .and_then(|v| millis(v.trim()))
            .unwrap_or(f64::NAN)
    };
    let (p50_ms, p99_ms) = (percentile("50%"), percentile("99%"));
    // "Socket errors: connect 0, read 0, write 0, timeout 0" and non-2xx answers
    // (which are the point of the 503 load: there, the other answers are errors).
    let mut errors = 0;
    let mut non_2xx = 0;
    for l in text.lines().map(str::trim) {
        if let Some(rest) = l.strip_prefix("Socket errors:") {
            errors += rest
                .split(',')
                .filter_map(|p| p.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
        if let Some(rest) = l.strip_prefix("Non-2xx or 3xx responses:") {
            non_2xx += rest.trim().parse::<u64>().unwrap_or(0);
        }
    }
    errors += match load {
        Load::NoEndpoints => (requests as u64).saturating_sub(non_2xx),
        _ => non_2xx,
    };
    let cpu = after.saturating_sub(before) as f64 / ticks;
    Ok(Run {
        units,
        rate: units / secs.max(1e-9),
        cpu_us: cpu * 1e6 / units.max(1e-9),
        p50_ms,
        p99_ms,
        errors,
        backend_us: backend_cpu * 1e6 / units.max(1e-9),
        client_us: client_cpu * 1e6 / units.max(1e-9),
        idle,
        preempted: preempted as f64 * 1000.0 / units.max(1e-9),
    })
}

/// `opts.rounds` interleaved rounds of `loads` through every proxy, each run
/// printed as it ends: `runs[load][proxy]` holds one [`Run`] per round. Within a
/// load the order of the proxies is rotated per round, so no proxy always runs
/// right after the same one; a proxy without a route for a load
/// ([`Load::NoEndpoints`] without [`Proxy::empty`]) is left out of it.
pub(crate) fn rounds(
    proxies: &[Proxy],
    backend: &Proc,
    loads: &[Load],
    opts: &Options,
) -> anyhow::Result<Vec<Vec<Vec<Run>>>> {
    let ticks = clock_ticks();
    let mut runs: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); proxies.len()]; loads.len()];
    for round in 0..opts.rounds {
        for (l, load) in loads.iter().enumerate() {
            for k in 0..proxies.len() {
                let i = (k + round) % proxies.len();
                let p = &proxies[i];
                if *load == Load::NoEndpoints && p.empty.is_none() {
                    continue;
                }
                let r = wrk(p, backend, *load, opts, ticks)?;
                let unit = load.unit();
                println!(
                    "  round {} {unit:<5} {:<13} {:>10.1} {unit}/s  {:>8.2} us CPU/{unit}  p50 {:>7.3} ms  p99 {:>7.3} ms  errors {}",
                    round + 1,
                    p.proc.name,
                    r.rate,
                    r.cpu_us,
                    r.p50_ms,
                    r.p99_ms,
                    r.errors
                );
                runs[l][i].push(r);
            }
        }
    }
    Ok(runs)
}

/// KiB of proxy RSS per 1,000 idle connections.
fn idle_rss(proxy: &Proxy, n: usize) -> anyhow::Result<f64> {
    let before = proxy.proc.rss_kib();
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        open.push(
            TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, proxy.port)))
                .with_context(|| format!("cannot open idle connections to {}", proxy.proc.name))?,
        );
    }
    // Each proxy dials the backend and sets up its state after the accept: give it
    // a moment to do so for all of them.
    std::thread::sleep(Duration::from_secs(2));
    let with = proxy.proc.rss_kib();
    drop(open);
    Ok(with.saturating_sub(before) as f64 * 1000.0 / n as f64)
}

/// Runs the comparison.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    crate::tools::ensure_perf_l4()?;
    if opts.dwara.is_none() {
        crate::cargo(&["build", "--release", "-p", "dwara"])?;
    }
    crate::perf_util::in_scratch_dir("perf-l4", |dir| run_in(dir, &opts))
}

fn run_in(dir: &Path, opts: &Options) -> anyhow::Result<()> {
    let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "perf l4: wrk --latency -t {} -d {}s through each proxy to nginx, {} interleaved rounds; \
         {} idle connections for RSS; load average at start: {}",
        opts.threads,
        opts.seconds,
        opts.rounds,
        opts.idle,
        load_avg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let (backend_proc, backend) = start_backend(dir)?;
    let mut proxies: Vec<Proxy> = Vec::new();
    let dns = free_port(Ipv4Addr::LOCALHOST)?;
    // dwara first: HAProxy resolves the backend through dwara's name server.
    for name in ALL_PROXIES {
        if !opts.proxies.iter().any(|p| p == name) {
            continue;
        }
        let p = match *name {
            "dwara" => {
                let bin = opts.dwara.clone().unwrap_or_else(release_dwara);
                start_dwara(dir, name, &bin, backend, dns, false)?
            }
            "dwara-1t" => {
                // Its own name server: every dwara serves the backend name itself.
                let bin = opts.dwara.clone().unwrap_or_else(release_dwara);
                let dns = free_port(Ipv4Addr::LOCALHOST)?;
                start_dwara(dir, name, &bin, backend, dns, true)?
            }
            "haproxy-1t" => start_haproxy(dir, backend, dns, 1)?,
            "haproxy-2t" => start_haproxy(dir, backend, dns, 2)?,
            _ => start_nginx_stream(dir, backend)?,
        };
        proxies.push(p);
    }
    if let Some(bin) = &opts.before {
        let dns = free_port(Ipv4Addr::LOCALHOST)?;
        proxies.push(start_dwara(dir, "dwara-before", bin, backend, dns, false)?);
    }

    let mut idle = Vec::new();
    for p in &proxies {
        let kib = idle_rss(p, opts.idle)?;
        println!(
            "  {:<13} RSS {:>7} KiB fresh, +{kib:.0} KiB per 1,000 idle connections",
            p.proc.name,
            p.proc.rss_kib()
        );
        idle.push(kib);
    }

    let runs = rounds(&proxies, &backend_proc, &Load::ALL, opts)?;

    let med = |rs: &[Run], f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
    let hap = proxies.iter().position(|p| p.proc.name == "haproxy-1t");
    // The ratios against HAProxy-1t: dwara as configured by default, and dwara on one
    // L4 worker and one runtime thread (the like-for-like pairing), when it ran.
    let ours: Vec<(usize, &str)> = proxies
        .iter()
        .enumerate()
        .filter(|(_, p)| p.proc.name == "dwara" || p.proc.name == "dwara-1t")
        .map(|(i, p)| (i, p.proc.name.as_str()))
        .collect();
    let mut targets: Vec<Vec<String>> = vec![Vec::new(); ours.len()];
    for (l, load) in Load::ALL.iter().enumerate() {
        println!("\n{}, median of {} rounds:", load.title(), opts.rounds);
        println!(
            "  {:<13} {:>12} {:>14} {:>9} {:>7} {:>11} {:>10}",
            "proxy",
            format!("{}/s", load.unit()),
            format!("us CPU/{}", load.unit()),
            "p99 ms",
            "errors",
            "dwara rate",
            "dwara CPU"
        );
        let dwara = &runs[l][0];
        for (p, rs) in proxies.iter().zip(&runs[l]) {
            println!(
                "  {:<13} {:>12.1} {:>14.2} {:>9.3} {:>7} {:>10.2}x {:>9.2}x",
                p.proc.name,
                med(rs, &|r| r.rate),
                med(rs, &|r| r.cpu_us),
                med(rs, &|r| r.p99_ms),
                rs.iter().map(|r| r.errors).sum::<u64>(),
                med(dwara, &|r| r.rate) / med(rs, &|r| r.rate),
                med(dwara, &|r| r.cpu_us) / med(rs, &|r| r.cpu_us),
            );
        }
        if let Some(h) = hap {
            let h = &runs[l][h];
            for ((i, _), t) in ours.iter().zip(&mut targets) {
                let d = &runs[l][*i];
                t.push(format!(
                    "{}: rate {:.2}x (>= 1.1), CPU/{} {:.2}x (<= 1), p99 {:.2}x (<= 1)",
                    load.unit(),
                    med(d, &|r| r.rate) / med(h, &|r| r.rate),
                    load.unit(),
                    med(d, &|r| r.cpu_us) / med(h, &|r| r.cpu_us),
                    med(d, &|r| r.p99_ms) / med(h, &|r| r.p99_ms),
                ));
            }
        }
    }
    println!("\nRSS per 1,000 idle connections (fresh processes):");
    for (p, kib) in proxies.iter().zip(&idle) {
        println!("  {:<13} {kib:>8.0} KiB", p.proc.name);
    }
    if let Some(h) = hap {
        for ((i, name), t) in ours.iter().zip(&mut targets) {
            t.push(format!(
                "idle RSS {:.2}x (<= 1)",
                idle[*i] / idle[h].max(1e-9)
            ));
            println!(
                "\ntargets (issue 16), {name} / haproxy-1t: {}",
                t.join("; ")
            );
        }
    }
    Ok(())
}
