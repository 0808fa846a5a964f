//! The real Docker engine for tests, driven by the `docker` CLI: [`docker`] (and
//! [`docker_async`]) run one command; [`engine_reachable`] says whether there is an
//! engine to test against; [`busybox_image`] builds the tiny test image
//! [`BUSYBOX_IMAGE`] (`FROM scratch` + Debian's static busybox) once per process,
//! installing `busybox-static` with apt-get when it is missing; a [`Scope`] names a
//! test's containers and networks and removes them when dropped, failed or not;
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
/// beyond any command of the tests on a loaded machine, and far short of CI's
/// limit, so a daemon that stopped answering fails the tests instead of hanging
/// them.
pub const DOCKER_DEADLINE: Duration = Duration::from_secs(300);

/// Runs `docker ARGS`: trimmed stdout, or stderr (with the command) as the error.
/// A command still running after [`DOCKER_DEADLINE`] is killed and is an error.
pub fn docker<S: AsRef<str>>(args: &[S]) -> Result<String, String> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let out = run_bounded("docker", &args, DOCKER_DEADLINE)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `program ARGS` to its end and hands back its output, or kills it once
/// `deadline` has passed and says so.
fn run_bounded(program: &str, args: &[&str], deadline: Duration) -> Result<Output, String> {
    let command = || format!("{program} {}", args.join(" "));
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(deadline) {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(format!("{}: cannot wait for it: {e}", command())),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            Err(format!(
                "{}: no answer within {:?} (is the daemon stuck?)",
                command(),
                deadline
            ))
        }
    }
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
    fn a_command_past_its_deadline_is_killed_and_is_an_error() {
        // A length no other process here sleeps for, to find this one by.
        let arg = format!("30.{}", std::process::id());
        let err = run_bounded("sleep", &[&arg], Duration::from_millis(200)).unwrap_err();
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
