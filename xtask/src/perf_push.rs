//! `cargo xtask perf push`: how long an endpoint takes to enter and to leave an
//! upstream's rotation when the upstream follows the name server of its own process
//! by push, against the same upstream polling that name server over DNS (the
//! baseline), in one run.
//!
//! ```text
//! cargo xtask perf push [--rounds R] [--docker]
//! ```
//!
//! Two `dwara serve` processes (release build) on 127.0.0.1:
//! - `push`: the name server (domain `weave.local`, TTL 1 s) and an upstream
//!   following `api.weave.local`, which therefore reads the records database by push;
//! - `poll`: only an upstream following the same name over DNS from `push`'s name
//!   server, with `refresh_interval_s: 1` (the floor: polling's best case).
//!
//! The moment an upstream changes is read from its own log: the refresh loop's
//! `endpoint set updated` line, stamped (to the microsecond) when the new set was
//! published, which is what `GET /upstreams` and new connections see from then on.
//!
//! An anchor entry stays registered throughout, so a removal leaves a non-empty
//! answer and is published (the `min_endpoints: 1` floor would keep it otherwise).
//! Each round waits a pseudo-random 0–1 s (so the polling phase varies), registers
//! an address with `PUT /name/…` and times, for each process, until the endpoint is
//! in the upstream; waits again, deletes it with `DELETE /name/…` and times until it
//! has left.
//!
//! `--docker` adds the same with containers (the `dwara-test-busybox` image is built
//! from Debian's static busybox when missing, as the tests do): `push` follows the
//! Docker engine; the anchor is a container with hostname `api` in the domain, and
//! so is a container with a `HEALTHCHECK` (`test -e /ok` every second, unhealthy
//! after one failure). Each round starts a container `api` and kills it, removes the
//! checked container's `/ok` (it turns unhealthy) and puts it back (healthy). Times
//! run from the engine's event (`start`, `die`, `health_status: unhealthy`,
//! `health_status: healthy`; its `timeNano`, the daemon's clock, which is this
//! machine's) to:
//! - `stream`: this harness reading the event from its own event stream on the
//!   daemon's socket (the daemon's delivery);
//! - `inspect`: the round trip of this harness's inspect of the container, sent as
//!   soon as it read the event (what the daemon makes any inspect wait then);
//! - `dwara read`: `push` reading the event (its `Docker event` line);
//! - `dwara inspect`: the round trip of `push`'s first inspect of the container to
//!   end after the event (its `inspected` line);
//! - `records`: `push` writing the records database (its `registered`,
//!   `unregistered` or `health changed` line), which is when DNS answers change;
//! - `push` and `poll`: each upstream publishing its new set.
//!
//! A `start` event is logged when the daemon has started the container (network
//! set up, process running), a little before `docker run -d` returns; the network
//! `connect` event before it already made `push` inspect the container, and that
//! inspect is answered once the start is done, so the records are usually written
//! before `push` reads the `start` itself. After a `die` the daemon answers an
//! inspect only once it has torn the container's network down: `push` removes the
//! records on reading the `die`, before its inspect.
//!
//! Prints the median and the worst of each column per kind of event, then per kind:
//! push − dwara read (what `push` itself takes once it has the event), records →
//! push (the watch wake-up and the upstream's rebuild), push / (stream + inspect)
//! (against reading the event and inspecting the container, the daemon's part for
//! any client that inspects), push / poll, and in how many rounds push took over
//! 50 ms.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use crate::perf_util::{
    Dwara, free_port, in_scratch_dir, median, output_of, release_dwara, spawn_dwara,
};

const IMAGE: &str = "dwara-test-busybox:latest";
/// The port of every endpoint (nothing listens: the upstream's set is what is read).
const PORT: u16 = 8080;
/// The daemon's socket, which this harness also reads events from.
const SOCKET: &str = "/var/run/docker.sock";
/// How long any awaited event may take before the run fails.
const PATIENCE: Duration = Duration::from_secs(30);

struct Options {
    rounds: usize,
    docker: bool,
}

fn parse_args(args: &[String]) -> anyhow::Result<Options> {
    let mut opts = Options {
        rounds: 20,
        docker: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--rounds" => {
                let v = it.next().context("--rounds needs a value")?;
                opts.rounds = v.parse().context("--rounds")?;
            }
            "--docker" => opts.docker = true,
            other => bail!("unknown option {other}"),
        }
    }
    if opts.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    Ok(opts)
}

