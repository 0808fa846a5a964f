//! Makes sure the system tools the tests and perf runs use are installed.
//!
//! Run as root (CI, a fresh machine) it installs what is missing with apt-get,
//! quietly, running `apt-get update` once first; as another user it stops with the
//! exact line to run.

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
];

fn on_path(program: &str) -> bool {
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

/// Installs the missing tools, or fails naming the install command.
pub(crate) fn ensure() -> anyhow::Result<()> {
    let missing: Vec<&str> = TOOLS
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
    for svc in ["dnsmasq", "unbound"] {
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
