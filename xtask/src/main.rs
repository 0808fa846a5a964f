//! `cargo xtask`: the one entry point for CI, benchmarks, fuzzing and performance runs.
//!
//! - `cargo xtask ci` makes sure the system tools the tests use are installed, then runs
//!   `cargo fmt --check`, `cargo clippy --all-targets --all-features -- -D warnings`,
//!   checks `dwara-dns-cache` and `dwara-discovery` without their optional features,
//!   builds the container image unoptimised (tag [`CI_IMAGE`], which the end-to-end
//!   image test runs), runs `cargo test --all-features` with `DWARA_REQUIRE_ALL=1` (a
//!   test whose prerequisite, Docker or network namespaces, is missing fails instead
//!   of skipping), `cargo doc` with warnings as errors, and `cargo package` of every
//!   publishable crate (each built from its package alone); then the same checks for
//!   `crates/pingora`, a workspace of its own.
//! - `cargo xtask tools` installs the system tools the tests use.
//! - `cargo xtask package` runs `cargo package` of every publishable crate, as `ci`
//!   does, after removing the packages and units an earlier run left for cargo to
//!   reuse (see the `package` module).
//! - `cargo xtask bench [ARGS]` runs the criterion benchmarks.
//! - `cargo xtask perf dns [--names N]` compares the name server with dnsmasq and unbound.
//! - `cargo xtask perf store [--names N] [--connections C]` times HTTP registration in
//!   memory vs with `--data-dir`; `perf store --one-name` times `N` instances of one
//!   name against `N` distinct names.
//! - `cargo xtask perf cluster [--sizes 3,5,10] [--sync 10000,50000]` times gossip
//!   replication between `dwara serve` processes; `perf cluster --faults` runs the
//!   network fault scenarios, `perf cluster --simulate 100,1000` the in-process
//!   simulation of large clusters.
//! - `cargo xtask perf l4 [--rounds R] [--seconds S] [--proxies …]` compares dwara's
//!   L4 upstreams with HAProxy and nginx `stream` under wrk.
//! - `cargo xtask perf http [--rounds R] [--seconds S] [--pin]` compares dwara's HTTP
//!   upstreams with HAProxy `mode http`, nginx `proxy_pass` and Caddy `reverse_proxy`
//!   under wrk, and the latency of the 503 with nothing to route to with HAProxy's;
//!   `--pin` runs each proxy on CPU 0 and wrk and the backend on the others,
//!   `--loads` runs only the loads named, `--quota PERCENT` holds each proxy to
//!   that share of one CPU, `--keep-busy` keeps the proxies' CPU from idling (an
//!   idle-priority spinner, `cargo xtask perf spin`); dwara-1t's round-by-round
//!   ratios come with a 95% confidence interval.
//! - `cargo xtask perf tunnel [--rounds R] [--seconds S]` compares dwara's HTTP/1.1
//!   upgrade tunnels with HAProxy's, nginx's and Caddy's: ping-pong messages and bulk
//!   echo through each to an upgrade-echo backend (`cargo xtask perf tunnel-backend
//!   --listen ADDR`, this xtask as a process of its own).
//! - `cargo xtask perf http-instructions [--seconds S] [--before PATH] [--haproxy]
//!   [--cache] [--new-connections] [--keep DIR]` counts the instructions per proxied
//!   keep-alive request under callgrind (steady where the rates of `perf http` are
//!   not), HAProxy's too with `--haproxy`, the cache misses per request with
//!   `--cache`, and per request on a new connection with `--new-connections`; `--keep DIR`
//!   keeps the callgrind dumps for `callgrind_annotate`.
//! - `cargo xtask perf rolling [--replacements N] [--rate R] [--keep-logs DIR]`
//!   replaces backend instances one by one (each killed before its name is deleted)
//!   under a fixed-rate keep-alive client, through dwara HTTP (push-fed and polled),
//!   dwara L4, HAProxy and Caddy, and counts failed requests.
//! - `cargo xtask perf push [--rounds R] [--docker]` times an endpoint into and out of
//!   an upstream's rotation, fed by push from the name server in the same process vs
//!   polling it over DNS.
//! - `cargo xtask perf guard [--qps N] [--seconds S] [--legit-qps N]`: a forged-source
//!   flood against the DNS rate limit (reply vs request bytes, limit off and on) and
//!   what a legitimate dnsperf client sees meanwhile, in network namespaces.
//! - `cargo xtask pgo` builds `dwara` with profile-guided optimisation, trained on
//!   short runs of `perf http`, `perf l4` and `perf dns` (see the `pgo` module), as
//!   `target/pgo/use/release/dwara`.
//! - `cargo xtask fuzz [TARGET...] [--seconds N] [--idle]` runs the cargo-fuzz targets (nightly).
//! - `cargo xtask image [--tag T] [--debug | --pgo] [--no-save]` builds the container image
//!   (`FROM scratch`, the static binary) and saves it as a tar for `docker load`.
//!
//! `cargo xtask help` prints the usage; an unknown command prints it and exits 2.
//!
//! `perf`, `pgo` and `image --pgo` always run an optimised xtask (a debug one hands
//! over to `cargo run --release -p xtask`): the harness is the client of what it
//! measures, and of what it trains.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

