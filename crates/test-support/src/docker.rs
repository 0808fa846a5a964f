//! The real Docker engine for tests, driven by the `docker` CLI: [`docker`] (and
//! [`docker_async`]) run one command, bounded by [`DOCKER_DEADLINE`] (after one
//! command outlives it, every later one fails at once); [`engine_reachable`] says
//! whether there is an engine to test against; [`busybox_image`] builds the tiny
//! test image [`BUSYBOX_IMAGE`] (`FROM scratch` + Debian's static busybox) once per
//! process, installing `busybox-static` with apt-get when it is missing; a
//! [`Scope`] names a test's containers and networks and removes them when dropped,
//! failed or not;
//! [`HEALTHY_WHILE_OK`] gives a container a `HEALTHCHECK` a test can flip.
//!
//! A [`Scope::with_pid_label`] also labels its containers with the pid of the test
//! process ([`PID_LABEL`]) and, once per process, removes the labelled containers
//! of test processes that are gone (killed before their scopes were dropped).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// The tag of the test image that [`busybox_image`] builds.
pub const BUSYBOX_IMAGE: &str = "dwara-test-busybox:latest";

/// The label carrying the pid of the test process that made a container.
pub const PID_LABEL: &str = "dwara.test.binary-pid";

/// `docker run` flags for a `HEALTHCHECK` that passes while `/ok` exists in the
/// container: checked every second, unhealthy after one failure.
pub const HEALTHY_WHILE_OK: [&str; 8] = [
    "--health-cmd",
    "test -e /ok",
    "--health-interval",
    "1s",
    "--health-timeout",
    "1s",
    "--health-retries",
    "1",
];

/// How long one `docker` command may take before [`docker`] gives up on it: far
/// beyond any command of the tests on a loaded machine (the slowest, a `docker
/// run` while others start, takes a few seconds), and short enough that a daemon
/// that stopped answering fails the tests in minutes instead of hanging them.
pub const DOCKER_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `docker ARGS`: trimmed stdout, or stderr (with the command) as the error.
/// A command still running after [`DOCKER_DEADLINE`] is killed and is an error,
/// and so is every later command of the process, at once. Commands that create or
/// start a container run one at a time.
pub fn docker<S: AsRef<str>>(args: &[S]) -> Result<String, String> {
    static DOCKER: Engine = Engine::new("docker", DOCKER_DEADLINE);
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    DOCKER.run(&args)
}

/// One engine's command-line client as the tests drive it.
///
/// Commands that create or start a container run one at a time: Docker 20.10 can
/// deadlock (dockerd and containerd waiting on each other, `docker inspect` of the
/// new containers never answered) when many are created at once
/// (moby/moby#42682); one at a time costs the tests a few seconds.
///
/// The first command that outlives the deadline is remembered with what the
/// machine showed then, and from then on nothing more is run: a daemon that left
/// one command unanswered for minutes does not answer the next (its container
/// locks are held), and waiting out the deadline again for every later command
/// and every [`Scope`]'s clean-up would turn one failure into an hour.
struct Engine {
    program: &'static str,
    deadline: Duration,
    starting: Mutex<()>,
    stuck: OnceLock<String>,
}

