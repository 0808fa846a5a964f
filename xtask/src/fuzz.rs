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

const TARGETS: &[&str] = &["dns_packet", "config_yaml", "resolv_conf", "http_form"];

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
    for target in targets {
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
            bail!(
                "fuzz target {target} failed; the input is in fuzz/artifacts/{target}/: \
                 copy it to fuzz/regressions/{target}/ and fix the bug"
            );
        }
    }
    Ok(())
}
