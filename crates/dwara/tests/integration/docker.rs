//! `dwara serve --docker …` against the real Docker engine on this machine, driven
//! by `docker` and dig: containers answer by name within a second of `docker run`
//! and are NXDOMAIN within a second of `docker stop`; a restarted `dwara serve`
//! registers what runs and not what stopped meanwhile; `--docker on` without a
//! daemon fails with one line, `auto` serves on; the event stream cut at a socat relay
//! is repaired on return; and, end to end, dwara in a container answering two busybox
//! containers that use it as their DNS server.
//!
//! Engine tests are skipped, with the reason printed, only when no Docker engine is
//! reachable. They use the domain `dockertest.local` (no other test serves it) and
//! container names `dwe-<test>-<pid>-…` labelled with this process's pid; every test
//! removes its containers on the way out, and containers left by a killed earlier
//! run are removed once per process.
//!
//! The end-to-end test puts the binary under test and the libraries `ldd` lists in
//! a `FROM scratch` image.
//!
//! Measurements (ignored; they print numbers and assert no timings):
//! `cargo test -p dwara --test integration -- --ignored --nocapture docker::measure`
//! (`DWARA_BIN=path` measures another build of the binary, e.g. the release one).

#![allow(clippy::print_stdout)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, UNIX_EPOCH};

use test_support::docker::{
    BUSYBOX_IMAGE as BUSYBOX, HEALTHY_WHILE_OK, Scope, busybox_image, docker, engine_reachable,
};

use crate::nameserver::{BIN, Serve};

/// The domain these tests serve.
const DOMAIN: &str = "dockertest.local";
/// The image of dwara itself for the end-to-end test.
const DWARA_IMAGE: &str = "dwara-test-dwara:latest";
/// The real daemon socket.
const SOCKET: &str = "/var/run/docker.sock";
/// How long a check may take before the test gives up. How fast names follow the
/// engine is measured by `docker::measure` (ignored by default), not asserted here.
const PATIENCE: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------
// The engine: `docker`, the test image, containers removed on drop.

/// `docker ARGS`, panicking with the message when it fails.
fn docker_ok(args: &[&str]) -> String {
    docker(args).unwrap_or_else(|e| panic!("{e}"))
}

/// One test's containers (labelled with this process's pid) and networks, removed
/// on drop, failed or not.
struct Engine {
    scope: Scope,
}

/// `None` (after printing why) when no Docker engine is reachable.
fn engine(test: &str) -> Option<Engine> {
    if !test_support::require(
        &format!("a Docker engine for docker::{test}"),
        engine_reachable(),
    ) {
        return None;
    }
    busybox_image().expect("build the busybox test image");
    Some(Engine {
        scope: Scope::with_pid_label(format!("dwe-{test}-{}", std::process::id())),
    })
}

impl Engine {
    /// This test's name for `name` (also usable as a hostname: short, no dots).
    fn name(&self, name: &str) -> String {
        self.scope.name(name)
    }

