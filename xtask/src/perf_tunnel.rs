//! `cargo xtask perf tunnel`: dwara's HTTP/1.1 upgrade tunnels vs HAProxy
//! `mode http`, nginx `proxy_pass` and Caddy `reverse_proxy`.
//!
//! ```text
//! cargo xtask perf tunnel [--rounds R] [--seconds S] [--threads T] [--dwara PATH]
//! ```
//!
//! 1. Installs nginx-light, HAProxy and Caddy when missing (with the rest of
//!    `perf http`'s tools).
//! 2. Starts the backend, an upgrade-echo server: this xtask again, as its own
//!    process (`cargo xtask perf tunnel-backend --listen ADDR`, so its CPU can be
//!    read), a thread per connection. It reads a request head, answers `101
//!    Switching Protocols` with the request's `Upgrade` value (a request without
//!    one gets `400` and is closed) and then echoes every byte until EOF.
//! 3. In front of it: `dwara serve` (release build) with `--l4-workers 1
//!    --worker-threads 1` (`dwara-1t`) and a `protocol: http` upstream that follows
//!    `backend.perf.local` through its own name server, as `perf http` runs it;
//!    HAProxy `mode http`, `nbthread 1`, `option splice-auto` (as `perf l4` gives
//!    it), `timeout tunnel 1h`; nginx (one worker)
//!    with `proxy_http_version 1.1`, `Upgrade` and `Connection: upgrade` set and
//!    `proxy_read_timeout 1h`; Caddy `reverse_proxy` (which passes upgrades by
//!    itself; its site has no host name, so the client's `Host: bench` matches).
//! 4. `R` interleaved rounds (default 5) of two loads of `S` seconds (default 5),
//!    every proxy in every round, the order rotated per round. Each run first opens
//!    its tunnels (`GET /echo` with `Upgrade: echo`; any answer but `101` fails the
//!    run), then measures: `ping-pong`, 32 tunnels each writing a 64-byte message
//!    and reading its echo in a loop (round trips per second, p50 and p99 round
//!    trip), and `bulk`, 8 tunnels each writing 64 KiB chunks on one task and
//!    reading the echo on another (MiB echoed back per second). The client is
//!    this xtask on a tokio runtime of `T` threads (default 1, like `wrk -t 1`).
//!    A tunnel that closes or fails early, or echoes other bytes, is an error.
//!    Each run records the proxy's CPU per unit (user + system from
//!    `/proc/PID/stat`, nginx's worker included) over the measured window, and the
//!    backend's and the client's.
//! 5. Prints each run, then per load the medians, the ratios `dwara-1t ÷ proxy` of
//!    the rate and the CPU per unit, and the median of the round-by-round ratios of
//!    the rates (`paired`); under it the backend's and the client's CPU per unit.
//!
//! Everything listens on 127.0.0.1 only, in a temporary directory removed at the end.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tokio::time::timeout_at;

use crate::perf_http::spawn_caddy;
use crate::perf_l4::{Proc, Proxy, local, nginx_head, register_backend, spawn_nginx};
use crate::perf_util::{clock_ticks, cpu_ticks, free_port, median, parse_flags, release_dwara};

const USAGE: &str = "usage: cargo xtask perf tunnel [--rounds R] [--seconds S] [--threads T] \
                     [--dwara PATH]";
const BACKEND_USAGE: &str = "usage: cargo xtask perf tunnel-backend --listen ADDR";
const PROXIES: [&str; 4] = ["dwara-1t", "haproxy-1t", "nginx", "caddy"];

/// What the client sends to open a tunnel.
const REQUEST: &[u8] =
    b"GET /echo HTTP/1.1\r\nHost: bench\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
/// The size of a ping-pong message.
const MESSAGE: usize = 64;
/// The size of a bulk write (and of the echo server's and the reader's buffers).
const CHUNK: usize = 64 * 1024;
/// The longest request or answer head read.
const MAX_HEAD: usize = 16 * 1024;
/// How long a round trip (or the opening of a tunnel) may take past the end of the
/// window before the tunnel counts as failed.
const GRACE: Duration = Duration::from_secs(5);

