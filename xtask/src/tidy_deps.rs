//! Tidy check on what each library crate costs its users: the number of distinct
//! packages its normal dependencies pull in (transitively, default features, for
//! the host), held to a ceiling written here and printed on every run.
//!
//! A crate picked à la carte must bring only what it needs (`dwara-lb` no async
//! runtime, `dwara-dns-cache` neither hyper nor reqwest unless asked). A new
//! dependency that raises a count fails this test until the ceiling is raised on
//! purpose, in the same change that explains why.

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::process::Command;

    /// `(crate, ceiling)`: each ceiling is the count measured when it was set;
    /// lower it when the count drops.
    const CEILINGS: &[(&str, usize)] = &[
        ("dwara-lb", 25),
        ("dwara-resolv-conf", 0),
        ("dwara-resolver", 94),
        ("dwara-dns-cache", 102),
        ("dwara-discovery", 39),
        ("dwara-discovery-dns", 105),
        ("dwara-discovery-consul", 40),
        ("dwara-discovery-k8s", 40),
        // The HTTP path (hyper server and client, the dial-path DNS cache); HTTP/2
        // with prior knowledge on the server side brings h2 (and its fnv, indexmap,
        // hashbrown).
        ("dwara-proxy", 149),
        ("dwara-records", 69),
        ("dwara-store", 21),
        ("dwara-nameserver", 114),
        ("dwara-cluster", 137),
        ("dwara-docker", 108),
    ];

    /// Crates a library crate must not pull in by default, whatever the count.
    const FORBIDDEN: &[(&str, &[&str])] = &[
        ("dwara-lb", &["tokio"]),
        ("dwara-dns-cache", &["hyper", "hyper-util", "reqwest"]),
        ("dwara-discovery", &["tower"]),
        ("dwara-records", &["axum", "hyper"]),
    ];

    /// The distinct packages (name and version) `krate` depends on, not counting itself.
    fn normal_dependencies(krate: &str) -> BTreeSet<String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args([
                "tree",
                "--package",
                krate,
                "--edges",
                "normal",
                "--prefix",
                "none",
            ])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .output()
            .expect("cargo tree runs");
        assert!(
            out.status.success(),
            "cargo tree -p {krate}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut packages: BTreeSet<String> = text
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                Some(format!("{} {}", words.next()?, words.next()?))
            })
            .collect();
        packages.retain(|p| !p.starts_with(&format!("{krate} ")));
        packages
    }

    /// The publishable library crates of the workspace (all but the binary).
    fn library_crates() -> BTreeSet<String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .output()
            .expect("cargo metadata runs");
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
        meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            // `publish = false` is an empty list of registries.
            .filter(|p| p["publish"].as_array().is_none_or(|r| !r.is_empty()))
            .filter_map(|p| p["name"].as_str())
            .filter(|name| *name != "dwara")
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_library_crate_has_a_ceiling() {
        let listed: BTreeSet<String> = CEILINGS.iter().map(|(k, _)| (*k).to_owned()).collect();
        assert_eq!(
            library_crates(),
            listed,
            "library crates vs the ceilings listed here"
        );
    }

    #[test]
    fn library_crates_keep_their_dependency_counts() {
        let mut over = Vec::new();
        println!("normal dependencies (transitive, default features):");
        for (krate, ceiling) in CEILINGS {
            let packages = normal_dependencies(krate);
            println!("  {krate:<24} {:>4} (ceiling {ceiling})", packages.len());
            if packages.len() > *ceiling {
                over.push(format!("{krate}: {} > {ceiling}", packages.len()));
            }
            let forbidden = FORBIDDEN
                .iter()
                .filter(|(k, _)| k == krate)
                .flat_map(|(_, names)| names.iter());
            for name in forbidden {
                assert!(
                    !packages.iter().any(|p| p.split(' ').next() == Some(name)),
                    "{krate} pulls in {name} by default"
                );
            }
        }
        assert!(
            over.is_empty(),
            "dependency counts over their ceilings: {over:?}"
        );
    }
}