/// Items appended by a reader thread, awaited by the harness.
struct Feed<T> {
    items: Mutex<Vec<T>>,
    grew: Condvar,
}

impl<T> Feed<T> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            items: Mutex::new(Vec::new()),
            grew: Condvar::new(),
        })
    }

    fn push(&self, item: T) {
        self.items
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(item);
        self.grew.notify_all();
    }

    /// Waits ([`PATIENCE`]) for the first item `pick` maps to something.
    fn wait<R>(&self, what: &str, mut pick: impl FnMut(&T) -> Option<R>) -> anyhow::Result<R> {
        let deadline = Instant::now() + PATIENCE;
        let mut items = self
            .items
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            if let Some(r) = items.iter().find_map(&mut pick) {
                return Ok(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{what}: not seen within {PATIENCE:?}");
            }
            items = self
                .grew
                .wait_timeout(items, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// One line of a `dwara serve` log: its timestamp and the rest.
struct Line {
    at: SystemTime,
    text: String,
}

impl Line {
    /// The message and fields of an event of `target`, when the line is one.
    fn of<'a>(&'a self, target: &str) -> Option<&'a str> {
        self.text
            .split_once(target)
            .and_then(|(_, rest)| rest.strip_prefix(": "))
    }

    /// Whether this is `upstream api` publishing a set that has (`present`) or has
    /// not `addr`, i.e. `addr` was just added or removed.
    fn publishes(&self, addr: &str, present: bool) -> bool {
        let Some(m) = self.of("dwara_discovery::refresh") else {
            return false;
        };
        let Some(fields) = m.strip_prefix("endpoint set updated upstream=api ") else {
            return false;
        };
        let (added, removed) = fields.split_once(" removed=").unwrap_or((fields, ""));
        let quoted = format!("\"{addr}\"");
        if present {
            added.contains(&quoted)
        } else {
            removed.contains(&quoted)
        }
    }

    /// The fields of the updater's `message` about `container`, when they include
    /// `with`.
    fn updater<'a>(&'a self, message: &str, container: &str, with: &str) -> Option<&'a str> {
        let m = self.of("dwara_docker::updater")?;
        let fields = m.strip_prefix(message)?.strip_prefix(' ')?;
        let about = fields.contains(&format!("container={container}"));
        (about && fields.contains(with)).then_some(fields)
    }
}

/// `2026-12-02T09:06:03.350077Z` (tracing's timestamps) as a time.
fn parse_utc(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(str::parse::<u64>);
    let (h, min, sec) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Days from 1970-01-01 to the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let nanos: u64 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    Some(
        UNIX_EPOCH
            + Duration::new(days * 86_400 + h * 3600 + min * 60 + sec, 0)
            + Duration::from_nanos(nanos),
    )
}

/// A `dwara serve` whose log is read into a [`Feed`]; killed on drop.
struct Logged {
    dwara: Dwara,
    log: Arc<Feed<Line>>,
}

impl Logged {
    /// Starts `dwara serve --config <dir>/<name>.yaml` with `extra` flags, logging at
    /// `DWARA_LOG=filter`. Lines without a timestamp and errors go on to stderr.
    fn start(
        dir: &Path,
        name: &str,
        yaml: &str,
        extra: &[&str],
        filter: &str,
    ) -> anyhow::Result<Self> {
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(&config, yaml)?;
        let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
        let mut cmd = Command::new(release_dwara());
        cmd.arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--http-listen")
            .arg(http.to_string())
            .args(extra)
            .env("DWARA_LOG", filter)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut dwara = spawn_dwara(cmd, http, &format!("dwara serve ({name})"))?;
        let stderr = dwara.child.stderr.take().context("no stderr pipe")?;
        let log = Feed::new();
        let feed = log.clone();
        let name = name.to_owned();
        std::thread::spawn(move || {
            for text in BufReader::new(stderr).lines().map_while(Result::ok) {
                let at = text.split_whitespace().next().and_then(parse_utc);
                if at.is_none() || text.contains(" ERROR ") {
                    eprintln!("[{name}] {text}");
                }
                if let Some(at) = at {
                    feed.push(Line { at, text });
                }
            }
        });
        Ok(Self { dwara, log })
    }

    /// When upstream `api` published a set with (`present`) or without `addr`,
    /// after `after`.
    fn published(
        &self,
        addr: &str,
        present: bool,
        after: SystemTime,
    ) -> anyhow::Result<SystemTime> {
        let what = format!(
            "{addr} {} upstream api",
            if present { "into" } else { "out of" }
        );
        self.log.wait(&what, |l| {
            (l.at >= after && l.publishes(addr, present)).then_some(l.at)
        })
    }