    /// `docker run -d --name PREFIX-name ARGS… IMAGE CMD…`: the full container id.
    fn run_image(&self, name: &str, args: &[&str], image: &str, cmd: &[&str]) -> String {
        self.scope
            .run(name, args, image, cmd)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A busybox container that sleeps.
    fn run(&self, name: &str, args: &[&str]) -> String {
        self.run_image(name, args, BUSYBOX, &["sleep", "100000"])
    }

    /// A sleeping container with hostname PREFIX-name in the test domain; its fqdn.
    fn run_host(&self, name: &str) -> (String, String) {
        let host = self.name(name);
        let id = self.run(name, &["--hostname", &host, "--domainname", DOMAIN]);
        (id, format!("{host}.{DOMAIN}"))
    }

    /// A sleeping busybox container on `net` whose resolver is `dns`, with a host
    /// name in `domain` that differs from its container name (so Docker's own
    /// resolver, which knows container names and aliases, cannot be what answers):
    /// (id, fqdn, address on `net`).
    fn client(&self, name: &str, net: &str, dns: &str, domain: &str) -> (String, String, String) {
        let host = format!("{name}-{}", std::process::id());
        let id = self.run(
            name,
            &[
                "--network",
                net,
                "--dns",
                dns,
                "--hostname",
                &host,
                "--domainname",
                domain,
            ],
        );
        let ip = ip_on(&id, net);
        (id, format!("{host}.{domain}"), ip)
    }

    /// A user-defined bridge network, removed on drop.
    fn network(&self, name: &str) -> String {
        self.scope.network(name).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The container's IPv4 addresses on every network, sorted.
fn ipv4s(id: &str) -> Vec<String> {
    let out = docker_ok(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        id,
    ]);
    let mut v: Vec<String> = out.split_whitespace().map(str::to_owned).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------------
// `dwara serve` with Docker on.

/// A running `dwara serve --domain dockertest.local …` (a [`Serve`]: its stderr kept;
/// killed on drop).
struct DockerServe(Serve);

impl std::ops::Deref for DockerServe {
    type Target = Serve;

    fn deref(&self) -> &Serve {
        &self.0
    }
}

/// The binary under test (`DWARA_BIN` overrides, for measuring another build).
fn bin() -> PathBuf {
    std::env::var_os("DWARA_BIN").map_or_else(|| PathBuf::from(BIN), PathBuf::from)
}

/// `dwara serve` on loopback in the test domain, with `args` (the Docker flags).
fn serve_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--domain", DOMAIN])
        .args([
            "--dns-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .args(["--fallback", "127.0.0.1:9"])
        .args(args)
        .env("NO_COLOR", "1")
        .env("DWARA_LOG", "info")
        .env_remove("DOCKER_HOST")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

impl DockerServe {
    /// Starts `dwara serve ARGS` and waits for its "name server ready" line.
    fn start(args: &[&str]) -> Self {
        Self::spawn(serve_command(args))
    }

    /// Runs `cmd` and waits (30 s) for its "name server ready" line.
    fn spawn(cmd: Command) -> Self {
        Self(Serve::spawn_within(cmd, Duration::from_secs(30)))
    }

    /// The sorted A records of `fqdn`, or the status when it is not NOERROR.
    fn a(&self, fqdn: &str) -> Result<Vec<String>, String> {
        let answer = self
            .dig()
            .query(fqdn, "A")
            .map_err(|e| format!("dig: {e}"))?;
        if answer.status == "NOERROR" {
            Ok(answer.data("A"))
        } else {
            Err(answer.status)
        }
    }

    fn nxdomain(&self, fqdn: &str) -> bool {
        self.a(fqdn) == Err("NXDOMAIN".to_owned())
    }

    /// The value of the `/metrics` series `series` (0 when absent).
    fn metric(&self, series: &str) -> f64 {
        self.0.metric(series).unwrap_or(0.0)
    }

    /// SIGTERM, and the exit status (within 10 s).
    fn stop(mut self) -> ExitStatus {
        test_support::signal(self.0.child.id(), "TERM").unwrap();
        wait_exit(&mut self.0.child, Duration::from_secs(10)).expect("dwara serve exits on SIGTERM")
    }
}

/// The child's exit status, or `None` (child killed) when it runs past `timeout`.
fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `check` until it holds or `timeout` passes: how long it took, if it held.
fn poll(timeout: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if check() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------
// Tests.

#[test]
fn a_container_answers_after_run_and_is_nxdomain_after_stop() {
    let Some(e) = engine("web1") else { return };
    let s = DockerServe::start(&["--docker", "on"]);
    let fqdn = format!("web1.{DOMAIN}");
    assert!(s.nxdomain(&fqdn), "{:?}", s.a(&fqdn));
    let id = e.run("web1", &["--hostname", "web1", "--domainname", DOMAIN]);
    let started = Instant::now();
    let want = ipv4s(&id);
    assert!(!want.is_empty());
    let up = poll(PATIENCE, || s.a(&fqdn).as_ref() == Ok(&want));
    let took = started.elapsed();
    assert!(up.is_some(), "never answered {want:?}: {:?}", s.a(&fqdn));
    println!("answered {took:?} after docker run");

    // Outside the domain: not registered (hostname carries another domain).
    let other = e.run(
        "other",
        &["--hostname", "web1", "--domainname", "elsewhere.test"],
    );
    assert!(!ipv4s(&other).is_empty());

    docker_ok(&["stop", "-t", "0", &id]);
    let stopped = Instant::now();
    let down = poll(PATIENCE, || s.nxdomain(&fqdn));
    let took = stopped.elapsed();
    assert!(down.is_some(), "still answers after stop: {:?}", s.a(&fqdn));
    println!("NXDOMAIN {took:?} after docker stop");
    // The one outside the domain never was registered under the name.
    assert!(s.nxdomain(&fqdn));
    assert!(
        s.logged("containers registered)"),
        "the ready line names the Docker socket"
    );
}

#[test]
fn a_restarted_serve_registers_what_runs_and_not_what_stopped_meanwhile() {
    let Some(e) = engine("restart") else { return };
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    let args = ["--docker", "on", "--data-dir", data_dir];
    let (keep, keep_fqdn) = e.run_host("keep");
    let (gone, gone_fqdn) = e.run_host("gone");
    let s = DockerServe::start(&args);
    // Running containers are registered before the name server says it is ready.
    assert_eq!(s.a(&keep_fqdn), Ok(ipv4s(&keep)));
    assert_eq!(s.a(&gone_fqdn), Ok(ipv4s(&gone)));
    assert!(s.stop().success());

    // While dwara is down: one stops, one starts.
    docker_ok(&["stop", "-t", "0", &gone]);
    let (new, new_fqdn) = e.run_host("new");

    let s = DockerServe::start(&args);
    assert_eq!(s.a(&keep_fqdn), Ok(ipv4s(&keep)));
    assert_eq!(s.a(&new_fqdn), Ok(ipv4s(&new)));
    assert!(s.nxdomain(&gone_fqdn), "{:?}", s.a(&gone_fqdn));
    // And it follows events again.
    docker_ok(&["stop", "-t", "0", &keep]);
    assert!(
        poll(PATIENCE, || s.nxdomain(&keep_fqdn)).is_some(),
        "{:?}",
        s.a(&keep_fqdn)
    );
}

#[test]
fn docker_on_without_a_daemon_fails_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-daemon.sock");
    let socket = socket.to_str().unwrap();
    let mut cmd = serve_command(&["--docker", "on", "--docker-socket", socket]);
    cmd.env("DWARA_LOG", "warn");
    let mut child = cmd.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let status = wait_exit(&mut child, Duration::from_secs(20));
    let text = reader.join().unwrap();
    let status = status.unwrap_or_else(|| panic!("dwara serve kept running:\n{text}"));
    assert!(!status.success(), "{status:?}: {text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "want one line:\n{text}");
    assert!(lines[0].starts_with("dwara: "), "{text}");
    assert!(lines[0].contains("Docker daemon"), "{text}");
    assert!(lines[0].contains(socket), "{text}");
}

#[test]
fn docker_auto_without_a_socket_serves_on_and_says_docker_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-daemon.sock");
    // No --docker flag: auto is the default, and DOCKER_HOST names the socket.
    let mut cmd = serve_command(&[]);
    cmd.env("DOCKER_HOST", format!("unix://{}", socket.display()));
    let s = DockerServe::spawn(cmd);
    assert!(
        s.logged(&format!(
            "Docker updater off: no socket at {}",
            socket.display()
        )),
        "{:?}",
        s.log.lock().unwrap()
    );
    // It serves: its domain answers (NXDOMAIN for an unknown name), the API registers.
    let fqdn = format!("by-hand.{DOMAIN}");
    assert!(s.nxdomain(&fqdn));
    let (status, body) = test_support::http::request(
        s.http,
        "PUT",
        "/name/c1/10.77.0.1",
        Some(&format!("fqdn={fqdn}")),
    );
    assert_eq!(status, 204, "{body}");
    assert_eq!(s.a(&fqdn), Ok(vec!["10.77.0.1".to_owned()]));
    // The Docker metrics are not there.
    assert_eq!(s.metric("dwara_docker_reconciles_total"), 0.0);
    // Explicit auto, a socket path that does not exist: the same.
    let s = DockerServe::start(&["--docker", "auto", "--docker-socket", "/nonexistent/d.sock"]);
    assert!(s.logged("Docker updater off: no socket at /nonexistent/d.sock"));
    assert!(s.nxdomain(&fqdn));
}

/// The container's address on `network`.
fn ip_on(id: &str, network: &str) -> String {
    docker_ok(&[
        "inspect",
        "-f",
        &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
        id,
    ])
}

#[test]
fn the_docker_section_and_the_flags_over_it_choose_names_and_network() {
    let Some(e) = engine("names") else { return };
    let net = e.network("net");
    let alias = format!("al-{}", std::process::id());
    let (host, name) = (e.name("h"), e.name("c"));
    let id = e.run(
        "c",
        &[
            "--network",
            &net,
            "--network-alias",
            &alias,
            "--hostname",
            &host,
            "--domainname",
            DOMAIN,
        ],
    );
    docker_ok(&["network", "connect", "bridge", &id]);
    let (on_net, on_bridge) = (ip_on(&id, &net), ip_on(&id, "bridge"));
    assert_ne!(on_net, on_bridge);
    let [host_fqdn, name_fqdn, alias_fqdn] =
        [&host, &name, &alias].map(|n| format!("{n}.{DOMAIN}"));

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dwara.yaml");
    std::fs::write(
        &config,
        format!(
            "nameserver: {{}}\ndocker:\n  mode: \"on\"\n  network: {net}\n  names: hostname,name,aliases\n"
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    // The section alone: three names, the one network's address.
    let s = DockerServe::start(&["--config", config]);
    for fqdn in [&host_fqdn, &name_fqdn, &alias_fqdn] {
        assert_eq!(s.a(fqdn), Ok(vec![on_net.clone()]), "{fqdn}");
    }
    drop(s);
    // Flags override it: the hostname only, the other network.
    let s = DockerServe::start(&[
        "--config",
        config,
        "--docker-names",
        "hostname",
        "--docker-network",
        "bridge",
    ]);
    assert_eq!(s.a(&host_fqdn), Ok(vec![on_bridge]));
    assert!(s.nxdomain(&name_fqdn), "{:?}", s.a(&name_fqdn));
    assert!(s.nxdomain(&alias_fqdn), "{:?}", s.a(&alias_fqdn));
}

/// socat between a test socket and the daemon's, in its own process group so a cut
/// closes every relayed connection (the event stream too).
struct Relay {
    path: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Relay {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut relay = Self {
            path: dir.path().join("docker.sock"),
            child: None,
            _dir: dir,
        };
        relay.restore();
        relay
    }

    /// (Re)starts socat and waits for its socket.
    fn restore(&mut self) {
        assert!(self.child.is_none(), "relay already up");
        let child = Command::new("socat")
            .arg(format!(
                "UNIX-LISTEN:{},fork,unlink-early",
                self.path.display()
            ))
            .arg(format!("UNIX-CONNECT:{SOCKET}"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn socat");
        self.child = Some(child);
        assert!(
            poll(Duration::from_secs(10), || self.path.exists()).is_some(),
            "socat made no socket at {}",
            self.path.display()
        );
    }

    /// Kills socat and every connection it relays; removes the socket.
    fn cut(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Its own process group: the listener and its forked per-connection children.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

#[test]
fn a_cut_daemon_connection_is_repaired_when_it_comes_back() {
    let Some(e) = engine("relay") else { return };
    if !crate::interop::require("socat") {
        return;
    }
    let mut relay = Relay::start();
    let socket = relay.path.to_str().unwrap().to_owned();
    let (old, old_fqdn) = e.run_host("old");
    let s = DockerServe::start(&["--docker", "on", "--docker-socket", &socket]);
    let old_ips = ipv4s(&old);
    assert_eq!(s.a(&old_fqdn), Ok(old_ips.clone()));

    relay.cut();
    assert!(
        poll(PATIENCE, || s.logged("Docker event stream ended")
            || s.logged("Docker event stream failed"))
        .is_some(),
        "the cut was not noticed"
    );
    // While cut: one stops, one starts; dwara cannot see it.
    docker_ok(&["stop", "-t", "0", &old]);
    let (new, new_fqdn) = e.run_host("new");
    let new_ips = ipv4s(&new);
    assert_eq!(s.a(&old_fqdn), Ok(old_ips));
    assert!(s.nxdomain(&new_fqdn));

    relay.restore();
    let repaired = poll(PATIENCE, || {
        s.a(&new_fqdn).as_ref() == Ok(&new_ips) && s.nxdomain(&old_fqdn)
    });
    assert!(
        repaired.is_some(),
        "after restore: new {:?} (want {new_ips:?}), old {:?}",
        s.a(&new_fqdn),
        s.a(&old_fqdn)
    );
    // The repair (reconcile) happens before the "reconnected" line and the counters
    // are written: await them rather than read them once.
    assert!(poll(PATIENCE, || s.logged("reconnected to the Docker daemon")).is_some());
    assert!(
        poll(PATIENCE, || s.metric("dwara_docker_reconnects_total")
            >= 1.0)
        .is_some()
    );
    assert!(
        poll(PATIENCE, || {
            s.metric("dwara_docker_reconcile_repairs_total{change=\"removed\"}") >= 1.0
        })
        .is_some()
    );
    // And events are followed again through the restored relay.
    docker_ok(&["stop", "-t", "0", &new]);
    assert!(poll(PATIENCE, || s.nxdomain(&new_fqdn)).is_some());
}

// ---------------------------------------------------------------------------------
// End to end: dwara itself in a container.

/// The image label carrying the binary's mtime (the image cache key).
const MTIME_LABEL: &str = "dwara.test.binary-mtime";

/// The binary under test and the shared libraries `ldd` lists for it, at their own
/// paths, in a `FROM scratch` image: no second (static, release) build is needed.
/// Built at most once per process; rebuilt only when the binary's mtime differs
/// from the image's label. `Err` says why the image cannot be built here.
fn dwara_image() -> Result<(), String> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT.get_or_init(build_dwara_image).clone()
}

fn build_dwara_image() -> Result<(), String> {
    let binary = Path::new(BIN);
    let stamp = std::fs::metadata(binary)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", binary.display()))?
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_nanos()
        .to_string();
    let format = format!("{{{{index .Config.Labels \"{MTIME_LABEL}\"}}}}");
    if docker(&["image", "inspect", "-f", &format, DWARA_IMAGE]).as_deref() == Ok(stamp.as_str()) {
        return Ok(());
    }
    let ldd = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("cannot run ldd: {e}"))?;
    if !ldd.status.success() {
        return Err(format!("ldd {}: {}", binary.display(), ldd.status));
    }
    // Lines are `name => /path (addr)`, `/path (addr)` or `linux-vdso.so.1 (addr)`.
    let libs: Vec<PathBuf> = String::from_utf8_lossy(&ldd.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(PathBuf::from)
        .collect();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = dir.path().join("root");
    for file in libs
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new("/dwara")])
    {
        let from = if file == Path::new("/dwara") {
            binary
        } else {
            file
        };
        let to = root.join(file.strip_prefix("/").map_err(|e| e.to_string())?);
        std::fs::create_dir_all(to.parent().ok_or("no parent")?).map_err(|e| e.to_string())?;
        std::fs::copy(from, &to).map_err(|e| format!("{}: {e}", from.display()))?;
    }
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY root/ /\nENTRYPOINT [\"/dwara\"]\n",
    )
    .map_err(|e| e.to_string())?;
    let previous = docker(&["image", "inspect", "-f", "{{.Id}}", DWARA_IMAGE]).ok();
    let label = format!("{MTIME_LABEL}={stamp}");
    let built = docker(&[
        "build",
        "-q",
        "--label",
        &label,
        "-t",
        DWARA_IMAGE,
        &dir.path().to_string_lossy(),
    ])
    .map_err(|e| format!("cannot build the dwara image: {e}"))?;
    // The image of the previous binary would stay behind untagged.
    if let Some(old) = previous.filter(|old| *old != built) {
        let _ = docker(&["rmi", &old]);
    }
    Ok(())
}

/// `docker exec ID CMD…`: (success, stdout + stderr).
fn exec(id: &str, cmd: &[&str]) -> (bool, String) {
    let out = Command::new("docker")
        .arg("exec")
        .arg(id)
        .args(cmd)
        .output()
        .expect("run docker exec");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `docker logs ID`, both streams.
fn logs(id: &str) -> String {
    let out = Command::new("docker")
        .args(["logs", id])
        .output()
        .expect("run docker logs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn end_to_end_dwara_in_a_container_is_the_dns_server_of_two_busybox_containers() {
    let Some(e) = engine("e2e") else { return };
    if !test_support::require("the dwara image (built by dwara_image)", dwara_image()) {
        return;
    }
    let net = e.network("net");
    let mount = format!("{SOCKET}:{SOCKET}");
    let dwara = e.run_image(
        "dwara",
        &["--network", &net, "-v", &mount],
        DWARA_IMAGE,
        &[
            "serve",
            "--domain",
            DOMAIN,
            "--dns-listen",
            "0.0.0.0:53",
            "--http-listen",
            "0.0.0.0:6784",
            "--http-insecure",
            "--fallback",
            "127.0.0.1:9",
            "--docker",
            "on",
        ],
    );
    assert!(
        poll(PATIENCE, || logs(&dwara).contains("name server ready")).is_some(),
        "dwara in its container did not become ready:\n{}",
        logs(&dwara)
    );
    let dwara_ip = ip_on(&dwara, &net);
    let (alpha, alpha_fqdn, alpha_ip) = e.client("alpha", &net, &dwara_ip, DOMAIN);
    let (beta, beta_fqdn, beta_ip) = e.client("beta", &net, &dwara_ip, DOMAIN);

    // Through the containers' resolver (Docker's, forwarding to --dns = dwara).
    let resolved = poll(PATIENCE, || {
        let (ok, text) = exec(&alpha, &["nslookup", &beta_fqdn]);
        ok && text.contains(&beta_ip)
    });
    assert!(
        resolved.is_some(),
        "alpha cannot resolve {beta_fqdn}: {:?}\ndwara:\n{}",
        exec(&alpha, &["nslookup", &beta_fqdn]),
        logs(&dwara)
    );
    let (ok, text) = exec(&alpha, &["ping", "-c1", "-W2", &beta_fqdn]);
    assert!(ok && text.contains(&beta_ip), "{text}");
    let (ok, text) = exec(&beta, &["ping", "-c1", "-W2", &alpha_fqdn]);
    assert!(ok && text.contains(&alpha_ip), "{text}");
    // Asked directly, dwara itself answers.
    let (ok, text) = exec(&beta, &["nslookup", &alpha_fqdn, &dwara_ip]);
    assert!(ok && text.contains(&alpha_ip), "{text}");

    // beta stops: dwara forgets it, and alpha can no longer resolve it.
    docker_ok(&["stop", "-t", "0", &beta]);
    let forgotten = poll(PATIENCE, || {
        let (_, text) = exec(&alpha, &["nslookup", &beta_fqdn, &dwara_ip]);
        text.contains("NXDOMAIN")
    });
    assert!(
        forgotten.is_some(),
        "{:?}",
        exec(&alpha, &["nslookup", &beta_fqdn, &dwara_ip])
    );
}

/// The image `cargo xtask image` builds from the repository's Dockerfile (static
/// binary, `FROM scratch`), run as the README's bridge example says: the Docker
/// socket and a data volume mounted, the image's own command (domain `weave.local`,
/// DNS on the container's `0.0.0.0:53`, registrations kept in `/data`). Two busybox
/// containers on the network resolve each other through it. `cargo xtask ci` builds
/// the image and names it in `DWARA_IMAGE`; without that variable the test says so
/// and returns (`cargo xtask image --debug --tag dwara-ci:latest` then
/// `DWARA_IMAGE=dwara-ci:latest cargo test -p dwara --test integration image` runs it
/// by hand).
#[test]
fn the_image_from_the_dockerfile_resolves_containers_as_the_readme_runs_it() {
    let image = std::env::var("DWARA_IMAGE")
        .ok()
        .filter(|i| !i.is_empty())
        .ok_or("DWARA_IMAGE is not set (cargo xtask ci sets it)");
    let Some(image) = test_support::require_ok("the repository's image", image) else {
        return;
    };
    let Some(e) = engine("image") else { return };
    docker(&["image", "inspect", &image])
        .unwrap_or_else(|err| panic!("DWARA_IMAGE={image} is not an image here: {err}"));
    let data = tempfile::tempdir().unwrap();
    let net = e.network("net");
    let socket = format!("{SOCKET}:{SOCKET}");
    let volume = format!("{}:/data", data.path().display());
    // No command: the image's own.
    let dwara = e.run_image(
        "dwara",
        &["--network", &net, "-v", &socket, "-v", &volume],
        &image,
        &[],
    );
    assert!(
        poll(PATIENCE, || logs(&dwara).contains("name server ready")).is_some(),
        "the image did not become ready:\n{}",
        logs(&dwara)
    );
    let ready = logs(&dwara);
    assert!(ready.contains("data_dir=/data"), "{ready}");
    assert!(
        ready.contains("docker=/var/run/docker.sock (API"),
        "{ready}"
    );
    assert!(
        data.path().join("registrations.redb").exists(),
        "no store in the data volume"
    );
    let dwara_ip = ip_on(&dwara, &net);
    let domain = "weave.local";
    let (alpha, _, alpha_ip) = e.client("alpha", &net, &dwara_ip, domain);
    let (_, beta_fqdn, beta_ip) = e.client("beta", &net, &dwara_ip, domain);
    let resolved = poll(PATIENCE, || {
        let (ok, text) = exec(&alpha, &["nslookup", &beta_fqdn, &dwara_ip]);
        ok && text.contains(&beta_ip)
    });
    assert!(
        resolved.is_some(),
        "alpha ({alpha_ip}) cannot resolve {beta_fqdn} through the image: {:?}\ndwara:\n{}",
        exec(&alpha, &["nslookup", &beta_fqdn, &dwara_ip]),
        logs(&dwara)
    );
    // Through the container's own resolver too (Docker's, forwarding to --dns).
    let (ok, text) = exec(&alpha, &["ping", "-c1", "-W2", &beta_fqdn]);
    assert!(ok && text.contains(&beta_ip), "{text}");
}

// ---------------------------------------------------------------------------------
// Measurements (ignored by default).

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let median = samples[samples.len() / 2];
    let worst = samples[samples.len() - 1];
    println!(
        "{label}: median {median:.1?}, worst {worst:.1?} (n = {})",
        samples.len()
    );
}

#[test]
#[ignore = "measurement: --ignored --nocapture docker::measure"]
fn measure_run_to_answer_and_stop_to_nxdomain() {
    let Some(e) = engine("mlat") else { return };
    let s = DockerServe::start(&["--docker", "on"]);
    // What one dig costs, to read the figures below with.
    let mut dig = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        assert!(s.nxdomain(&format!("nobody.{DOMAIN}")));
        dig.push(t.elapsed());
    }
    let (mut up, mut down) = (Vec::new(), Vec::new());
    // How many of the 20 were already right at the first dig.
    let (mut up_first, mut down_first) = (0, 0);
    for i in 0..20 {
        let (id, fqdn) = e.run_host(&format!("m{i}"));
        let t = Instant::now();
        let mut queries = 0;
        assert!(
            poll(PATIENCE, || {
                queries += 1;
                s.a(&fqdn).is_ok()
            })
            .is_some()
        );
        up.push(t.elapsed());
        up_first += usize::from(queries == 1);
        docker_ok(&["stop", "-t", "0", &id]);
        let t = Instant::now();
        let mut queries = 0;
        assert!(
            poll(PATIENCE, || {
                queries += 1;
                s.nxdomain(&fqdn)
            })
            .is_some()
        );
        down.push(t.elapsed());
        down_first += usize::from(queries == 1);
        docker_ok(&["rm", "-f", &id]);
    }
    summary("one dig query (the polling's resolution)", dig);
    summary("docker run returned -> dig answers", up);
    println!("  answered at the first dig: {up_first}/20");
    summary("docker stop returned -> dig NXDOMAIN", down);
    println!("  NXDOMAIN at the first dig: {down_first}/20");
}

#[test]
#[ignore = "measurement: --ignored --nocapture docker::measure"]
fn measure_reconcile_with_200_running() {
    const N: usize = 200;
    let Some(e) = engine("mrec") else { return };
    let t = Instant::now();
    let fqdns: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|w| {
                let e = &e;
                scope.spawn(move || {
                    (w..N)
                        .step_by(8)
                        .map(|i| e.run_host(&format!("r{i}")).1)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    println!("started {N} containers in {:.1?}", t.elapsed());
    let (mut ready, mut answered, mut reconcile) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let s = DockerServe::start(&["--docker", "on"]);
        ready.push(t.elapsed());
        // The updater reconciles before the name server says it is ready: every
        // name answers at the first query.
        for fqdn in &fqdns {
            assert!(s.a(fqdn).is_ok(), "{fqdn}: {:?}", s.a(fqdn));
        }
        answered.push(t.elapsed());
        let ms = s
            .log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("reconciled with the running containers"))
            .and_then(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("elapsed_ms="))
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .expect("the reconcile log line");
        reconcile.push(Duration::from_millis(ms));
        assert!(s.stop().success());
    }
    summary(
        "reconcile itself (list + 200 inspects, from its log)",
        reconcile,
    );
    summary("dwara serve spawned -> ready (all 200 registered)", ready);
    summary(
        "dwara serve spawned -> 200 names answered by dig (one by one)",
        answered,
    );
}

#[test]
fn labels_register_ports_answered_as_srv() {
    let Some(e) = engine("srv") else { return };
    let s = DockerServe::start(&["--docker", "on"]);
    let host = |n: &str| e.name(n);
    let web = e.run(
        "web",
        &[
            "--hostname",
            &host("web"),
            "--domainname",
            DOMAIN,
            "--label",
            "dwara.port=8080",
            "--label",
            "dwara.service=_http._tcp",
            "--label",
            "dwara.priority=2",
            "--label",
            "dwara.weight=9",
        ],
    );
    let dns = e.run(
        "dns",
        &[
            "--hostname",
            &host("dns"),
            "--domainname",
            DOMAIN,
            "--label",
            "dwara.port=53",
            "--expose",
            "53/udp",
        ],
    );
    let bad = e.run(
        "bad",
        &[
            "--hostname",
            &host("bad"),
            "--domainname",
            DOMAIN,
            "--label",
            "dwara.port=0",
        ],
    );
    let heavy = e.run(
        "heavy",
        &[
            "--hostname",
            &host("heavy"),
            "--domainname",
            DOMAIN,
            "--label",
            "dwara.port=80",
            "--label",
            "dwara.weight=heavy",
        ],
    );
    let srv = |name: &str| {
        let a = s.dig().query(name, "SRV").unwrap();
        let mut extra: Vec<String> = a.additional.iter().map(|r| r.data.clone()).collect();
        extra.sort();
        (a.status.clone(), a.data("SRV"), extra)
    };
    let web_srv = format!("_http._tcp.{}.{DOMAIN}", host("web"));
    // One SRV record per address, each targeting its own name, with the labels'
    // priority and weight (0 and 1 without them).
    let records = |rank: &str, port: u16, ips: &[String]| {
        let mut v: Vec<String> = ips
            .iter()
            .map(|ip| {
                let target = test_support::dig::srv_target(ip.parse().unwrap(), DOMAIN);
                format!("{rank} {port} {target}")
            })
            .collect();
        v.sort();
        v
    };
    let want = (
        "NOERROR".to_owned(),
        records("2 9", 8080, &ipv4s(&web)),
        ipv4s(&web),
    );
    let up = poll(PATIENCE, || srv(&web_srv) == want);
    assert!(
        up.is_some(),
        "{web_srv}: {:?}, want {want:?}",
        srv(&web_srv)
    );
    // No dwara.service: `_<port>._<proto>`, udp from the exposure.
    let dns_srv = format!("_53._udp.{}.{DOMAIN}", host("dns"));
    let want = (
        "NOERROR".to_owned(),
        records("0 1", 53, &ipv4s(&dns)),
        ipv4s(&dns),
    );
    assert!(
        poll(PATIENCE, || srv(&dns_srv) == want).is_some(),
        "{:?}",
        srv(&dns_srv)
    );
    // A bad label: the names are registered without a service, and it is counted.
    let bad_fqdn = format!("{}.{DOMAIN}", host("bad"));
    assert!(poll(PATIENCE, || s.a(&bad_fqdn) == Ok(ipv4s(&bad))).is_some());
    assert_eq!(srv(&format!("_0._tcp.{bad_fqdn}")).0, "NXDOMAIN");
    assert_eq!(srv(&format!("_tcp.{bad_fqdn}")).0, "NXDOMAIN");
    // So with a bad weight: the port is not registered without it.
    let heavy_fqdn = format!("{}.{DOMAIN}", host("heavy"));
    assert!(poll(PATIENCE, || s.a(&heavy_fqdn) == Ok(ipv4s(&heavy))).is_some());
    assert_eq!(srv(&format!("_80._tcp.{heavy_fqdn}")).0, "NXDOMAIN");
    assert!(s.metric("dwara_docker_bad_labels_total") >= 2.0);
    // The HTTP view shows the endpoints; a stopped container's SRV goes with it.
    let (status, body) =
        test_support::http::request(s.0.http, "GET", &format!("/name/{web_srv}"), None);
    assert_eq!(status, 200, "{body}");
    let eps: Vec<String> = serde_json::from_str(&body).unwrap();
    assert_eq!(
        eps,
        ipv4s(&web)
            .iter()
            .map(|ip| format!("{ip}:8080"))
            .collect::<Vec<_>>()
    );
    docker_ok(&["stop", "-t", "0", &web]);
    assert!(
        poll(PATIENCE, || srv(&web_srv).0 == "NXDOMAIN").is_some(),
        "{:?}",
        srv(&web_srv)
    );
    // The whole answer in the message: this failed once in a full CI run (an empty
    // answer section) and never alone.
    let other = srv(&dns_srv);
    assert_eq!(
        other.1,
        records("0 1", 53, &ipv4s(&dns)),
        "the other container's SRV stays: {other:?}"
    );
}

/// The sorted union of two address lists.
fn union(a: &[String], b: &[String]) -> Vec<String> {
    let mut v: Vec<String> = a.iter().chain(b).cloned().collect();
    v.sort();
    v
}

#[test]
fn a_container_with_a_healthcheck_is_answered_only_while_healthy() {
    let Some(e) = engine("health") else { return };
    let s = DockerServe::start(&["--docker", "on"]);
    let host = e.name("svc");
    let fqdn = format!("{host}.{DOMAIN}");
    let on_name = ["--hostname", &host, "--domainname", DOMAIN];
    // A container without a check keeps the name from failing open.
    let plain = e.run("plain", &on_name);
    let checked = e.run("checked", &[&on_name[..], &HEALTHY_WHILE_OK[..]].concat());
    let (plain_ips, checked_ips) = (ipv4s(&plain), ipv4s(&checked));
    let both = union(&plain_ips, &checked_ips);
    // `starting`: registered, not answered.
    assert!(
        poll(PATIENCE, || s
            .metric("dwara_records_health{health=\"starting\"}")
            == 1.0)
        .is_some(),
        "the checked container is not registered as starting"
    );
    assert_eq!(s.a(&fqdn), Ok(plain_ips.clone()));

    docker_ok(&["exec", &checked, "touch", "/ok"]);
    let healthy = poll(PATIENCE, || s.a(&fqdn) == Ok(both.clone()));
    assert!(
        healthy.is_some(),
        "never answered once healthy: {:?}",
        s.a(&fqdn)
    );
    docker_ok(&["exec", &checked, "rm", "/ok"]);
    let unhealthy = poll(PATIENCE, || s.a(&fqdn) == Ok(plain_ips.clone()));
    assert!(
        unhealthy.is_some(),
        "still answered when unhealthy: {:?}",
        s.a(&fqdn)
    );
    assert_eq!(s.metric("dwara_records_health{health=\"unhealthy\"}"), 1.0);
    println!(
        "healthy answered after {healthy:?}, unhealthy gone after {unhealthy:?} (from docker exec, check interval 1 s)"
    );

    // Only the unhealthy one left: the name fails open and answers it.
    docker_ok(&["rm", "-f", &plain]);
    assert!(
        poll(PATIENCE, || s.a(&fqdn) == Ok(checked_ips.clone())).is_some(),
        "an all-unhealthy name does not fail open: {:?}",
        s.a(&fqdn)
    );
    assert_eq!(s.metric("dwara_records_names_failing_open"), 1.0);
    // Healthy again: answered as such.
    docker_ok(&["exec", &checked, "touch", "/ok"]);
    assert!(
        poll(PATIENCE, || s
            .metric("dwara_records_health{health=\"healthy\"}")
            == 1.0)
        .is_some()
    );
    assert_eq!(s.metric("dwara_records_names_failing_open"), 0.0);
    assert_eq!(s.a(&fqdn), Ok(checked_ips));
}
