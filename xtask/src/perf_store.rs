//! `cargo xtask perf store`: registering names over HTTP in memory vs with
//! `--data-dir`, in one run.
//!
//! ```text
//! cargo xtask perf store [--names N] [--connections C] [--rounds R] [--dir PARENT]
//! cargo xtask perf store --one-name [--names N] [--connections C] [--rounds R]
//! ```
//!
//! With `--one-name` it compares instead, in memory, `N` registrations of one name
//! (`N` instances of `svc.weave.local`, one address each) with `N` distinct names:
//! the cost of the records' edit path, which is linear in the records of the name
//! being changed.
//!
//! Each round starts `dwara serve` (release build) twice, once in memory and once
//! with a fresh data dir under `PARENT` (default: the system temp dir; it must be a
//! real disk for the fsyncs to mean anything), and registers `N` names
//! (`nI.weave.local` → one address each) over `C` keep-alive HTTP connections with
//! one request in flight per connection, timing the whole. Both variants use the same
//! concurrency, so the comparison is fair: with a data dir every `204` waits for its
//! registration's fsync, and concurrent requests share one (group commit). The
//! data-dir server is then killed (SIGKILL) and restarted on the same dir, timing
//! the start until `GET /name` lists all `N` names.
//!
//! Prints the median per variant, the ratio data-dir / memory and the restart time,
//! and how much the in-memory server's resident memory grew per registration
//! (`VmRSS` after the registrations minus before, divided by `N`: the records, their
//! indexes and hash-table slack, and whatever the allocator keeps).
//! Everything listens on 127.0.0.1 only.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::perf_util::{Dwara, free_port, release_dwara, rss_kib, spawn_dwara};
use anyhow::{Context, bail};

struct Options {
    names: usize,
    connections: usize,
    rounds: usize,
    dir: PathBuf,
    one_name: bool,
}

/// What the registrations name.
#[derive(Clone, Copy)]
enum Shape {
    /// `nI.weave.local`: one name per registration.
    Distinct,
    /// `svc.weave.local` for every registration: one name with `N` instances.
    OneName,
}

impl Shape {
    fn fqdn(self, i: usize) -> String {
        match self {
            Shape::Distinct => format!("n{i}.weave.local"),
            Shape::OneName => "svc.weave.local".to_owned(),
        }
    }
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut opts = Options {
        names: 100_000,
        connections: 64,
        rounds: 3,
        dir: std::env::temp_dir(),
        one_name: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--one-name" {
            opts.one_name = true;
            continue;
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--names" => opts.names = value.parse().context("--names")?,
            "--connections" => opts.connections = value.parse().context("--connections")?,
            "--rounds" => opts.rounds = value.parse().context("--rounds")?,
            "--dir" => opts.dir = PathBuf::from(value),
            other => bail!("unknown option {other}"),
        }
    }
    if opts.names == 0 || opts.connections == 0 || opts.rounds == 0 {
        bail!("--names, --connections and --rounds must be at least 1");
    }
    Ok(opts)
}

fn start(data_dir: Option<&Path>) -> anyhow::Result<Dwara> {
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
    let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
    let bin = release_dwara();
    let mut cmd = Command::new(&bin);
    cmd.args(["serve", "--fallback", "127.0.0.1:9", "--dns-listen"])
        .arg(dns.to_string())
        .arg("--http-listen")
        .arg(http.to_string())
        .env("DWARA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(dir) = data_dir {
        cmd.arg("--data-dir").arg(dir);
    }
    spawn_dwara(cmd, http, "dwara serve")
}

/// A blocking client for one-off requests.
fn client() -> anyhow::Result<reqwest::blocking::Client> {
    Ok(reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()?)
}

