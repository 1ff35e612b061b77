//! escrowctl against a real coordinator: each subcommand works, `--json`
//! is the API's JSON, `sku list` reads every page, `audit` exits 1 on
//! drift or a stale report, and `sku watch` follows a sale on a real
//! region agent; `prune` deletes only what is older than its window;
//! `completions` needs no coordinator. The
//! coordinator runs on PostgreSQL and on SQLite (`NAME::postgres`,
//! `NAME::sqlite`), so the CLI is tested without a PostgreSQL server too.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use coordinator::auth::Auth;
use coordinator::store::Store;
use escrow_core::{RegionName, Tenant};
use region_agent::coordinator_client::{CoordinatorLink, HttpCoordinator};
use reqwest::StatusCode;
use serde_json::Value;
use test_support::{Served, TestDb};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::TcpListener;
use tokio::process::{Child, ChildStdout};

test_support::on_both_backends!(
    postgres: coordinator::store::POSTGRES_MIGRATOR,
    sqlite: coordinator::store::SQLITE_MIGRATOR;
    subcommands_and_audit_exit_status,
    sku_put_chooses_the_policy,
    sku_list_reads_every_page,
    sku_watch_follows_a_sale,
    prune_reports_what_it_deleted,
    cart_show_reads_a_cart_at_its_region,
);

const ADMIN: &str = test_support::ADMIN;
/// Region `eu`'s token at the coordinator.
const REGION_TOKEN: &str = "t";

