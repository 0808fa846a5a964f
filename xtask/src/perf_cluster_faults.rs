//! `cargo xtask perf cluster --faults` and `cargo xtask perf cluster --simulate N,…`:
//! the cluster under network faults, and at sizes no machine runs as processes.
//!
//! - `--faults` runs the fault tests of the `dwara` binary (`faults::` in its
//!   integration tests: five hosts in network namespaces with 30 % loss and
//!   50 ± 20 ms delay, a 2 | 3 split with writes on both sides, a one-way cut with a
//!   flapping link) on a release build, one at a time, and prints their
//!   `faults: …` timing lines. Needs root (namespaces, iptables).
//! - `--simulate 100,1000 [--interval-ms MS] [--phi X] [--changes K] [--idle-s S]`
//!   runs the cluster crate's `simulate` example once per size: that many real
//!   cluster nodes in one process over chitchat's in-memory transport on tokio's
//!   paused clock (figures in simulated time), printing join time, the time one
//!   change takes to reach every node, idle bytes per node per second, the largest
//!   message and how long a stopped node takes to be hidden.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Runs the fault scenarios (release) and prints their timing lines.
pub(crate) fn faults() -> anyhow::Result<()> {
    crate::tools::ensure()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut child = Command::new(&cargo)
        .args(["test", "--release", "-p", "dwara", "--test", "integration"])
        .args(["faults::", "--", "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {cargo}"))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let relay = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("test ") || line.starts_with("test result") {
                println!("{line}");
            }
        }
    });
    let stderr = child.stderr.take().context("no stderr")?;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.starts_with("faults:") || line.contains("panicked") || line.starts_with("SKIPPED") {
            println!("{line}");
        }
    }
    let _ = relay.join();
    let status = child.wait()?;
    if !status.success() {
        bail!("the fault tests failed ({status})");
    }
    Ok(())
}

/// Runs the simulation once per size in `sizes` (`100,1000`), passing `rest` on.
pub(crate) fn simulate(sizes: &str, rest: &[String]) -> anyhow::Result<()> {
    let sizes: Vec<usize> = sizes
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .with_context(|| format!("--simulate: {s:?}"))
        })
        .collect::<anyhow::Result<_>>()?;
    crate::cargo(&[
        "build",
        "--release",
        "-p",
        "dwara-cluster",
        "--example",
        "simulate",
    ])?;
    for n in sizes {
        let mut args = vec![
            "run",
            "--release",
            "--quiet",
            "-p",
            "dwara-cluster",
            "--example",
            "simulate",
            "--",
            "--nodes",
        ];
        let n = n.to_string();
        args.push(&n);
        args.extend(rest.iter().map(String::as_str));
        crate::cargo(&args)?;
    }
    Ok(())
}