struct Options {
    rounds: usize,
    seconds: u32,
    threads: usize,
    dwara: Option<PathBuf>,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let f = parse_flags(
        args,
        &["--rounds", "--seconds", "--threads", "--dwara"],
        USAGE,
    )?;
    Ok(Options {
        rounds: f.count("--rounds", 5)?,
        seconds: f.count("--seconds", 5)?,
        threads: f.count("--threads", 1)?,
        dwara: f.path("--dwara"),
    })
}

/// The loads of `perf tunnel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TunnelLoad {
    /// 64-byte messages, one in flight per tunnel.
    PingPong,
    /// 64 KiB writes and reads, both directions busy.
    Bulk,
}

impl TunnelLoad {
    const ALL: [TunnelLoad; 2] = [TunnelLoad::PingPong, TunnelLoad::Bulk];

    fn title(self) -> &'static str {
        match self {
            TunnelLoad::PingPong => "ping-pong, 32 tunnels, 64-byte messages",
            TunnelLoad::Bulk => "bulk echo, 8 tunnels, 64 KiB writes",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            TunnelLoad::PingPong => "msg",
            TunnelLoad::Bulk => "MiB",
        }
    }

    fn tunnels(self) -> usize {
        match self {
            TunnelLoad::PingPong => 32,
            TunnelLoad::Bulk => 8,
        }
    }
}

/// One measured run of a load through a proxy.
#[derive(Debug, Clone, Default)]
struct Run {
    /// Messages or MiB per second.
    rate: f64,
    /// The proxy's CPU per unit, µs.
    cpu_us: f64,
    /// Round trip percentiles (ping-pong only; NaN otherwise).
    p50_ms: f64,
    p99_ms: f64,
    /// Tunnels that closed, failed or echoed other bytes.
    errors: u64,
    /// Why the first of them failed.
    first_error: Option<String>,
    /// The backend's CPU per unit, µs.
    backend_us: f64,
    /// The client's (this process's) CPU per unit, µs.
    client_us: f64,
}

// ---------------------------------------------------------------------------
// Heads: pure helpers shared by the backend and the client.

/// The length of the head at the start of `buf` (through the blank line), if
/// `buf` holds all of it.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// The value of header `name` (case-insensitive) in `head`, trimmed; the first
/// line (request or status line) is not a header.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The status code of an answer head (`HTTP/1.x NNN …`).
fn status_code(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    if !words.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = words.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
}

/// What the backend answers to request head `head`, and whether the connection
/// becomes an echo tunnel after it.
fn backend_answer(head: &[u8]) -> (Vec<u8>, bool) {
    let text = String::from_utf8_lossy(head);
    match header(&text, "upgrade").filter(|v| !v.is_empty()) {
        Some(protocol) => (
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: {protocol}\r\n\
                 Connection: Upgrade\r\n\r\n"
            )
            .into_bytes(),
            true,
        ),
        None => (
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
            false,
        ),
    }
}

/// Reads a head from `r`: the head (through the blank line) and the bytes read
/// past it. Fails at EOF before the blank line or past [`MAX_HEAD`] bytes.
fn read_head<R: Read>(r: &mut R) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = r.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before the end of the head",
            ));
        }
        // Only the new bytes and the three before them can complete the blank line.
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf[from..]).map(|e| e + from) {
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "head too long",
            ));
        }
    }
}

/// The `q` quantile (0..=1) of `sorted` (ascending), in its unit; NaN when empty.
fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[at] as f64
}

// ---------------------------------------------------------------------------
// The backend: `perf tunnel-backend --listen ADDR`.

/// Runs the upgrade-echo backend until killed.
pub(crate) fn backend_main(args: &[String]) -> anyhow::Result<()> {
    let f = parse_flags(args, &["--listen"], BACKEND_USAGE)?;
    let addr: SocketAddr = f
        .text("--listen")
        .with_context(|| format!("--listen is required; {BACKEND_USAGE}"))?
        .parse()
        .context("--listen needs an address like 127.0.0.1:8080")?;
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    serve_forever(&listener);
    Ok(())
}

