//! `cargo xtask perf http`: dwara's HTTP upstreams vs HAProxy `mode http`, nginx
//! `proxy_pass` and Caddy `reverse_proxy`.
//!
//! ```text
//! cargo xtask perf http [--rounds R] [--seconds S] [--threads T] [--dwara PATH]
//!                        [--before PATH] [--pin] [--loads LIST] [--quota PERCENT]
//!                        [--keep-busy]
//! ```
//!
//! 1. Installs nginx-light, HAProxy, Caddy and wrk when missing.
//! 2. Starts the backend of `perf l4` (nginx, one worker: `return 200` for `/tiny`,
//!    a 1 MiB static file for `/1m`) and in front of it: `dwara serve` (release
//!    build) with a `protocol: http` upstream that follows `backend.perf.local`
//!    through its own name server, with its defaults (`dwara`: an L4 worker per
//!    core) and with `--l4-workers 1 --worker-threads 1` (`dwara-1t`); HAProxy
//!    `mode http`, `nbthread 1`, `http-reuse always`; nginx (one worker) with
//!    `proxy_pass` to an `upstream` with a `keepalive 64` pool; Caddy
//!    `reverse_proxy` (its own defaults: Go's runtime on every core, a keep-alive
//!    pool). Each does to a request what dwara's HTTP upstream does: `Host` passed
//!    through, `X-Forwarded-For` appended, `X-Forwarded-Proto` set (HAProxy:
//!    `option forwardfor` and `http-request set-header`; nginx: `proxy_set_header`
//!    of the three; Caddy does all three by default), so that every proxy writes
//!    the same request to the backend. Each dwara has a second `protocol: http`
//!    upstream, `empty`, that follows a name with no addresses; HAProxy a second
//!    frontend whose backend has no server: both answer 503 there.
//! 3. `R` interleaved rounds (default 5) of four wrk loads of `S` seconds (default
//!    5), every proxy in every round, the order rotated per round: keep-alive
//!    requests (32 connections), a new client connection per request (32
//!    connections, `Connection: close`), 1 MiB bodies (8 connections), and the
//!    503 with nothing to route to (one keep-alive connection, one request at a
//!    time, so the latencies are the time to make the 503; dwara and HAProxy
//!    only). Each run records the rate, the proxy's CPU per request or MiB (user +
//!    system from `/proc/PID/stat`, worker processes included), wrk's p50 and p99
//!    and errors (on the 503 load, answers that were not an error); also the
//!    backend's and wrk's CPU per unit, the share of the machine left idle
//!    (`/proc/stat`) and the proxy's involuntary context switches, since the rate
//!    is bounded by the whole chain on two cores.
//! 4. Prints the medians and the ratios of `dwara-1t` and `dwara` to each other
//!    proxy, and the median of `dwara-1t`'s rate divided by each proxy's in the
//!    same round (`paired`: steadier than the ratio of medians on a machine whose
//!    speed drifts from round to round); under it, per proxy, the backend's and
//!    wrk's CPU per unit, the three together (`chain`), the machine's busy time
//!    per unit (cores × busy share ÷ rate), its idle share, and how often the
//!    proxy was preempted (its involuntary context switches per 1,000 units, from
//!    `/proc/PID/task/*/status`); and under that, per proxy, `dwara-1t`'s rate
//!    divided by its round by round: the lowest, the highest, and in how many
//!    rounds `dwara-1t` was ahead (a ratio above 1), the geometric mean of those
//!    ratios and its 95% confidence interval (Student's t over their logarithms,
//!    each round taken as one sample). Where the lowest is below 1 and the highest
//!    above, the two are level within the rounds' spread; where the whole interval
//!    is above 1, `dwara-1t` is ahead beyond it.
//!
//! `--loads LIST` runs only the loads named (comma-separated, in the order above:
//! `keep-alive`, `new-connection`, `bodies`, `503`), so that more rounds of one
//! load fit in the same time and narrow its interval.
//!
//! `--quota PERCENT` puts every proxy (all its processes and threads) in a cgroup
//! that gets `PERCENT`% of one CPU per 10 ms ([`Quota`]). Pinned on two cores, a
//! proxy's core and the core of wrk and the backend are both nearly busy, and the
//! rate is bounded by whichever runs out first, often wrk and the backend's; under
//! a quota well below a core the proxy alone bounds the rate, and the rates
//! compare what each proxy serves with the same CPU.
//!
//! `--keep-busy` (with `--pin`) keeps the proxies' CPU busy with a process that
//! spins at idle priority (`SCHED_IDLE`, `cargo xtask perf spin` under `chrt
//! --idle 0`): it runs only when no proxy can, and a proxy woken takes the CPU
//! from it at once. Without it, a proxy held to its quota leaves its CPU idle for
//! the rest of each period, and on a virtual machine an idle CPU is handed back to
//! the host, which runs other work there and leaves the proxy's caches cold: every
//! proxy then spends several µs more per request, the more the larger its working
//! set. The spinner's time counts as idle in the printed idle share.
//!
//! `--before PATH` adds `dwara-1t-before`: `dwara-1t` run from another build (the
//! one before a change), in the same rounds, so that the `dwara-1t` ratios on its
//! row compare the two builds under the same load.
//!
//! Everything listens on 127.0.0.1 only, in a temporary directory removed at the end.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::perf_l4::{
    Load, Options, Pinning, Proc, Proxy, Quota, Run, local, nginx_head, rounds,
    runs_at_idle_priority, spawn_nginx, start_backend, start_dwara_with,
};
use crate::perf_util::{free_port, median, parse_flags, release_dwara};