impl Engine {
    const fn new(program: &'static str, deadline: Duration) -> Self {
        Self {
            program,
            deadline,
            starting: Mutex::new(()),
            stuck: OnceLock::new(),
        }
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        let command = || format!("{} {}", self.program, args.join(" "));
        if let Some(first) = self.stuck.get() {
            return Err(format!(
                "{}: not run, the daemon stopped answering earlier: {first}",
                command()
            ));
        }
        let _one_at_a_time = matches!(
            args.first(),
            Some(&("run" | "create" | "start" | "restart"))
        )
        .then(|| self.starting.lock().unwrap_or_else(PoisonError::into_inner));
        let out = match run_bounded(self.program, args, self.deadline) {
            Ok(out) => out,
            Err(Bounded::Failed(e)) => return Err(e),
            Err(Bounded::Deadline(e)) => {
                let first = self.stuck.get_or_init(|| {
                    let seen = daemon_snapshot();
                    eprintln!("{e}\nwhat the machine showed then:\n{}", seen.join("\n"));
                    format!("{e}; then: {}", seen.join(" | "))
                });
                return Err(first.clone());
            }
        };
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(format!(
                "{}: {}",
                command(),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

/// Why [`run_bounded`] has no output to hand back.
#[derive(Debug)]
enum Bounded {
    /// The program could not be run or waited for.
    Failed(String),
    /// It was still running at the deadline (and was killed).
    Deadline(String),
}

/// Runs `program ARGS` to its end and hands back its output, or kills it once
/// `deadline` has passed and says so.
fn run_bounded(program: &str, args: &[&str], deadline: Duration) -> Result<Output, Bounded> {
    let command = || format!("{program} {}", args.join(" "));
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Bounded::Failed(format!("cannot run {program}: {e}")))?;
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(deadline) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(Bounded::Failed(format!(
            "{}: cannot wait for it: {e}",
            command()
        ))),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            Err(Bounded::Deadline(format!(
                "{}: no answer within {:?} (is the daemon stuck?)",
                command(),
                deadline
            )))
        }
    }
}

/// What the machine shows of a daemon that stopped answering: the engine's
/// processes (state, seconds running, what they wait in) and the last lines of
/// the daemon's log where it writes one to a file; a line each.
fn daemon_snapshot() -> Vec<String> {
    let mut seen = Vec::new();
    if let Ok(Ok(out)) = run_bounded(
        "ps",
        &["-eo", "pid,stat,etimes,wchan:24,args"],
        Duration::from_secs(10),
    )
    .map(|out| String::from_utf8(out.stdout))
    {
        seen.extend(
            out.lines()
                .filter(|l| {
                    ["dockerd", "containerd", "runc", "fuse-overlayfs", "docker "]
                        .iter()
                        .any(|p| l.contains(p))
                })
                .take(16)
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")),
        );
    }
    if let Ok(log) = std::fs::read_to_string("/var/log/dockerd.log") {
        let lines: Vec<&str> = log.lines().collect();
        seen.extend(
            lines[lines.len().saturating_sub(6)..]
                .iter()
                .map(|l| format!("dockerd.log: {l}")),
        );
    }
    if seen.is_empty() {
        seen.push("nothing (no engine process or log found)".to_owned());
    }
    seen
}

/// [`docker`] from async code without blocking the runtime.
pub async fn docker_async<S: AsRef<str>>(args: &[S]) -> Result<String, String> {
    let args: Vec<String> = args.iter().map(|s| s.as_ref().to_owned()).collect();
    tokio::task::spawn_blocking(move || docker(&args))
        .await
        .map_err(|e| e.to_string())?
}

/// `Ok` when a Docker engine answers; the error says why not.
pub fn engine_reachable() -> Result<(), String> {
    docker(&["version", "--format", "{{.Server.APIVersion}}"]).map(|_| ())
}

/// Builds [`BUSYBOX_IMAGE`] once per process; `Err` says why it cannot be.
///
/// `/bin/busybox` must be Debian's static busybox; when it is missing,
/// `busybox-static` is installed with apt-get (the tests run as root).
pub fn busybox_image() -> Result<(), String> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT.get_or_init(build_busybox_image).clone()
}

fn build_busybox_image() -> Result<(), String> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        let status = Command::new("apt-get")
            .args(["install", "-y", "-q", "busybox-static"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if !status.success() || !busybox.exists() {
            return Err("busybox-static is missing and apt-get install failed \
                 (run as root, or install busybox-static)"
                .to_owned());
        }
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::copy(busybox, dir.path().join("busybox")).map_err(|e| e.to_string())?;
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\n\
         RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nCMD [\"/bin/sh\"]\n",
    )
    .map_err(|e| e.to_string())?;
    let path = dir.path().to_string_lossy().into_owned();
    docker(&["build", "-q", "-t", BUSYBOX_IMAGE, &path]).map(|_| ())
}

/// Removes, once per process, the containers labelled [`PID_LABEL`] whose test
/// process is gone; a concurrent run's containers are left alone.
fn remove_orphans() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let format = format!("{{{{.ID}}}} {{{{.Label \"{PID_LABEL}\"}}}}");
        let Ok(list) = docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label={PID_LABEL}"),
            "--format",
            &format,
        ]) else {
            return;
        };
        for line in list.lines() {
            let mut parts = line.split_whitespace();
            let (Some(id), Some(pid)) = (parts.next(), parts.next()) else {
                continue;
            };
            if !Path::new("/proc").join(pid).exists() {
                let _ = docker(&["rm", "-f", id]);
            }
        }
    });
}

/// One test's containers (`PREFIX-name`) and networks, removed on drop.
#[derive(Debug)]
pub struct Scope {
    prefix: String,
    label: Option<String>,
    networks: Mutex<Vec<String>>,
}

