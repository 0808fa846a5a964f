//! Prerequisites of tests: Docker, network namespaces, a tool on `PATH`.
//!
//! A developer's plain `cargo test` on a machine without Docker skips the Docker
//! tests with one printed `SKIP` line; `cargo xtask ci` sets [`REQUIRE_ALL`]`=1`, and
//! then a missing prerequisite fails the test that needed it, so a CI machine
//! without Docker cannot pass by skipping.
//!
//! ```
//! # fn docker_is_reachable() -> Result<(), String> { Ok(()) }
//! // In a test: return early (skipped) unless Docker is there.
//! if !test_support::require("a Docker engine", docker_is_reachable()) {
//!     return;
//! }
//! ```

use std::fmt::Display;

/// The environment variable that turns a missing prerequisite into a failure when
/// set to `1`.
pub const REQUIRE_ALL: &str = "DWARA_REQUIRE_ALL";

/// Whether [`REQUIRE_ALL`] is set to `1`.
pub fn required() -> bool {
    std::env::var(REQUIRE_ALL).is_ok_and(|v| v == "1")
}

/// Whether the prerequisite `what` is available: `Ok` when it is, or why not.
///
/// When it is not: with [`REQUIRE_ALL`]`=1` this panics naming the test, `what`
/// and the reason; otherwise it prints one `SKIP <test>: <what> is not available:
/// <reason>` line and returns `false`, and the caller returns.
pub fn require<T, E: Display>(what: &str, available: Result<T, E>) -> bool {
    require_ok(what, available).is_some()
}

/// [`require`] handing back what the check produced (a client, a path), so a test
/// writes `let Some(docker) = require_ok("a Docker engine", connect()) else { return };`.
pub fn require_ok<T, E: Display>(what: &str, available: Result<T, E>) -> Option<T> {
    match available {
        Ok(v) => Some(v),
        Err(why) => {
            let line = missing(&current_test(), what, &why);
            if required() {
                panic!("{line} ({REQUIRE_ALL}=1: every prerequisite is required)");
            }
            eprintln!("SKIP {line}");
            None
        }
    }
}

/// `<test>: <what> is not available: <why>`.
fn missing(test: &str, what: &str, why: &dyn Display) -> String {
    format!("{test}: {what} is not available: {why}")
}

/// The running test's name: libtest names the thread it runs a test on after it.
fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_available_prerequisite_is_handed_back() {
        assert_eq!(require_ok::<_, String>("a tool", Ok(7)), Some(7));
        assert!(require::<_, String>("a tool", Ok(())));
    }

    #[test]
    fn a_missing_prerequisite_names_the_test_what_and_why() {
        let line = missing(&current_test(), "a Docker engine", &"no socket");
        assert_eq!(
            line,
            "require::tests::a_missing_prerequisite_names_the_test_what_and_why: \
             a Docker engine is not available: no socket"
        );
    }

    /// Skips under a plain `cargo test`, fails under `cargo xtask ci`: whichever
    /// this run is, the outcome follows the variable.
    #[test]
    fn a_missing_prerequisite_skips_or_fails_as_the_variable_says() {
        let outcome = std::panic::catch_unwind(|| require::<(), _>("a tool", Err("not on PATH")));
        match outcome {
            Ok(skipped) => assert!(!required() && !skipped),
            Err(_) => assert!(required()),
        }
    }
}
