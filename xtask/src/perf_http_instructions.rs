//! `cargo xtask perf http-instructions`: the instructions dwara executes per
//! proxied keep-alive request, counted by valgrind's callgrind.
//!
//! ```text
//! cargo xtask perf http-instructions [--seconds S] [--dwara PATH] [--before PATH]
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
//! Two builds whose counts differ by less than about 0.5% are not told apart.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::perf_l4::{Load, Options, start_backend, start_dwara_under, wrk};
use crate::perf_util::{clock_ticks, free_port, output_of, parse_flags, release_dwara};

const USAGE: &str =
    "usage: cargo xtask perf http-instructions [--seconds S] [--dwara PATH] [--before PATH]";

/// Runs the count for `--dwara` (or the release build) and `--before`.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let f = parse_flags(args, &["--seconds", "--dwara", "--before"], USAGE)?;
    let seconds: u32 = f.count("--seconds", 15)?;
    if seconds == 0 {
        bail!("--seconds must be at least 1\n{USAGE}");
    }
    crate::tools::ensure_perf_http_instructions()?;
    let dwara = match f.path("--dwara") {
        Some(p) => p,
        None => {
            crate::cargo(&["build", "--release", "-p", "dwara"])?;
            release_dwara()
        }
    };
    let mut builds = vec![("dwara-1t", dwara)];
    if let Some(before) = f.path("--before") {
        builds.push(("dwara-1t-before", before));
    }
    crate::perf_util::in_scratch_dir("perf-http-instructions", |dir| {
        run_in(dir, &builds, seconds)
    })
}

fn run_in(dir: &Path, builds: &[(&str, PathBuf)], seconds: u32) -> anyhow::Result<()> {
    println!(
        "perf http-instructions: dwara-1t under callgrind, wrk -t1 -c16 -d{seconds}s \
         keep-alive requests of /tiny through it to nginx"
    );
    let (_backend, backend) = start_backend(dir)?;
    let mut counts = Vec::new();
    for (name, bin) in builds {
        let (requests, instructions) = count(dir, name, bin, backend, seconds)?;
        let per_request = instructions as f64 / requests.max(1.0);
        println!(
            "  {name:<16} {requests:>9.0} requests  {instructions:>15} instructions  \
             {per_request:>9.0} per request"
        );
        counts.push(per_request);
    }
    if let [now, before] = counts[..] {
        println!(
            "  dwara-1t ÷ dwara-1t-before: {:.4}x instructions per request",
            now / before
        );
    }
    Ok(())
}

/// Requests served and instructions executed by `bin` under the counted load.
fn count(
    dir: &Path,
    name: &str,
    bin: &Path,
    backend: u16,
    seconds: u32,
) -> anyhow::Result<(f64, u64)> {
    let out = dir.join(format!("{name}.callgrind"));
    let wrapper = [
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--instr-atstart=no".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    let dns = free_port(Ipv4Addr::LOCALHOST)?;
    let proxy = start_dwara_under(&wrapper, dir, name, bin, (backend, dns), true, true)?;
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
        };
        wrk(&proxy, Load::Counted, &opts, clock_ticks())
    };
    load(2)?;
    output_of("callgrind_control", &["-i", "on", &pid])?;
    let run = load(seconds)?;
    output_of("callgrind_control", &["-i", "off", &pid])?;
    output_of("callgrind_control", &["-d", &pid])?;
    // The dump asked for lands beside the out file, numbered.
    let dump = dir.join(format!("{name}.callgrind.1"));
    let text = std::fs::read_to_string(&dump)
        .with_context(|| format!("callgrind wrote no dump at {}", dump.display()))?;
    Ok((run.units, totals(&text)?))
}

/// The instructions a callgrind dump counted: its `totals:` line (its `summary:`
/// line is 0 in a dump asked for with `callgrind_control -d`).
fn totals(dump: &str) -> anyhow::Result<u64> {
    dump.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no totals in the callgrind dump")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_come_from_the_dump() {
        let dump = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\n\
                    fn=(1) main\n16 3\nsummary: 0\ntotals: 971052661\n";
        assert_eq!(totals(dump).unwrap(), 971_052_661);
        assert!(totals("events: Ir\nsummary: 42\n").is_err());
    }
}