async fn serve(db: &TestDb) -> String {
    let state = coordinator::AppState::new(
        Store::open(db.url(), 4).await.unwrap(),
        Auth::new(
            Some(ADMIN.to_owned()),
            vec![(RegionName::parse("eu").unwrap(), REGION_TOKEN.to_owned())],
        ),
        coordinator::policies::Policies::new("tail-merge", 200).unwrap(),
        10_000,
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(coordinator::run(listener, state, std::future::pending()));
    url
}

/// `escrowctl ARGS` with the admin token against `url`, `ARGS` written as
/// on a command line (no argument here holds a space).
async fn ctl(url: &str, args: &str) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_escrowctl"));
    cmd.args(["--url", url, "--token", ADMIN])
        .args(args.split_whitespace());
    cmd.output().await.unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Asserts that `out` is a success, showing its stderr if not.
fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Goal: put, show, pause, resume, add-stock, regions and audit all work
/// through the CLI, and audit's exit status tells drift and stale reports.
async fn subcommands_and_audit_exit_status(db: TestDb) {
    let url = serve(&db).await;
    let out = ctl(&url, "sku put acme/drop --total 100 --max-per-user 2").await;
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("acme/drop"));

    let out = ctl(&url, "--json sku add-stock acme/drop 5").await;
    assert_eq!(json(&out)["total"], 105);
    // The same add-stock with one key, twice: applied once.
    for _ in 0..2 {
        let out = ctl(
            &url,
            "--json --idempotency-key restock-7 sku add-stock acme/drop 7",
        )
        .await;
        assert_eq!(json(&out)["total"], 112);
    }
    let out = ctl(&url, "--json sku pause acme/drop").await;
    assert_eq!(json(&out)["paused"], true);
    let out = ctl(&url, "--json sku resume acme/drop").await;
    assert_eq!(json(&out)["paused"], false);
    let out = ctl(&url, "--json sku show acme/drop").await;
    assert_eq!(
        (
            json(&out)["pool"].as_i64(),
            json(&out)["max_per_user"].as_i64()
        ),
        (Some(112), Some(2))
    );
    assert_eq!(json(&out)["user_limit_scope"], "region");
    let out = ctl(
        &url,
        "sku put acme/limited --total 10 --user-limit-scope global",
    )
    .await;
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 (global)"));
    let out = ctl(&url, "--json sku show acme/limited").await;
    assert_eq!(json(&out)["user_limit_scope"], "global");
    let out = ctl(
        &url,
        "sku put acme/limited --total 10 --user-limit-scope region",
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "a scope is chosen at creation");
    assert!(ctl(&url, "regions").await.status.success());

    // All units in the pool, no region: nothing can be stale, drift 0.
    let out = ctl(&url, "audit").await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A region with quota in transit that never reported is stale.
    ctl(&url, "sku put acme/other --total 10 --regions eu=1").await;
    let out = ctl(&url, "audit").await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAILED"));

    // Drift: a total that no longer matches the units (CHECK pool <= total still holds).
    db.execute("DELETE FROM transfers").await;
    db.execute("DELETE FROM sku_regions WHERE sku = 'other'")
        .await;
    db.execute("UPDATE skus SET total = total + 1 WHERE sku = 'drop'")
        .await;
    let out = ctl(&url, "--json audit").await;
    assert_eq!(out.status.code(), Some(1));
    assert_ne!(json(&out)["drift_total"], 0);

    // Errors: bad id, wrong token, unknown SKU exit 2 with a message.
    assert_eq!(ctl(&url, "sku show nope").await.status.code(), Some(2));
    assert_eq!(
        ctl(&url, "sku show acme/missing").await.status.code(),
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
    let put = |extra: &str| {
        let args = format!("--json sku put acme/drop --total 50 {extra}");
        let url = url.clone();
        async move { ctl(&url, &args).await }
    };
    let out = put("").await;
    assert_eq!(
        (&json(&out)["policy"], &json(&out)["policy_is_default"]),
        (&Value::from("tail-merge"), &Value::from(true))
    );

    let out = put("--policy refill --set low_water_s=2.5 --set min_units=4").await;
    assert_success(&out);
    let shown = json(&ctl(&url, "--json sku show acme/drop").await);
    assert_eq!(shown["policy"], "refill");
    assert_eq!(shown["settings"]["low_water_s"], 2.5);
    assert_eq!(shown["settings"]["min_units"], 4);

    let out = put("--policy tail-merge --set refill.refill_s=7").await;
    assert_success(&out);
    assert_eq!(json(&out)["settings"]["refill"]["refill_s"], 7.0);

    for bad in [
        "--policy fastest",
        "--set refill.nope=1",
        "--set merge_fraction=3",
    ] {
        let out = ctl(&url, &format!("sku put acme/drop --total 50 {bad}")).await;
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("policy"),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let after = json(&ctl(&url, "--json sku show acme/drop").await);
    assert_eq!(after["policy"], "tail-merge");
    assert_eq!(after["settings"]["refill"]["refill_s"], 7.0);
}

/// The `tenant/sku` of every line of `sku list --json`'s answer.
fn listed(out: &Output) -> Vec<String> {
    assert_success(out);
    let answer = json(out);
    assert_eq!(answer["next"], Value::Null);
    test_support::api::page_ids(&answer)
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
        let out = ctl(&url, &format!("sku put {id} --total {total}")).await;
        assert!(out.status.success(), "{id}");
    }
    ctl(&url, "sku pause acme/b").await;

    let out = ctl(&url, "--json sku list acme --limit 2").await;
    assert_eq!(listed(&out), ["acme/a", "acme/b", "acme/c", "acme/d"]);
    let skus = json(&out)["skus"].as_array().unwrap().clone();
    assert_eq!(
        skus.iter()
            .map(|s| (s["total"].as_u64().unwrap(), s["pool"].as_u64().unwrap()))
            .collect::<Vec<_>>(),
        [(1, 1), (2, 2), (3, 3), (4, 4)]
    );
    assert_eq!(skus[1]["paused"], true);

    let out = ctl(&url, "--json sku list --limit 1").await;
    assert_eq!(
        listed(&out),
        ["acme/a", "acme/b", "acme/c", "acme/d", "beta/x"]
    );
    let out = ctl(&url, "--json sku list nobody").await;
    assert!(listed(&out).is_empty());

    let out = ctl(&url, "sku list beta").await;
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
    let mode = json(&ctl(&url, "--json sku show beta/x").await)["mode"].clone();
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
        "sku list --limit 0",
        "sku list acme --limit 1001",
        "sku list acme/a",
    ] {
        let out = ctl(&url, bad).await;
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(!out.stderr.is_empty(), "{bad}");
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

/// A region agent for `eu` under the coordinator at `url`, served in this
/// process on its own database (same backend as `db`, returned to be kept
/// until the agent stops), syncing every 50 ms.
async fn agent(db: &TestDb, url: &str) -> (Served, TestDb) {
    let db = db
        .sibling(
            "agent-eu",
            &region_agent::store::postgres::MIGRATOR,
            &region_agent::store::sqlite::MIGRATOR,
        )
        .await;
    let eu = RegionName::parse("eu").unwrap();
    let http = HttpCoordinator::new(
        url,
        eu.clone(),
        REGION_TOKEN.to_owned(),
        Duration::from_secs(2),
    )
    .unwrap();
    let settings = region_agent::AgentSettings {
        region: eu,
        auth: region_agent::auth::Auth::new(
            vec![(
                Tenant::parse("acme").unwrap(),
                test_support::ACME_KEY.to_owned(),
            )],
            Some(ADMIN.to_owned()),
        ),
        limits: region_agent::owner::Limits {
            max_in_flight: 64,
            max_waiting: 1024,
            wait_timeout_ms: 10_000,
        },
        coordinator: Some(Arc::new(CoordinatorLink::new(Arc::new(http), 50))),
        keys: region_agent::KeyMemory::default(),
    };
    let state = region_agent::start(
        region_agent::store::open(db.url(), 4).await.unwrap(),
        Arc::new(region_agent::clock::SystemClock),
        settings,
    )
    .await
    .unwrap();
    let served = Served::start(None, |listener, shutdown| {
        region_agent::run(listener, state, shutdown)
    })
    .await;
    (served, db)
}

/// `escrowctl ARGS` against `url`, its stdout read line by line.
fn watch(url: &str, args: &str) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_escrowctl"))
        .args(["--url", url, "--token", ADMIN])
        .args(args.split_whitespace())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// The next line of a watch, failing the test after 10 s.
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("no line from the watch within 10 s")
        .unwrap()
        .expect("the watch ended")
}

/// Goal: `sku watch --plain --once` prints one line with the SKU's pool,
/// mode and regions as the coordinator has them; `sku watch --plain`
/// prints a line per refresh whose numbers follow holds and sales made on
/// a real agent and an add-stock, with a sales rate from successive
/// polls; an unknown SKU ends the watch with exit status 2 and the answer.
async fn sku_watch_follows_a_sale(db: TestDb) {
    let url = serve(&db).await;
    let out = ctl(&url, "sku put acme/drop --total 100 --regions eu=1").await;
    assert!(out.status.success());

    let out = ctl(&url, "sku watch acme/drop --plain --once").await;
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let shown = json(&ctl(&url, "--json sku show acme/drop").await);
    for part in [
        "acme/drop".to_owned(),
        format!("mode {}", shown["mode"].as_str().unwrap()),
        format!("pool {}", shown["pool"]),
        "total 100".to_owned(),
        "| eu available 0 held 0 sold 0".to_owned(),
        // A region that never reported while its grant is in transit.
        "report - STALE".to_owned(),
    ] {
        assert!(stdout.contains(&part), "{part:?} not in {stdout}");
    }

    // With --json, the coordinator's view itself.
    let out = ctl(&url, "--json sku watch acme/drop --plain --once").await;
    assert_eq!(json(&out)["pool"], shown["pool"]);

    let (agent, _agent_db) = agent(&db, &url).await;
    let buyer = test_support::Api::new(&agent.url);
    test_support::eventually(
        "the agent's first grant",
        Duration::from_secs(10),
        async || {
            buyer.admin_sku("acme", "drop").await["available"]
                .as_i64()
                .is_some_and(|a| a > 0)
        },
    )
    .await;
    let (mut child, mut lines) = watch(&url, "sku watch acme/drop --plain --interval-ms 100");
    let first = next_line(&mut lines).await;
    for i in 0..3 {
        let key = format!("order-{i}");
        let held = buyer
            .reserve_until_final(&key, &format!("user-{i}"), "drop")
            .await;
        assert_eq!(held.status, StatusCode::CREATED, "{:?}", held.body);
        let (status, body) = buyer.action(&key, "confirm").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert!(ctl(&url, "sku add-stock acme/drop 5")
        .await
        .status
        .success());
    let mut seen = vec![first];
    while !seen.last().unwrap().contains("total 105") || !seen.last().unwrap().contains(" sold 3 ")
    {
        seen.push(next_line(&mut lines).await);
    }
    // And it goes on refreshing.
    seen.push(next_line(&mut lines).await);
    child.kill().await.unwrap();
    assert!(seen[0].contains("total 100"), "{seen:#?}");
    assert!(seen[0].contains(" sold 0 "), "{seen:#?}");
    assert!(seen.last().unwrap().contains("total 105"), "{seen:#?}");
    assert!(
        seen.iter()
            .any(|l| l.contains("| eu available") && !l.contains("STALE")),
        "the agent's reports never arrived: {seen:#?}"
    );
    // Three sales between two polls 100 ms apart show as a rate above 0.
    assert!(
        seen.iter().skip(1).any(|l| !l.contains(" sales 0.00/s")),
        "{seen:#?}"
    );

    let out = ctl(&url, "sku watch acme/missing --plain").await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("UNKNOWN_SKU"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    agent.stop().await;
}

/// Goal: a watch of a coordinator that does not answer keeps trying and
/// says so on every refresh (and `--once` exits 2), rather than giving up;
/// it ends with exit status 0 when its reader closes the pipe.
#[tokio::test]
async fn sku_watch_keeps_retrying_an_unreachable_coordinator() {
    let closed = format!("http://127.0.0.1:{}", test_support::free_port());
    let (mut child, mut lines) = watch(&closed, "sku watch acme/drop --plain --interval-ms 100");
    for _ in 0..3 {
        let line = next_line(&mut lines).await;
        assert!(line.contains("coordinator unreachable"), "{line}");
    }
    assert_eq!(child.try_wait().unwrap(), None, "the watch gave up");
    // A reader that stops reading (`| head`) ends the watch quietly.
    drop(lines);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("the watch went on printing to a closed pipe")
        .unwrap();
    assert!(status.success(), "{status}");

    let out = ctl(&closed, "sku watch acme/drop --once").await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("coordinator unreachable"));
}

/// Goal: `prune --older-than-s N` deletes what is older than N seconds and
/// says how much; a window under a minute exits 2 with the reason.
async fn prune_reports_what_it_deleted(db: TestDb) {
    let url = serve(&db).await;
    let out = ctl(&url, "--idempotency-key k1 sku put acme/drop --total 5").await;
    assert!(out.status.success(), "{out:?}");
    let out = ctl(&url, "prune --older-than-s 3600").await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "pruned: admin_keys 0, grants 0"
    );
    let age = match db.backend() {
        test_support::Backend::Postgres => {
            "UPDATE admin_requests SET created_at = created_at - interval '2 hours'"
        }
        test_support::Backend::Sqlite => {
            "UPDATE admin_requests SET created_at = created_at - 7200000"
        }
    };
    db.execute(age).await;
    let out = ctl(&url, "--json prune --older-than-s 3600").await;
    assert_eq!(json(&out)["admin_keys"], 1);
    let out = ctl(&url, "prune --older-than-s 5").await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("older_than_s"));
}

