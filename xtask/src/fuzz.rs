//! `cargo xtask fuzz [TARGET...] [--seconds N] [--target-dir DIR] [--idle] [-- LIBFUZZER_ARGS]`:
//! runs the cargo-fuzz targets of `fuzz/`.
//!
//! Each target runs for N seconds (default 60) on the nightly toolchain, one after
//! the other, starting from its working corpus (`fuzz/corpus/TARGET`, not committed)
//! plus the committed regressions (`fuzz/regressions/TARGET`). A crash stops the run;
//! copy the input from `fuzz/artifacts/TARGET/` into `fuzz/regressions/TARGET/` so
//! `cargo test` replays it from then on, and fix the bug. At the end a table gives
//! each target's seconds, executions and slowest input, from libFuzzer's final stats.
//!
//! The sanitizer builds go to `--target-dir`, else `$DWARA_FUZZ_TARGET_DIR`, else
//! `fuzz/target`; never to `$CARGO_TARGET_DIR`, which holds the stable builds.
//! `--idle` builds every target first, then runs each fuzzer under `chrt --idle 0`
//! (SCHED_IDLE), so a long run only takes CPU nothing else wants. Arguments after
//! `--` go to libFuzzer (e.g. `-timeout=5 -report_slow_units=1`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

const TARGETS: &[&str] = &[
    "dns_packet",
    "dns_udp",
    "dns_tcp",
    "dns_differential",
    "dns_answers",
    "http_path",
    "http_form",
    "config_yaml",
    "resolv_conf",
    "cluster_value",
    "cluster_bucket",
    "cluster_datagram",
    "cluster_keyfile",
    "store_record",
    "records_db",
    "docker_event",
    "allow_list",
    "http_auth",
    "http_headers",
];

/// How the fuzzers run, from the command line.
struct Options {
    seconds: u64,
    targets: Vec<&'static str>,
    target_dir: PathBuf,
    priority: Priority,
    libfuzzer_args: Vec<String>,
}

/// What one target's run reported.
struct Outcome {
    target: &'static str,
    /// libFuzzer's own count (`Done N runs in S second(s)`), else the wall time.
    seconds: u64,
    executions: Option<u64>,
    slowest_unit_secs: Option<u64>,
}

fn parse(args: &[String], fuzz_dir: &Path) -> anyhow::Result<Options> {
    let mut seconds = 60u64;
    let mut targets = Vec::new();
    let mut target_dir = std::env::var_os("DWARA_FUZZ_TARGET_DIR").map(PathBuf::from);
    let mut priority = Priority::Inherited;
    let mut libfuzzer_args = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seconds" => {
                seconds = it
                    .next()
                    .context("--seconds needs a value")?
                    .parse()
                    .context("--seconds: not a number")?;
            }
            "--target-dir" => {
                target_dir = Some(it.next().context("--target-dir needs a value")?.into());
            }
            "--idle" => priority = Priority::Idle,
            "--" => libfuzzer_args.extend(it.by_ref().cloned()),
            t => match TARGETS.iter().find(|known| **known == t) {
                Some(known) => targets.push(*known),
                None => bail!("unknown fuzz target or flag {t:?} (targets: {TARGETS:?})"),
            },
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    Ok(Options {
        seconds,
        targets,
        target_dir: target_dir.unwrap_or_else(|| fuzz_dir.join("target")),
        priority,
        libfuzzer_args,
    })
}

/// Runs the requested targets (all when none is named).
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .to_path_buf();
    let fuzz_dir = root.join("fuzz");
    let opts = parse(args, &fuzz_dir)?;
    preflight(opts.priority)?;
    if matches!(opts.priority, Priority::Idle) {
        // One build for all targets at normal priority; the runs below then find
        // them built and only the fuzzing itself is SCHED_IDLE.
        let status = cargo_fuzz(&fuzz_dir, &opts.target_dir, Priority::Inherited)
            .arg("build")
            .status()
            .context("cannot run `cargo +nightly fuzz build`")?;
        if !status.success() {
            bail!("cargo fuzz build failed ({status})");
        }
    }
    let mut outcomes = Vec::new();
    for &target in &opts.targets {
        match run_target(&fuzz_dir, &opts, target) {
            Ok(outcome) => outcomes.push(outcome),
            Err(e) => {
                print_table(&outcomes);
                return Err(e);
            }
        }
    }
    print_table(&outcomes);
    Ok(())
}

/// The CPU scheduling a child process runs under.
#[derive(Clone, Copy)]
enum Priority {
    /// The caller's own.
    Inherited,
    /// SCHED_IDLE, through `chrt --idle 0`.
    Idle,
}

