//! Tests that need a tool from outside the workspace (Chromium and its
//! WebDriver, libfaketime, promtool, root to mount a tmpfs, PostgreSQL's
//! server binaries) skip where it is missing, loudly, so a developer's
//! machine runs what it can. In CI a skip would pass unseen: with
//! `ESCROW_REQUIRE_TOOLS=1` every such skip fails its test instead, as
//! `ESCROW_REQUIRE_POSTGRES=1` does for the PostgreSQL half of the suite
//! ([`crate::backend`]). Every skip goes through [`skip_without`], so the
//! rule is written once.

use std::io::Write as _;

/// Set, a test whose outside tool is missing fails instead of skipping.
pub const REQUIRE_TOOLS: &str = "ESCROW_REQUIRE_TOOLS";

/// Set, an unreachable PostgreSQL fails the run instead of skipping its
/// half of the suite.
pub const REQUIRE_POSTGRES: &str = "ESCROW_REQUIRE_POSTGRES";

/// Whether the switch `name` is on: set, and neither empty nor `0`.
pub fn required(name: &str) -> bool {
    is_on(std::env::var(name).ok().as_deref())
}

/// The rule of [`required`] on a switch's value.
fn is_on(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

/// To be called where a test finds `tool` missing and is about to skip
/// `what` (the test, or a part of it); `tool` reads after "needs" and says
/// how to get it (`"root, to mount a tmpfs"`). With
/// [`REQUIRE_TOOLS`] on, fails the test; otherwise says `SKIPPING` on the
/// real stderr, past the test harness's capture (a skip must be seen, not
/// only in a failing test's output), and returns for the caller to skip.
#[track_caller]
pub fn skip_without(tool: &str, what: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    assert!(
        !required(REQUIRE_TOOLS),
        "{REQUIRE_TOOLS} is set and {what} ({test}) needs {tool}, missing here"
    );
    let _ = writeln!(
        std::io::stderr().lock(),
        "*** SKIPPING {what} ({test}): it needs {tool}, missing here. \
         Set {REQUIRE_TOOLS}=1 to fail instead. ***"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the switch reads as on only when set to something other
    /// than empty or `0`, as `ESCROW_REQUIRE_POSTGRES` does.
    #[test]
    fn a_switch_is_on_when_set_to_anything_but_empty_or_zero() {
        for (value, on) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("1"), true),
            (Some("yes"), true),
        ] {
            assert_eq!(is_on(value), on, "{value:?}");
        }
    }

    /// Goal: without the switch a missing tool skips (the call returns);
    /// with it, the same call fails the test. The child test process is
    /// this very binary, run with the switch on, so the real rule is what
    /// is tested.
    #[test]
    fn a_missing_tool_skips_without_the_switch_and_fails_with_it() {
        if std::env::var_os("ESCROW_TOOLS_CHILD").is_some() {
            skip_without("a tool nobody has", "this check");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let run = |switch: &str| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "tools::tests::a_missing_tool_skips_without_the_switch_and_fails_with_it",
                    "--nocapture",
                ])
                .env("ESCROW_TOOLS_CHILD", "1")
                .env(REQUIRE_TOOLS, switch)
                .output()
                .unwrap()
        };
        let said = |out: &std::process::Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        let skipped = run("0");
        let said_skipped = said(&skipped);
        assert!(skipped.status.success(), "{said_skipped}");
        assert!(
            said_skipped.contains("SKIPPING this check"),
            "{said_skipped}"
        );
        let failed = run("1");
        let said_failed = said(&failed);
        assert!(!failed.status.success(), "{said_failed}");
        assert!(
            said_failed.contains("ESCROW_REQUIRE_TOOLS is set and this check"),
            "{said_failed}"
        );
    }
}
