//! `cargo xtask fuzz [TARGET] [--seconds N]`: runs the cargo-fuzz targets of `fuzz/`.
//!
//! Each target runs for N seconds (default 60) on the nightly toolchain, starting
//! from its working corpus (`fuzz/corpus/TARGET`, not committed) plus the committed
//! regressions (`fuzz/regressions/TARGET`). A crash stops the run; copy the input
//! from `fuzz/artifacts/TARGET/` into `fuzz/regressions/TARGET/` so `cargo test`
//! replays it from then on, and fix the bug.

use std::path::Path;
use std::process::Command;

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
    "store_record",
    "docker_event",
];

/// Runs the requested targets (all when none is named).
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut seconds = 60u64;
    let mut targets = Vec::new();
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
            t if TARGETS.contains(&t) => targets.push(t),
            other => bail!("unknown fuzz target or flag {other:?} (targets: {TARGETS:?})"),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("workspace root")?
        .to_path_buf();
    let fuzz_dir = root.join("fuzz");
    preflight()?;
    for target in targets {
        let artifacts = fuzz_dir.join("artifacts").join(target);
        let before = crash_inputs(&artifacts);
        let corpus = fuzz_dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        println!("fuzzing {target} for {seconds}s");
        let status = Command::new("cargo")
            .current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", target])
            .arg(&corpus)
            .arg(fuzz_dir.join("regressions").join(target))
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .status()
            .context("cannot run `cargo +nightly fuzz` (cargo install cargo-fuzz)")?;
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
    }
    Ok(())
}

/// Fails with what to install when `cargo +nightly fuzz` cannot run.
fn preflight() -> anyhow::Result<()> {
    let ok = |args: &[&str]| {
        Command::new("cargo")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok(&["+nightly", "--version"]) {
        bail!("the nightly toolchain is missing: rustup toolchain install nightly");
    }
    if !ok(&["+nightly", "fuzz", "--version"]) {
        bail!("cargo-fuzz is not installed: cargo install cargo-fuzz");
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
