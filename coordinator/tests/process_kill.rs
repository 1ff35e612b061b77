//! kill -9 between a debit and its delivery, on both sides: the coordinator
//! with grants in its outbox, and an agent with a return in its outbox.
//! After restarts every transfer arrives exactly once and drift is 0.
//! Runs the real binaries (`cargo build --workspace --bins` first).
//!
//! The coordinator's kill runs on both backends. The agent's kill is
//! PostgreSQL only: it holds the window between the agent's debit and its
//! delivery open by locking the coordinator's `transfers` table against
//! new returns while the admin change that recalls the units commits.
//! SQLite has no lock finer than the file's one write lock, which would
//! hold back that admin change too, and without a lock the agent delivers
//! its return at once, so the window cannot be held open there.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

coordinator_tests!(coordinator_killed_between_debit_and_delivery);
postgres_only!(
    migrator: coordinator::store::POSTGRES_MIGRATOR;
    agent_killed_between_debit_and_delivery_of_a_return,
);

fn coordinator_process(db: &TestDb, port: u16) -> Proc {
    Proc::spawn(
        service(binary("coordinator"), port, db.url())
            .args([
                "--region-token",
                &format!("eu={},us={}", region_token("eu"), region_token("us")),
            ])
            .args(["--sync-interval-ms", &SYNC_MS.to_string()]),
    )
}

/// Sum of units and count of grants an agent's database credited.
async fn credited(db: &TestDb) -> (i64, i64) {
    let found = db
        .ints("SELECT CAST(COALESCE(sum(units), 0) AS bigint), count(*) FROM applied_grants")
        .await;
    (found[0], found[1])
}

/// Sum of units and count of grants the coordinator marked delivered to `region`.
async fn delivered(db: &TestDb, region: &str) -> (i64, i64) {
    let found = db
        .ints(&format!(
            "SELECT CAST(COALESCE(sum(units), 0) AS bigint), count(*) FROM transfers
             WHERE kind = 'GRANT' AND state = 'DELIVERED' AND region = '{region}'"
        ))
        .await;
    (found[0], found[1])
}