const USAGE: &str = "usage: cargo xtask perf http [--rounds R] [--seconds S] [--threads T] \
                     [--dwara PATH] [--before PATH] [--pin] \
                     [--loads keep-alive,new-connection,bodies,503] [--quota PERCENT] \
                     [--keep-busy]";
const PROXIES: [&str; 5] = ["dwara-1t", "dwara", "haproxy-1t", "nginx", "caddy"];

/// The loads of `perf http`: those of `perf l4` and the 503 without endpoints.
const LOADS: [Load; 4] = [
    Load::KeepAlive,
    Load::NewConnection,
    Load::Bodies,
    Load::NoEndpoints,
];

/// The name of each of [`LOADS`] for `--loads`, in the same order.
const LOAD_NAMES: [&str; 4] = ["keep-alive", "new-connection", "bodies", "503"];

/// The loads `--loads` names, in the order of [`LOADS`]; all of them without it.
fn parse_loads(list: Option<&str>) -> anyhow::Result<Vec<Load>> {
    let Some(list) = list else {
        return Ok(LOADS.to_vec());
    };
    let mut wanted = Vec::new();
    for name in list.split(',').map(str::trim) {
        let Some(i) = LOAD_NAMES.iter().position(|n| *n == name) else {
            anyhow::bail!("--loads: unknown load {name:?}; {USAGE}");
        };
        wanted.push(LOADS[i]);
    }
    Ok(LOADS.into_iter().filter(|l| wanted.contains(l)).collect())
}

fn parse_args(args: &[String]) -> anyhow::Result<(Options, Selection)> {
    let switch = |name: &str| args.iter().any(|a| a == name);
    let (pin, keep_busy) = (switch("--pin"), switch("--keep-busy"));
    if keep_busy && !pin {
        anyhow::bail!("--keep-busy keeps the proxies' CPU busy: it needs --pin; {USAGE}");
    }
    let args: Vec<String> = args
        .iter()
        .filter(|a| *a != "--pin" && *a != "--keep-busy")
        .cloned()
        .collect();
    let f = parse_flags(
        &args,
        &[
            "--rounds",
            "--seconds",
            "--threads",
            "--dwara",
            "--before",
            "--loads",
            "--quota",
        ],
        USAGE,
    )?;
    let loads = parse_loads(f.text("--loads"))?;
    let quota: Option<u32> = f
        .text("--quota")
        .map(|_| f.count("--quota", 100))
        .transpose()?;
    if let Some(q) = quota.filter(|q| *q > 100) {
        anyhow::bail!("--quota {q}: at most 100 (% of one CPU)");
    }
    let opts = Options {
        rounds: f.count("--rounds", 5)?,
        seconds: f.count("--seconds", 5)?,
        idle: 0,
        threads: f.count("--threads", 1)?,
        proxies: Vec::new(),
        before: f.path("--before"),
        dwara: f.path("--dwara"),
        pin: if pin { Some(Pinning::new()?) } else { None },
        spinner: None,
    };
    Ok((
        opts,
        Selection {
            loads,
            quota,
            keep_busy,
        },
    ))
}

