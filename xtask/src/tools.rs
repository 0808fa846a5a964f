//! Makes sure the system tools the tests and perf runs use are installed.
//!
//! Run as root (CI, a fresh machine) it installs what is missing with apt-get,
//! quietly, running `apt-get update` once first; as another user it stops with the
//! exact line to run. [`ensure`] covers what the tests need (the CI command);
//! [`ensure_perf_l4`] adds what only `cargo xtask perf l4` runs, so CI does not
//! install it.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// (program looked for on PATH, Debian package that provides it).
const TOOLS: &[(&str, &str)] = &[
    ("dnsmasq", "dnsmasq"),
    ("dig", "bind9-dnsutils"),
    ("dnsperf", "dnsperf"),
    ("unbound", "unbound"),
    // Docker tests build their images from Debian's static busybox.
    ("busybox", "busybox-static"),
    // Cluster tests shift one node's wall clock.
    ("faketime", "faketime"),
    // Cluster tests and perf reach nodes inside network namespaces over HTTP.
    ("curl", "curl"),
    // Docker reconnect tests cut the daemon socket with a socat relay.
    ("socat", "socat"),
    // Cluster tests build hosts from network namespaces and veth pairs.
    ("ip", "iproute2"),
    // Fault tests drop packets (statistic match) and queue them to a delayer (NFQUEUE).
    ("iptables", "iptables"),
    // Interop tests put HAProxy and Caddy in front of dwara's SRV and A answers.
    ("haproxy", "haproxy"),
    ("caddy", "caddy"),
    // Interop tests point Prometheus' dns_sd_configs (SRV) at dwara, from a mount
    // namespace whose /etc/resolv.conf names it.
    ("prometheus", "prometheus"),
    ("unshare", "util-linux"),
    // Pingora's compression (flate2 with zlib-ng) builds zlib-ng with CMake.
    ("cmake", "cmake"),
];

/// What `cargo xtask perf l4` needs: the backend, the client and the peer proxies
/// (an absolute path is a file to look for, here nginx's dynamic stream module).
/// HAProxy is in [`TOOLS`] too, for the interop tests.
const PERF_L4_TOOLS: &[(&str, &str)] = &[
    ("nginx", "nginx-light"),
    (
        "/usr/lib/nginx/modules/ngx_stream_module.so",
        "libnginx-mod-stream",
    ),
    ("haproxy", "haproxy"),
    ("wrk", "wrk"),
];

/// What `cargo xtask perf http` and `perf rolling` run beside dwara.
const PERF_HTTP_TOOLS: &[(&str, &str)] = &[
    ("nginx", "nginx-light"),
    ("haproxy", "haproxy"),
    ("caddy", "caddy"),
    ("wrk", "wrk"),
];

/// What `cargo xtask perf http-instructions` runs (program, Debian package).
const PERF_HTTP_INSTRUCTIONS_TOOLS: &[(&str, &str)] = &[
    ("nginx", "nginx-light"),
    ("wrk", "wrk"),
    ("valgrind", "valgrind"),
];

fn on_path(program: &str) -> bool {
    if program.starts_with('/') {
        return Path::new(program).is_file();
    }
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path)
        .chain([
            Path::new("/usr/sbin").to_path_buf(),
            Path::new("/sbin").to_path_buf(),
        ])
        .any(|dir| dir.join(program).is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Installs the missing test tools, or fails naming the install command.
pub(crate) fn ensure() -> anyhow::Result<()> {
    install_missing(TOOLS)
}

/// Installs the missing `perf l4` tools, or fails naming the install command.
pub(crate) fn ensure_perf_l4() -> anyhow::Result<()> {
    install_missing(PERF_L4_TOOLS)
}

/// Installs the missing `perf http` / `perf rolling` tools, or fails naming the
/// install command.
pub(crate) fn ensure_perf_http() -> anyhow::Result<()> {
    install_missing(PERF_HTTP_TOOLS)
}

/// Installs what `cargo xtask perf http-instructions` needs when missing.
pub(crate) fn ensure_perf_http_instructions() -> anyhow::Result<()> {
    install_missing(PERF_HTTP_INSTRUCTIONS_TOOLS)
}

fn install_missing(tools: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(prog, _)| !on_path(prog))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let line = format!("apt-get install -y {}", missing.join(" "));
    if !is_root() {
        bail!("missing test tools; run: sudo apt-get update && sudo {line}");
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run_quiet(Command::new("apt-get").arg("update").arg("-qq"))?;
    run_quiet(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing),
    )
    .with_context(|| format!("`{line}` failed"))?;
    // The Debian packages start system services on install; the tests start their
    // own instances on loopback ports and do not want these.
    for svc in ["dnsmasq", "unbound", "nginx", "haproxy", "caddy"] {
        let _ = Command::new("service")
            .args([svc, "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    Ok(())
}

fn run_quiet(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