fn serve_forever(listener: &TcpListener) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else {
            continue;
        };
        std::thread::spawn(move || {
            let _ = serve(conn);
        });
    }
}

/// One backend connection: the request head, the answer, then the echo.
fn serve(mut s: TcpStream) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    let (head, rest) = read_head(&mut s)?;
    let (answer, tunnel) = backend_answer(&head);
    s.write_all(&answer)?;
    if !tunnel {
        // Close after the answer; drain what the client still sends (briefly) so
        // that closing does not reset the connection before the answer is read.
        s.shutdown(Shutdown::Write)?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        let _ = std::io::copy(&mut s, &mut std::io::sink());
        return Ok(());
    }
    s.write_all(&rest)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        s.write_all(&buf[..n])?;
    }
    s.shutdown(Shutdown::Write)
}

/// Opens a tunnel through `port` with blocking I/O and checks that it echoes.
fn probe(port: u16) -> anyhow::Result<()> {
    let mut s = TcpStream::connect_timeout(
        &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_secs(1),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(REQUEST)?;
    let (head, rest) = read_head(&mut s)?;
    if status_code(&head) != Some(101) {
        bail!("answer: {}", String::from_utf8_lossy(&head).trim());
    }
    if !rest.is_empty() {
        bail!("{} bytes after the 101 before any were sent", rest.len());
    }
    s.write_all(b"probe")?;
    let mut back = [0u8; 5];
    s.read_exact(&mut back)?;
    if &back != b"probe" {
        bail!("echoed {back:?}");
    }
    Ok(())
}

/// Waits (60 s) until a tunnel through `port` echoes; fails at once if `proc`
/// exits first, with its standard error.
fn wait_tunnel(proc: &mut Proc, dir: &Path, port: u16) -> anyhow::Result<()> {
    let path = dir.join(format!("{}.stderr", proc.name));
    let stderr = || {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = anyhow::anyhow!("nothing tried");
    while Instant::now() < deadline {
        if let Some(status) = proc.child.try_wait()? {
            bail!(
                "{} exited during startup ({status}): {}",
                proc.name,
                stderr()
            );
        }
        match probe(port) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "no echoing tunnel through {} on port {port} within 60 s (last: {last:#}): {}",
        proc.name,
        stderr()
    )
}

fn start_backend(dir: &Path) -> anyhow::Result<(Proc, u16)> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let exe = std::env::current_exe().context("cannot find the xtask executable")?;
    let mut proc = Proc::spawn(
        "backend",
        dir,
        Command::new(exe).args(["perf", "tunnel-backend", "--listen", &local(port)]),
    )?;
    wait_tunnel(&mut proc, dir, port)?;
    Ok((proc, port))
}

// ---------------------------------------------------------------------------
// The proxies.

fn proxy(proc: Proc, port: u16) -> Proxy {
    Proxy {
        proc,
        port,
        empty: None,
    }
}

/// `dwara serve` with one L4 worker and one runtime thread, its `protocol: http`
/// upstream following `backend.perf.local` through its own name server.
fn start_dwara(dir: &Path, bin: &Path, backend: u16) -> anyhow::Result<Proxy> {
    let name = "dwara-1t";
    let [port, http, dns] = [0; 3].map(|_| free_port(Ipv4Addr::LOCALHOST));
    let (port, http, dns) = (port?, http?, dns?);
    let conf = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &conf,
        format!(
            "nameserver:\n  domain: perf.local\n  dns_listen: {dns}\n  ttl: 1\n  \
             fallback: [127.0.0.1:9]\n\
             upstreams:\n  - name: backend\n    listen: {listen}\n    protocol: http\n    \
             dns_discovery:\n      hostname: backend.perf.local\n      port: {backend}\n      \
             refresh_interval_s: 1\n      nameservers: [{dns}]\n",
            dns = local(dns),
            listen = local(port),
        ),
    )?;
    let mut proc = Proc::spawn(
        name,
        dir,
        Command::new(bin)
            .args(["serve", "--docker", "off", "--config"])
            .arg(&conf)
            .args(["--http-listen", &local(http)])
            .args(["--l4-workers", "1", "--worker-threads", "1"])
            .env("DWARA_LOG", "warn"),
    )?;
    // The upstream's only endpoint comes from dwara's own name server.
    register_backend(&mut proc, name, http)?;
    wait_tunnel(&mut proc, dir, port)?;
    Ok(proxy(proc, port))
}

