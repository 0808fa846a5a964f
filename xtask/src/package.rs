//! `cargo xtask package` (the last workspace step of `cargo xtask ci`): `cargo package`
//! of every publishable crate, each built from its package alone against the others
//! packaged beside it, after removing what an earlier run left for cargo to reuse.
//!
//! Cargo takes a registry package to be immutable, and `cargo package --workspace`
//! serves our packages to its verify builds from a temporary local registry
//! (`<build dir>/package/tmp-registry`). So an earlier run leaves two things that a
//! later one reuses by name and version without looking at their files:
//! - the copy it unpacked of each of our packages,
//!   `$CARGO_HOME/registry/src/-<hash>/<name>-<version>/` (one `-<hash>` directory per
//!   temporary registry, so per build directory);
//! - the units the verify builds compiled from those copies, in the shared build
//!   directory (`debug/deps/*<hash>*`, `debug/.fingerprint/<name>-<hash>/`,
//!   `debug/build/<name>-<hash>/`): cargo treats them as the crates.io packages of that
//!   name and version, fresh whatever their sources say.
//!
//! Left there, a second run verifies each package against the others as the first run
//! packaged them (a function added since is "not found"). [`forget_earlier_packages`]
//! removes both, before and after `cargo package`, and nothing else: a unit is ours when
//! its dep-info (the `.d` file rustc writes beside it) names sources inside an unpacked
//! copy of one of our packages, and a copy is removed only from a `-<hash>` directory
//! that such a unit, compiled in this build directory, was built from. The copies that
//! another checkout's `cargo package` uses (its own `-<hash>`, perhaps in a run at the
//! same time) are left alone, as are the crates.io dependencies and our crates built
//! from the workspace. Removing after the run too keeps copies from outliving the units
//! that name them (a `cargo clean` between two runs); only a run interrupted and then
//! followed by a `cargo clean` leaves copies that cargo would reuse (remove them by
//! hand then). Only the `debug` profile directory is
//! looked at, where `cargo package` builds without `--target`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Removes what an earlier run left (see the module docs), runs `cargo package` of
/// every publishable crate, then removes what this run left, whether it passed or not.
pub(crate) fn run() -> anyhow::Result<()> {
    let workspace = Workspace::read()?;
    forget_earlier_packages(&workspace, "an earlier run")?;
    let mut args = vec!["package", "--workspace", "--allow-dirty", "--quiet"];
    for name in crate::UNPUBLISHED {
        args.extend(["--exclude", name]);
    }
    // The packages are built as workspaces of their own, which have none of the root
    // manifest's profile settings: with every crate's debug info off, the dependencies
    // they share with the workspace build (`cargo xtask ci`'s tests) are reused instead
    // of rebuilt.
    let packaged = crate::cargo_with(&args, &[("CARGO_PROFILE_DEV_DEBUG", "false")]);
    // Also after the run: a `cargo clean` before the next one would take the units that
    // tell which copies are ours, and leave the copies for cargo to reuse.
    let forgotten = forget_earlier_packages(&workspace, "this run");
    packaged?;
    forgotten
}

/// What [`forget_earlier_packages`] needs to know of the workspace.
struct Workspace {
    /// Where cargo builds (`cargo metadata`'s `build_directory`, the target directory
    /// unless configured apart).
    build_dir: PathBuf,
    /// `$CARGO_HOME/registry/src`, where cargo unpacks registry packages.
    registry_src: PathBuf,
    /// `(name, version)` of every workspace member.
    packages: Vec<(String, String)>,
}

impl Workspace {
    fn read() -> anyhow::Result<Self> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = Command::new(&cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .output()
            .with_context(|| format!("cannot run {cargo} metadata"))?;
        if !out.status.success() {
            bail!(
                "`cargo metadata` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&out.stdout).context("`cargo metadata` printed no JSON")?;
        let build_dir = meta["build_directory"]
            .as_str()
            .or_else(|| meta["target_directory"].as_str())
            .context("`cargo metadata` names no build or target directory")?;
        let packages = meta["packages"]
            .as_array()
            .context("`cargo metadata` lists no packages")?
            .iter()
            .filter_map(|p| {
                Some((
                    p["name"].as_str()?.to_owned(),
                    p["version"].as_str()?.to_owned(),
                ))
            })
            .collect();
        Ok(Self {
            build_dir: PathBuf::from(build_dir),
            registry_src: cargo_home()?.join("registry/src"),
            packages,
        })
    }
}

/// `$CARGO_HOME`, or its default `~/.cargo`.
fn cargo_home() -> anyhow::Result<PathBuf> {
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        return Ok(PathBuf::from(home));
    }
    let home = std::env::var_os("HOME").context("neither CARGO_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cargo"))
}

