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
//! An anchor entry stays registered throughout, so a removal leaves a non-empty
//! answer and is published (the `min_endpoints: 1` floor would keep it otherwise).
//! Each round waits a pseudo-random 0–1 s (so the polling phase varies), registers
//! an address with `PUT /name/…` and times, for each process, until the endpoint is
//! in `GET /upstreams`; waits again, deletes it with `DELETE /name/…` and times
//! until it has left. `GET /upstreams` is polled every millisecond, so times have
//! a resolution of about 1 ms.
//!
//! `--docker` adds the same with containers (the `dwara-test-busybox` image is built
//! from Debian's static busybox when missing, as the tests do): `push` follows the
//! Docker engine, a container with hostname `api` in the domain is started and
//! killed, and times run from the engine's `start` and `die` events (their
//! `timeNano`, read back with `docker events`) to the change in `GET /upstreams`.
//!
//! Prints the median and the worst time per path and direction, and the ratio
//! push / poll.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use crate::perf_util::{await_listening, free_port, in_scratch_dir, median, release_dwara};

const IMAGE: &str = "dwara-test-busybox:latest";
/// The port of every endpoint (nothing listens: `GET /upstreams` is what is read).
const PORT: u16 = 8080;

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

/// A `dwara serve`; killed on drop.
struct Dwara {
    http: SocketAddr,
    child: Child,
}