mod fuzz;
mod image;
mod package;
mod perf_cluster;
mod perf_cluster_faults;
mod perf_dns;
mod perf_guard;
mod perf_http;
mod perf_http_instructions;
mod perf_l4;
mod perf_push;
mod perf_rolling;
mod perf_store;
mod perf_tunnel;
mod perf_util;
mod pgo;
mod tidy;
mod tidy_deps;
mod tools;

use std::process::Command;

use anyhow::{Context, bail};

/// Every command, as `cargo xtask help` prints it.
const USAGE: &str = "usage: cargo xtask COMMAND
commands:
  ci                   tools, fmt, clippy, image, tests (DWARA_REQUIRE_ALL=1), docs
  tools                install the system tools the tests use
  package              cargo package of every publishable crate (the last step of ci)
  bench [ARGS]         the criterion benchmarks
  fuzz [TARGET...] [--seconds N] [--idle]
  image [--tag T] [--debug | --pgo] [--no-save]
  perf dns [--names N]
  perf store [--one-name] [--names N] [--connections C] [--rounds R] [--dir PARENT]
  perf cluster [--sizes 3,5,10] [--sync 10000,50000] | --faults | --simulate 100,1000
  perf l4 [--rounds R] [--seconds S] [--proxies ...]
  perf http [--rounds R] [--seconds S] [--dwara PATH] [--before PATH] [--pin]
            [--loads keep-alive,new-connection,bodies,503] [--quota PERCENT] [--keep-busy]
  perf spin            the idle-priority spinner perf http --keep-busy runs
  perf tunnel [--rounds R] [--seconds S] [--threads T] [--dwara PATH]
  perf tunnel-backend --listen ADDR  the upgrade-echo server perf tunnel runs
  perf http-instructions [--seconds S] [--dwara PATH] [--before PATH] [--haproxy] [--cache]
                       [--new-connections] [--keep DIR]
  perf rolling [--replacements N] [--rate R] [--keep-logs DIR]
  perf push [--rounds R] [--docker]
  perf guard [--qps N] [--seconds S] [--legit-qps N]
  perf guard-flood ... the flooder perf guard runs in a network namespace
  pgo                  dwara built with profile-guided optimisation (target/pgo/use)
  help                 this text";

/// What `cargo xtask perf` runs.
const PERF_COMMANDS: [&str; 13] = [
    "dns",
    "store",
    "cluster",
    "l4",
    "http",
    "http-instructions",
    "tunnel",
    "tunnel-backend",
    "rolling",
    "push",
    "guard",
    "guard-flood",
    "spin",
];

