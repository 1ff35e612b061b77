//! The demo as a user runs it, non-interactively: the `demo` binary on a
//! small sale (200 units, 600 buyers over 3 s) with its default storage,
//! a SQLite file per process in a fresh run directory, eu and us at a
//! distance from the coordinator (`--rtt`) and ap on loopback. Only its
//! output and exit status are read, as CI would: every unit sold once,
//! nothing oversold, the audit without drift, each region's round trip
//! and holds in the summary, the run directory kept. No PostgreSQL is
//! needed.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::process::Command;

use harness::process::Binaries;

/// The value of summary row `label` (`  label    value`), if printed.
fn row<'a>(stdout: &'a str, label: &str) -> Option<&'a str> {
    stdout.lines().find_map(|line| {
        line.trim_start()
            .strip_prefix(label)
            .filter(|rest| rest.starts_with("  "))
            .map(str::trim)
    })
}

/// The number that starts `text` (`1,234 holds`), without its commas.
fn leading_count(text: &str) -> Option<u64> {
    let digits: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Goal: a whole demo run on SQLite, two regions at a distance, ends with
/// exit status 0, all 200 units sold (confirmed) exactly once, oversold 0
/// and audit drift 0 in the summary, each region's round trip (or
/// loopback) in the summary with holds that add up to the buyers who held
/// a unit, plain progress lines with the hold waits on a non-terminal
/// stdout, and the run directory holding every process's database and log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_sale_sells_every_unit_once_on_sqlite() {
    // The services the demo starts, built in the test's profile beside
    // the `demo` binary.
    Binaries::build().await.unwrap();
    let runs = std::env::temp_dir().join(format!("demo-test-runs-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(["--units", "200", "--buyers", "600", "--seconds", "3"])
        .args(["--rtt", "eu=20,us=80"])
        .arg("--runs-dir")
        .arg(&runs)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(output.status.success(), "{}: {context}", output.status);

    assert!(
        stdout.contains("demo: ok: 200 of 200 units sold, oversold 0, audit drift 0"),
        "{context}"
    );
    let sold = row(&stdout, "sold").unwrap_or_default();
    assert!(sold.starts_with("200 of 200 units"), "{context}");
    assert!(sold.ends_with("0 still held, 0 free"), "{context}");
    assert_eq!(row(&stdout, "oversold"), Some("0"), "{context}");
    assert_eq!(row(&stdout, "audit drift"), Some("0"), "{context}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(" selling ") && l.contains(" drift ") && l.contains(" hold ")),
        "plain progress lines: {context}"
    );

    let mut holds = 0;
    for (region, distance) in [
        ("eu", "rtt 20 ms, "),
        ("us", "rtt 80 ms, "),
        ("ap", "loopback, "),
    ] {
        let line = row(&stdout, region).unwrap_or_default();
        let Some(rest) = line.strip_prefix(distance) else {
            panic!("{region}'s round trip: {context}");
        };
        assert!(rest.contains(" holds"), "{region}'s holds: {context}");
        holds += leading_count(rest).unwrap();
    }
    let buyers = row(&stdout, "buyers").unwrap_or_default();
    assert!(buyers.contains(" held a unit"), "{context}");
    assert_eq!(Some(holds), leading_count(buyers), "{context}");

    let run_dir = std::fs::read_dir(&runs)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .next()
        .unwrap();
    for name in [
        "coordinator",
        "region-agent-eu",
        "region-agent-us",
        "region-agent-ap",
    ] {
        for extension in ["db", "log"] {
            let file = run_dir.join(format!("{name}.{extension}"));
            assert!(file.is_file(), "{} is kept: {context}", file.display());
        }
    }
    std::fs::remove_dir_all(&runs).unwrap();
}
