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
        ("dwara-resolver", 93),
        ("dwara-dns-cache", 101),
        ("dwara-discovery", 39),
        ("dwara-discovery-dns", 104),
        ("dwara-discovery-consul", 40),
        ("dwara-discovery-k8s", 40),
        ("dwara-nameserver", 133),
        ("dwara-store", 21),
        ("dwara-cluster", 161),
        ("dwara-docker", 144),
        ("dwara-proxy", 136),
    ];

    /// Crates a library crate must not pull in by default, whatever the count.
    const FORBIDDEN: &[(&str, &[&str])] = &[
        ("dwara-lb", &["tokio"]),
        ("dwara-dns-cache", &["hyper", "hyper-util", "reqwest"]),
        ("dwara-discovery", &["tower"]),
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
