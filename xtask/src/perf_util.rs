//! What every `cargo xtask perf …` harness needs: the release `dwara` binary, free
//! ports, a process's resident memory and CPU time.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Waits (60 s) until `child`, a `dwara serve` called `what` in errors, accepts
/// connections on `http`; fails at once if it exits first.
pub(crate) fn await_listening(
    child: &mut Child,
    http: SocketAddr,
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(http).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited: {status}");
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {http} within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// A `dwara serve` a harness started; killed on drop.
pub(crate) struct Dwara {
    pub(crate) http: SocketAddr,
    pub(crate) child: Child,
}

impl Drop for Dwara {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `cmd`, a `dwara serve … --http-listen http` called `what` in errors, and
/// waits until it listens.
pub(crate) fn spawn_dwara(mut cmd: Command, http: SocketAddr, what: &str) -> anyhow::Result<Dwara> {
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {what}"))?;
    let mut d = Dwara { http, child };
    await_listening(&mut d.child, http, what)?;
    Ok(d)
}

/// Runs `program args…`: its standard output, trimmed, or an error with its
/// standard error when it fails.
pub(crate) fn output_of(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Where `cargo build --release` put `dwara` (`CARGO_TARGET_DIR` or the workspace's).
/// Runs `f` in a fresh scratch directory `$TMPDIR/dwara-<name>-<pid>`, removed
/// afterwards whatever `f` returned.
pub(crate) fn in_scratch_dir(
    name: &str,
    f: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("dwara-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = f(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

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

/// Clock ticks per second of `/proc/*/stat` times.
pub(crate) fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// (utime + stime, cutime + cstime) of `pid` in clock ticks (see [`cpu_split`]).
pub(crate) fn cpu_ticks(pid: &str) -> Option<(u64, u64)> {
    cpu_split(pid).map(|c| (c.user + c.sys, c.child_user + c.child_sys))
}

/// User and system time of `pid` in clock ticks, its own (`utime`, `stime`) and its
/// waited-for children's (`cutime`, `cstime`): `/proc/PID/stat` fields 14–17 (the
/// name in parentheses may hold spaces, so they are counted after it).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuSplit {
    pub(crate) user: u64,
    pub(crate) sys: u64,
    pub(crate) child_user: u64,
    pub(crate) child_sys: u64,
}

/// [`CpuSplit`] of `pid` (or `"self"`).
pub(crate) fn cpu_split(pid: &str) -> Option<CpuSplit> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    (f.len() == 4).then(|| CpuSplit {
        user: f[0],
        sys: f[1],
        child_user: f[2],
        child_sys: f[3],
    })
}

/// Context switches (voluntary + involuntary) of every thread of `pid`, summed over
/// `/proc/PID/task/*/status`; threads that exited are not counted.
pub(crate) fn context_switches(pid: u32) -> Option<u64> {
    task_status_sum(pid, "ctxt_switches:")
}

/// Involuntary context switches (the scheduler took the CPU away while the thread
/// could still run) of every thread of `pid`, as [`context_switches`] counts them;
/// 0 when the process is gone.
pub(crate) fn preemptions(pid: u32) -> u64 {
    task_status_sum(pid, "nonvoluntary_ctxt_switches:").unwrap_or(0)
}

/// The sum over every thread of `pid` of the values of the `/proc/PID/task/*/status`
/// lines whose name ends with `field` (`ctxt_switches:` takes both kinds); `None`
/// when the process is gone.
fn task_status_sum(pid: u32, field: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(status) = std::fs::read_to_string(task.ok()?.path().join("status")) else {
            continue;
        };
        total += status
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|name| name.ends_with(field))
            })
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    Some(total)
}

/// The median of `v` (the upper one of an even count); NaN when empty.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// The `--flag value` pairs of a harness's command line, checked against the flags
/// it knows.
#[derive(Debug, Default)]
pub(crate) struct Flags {
    values: Vec<(String, String)>,
}

/// Reads `args` as `--flag value` pairs; a flag not in `known`, or one without a
/// value, is an error that shows `usage`.
pub(crate) fn parse_flags(args: &[String], known: &[&str], usage: &str) -> anyhow::Result<Flags> {
    let mut flags = Flags::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if !known.contains(&flag.as_str()) {
            bail!("unknown argument {flag:?}; {usage}");
        }
        let value = it
            .next()
            .with_context(|| format!("{flag} needs a value; {usage}"))?;
        flags.values.push((flag.clone(), value.clone()));
    }
    Ok(flags)
}

impl Flags {
    /// The last value given for `flag`.
    pub(crate) fn text(&self, flag: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `flag` as a whole number of at least 1, or `default`.
    pub(crate) fn count<T: TryFrom<u64>>(&self, flag: &str, default: T) -> anyhow::Result<T> {
        let Some(v) = self.text(flag) else {
            return Ok(default);
        };
        let n: u64 = v
            .parse()
            .with_context(|| format!("{flag} needs a number, got {v:?}"))?;
        T::try_from(n.max(1)).map_err(|_| anyhow::anyhow!("{flag} {v} is too large"))
    }

    /// The value of `flag` as a path.
    pub(crate) fn path(&self, flag: &str) -> Option<PathBuf> {
        self.text(flag).map(PathBuf::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn flags_take_values_and_refuse_what_they_do_not_know() {
        let f = parse_flags(
            &args(&["--rounds", "3", "--dwara", "/x"]),
            &["--rounds", "--dwara", "--seconds"],
            "u",
        )
        .unwrap();
        assert_eq!(f.count("--rounds", 5usize).unwrap(), 3);
        assert_eq!(f.count("--seconds", 5u32).unwrap(), 5);
        assert_eq!(f.path("--dwara"), Some(PathBuf::from("/x")));
        let zero = parse_flags(&args(&["--rounds", "0"]), &["--rounds"], "u").unwrap();
        assert_eq!(zero.count("--rounds", 5usize).unwrap(), 1);
        assert!(zero.count::<u8>("--rounds", 1).is_ok());
        let e = parse_flags(&args(&["--nope", "1"]), &["--rounds"], "usage: x").unwrap_err();
        assert!(e.to_string().contains("\"--nope\""), "{e}");
        let e = parse_flags(&args(&["--rounds"]), &["--rounds"], "usage: x").unwrap_err();
        assert!(e.to_string().contains("--rounds needs a value"), "{e}");
        let bad = parse_flags(&args(&["--rounds", "x"]), &["--rounds"], "u").unwrap();
        assert!(bad.count("--rounds", 1usize).is_err());
        let big = parse_flags(&args(&["--rounds", "300"]), &["--rounds"], "u").unwrap();
        assert!(big.count::<u8>("--rounds", 1).is_err());
    }
}