/// What `perf http` runs beside [`Options`]: the loads, and the proxies' CPU quota.
#[derive(Debug)]
struct Selection {
    loads: Vec<Load>,
    /// `--quota`: the percent of one CPU each proxy gets.
    quota: Option<u32>,
    /// `--keep-busy`: the proxies' CPU kept busy at idle priority.
    keep_busy: bool,
}

/// `cargo xtask perf spin`: spins until it is stopped. `perf http --keep-busy`
/// runs it at idle priority on the proxies' CPU, so that the CPU never idles.
pub(crate) fn spin_main(args: &[String]) -> anyhow::Result<()> {
    if !args.is_empty() {
        anyhow::bail!("usage: cargo xtask perf spin (no arguments)");
    }
    loop {
        std::hint::spin_loop();
    }
}

/// Starts [`spin_main`] at idle priority on the CPUs `cpus`, once it is seen to
/// run under `SCHED_IDLE` (within 10 s).
fn start_spinner(dir: &Path, cpus: &str) -> anyhow::Result<Proc> {
    let exe = std::env::current_exe().context("cannot find the xtask executable")?;
    let mut cmd = Command::new("chrt");
    cmd.args(["--idle", "0", "taskset", "-c", cpus])
        .arg(exe)
        .args(["perf", "spin"]);
    let mut spinner = Proc::spawn("spinner", dir, &mut cmd)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !runs_at_idle_priority(spinner.child.id()) {
        if let Some(status) = spinner.child.try_wait()? {
            anyhow::bail!("--keep-busy: the spinner exited ({status}); {cmd:?}");
        }
        if Instant::now() > deadline {
            anyhow::bail!("--keep-busy: the spinner is not under SCHED_IDLE after 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(spinner)
}

fn start_haproxy(dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
    start_haproxy_under(&[], dir, backend)
}

/// HAProxy-1t as [`start_haproxy`] starts it, run by `wrapper` (a program and its
/// arguments, before HAProxy's own) when there is one.
pub(crate) fn start_haproxy_under(
    wrapper: &[String],
    dir: &Path,
    backend: u16,
) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let empty = free_port(Ipv4Addr::LOCALHOST)?;
    let conf = dir.join("haproxy-http.cfg");
    std::fs::write(
        &conf,
        format!(
            "global\n  nbthread 1\n  maxconn 4000\n\
             defaults\n  mode http\n  http-reuse always\n  option forwardfor\n  \
             timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n\
             frontend f\n  bind {listen}\n  http-request set-header X-Forwarded-Proto http\n  \
             default_backend b\n\
             backend b\n  server s1 {backend}\n\
             frontend e\n  bind {empty}\n  default_backend none\n\
             backend none\n",
            listen = local(port),
            empty = local(empty),
            backend = local(backend),
        ),
    )?;
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg("haproxy");
            c
        }
        None => Command::new("haproxy"),
    };
    let mut proc = Proc::spawn("haproxy-1t", dir, cmd.arg("-db").arg("-f").arg(&conf))?;
    proc.wait_http(port)?;
    proc.wait_answer(empty, "HTTP/1.1 503")?;
    Ok(Proxy {
        proc,
        port,
        empty: Some(empty),
    })
}

