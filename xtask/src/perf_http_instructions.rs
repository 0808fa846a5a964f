//! `cargo xtask perf http-instructions`: the instructions dwara executes per
//! proxied keep-alive request (with `--new-connections`, per request on a new
//! connection), counted by valgrind's callgrind.
//!
//! ```text
//! cargo xtask perf http-instructions [--seconds S] [--dwara PATH] [--before PATH]
//!                                    [--haproxy] [--cache] [--new-connections]
//!                                    [--keep DIR]
//! ```
//!
//! The rates of `perf http` swing by ±20% from round to round on a shared 2-core
//! machine; an instruction count does not depend on what else the machine is
//! doing, so it tells two builds apart where the rates cannot (it says nothing of
//! cache misses or of the kernel's share, which the rates include).
//!
//! 1. Installs nginx-light, wrk and valgrind when missing.
//! 2. Starts the backend of `perf http` (nginx, one worker, `return 200` for
//!    `/tiny`) and `dwara serve --l4-workers 1 --worker-threads 1` with its
//!    `protocol: http` upstream (as `dwara-1t` of `perf http`) under
//!    `valgrind --tool=callgrind --instr-atstart=no`: nothing is counted yet.
//! 3. Warms it up (wrk, 2 s: the pooled connections made, the code paged in),
//!    turns counting on (`callgrind_control -i on`), runs keep-alive requests
//!    (`wrk -t1 -c16`, `/tiny`) for `S` seconds (default 15; under callgrind dwara
//!    serves a few thousand requests a second), turns counting off and dumps the
//!    counts (`callgrind_control -d`). 16 connections, not the 32 of `perf http`:
//!    how wrk's requests fall into the event loop's batches differs from run to
//!    run, and so do the instructions per request of one build, by about 1% with
//!    32 connections and about 0.5% with 16.
//! 4. Prints the instructions of the whole process divided by the requests wrk
//!    counted; with `--before PATH`, the same for that build, run after the first
//!    against the same backend, and the ratio of the two.
//!
//! `--haproxy` counts HAProxy-1t too, configured as `perf http` configures it
//! (`mode http`, one thread, the same request rewriting), under the same load.
//! `--cache` turns on callgrind's cache and branch simulation (the caches as the
//! CPU reports them) and prints, per request, the misses of the first-level
//! instruction and data caches and the mispredicted branches beside the
//! instructions: where two proxies run about as many instructions, these tell
//! how much of the code and data each request brings back into the cache (see
//! `docs/PERFORMANCE.md`). It is several times slower.
//!
//! `--new-connections` sends each request on a new connection instead (`wrk -t1
//! -c16 -H "Connection: close"`, as the new-connection load of `perf http` with
//! 16 connections) and prints the counts per connection: what accepting,
//! serving and closing a client connection costs beside its one request.
//!
//! `--keep DIR` copies each proxy's callgrind dump into `DIR` (made if missing),
//! as `NAME.callgrind`, for `callgrind_annotate --inclusive=yes DIR/NAME.callgrind`
//! to say where the instructions went.
//!
//! Two builds whose counts differ by less than about 0.5% are not told apart.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::perf_http::start_haproxy_under;
use crate::perf_l4::{Load, Options, Proc, Proxy, start_backend, start_dwara_under, wrk};
use crate::perf_util::{clock_ticks, free_port, output_of, parse_flags, release_dwara};

const USAGE: &str = "usage: cargo xtask perf http-instructions [--seconds S] [--dwara PATH] \
                     [--before PATH] [--haproxy] [--cache] [--new-connections] [--keep DIR]";