fn start_haproxy(dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let conf = dir.join("haproxy-tunnel.cfg");
    std::fs::write(
        &conf,
        format!(
            "global\n  nbthread 1\n  maxconn 4000\n\
             defaults\n  mode http\n  option forwardfor\n  option splice-auto\n  timeout connect 5s\n  \
             timeout client 300s\n  timeout server 300s\n  timeout tunnel 1h\n\
             frontend f\n  bind {listen}\n  http-request set-header X-Forwarded-Proto http\n  \
             default_backend b\n\
             backend b\n  server s1 {backend}\n",
            listen = local(port),
            backend = local(backend),
        ),
    )?;
    let mut proc = Proc::spawn(
        "haproxy-1t",
        dir,
        Command::new("haproxy").arg("-db").arg("-f").arg(&conf),
    )?;
    wait_tunnel(&mut proc, dir, port)?;
    Ok(proxy(proc, port))
}

fn start_nginx(dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    let conf = dir.join("nginx-tunnel.conf");
    std::fs::write(
        &conf,
        format!(
            "{head}http {{\n  access_log off;\n  server {{\n    listen {listen};\n    \
             location / {{\n      proxy_pass http://{backend};\n      \
             proxy_http_version 1.1;\n      proxy_set_header Upgrade $http_upgrade;\n      \
             proxy_set_header Connection \"upgrade\";\n      \
             proxy_set_header Host $http_host;\n      \
             proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n      \
             proxy_set_header X-Forwarded-Proto $scheme;\n      \
             proxy_read_timeout 1h;\n      proxy_send_timeout 1h;\n    }}\n  }}\n}}\n",
            head = nginx_head(dir, "nginx-tunnel"),
            listen = local(port),
            backend = local(backend),
        ),
    )?;
    let mut proc = spawn_nginx("nginx", dir, &conf)?;
    wait_tunnel(&mut proc, dir, port)?;
    Ok(proxy(proc, port))
}

fn start_caddy(dir: &Path, backend: u16) -> anyhow::Result<Proxy> {
    let port = free_port(Ipv4Addr::LOCALHOST)?;
    // `http://:PORT`, no host: a site named 127.0.0.1 would only match that Host.
    let mut proc = spawn_caddy(dir, &format!("http://:{port}"), backend)?;
    wait_tunnel(&mut proc, dir, port)?;
    Ok(proxy(proc, port))
}

fn start(dir: &Path, name: &str, opts: &Options, backend: u16) -> anyhow::Result<Proxy> {
    match name {
        "dwara-1t" => {
            let bin = opts.dwara.clone().unwrap_or_else(release_dwara);
            start_dwara(dir, &bin, backend)
        }
        "haproxy-1t" => start_haproxy(dir, backend),
        "nginx" => start_nginx(dir, backend),
        _ => start_caddy(dir, backend),
    }
}

// ---------------------------------------------------------------------------
// The client.

/// Opens a tunnel through `port`: the request, then the whole `101` head.
async fn open_tunnel(port: u16) -> anyhow::Result<tokio::net::TcpStream> {
    let mut s = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    s.set_nodelay(true)?;
    s.write_all(REQUEST).await?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let end = loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!(
                "closed before the end of the answer head: {:?}",
                String::from_utf8_lossy(&buf)
            );
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&buf) {
            break end;
        }
        if buf.len() > MAX_HEAD {
            bail!("answer head over {MAX_HEAD} bytes");
        }
    };
    let head = &buf[..end];
    if status_code(head) != Some(101) {
        bail!(
            "answered {:?} instead of 101",
            String::from_utf8_lossy(head).trim()
        );
    }
    if end != buf.len() {
        bail!(
            "{} bytes after the 101 before any were sent",
            buf.len() - end
        );
    }
    Ok(s)
}