/// A unit in the build directory compiled from an unpacked copy of one of our packages.
#[derive(Debug, PartialEq)]
struct RegistryUnit {
    /// The package's name.
    name: String,
    /// The copy it was compiled from: `<registry src>/-<hash>/<name>-<version>`.
    copy: PathBuf,
    /// Whether rustc wrote its outputs into this build directory: only then is the
    /// copy's `-<hash>` directory the temporary registry of this build directory (a
    /// build directory copied from elsewhere holds units of another one's).
    built_here: bool,
}

/// Removes the units compiled from unpacked copies of our packages, then every copy of
/// our packages in the `-<hash>` directories those units built here came from; says
/// what it removed, one line per copy, as left by `by` ("an earlier run", "this run").
fn forget_earlier_packages(ws: &Workspace, by: &str) -> anyhow::Result<()> {
    let profile = ws.build_dir.join("debug");
    // Per copy: the hashes of the units removed, and what was removed of them.
    let mut units: BTreeMap<PathBuf, (Vec<String>, Vec<String>)> = BTreeMap::new();
    let mut registries = BTreeSet::new();
    for dep_info in dep_info_files(&profile)? {
        let text = match std::fs::read_to_string(&dep_info) {
            Ok(text) => text,
            // Removed with a unit's build script directory above.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", dep_info.display()));
            }
        };
        let Some(unit) = registry_unit(ws, &text) else {
            continue;
        };
        let (hash, removed) = remove_unit(&profile, &dep_info, &unit.name)?;
        let entry = units.entry(unit.copy.clone()).or_default();
        entry.0.push(hash);
        entry.1.extend(removed);
        if unit.built_here
            && let Some(registry) = unit.copy.parent()
        {
            registries.insert(registry.to_path_buf());
        }
    }
    let mut copies = BTreeSet::new();
    for registry in registries {
        for (name, version) in &ws.packages {
            let copy = registry.join(format!("{name}-{version}"));
            if copy.exists() {
                std::fs::remove_dir_all(&copy)
                    .with_context(|| format!("cannot remove {}", copy.display()))?;
                copies.insert(copy);
            }
        }
    }
    if units.is_empty() && copies.is_empty() {
        println!("xtask package: nothing left by {by} to remove");
    }
    for copy in units.keys().chain(&copies).collect::<BTreeSet<_>>() {
        let what = if copies.contains(copy) {
            "removed the copy"
        } else {
            "kept the copy"
        };
        let mut line = format!(
            "xtask package: {what} {} that {by} unpacked",
            copy.display()
        );
        if let Some((hashes, removed)) = units.get(copy) {
            let files = removed.iter().filter(|r| r.starts_with("deps/")).count();
            line.push_str(&format!(
                " and removed the units compiled from it in {}: {} ({files} files in deps/, {} directories in .fingerprint/ and build/)",
                profile.display(),
                hashes.join(" "),
                removed.len() - files,
            ));
        }
        println!("{line}");
    }
    Ok(())
}

/// The dep-info files of the units in a profile directory: `deps/*.d` (libraries and
/// tests) and `build/*/*.d` (build scripts).
fn dep_info_files(profile: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = vec![profile.join("deps")];
    if let Ok(build) = std::fs::read_dir(profile.join("build")) {
        dirs.extend(build.flatten().map(|e| e.path()));
    }
    let mut files = Vec::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // A build directory nothing was built in yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
        };
        for entry in entries {
            let path = entry
                .with_context(|| format!("cannot list {}", dir.display()))?
                .path();
            if path.extension().is_some_and(|e| e == "d") {
                files.push(path);
            }
        }
    }
    Ok(files)
}

/// The unit whose dep-info is `text`, if its sources lie in an unpacked copy of one of
/// our packages: `<registry src>/-<hash>/<name>-<version>/…` (a local registry's
/// directory has no host name, so it starts with `-`).
fn registry_unit(ws: &Workspace, text: &str) -> Option<RegistryUnit> {
    let (outputs, sources) = parse_dep_info(text);
    sources.iter().find_map(|source| {
        let mut parts = source.strip_prefix(&ws.registry_src).ok()?.components();
        let registry = parts.next()?.as_os_str().to_str()?;
        let copy = parts.next()?.as_os_str().to_str()?;
        if !registry.starts_with('-') {
            return None;
        }
        let (name, _) = ws
            .packages
            .iter()
            .find(|(name, version)| copy == format!("{name}-{version}"))?;
        Some(RegistryUnit {
            name: name.clone(),
            copy: ws.registry_src.join(registry).join(copy),
            built_here: !outputs.is_empty() && outputs.iter().all(|o| o.starts_with(&ws.build_dir)),
        })
    })
}