/// Runs the count for `--dwara` (or the release build), `--before` and, with
/// `--haproxy`, HAProxy-1t.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    // The switches first: the other flags take a value each.
    let haproxy = args.iter().any(|a| a == "--haproxy");
    let cache = args.iter().any(|a| a == "--cache");
    let load = match args.iter().any(|a| a == "--new-connections") {
        true => Load::CountedConnections,
        false => Load::Counted,
    };
    let rest: Vec<String> = args
        .iter()
        .filter(|a| !["--haproxy", "--cache", "--new-connections"].contains(&a.as_str()))
        .cloned()
        .collect();
    let f = parse_flags(
        &rest,
        &["--seconds", "--dwara", "--before", "--keep"],
        USAGE,
    )?;
    let seconds: u32 = f.count("--seconds", 15)?;
    if seconds == 0 {
        bail!("--seconds must be at least 1\n{USAGE}");
    }
    crate::tools::ensure_perf_http_instructions()?;
    if haproxy {
        crate::tools::ensure_perf_http()?;
    }
    let dwara = match f.path("--dwara") {
        Some(p) => p,
        None => {
            crate::cargo(&["build", "--release", "-p", "dwara"])?;
            release_dwara()
        }
    };
    let mut subjects = vec![Subject::Dwara("dwara-1t", dwara)];
    if let Some(before) = f.path("--before") {
        subjects.push(Subject::Dwara("dwara-1t-before", before));
    }
    if haproxy {
        subjects.push(Subject::Haproxy);
    }
    let keep = f.path("--keep");
    if let Some(k) = &keep {
        std::fs::create_dir_all(k).with_context(|| format!("cannot make {}", k.display()))?;
    }
    crate::perf_util::in_scratch_dir("perf-http-instructions", |dir| {
        run_in(dir, &subjects, (load, seconds), cache, keep.as_deref())
    })
}

/// What is counted.
enum Subject {
    /// dwara-1t from a build.
    Dwara(&'static str, PathBuf),
    /// HAProxy-1t as `perf http` runs it.
    Haproxy,
}

impl Subject {
    fn name(&self) -> &'static str {
        match self {
            Self::Dwara(name, _) => name,
            Self::Haproxy => "haproxy-1t",
        }
    }

    /// Starts it under `wrapper` in front of `backend`.
    fn start(&self, wrapper: &[String], dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
        match self {
            Self::Dwara(name, bin) => {
                let dns = free_port(Ipv4Addr::LOCALHOST)?;
                start_dwara_under(wrapper, dir, name, bin, (backend, dns), true, true)
            }
            Self::Haproxy => start_haproxy_under(wrapper, dir, backend),
        }
    }
}