/// Goal: the coordinator killed with -9 right after debiting grants, and
/// again repeatedly while agents sync and stock is added, loses and
/// duplicates nothing: each grant is credited once and the books settle.
async fn coordinator_killed_between_debit_and_delivery(db: TestDb) {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut coord = coordinator_process(&db, port);
    wait_ready(&url).await;
    let admin = Api::new(&url);
    let (status, _) = admin
        .put_sku(
            "acme",
            "drop",
            json!({"total": 300, "regions": {"eu": 1, "us": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    // Grants are debited and PENDING; no agent has them yet.
    coord.kill9();
    let pending = db
        .int("SELECT count(*) FROM transfers WHERE state = 'PENDING'")
        .await;
    assert_eq!(pending, 2);

    let eu_db = agent_db(&db, "eu").await;
    let us_db = agent_db(&db, "us").await;
    let eu = Agent::start(&eu_db, "eu", &url, None).await;
    let us = Agent::start(&us_db, "us", &url, None).await;
    let mut coord = coordinator_process(&db, port);
    wait_ready(&url).await;
    for round in 0..6u64 {
        // A new SKU's initial split: grants debited and waiting for the agents.
        let (status, _) = admin
            .put_sku(
                "acme",
                &format!("more-{round}"),
                json!({"total": 50, "regions": {"eu": 1, "us": 1}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED);
        // Kill at varying points of the delivery: after 0, 1, 2 or 3 more
        // sync attempts of the agents.
        let syncs =
            || eu.wire.syncs.load(Ordering::Relaxed) + us.wire.syncs.load(Ordering::Relaxed);
        let before = syncs();
        eventually("the agents sync", Duration::from_secs(10), async || {
            syncs() >= before + round % 4
        })
        .await;
        coord.kill9();
        // Each agent finds the coordinator gone before it comes back.
        let (eu_before, us_before) = (
            eu.wire.syncs.load(Ordering::Relaxed),
            us.wire.syncs.load(Ordering::Relaxed),
        );
        eventually(
            "both agents try a sync against the dead coordinator",
            Duration::from_secs(10),
            async || {
                eu.wire.syncs.load(Ordering::Relaxed) > eu_before
                    && us.wire.syncs.load(Ordering::Relaxed) > us_before
            },
        )
        .await;
        coord = coordinator_process(&db, port);
        wait_ready(&url).await;
    }
    let audit = settled_audit(&admin, Duration::from_secs(30)).await;
    assert_eq!(audit["skus"].as_array().unwrap().len(), 7);
    let sent = [delivered(&db, "eu").await, delivered(&db, "us").await];
    let received = [credited(&eu_db).await, credited(&us_db).await];
    println!(
        "coordinator kill -9: (units, grants) delivered to eu, us {sent:?}; credited {received:?}"
    );
    assert_eq!(sent, received);
    for sku in audit["skus"].as_array().unwrap() {
        for region in ["eu", "us"] {
            let line = &sku["regions"][region];
            assert_eq!(line["leased"], line["available"], "{region}: {line}");
        }
    }
    eu.stop().await;
    us.stop().await;
    drop(coord);
}

/// Goal: an agent killed with -9 after debiting a return (the return is in
/// its outbox, the coordinator has not seen it) delivers it exactly once
/// after restart; the region's units reach the pool once and drift is 0.
async fn agent_killed_between_debit_and_delivery_of_a_return(pool: PgPool) {
    let db = TestDb::postgres(pool.clone());
    let (coord, admin) = Coord::with_drop(&db).await;
    let eu_db = agent_db(&db, "eu").await;
    let port = free_port();
    let agent_url = format!("http://127.0.0.1:{port}");
    // A slow sync leaves a wide window between a debit and its delivery.
    let spawn_eu = || {
        Proc::spawn(
            service(binary("region-agent"), port, eu_db.url())
                .args(["--region", "eu", "--coordinator-url", &coord.url])
                .args(["--region-token", &region_token("eu")])
                .args(["--tenant-key", &format!("acme={ACME_KEY}")])
                .args(["--sync-interval-ms", "1000"]),
        )
    };
    let mut eu = spawn_eu();
    wait_ready(&agent_url).await;
    eventually("eu holds its quota", Duration::from_secs(20), async || {
        admin.admin_sku("acme", "drop").await["regions"]["eu"]["leased"] == 40
    })
    .await;

    // Returns cannot be recorded while this lock is held: eu's delivery
    // waits, so the window between its debit and the delivery stays open
    // (the agent syncs at once after a return, so timing cannot open it).
    let mut hold_returns = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE transfers IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *hold_returns)
        .await
        .unwrap();
    // Take eu out of the SKU: the coordinator recalls all of its free units.
    admin
        .put_sku("acme", "drop", json!({"total": 100, "regions": {"us": 1}}))
        .await;
    eventually(
        "eu debited its return",
        Duration::from_secs(20),
        async || eu_db.int("SELECT count(*) FROM outbox_returns").await > 0,
    )
    .await;
    eu.kill9();
    let seen_under_lock: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transfers WHERE kind = 'RETURN'")
            .fetch_one(&pool)
            .await
            .unwrap();
    hold_returns.rollback().await.unwrap();
    let return_id = eu_db.texts("SELECT id FROM outbox_returns").await.remove(0);
    let units = eu_db.int("SELECT units FROM outbox_returns").await;
    assert_eq!(
        (seen_under_lock, units),
        (0, 40),
        "killed after the debit, before the delivery"
    );
    admin.assert_no_drift().await;

    let _eu = spawn_eu();
    wait_ready(&agent_url).await;
    eventually(
        "the return arrives and is forgotten",
        Duration::from_secs(20),
        async || eu_db.int("SELECT count(*) FROM outbox_returns").await == 0,
    )
    .await;
    let returns: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, units FROM transfers WHERE kind = 'RETURN'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        returns,
        vec![(return_id, 40)],
        "the return applied exactly once"
    );
    eventually(
        "eu reports its empty lease",
        Duration::from_secs(20),
        async || {
            let line = admin.admin_sku("acme", "drop").await["regions"]["eu"].clone();
            line["leased"] == 0 && line["available"] == 0 && line["region_drift"] == 0
        },
    )
    .await;
    admin.assert_no_drift().await;
    coord.stop().await;
}
