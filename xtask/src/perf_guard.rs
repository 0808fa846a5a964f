//! `cargo xtask perf guard [--qps N] [--seconds S] [--legit-qps N]`: the DNS rate
//! limit against a forged-source flood, and what a legitimate client sees meanwhile.
//!
//! Two network namespaces joined by a veth pair: `srv` (10.77.0.1) runs `dwara serve
//! --dns-allow 0.0.0.0/0` (so the flood gets real answers: the worst case), with
//! `big.weave.local` holding 8 addresses (a 33-byte query, a 161-byte answer);
//! `cli` (10.77.0.2) runs the flooder and dnsperf. The flooder is this xtask
//! (`perf guard-flood`) inside `cli`, sending raw IPv4/UDP datagrams whose source is
//! a random address and port of the victim network 198.51.100.0/24, paced to
//! `--qps` (default 100,000; a loaded machine may send fewer, the achieved rate is
//! printed); `srv` routes the replies back to `cli`, which drops them. The server's
//! own counters (`dwara_dns_udp_request_bytes_total`, `…_reply_bytes_total`,
//! `dwara_dns_rate_limited_total`) give the bytes in and out.
//!
//! Phases, in one run: (1) dnsperf alone at `--legit-qps` (default 1000) from
//! 10.77.0.2 for `--seconds`; (2) the flood with the rate limit off, the baseline;
//! (3) the flood with the default rate limit; (4) the flood (rate limit on) and
//! dnsperf together; (5) the same with the server's UDP receive queue left at the
//! kernel's default (`--dns-udp-recv-buffer 0`), the baseline for (4). Printed: the
//! reply/request byte ratio of (2) and (3), dnsperf's lost queries and latency in
//! (1), (4) and (5), and the datagrams the kernel dropped at full receive queues in
//! the server's namespace (`RcvbufErrors`) in (4) and (5).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const SRV: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const CLI: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const VICTIM: [u8; 3] = [198, 51, 100];
const NAME: &str = "big.weave.local";
const ADDRESSES: u8 = 8;

struct Options {
    qps: u64,
    seconds: u64,
    legit_qps: u64,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        qps: 100_000,
        seconds: 10,
        legit_qps: 1000,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || -> anyhow::Result<u64> {
            it.next()
                .with_context(|| format!("{a} needs a value"))?
                .parse()
                .with_context(|| format!("{a}: not a number"))
        };
        match a.as_str() {
            "--qps" => o.qps = value()?,
            "--seconds" => o.seconds = value()?.max(1),
            "--legit-qps" => o.legit_qps = value()?,
            _ => bail!("usage: cargo xtask perf guard [--qps N] [--seconds S] [--legit-qps N]"),
        }
    }
    Ok(o)
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The two namespaces; deleted on drop.
struct Namespaces {
    srv: String,
    cli: String,
}

impl Namespaces {
    fn create() -> anyhow::Result<Self> {
        let tag = format!("dwguard{}", std::process::id());
        let me = Self {
            srv: format!("{tag}-srv"),
            cli: format!("{tag}-cli"),
        };
        ip(&["netns", "add", &me.srv]).context("network namespaces need root")?;
        ip(&["netns", "add", &me.cli])?;
        ip(&[
            "-n", &me.srv, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
            &me.cli,
        ])?;
        for (ns, addr) in [(&me.srv, SRV), (&me.cli, CLI)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        let victim = format!("{}.{}.{}.0/24", VICTIM[0], VICTIM[1], VICTIM[2]);
        ip(&[
            "-n",
            &me.srv,
            "route",
            "add",
            &victim,
            "via",
            &CLI.to_string(),
        ])?;
        Ok(me)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.srv]);
        let _ = ip(&["netns", "del", &self.cli]);
    }
}

fn in_ns(ns: &str, program: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, program]);
    c
}

/// `dwara serve` in `srv` with `args`; killed on drop.
struct Dwara(Child);

