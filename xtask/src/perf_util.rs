//! What every `cargo xtask perf …` harness needs: the release `dwara` binary, free
//! ports, a process's resident memory.

use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

/// Where `cargo build --release` put `dwara` (`CARGO_TARGET_DIR` or the workspace's).
pub(crate) fn release_dwara() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
            PathBuf::from,
        )
        .join("release/dwara")
}

/// A port free for both UDP and TCP on `ip` now.
pub(crate) fn free_port(ip: Ipv4Addr) -> anyhow::Result<u16> {
    loop {
        let udp = UdpSocket::bind((ip, 0))?;
        let port = udp.local_addr()?.port();
        if TcpListener::bind((ip, port)).is_ok() {
            return Ok(port);
        }
    }
}

/// Resident set size of `pid` in KiB.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}