/// The exit status of a command line that names no command.
const USAGE_ERROR: i32 = 2;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    match cmd {
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        "ci" => ci(),
        "tools" => tools::ensure(),
        "package" => package::run(),
        "bench" => cargo(&[&["bench", "-p", "dwara-benches"], &as_strs(rest)[..]].concat()),
        "fuzz" => fuzz::run(rest),
        // `--pgo` trains the binary with the perf harnesses, as `pgo` does.
        "image" if cfg!(debug_assertions) && rest.iter().any(|a| a == "--pgo") => {
            in_release_xtask("image", rest)
        }
        "image" => image::run(&image::ImageArgs::parse(rest)?),
        // The harnesses are clients too (registrations over HTTP, process control):
        // built for debugging, the client measured itself (perf dns registered at a
        // quarter of the server's rate). A debug xtask runs its release build instead.
        "perf"
            if !rest
                .first()
                .is_some_and(|w| PERF_COMMANDS.contains(&w.as_str())) =>
        {
            usage_error(&format!("perf {}", rest.first().map_or("", String::as_str)))
        }
        "pgo" if cfg!(debug_assertions) => in_release_xtask("pgo", rest),
        "pgo" => pgo::run(rest),
        "perf" if cfg!(debug_assertions) => in_release_xtask("perf", rest),
        "perf" => match rest.split_first() {
            Some((what, rest)) if what == "dns" => {
                tools::ensure()?;
                perf_dns::run(rest)
            }
            Some((what, rest)) if what == "store" => perf_store::run(rest),
            Some((what, rest)) if what == "cluster" => perf_cluster::run(rest),
            Some((what, rest)) if what == "l4" => perf_l4::run(rest),
            Some((what, rest)) if what == "http" => perf_http::run(rest),
            Some((what, rest)) if what == "http-instructions" => perf_http_instructions::run(rest),
            Some((what, rest)) if what == "tunnel" => perf_tunnel::run(rest),
            Some((what, rest)) if what == "tunnel-backend" => perf_tunnel::backend_main(rest),
            Some((what, rest)) if what == "rolling" => perf_rolling::run(rest),
            Some((what, rest)) if what == "push" => perf_push::run(rest),
            Some((what, rest)) if what == "guard" => {
                tools::ensure()?;
                perf_guard::run(rest)
            }
            Some((what, rest)) if what == "guard-flood" => perf_guard::flood_main(rest),
            Some((what, rest)) if what == "spin" => perf_http::spin_main(rest),
            Some((what, _)) => usage_error(&format!("perf {what}")),
            None => usage_error("perf"),
        },
        other => usage_error(other),
    }
}

/// An unknown command: the usage on stderr, exit status 2 (as for a bad command line).
fn usage_error(what: &str) -> ! {
    eprintln!("xtask: unknown command {what:?}\n{USAGE}");
    std::process::exit(USAGE_ERROR);
}

/// The tag of the image `cargo xtask ci` builds and tests.
const CI_IMAGE: &str = "dwara-ci:latest";

/// `cargo xtask COMMAND REST` run again by the release build of xtask (what a
/// debug xtask does for the commands whose harness must not measure itself).
fn in_release_xtask(command: &str, rest: &[String]) -> anyhow::Result<()> {
    let run = [
        "run",
        "--release",
        "--quiet",
        "--package",
        "xtask",
        "--",
        command,
    ];
    cargo(&[&run[..], &as_strs(rest)[..]].concat())
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The README's test command: tools, format, lints, tests, docs.
fn ci() -> anyhow::Result<()> {
    tools::ensure()?;
    cargo(&["fmt", "--all", "--check"])?;
    // Every feature on: optional integrations (the dial-path cache's reqwest
    // resolver) are built, linted and tested like the rest.
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    // And the crates with optional features without any of them, as a proxy author
    // who takes only the core gets them.
    cargo(&[
        "check",
        "-p",
        "dwara-dns-cache",
        "-p",
        "dwara-discovery",
        "--no-default-features",
    ])?;
    // The image from the repository's Dockerfile, which the tests run when
    // `DWARA_IMAGE` names it (the end-to-end container test).
    image::run(&image::ImageArgs::for_tests(CI_IMAGE))?;
    // A test whose prerequisite (Docker, network namespaces) is missing fails here
    // rather than skipping: a machine without them cannot pass.
    cargo_with(
        &["test", "--workspace", "--all-features"],
        &[("DWARA_IMAGE", CI_IMAGE), ("DWARA_REQUIRE_ALL", "1")],
    )?;
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
    package::run()?;
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

#[cfg(test)]
mod tests {
    /// Every command `main` dispatches is in the usage and in the module docs.
    #[test]
    fn usage_and_module_docs_list_every_command() {
        let src = include_str!("main.rs");
        let main =
            &src[src.find("fn main()").unwrap_or(0)..src.find("fn usage_error").unwrap_or(0)];
        let mut commands: Vec<String> = main
            .match_indices("what == \"")
            .map(|(at, m)| {
                let name = &main[at + m.len()..];
                format!("perf {}", &name[..name.find('"').unwrap_or(0)])
            })
            .collect();
        for line in main.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix('"')
                && let Some(end) = rest.find('"')
                && line.contains("=>")
                && !line.contains("--help")
            {
                commands.push(rest[..end].to_owned());
            }
        }
        assert!(commands.len() >= 12, "found only {commands:?}");
        let docs: String = src
            .lines()
            .filter_map(|l| l.strip_prefix("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        for c in &commands {
            assert!(
                super::USAGE.contains(&format!("  {c}")),
                "{c} is not in USAGE"
            );
            if c != "perf guard-flood" && c != "help" {
                assert!(
                    docs.contains(&format!("cargo xtask {c}")),
                    "{c} is not in the module docs"
                );
            }
        }
    }
}