impl Drop for Dwara {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn curl(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = in_ns(ns, "curl")
        .args(["-s", "-f", "-m", "5"])
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!("curl {args:?} failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn start_dwara(
    ns: &Namespaces,
    rate_limit: Option<u32>,
    recv_buffer: Option<usize>,
) -> anyhow::Result<Dwara> {
    let mut cmd = in_ns(
        &ns.srv,
        &crate::perf_util::release_dwara().to_string_lossy(),
    );
    cmd.args(["serve", "--docker", "off", "--fallback", "127.0.0.1:9"])
        .args(["--dns-listen", &format!("{SRV}:53")])
        .args(["--http-listen", "127.0.0.1:6784"])
        .args(["--dns-allow", "0.0.0.0/0"]);
    if let Some(qps) = rate_limit {
        cmd.args(["--dns-rate-limit", &qps.to_string()]);
    }
    if let Some(bytes) = recv_buffer {
        cmd.args(["--dns-udp-recv-buffer", &bytes.to_string()]);
    }
    let child = cmd
        .env("DWARA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start dwara")?;
    let d = Dwara(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while curl(&ns.srv, &["http://127.0.0.1:6784/domain"]).is_err() {
        if Instant::now() > deadline {
            bail!("dwara did not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..ADDRESSES {
        curl(
            &ns.srv,
            &[
                "-X",
                "PUT",
                "-d",
                &format!("fqdn={NAME}"),
                &format!("http://127.0.0.1:6784/name/c{i}/10.32.0.{i}"),
            ],
        )?;
    }
    Ok(d)
}

/// The server's counters of interest.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    request_bytes: f64,
    reply_bytes: f64,
    slipped: f64,
    dropped: f64,
}

impl Counters {
    /// What the counters grew by since `before`.
    fn since(&self, before: &Counters) -> Counters {
        Counters {
            request_bytes: self.request_bytes - before.request_bytes,
            reply_bytes: self.reply_bytes - before.reply_bytes,
            slipped: self.slipped - before.slipped,
            dropped: self.dropped - before.dropped,
        }
    }
}

/// The datagrams a finished flooder says it sent (its `sent=N` line; 0 without one).
fn sent_by(out: &std::process::Output) -> u64 {
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("sent="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn counters(ns: &Namespaces) -> anyhow::Result<Counters> {
    let text = curl(&ns.srv, &["http://127.0.0.1:6784/metrics"])?;
    let get = |series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    };
    Ok(Counters {
        request_bytes: get("dwara_dns_udp_request_bytes_total"),
        reply_bytes: get("dwara_dns_udp_reply_bytes_total"),
        slipped: get("dwara_dns_rate_limited_total{action=\"slipped\"}"),
        dropped: get("dwara_dns_rate_limited_total{action=\"dropped\"}"),
    })
}

/// UDP datagrams the kernel dropped in `srv` because a socket's receive queue was
/// full (`RcvbufErrors` in the namespace's `/proc/net/snmp`).
fn rcvbuf_errors(ns: &Namespaces) -> anyhow::Result<u64> {
    let out = in_ns(&ns.srv, "cat").arg("/proc/net/snmp").output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        bail!("no Udp lines in /proc/net/snmp");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .context("no RcvbufErrors in /proc/net/snmp")
}

/// Starts the flooder in `cli` for `seconds`.
fn flood(ns: &Namespaces, opts: &Options) -> anyhow::Result<Child> {
    let me = std::env::current_exe()?;
    in_ns(&ns.cli, &me.to_string_lossy())
        .args(["perf", "guard-flood"])
        .args([&opts.qps.to_string(), &opts.seconds.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the flooder")
}

/// What dnsperf saw.
struct Legit {
    completed: u64,
    lost: u64,
    mean_ms: f64,
    max_ms: f64,
}

fn dnsperf(ns: &Namespaces, file: &std::path::Path, opts: &Options) -> anyhow::Result<Legit> {
    let out = in_ns(&ns.cli, "dnsperf")
        .args(["-s", &SRV.to_string(), "-d"])
        .arg(file)
        .args(["-Q", &opts.legit_qps.to_string()])
        .args(["-l", &opts.seconds.to_string(), "-c", "1", "-T", "1"])
        .output()
        .context("cannot run dnsperf")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("dnsperf failed: {text}");
    }
    let after = |key: &str| -> &str {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map_or("", str::trim)
    };
    let first = |s: &str| -> f64 {
        s.split_whitespace()
            .next()
            .and_then(|w| {
                w.trim_matches(|c: char| !c.is_ascii_digit() && c != '.')
                    .parse()
                    .ok()
            })
            .unwrap_or(f64::NAN)
    };
    let lat = after("Average Latency (s):");
    let max = lat
        .split("max")
        .nth(1)
        .map_or(f64::NAN, |s| first(s.trim_end_matches(')')));
    Ok(Legit {
        completed: first(after("Queries completed:")) as u64,
        lost: first(after("Queries lost:")) as u64,
        mean_ms: first(lat) * 1000.0,
        max_ms: max * 1000.0,
    })
}

/// One flood phase: (server counters over the phase, datagrams the flooder sent).
fn flood_phase(ns: &Namespaces, opts: &Options) -> anyhow::Result<(Counters, u64, f64)> {
    let before = counters(ns)?;
    let started = Instant::now();
    let child = flood(ns, opts)?;
    let out = child.wait_with_output()?;
    let wall = started.elapsed().as_secs_f64();
    let sent = sent_by(&out);
    // The server may still be working through its queue: let it drain.
    std::thread::sleep(Duration::from_millis(500));
    let after = counters(ns)?;
    Ok((after.since(&before), sent, wall))
}

/// Runs the measurement.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    crate::cargo(&["build", "--release", "-p", "dwara"])?;
    crate::perf_util::in_scratch_dir("perf-guard", |dir| run_in(dir, &opts))
}

fn run_in(dir: &std::path::Path, opts: &Options) -> anyhow::Result<()> {
    let ns = Namespaces::create()?;
    let qfile = dir.join("queries");
    std::fs::write(&qfile, format!("{NAME} A\n"))?;
    println!(
        "perf guard: forged flood of {} qps from {}.{}.{}.0/24 (random addresses and ports) for {} s, \
         {NAME} A ({ADDRESSES} addresses); legitimate client: dnsperf -Q {} from {CLI}",
        opts.qps, VICTIM[0], VICTIM[1], VICTIM[2], opts.seconds, opts.legit_qps
    );

    let off = start_dwara(&ns, Some(0), None)?;
    let alone = dnsperf(&ns, &qfile, opts)?;
    let (no_limit, sent_off, wall_off) = flood_phase(&ns, opts)?;
    drop(off);

    let on = start_dwara(&ns, None, None)?;
    let (limited, sent_on, wall_on) = flood_phase(&ns, opts)?;
    let during = legit_during_flood(&ns, &qfile, opts)?;
    drop(on);
    // The same with the kernel's default receive queue: the baseline of the queue.
    let shallow = start_dwara(&ns, None, Some(0))?;
    let during_shallow = legit_during_flood(&ns, &qfile, opts)?;
    drop(shallow);

    let ratio = |c: &Counters| c.reply_bytes / c.request_bytes.max(1.0);
    println!("\nflood (server's counters over the phase):");
    println!(
        "  {:<22} {:>12} {:>14} {:>14} {:>9} {:>10} {:>10}",
        "rate limit", "sent qps", "request bytes", "reply bytes", "ratio", "slipped", "dropped"
    );
    for (label, c, sent, wall) in [
        ("off (baseline)", &no_limit, sent_off, wall_off),
        ("default (2000/s)", &limited, sent_on, wall_on),
    ] {
        println!(
            "  {:<22} {:>12.0} {:>14.0} {:>14.0} {:>9.3} {:>10.0} {:>10.0}",
            label,
            sent as f64 / wall,
            c.request_bytes,
            c.reply_bytes,
            ratio(c),
            c.slipped,
            c.dropped
        );
    }
    println!(
        "\nlegitimate client (dnsperf -Q {} for {} s):",
        opts.legit_qps, opts.seconds
    );
    println!(
        "  {:<44} {:>10} {:>6} {:>10} {:>10}",
        "", "completed", "lost", "mean ms", "max ms"
    );
    println!(
        "  {:<44} {:>10} {:>6} {:>10.3} {:>10.3}",
        "alone", alone.completed, alone.lost, alone.mean_ms, alone.max_ms
    );
    for (queue, d) in [
        ("default 4 MiB queue", &during),
        ("kernel's default queue (baseline)", &during_shallow),
    ] {
        let l = &d.legit;
        println!(
            "  {:<44} {:>10} {:>6} {:>10.3} {:>10.3}",
            format!("flood ({:.0} qps sent), {queue}", d.sent_qps),
            l.completed,
            l.lost,
            l.mean_ms,
            l.max_ms
        );
        println!(
            "    server: {:.0} request bytes, {:.0} reply bytes (ratio {:.3}); kernel dropped {} datagrams at full receive queues",
            d.server.request_bytes,
            d.server.reply_bytes,
            d.server.reply_bytes / d.server.request_bytes.max(1.0),
            d.queue_drops
        );
    }
    Ok(())
}

/// What the legitimate client and the server saw during one flood.
struct During {
    legit: Legit,
    sent_qps: f64,
    server: Counters,
    queue_drops: u64,
}

/// dnsperf beside the flood (rate limit on), against the server running now.
fn legit_during_flood(
    ns: &Namespaces,
    qfile: &std::path::Path,
    opts: &Options,
) -> anyhow::Result<During> {
    let before = counters(ns)?;
    let drops_before = rcvbuf_errors(ns)?;
    let flooder = flood(ns, opts)?;
    let legit = dnsperf(ns, qfile, opts)?;
    let out = flooder.wait_with_output()?;
    let sent = sent_by(&out);
    let after = counters(ns)?;
    Ok(During {
        legit,
        sent_qps: sent as f64 / opts.seconds as f64,
        server: after.since(&before),
        queue_drops: rcvbuf_errors(ns)?.saturating_sub(drops_before),
    })
}

/// `perf guard-flood QPS SECONDS` (run inside the client namespace): sends forged
/// queries for [`NAME`] to the server at up to QPS for SECONDS, then prints
/// `sent=N bytes=B`.
pub(crate) fn flood_main(args: &[String]) -> anyhow::Result<()> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let (Some(qps), Some(seconds)) = (
        args.first().and_then(|a| a.parse::<u64>().ok()),
        args.get(1).and_then(|a| a.parse::<u64>().ok()),
    ) else {
        bail!("usage: perf guard-flood QPS SECONDS");
    };
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))
        .context("raw sockets need root")?;
    sock.set_header_included_v4(true)?;
    let dst = SockAddr::from(SocketAddrV4::new(SRV, 0));
    let mut dns = vec![0u8, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in NAME.split('.') {
        dns.push(label.len() as u8);
        dns.extend_from_slice(label.as_bytes());
    }
    dns.extend_from_slice(&[0, 0, 1, 0, 1]);
    let udp_len = 8 + dns.len();
    let total = 20 + udp_len;
    let mut pkt = vec![0u8; total];
    pkt[0] = 0x45;
    pkt[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    pkt[8] = 64;
    pkt[9] = 17;
    pkt[16..20].copy_from_slice(&SRV.octets());
    pkt[22..24].copy_from_slice(&53u16.to_be_bytes());
    pkt[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
    pkt[28..].copy_from_slice(&dns);
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let (mut sent, mut bytes) = (0u64, 0u64);
    while Instant::now() < end {
        // Keep to the schedule: send what is due, in slices of at most 64.
        let due = (started.elapsed().as_secs_f64() * qps as f64) as u64;
        if sent >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        for _ in 0..(due - sent).min(64) {
            let r = next();
            pkt[12..15].copy_from_slice(&VICTIM);
            pkt[15] = (r & 0xff) as u8;
            // Source port 1024..65535, DNS id random.
            let port = 1024 + ((r >> 8) % 64_512) as u16;
            pkt[20..22].copy_from_slice(&port.to_be_bytes());
            pkt[28..30].copy_from_slice(&((r >> 32) as u16).to_be_bytes());
            if sock.send_to(&pkt, &dst).is_ok() {
                sent += 1;
                bytes += dns.len() as u64;
            }
        }
    }
    println!("sent={sent} bytes={bytes}");
    Ok(())
}