fn start_nginx(dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let conf = dir.join("nginx-http.conf");
    std::fs::write(
        &conf,
        format!(
            "{head}http {{\n  access_log off;\n  upstream b {{\n    server {backend};\n    \
             keepalive 64;\n  }}\n  server {{\n    listen {listen};\n    location / {{\n      \
             proxy_pass http://b;\n      proxy_http_version 1.1;\n      \
             proxy_set_header Connection \"\";\n      proxy_set_header Host $http_host;\n      \
             proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n      \
             proxy_set_header X-Forwarded-Proto $scheme;\n    }}\n  }}\n}}\n",
            head = nginx_head(dir, "nginx-http"),
            listen = local(port),
            backend = local(backend),
        ),
    )?;
    let mut proc = spawn_nginx("nginx", dir, &conf)?;
    proc.wait_http(port)?;
    Ok(Proxy {
        proc,
        port,
        empty: None,
    })
}

fn start_caddy(dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let mut proc = spawn_caddy(dir, &format!("http://127.0.0.1:{port}"), backend)?;
    proc.wait_http(port)?;
    Ok(Proxy {
        proc,
        port,
        empty: None,
    })
}

/// Caddy 2.6 serving `site` (e.g. `http://127.0.0.1:PORT`) on 127.0.0.1 as a
/// `reverse_proxy` to `backend`, without its admin endpoint or automatic HTTPS.
pub(crate) fn spawn_caddy(dir: &Path, site: &str, backend: u16) -> anyhow::Result<Proc> {
    let conf = dir.join("Caddyfile");
    std::fs::write(
        &conf,
        format!(
            "{{\n  admin off\n  auto_https off\n}}\n\
             {site} {{\n  bind 127.0.0.1\n  reverse_proxy {backend}\n}}\n",
            backend = local(backend),
        ),
    )?;
    Proc::spawn(
        "caddy",
        dir,
        Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&conf)
            .env("HOME", dir)
            .env("XDG_DATA_HOME", dir)
            .env("XDG_CONFIG_HOME", dir),
    )
}

/// Runs the comparison.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let (opts, selection) = parse_args(args)?;
    crate::tools::ensure_perf_http()?;
    if opts.dwara.is_none() {
        crate::cargo(&["build", "--release", "-p", "dwara"])?;
    }
    crate::perf_util::in_scratch_dir("perf-http", |dir| run_in(dir, &opts, &selection))
}

fn start(dir: &Path, name: &str, opts: &Options, backend: u16) -> anyhow::Result<Proxy> {
    let bin = opts.dwara.clone().unwrap_or_else(release_dwara);
    match name {
        "dwara" | "dwara-1t" => {
            let dns = free_port(Ipv4Addr::LOCALHOST)?;
            start_dwara_with(dir, name, &bin, (backend, dns), name == "dwara-1t", true)
        }
        "haproxy-1t" => start_haproxy(dir, backend),
        "nginx" => start_nginx(dir, backend),
        _ => start_caddy(dir, backend),
    }
}

fn run_in(dir: &Path, opts: &Options, selection: &Selection) -> anyhow::Result<()> {
    let loads = &selection.loads[..];
    // Made before the proxies, so dropped after they have been stopped.
    let quota = selection.quota.map(Quota::new).transpose()?;
    let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "perf http: wrk --latency -t {} -d {}s through each proxy to nginx, {} interleaved \
         rounds{}; load average at start: {}",
        opts.threads,
        opts.seconds,
        opts.rounds,
        match &opts.pin {
            Some(p) => format!(
                "; each proxy pinned to CPU {}, wrk and the backend to CPU {}",
                p.proxy, p.rest
            ),
            None => String::new(),
        } + &match selection.quota {
            Some(q) => format!("; each proxy limited to {q}% of one CPU"),
            None => String::new(),
        } + if selection.keep_busy {
            "; the proxies' CPU kept busy at idle priority"
        } else {
            ""
        },
        load_avg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let (backend_proc, backend) = start_backend(dir)?;
    let mut proxies = PROXIES
        .iter()
        .map(|name| start(dir, name, opts, backend))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(bin) = &opts.before {
        let dns = free_port(Ipv4Addr::LOCALHOST)?;
        let name = "dwara-1t-before";
        proxies.push(start_dwara_with(
            dir,
            name,
            bin,
            (backend, dns),
            true,
            true,
        )?);
    }
    if let Some(pin) = &opts.pin {
        backend_proc.pin(&pin.rest)?;
        for p in &proxies {
            p.proc.pin(&pin.proxy)?;
        }
    }
    if let Some(quota) = &quota {
        for p in &proxies {
            p.proc.limit(quota)?;
        }
    }
    let spinner = match (&opts.pin, selection.keep_busy) {
        (Some(pin), true) => Some(start_spinner(dir, &pin.proxy)?),
        _ => None,
    };
    let opts = &Options {
        spinner: spinner.as_ref().map(|s| s.child.id()),
        ..opts.clone()
    };
    let runs = rounds(&proxies, &backend_proc, loads, opts)?;
    drop(spinner);
    report(&proxies, loads, &runs, opts);
    Ok(())
}

