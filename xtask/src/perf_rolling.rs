//! `cargo xtask perf rolling`: backend instances replaced one by one, each killed
//! before its name is deleted, under a fixed-rate keep-alive client; the failed
//! requests of each proxy.
//!
//! ```text
//! cargo xtask perf rolling [--replacements N] [--rate R] [--clients C] [--dwara PATH]
//!                          [--keep-logs DIR]
//! ```
//!
//! 1. Starts `dwara serve` (release build) with its name server (domain
//!    `perf.local`, TTL 1) and two upstreams on the name `web.perf.local`: one
//!    `protocol: http` (`dwara-http-push`) and one TCP (`dwara-l4`), both fed by
//!    push from the records database. A second `dwara serve` without a name server
//!    (`dwara-http-polled`) polls the first one's DNS every second. HAProxy 2.6
//!    `mode http` (`resolvers` on dwara's DNS, `hold valid 1s`, a
//!    `server-template` of 6, `retry-on all-retryable-errors`, `retries 3`,
//!    `option redispatch`) and Caddy 2.6 (`reverse_proxy` with `dynamic a` on
//!    dwara's DNS, `refresh 1s`, `lb_try_duration 2s`) resolve the same name.
//! 2. Three backend instances (nginx, one process each, `master_process off`, on
//!    127.0.0.10.. sharing a port) are registered under the name over dwara's HTTP
//!    API.
//! 3. Every proxy gets `C` keep-alive clients (default 4) sending `GET /tiny` at a
//!    fixed total rate of `R` requests per second (default 500), raw HTTP/1.1 over
//!    one TCP connection each, no retries: an error, a closed connection or a
//!    non-200 answer is a failed request, and the client reconnects.
//! 4. `N` replacements (default 9): a new instance starts and is registered; 2 s
//!    later the oldest is killed (SIGKILL); 2 s later its name is deleted; 1 s
//!    pause.
//! 5. Prints the requests and failed requests of each proxy.
//!
//! `--keep-logs DIR` writes each proxy's standard error to `DIR/NAME.stderr`
//! (`dwara-a`, `dwara-b`, `haproxy`, `caddy`) and leaves it there; the dwara
//! processes log at `DWARA_LOG` when it is set (`warn` otherwise), so
//! `DWARA_LOG=dwara_proxy=debug` keeps the reason of every 5xx dwara made.
//!
//! Everything listens on 127.0.0.x only, in a temporary directory removed at the end.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::perf_l4::{Proc, local};
use crate::perf_util::{free_port, parse_flags, release_dwara};

const USAGE: &str = "usage: cargo xtask perf rolling [--replacements N] [--rate R] \
                     [--clients C] [--dwara PATH] [--keep-logs DIR]";

struct Options {
    replacements: usize,
    rate: u32,
    clients: u32,
    dwara: Option<PathBuf>,
    /// Where each proxy's standard error is written and kept.
    keep_logs: Option<PathBuf>,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let f = parse_flags(
        args,
        &[
            "--replacements",
            "--rate",
            "--clients",
            "--dwara",
            "--keep-logs",
        ],
        USAGE,
    )?;
    Ok(Options {
        replacements: f.count("--replacements", 9)?,
        rate: f.count("--rate", 500)?,
        clients: f.count("--clients", 4)?,
        dwara: f.path("--dwara"),
        keep_logs: f.path("--keep-logs"),
    })
}

/// Runs the scenario.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    if let Some(logs) = &opts.keep_logs {
        std::fs::create_dir_all(logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
    }
    crate::tools::ensure_perf_http()?;
    if opts.dwara.is_none() {
        crate::cargo(&["build", "--release", "-p", "dwara"])?;
    }
    crate::perf_util::in_scratch_dir("perf-rolling", |dir| run_in(dir, &opts))
}