impl Drop for Dwara {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path, name: &str, yaml: &str, extra: &[&str]) -> anyhow::Result<Dwara> {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(&config, yaml)?;
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port(Ipv4Addr::LOCALHOST)?));
    let bin = release_dwara();
    let child = Command::new(&bin)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--http-listen")
        .arg(http.to_string())
        .args(extra)
        .env("DWARA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let mut d = Dwara { http, child };
    await_listening(&mut d.child, http, &format!("dwara serve ({name})"))?;
    Ok(d)
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

/// The endpoints of upstream 0 as `ip:port` strings.
fn endpoints(client: &reqwest::blocking::Client, d: &Dwara) -> anyhow::Result<Vec<String>> {
    let v: serde_json::Value = client
        .get(format!("http://{}/upstreams", d.http))
        .send()?
        .json()?;
    Ok(v["upstreams"][0]["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["addr"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// Polls both processes every millisecond until `addr`'s presence is `present` in
/// each; the moment each got there.
fn until(
    client: &reqwest::blocking::Client,
    procs: [&Dwara; 2],
    addr: &str,
    present: bool,
) -> anyhow::Result<[SystemTime; 2]> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen: [Option<SystemTime>; 2] = [None, None];
    loop {
        for (i, d) in procs.iter().enumerate() {
            if seen[i].is_none() && endpoints(client, d)?.iter().any(|e| e == addr) == present {
                seen[i] = Some(SystemTime::now());
            }
        }
        if let [Some(a), Some(b)] = seen {
            return Ok([a, b]);
        }
        if Instant::now() > deadline {
            bail!("{addr} present={present} not reached within 30 s: {seen:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
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

/// Times of one path (push or poll) in one direction, in milliseconds.
#[derive(Default)]
struct Times {
    into: Vec<f64>,
    out: Vec<f64>,
}

fn ms_between(from: SystemTime, to: SystemTime) -> f64 {
    to.duration_since(from)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Sends `req`; fails unless the answer is a success.
fn send(req: reqwest::blocking::RequestBuilder) -> anyhow::Result<()> {
    let resp = req.send()?;
    if !resp.status().is_success() {
        bail!("{} {}", resp.status(), resp.text().unwrap_or_default());
    }
    Ok(())
}

fn registrations(opts: &Options, dir: &Path) -> anyhow::Result<[Times; 2]> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?;
    let dns = free_port(Ipv4Addr::LOCALHOST)?;
    let push_yaml = format!(
        "nameserver:\n  domain: weave.local\n  dns_listen: 127.0.0.1:{dns}\n  ttl: 1\n  fallback: [127.0.0.1:9]\n{}",
        upstream_yaml(free_port(Ipv4Addr::LOCALHOST)?, "")
    );
    let push = start(dir, "push", &push_yaml, &["--docker", "off"])?;
    let poll_yaml = upstream_yaml(
        free_port(Ipv4Addr::LOCALHOST)?,
        &format!("      nameservers: [127.0.0.1:{dns}]\n"),
    );
    let poll = start(dir, "poll", &poll_yaml, &["--docker", "off"])?;
    let api = |path: &str| format!("http://{}{path}", push.http);
    send(
        client
            .put(api("/name/anchor/127.0.0.3"))
            .body("fqdn=api.weave.local"),
    )?;
    until(&client, [&push, &poll], &format!("127.0.0.3:{PORT}"), true)?;
    let mut pauses = Pauses(0x9e37_79b9_7f4a_7c15);
    let mut times = [Times::default(), Times::default()];
    let addr = format!("127.0.0.2:{PORT}");
    for round in 0..opts.rounds {
        std::thread::sleep(pauses.next());
        let id = format!("c{round}");
        let t0 = SystemTime::now();
        send(
            client
                .put(api(&format!("/name/{id}/127.0.0.2")))
                .body("fqdn=api.weave.local"),
        )?;
        let seen = until(&client, [&push, &poll], &addr, true)?;
        for (t, s) in times.iter_mut().zip(seen) {
            t.into.push(ms_between(t0, s));
        }
        std::thread::sleep(pauses.next());
        let t0 = SystemTime::now();
        send(client.delete(api(&format!("/name/{id}"))))?;
        let seen = until(&client, [&push, &poll], &addr, false)?;
        for (t, s) in times.iter_mut().zip(seen) {
            t.out.push(ms_between(t0, s));
        }
    }
    Ok(times)
}

fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .context("cannot run docker")?;
    if !out.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
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

/// The engine's time of `event` of container `id` (its `timeNano`).
fn event_time(id: &str, event: &str, since: SystemTime) -> anyhow::Result<SystemTime> {
    let since = since
        .duration_since(UNIX_EPOCH)?
        .as_secs()
        .saturating_sub(5);
    let until = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() + 1;
    let out = docker(&[
        "events",
        "--since",
        &since.to_string(),
        "--until",
        &until.to_string(),
        "--filter",
        &format!("container={id}"),
        "--filter",
        &format!("event={event}"),
        "--format",
        "{{.TimeNano}}",
    ])?;
    let nanos: u64 = out
        .lines()
        .last()
        .context("no such event")?
        .trim()
        .parse()
        .context("timeNano")?;
    Ok(UNIX_EPOCH + Duration::from_nanos(nanos))
}

fn containers(opts: &Options, dir: &Path) -> anyhow::Result<[Times; 2]> {
    ensure_image(dir)?;
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()?;
    let dns = free_port(Ipv4Addr::LOCALHOST)?;
    let push_yaml = format!(
        "nameserver:\n  domain: weave.local\n  dns_listen: 127.0.0.1:{dns}\n  ttl: 1\n  fallback: [127.0.0.1:9]\n{}",
        upstream_yaml(free_port(Ipv4Addr::LOCALHOST)?, "")
    );
    let push = start(dir, "push-docker", &push_yaml, &["--docker", "on"])?;
    let poll_yaml = upstream_yaml(
        free_port(Ipv4Addr::LOCALHOST)?,
        &format!("      nameservers: [127.0.0.1:{dns}]\n"),
    );
    let poll = start(dir, "poll-docker", &poll_yaml, &["--docker", "off"])?;
    let prefix = format!("dwara-perf-push-{}", std::process::id());
    let run = |name: &str| {
        docker(&[
            "run",
            "-d",
            "--name",
            &format!("{prefix}-{name}"),
            "--hostname",
            "api",
            "--domainname",
            "weave.local",
            IMAGE,
            "sleep",
            "100000",
        ])
    };
    let cleanup = || {
        if let Ok(ids) = docker(&["ps", "-aq", "--filter", &format!("name={prefix}-")]) {
            for id in ids.split_whitespace() {
                let _ = docker(&["rm", "-f", id]);
            }
        }
    };
    let result = (|| {
        let anchor = run("anchor")?;
        let anchor_ip = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &anchor,
        ])?;
        until(
            &client,
            [&push, &poll],
            &format!("{anchor_ip}:{PORT}"),
            true,
        )?;
        let mut pauses = Pauses(0x2545_f491_4f6c_dd1d);
        let mut times = [Times::default(), Times::default()];
        for round in 0..opts.rounds {
            std::thread::sleep(pauses.next());
            let before = SystemTime::now();
            let id = run(&format!("c{round}"))?;
            let ip = docker(&[
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                &id,
            ])?;
            let addr = format!("{ip}:{PORT}");
            let seen = until(&client, [&push, &poll], &addr, true)?;
            let started = event_time(&id, "start", before)?;
            for (t, s) in times.iter_mut().zip(seen) {
                t.into.push(ms_between(started, s));
            }
            std::thread::sleep(pauses.next());
            let before = SystemTime::now();
            docker(&["kill", &id])?;
            let seen = until(&client, [&push, &poll], &addr, false)?;
            let died = event_time(&id, "die", before)?;
            for (t, s) in times.iter_mut().zip(seen) {
                t.out.push(ms_between(died, s));
            }
            let _ = docker(&["rm", "-f", &id]);
        }
        Ok(times)
    })();
    cleanup();
    result
}

fn worst(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn report(title: &str, [push, poll]: &[Times; 2]) {
    println!("{title}");
    println!(
        "  {:<28} {:>10} {:>10} {:>10} {:>10}",
        "", "push p50", "push max", "poll p50", "poll max"
    );
    for (what, a, b) in [
        ("into rotation (ms)", &push.into, &poll.into),
        ("out of rotation (ms)", &push.out, &poll.out),
    ] {
        println!(
            "  {what:<28} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            median(a.clone()),
            worst(a),
            median(b.clone()),
            worst(b)
        );
    }
    let ratio = |a: &[f64], b: &[f64]| median(a.to_vec()) / median(b.to_vec());
    println!(
        "  push / poll (medians): into {:.3}, out {:.3}",
        ratio(&push.into, &poll.into),
        ratio(&push.out, &poll.out)
    );
}

/// `cargo xtask perf push`.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    crate::cargo(&["build", "--release", "-p", "dwara"])?;
    in_scratch_dir("perf-push", |dir| {
        let times = registrations(&opts, dir)?;
        report(
            &format!(
                "PUT/DELETE over HTTP → GET /upstreams, {} rounds (push: same process; poll: DNS, refresh 1 s, TTL 1 s)",
                opts.rounds
            ),
            &times,
        );
        if opts.docker {
            let times = containers(&opts, dir)?;
            report(
                &format!(
                    "Docker start/die event → GET /upstreams, {} rounds",
                    opts.rounds
                ),
                &times,
            );
        }
        Ok(())
    })
}