fn report(proxies: &[Proxy], loads: &[Load], runs: &[Vec<Vec<Run>>], opts: &Options) {
    // For the machine's busy time per unit: cores × (1 − idle) ÷ rate.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let med = |rs: &[Run], f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
    for (l, load) in loads.iter().enumerate() {
        println!("\n{}, median of {} rounds:", load.title(), opts.rounds);
        println!(
            "  {:<15} {:>12} {:>14} {:>8} {:>8} {:>7} {:>13} {:>13} {:>11} {:>15}",
            "proxy",
            format!("{}/s", load.unit()),
            format!("us CPU/{}", load.unit()),
            "p50 ms",
            "p99 ms",
            "errors",
            "dwara-1t rate",
            "dwara-1t CPU",
            "dwara rate",
            "dwara-1t paired"
        );
        let one = &runs[l][0];
        let all = &runs[l][1];
        for (p, rs) in proxies.iter().zip(&runs[l]) {
            if rs.is_empty() {
                continue;
            }
            let paired = RoundByRound::of(one, rs).map_or(f64::NAN, |s| s.median);
            println!(
                "  {:<15} {:>12.1} {:>14.2} {:>8.3} {:>8.3} {:>7} {:>12.2}x {:>12.2}x {:>10.2}x {:>14.2}x",
                p.proc.name,
                med(rs, &|r| r.rate),
                med(rs, &|r| r.cpu_us),
                med(rs, &|r| r.p50_ms),
                med(rs, &|r| r.p99_ms),
                rs.iter().map(|r| r.errors).sum::<u64>(),
                med(one, &|r| r.rate) / med(rs, &|r| r.rate),
                med(one, &|r| r.cpu_us) / med(rs, &|r| r.cpu_us),
                med(all, &|r| r.rate) / med(rs, &|r| r.rate),
                paired,
            );
        }
        // Where the rest of the machine's CPU went in the same runs: the proxy's rate is
        // bounded by the whole chain (wrk, the proxy, nginx behind it) on two cores, so
        // a proxy that costs the backend or the client more per request is slower even
        // at the same CPU of its own.
        println!(
            "  {:<15} {:>14} {:>14} {:>14} {:>14} {:>8} {:>16}",
            "",
            format!("backend us/{}", load.unit()),
            format!("wrk us/{}", load.unit()),
            format!("chain us/{}", load.unit()),
            format!("machine us/{}", load.unit()),
            "idle",
            format!("preempted/k{}", load.unit()),
        );
        for (p, rs) in proxies.iter().zip(&runs[l]) {
            if rs.is_empty() {
                continue;
            }
            println!(
                "  {:<15} {:>14.2} {:>14.2} {:>14.2} {:>14.2} {:>7.1}% {:>16.1}",
                p.proc.name,
                med(rs, &|r| r.backend_us),
                med(rs, &|r| r.client_us),
                med(rs, &|r| r.cpu_us + r.backend_us + r.client_us),
                med(rs, &|r| cores * (1.0 - r.idle) * 1e6 / r.rate.max(1e-9)),
                100.0 * med(rs, &|r| r.idle),
                med(rs, &|r| r.preempted),
            );
        }
        println!(
            "  {:<15} {:>14} {:>14} {:>14} {:>14} {:>16}",
            "dwara-1t ÷ it",
            "lowest round",
            "highest round",
            "rounds ahead",
            "geometric mean",
            "95% interval"
        );
        for (p, rs) in proxies.iter().zip(&runs[l]).skip(1) {
            let Some(s) = RoundByRound::of(one, rs) else {
                continue;
            };
            println!(
                "  {:<15} {:>13.2}x {:>13.2}x {:>14} {:>13.3}x {:>16}",
                p.proc.name,
                s.lowest,
                s.highest,
                format!("{} of {}", s.ahead, s.rounds),
                s.mean,
                match s.interval {
                    Some((lo, hi)) => format!("{lo:.3}x-{hi:.3}x"),
                    None => "-".to_owned(),
                }
            );
        }
    }
}