    /// The first updater line `message` about `container` with `with` in its fields,
    /// after `after`: its time and fields.
    fn updater(
        &self,
        message: &str,
        container: &str,
        with: &str,
        after: SystemTime,
    ) -> anyhow::Result<(SystemTime, String)> {
        self.log
            .wait(&format!("{message} {container} {with}"), |l| {
                let fields = l
                    .updater(message, container, with)
                    .filter(|_| l.at >= after)?;
                Some((l.at, fields.to_owned()))
            })
    }
}

fn upstream_yaml(proxy: u16, extra: &str) -> String {
    format!(
        "upstreams:
  - name: api
    listen: 127.0.0.1:{proxy}
    dns_discovery:
      hostname: api.weave.local
      port: {PORT}
      refresh_interval_s: 1
{extra}"
    )
}

/// `push` (name server, Docker `docker`, upstream by push) and `poll` (upstream
/// polling `push`'s name server over DNS).
fn pair(dir: &Path, docker: &str) -> anyhow::Result<[Logged; 2]> {
    let dns = free_port(Ipv4Addr::LOCALHOST)?;
    let push_yaml = format!(
        "nameserver:\n  domain: weave.local\n  dns_listen: 127.0.0.1:{dns}\n  ttl: 1\n  fallback: [127.0.0.1:9]\n{}",
        upstream_yaml(free_port(Ipv4Addr::LOCALHOST)?, "")
    );
    let push = Logged::start(
        dir,
        &format!("push-docker-{docker}"),
        &push_yaml,
        &["--docker", docker],
        "warn,dwara_discovery=info,dwara_docker=debug",
    )?;
    let poll_yaml = upstream_yaml(
        free_port(Ipv4Addr::LOCALHOST)?,
        &format!("      nameservers: [127.0.0.1:{dns}]\n"),
    );
    let poll = Logged::start(
        dir,
        &format!("poll-docker-{docker}"),
        &poll_yaml,
        &["--docker", "off"],
        "warn,dwara_discovery=info",
    )?;
    Ok([push, poll])
}

/// When both upstreams published a set with (`present`) or without `addr`, after
/// `after`.
fn both_published(
    procs: &[Logged; 2],
    addr: &str,
    present: bool,
    after: SystemTime,
) -> anyhow::Result<[SystemTime; 2]> {
    Ok([
        procs[0].published(addr, present, after)?,
        procs[1].published(addr, present, after)?,
    ])
}

/// Pseudo-random pauses in 0..1 s (xorshift; no dependency for this).
struct Pauses(u64);

impl Pauses {
    fn next(&mut self) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_millis(self.0 % 1000)
    }
}

/// Milliseconds from `from` to `to` (negative when `to` is earlier).
fn ms_between(from: SystemTime, to: SystemTime) -> f64 {
    match to.duration_since(from) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    }
}

/// Sends `req`; fails unless the answer is a success.
fn send(req: reqwest::blocking::RequestBuilder) -> anyhow::Result<()> {
    let resp = req.send()?;
    if !resp.status().is_success() {
        bail!("{} {}", resp.status(), resp.text().unwrap_or_default());
    }
    Ok(())
}

/// Times of one direction, in milliseconds: (push, poll) per round.
#[derive(Default)]
struct Times {
    push: Vec<f64>,
    poll: Vec<f64>,
}

impl Times {
    fn add(&mut self, t0: SystemTime, [push, poll]: [SystemTime; 2]) {
        self.push.push(ms_between(t0, push));
        self.poll.push(ms_between(t0, poll));
    }
}

fn registrations(opts: &Options, dir: &Path) -> anyhow::Result<[Times; 2]> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?;
    let procs = pair(dir, "off")?;
    let api = |path: &str| format!("http://{}{path}", procs[0].dwara.http);
    let put = |id: &str, ip: &str| {
        send(
            client
                .put(api(&format!("/name/{id}/{ip}")))
                .body("fqdn=api.weave.local"),
        )
    };
    let t0 = SystemTime::now();
    put("anchor", "127.0.0.3")?;
    both_published(&procs, &format!("127.0.0.3:{PORT}"), true, t0)?;
    let mut pauses = Pauses(0x9e37_79b9_7f4a_7c15);
    let (mut into, mut out) = (Times::default(), Times::default());
    let addr = format!("127.0.0.2:{PORT}");
    for round in 0..opts.rounds {
        std::thread::sleep(pauses.next());
        let id = format!("c{round}");
        let t0 = SystemTime::now();
        put(&id, "127.0.0.2")?;
        into.add(t0, both_published(&procs, &addr, true, t0)?);
        std::thread::sleep(pauses.next());
        let t0 = SystemTime::now();
        send(client.delete(api(&format!("/name/{id}"))))?;
        out.add(t0, both_published(&procs, &addr, false, t0)?);
    }
    Ok([into, out])
}