/// One backend instance: a single nginx process on `ip:port`.
fn start_instance(dir: &Path, ip: Ipv4Addr, port: u16) -> anyhow::Result<Proc> {
    let name = format!("web-{ip}");
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nuser root;\npid {dir}/{name}.pid;\n\
             error_log {dir}/{name}.log warn;\nevents {{ worker_connections 4000; }}\n\
             http {{\n  access_log off;\n  keepalive_requests 1000000000;\n  \
             keepalive_timeout 300s;\n  server {{\n    listen {ip}:{port};\n    \
             location = /tiny {{ return 200 \"ok\\n\"; }}\n  }}\n}}\n",
            dir = dir.display()
        ),
    )?;
    let mut p = Proc::spawn(
        &name,
        dir,
        Command::new("nginx")
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf),
    )?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect((ip, port)).is_err() {
        if Instant::now() > deadline || p.child.try_wait()?.is_some() {
            bail!("backend {ip}:{port} did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(p)
}

/// The registration API of the name server.
struct Names {
    client: reqwest::blocking::Client,
    http: String,
}

impl Names {
    fn put(&self, id: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        let r = self
            .client
            .put(format!("http://{}/name/{id}/{ip}", self.http))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("fqdn=web.perf.local")
            .send()?;
        if r.status().as_u16() != 204 {
            bail!("PUT {id} {ip}: {}", r.status());
        }
        Ok(())
    }

    fn delete(&self, id: &str, ip: Ipv4Addr) -> anyhow::Result<()> {
        let r = self
            .client
            .delete(format!("http://{}/name/{id}/{ip}", self.http))
            .send()?;
        if !r.status().is_success() {
            bail!("DELETE {id} {ip}: {}", r.status());
        }
        Ok(())
    }
}

fn wait_port(port: u16, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        if Instant::now() > deadline {
            bail!("{what} does not listen on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The proxy processes, the `(name, port)` of each route through them, and the
/// registration API.
struct Started {
    _procs: Vec<Proc>,
    routes: Vec<(&'static str, u16)>,
    names: Names,
}

/// The proxies: both dwara processes, HAProxy, Caddy.
fn start_proxies(dir: &Path, opts: &Options, port: u16) -> anyhow::Result<Started> {
    let bin = opts.dwara.clone().unwrap_or_else(release_dwara);
    let logs = opts.keep_logs.as_deref().unwrap_or(dir);
    // `DWARA_LOG` passes through (e.g. `dwara_proxy=debug` with `--keep-logs`).
    let level = std::env::var("DWARA_LOG").unwrap_or_else(|_| "warn".to_owned());
    let [dns, http_a, http_b, push, l4, polled, hap, caddy] =
        [0; 8].map(|_| free_port(Ipv4Addr::LOCALHOST));
    let (dns, http_a, http_b) = (dns?, http_a?, http_b?);
    let (push, l4, polled, hap, caddy) = (push?, l4?, polled?, hap?, caddy?);
    let disc = |ns: &str| {
        format!(
            "    dns_discovery:\n      hostname: web.perf.local\n      port: {port}\n      \
             refresh_interval_s: 1\n{ns}"
        )
    };
    let a = dir.join("dwara-a.yaml");
    std::fs::write(
        &a,
        format!(
            "nameserver:\n  domain: perf.local\n  dns_listen: {dns}\n  ttl: 1\n  \
             fallback: [127.0.0.1:9]\nupstreams:\n  - name: http-push\n    listen: {push}\n    \
             protocol: http\n    connect_timeout_ms: 500\n{d}  - name: l4\n    listen: {l4}\n    \
             connect_timeout_ms: 500\n{d}",
            dns = local(dns),
            push = local(push),
            l4 = local(l4),
            d = disc(""),
        ),
    )?;
    let b = dir.join("dwara-b.yaml");
    std::fs::write(
        &b,
        format!(
            "upstreams:\n  - name: http-polled\n    listen: {polled}\n    protocol: http\n    \
             connect_timeout_ms: 500\n{d}",
            polled = local(polled),
            d = disc(&format!("      nameservers: [{}]\n", local(dns))),
        ),
    )?;
    let dwara = |name: &str, conf: &Path, http: u16| {
        Proc::spawn(
            name,
            logs,
            Command::new(&bin)
                .args(["serve", "--docker", "off", "--config"])
                .arg(conf)
                .args(["--http-listen", &local(http)])
                .env("DWARA_LOG", &level),
        )
    };
    let mut procs = vec![dwara("dwara-a", &a, http_a)?];
    wait_port(http_a, "dwara-a")?;
    procs.push(dwara("dwara-b", &b, http_b)?);
    let hcfg = dir.join("haproxy.cfg");
    std::fs::write(
        &hcfg,
        format!(
            "global\n  nbthread 1\n  maxconn 4000\ndefaults\n  mode http\n  timeout connect 500ms\n  \
             timeout client 300s\n  timeout server 300s\n  retries 3\n  option redispatch 1\n  \
             retry-on all-retryable-errors\nresolvers dwara\n  nameserver dwara {dns}\n  \
             hold valid 1s\n  hold obsolete 0s\nfrontend f\n  bind {listen}\n  default_backend b\n\
             backend b\n  server-template s 6 web.perf.local:{port} resolvers dwara \
             resolve-prefer ipv4 init-addr none\n",
            dns = local(dns),
            listen = local(hap),
        ),
    )?;
    procs.push(Proc::spawn(
        "haproxy",
        logs,
        Command::new("haproxy").arg("-db").arg("-f").arg(&hcfg),
    )?);
    let ccfg = dir.join("Caddyfile");
    std::fs::write(
        &ccfg,
        format!(
            "{{\n  admin off\n  auto_https off\n}}\n\
             http://127.0.0.1:{caddy} {{\n  bind 127.0.0.1\n  reverse_proxy {{\n    dynamic a {{\n      \
             name web.perf.local\n      port {port}\n      refresh 1s\n      resolvers {dns}\n    }}\n    \
             lb_try_duration 2s\n    lb_try_interval 50ms\n  }}\n}}\n",
            dns = local(dns),
        ),
    )?;
    procs.push(Proc::spawn(
        "caddy",
        logs,
        Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&ccfg)
            .env("HOME", dir)
            .env("XDG_DATA_HOME", dir)
            .env("XDG_CONFIG_HOME", dir),
    )?);
    let names = Names {
        client: reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(5))
            .no_proxy()
            .build()?,
        http: local(http_a),
    };
    let routes = vec![
        ("dwara-http-push", push),
        ("dwara-http-polled", polled),
        ("dwara-l4", l4),
        ("haproxy", hap),
        ("caddy", caddy),
    ];
    Ok(Started {
        _procs: procs,
        routes,
        names,
    })
}

/// Requests and failures of one proxy.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    /// Failures by what the client saw (a status line or an I/O error kind).
    why: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Tally {
    fn fail(&self, why: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.why.lock() {
            *m.entry(why).or_default() += 1;
        }
    }
}

/// One `GET /tiny` on a kept connection: `Ok(None)` on a 200, else the status line.
fn request(conn: &mut Option<BufReader<TcpStream>>, port: u16) -> std::io::Result<Option<String>> {
    if conn.is_none() {
        let s = TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_secs(2),
        )?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        *conn = Some(BufReader::new(s));
    }
    let Some(r) = conn.as_mut() else {
        return Ok(Some("no connection".to_owned()));
    };
    r.get_mut()
        .write_all(b"GET /tiny HTTP/1.1\r\nHost: web.perf.local\r\n\r\n")?;
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let ok = line.starts_with("HTTP/1.1 200");
    let status = line.trim().to_owned();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body)?;
    Ok((!ok).then_some(status))
}

/// A keep-alive client at `rate` requests per second until `stop`.
fn client(port: u16, rate: f64, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut next = Instant::now();
    let mut conn = None;
    while !stop.load(Ordering::Relaxed) {
        match request(&mut conn, port) {
            Ok(None) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Some(status)) => {
                tally.fail(status);
                conn = None;
            }
            Err(e) => {
                tally.fail(format!("{:?}", e.kind()));
                conn = None;
            }
        }
        next += gap;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
}

fn run_in(dir: &Path, opts: &Options) -> anyhow::Result<()> {
    // Three to start with, then one per replacement.
    let ips: Vec<Ipv4Addr> = (0..opts.replacements + 3)
        .map(|i| Ipv4Addr::new(127, 0, 0, 10 + u8::try_from(i).unwrap_or(200)))
        .collect();
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let Started {
        _procs,
        routes,
        names,
    } = start_proxies(dir, opts, port)?;
    let mut live: Vec<(Proc, Ipv4Addr)> = Vec::new();
    for (i, ip) in ips[..3].iter().enumerate() {
        live.push((start_instance(dir, *ip, port)?, *ip));
        names.put(&format!("web{i}"), *ip)?;
    }
    for (name, p) in &routes {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conn = None;
        while !matches!(request(&mut conn, *p), Ok(None)) {
            conn = None;
            if Instant::now() > deadline {
                bail!("{name} does not answer on {p}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    println!(
        "perf rolling: {} replacements of 3 instances, {} keep-alive clients per proxy at {} req/s in all",
        opts.replacements, opts.clients, opts.rate
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let tallies: Vec<Arc<Tally>> = routes.iter().map(|_| Arc::default()).collect();
    for ((_, p), t) in routes.iter().zip(&tallies) {
        for _ in 0..opts.clients {
            let (t, stop, p) = (t.clone(), stop.clone(), *p);
            let rate = f64::from(opts.rate) / f64::from(opts.clients);
            threads.push(std::thread::spawn(move || client(p, rate, t, stop)));
        }
    }
    let started = Instant::now();
    for (k, ip) in ips[3..].iter().enumerate() {
        let id = k + 3;
        live.push((start_instance(dir, *ip, port)?, *ip));
        names.put(&format!("web{id}"), *ip)?;
        std::thread::sleep(Duration::from_secs(2));
        let (old, old_ip) = live.remove(0);
        let old_id = id - 3;
        let _ = Command::new("kill")
            .args(["-KILL", &old.child.id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(2));
        names.delete(&format!("web{old_id}"), old_ip)?;
        drop(old);
        std::thread::sleep(Duration::from_secs(1));
        println!(
            "  replaced {old_ip} by {ip} ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    println!(
        "\nfailed requests ({} replacements, each instance killed 2 s before its name was deleted):",
        opts.replacements
    );
    for ((name, _), t) in routes.iter().zip(&tallies) {
        let ok = t.ok.load(Ordering::Relaxed);
        let failed = t.failed.load(Ordering::Relaxed);
        let why = t.why.lock().map(|m| format!("{m:?}")).unwrap_or_default();
        println!(
            "  {name:<18} {failed:>6} failed of {:>7}  {why}",
            ok + failed
        );
    }
    if let Some(logs) = &opts.keep_logs {
        println!(
            "\nthe proxies' standard error is kept in {}",
            logs.display()
        );
    }
    Ok(())
}