fn run_in(
    dir: &Path,
    subjects: &[Subject],
    (load, seconds): (Load, u32),
    cache: bool,
    keep: Option<&Path>,
) -> anyhow::Result<()> {
    let (what, per_what) = match load {
        Load::CountedConnections => ("requests of /tiny, each on a new connection,", "connection"),
        _ => ("keep-alive requests of /tiny", "request"),
    };
    println!(
        "perf http-instructions: each proxy under callgrind{}, wrk -t1 -c16 -d{seconds}s \
         {what} through it to nginx",
        if cache {
            " with its cache and branch simulation"
        } else {
            ""
        }
    );
    let (backend_proc, backend) = start_backend(dir)?;
    let mut counts = Vec::new();
    for subject in subjects {
        let name = subject.name();
        let (requests, events) = count(
            dir,
            subject,
            (&backend_proc, backend),
            (load, seconds),
            cache,
        )?;
        if let Some(k) = keep {
            let from = dump_of(dir, name);
            let to = k.join(format!("{name}.callgrind"));
            std::fs::copy(&from, &to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
            println!("  {name}: callgrind dump kept at {}", to.display());
        }
        let event = |e: &str| {
            events
                .iter()
                .find(|(name, _)| name == e)
                .map_or(0, |(_, v)| *v)
        };
        let per = |e: &str| event(e) as f64 / requests.max(1.0);
        let instructions = event("Ir");
        println!(
            "  {name:<16} {requests:>9.0} requests  {instructions:>15} instructions  \
             {:>9.0} per {per_what}",
            per("Ir")
        );
        if cache {
            println!(
                "  {:<16} per {per_what}: L1i misses {:.0}, L1d misses {:.0} (read {:.0}, \
                 write {:.0}), mispredicted branches {:.0} (indirect {:.0})",
                "",
                per("I1mr"),
                per("D1mr") + per("D1mw"),
                per("D1mr"),
                per("D1mw"),
                per("Bcm") + per("Bim"),
                per("Bim"),
            );
        }
        counts.push((name, per("Ir")));
    }
    let by_name = |n: &str| counts.iter().find(|(name, _)| *name == n).map(|c| c.1);
    if let (Some(now), Some(before)) = (by_name("dwara-1t"), by_name("dwara-1t-before")) {
        println!(
            "  dwara-1t ÷ dwara-1t-before: {:.4}x instructions per {per_what}",
            now / before
        );
    }
    if let (Some(now), Some(haproxy)) = (by_name("dwara-1t"), by_name("haproxy-1t")) {
        println!(
            "  dwara-1t ÷ haproxy-1t: {:.4}x instructions per {per_what}",
            now / haproxy
        );
    }
    Ok(())
}

/// Requests served under the counted load, and the events callgrind counted over
/// it (`Ir`, the instructions; with `cache`, also its cache and branch events).
fn count(
    dir: &Path,
    subject: &Subject,
    (backend_proc, backend): (&Proc, u16),
    (load, seconds): (Load, u32),
    cache: bool,
) -> anyhow::Result<(f64, Vec<(String, u64)>)> {
    let name = subject.name();
    let out = dir.join(format!("{name}.callgrind"));
    let mut wrapper = vec![
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--instr-atstart=no".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    if cache {
        wrapper.push("--cache-sim=yes".to_owned());
        wrapper.push("--branch-sim=yes".to_owned());
    }
    let proxy = subject.start(&wrapper, dir, backend)?;
    let pid = proxy.proc.child.id().to_string();
    let load = |seconds| {
        let opts = Options {
            rounds: 1,
            seconds,
            idle: 0,
            threads: 1,
            proxies: Vec::new(),
            before: None,
            dwara: None,
            pin: None,
            spinner: None,
        };
        wrk(&proxy, backend_proc, load, &opts, clock_ticks())
    };
    load(2)?;
    output_of("callgrind_control", &["-i", "on", &pid])?;
    let run = load(seconds)?;
    output_of("callgrind_control", &["-i", "off", &pid])?;
    output_of("callgrind_control", &["-d", &pid])?;
    let dump = dump_of(dir, name);
    let text = std::fs::read_to_string(&dump)
        .with_context(|| format!("callgrind wrote no dump at {}", dump.display()))?;
    Ok((run.units, totals(&text)?))
}

/// Where the dump asked for of `name` lands: beside its out file, numbered.
fn dump_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.callgrind.1"))
}

/// The events a callgrind dump counted, by name: its `events:` line names the
/// columns of its `totals:` line (its `summary:` line is 0 in a dump asked for with
/// `callgrind_control -d`).
fn totals(dump: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let names = dump
        .lines()
        .find_map(|l| l.strip_prefix("events:"))
        .context("no events line in the callgrind dump")?;
    let values = dump
        .lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .context("no totals in the callgrind dump")?;
    let values: Vec<u64> = values
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("totals that are not counts in the callgrind dump")?;
    let names: Vec<&str> = names.split_whitespace().collect();
    if values.len() != names.len() {
        bail!(
            "the callgrind dump has {} events and {} totals",
            names.len(),
            values.len()
        );
    }
    Ok(names.into_iter().map(str::to_owned).zip(values).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_come_from_the_dump() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\n\
                    fn=(1) main\n16 3\nsummary: 0\ntotals: 971052661\n";
        assert_eq!(totals(dump).unwrap(), vec![("Ir".to_owned(), 971_052_661)]);
        assert!(totals("events: Ir\nsummary: 42\n").is_err());
    }

    #[test]
    fn totals_are_named_by_the_events_line() {
        let dump = "events: Ir Dr Dw I1mr D1mr D1mw\nsummary: 0\ntotals: 100 40 20 7 3 2\n";
        let t = totals(dump).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(t[3], ("I1mr".to_owned(), 7));
        assert_eq!(t[5], ("D1mw".to_owned(), 2));
        // A totals line that does not match its events is an error, not a guess.
        assert!(totals("events: Ir I1mr\ntotals: 100\n").is_err());
        assert!(totals("events: Ir\ntotals: many\n").is_err());
    }
}