fn docker(args: &[&str]) -> anyhow::Result<String> {
    output_of("docker", args)
}

/// The test image: `FROM scratch` + Debian's static busybox, built when missing.
fn ensure_image(dir: &Path) -> anyhow::Result<()> {
    if docker(&["image", "inspect", IMAGE]).is_ok() {
        return Ok(());
    }
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox is missing: apt-get install busybox-static");
    }
    let ctx = dir.join("image");
    std::fs::create_dir_all(&ctx)?;
    std::fs::copy(busybox, ctx.join("busybox"))?;
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\n\
         RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nCMD [\"/bin/sh\"]\n",
    )?;
    docker(&["build", "-q", "-t", IMAGE, &ctx.to_string_lossy()]).map(|_| ())
}

/// One engine event as this harness saw it on its own stream.
#[derive(Clone)]
struct Seen {
    id: String,
    /// `start`, `die`, `health_status: healthy`, …
    action: String,
    /// The daemon's `timeNano`.
    at: SystemTime,
    /// When this harness read it.
    read: SystemTime,
    /// The round trip of the inspect sent right after reading it, in ms.
    inspect_ms: f64,
    /// The container's first IPv4 address, from that inspect.
    ip: Option<String>,
}

/// `GET path` (HTTP/1.0, so the answer is not chunked) on the daemon's socket: the
/// stream, past the answer's head.
fn daemon_get(path: &str) -> anyhow::Result<(UnixStream, BufReader<UnixStream>)> {
    let mut s =
        UnixStream::connect(SOCKET).with_context(|| format!("cannot connect to {SOCKET}"))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n")?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut status = String::new();
    r.read_line(&mut status)?;
    if !status.contains(" 200 ") {
        bail!("GET {path} on {SOCKET}: {}", status.trim());
    }
    let mut header = String::new();
    while r.read_line(&mut header)? > 2 {
        header.clear();
    }
    Ok((s, r))
}

/// This harness's own view of the engine: its event stream, each event followed at
/// once by an inspect of the container. Closed on drop.
struct Engine {
    stream: UnixStream,
    seen: Arc<Feed<Seen>>,
}

impl Engine {
    fn follow() -> anyhow::Result<Self> {
        let filters = r#"{"type":["container"],"event":["start","die","health_status"]}"#;
        let encoded: String = filters.bytes().map(|b| format!("%{b:02X}")).collect();
        let (stream, mut reader) = daemon_get(&format!("/events?filters={encoded}"))?;
        let seen = Feed::new();
        let feed = seen.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                let read = SystemTime::now();
                if let Some(s) = Self::seen(&line, read) {
                    feed.push(s);
                }
                line.clear();
            }
        });
        Ok(Self { stream, seen })
    }

    fn seen(line: &str, read: SystemTime) -> Option<Seen> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let id = v["id"].as_str()?.to_owned();
        let at = UNIX_EPOCH + Duration::from_nanos(v["timeNano"].as_u64()?);
        let asked = Instant::now();
        let inspected = daemon_get(&format!("/containers/{id}/json")).and_then(|(_, mut r)| {
            let mut body = String::new();
            r.read_to_string(&mut body)?;
            Ok(body)
        });
        let inspect_ms = asked.elapsed().as_secs_f64() * 1000.0;
        let ip = inspected.ok().and_then(|body| {
            let c: serde_json::Value = serde_json::from_str(&body).ok()?;
            c["NetworkSettings"]["Networks"]
                .as_object()?
                .values()
                .find_map(|n| n["IPAddress"].as_str().filter(|ip| !ip.is_empty()))
                .map(str::to_owned)
        });
        Some(Seen {
            id,
            action: v["Action"].as_str()?.to_owned(),
            at,
            read,
            inspect_ms,
            ip,
        })
    }

    /// The first event `action` of container `id` at or after `after`.
    fn event(&self, id: &str, action: &str, after: SystemTime) -> anyhow::Result<Seen> {
        self.seen
            .wait(&format!("Docker event {action} of {id}"), |s| {
                (s.id == id && s.action == action && s.at >= after).then(|| s.clone())
            })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// What the engine and `push` do with each kind of event.
#[derive(Clone, Copy)]
enum Step {
    Start,
    Die,
    Unhealthy,
    Healthy,
}

impl Step {
    const ALL: [Step; 4] = [Step::Start, Step::Die, Step::Unhealthy, Step::Healthy];

    fn label(self) -> &'static str {
        match self {
            Step::Start => "in: start",
            Step::Die => "out: die (kill)",
            Step::Unhealthy => "out: unhealthy",
            Step::Healthy => "in: healthy again",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Step::Start => "start",
            Step::Die => "die",
            Step::Unhealthy => "health_status: unhealthy",
            Step::Healthy => "health_status: healthy",
        }
    }

    /// The updater's name for the action, in its `Docker event` line.
    fn dwara_action(self) -> &'static str {
        match self {
            Step::Start => "start",
            Step::Die => "die",
            Step::Unhealthy | Step::Healthy => "health_status",
        }
    }

    /// The updater's line that says the records changed.
    fn records_line(self) -> &'static str {
        match self {
            Step::Start => "registered",
            Step::Die => "unregistered",
            Step::Unhealthy | Step::Healthy => "health changed",
        }
    }

    fn present(self) -> bool {
        matches!(self, Step::Start | Step::Healthy)
    }
}