async fn open_tunnels(port: u16, n: usize) -> anyhow::Result<Vec<tokio::net::TcpStream>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let deadline = tokio::time::Instant::now() + GRACE;
        out.push(
            timeout_at(deadline, open_tunnel(port))
                .await
                .context("the tunnel took over 5 s to open")??,
        );
    }
    Ok(out)
}

/// What the tasks of a load counted.
#[derive(Debug, Default)]
struct Outcome {
    /// Messages or bytes.
    count: u64,
    /// Round trips, ns (ping-pong).
    latencies: Vec<u64>,
    /// Tunnels that failed.
    errors: u64,
    /// Why the first of them failed.
    first_error: Option<String>,
}

impl Outcome {
    fn failed(&mut self, why: Option<String>) {
        if let Some(why) = why {
            self.errors += 1;
            self.first_error.get_or_insert(why);
        }
    }
}

/// One ping-pong tunnel until `deadline`: (round trips, their latencies in ns,
/// why it failed if it did).
async fn ping_pong_one(
    mut s: tokio::net::TcpStream,
    id: u64,
    deadline: tokio::time::Instant,
) -> (u64, Vec<u64>, Option<String>) {
    let mut msg = [0x2au8; MESSAGE];
    msg[8..16].copy_from_slice(&id.to_le_bytes());
    let mut back = [0u8; MESSAGE];
    let mut latencies = Vec::with_capacity(1 << 16);
    let mut n = 0u64;
    while tokio::time::Instant::now() < deadline {
        msg[..8].copy_from_slice(&n.to_le_bytes());
        let t = Instant::now();
        let trip = timeout_at(deadline + GRACE, async {
            s.write_all(&msg).await?;
            s.read_exact(&mut back).await?;
            Ok::<_, std::io::Error>(())
        })
        .await;
        let why = match trip {
            Err(_) => Some(format!("no echo within {GRACE:?} after the window")),
            Ok(Err(e)) => Some(format!("ping-pong after {n} round trips: {e}")),
            Ok(Ok(())) if back != msg => Some(format!("round trip {n} echoed other bytes")),
            Ok(Ok(())) => None,
        };
        if why.is_some() {
            return (n, latencies, why);
        }
        latencies.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        n += 1;
    }
    (n, latencies, None)
}

async fn ping_pong(
    tunnels: Vec<tokio::net::TcpStream>,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Outcome> {
    let tasks: Vec<_> = tunnels
        .into_iter()
        .zip(0u64..)
        .map(|(s, id)| tokio::spawn(ping_pong_one(s, id, deadline)))
        .collect();
    let mut out = Outcome::default();
    for t in tasks {
        let (n, lat, failed) = t.await?;
        out.count += n;
        out.latencies.extend(lat);
        out.failed(failed);
    }
    Ok(out)
}

/// One bulk tunnel until `deadline`, writing on one task and reading on another:
/// (bytes read back, why it failed if it did).
async fn bulk_one(
    s: tokio::net::TcpStream,
    deadline: tokio::time::Instant,
) -> anyhow::Result<(u64, Option<String>)> {
    let (mut r, mut w) = s.into_split();
    // The writer hands its half back rather than dropping it: dropping a write
    // half sends FIN, and a proxy that closes the whole tunnel on a half-close
    // (Caddy does) would end the reader's last moments with an EOF.
    let writer = tokio::spawn(async move {
        let chunk = vec![0x5au8; CHUNK];
        let mut sent = 0u64;
        let why = loop {
            match timeout_at(deadline, w.write_all(&chunk)).await {
                Err(_) => break None,
                Ok(Ok(())) => sent += CHUNK as u64,
                Ok(Err(e)) => break Some(format!("bulk write after {sent} bytes: {e}")),
            }
        };
        (w, why)
    });
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0u64;
        loop {
            match timeout_at(deadline, r.read(&mut buf)).await {
                Err(_) => return (got, None),
                Ok(Ok(0)) => return (got, Some(format!("bulk read: EOF after {got} bytes"))),
                Ok(Err(e)) => return (got, Some(format!("bulk read after {got} bytes: {e}"))),
                Ok(Ok(n)) => got += n as u64,
            }
        }
    });
    let (w, write_failed) = writer.await?;
    let (got, read_failed) = reader.await?;
    drop(w);
    Ok((got, read_failed.or(write_failed)))
}