/// `dwara-1t`'s rate divided by another proxy's, round by round.
#[derive(Debug, PartialEq)]
struct RoundByRound {
    lowest: f64,
    highest: f64,
    /// The rounds in which `dwara-1t` served more.
    ahead: usize,
    rounds: usize,
    /// The median of the ratios (the report's `paired` column).
    median: f64,
    /// The geometric mean of the ratios.
    mean: f64,
    /// The 95% confidence interval of `mean` (Student's t over the ratios'
    /// logarithms, each round one sample); `None` with fewer than two rounds.
    interval: Option<(f64, f64)>,
}

impl RoundByRound {
    /// From both proxies' runs, in round order (the same index is the same round);
    /// `None` when there is no round with both.
    fn of(one: &[Run], other: &[Run]) -> Option<Self> {
        let ratios: Vec<f64> = one
            .iter()
            .zip(other)
            .map(|(a, b)| a.rate / b.rate)
            .filter(|r| r.is_finite())
            .collect();
        let lowest = ratios.iter().copied().reduce(f64::min)?;
        let highest = ratios.iter().copied().reduce(f64::max)?;
        let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
        let n = logs.len() as f64;
        let mean = logs.iter().sum::<f64>() / n;
        let interval = (logs.len() >= 2).then(|| {
            let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let half = t_975(logs.len() - 1) * (var / n).sqrt();
            ((mean - half).exp(), (mean + half).exp())
        });
        Some(Self {
            lowest,
            highest,
            ahead: ratios.iter().filter(|r| **r > 1.0).count(),
            rounds: ratios.len(),
            median: median(ratios),
            mean: mean.exp(),
            interval,
        })
    }
}

