//! Tidy checks, run by `cargo test` (so by `cargo xtask ci` too).
//!
//! - every Rust module starts with `//!` docs;
//! - every crate root forbids unsafe code;
//! - every workspace member inherits the workspace lints;
//! - the name-server half never depends on the load-balancer half and vice versa
//!   (checked over `cargo metadata`, transitively); `dwara-store` depends on no
//!   workspace crate.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask sits in the workspace root")
            .to_path_buf()
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && name != "corpus" && name != "artifacts" {
                    rust_files(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    fn member_dirs() -> Vec<PathBuf> {
        let root = root();
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
            .expect("crates/")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("Cargo.toml").exists())
            .collect();
        dirs.push(root.join("xtask"));
        dirs.push(root.join("benches"));
        dirs.sort();
        dirs
    }

    #[test]
    fn every_module_has_module_docs() {
        let mut files = Vec::new();
        for dir in member_dirs() {
            rust_files(&dir, &mut files);
        }
        rust_files(&root().join("fuzz"), &mut files);
        let missing: Vec<String> = files
            .iter()
            .filter(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                !first.starts_with("//!")
            })
            .map(|f| f.display().to_string())
            .collect();
        assert!(files.len() > 20, "found only {} files", files.len());
        assert!(
            missing.is_empty(),
            "modules without //! docs:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn every_crate_inherits_workspace_lints_and_forbids_unsafe() {
        let mut problems = Vec::new();
        for dir in member_dirs() {
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
            let inherits = manifest
                .split("[lints]")
                .nth(1)
                .is_some_and(|rest| rest.trim_start().starts_with("workspace = true"));
            if !inherits {
                problems.push(format!("{}: no `[lints] workspace = true`", dir.display()));
            }
            for root_file in ["src/lib.rs", "src/main.rs"] {
                let path = dir.join(root_file);
                if let Ok(text) = std::fs::read_to_string(&path)
                    && !text.contains("#![forbid(unsafe_code)]")
                {
                    problems.push(format!("{}: no #![forbid(unsafe_code)]", path.display()));
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// Transitive workspace-internal dependencies of each workspace package.
    fn internal_deps() -> HashMap<String, BTreeSet<String>> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(root())
            .output()
            .expect("cargo metadata");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
        let packages = meta["packages"].as_array().expect("packages");
        let names: BTreeSet<String> = packages
            .iter()
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect();
        let direct: HashMap<String, Vec<String>> = packages
            .iter()
            .map(|p| {
                let deps = p["dependencies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    // Normal dependencies only: tests may use anything.
                    .filter(|d| d["kind"].is_null())
                    .filter_map(|d| d["name"].as_str())
                    .filter(|n| names.contains(*n))
                    .map(str::to_owned)
                    .collect();
                (p["name"].as_str().unwrap_or_default().to_owned(), deps)
            })
            .collect();
        direct
            .keys()
            .map(|pkg| {
                let mut seen = BTreeSet::new();
                let mut stack = vec![pkg.clone()];
                while let Some(p) = stack.pop() {
                    for d in direct.get(&p).into_iter().flatten() {
                        if seen.insert(d.clone()) {
                            stack.push(d.clone());
                        }
                    }
                }
                (pkg.clone(), seen)
            })
            .collect()
    }

    #[test]
    fn nameserver_half_and_lb_half_stay_apart() {
        let deps = internal_deps();
        let nameserver_half = [
            "dwara-nameserver",
            "dwara-store",
            "dwara-cluster",
            "dwara-docker",
        ];
        let lb_half = [
            "dwara-lb",
            "dwara-discovery",
            "dwara-discovery-dns",
            "dwara-discovery-consul",
            "dwara-discovery-k8s",
            "dwara-dns-cache",
            "dwara-proxy",
        ];
        for c in nameserver_half.iter().chain(&lb_half) {
            assert!(
                deps.contains_key(*c),
                "{c} is listed here but is not a workspace crate"
            );
        }
        for ns in nameserver_half {
            for lb in lb_half {
                assert!(
                    !deps.get(ns).is_some_and(|d| d.contains(lb)),
                    "{ns} depends on {lb}"
                );
                assert!(
                    !deps.get(lb).is_some_and(|d| d.contains(ns)),
                    "{lb} depends on {ns}"
                );
            }
        }
        // The store knows registrations, not the name server.
        assert!(
            deps.get("dwara-store").is_some_and(BTreeSet::is_empty),
            "dwara-store depends on {:?}",
            deps.get("dwara-store")
        );
        // And the binary joins both halves.
        let bin = &deps["dwara"];
        assert!(bin.contains("dwara-nameserver") && bin.contains("dwara-lb"));
    }
}
