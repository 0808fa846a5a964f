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
//! ci` tests the image that way), `--no-save` skips the tar. `--pgo` builds it
//! with profile-guided optimisation as `cargo xtask pgo` does (instrumented,
//! trained on the benchmarks' loads, built again with the profile), on the static
//! build itself, in `TARGET/pgo/static`: two more release builds and about three
//! minutes of loads. A `docker` command
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

#[derive(Clone, Copy, PartialEq, Debug)]
enum Profile {
    Release,
    Debug,
    /// Release, with the profile of `cargo xtask pgo`.
    Pgo,
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
                "--debug" | "--pgo" => {
                    let wanted = if arg == "--pgo" {
                        Profile::Pgo
                    } else {
                        Profile::Debug
                    };
                    if parsed.profile != Profile::Release && parsed.profile != wanted {
                        bail!("--debug and --pgo exclude each other");
                    }
                    parsed.profile = wanted;
                }
                "--no-save" => parsed.save = Save::No,
                other => bail!(
                    "unknown argument {other:?}; usage: cargo xtask image [--tag T] [--debug | --pgo] [--no-save]"
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
    let binary = build(args.profile, &target)?;
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

/// Builds the static binary of `profile` and says where it is.
fn build(profile: Profile, target: &Path) -> anyhow::Result<PathBuf> {
    if profile == Profile::Pgo {
        // Trained on this very build: cargo names the symbols of a `--target`
        // build apart from the host build's, so the host build's profile would
        // match none of them.
        return crate::pgo::make(crate::pgo::Build::Static);
    }
    let mut cmd = vec!["build", "--quiet", "--target", TRIPLE, "-p", "dwara"];
    let dir = match profile {
        Profile::Debug => "debug",
        Profile::Release | Profile::Pgo => {
            cmd.push("--release");
            "release"
        }
    };
    crate::cargo_with(&cmd, &[("RUSTFLAGS", "-C target-feature=+crt-static")])?;
    Ok(target.join(TRIPLE).join(dir).join("dwara"))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<ImageArgs> {
        ImageArgs::parse(&args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn the_build_is_release_unless_asked_for_debug_or_pgo() {
        assert_eq!(parse(&[]).unwrap().profile, Profile::Release);
        assert_eq!(parse(&["--debug"]).unwrap().profile, Profile::Debug);
        let pgo = parse(&["--pgo", "--tag", "dwara:pgo"]).unwrap();
        assert_eq!((pgo.profile, pgo.tag.as_str()), (Profile::Pgo, "dwara:pgo"));
        assert_eq!(parse(&["--pgo", "--pgo"]).unwrap().profile, Profile::Pgo);
        let Err(e) = parse(&["--pgo", "--debug"]) else {
            panic!("--pgo with --debug accepted");
        };
        assert!(e.to_string().contains("exclude each other"), "{e}");
        assert!(parse(&["--fast"]).is_err());
    }
}