/// Student's t distribution's 97.5th percentile for `df` degrees of freedom (the
/// half-width factor of a two-sided 95% interval): the table up to 30, above it
/// the Cornish–Fisher expansion around the normal's 1.95996 (within 0.0001 of
/// the exact values from 30 on).
fn t_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    if df <= 30 {
        return T[df.max(1) - 1];
    }
    let z: f64 = 1.959_964;
    let n = df as f64;
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * n)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * n * n)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * n * n * n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_975_beyond_the_table_follows_the_published_values() {
        // Published two-sided 95% values.
        for (df, t) in [(31, 2.0395), (40, 2.0211), (60, 2.0003), (120, 1.9799)] {
            assert!((t_975(df) - t).abs() < 2e-4, "df {df}: {}", t_975(df));
        }
        // Continuous at the table's end, and falling towards the normal's.
        assert!((t_975(30) - t_975(31)).abs() < 0.005);
        assert!(t_975(100_000) > 1.9599 && t_975(100_000) < 1.9601);
        assert!((t_975(0) - 12.706).abs() < 1e-9);
    }

    #[test]
    fn round_by_round_ratios_pair_the_same_rounds() {
        let run = |rate: f64| Run {
            rate,
            ..Run::default()
        };
        let one = [run(100.0), run(90.0), run(120.0)];
        let other = [run(80.0), run(100.0), run(100.0)];
        let s = RoundByRound::of(&one, &other).unwrap();
        assert_eq!((s.ahead, s.rounds), (2, 3));
        assert!((s.median - 1.2).abs() < 1e-9, "{s:?}");
        assert!((s.lowest - 0.9).abs() < 1e-9, "{s:?}");
        assert!((s.highest - 1.25).abs() < 1e-9, "{s:?}");
        // The geometric mean of 1.25, 0.9 and 1.2 is 1.1052; the logarithms'
        // standard deviation 0.17904, so the half-width is 4.303 × 0.17904 / √3.
        assert!((s.mean - 1.1052).abs() < 1e-4, "{s:?}");
        let (lo, hi) = s.interval.unwrap();
        let half = 4.303 * 0.17904 / 3f64.sqrt();
        assert!((lo - (1.1052f64.ln() - half).exp()).abs() < 1e-3, "{s:?}");
        assert!((hi - (1.1052f64.ln() + half).exp()).abs() < 1e-3, "{s:?}");
        // One round gives a mean but no interval.
        let s = RoundByRound::of(&one[..1], &other[..1]).unwrap();
        assert!(
            (s.mean - 1.25).abs() < 1e-9 && s.interval.is_none(),
            "{s:?}"
        );
        // A round without a rate on the other side says nothing.
        let s = RoundByRound::of(&one[..1], &[run(0.0)]);
        assert_eq!(s, None);
        assert_eq!(RoundByRound::of(&[], &other), None);
    }

    #[test]
    fn pin_is_a_switch_beside_the_flags_with_values() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (o, _) = parse_args(&args(&["--rounds", "3", "--pin", "--seconds", "2"])).unwrap();
        assert_eq!((o.rounds, o.seconds), (3, 2));
        let pin = o.pin.expect("--pin pins");
        assert_eq!(pin.proxy, "0");
        assert!(pin.rest.starts_with('1'), "{}", pin.rest);
        assert!(
            parse_args(&args(&["--rounds", "3"]))
                .unwrap()
                .0
                .pin
                .is_none()
        );
        let Err(e) = parse_args(&args(&["--pin", "--rounds"])) else {
            panic!("a flag without its value is refused");
        };
        assert!(e.to_string().contains("--rounds needs a value"), "{e}");
        assert!(parse_args(&args(&["--pinned"])).is_err());
    }

    #[test]
    fn a_quota_is_a_share_of_one_cpu() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (_, s) = parse_args(&args(&["--quota", "40", "--loads", "keep-alive"])).unwrap();
        assert_eq!((s.quota, s.loads), (Some(40), vec![Load::KeepAlive]));
        assert_eq!(parse_args(&args(&[])).unwrap().1.quota, None);
        let Err(e) = parse_args(&args(&["--quota", "150"])) else {
            panic!("a quota over one CPU is refused");
        };
        assert!(e.to_string().contains("at most 100"), "{e}");
    }

    #[test]
    fn keep_busy_is_a_switch_that_needs_pin() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let (o, s) = parse_args(&args(&["--keep-busy", "--pin", "--quota", "50"])).unwrap();
        assert!(s.keep_busy && o.pin.is_some());
        assert_eq!((s.quota, o.spinner), (Some(50), None));
        assert!(!parse_args(&args(&["--pin"])).unwrap().1.keep_busy);
        let Err(e) = parse_args(&args(&["--keep-busy", "--quota", "50"])) else {
            panic!("--keep-busy without --pin is refused");
        };
        assert!(e.to_string().contains("needs --pin"), "{e}");
    }

    #[test]
    fn loads_are_chosen_by_name_and_run_in_their_usual_order() {
        assert_eq!(parse_loads(None).unwrap(), LOADS.to_vec());
        assert_eq!(
            parse_loads(Some("503,keep-alive")).unwrap(),
            vec![Load::KeepAlive, Load::NoEndpoints]
        );
        assert_eq!(parse_loads(Some("bodies")).unwrap(), vec![Load::Bodies]);
        let e = parse_loads(Some("keep-alive,tiny")).unwrap_err();
        assert!(e.to_string().contains("unknown load \"tiny\""), "{e}");
    }
}
