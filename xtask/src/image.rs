//! `cargo xtask image`: the container image, `FROM scratch` with one static binary.
//!
//! 1. `cargo build --release --target x86_64-unknown-linux-gnu -p dwara` with
//!    `RUSTFLAGS=-C target-feature=+crt-static` (glibc, statically linked);
//! 2. the binary, checked to need no dynamic loader, is the only file of a build
//!    context in `TARGET/image/`, which `docker build -f Dockerfile` (the repository's)
//!    turns into the image `dwara:latest` (`--tag` to change it);
//! 3. `docker save` writes the image as a tar for `docker load` on hosts without a
//!    registry (`TARGET/image/dwara-image.tar`).
//!
//! `--debug` builds the binary without optimisation (a faster build; `cargo xtask
//! ci` tests the image that way), `--no-save` skips the tar. A `docker` command
//! that has not ended after 5 minutes is killed and fails the task.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// The target triple of the static build.
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// What `cargo xtask image` was asked for.
pub(crate) struct ImageArgs {
    tag: String,
    profile: Profile,
    save: Save,
}

#[derive(Clone, Copy, PartialEq)]
enum Profile {
    Release,
    Debug,
}

#[derive(Clone, Copy, PartialEq)]
enum Save {
    Tar,
    No,
}

impl ImageArgs {
    pub(crate) fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut parsed = Self {
            tag: "dwara:latest".to_owned(),
            profile: Profile::Release,
            save: Save::Tar,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--tag" => {
                    parsed.tag = it.next().context("--tag needs a value")?.clone();
                }
                "--debug" => parsed.profile = Profile::Debug,
                "--no-save" => parsed.save = Save::No,
                other => bail!(
                    "unknown argument {other:?}; usage: cargo xtask image [--tag T] [--debug] [--no-save]"
                ),
            }
        }
        Ok(parsed)
    }

    /// An image for the tests: tagged `tag`, unoptimised, no tar.
    pub(crate) fn for_tests(tag: &str) -> Self {
        Self {
            tag: tag.to_owned(),
            profile: Profile::Debug,
            save: Save::No,
        }
    }
}

/// Builds the static binary and the image; prints where the tar is.
pub(crate) fn run(args: &ImageArgs) -> anyhow::Result<()> {
    let root = workspace_root()?;
    let target = target_dir(&root);
    let mut build = vec!["build", "--quiet", "--target", TRIPLE, "-p", "dwara"];
    if args.profile == Profile::Release {
        build.push("--release");
    }
    crate::cargo_with(&build, &[("RUSTFLAGS", "-C target-feature=+crt-static")])?;
    let dir = match args.profile {
        Profile::Release => "release",
        Profile::Debug => "debug",
    };
    let binary = target.join(TRIPLE).join(dir).join("dwara");
    ensure_static(&binary)?;

    let context = target.join("image");
    std::fs::create_dir_all(&context)
        .with_context(|| format!("cannot create {}", context.display()))?;
    let copy = context.join("dwara");
    std::fs::copy(&binary, &copy)
        .with_context(|| format!("cannot copy {} to {}", binary.display(), copy.display()))?;
    let dockerfile = root.join("Dockerfile");
    let revision = git_revision(&root);
    docker(&[
        "build",
        "--quiet",
        "--label",
        &format!("org.opencontainers.image.revision={revision}"),
        "-t",
        &args.tag,
        "-f",
        &dockerfile.to_string_lossy(),
        &context.to_string_lossy(),
    ])?;
    println!("image {} built from {}", args.tag, binary.display());
    if args.save == Save::Tar {
        let tar = context.join("dwara-image.tar");
        docker(&["save", "-o", &tar.to_string_lossy(), &args.tag])?;
        let bytes = std::fs::metadata(&tar).map(|m| m.len()).unwrap_or(0);
        println!(
            "saved {} ({:.1} MiB): `docker load -i {}` on another host",
            tar.display(),
            bytes as f64 / (1024.0 * 1024.0),
            tar.display()
        );
    }
    Ok(())
}

/// Fails unless `binary` runs without a dynamic loader (a `FROM scratch` image has
/// none).
fn ensure_static(binary: &Path) -> anyhow::Result<()> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run ldd")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // ldd says "not a dynamic executable" (or "statically linked") and fails.
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        Ok(())
    } else {
        bail!(
            "{} is not static, a FROM scratch image cannot run it:\n{text}",
            binary.display()
        )
    }
}

/// How long one `docker` command here may take: the build copies one binary into
/// an empty image (seconds), the save writes a few MiB. Past this the daemon is
/// taken to be stuck, and the task fails instead of hanging.
const DOCKER_DEADLINE: Duration = Duration::from_secs(300);

fn docker(args: &[&str]) -> anyhow::Result<()> {
    let mut child = Command::new("docker")
        .args(args)
        .spawn()
        .context("cannot run docker (is the Docker CLI installed?)")?;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().context("cannot wait for docker")? {
            break status;
        }
        if started.elapsed() > DOCKER_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "`docker {}` did not end within {DOCKER_DEADLINE:?} (is the daemon stuck?)",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        bail!("`docker {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The workspace root: xtask's manifest dir's parent.
fn workspace_root() -> anyhow::Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

/// `CARGO_TARGET_DIR`, else `ROOT/target`.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// The commit the image is built from, `unknown` outside a git checkout.
fn git_revision(root: &Path) -> String {
    Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}
