//! `cargo xtask pgo`: the `dwara` binary built with profile-guided optimisation.
//!
//! ```text
//! cargo xtask pgo
//! ```
//!
//! 1. Adds rustup's `llvm-tools` component when its `llvm-profdata` is missing (the
//!    one that reads the profiles this `rustc` writes).
//! 2. Builds `dwara` instrumented (`-Cprofile-generate`) in `target/pgo/generate`.
//! 3. Trains it with short runs of the loads the benchmarks use, each against the
//!    instrumented binary: `perf http` (keep-alive requests, a new connection per
//!    request, 1 MiB bodies, the 503 with nothing to route to; HTTP API
//!    registrations), `perf l4` (forwarded connections) and `perf dns` (UDP and TCP
//!    answers of the name server, 1,000 names registered over HTTP). Code no load
//!    runs is laid out as cold, so it may run a little slower than in the plain
//!    release build.
//! 4. Merges the profiles into `target/pgo/dwara.profdata` and builds `dwara` with
//!    them (`-Cprofile-use`) in `target/pgo/use`; prints that binary's path.
//!
//! The plain release build (`cargo build --release`, and so the README's `cargo run
//! --release -p dwara -- serve`) does not use the profile. `cargo xtask perf http
//! --dwara target/pgo/use/release/dwara --before target/release/dwara` measures the
//! two side by side (docs/PERFORMANCE.md). It takes about two release builds and
//! three minutes of loads.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::perf_util::release_dwara;

/// The workspace's target directory (`target`, or `CARGO_TARGET_DIR`).
pub(crate) fn target_dir() -> PathBuf {
    let bin = release_dwara();
    bin.parent()
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
}

fn rustc_output(args: &[&str]) -> anyhow::Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(&rustc)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {rustc}"))?;
    if !out.status.success() {
        bail!(
            "{rustc} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The host triple in `rustc -vV`'s output.
fn host_triple(verbose_version: &str) -> Option<&str> {
    verbose_version
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::trim)
}

/// `llvm-profdata` of the toolchain that builds dwara, added with rustup when missing.
fn llvm_profdata() -> anyhow::Result<PathBuf> {
    let sysroot = rustc_output(&["--print", "sysroot"])?;
    let version = rustc_output(&["-vV"])?;
    let host = host_triple(&version).context("rustc -vV names no host")?;
    let path = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin/llvm-profdata");
    if !path.exists() {
        println!("pgo: adding rustup's llvm-tools component (for llvm-profdata)");
        let status = Command::new("rustup")
            .args(["component", "add", "llvm-tools"])
            .status()
            .context("cannot run rustup")?;
        if !status.success() || !path.exists() {
            bail!(
                "{} is missing and `rustup component add llvm-tools` did not add it",
                path.display()
            );
        }
    }
    Ok(path)
}

fn strs(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// Which binary a profile is made for: its symbols must be the trained ones, and
/// cargo names them after the target it builds for.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Build {
    /// `cargo build --release`: `TARGET/pgo/use/release/dwara`.
    Host,
    /// The container image's static binary (`--target x86_64-unknown-linux-gnu`,
    /// `crt-static`): `TARGET/pgo/static/use/x86_64-unknown-linux-gnu/release/dwara`.
    Static,
}

/// The static build's target triple.
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

impl Build {
    /// Where its instrumented and optimised builds, profiles and merged profile go.
    fn base(self) -> anyhow::Result<PathBuf> {
        let base = match self {
            Self::Host => target_dir().join("pgo"),
            Self::Static => target_dir().join("pgo").join("static"),
        };
        std::fs::create_dir_all(&base)?;
        Ok(std::fs::canonicalize(&base)?)
    }

    /// `cargo build` of dwara for this build, with `flags` as `RUSTFLAGS`, into
    /// `dir`; the binary's path.
    fn cargo(self, dir: &Path, flags: &str) -> anyhow::Result<PathBuf> {
        let mut args = vec!["build", "--release", "-p", "dwara"];
        let mut rustflags = flags.to_owned();
        let binary = match self {
            Self::Host => dir.join("release/dwara"),
            Self::Static => {
                args.extend(["--target", TRIPLE]);
                rustflags.insert_str(0, "-C target-feature=+crt-static ");
                dir.join(TRIPLE).join("release/dwara")
            }
        };
        crate::cargo_with(
            &args,
            &[
                ("CARGO_TARGET_DIR", &dir.to_string_lossy()),
                ("RUSTFLAGS", &rustflags),
            ],
        )?;
        Ok(binary)
    }
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    if let Some(a) = args.first() {
        bail!("unknown argument {a:?}; usage: cargo xtask pgo");
    }
    make(Build::Host).map(|_| ())
}

/// Builds `build` instrumented, trains it, merges its profiles and builds it with
/// them; the optimised binary's path.
pub(crate) fn make(build: Build) -> anyhow::Result<PathBuf> {
    crate::tools::ensure()?;
    crate::tools::ensure_perf_http()?;
    let profdata = llvm_profdata()?;
    let base = build.base()?;
    let profiles = base.join("profiles");
    if profiles.exists() {
        std::fs::remove_dir_all(&profiles)?;
    }
    std::fs::create_dir_all(&profiles)?;

    println!("pgo: building the instrumented dwara ({build:?})");
    let trainee = build.cargo(
        &base.join("generate"),
        &format!("-Cprofile-generate={}", profiles.display()),
    )?;
    let trainee = trainee.to_string_lossy();
    train(&trainee)?;

    let raw: Vec<PathBuf> = std::fs::read_dir(&profiles)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "profraw"))
        .collect();
    if raw.is_empty() {
        bail!(
            "the training wrote no profile into {} (did dwara exit on SIGTERM?)",
            profiles.display()
        );
    }
    let merged = base.join("dwara.profdata");
    let status = Command::new(&profdata)
        .arg("merge")
        .arg("-o")
        .arg(&merged)
        .args(&raw)
        .status()
        .with_context(|| format!("cannot run {}", profdata.display()))?;
    if !status.success() {
        bail!("llvm-profdata merge failed ({status})");
    }

    println!("pgo: building dwara with the profile");
    let binary = build.cargo(
        &base.join("use"),
        &format!("-Cprofile-use={}", merged.display()),
    )?;
    println!(
        "pgo: built {} (profile {}, merged from {} files the training wrote)",
        binary.display(),
        merged.display(),
        raw.len()
    );
    Ok(binary)
}

/// Runs the loads the benchmarks use against the instrumented `trainee`.
fn train(trainee: &str) -> anyhow::Result<()> {
    println!("pgo: training it (perf http, perf l4, perf dns: one short round each)");
    // One round of 3 s against the trainee, with `extra` arguments.
    let round = |extra: &[&str]| {
        let mut args = strs(&["--rounds", "1", "--seconds", "3", "--dwara", trainee]);
        args.extend(strs(extra));
        args
    };
    crate::perf_http::run(&round(&[]))?;
    crate::perf_l4::run(&round(&["--proxies", "dwara,dwara-1t"]))?;
    crate::perf_dns::run(&round(&[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_triple_is_read_from_rustc_vv() {
        let vv = "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\n\
                  host: x86_64-unknown-linux-gnu\nrelease: 1.95.0\n";
        assert_eq!(host_triple(vv), Some("x86_64-unknown-linux-gnu"));
        assert_eq!(host_triple("rustc 1.95.0\n"), None);
    }

    #[test]
    fn arguments_are_refused() {
        let err = run(&strs(&["--rounds", "3"])).unwrap_err().to_string();
        assert!(err.contains("unknown argument \"--rounds\""), "{err}");
    }
}
