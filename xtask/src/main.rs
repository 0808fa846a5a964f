//! `cargo xtask`: the one entry point for CI, benchmarks, fuzzing and performance runs.
//!
//! - `cargo xtask ci` makes sure the system tools the tests use are installed, then runs
//!   `cargo fmt --check`, `cargo clippy --all-targets -- -D warnings`, builds the
//!   container image unoptimised (tag [`CI_IMAGE`], which the end-to-end image test
//!   runs), `cargo test`, `cargo doc` with warnings as errors, and `cargo package`
//!   of every publishable crate (each built from its package alone); then the same
//!   checks for `crates/pingora`, a workspace of its own.
//! - `cargo xtask bench [ARGS]` runs the criterion benchmarks.
//! - `cargo xtask perf dns [--names N]` compares the name server with dnsmasq and unbound.
//! - `cargo xtask perf store [--names N] [--connections C]` times HTTP registration in
//!   memory vs with `--data-dir`.
//! - `cargo xtask perf cluster [--sizes 3,5,10] [--sync 10000,50000]` times gossip
//!   replication between `dwara serve` processes; `perf cluster --faults` runs the
//!   network fault scenarios, `perf cluster --simulate 100,1000` the in-process
//!   simulation of large clusters.
//! - `cargo xtask perf l4 [--rounds R] [--seconds S] [--proxies …]` compares dwara's
//!   L4 upstreams with HAProxy and nginx `stream` under wrk.
//! - `cargo xtask perf push [--rounds R] [--docker]` times an endpoint into and out of
//!   an upstream's rotation, fed by push from the name server in the same process vs
//!   polling it over DNS.
//! - `cargo xtask perf guard [--qps N] [--seconds S] [--legit-qps N]`: a forged-source
//!   flood against the DNS rate limit (reply vs request bytes, limit off and on) and
//!   what a legitimate dnsperf client sees meanwhile, in network namespaces.
//! - `cargo xtask fuzz [TARGET...] [--seconds N] [--idle]` runs the cargo-fuzz targets (nightly).
//! - `cargo xtask image [--tag T] [--debug] [--no-save]` builds the container image
//!   (`FROM scratch`, the static binary) and saves it as a tar for `docker load`.
//!
//! `perf` always runs an optimised xtask (a debug one hands over to `cargo run
//! --release -p xtask`): the harness is the client of what it measures.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

mod fuzz;
mod image;
mod perf_cluster;
mod perf_cluster_faults;
mod perf_dns;
mod perf_guard;
mod perf_l4;
mod perf_push;
mod perf_store;
mod perf_util;
mod tidy;
mod tidy_deps;
mod tools;

use std::process::Command;

use anyhow::{Context, bail};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    match cmd {
        "ci" => ci(),
        "tools" => tools::ensure(),
        "bench" => cargo(&[&["bench", "-p", "dwara-benches"], &as_strs(rest)[..]].concat()),
        "fuzz" => fuzz::run(rest),
        "image" => image::run(&image::ImageArgs::parse(rest)?),
        // The harnesses are clients too (registrations over HTTP, process control):
        // built for debugging, the client measured itself (perf dns registered at a
        // quarter of the server's rate). A debug xtask runs its release build instead.
        "perf" if cfg!(debug_assertions) => cargo(
            &[
                &[
                    "run",
                    "--release",
                    "--quiet",
                    "--package",
                    "xtask",
                    "--",
                    "perf",
                ],
                &as_strs(rest)[..],
            ]
            .concat(),
        ),
        "perf" => match rest.split_first() {
            Some((what, rest)) if what == "dns" => {
                tools::ensure()?;
                perf_dns::run(rest)
            }
            Some((what, rest)) if what == "store" => perf_store::run(rest),
            Some((what, rest)) if what == "cluster" => perf_cluster::run(rest),
            Some((what, rest)) if what == "l4" => perf_l4::run(rest),
            Some((what, rest)) if what == "push" => perf_push::run(rest),
            Some((what, rest)) if what == "guard" => {
                tools::ensure()?;
                perf_guard::run(rest)
            }
            Some((what, rest)) if what == "guard-flood" => perf_guard::flood_main(rest),
            _ => bail!("usage: cargo xtask perf dns|store|cluster|l4|push|guard [OPTIONS]"),
        },
        _ => {
            println!("usage: cargo xtask <ci|tools|bench|fuzz|image|perf dns|store|cluster|l4>");
            Ok(())
        }
    }
}

/// The tag of the image `cargo xtask ci` builds and tests.
const CI_IMAGE: &str = "dwara-ci:latest";

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The README's test command: tools, format, lints, tests, docs.
fn ci() -> anyhow::Result<()> {
    tools::ensure()?;
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // The image from the repository's Dockerfile, which the tests run when
    // `DWARA_IMAGE` names it (the end-to-end container test).
    image::run(&image::ImageArgs::for_tests(CI_IMAGE))?;
    cargo_with(&["test", "--workspace"], &[("DWARA_IMAGE", CI_IMAGE)])?;
    // Crate docs are part of the change they describe: a broken link fails CI.
    cargo_with(
        &[
            "doc",
            "--workspace",
            "--no-deps",
            "--document-private-items",
            "--quiet",
        ],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    package()?;
    pingora()?;
    println!("xtask ci: all green");
    Ok(())
}

/// The crates that are never published: test and build tooling.
const UNPUBLISHED: &[&str] = &[
    "test-support",
    "dwara-fuzz-checks",
    "dwara-benches",
    "xtask",
];

/// `cargo package` for every publishable crate: each is packaged alone and built from
/// its package against the others packaged beside it, so a dependency without a
/// version, a file outside the package or metadata crates.io refuses fails here.
/// `--allow-dirty`: a developer's uncommitted change is packaged as it is.
fn package() -> anyhow::Result<()> {
    let mut args = vec!["package", "--workspace", "--allow-dirty", "--quiet"];
    for name in UNPUBLISHED {
        args.extend(["--exclude", name]);
    }
    cargo(&args)
}

/// `crates/pingora`, a workspace of its own (Pingora takes many minutes to build):
/// lints, tests (a Pingora proxy as a real process following DNS) and docs, once,
/// in the main target directory so the dependencies both share are built once.
fn pingora() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = root.join("crates/pingora/Cargo.toml").display().to_string();
    let manifest = manifest.as_str();
    let target = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| root.join("target").display().to_string());
    let env = [("CARGO_TARGET_DIR", target.as_str())];
    cargo_with(&["fmt", "--manifest-path", manifest, "--check"], &env)?;
    cargo_with(
        &[
            "clippy",
            "--manifest-path",
            manifest,
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &env,
    )?;
    cargo_with(
        &["test", "--manifest-path", manifest],
        &[
            ("CARGO_TARGET_DIR", target.as_str()),
            ("DWARA_REQUIRE_ALL", "1"),
        ],
    )?;
    cargo_with(
        &["doc", "--manifest-path", manifest, "--no-deps", "--quiet"],
        &[
            ("CARGO_TARGET_DIR", target.as_str()),
            ("RUSTDOCFLAGS", "-D warnings"),
        ],
    )
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    cargo_with(args, &[])
}

/// `cargo ARGS` with `env` set for it; fails unless it succeeds.
fn cargo_with(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("cannot run {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}