/// Registers names `k, k + step, …` below `n`, one request at a time.
async fn register_share(
    client: reqwest::Client,
    http: SocketAddr,
    k: usize,
    step: usize,
    n: usize,
    shape: Shape,
) -> anyhow::Result<()> {
    for i in (k..n).step_by(step) {
        let ip = Ipv4Addr::from(0x0a00_0000 + u32::try_from(i)?);
        let resp = client
            .put(format!("http://{http}/name/c{i}/{ip}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("fqdn={}", shape.fqdn(i)))
            .send()
            .await?;
        if resp.status().as_u16() != 204 {
            let status = resp.status();
            bail!(
                "registration {i} failed: {status} {}",
                resp.text().await.unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// Registers `n` names over `c` connections (one task each, on the async client: the
/// blocking one funnels every request through one runtime thread and measured the
/// client, not the server); returns the time taken.
fn register(http: SocketAddr, n: usize, c: usize, shape: Shape) -> anyhow::Result<Duration> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .pool_max_idle_per_host(c)
            .build()?;
        let started = Instant::now();
        let tasks: Vec<_> = (0..c)
            .map(|k| tokio::spawn(register_share(client.clone(), http, k, c, n, shape)))
            .collect();
        for t in tasks {
            t.await??;
        }
        Ok(started.elapsed())
    })
}

/// Registers `n` names on `d` like [`register`]; also returns the growth of its
/// resident memory per registration, in bytes.
fn register_measured(
    d: &Dwara,
    n: usize,
    c: usize,
    shape: Shape,
) -> anyhow::Result<(Duration, f64)> {
    let pid = d.child.id();
    let before = rss_kib(pid).context("VmRSS before")?;
    let t = register(d.http, n, c, shape)?;
    let after = rss_kib(pid).context("VmRSS after")?;
    Ok((t, after.saturating_sub(before) as f64 * 1024.0 / n as f64))
}

/// How many entries `GET /name` lists.
fn count_entries(http: SocketAddr) -> anyhow::Result<usize> {
    let resp = client()?.get(format!("http://{http}/name")).send()?;
    if resp.status().as_u16() != 200 {
        bail!("GET /name: {}", resp.status());
    }
    let entries: serde_json::Value = resp.json()?;
    Ok(entries.as_array().map_or(0, Vec::len))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Runs the comparison.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    crate::cargo(&["build", "--release", "-p", "dwara"])?;
    let parent = opts
        .dir
        .join(format!("dwara-perf-store-{}", std::process::id()));
    if opts.one_name {
        return run_one_name(&opts);
    }
    std::fs::create_dir_all(&parent)?;
    let result = run_in(&parent, &opts);
    let _ = std::fs::remove_dir_all(&parent);
    result
}

fn run_in(parent: &Path, opts: &Options) -> anyhow::Result<()> {
    let (n, c) = (opts.names, opts.connections);
    println!(
        "perf store: {n} registrations over {c} keep-alive connections, {} rounds, data dirs in {}",
        opts.rounds,
        parent.display()
    );
    let (mut memory, mut durable, mut restart) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_name = Vec::new();
    for round in 0..opts.rounds {
        let d = start(None)?;
        let (t, bytes) = register_measured(&d, n, c, Shape::Distinct)?;
        drop(d);
        memory.push(t);
        per_name.push(bytes);

        let dir = parent.join(format!("round-{round}"));
        let d = start(Some(&dir))?;
        let td = register(d.http, n, c, Shape::Distinct)?;
        drop(d); // SIGKILL
        durable.push(td);

        let started = Instant::now();
        let d = start(Some(&dir))?;
        let loaded = count_entries(d.http)?;
        let tr = started.elapsed();
        if loaded != n {
            bail!("after SIGKILL and restart {loaded} of {n} registrations are back");
        }
        restart.push(tr);
        println!(
            "round {}: memory {:.2} s (RSS +{bytes:.0} B per name), data dir {:.2} s ({:.2}x), \
             restart with {n} stored {:.2} s",
            round + 1,
            t.as_secs_f64(),
            td.as_secs_f64(),
            td.as_secs_f64() / t.as_secs_f64(),
            tr.as_secs_f64()
        );
    }
    let (m, dd, r) = (median(memory), median(durable), median(restart));
    per_name.sort_by(f64::total_cmp);
    println!(
        "in memory, RSS growth per name: median {:.0} B (rounds {per_name:.0?})",
        per_name[per_name.len() / 2]
    );
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "median: memory {:.2} s ({:.0}/s), data dir {:.2} s ({:.0}/s): data dir / memory = {:.2}x; \
         restart loading {n}: {:.2} s",
        m.as_secs_f64(),
        rate(m),
        dd.as_secs_f64(),
        rate(dd),
        dd.as_secs_f64() / m.as_secs_f64(),
        r.as_secs_f64()
    );
    Ok(())
}

/// `--one-name`: `N` instances of one name against `N` distinct names, in memory,
/// interleaved per round.
fn run_one_name(opts: &Options) -> anyhow::Result<()> {
    let (n, c) = (opts.names, opts.connections);
    println!(
        "perf store --one-name: {n} registrations over {c} keep-alive connections, {} rounds, in memory",
        opts.rounds
    );
    let (mut distinct, mut one) = (Vec::new(), Vec::new());
    for round in 0..opts.rounds {
        let d = start(None)?;
        let (td, bd) = register_measured(&d, n, c, Shape::Distinct)?;
        drop(d);
        let d = start(None)?;
        let (to, bo) = register_measured(&d, n, c, Shape::OneName)?;
        let loaded = count_entries(d.http)?;
        drop(d);
        if loaded != n {
            bail!("{loaded} of {n} instances of svc.weave.local are listed");
        }
        distinct.push(td);
        one.push(to);
        println!(
            "round {}: distinct names {:.2} s (RSS +{bd:.0} B each), one name {:.2} s \
             (RSS +{bo:.0} B each) ({:.2}x)",
            round + 1,
            td.as_secs_f64(),
            to.as_secs_f64(),
            to.as_secs_f64() / td.as_secs_f64()
        );
    }
    let (d, o) = (median(distinct), median(one));
    println!(
        "median: distinct names {:.2} s, one name {:.2} s: one name / distinct = {:.2}x",
        d.as_secs_f64(),
        o.as_secs_f64(),
        o.as_secs_f64() / d.as_secs_f64()
    );
    Ok(())
}