/// The columns of the container table: ms after the event, per round.
const COLUMNS: [&str; 7] = [
    "stream",
    "inspect",
    "dwara read",
    "dwara inspect",
    "records",
    "push",
    "poll",
];

/// One step's samples, a vector per column of [`COLUMNS`].
#[derive(Default)]
struct Samples([Vec<f64>; 7]);

/// What `push` and `poll` did about `event` (a `step` begun at `t0`), which made
/// `addr` enter or leave.
fn observe(
    procs: &[Logged; 2],
    step: Step,
    t0: SystemTime,
    event: &Seen,
    addr: &str,
    samples: &mut Samples,
) -> anyhow::Result<()> {
    let [push, poll] = both_published(procs, addr, step.present(), t0)?;
    let updater = &procs[0];
    let action = format!("action={} ", step.dwara_action());
    let (read, _) = updater.updater("Docker event", &event.id, &action, t0)?;
    let (records, _) = updater.updater(step.records_line(), &event.id, "", t0)?;
    let (_, inspected) = updater.updater("inspected", &event.id, "", event.at)?;
    let dwara_inspect_ms = inspected
        .split_whitespace()
        .find_map(|f| f.strip_prefix("inspect_us="))
        .and_then(|us| us.parse::<f64>().ok())
        .map_or(f64::NAN, |us| us / 1000.0);
    let values = [
        ms_between(event.at, event.read),
        event.inspect_ms,
        ms_between(event.at, read),
        dwara_inspect_ms,
        ms_between(event.at, records),
        ms_between(event.at, push),
        ms_between(event.at, poll),
    ];
    for (column, v) in samples.0.iter_mut().zip(values) {
        column.push(v);
    }
    Ok(())
}