/// `(outputs, sources)` of a dep-info file: Makefile rules `OUTPUT: SOURCE...`, one per
/// output, then an empty rule per source; a space in a path is written `\ `, and
/// comment lines (`# env-dep:…`) say which environment variables were read.
fn parse_dep_info(text: &str) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut outputs = Vec::new();
    let mut sources = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => word.extend(chars.next()),
                c if c.is_whitespace() => {
                    words.extend((!word.is_empty()).then(|| std::mem::take(&mut word)))
                }
                c => word.push(c),
            }
        }
        words.extend((!word.is_empty()).then_some(word));
        let Some((first, rest)) = words.split_first() else {
            continue;
        };
        let Some(output) = first.strip_suffix(':') else {
            continue;
        };
        // The rules that name no source are the sources' own.
        if !rest.is_empty() {
            outputs.push(PathBuf::from(output));
        }
        sources.extend(rest.iter().map(PathBuf::from));
    }
    (outputs, sources)
}

/// Removes the unit whose dep-info is `dep_info` (`<profile>/deps/<crate>-<hash>.d`, or
/// `<profile>/build/<name>-<hash>/<crate>-<hash>.d` for a build script): its files in
/// `deps/`, its fingerprint `.fingerprint/<name>-<hash>/` and its build script
/// directory `build/<name>-<hash>/`. Returns the unit's hash and what it removed,
/// relative to `profile`.
fn remove_unit(
    profile: &Path,
    dep_info: &Path,
    name: &str,
) -> anyhow::Result<(String, Vec<String>)> {
    let stem = dep_info
        .file_stem()
        .and_then(|s| s.to_str())
        .with_context(|| format!("{} has no file name", dep_info.display()))?;
    let (_, hash) = stem
        .rsplit_once('-')
        .with_context(|| format!("{} names no unit hash", dep_info.display()))?;
    let mut removed = Vec::new();
    let deps = profile.join("deps");
    let prefixes = [format!("{stem}."), format!("lib{stem}.")];
    if let Ok(entries) = std::fs::read_dir(&deps) {
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if prefixes.iter().any(|p| file.starts_with(p.as_str())) {
                let path = entry.path();
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot remove {}", path.display()))?;
                removed.push(format!("deps/{file}"));
            }
        }
    }
    for dir in [".fingerprint", "build"] {
        let relative = format!("{dir}/{name}-{hash}");
        let path = profile.join(&relative);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
            removed.push(format!("{relative}/"));
        }
    }
    Ok((hash.to_owned(), removed))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::{RegistryUnit, Workspace, forget_earlier_packages, parse_dep_info, registry_unit};

    /// A workspace of two packages built in `root/target`, with `root/cargo/registry/src`.
    fn workspace(root: &Path) -> Workspace {
        Workspace {
            build_dir: root.join("target"),
            registry_src: root.join("cargo/registry/src"),
            packages: vec![
                ("dwara-records".to_owned(), "0.1.0".to_owned()),
                ("dwara-nameserver".to_owned(), "0.1.0".to_owned()),
            ],
        }
    }

    /// A dep-info file as rustc writes it for the library `krate` built from `sources`
    /// into `deps`.
    fn dep_info(deps: &Path, krate: &str, hash: &str, sources: &[&Path]) -> String {
        let sources: Vec<String> = sources
            .iter()
            .map(|s| s.display().to_string().replace(' ', "\\ "))
            .collect();
        let mut text = String::new();
        for output in [
            format!("{krate}-{hash}.d"),
            format!("lib{krate}-{hash}.rlib"),
            format!("lib{krate}-{hash}.rmeta"),
        ] {
            let output = deps.join(output).display().to_string().replace(' ', "\\ ");
            text.push_str(&format!("{output}: {}\n\n", sources.join(" ")));
        }
        for source in &sources {
            text.push_str(&format!("{source}:\n"));
        }
        text.push_str("\n# env-dep:CARGO_PKG_NAME=dwara-records\n");
        text
    }

    #[test]
    fn dep_info_gives_outputs_and_sources_with_escaped_spaces() {
        let text = "/t\\ t/deps/libx-1.rlib: /src\\ dir/lib.rs /src\\ dir/a.rs\n\n\
                    /src\\ dir/lib.rs:\n/src\\ dir/a.rs:\n\n# env-dep:A=b c\n";
        let (outputs, sources) = parse_dep_info(text);
        assert_eq!(outputs, vec![PathBuf::from("/t t/deps/libx-1.rlib")]);
        assert_eq!(
            sources,
            vec![
                PathBuf::from("/src dir/lib.rs"),
                PathBuf::from("/src dir/a.rs")
            ]
        );
    }

    #[test]
    fn only_units_compiled_from_an_unpacked_copy_of_ours_are_registry_units() {
        let root = Path::new("/home/dev");
        let ws = workspace(root);
        let deps = ws.build_dir.join("debug/deps");
        let copy = ws.registry_src.join("-0a1b2c/dwara-records-0.1.0");
        let text = dep_info(&deps, "dwara_records", "9f", &[&copy.join("src/lib.rs")]);
        assert_eq!(
            registry_unit(&ws, &text),
            Some(RegistryUnit {
                name: "dwara-records".to_owned(),
                copy: copy.clone(),
                built_here: true,
            })
        );
        // The same unit in a build directory copied from another one.
        let elsewhere = dep_info(
            Path::new("/other/target/debug/deps"),
            "dwara_records",
            "9f",
            &[&copy.join("src/lib.rs")],
        );
        assert!(registry_unit(&ws, &elsewhere).is_some_and(|u| !u.built_here));
        // Built from the workspace, from crates.io, or from another version.
        for source in [
            PathBuf::from("crates/records/src/lib.rs"),
            PathBuf::from("/home/dev/crates/records/src/lib.rs"),
            ws.registry_src
                .join("index.crates.io-1949cf8c6b5b557f/dwara-records-0.1.0/src/lib.rs"),
            ws.registry_src
                .join("-0a1b2c/dwara-records-0.2.0/src/lib.rs"),
            ws.registry_src.join("-0a1b2c/serde-1.0.228/src/lib.rs"),
        ] {
            let text = dep_info(&deps, "dwara_records", "9f", &[source.as_path()]);
            assert_eq!(registry_unit(&ws, &text), None, "{}", source.display());
        }
    }

    /// Writes `text` to `path`, creating its directory.
    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create dir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn forgetting_removes_registry_units_and_their_copies_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ws = workspace(dir.path());
        let profile = ws.build_dir.join("debug");
        let deps = profile.join("deps");
        let ours = ws.registry_src.join("-0a1b2c");
        let theirs = ws.registry_src.join("-3d4e5f");
        for registry in [&ours, &theirs] {
            for copy in ["dwara-records-0.1.0", "dwara-nameserver-0.1.0"] {
                write(&registry.join(copy).join("src/lib.rs"), "");
            }
        }
        let crates_io = ws
            .registry_src
            .join("index.crates.io-1949cf8c6b5b557f/serde-1.0.228");
        write(&crates_io.join("src/lib.rs"), "");
        // A unit compiled here from our temporary registry's copy of dwara-records, one
        // of dwara-records built from the workspace, and one of serde from crates.io.
        let units = [
            (
                "dwara_records",
                "dwara-records",
                "aa",
                ours.join("dwara-records-0.1.0/src/lib.rs"),
            ),
            (
                "dwara_records",
                "dwara-records",
                "bb",
                dir.path().join("crates/records/src/lib.rs"),
            ),
            ("serde", "serde", "cc", crates_io.join("src/lib.rs")),
        ];
        for (krate, name, hash, source) in &units {
            write(
                &deps.join(format!("{krate}-{hash}.d")),
                &dep_info(&deps, krate, hash, &[source.as_path()]),
            );
            write(&deps.join(format!("lib{krate}-{hash}.rlib")), "");
            write(&deps.join(format!("lib{krate}-{hash}.rmeta")), "");
            write(
                &profile.join(format!(".fingerprint/{name}-{hash}/lib-{krate}")),
                "",
            );
        }

        forget_earlier_packages(&ws, "a test").expect("forget");

        for gone in [
            deps.join("dwara_records-aa.d"),
            deps.join("libdwara_records-aa.rlib"),
            deps.join("libdwara_records-aa.rmeta"),
            profile.join(".fingerprint/dwara-records-aa"),
            ours.join("dwara-records-0.1.0"),
            ours.join("dwara-nameserver-0.1.0"),
        ] {
            assert!(!gone.exists(), "{} is still there", gone.display());
        }
        for kept in [
            deps.join("dwara_records-bb.d"),
            deps.join("libdwara_records-bb.rlib"),
            profile.join(".fingerprint/dwara-records-bb"),
            deps.join("libserde-cc.rlib"),
            profile.join(".fingerprint/serde-cc"),
            theirs.join("dwara-records-0.1.0"),
            crates_io.clone(),
        ] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        // A second pass finds nothing more to remove.
        forget_earlier_packages(&ws, "a test").expect("forget again");
        assert!(theirs.join("dwara-nameserver-0.1.0").exists());
    }
}
