//! Shared helpers for the criterion benchmarks in `benches/benches/`.

#![forbid(unsafe_code)]

#[cfg(test)]
mod tests {
    //! The README tells proxy authors to use `dwara-lb` and `dwara-dns-cache`
    //! together; their public names must not collide with different meanings.

    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;
    use std::time::Duration;

    // Glob imports, as a proxy using both crates might write them: a name both
    // export is ambiguous here and fails to compile.
    use dwara_dns_cache::*;
    use dwara_lb::*;

    #[test]
    fn lb_and_dns_cache_clocks_have_one_name_per_meaning() {
        // The cache's clock hands out instants …
        let manual = ManualClock::new();
        let cache_clock = Clock::from(manual.clone());
        let t0 = cache_clock.now();
        manual.advance(Duration::from_secs(2));
        assert_eq!(cache_clock.now() - t0, Duration::from_secs(2));

        // … the LB's ejection clock measures elapsed time for cool-downs.
        let ejection = Arc::new(ManualEjectionClock::new());
        let lb = UpstreamLb::builder(Policy::RoundRobin)
            .ejection(EjectionConfig::new(1, Duration::from_secs(10)))
            .clock(ejection.clone())
            .endpoints(EndpointSet::from_iter([
                Endpoint::new("10.0.0.1:80".parse().unwrap()),
                Endpoint::new("10.0.0.2:80".parse().unwrap()),
            ]))
            .build();
        let bad = "10.0.0.1:80".parse().unwrap();
        assert!(lb.report(bad, Outcome::Failure));
        assert!(lb.is_ejected(bad));
        ejection.advance(Duration::from_secs(11));
        assert_eq!(EjectionClock::now(&*ejection), Duration::from_secs(11));
        assert!(!lb.is_ejected(bad), "back after the cool-down");
    }

    /// Library functions with a `bool` parameter that some call passes a `true` or
    /// `false` literal to (rust-analyzer's style: split the function or take an
    /// enum). A tidy check; it belongs with `xtask/src/tidy.rs`.
    #[test]
    fn no_library_function_is_called_with_a_bool_literal() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates");
        let mut files = Vec::new();
        for krate in std::fs::read_dir(&root).unwrap() {
            let krate = krate.unwrap().path();
            if krate.file_name().is_some_and(|n| n != "dwara") {
                collect_rs(&krate.join("src"), &mut files);
            }
        }
        let texts: Vec<(String, String)> = files
            .iter()
            .map(|f| (f.display().to_string(), std::fs::read_to_string(f).unwrap()))
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

    fn collect_rs(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let path = e.unwrap().path();
            if path.is_dir() {
                collect_rs(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
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