fn containers(opts: &Options, dir: &Path) -> anyhow::Result<Vec<Samples>> {
    ensure_image(dir)?;
    let engine = Engine::follow()?;
    let procs = pair(dir, "on")?;
    let prefix = format!("dwara-perf-push-{}", std::process::id());
    let run = |name: &str, args: &[&str], cmd: &[&str]| {
        let name = format!("{prefix}-{name}");
        let on_name = [
            "run",
            "-d",
            "--name",
            &name,
            "--hostname",
            "api",
            "--domainname",
            "weave.local",
        ];
        docker(&[&on_name[..], args, &[IMAGE], cmd].concat())
    };
    let sleeper = ["sleep", "100000"];
    let cleanup = || {
        if let Ok(ids) = docker(&["ps", "-aq", "--filter", &format!("name={prefix}-")]) {
            for id in ids.split_whitespace() {
                let _ = docker(&["rm", "-f", id]);
            }
        }
    };
    // The address of container `id`, from this harness's inspect at its start.
    let addr_of = |id: &str| -> anyhow::Result<String> {
        let ip = engine.event(id, "start", UNIX_EPOCH)?.ip;
        Ok(format!("{}:{PORT}", ip.context("no address")?))
    };
    let result = (|| {
        let t0 = SystemTime::now();
        let anchor = run("anchor", &[], &sleeper)?;
        both_published(&procs, &addr_of(&anchor)?, true, t0)?;
        let check = [
            "--health-cmd",
            "test -e /ok",
            "--health-interval",
            "1s",
            "--health-timeout",
            "1s",
            "--health-retries",
            "1",
        ];
        let t0 = SystemTime::now();
        let checked = run(
            "checked",
            &check,
            &["sh", "-c", "touch /ok; exec sleep 100000"],
        )?;
        let checked_addr = addr_of(&checked)?;
        both_published(&procs, &checked_addr, true, t0)?;
        let mut pauses = Pauses(0x2545_f491_4f6c_dd1d);
        let mut samples: Vec<Samples> = Step::ALL.iter().map(|_| Samples::default()).collect();
        for round in 0..opts.rounds {
            let mut id = String::new();
            for (step, s) in Step::ALL.into_iter().zip(&mut samples) {
                std::thread::sleep(pauses.next());
                let t0 = SystemTime::now();
                match step {
                    Step::Start => id = run(&format!("c{round}"), &[], &sleeper)?,
                    Step::Die => drop(docker(&["kill", &id])?),
                    Step::Unhealthy => drop(docker(&["exec", &checked, "rm", "/ok"])?),
                    Step::Healthy => drop(docker(&["exec", &checked, "touch", "/ok"])?),
                }
                let (target, addr) = match step {
                    Step::Start | Step::Die => (&id, addr_of(&id)?),
                    Step::Unhealthy | Step::Healthy => (&checked, checked_addr.clone()),
                };
                let event = engine.event(target, step.action(), t0)?;
                observe(&procs, step, t0, &event, &addr, s)?;
            }
            docker(&["rm", "-f", &id])?;
        }
        Ok(samples)
    })();
    cleanup();
    result
}

fn worst(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

fn report(title: &str, [into, out]: &[Times; 2]) {
    println!("{title}");
    println!(
        "  {:<28} {:>10} {:>10} {:>10} {:>10}",
        "", "push p50", "push max", "poll p50", "poll max"
    );
    for (what, t) in [("into rotation (ms)", into), ("out of rotation (ms)", out)] {
        println!(
            "  {what:<28} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            median(t.push.clone()),
            worst(&t.push),
            median(t.poll.clone()),
            worst(&t.poll)
        );
    }
    let ratio = |t: &Times| median(t.push.clone()) / median(t.poll.clone());
    println!(
        "  push / poll (medians): into {:.3}, out {:.3}",
        ratio(into),
        ratio(out)
    );
}

fn report_containers(rounds: usize, samples: &[Samples]) {
    println!(
        "Docker event → upstream, {rounds} rounds: ms after the event's time (timeNano); the inspect columns are round trips"
    );
    for (title, value) in [
        ("median", median as fn(Vec<f64>) -> f64),
        ("max", |v: Vec<f64>| worst(&v)),
    ] {
        print!("  {title:<20}");
        for c in COLUMNS {
            print!(" {c:>13}");
        }
        println!();
        for (step, s) in Step::ALL.iter().zip(samples) {
            print!("  {:<20}", step.label());
            for v in &s.0 {
                print!(" {:>13.1}", value(v.clone()));
            }
            println!();
        }
    }
    println!("  medians:");
    for (step, s) in Step::ALL.iter().zip(samples) {
        let [stream, inspect, read, _, records, push, poll] = &s.0;
        let m = |v: &Vec<f64>| median(v.clone());
        println!(
            "  {:<20} push − dwara read {:.1} ms, records → push {:.2} ms; push / (stream + inspect) {:.2}; push / poll {:.3}; push over 50 ms in {} of {} rounds",
            step.label(),
            m(push) - m(read),
            m(push) - m(records),
            m(push) / (m(stream) + m(inspect)),
            m(push) / m(poll),
            push.iter().filter(|&&t| t > 50.0).count(),
            push.len(),
        );
    }
}

/// `cargo xtask perf push`.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    crate::cargo(&["build", "--release", "-p", "dwara"])?;
    in_scratch_dir("perf-push", |dir| {
        let times = registrations(&opts, dir)?;
        report(
            &format!(
                "PUT/DELETE over HTTP → upstream, {} rounds (push: same process; poll: DNS, refresh 1 s, TTL 1 s)",
                opts.rounds
            ),
            &times,
        );
        if opts.docker {
            let samples = containers(&opts, dir)?;
            report_containers(opts.rounds, &samples);
        }
        Ok(())
    })
}