/// Goal: `cart show TENANT/KEY --region URL` shows a cart as the region
/// agent that holds it committed it; an unknown cart exits 2 with the 404.
async fn cart_show_reads_a_cart_at_its_region(db: TestDb) {
    let url = serve(&db).await;
    assert_success(&ctl(&url, "sku put acme/drop --total 10 --regions eu=1").await);
    let (agent, _agent_db) = agent(&db, &url).await;
    let buyer = test_support::Api::new(&agent.url);
    let cart = serde_json::json!({
        "request_key": "c1", "user_id": "u1", "items": [{"sku": "drop", "qty": 1}]
    });
    let mut held = false;
    for _ in 0..100 {
        if buyer.buyer_post("/v1/carts", cart.clone()).await.0 == reqwest::StatusCode::CREATED {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held, "the cart was held once the agent had units");
    let region = format!("--region {}", agent.url);
    let out = ctl(&url, &format!("--json cart show acme/c1 {region}")).await;
    assert_success(&out);
    let shown = json(&out);
    assert_eq!(shown["status"], "HELD");
    assert_eq!(
        shown["items"],
        serde_json::json!([{"sku": "drop", "qty": 1}])
    );
    let out = ctl(&url, &format!("cart show acme/c1 {region}")).await;
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("HELD"));
    let out = ctl(&url, &format!("cart show acme/nope {region}")).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("404"));
    agent.stop().await;
}
