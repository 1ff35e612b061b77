//! escrowctl against a real coordinator: each subcommand works, `--json`
//! is the API's JSON, `sku list` reads every page, and `audit` exits 1 on
//! drift or a stale report; `completions` needs no coordinator. The
//! coordinator runs on PostgreSQL and on SQLite (`NAME::postgres`,
//! `NAME::sqlite`), so the CLI is tested without a PostgreSQL server too.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::process::Output;

use coordinator::auth::Auth;
use coordinator::store::Store;
use escrow_core::RegionName;
use serde_json::Value;
use test_support::TestDb;
use tokio::net::TcpListener;

test_support::on_both_backends!(
    postgres: coordinator::store::POSTGRES_MIGRATOR,
    sqlite: coordinator::store::SQLITE_MIGRATOR;
    subcommands_and_audit_exit_status,
    sku_put_chooses_the_policy,
    sku_list_reads_every_page,
);

const ADMIN: &str = "admin-secret";

async fn serve(db: &TestDb) -> String {
    let state = coordinator::AppState::new(
        Store::open(db.url(), 4).await.unwrap(),
        Auth::new(
            Some(ADMIN.to_owned()),
            vec![(RegionName::parse("eu").unwrap(), "t".to_owned())],
        ),
        coordinator::policies::Policies::new("tail-merge", 200).unwrap(),
        10_000,
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(coordinator::run(listener, state, std::future::pending()));
    url
}

async fn ctl(url: &str, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_escrowctl"));
    cmd.args(["--url", url, "--token", ADMIN]).args(args);
    cmd.output().await.unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Goal: put, show, pause, resume, add-stock, regions and audit all work
/// through the CLI, and audit's exit status tells drift and stale reports.
async fn subcommands_and_audit_exit_status(db: TestDb) {
    let url = serve(&db).await;
    let out = ctl(
        &url,
        &[
            "sku",
            "put",
            "acme/drop",
            "--total",
            "100",
            "--max-per-user",
            "2",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("acme/drop"));

    let out = ctl(&url, &["--json", "sku", "add-stock", "acme/drop", "5"]).await;
    assert_eq!(json(&out)["total"], 105);
    // The same add-stock with one key, twice: applied once.
    for _ in 0..2 {
        let out = ctl(
            &url,
            &[
                "--json",
                "--idempotency-key",
                "restock-7",
                "sku",
                "add-stock",
                "acme/drop",
                "7",
            ],
        )
        .await;
        assert_eq!(json(&out)["total"], 112);
    }
    let out = ctl(&url, &["--json", "sku", "pause", "acme/drop"]).await;
    assert_eq!(json(&out)["paused"], true);
    let out = ctl(&url, &["--json", "sku", "resume", "acme/drop"]).await;
    assert_eq!(json(&out)["paused"], false);
    let out = ctl(&url, &["--json", "sku", "show", "acme/drop"]).await;
    assert_eq!(
        (
            json(&out)["pool"].as_i64(),
            json(&out)["max_per_user"].as_i64()
        ),
        (Some(112), Some(2))
    );
    assert!(ctl(&url, &["regions"]).await.status.success());

    // All units in the pool, no region: nothing can be stale, drift 0.
    let out = ctl(&url, &["audit"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A region with quota in transit that never reported is stale.
    ctl(
        &url,
        &[
            "sku",
            "put",
            "acme/other",
            "--total",
            "10",
            "--regions",
            "eu=1",
        ],
    )
    .await;
    let out = ctl(&url, &["audit"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAILED"));

    // Drift: a total that no longer matches the units (CHECK pool <= total still holds).
    db.execute("DELETE FROM transfers").await;
    db.execute("DELETE FROM sku_regions WHERE sku = 'other'")
        .await;
    db.execute("UPDATE skus SET total = total + 1 WHERE sku = 'drop'")
        .await;
    let out = ctl(&url, &["--json", "audit"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_ne!(json(&out)["drift_total"], 0);

    // Errors: bad id, wrong token, unknown SKU exit 2 with a message.
    assert_eq!(
        ctl(&url, &["sku", "show", "nope"]).await.status.code(),
        Some(2)
    );
    assert_eq!(
        ctl(&url, &["sku", "show", "acme/missing"])
            .await
            .status
            .code(),
        Some(2)
    );
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_escrowctl"));
    let out = cmd
        .args(["--url", &url, "--token", "wrong", "audit"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Goal: `sku put --policy NAME --set KEY=VALUE` chooses a SKU's policy
/// and its settings (nested keys dotted, values as JSON), `sku show`
/// shows them, and a bad name or setting exits 2 with the coordinator's
/// reason and changes nothing.
async fn sku_put_chooses_the_policy(db: TestDb) {
    let url = serve(&db).await;
    let put = |extra: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut args = vec!["--json", "sku", "put", "acme/drop", "--total", "50"];
            args.extend_from_slice(extra);
            ctl(&url, &args).await
        }
    };
    let out = put(&[]).await;
    assert_eq!(
        (&json(&out)["policy"], &json(&out)["policy_is_default"]),
        (&Value::from("tail-merge"), &Value::from(true))
    );

    let out = put(&[
        "--policy",
        "refill",
        "--set",
        "low_water_s=2.5",
        "--set",
        "min_units=4",
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = json(&ctl(&url, &["--json", "sku", "show", "acme/drop"]).await);
    assert_eq!(shown["policy"], "refill");
    assert_eq!(shown["settings"]["low_water_s"], 2.5);
    assert_eq!(shown["settings"]["min_units"], 4);

    let out = put(&["--policy", "tail-merge", "--set", "refill.refill_s=7"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["settings"]["refill"]["refill_s"], 7.0);

    for bad in [
        &["--policy", "fastest"][..],
        &["--set", "refill.nope=1"][..],
        &["--set", "merge_fraction=3"][..],
    ] {
        let mut args = vec!["sku", "put", "acme/drop", "--total", "50"];
        args.extend_from_slice(bad);
        let out = ctl(&url, &args).await;
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("policy"),
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let after = json(&ctl(&url, &["--json", "sku", "show", "acme/drop"]).await);
    assert_eq!(after["policy"], "tail-merge");
    assert_eq!(after["settings"]["refill"]["refill_s"], 7.0);
}

/// The `tenant/sku` of every line of `sku list --json`'s answer.
fn listed(out: &Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = json(out);
    assert_eq!(answer["next"], Value::Null);
    answer["skus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}/{}",
                s["tenant"].as_str().unwrap(),
                s["sku"].as_str().unwrap()
            )
        })
        .collect()
}

/// Goal: `sku list` reads pages of `--limit` SKUs until the last, so with
/// a limit smaller than the SKUs every SKU is listed once, in order; with
/// a tenant only its SKUs; the table shows each SKU's line; a bad limit
/// or tenant exits 2.
async fn sku_list_reads_every_page(db: TestDb) {
    let url = serve(&db).await;
    for (id, total) in [
        ("acme/c", "3"),
        ("acme/a", "1"),
        ("beta/x", "9"),
        ("acme/b", "2"),
        ("acme/d", "4"),
    ] {
        let out = ctl(&url, &["sku", "put", id, "--total", total]).await;
        assert!(out.status.success(), "{id}");
    }
    ctl(&url, &["sku", "pause", "acme/b"]).await;

    let out = ctl(&url, &["--json", "sku", "list", "acme", "--limit", "2"]).await;
    assert_eq!(listed(&out), ["acme/a", "acme/b", "acme/c", "acme/d"]);
    let skus = json(&out)["skus"].as_array().unwrap().clone();
    assert_eq!(
        skus.iter()
            .map(|s| (s["total"].as_u64().unwrap(), s["pool"].as_u64().unwrap()))
            .collect::<Vec<_>>(),
        [(1, 1), (2, 2), (3, 3), (4, 4)]
    );
    assert_eq!(skus[1]["paused"], true);

    let out = ctl(&url, &["--json", "sku", "list", "--limit", "1"]).await;
    assert_eq!(
        listed(&out),
        ["acme/a", "acme/b", "acme/c", "acme/d", "beta/x"]
    );
    let out = ctl(&url, &["--json", "sku", "list", "nobody"]).await;
    assert!(listed(&out).is_empty());

    let out = ctl(&url, &["sku", "list", "beta"]).await;
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("in transit"), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains("beta/x"))
        .unwrap_or_else(|| panic!("no beta/x line: {table}"));
    let cells: Vec<&str> = row
        .split(['│', '┆'])
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    let mode = json(&ctl(&url, &["--json", "sku", "show", "beta/x"]).await)["mode"].clone();
    assert_eq!(
        cells,
        [
            "beta/x",
            "9",
            "0",
            "0",
            "0",
            "9",
            "0",
            mode.as_str().unwrap(),
            "false"
        ],
        "{table}"
    );
    assert!(!table.contains("acme/"), "{table}");

    for bad in [
        &["sku", "list", "--limit", "0"][..],
        &["sku", "list", "acme", "--limit", "1001"][..],
        &["sku", "list", "acme/a"][..],
    ] {
        let out = ctl(&url, bad).await;
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(!out.stderr.is_empty(), "{bad:?}");
    }
}

/// Goal: `completions SHELL` prints that shell's completion script for
/// escrowctl, subcommands included, without calling any server; an
/// unknown shell exits 2.
#[test]
fn completions_print_a_script() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_escrowctl"))
            .args(["--url", "http://127.0.0.1:1", "completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("escrowctl"), "{shell}: {script}");
        assert!(script.contains("add-stock"), "{shell}: {script}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_escrowctl"))
        .args(["completions", "cmd"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
