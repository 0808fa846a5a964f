//! Tidy checks, run by `cargo test` (so by `cargo xtask ci` too).
//!
//! - every Rust module starts with `//!` docs (a crate root may start with
//!   `#![doc = include_str!("../README.md")]` instead);
//! - every crate root forbids unsafe code;
//! - every workspace member inherits the workspace lints;
//! - every crate is placed: on the name-server half, on the load-balancer half,
//!   among the shared leaves or above both; a crate on no side fails the test;
//! - the name-server half never depends on the load-balancer half and vice versa
//!   (checked over `cargo metadata`, transitively); `dwara-store` and the shared
//!   leaves depend on no workspace crate; `dwara-cluster` and `dwara-docker` use
//!   `dwara-records`, not `dwara-nameserver`;
//! - no function of a library crate is over 100 lines (the test prints the longest);
//! - no library function with a `bool` parameter is called with a `true`/`false`
//!   literal (split it or take an enum);
//! - the reference docs (`README.md`, `ARCHITECTURE.md`, `docs/*.md`) name no issue
//!   number, no work session and no scratch path outside the repository.

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
                // A crate whose docs are its README includes it as the first line.
                !first.starts_with("//!") && !first.starts_with("#![doc = include_str!(")
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

    /// The name-server half of the workspace.
    const NAMESERVER_HALF: [&str; 5] = [
        "dwara-records",
        "dwara-nameserver",
        "dwara-store",
        "dwara-cluster",
        "dwara-docker",
    ];
    /// The dataplane (load-balancer) half.
    const LB_HALF: [&str; 9] = [
        "dwara-lb",
        "dwara-resolver",
        "dwara-discovery",
        "dwara-discovery-dns",
        "dwara-discovery-consul",
        "dwara-discovery-k8s",
        "dwara-dns-cache",
        "dwara-proxy",
        "dwara-pingora",
    ];
    /// Leaves either half may use: they depend on no workspace crate.
    const SHARED_LEAVES: [&str; 1] = ["dwara-resolv-conf"];
    /// Where the halves meet, and what only tests, benchmarks and tools use.
    const ABOVE_BOTH: [&str; 5] = [
        "dwara",
        "test-support",
        "dwara-fuzz-checks",
        "dwara-benches",
        "xtask",
    ];

    #[test]
    fn every_crate_is_placed_and_the_halves_stay_apart() {
        let deps = internal_deps();
        let placed: Vec<&str> = NAMESERVER_HALF
            .iter()
            .chain(&LB_HALF)
            .chain(&SHARED_LEAVES)
            .chain(&ABOVE_BOTH)
            .copied()
            .collect();
        // A new crate must be put on a side (or among the leaves) here first.
        let unknown: Vec<&String> = deps
            .keys()
            .filter(|c| !placed.contains(&c.as_str()))
            .collect();
        assert!(
            unknown.is_empty(),
            "crates on no side of the halves rule: {unknown:?} (add them to xtask/src/tidy.rs)"
        );
        for ns in NAMESERVER_HALF.iter().filter(|c| deps.contains_key(**c)) {
            for lb in LB_HALF.iter().filter(|c| deps.contains_key(**c)) {
                assert!(!deps[*ns].contains(*lb), "{ns} depends on {lb}");
                assert!(!deps[*lb].contains(*ns), "{lb} depends on {ns}");
            }
        }
        for leaf in SHARED_LEAVES.iter().chain(&["dwara-store"]) {
            assert!(
                deps.get(*leaf).is_some_and(BTreeSet::is_empty),
                "{leaf} depends on {:?}",
                deps.get(*leaf)
            );
        }
        // The writers beside the name server need the records, not the server.
        for writer in ["dwara-cluster", "dwara-docker"] {
            assert!(
                deps[writer].contains("dwara-records")
                    && !deps[writer].contains("dwara-nameserver"),
                "{writer} depends on {:?}",
                deps[writer]
            );
        }
        // And the binary joins both halves.
        let bin = &deps["dwara"];
        assert!(bin.contains("dwara-nameserver") && bin.contains("dwara-lb"));
    }

    /// The most lines a function of a library crate may have.
    const MAX_FUNCTION_LINES: usize = 100;

    /// The source files of library code: every `src/` file of a crate with a
    /// `lib.rs`, without the modules only its binary declares, without test files.
    fn library_files() -> Vec<PathBuf> {
        let mut files = Vec::new();
        for dir in member_dirs() {
            let src = dir.join("src");
            if !src.join("lib.rs").exists() {
                continue;
            }
            let main = std::fs::read_to_string(src.join("main.rs")).unwrap_or_default();
            let bin_modules: Vec<String> = main
                .lines()
                .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
                .map(str::to_owned)
                .collect();
            let mut all = Vec::new();
            rust_files(&src, &mut all);
            files.extend(all.into_iter().filter(|f| {
                let rel = f.strip_prefix(&src).unwrap_or(f);
                let first = rel
                    .components()
                    .next()
                    .map(|c| c.as_os_str().to_string_lossy());
                let first = first.as_deref().unwrap_or("").trim_end_matches(".rs");
                rel != Path::new("main.rs")
                    && !bin_modules.iter().any(|m| m == first)
                    && f.file_name().is_some_and(|n| n != "tests.rs")
                    && !rel.components().any(|c| c.as_os_str() == "tests")
            }));
        }
        files
    }

    /// `(name, first line, lines)` of every function in rustfmt-formatted `text`,
    /// up to its inline test module: a function ends at the first line that is its
    /// indentation followed by `}`.
    fn function_lengths(text: &str) -> Vec<(String, usize, usize)> {
        let text = text
            .split("#[cfg(test)]\nmod tests {")
            .next()
            .unwrap_or(text);
        let lines: Vec<&str> = text.lines().collect();
        let mut out = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            let Some(at) = trimmed.find("fn ") else {
                continue;
            };
            let head = &trimmed[..at];
            let is_fn = head.split_whitespace().all(|w| {
                matches!(
                    w,
                    "pub" | "pub(crate)" | "pub(super)" | "async" | "const" | "unsafe" | "extern"
                )
            });
            if !is_fn || trimmed.contains("//") && trimmed.find("//") < Some(at) {
                continue;
            }
            let name: String = trimmed[at + 3..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // A declaration without a body ends with `;` before any `{`.
            let rest = lines[i..].join("\n");
            let (brace, semi) = (rest.find('{'), rest.find(';'));
            if brace.is_none() || semi.is_some_and(|s| Some(s) < brace) {
                continue;
            }
            let close = format!("{indent}}}");
            if let Some(end) = lines[i..]
                .iter()
                .position(|l| *l == close || l.starts_with(&format!("{close} ")))
            {
                out.push((name, i + 1, end + 1));
            }
        }
        out
    }

    #[test]
    fn function_lengths_are_measured() {
        let text = "fn short() {\n    1\n}\n\npub(crate) async fn longer(\n    a: u8,\n) -> u8 {\n    a\n}\ntrait T {\n    fn decl(&self);\n}\n";
        let got = function_lengths(text);
        assert_eq!(
            got,
            [("short".to_owned(), 1, 3), ("longer".to_owned(), 5, 5)]
        );
    }

    #[test]
    fn no_library_function_is_over_100_lines() {
        let root = root();
        let mut long: Vec<(usize, String)> = Vec::new();
        for file in library_files() {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let rel = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .display()
                .to_string();
            for (name, line, len) in function_lengths(&text) {
                if len > MAX_FUNCTION_LINES {
                    long.push((len, format!("{rel}:{line} {name}: {len} lines")));
                }
            }
        }
        long.sort_unstable_by(|a, b| b.cmp(a));
        let longest: Vec<&str> = long.iter().map(|(_, l)| l.as_str()).collect();
        assert!(
            long.is_empty(),
            "functions over {MAX_FUNCTION_LINES} lines, longest first:\n{}",
            longest.join("\n")
        );
    }

    /// Library functions with a `bool` parameter that some call passes a `true` or
    /// `false` literal to (rust-analyzer's style: split the function or take an
    /// enum). A text scan of the library crates, not a parser.
    #[test]
    fn no_library_function_is_called_with_a_bool_literal() {
        let mut files = Vec::new();
        for krate in member_dirs() {
            let library = krate.join("src/lib.rs").exists() && !krate.ends_with("dwara");
            if library && !krate.ends_with("xtask") {
                rust_files(&krate.join("src"), &mut files);
            }
        }
        let texts: Vec<(String, String)> = files
            .iter()
            .map(|f| {
                (
                    f.display().to_string(),
                    std::fs::read_to_string(f).expect("readable source"),
                )
            })
            .collect();
        let mut bool_params: Vec<(String, Vec<usize>)> = Vec::new();
        for (_, text) in &texts {
            for (name, params) in signatures(text) {
                let bools: Vec<usize> = params
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.split(':').nth(1).is_some_and(|t| t.trim() == "bool"))
                    .map(|(i, _)| i)
                    .collect();
                if !bools.is_empty() {
                    bool_params.push((name, bools));
                }
            }
        }
        let mut offenders = Vec::new();
        for (file, text) in &texts {
            for (name, bools) in &bool_params {
                for args in calls(text, name) {
                    if bools
                        .iter()
                        .any(|&i| matches!(args.get(i).map(String::as_str), Some("true" | "false")))
                    {
                        offenders.push(format!("{file}: {name}({})", args.join(", ")));
                    }
                }
            }
        }
        assert!(offenders.is_empty(), "bool literals passed: {offenders:#?}");
    }

    /// What a reader of the docs cannot follow: an issue number (`issue #3`, `issue 14`),
    /// a work session (`session 7`), a path on a developer's machine (`/work/`, `/tmp/`).
    fn history_markers(text: &str) -> Vec<String> {
        let lower = text.to_lowercase();
        let mut found = Vec::new();
        for word in ["issue", "session"] {
            for (at, _) in lower.match_indices(word) {
                let word_start = !lower[..at]
                    .chars()
                    .next_back()
                    .is_some_and(char::is_alphanumeric);
                let rest = lower[at + word.len()..].trim_start_matches([' ', '-']);
                let rest = if word == "issue" {
                    rest.trim_start_matches('#')
                } else {
                    rest
                };
                let number: String = rest.chars().take_while(char::is_ascii_digit).collect();
                if word_start && !number.is_empty() {
                    found.push(format!("{word} {number}"));
                }
            }
        }
        for path in ["/work/", "/tmp/"] {
            if lower.contains(path) {
                found.push(path.to_owned());
            }
        }
        found
    }

    #[test]
    fn history_markers_are_recognised() {
        assert_eq!(history_markers("see issue #12"), ["issue 12"]);
        assert_eq!(history_markers("Issue 14's goals"), ["issue 14"]);
        assert_eq!(history_markers("(session 7, 21:05)"), ["session 7"]);
        assert_eq!(history_markers("built in /work/target-base"), ["/work/"]);
        let clean = "session encryption; a reissue; 3 sessions; tissue 4; /tmpfs";
        assert!(history_markers(clean).is_empty());
    }

    /// The docs are references for a newcomer, not a lab notebook: history lives in git.
    #[test]
    fn docs_name_no_issue_session_or_scratch_path() {
        let root = root();
        let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
        let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
            .expect("docs/")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        in_docs.sort();
        files.extend(in_docs);
        assert!(files.len() >= 4, "found only {files:?}");
        let offenders: Vec<String> = files
            .iter()
            .flat_map(|f| {
                let text = std::fs::read_to_string(f).expect("readable doc");
                history_markers(&text)
                    .into_iter()
                    .map(move |m| format!("{}: {m:?}", f.display()))
            })
            .collect();
        assert!(
            offenders.is_empty(),
            "docs name issues, sessions or scratch paths (describe what exists, \
             and how to reproduce it):\n{}",
            offenders.join("\n")
        );
    }

    /// The text inside the parentheses that open at `open`, split at top-level commas.
    fn args_at(text: &str, open: usize) -> Option<Vec<String>> {
        let (mut depth, mut start, mut args) = (0i32, open + 1, Vec::new());
        for (i, c) in text[open..].char_indices().map(|(i, c)| (open + i, c)) {
            match c {
                '(' | '[' | '{' | '<' if !(c == '<' && depth == 0 && i == open) => depth += 1,
                ')' | ']' | '}' => {
                    depth -= 1;
                    if depth == 0 {
                        let last = text[start..i].trim();
                        if !last.is_empty() {
                            args.push(last.to_owned());
                        }
                        return Some(args);
                    }
                }
                '>' if !text[..i].ends_with('-') && !text[..i].ends_with('=') => depth -= 1,
                ',' if depth == 1 => {
                    args.push(text[start..i].trim().to_owned());
                    start = i + 1;
                }
                _ => {}
            }
        }
        None
    }

    /// `(name, parameters without self)` of every `fn name(...)` in `text`.
    fn signatures(text: &str) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for (at, _) in text.match_indices("fn ") {
            let rest = &text[at + 3..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let Some(open) = rest[name.len()..].find('(') else {
                continue;
            };
            let open = at + 3 + name.len() + open;
            if let Some(mut params) = args_at(text, open) {
                params.retain(|p| !p.contains("self"));
                out.push((name, params));
            }
        }
        out
    }

    /// The argument lists of every call `name(...)` or `.name(...)` in `text`.
    fn calls(text: &str, name: &str) -> Vec<Vec<String>> {
        let needle = format!("{name}(");
        text.match_indices(&needle)
            .filter(|(at, _)| {
                let before = text[..*at].chars().next_back();
                !text[..*at].ends_with("fn ")
                    && !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
            .filter_map(|(at, _)| args_at(text, at + name.len()))
            .collect()
    }
}