async fn bulk(
    tunnels: Vec<tokio::net::TcpStream>,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Outcome> {
    let tasks: Vec<_> = tunnels
        .into_iter()
        .map(|s| tokio::spawn(bulk_one(s, deadline)))
        .collect();
    let mut out = Outcome::default();
    for t in tasks {
        let (got, failed) = t.await??;
        out.count += got;
        out.failed(failed);
    }
    Ok(out)
}

/// One run of `load` through `proxy`: tunnels opened, then `seconds` measured.
fn measure(
    rt: &Runtime,
    proxy: &Proxy,
    backend: &Proc,
    load: TunnelLoad,
    seconds: u32,
    ticks: f64,
) -> anyhow::Result<Run> {
    let tunnels = rt
        .block_on(open_tunnels(proxy.port, load.tunnels()))
        .with_context(|| format!("cannot open the tunnels through {}", proxy.proc.name))?;
    // Let the opening settle before the window starts.
    std::thread::sleep(Duration::from_millis(200));
    let cpu = || {
        (
            proxy.proc.cpu_ticks(),
            backend.cpu_ticks(),
            cpu_ticks("self").map_or(0, |(own, _)| own),
        )
    };
    let before = cpu();
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + Duration::from_secs(seconds.into()));
    let out = rt.block_on(async {
        match load {
            TunnelLoad::PingPong => ping_pong(tunnels, deadline).await,
            TunnelLoad::Bulk => bulk(tunnels, deadline).await,
        }
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    let after = cpu();
    let units = match load {
        TunnelLoad::PingPong => out.count as f64,
        TunnelLoad::Bulk => out.count as f64 / (1024.0 * 1024.0),
    };
    let per_unit = |a: u64, b: u64| a.saturating_sub(b) as f64 / ticks * 1e6 / units.max(1e-9);
    let mut lat = out.latencies;
    lat.sort_unstable();
    let (p50_ms, p99_ms) = match load {
        TunnelLoad::PingPong => (percentile(&lat, 0.5) / 1e6, percentile(&lat, 0.99) / 1e6),
        TunnelLoad::Bulk => (f64::NAN, f64::NAN),
    };
    Ok(Run {
        rate: units / elapsed.max(1e-9),
        cpu_us: per_unit(after.0, before.0),
        p50_ms,
        p99_ms,
        errors: out.errors,
        first_error: out.first_error,
        backend_us: per_unit(after.1, before.1),
        client_us: per_unit(after.2, before.2),
    })
}

/// `opts.rounds` interleaved rounds of every load through every proxy, each run
/// printed as it ends: `runs[load][proxy]` holds one [`Run`] per round, in round
/// order. The order of the proxies is rotated per round.
fn rounds(
    rt: &Runtime,
    proxies: &[Proxy],
    backend: &Proc,
    opts: &Options,
) -> anyhow::Result<Vec<Vec<Vec<Run>>>> {
    let ticks = clock_ticks();
    let mut runs = vec![vec![Vec::new(); proxies.len()]; TunnelLoad::ALL.len()];
    for round in 0..opts.rounds {
        for (l, load) in TunnelLoad::ALL.iter().enumerate() {
            for k in 0..proxies.len() {
                let i = (k + round) % proxies.len();
                let p = &proxies[i];
                let r = measure(rt, p, backend, *load, opts.seconds, ticks)?;
                let unit = load.unit();
                let latency = match load {
                    TunnelLoad::PingPong => {
                        format!("  p50 {:>7.3} ms  p99 {:>7.3} ms", r.p50_ms, r.p99_ms)
                    }
                    TunnelLoad::Bulk => String::new(),
                };
                println!(
                    "  round {} {unit:<4} {:<11} {:>10.1} {unit}/s  {:>8.2} us CPU/{unit}{latency}  \
                     errors {}{}",
                    round + 1,
                    p.proc.name,
                    r.rate,
                    r.cpu_us,
                    r.errors,
                    r.first_error
                        .as_ref()
                        .map(|why| format!("  <- TUNNELS FAILED, first: {why}"))
                        .unwrap_or_default(),
                );
                runs[l][i].push(r);
            }
        }
    }
    Ok(runs)
}

fn report(proxies: &[Proxy], runs: &[Vec<Vec<Run>>], opts: &Options) {
    let med = |rs: &[Run], f: &dyn Fn(&Run) -> f64| median(rs.iter().map(f).collect());
    let ms = |v: f64| {
        if v.is_nan() {
            "-".to_owned()
        } else {
            format!("{v:.3}")
        }
    };
    for (l, load) in TunnelLoad::ALL.iter().enumerate() {
        let unit = load.unit();
        println!("\n{}, median of {} rounds:", load.title(), opts.rounds);
        println!(
            "  {:<11} {:>12} {:>14} {:>8} {:>8} {:>7} {:>13} {:>13} {:>15}",
            "proxy",
            format!("{unit}/s"),
            format!("us CPU/{unit}"),
            "p50 ms",
            "p99 ms",
            "errors",
            "dwara-1t rate",
            "dwara-1t CPU",
            "dwara-1t paired"
        );
        // PROXIES starts with dwara-1t.
        let one = &runs[l][0];
        for (p, rs) in proxies.iter().zip(&runs[l]) {
            // Runs are in round order: the same index is the same round.
            let paired = median(one.iter().zip(rs).map(|(a, b)| a.rate / b.rate).collect());
            println!(
                "  {:<11} {:>12.1} {:>14.2} {:>8} {:>8} {:>7} {:>12.2}x {:>12.2}x {:>14.2}x",
                p.proc.name,
                med(rs, &|r| r.rate),
                med(rs, &|r| r.cpu_us),
                ms(med(rs, &|r| r.p50_ms)),
                ms(med(rs, &|r| r.p99_ms)),
                rs.iter().map(|r| r.errors).sum::<u64>(),
                med(one, &|r| r.rate) / med(rs, &|r| r.rate),
                med(one, &|r| r.cpu_us) / med(rs, &|r| r.cpu_us),
                paired,
            );
        }
        // The rest of the chain in the same runs: the echo server and the client
        // share the machine with the proxy.
        println!(
            "  {:<11} {:>16} {:>16} {:>16}",
            "",
            format!("backend us/{unit}"),
            format!("client us/{unit}"),
            format!("chain us/{unit}"),
        );
        for (p, rs) in proxies.iter().zip(&runs[l]) {
            println!(
                "  {:<11} {:>16.2} {:>16.2} {:>16.2}",
                p.proc.name,
                med(rs, &|r| r.backend_us),
                med(rs, &|r| r.client_us),
                med(rs, &|r| r.cpu_us + r.backend_us + r.client_us),
            );
        }
    }
}

/// Runs the comparison.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    crate::tools::ensure_perf_http()?;
    if opts.dwara.is_none() {
        crate::cargo(&["build", "--release", "-p", "dwara"])?;
    }
    crate::perf_util::in_scratch_dir("perf-tunnel", |dir| run_in(dir, &opts))
}

fn run_in(dir: &Path, opts: &Options) -> anyhow::Result<()> {
    let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "perf tunnel: {} s per load through each proxy to an upgrade-echo server, client on \
         {} thread(s), {} interleaved rounds; load average at start: {}",
        opts.seconds,
        opts.threads,
        opts.rounds,
        load_avg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let rt = if opts.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.threads)
            .enable_all()
            .build()?
    };
    let (backend_proc, backend) = start_backend(dir)?;
    let proxies = PROXIES
        .iter()
        .map(|name| start(dir, name, opts, backend))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runs = rounds(&rt, &proxies, &backend_proc, opts)?;
    report(&proxies, &runs, opts);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its bytes `step` at a time.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn head_end_finds_the_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nxy"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(head_end(b"\r\n\r\n"), Some(4));
        assert_eq!(head_end(b""), None);
    }

    #[test]
    fn read_head_splits_head_and_what_follows_whatever_the_chunks() {
        let input = b"GET /echo HTTP/1.1\r\nUpgrade: echo\r\n\r\nhello";
        for step in [1, 2, 3, 5, 4096] {
            let mut r = Trickle { data: input, step };
            let (head, rest) = read_head(&mut r).unwrap();
            assert_eq!(head, &input[..input.len() - 5], "step {step}");
            // What was read past the head is returned; the rest is still unread.
            assert_eq!([&rest[..], r.data].concat(), b"hello", "step {step}");
            if step == 4096 {
                assert_eq!(rest, b"hello");
            }
        }
        let mut short = Trickle {
            data: b"GET / HTTP/1.1\r\nHost: x\r\n",
            step: 7,
        };
        assert_eq!(
            read_head(&mut short).unwrap_err().kind(),
            std::io::ErrorKind::UnexpectedEof
        );
        let long = [b'a'; MAX_HEAD + 100];
        let mut long = Trickle {
            data: &long,
            step: 4096,
        };
        assert_eq!(
            read_head(&mut long).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn backend_switches_only_when_asked_to() {
        let (answer, tunnel) =
            backend_answer(b"GET /x HTTP/1.1\r\nHost: a\r\nuPgRaDe:  websocket \r\n\r\n");
        assert!(tunnel);
        assert_eq!(
            answer,
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        );
        let (answer, tunnel) = backend_answer(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(!tunnel);
        assert_eq!(status_code(&answer), Some(400));
        let (_, tunnel) = backend_answer(b"GET /x HTTP/1.1\r\nUpgrade:\r\n\r\n");
        assert!(!tunnel, "an empty Upgrade asks for nothing");
        // The request line is not a header, however it looks.
        let (_, tunnel) = backend_answer(b"Upgrade: x HTTP/1.1\r\nHost: a\r\n\r\n");
        assert!(!tunnel);
    }

    #[test]
    fn status_code_reads_the_status_line() {
        assert_eq!(
            status_code(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\n\r\n"),
            Some(101)
        );
        assert_eq!(status_code(b"HTTP/1.0 502 Bad Gateway\r\n\r\n"), Some(502));
        assert_eq!(status_code(b"HTTP/1.1 1010 x\r\n\r\n"), None);
        assert_eq!(status_code(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(status_code(b""), None);
    }

    #[test]
    fn percentile_picks_from_sorted_values() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 100.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7], 0.99), 7.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn arguments_have_perf_http_defaults() {
        let o = parse_args(&[]).unwrap();
        assert_eq!((o.rounds, o.seconds, o.threads), (5, 5, 1));
        assert!(o.dwara.is_none());
        let args: Vec<String> = ["--rounds", "2", "--dwara", "/bin/d"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let o = parse_args(&args).unwrap();
        assert_eq!(o.rounds, 2);
        assert_eq!(o.dwara, Some(PathBuf::from("/bin/d")));
        assert!(parse_args(&["--proxies".to_owned(), "x".to_owned()]).is_err());
    }

    /// The echo server on loopback: a tunnel echoes (the probe and the async
    /// client's handshake), a request without `Upgrade` gets 400.
    #[test]
    fn backend_tunnels_and_echoes_and_refuses_plain_requests() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || serve_forever(&listener));
        probe(port).unwrap();

        let mut plain = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        plain
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        plain
            .write_all(b"GET /tiny HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        plain.read_to_end(&mut answer).unwrap();
        assert_eq!(status_code(&answer), Some(400));

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let out = rt
            .block_on(async {
                let tunnels = open_tunnels(port, 2).await?;
                let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
                ping_pong(tunnels, deadline).await
            })
            .unwrap();
        assert_eq!(out.errors, 0);
        assert!(out.count > 0);
        assert_eq!(out.latencies.len() as u64, out.count);

        let out = rt
            .block_on(async {
                let tunnels = open_tunnels(port, 2).await?;
                let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
                bulk(tunnels, deadline).await
            })
            .unwrap();
        assert_eq!(out.errors, 0, "{:?}", out.first_error);
        assert!(out.count > CHUNK as u64, "{} bytes echoed", out.count);
    }
}