/// `cargo +nightly fuzz` in `fuzz/`, building into `target_dir`.
fn cargo_fuzz(fuzz_dir: &Path, target_dir: &Path, priority: Priority) -> Command {
    let mut cmd = match priority {
        Priority::Inherited => Command::new("cargo"),
        Priority::Idle => {
            let mut chrt = Command::new("chrt");
            chrt.args(["--idle", "0", "cargo"]);
            chrt
        }
    };
    cmd.current_dir(fuzz_dir)
        .env("CARGO_TARGET_DIR", target_dir)
        .args(["+nightly", "fuzz"]);
    cmd
}

fn run_target(fuzz_dir: &Path, opts: &Options, target: &'static str) -> anyhow::Result<Outcome> {
    let artifacts = fuzz_dir.join("artifacts").join(target);
    let before = crash_inputs(&artifacts);
    let corpus = fuzz_dir.join("corpus").join(target);
    std::fs::create_dir_all(&corpus)?;
    println!("fuzzing {target} for {}s", opts.seconds);
    let mut cmd = cargo_fuzz(fuzz_dir, &opts.target_dir, opts.priority);
    cmd.args(["run", target])
        .arg(&corpus)
        .arg(fuzz_dir.join("regressions").join(target))
        .arg("--")
        .arg(format!("-max_total_time={}", opts.seconds))
        .arg("-print_final_stats=1")
        .args(&opts.libfuzzer_args)
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .context("cannot run `cargo +nightly fuzz` (cargo install cargo-fuzz)")?;
    let mut executions = None;
    let mut slowest_unit_secs = None;
    let mut fuzz_seconds = None;
    if let Some(stderr) = child.stderr.take() {
        // libFuzzer reports on stderr: pass every line on and keep the final stats.
        for line in BufReader::new(stderr).lines() {
            let line = line.context("reading libFuzzer's output")?;
            eprintln!("{line}");
            if let Some(n) = stat(&line, "stat::number_of_executed_units:") {
                executions = Some(n);
            }
            if let Some(n) = stat(&line, "stat::slowest_unit_time_sec:") {
                slowest_unit_secs = Some(n);
            }
            if let Some(n) = done_seconds(&line) {
                fuzz_seconds = Some(n);
            }
        }
    }
    let status = child.wait().context("waiting for cargo fuzz")?;
    if !status.success() {
        let new: Vec<String> = crash_inputs(&artifacts)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if new.is_empty() {
            bail!(
                "cargo fuzz failed for {target} without leaving a crash input (see its \
                 output above: a build error, or an interrupted run)"
            );
        }
        bail!(
            "fuzz target {target} found a failing input: fuzz/artifacts/{target}/{}; \
             copy it to fuzz/regressions/{target}/ and fix the bug",
            new.join(", ")
        );
    }
    Ok(Outcome {
        target,
        seconds: fuzz_seconds.unwrap_or_else(|| started.elapsed().as_secs()),
        executions,
        slowest_unit_secs,
    })
}

/// S from libFuzzer's last line, `Done N runs in S second(s)`.
fn done_seconds(line: &str) -> Option<u64> {
    let rest = line.strip_prefix("Done ")?;
    let (_, after) = rest.split_once(" runs in ")?;
    after.strip_suffix(" second(s)")?.parse().ok()
}

/// The number after `key` on a libFuzzer stats line.
fn stat(line: &str, key: &str) -> Option<u64> {
    line.trim().strip_prefix(key)?.trim().parse().ok()
}

fn print_table(outcomes: &[Outcome]) {
    if outcomes.is_empty() {
        return;
    }
    println!("target            seconds  executions  slowest input (s)");
    for o in outcomes {
        let show = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |n| n.to_string());
        println!(
            "{:<16} {:>8} {:>11} {:>18}",
            o.target,
            o.seconds,
            show(o.executions),
            show(o.slowest_unit_secs)
        );
    }
}

/// Fails with what to install when `cargo +nightly fuzz` (or `chrt` for `--idle`)
/// cannot run.
fn preflight(priority: Priority) -> anyhow::Result<()> {
    let ok = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok("cargo", &["+nightly", "--version"]) {
        bail!("the nightly toolchain is missing: rustup toolchain install nightly");
    }
    if !ok("cargo", &["+nightly", "fuzz", "--version"]) {
        bail!("cargo-fuzz is not installed: cargo install cargo-fuzz");
    }
    if matches!(priority, Priority::Idle) && !ok("chrt", &["--version"]) {
        bail!("--idle needs chrt (util-linux)");
    }
    Ok(())
}

/// The file names in a target's artifact folder (libFuzzer's crash, leak, timeout
/// and out-of-memory inputs).
fn crash_inputs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