impl Scope {
    /// A scope whose names start with `prefix` (make it unique to the test and the
    /// process, e.g. with the pid).
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            label: None,
            networks: Mutex::new(Vec::new()),
        }
    }

    /// [`Scope::new`] whose containers carry [`PID_LABEL`]` = this process's pid`;
    /// first removes the orphans of dead test processes (once per process).
    pub fn with_pid_label(prefix: impl Into<String>) -> Self {
        remove_orphans();
        let mut scope = Self::new(prefix);
        scope.label = Some(format!("{PID_LABEL}={}", std::process::id()));
        scope
    }

    /// The prefix of this scope's names.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// This scope's name for `name`: `PREFIX-name`.
    pub fn name(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// The arguments of `docker run -d --name PREFIX-name [--label …] ARGS… IMAGE CMD…`.
    fn run_args(&self, name: &str, args: &[&str], image: &str, cmd: &[&str]) -> Vec<String> {
        let mut all: Vec<String> =
            vec!["run".into(), "-d".into(), "--name".into(), self.name(name)];
        if let Some(label) = &self.label {
            all.extend(["--label".into(), label.clone()]);
        }
        all.extend(args.iter().map(|s| (*s).to_owned()));
        all.push(image.to_owned());
        all.extend(cmd.iter().map(|s| (*s).to_owned()));
        all
    }

    /// `docker run -d --name PREFIX-name ARGS… IMAGE CMD…`: the full container id.
    pub fn run(
        &self,
        name: &str,
        args: &[&str],
        image: &str,
        cmd: &[&str],
    ) -> Result<String, String> {
        docker(&self.run_args(name, args, image, cmd))
    }

    /// [`Scope::run`] from async code without blocking the runtime.
    pub async fn run_async(
        &self,
        name: &str,
        args: &[&str],
        image: &str,
        cmd: &[&str],
    ) -> Result<String, String> {
        docker_async(&self.run_args(name, args, image, cmd)).await
    }

    /// Creates the user-defined network `PREFIX-name`, removed on drop; its name.
    pub fn network(&self, name: &str) -> Result<String, String> {
        let full = self.name(name);
        docker(&["network", "create", &full])?;
        self.adopt_network(&full);
        Ok(full)
    }

    /// [`Scope::network`] from async code without blocking the runtime.
    pub async fn network_async(&self, name: &str) -> Result<String, String> {
        let full = self.name(name);
        docker_async(&["network", "create", &full]).await?;
        self.adopt_network(&full);
        Ok(full)
    }

    fn adopt_network(&self, full: &str) {
        self.networks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(full.to_owned());
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let filter = format!("name={}-", self.prefix);
        if let Ok(ids) = docker(&["ps", "-aq", "--filter", &filter]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f"];
                args.extend(ids);
                let _ = docker(&args);
            }
        }
        let networks = std::mem::take(
            self.networks
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for net in networks {
            let _ = docker(&["network", "rm", &net]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_command_that_ends_hands_back_its_output() {
        let out = run_bounded(
            "sh",
            &["-c", "echo out; echo err >&2; exit 3"],
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn after_one_command_outlives_the_deadline_nothing_more_is_run() {
        let engine = Engine::new("sleep", Duration::from_millis(200));
        let arg = format!("31.{}", std::process::id());
        let first = engine.run(&[&arg]).unwrap_err();
        assert!(
            first.contains(&format!("sleep {arg}: no answer within 200ms")),
            "{first}"
        );
        assert!(first.contains("; then: "), "{first}");
        // A command that would end at once is not even started, and says why.
        let started = Instant::now();
        let next = engine.run(&["0"]).unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(150), "{next}");
        assert!(
            next.starts_with("sleep 0: not run, the daemon stopped answering earlier: "),
            "{next}"
        );
        assert!(next.ends_with(&first), "{next}");
    }

    #[test]
    fn a_command_that_fails_says_which_and_why() {
        let engine = Engine::new("sh", Duration::from_secs(30));
        let err = engine
            .run(&["-c", "echo no such thing >&2; exit 1"])
            .unwrap_err();
        assert_eq!(err, "sh -c echo no such thing >&2; exit 1: no such thing");
        assert_eq!(engine.run(&["-c", "echo ' ok '"]), Ok("ok".to_owned()));
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_and_is_an_error() {
        // A length no other process here sleeps for, to find this one by.
        let arg = format!("30.{}", std::process::id());
        let Err(Bounded::Deadline(err)) = run_bounded("sleep", &[&arg], Duration::from_millis(200))
        else {
            panic!("no deadline error");
        };
        assert!(
            err.contains(&format!("sleep {arg}: no answer within 200ms")),
            "{err}"
        );
        let running = || {
            std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .any(|c| c == format!("sleep\0{arg}\0").as_bytes())
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!running(), "the command was left running");
    }
}
