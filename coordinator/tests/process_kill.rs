//! kill -9 between a debit and its delivery, on both sides: the coordinator
//! with grants in its outbox, and an agent with a return in its outbox.
//! After restarts every transfer arrives exactly once and drift is 0.
//! Runs the real binaries (`cargo build --workspace --bins` first).

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

fn coordinator_process(pool: &PgPool, port: u16) -> Proc {
    Proc::spawn(
        service(binary("coordinator"), port, &database_url(pool))
            .args([
                "--region-token",
                &format!("eu={},us={}", region_token("eu"), region_token("us")),
            ])
            .args(["--sync-interval-ms", &SYNC_MS.to_string()]),
    )
}

/// Sum of units and count of grants an agent's database credited.
async fn credited(db: &AgentDb) -> (i64, i64) {
    sqlx::query_as("SELECT COALESCE(sum(units), 0)::bigint, count(*) FROM applied_grants")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// Goal: the coordinator killed with -9 right after debiting grants, and
/// again repeatedly while agents sync and stock is added, loses and
/// duplicates nothing: each grant is credited once and the books settle.
#[sqlx::test(migrator = "coordinator::store::MIGRATOR")]
async fn coordinator_killed_between_debit_and_delivery(pool: PgPool) {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut coord = coordinator_process(&pool, port);
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
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM transfers WHERE state = 'PENDING'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 2);

    let eu_db = AgentDb::create(&pool, "eu").await;
    let us_db = AgentDb::create(&pool, "us").await;
    let eu = Agent::start(&eu_db, "eu", &url, None).await;
    let us = Agent::start(&us_db, "us", &url, None).await;
    let mut coord = coordinator_process(&pool, port);
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
        coord = coordinator_process(&pool, port);
        wait_ready(&url).await;
    }
    let audit = settled_audit(&admin, Duration::from_secs(30)).await;
    assert_eq!(audit["skus"].as_array().unwrap().len(), 7);
    let delivered: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT region, sum(units)::bigint, count(*) FROM transfers
         WHERE kind = 'GRANT' AND state = 'DELIVERED' GROUP BY region ORDER BY region",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let (eu_units, eu_count) = credited(&eu_db).await;
    let (us_units, us_count) = credited(&us_db).await;
    println!("coordinator kill -9: delivered {delivered:?}; eu credited {eu_units} in {eu_count}, us {us_units} in {us_count}");
    assert_eq!(delivered[0], ("eu".to_owned(), eu_units, eu_count));
    assert_eq!(delivered[1], ("us".to_owned(), us_units, us_count));
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
#[sqlx::test(migrator = "coordinator::store::MIGRATOR")]
async fn agent_killed_between_debit_and_delivery_of_a_return(pool: PgPool) {
    let (coord, admin) = Coord::with_drop(&pool).await;
    let eu_db = AgentDb::create(&pool, "eu").await;
    let port = free_port();
    let agent_url = format!("http://127.0.0.1:{port}");
    // A slow sync leaves a wide window between a debit and its delivery.
    let spawn_eu = || {
        Proc::spawn(
            service(binary("region-agent"), port, &eu_db.url())
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
        async || {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_returns")
                .fetch_one(&eu_db.pool)
                .await
                .unwrap();
            n > 0
        },
    )
    .await;
    eu.kill9();
    let seen_under_lock: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transfers WHERE kind = 'RETURN'")
            .fetch_one(&pool)
            .await
            .unwrap();
    hold_returns.rollback().await.unwrap();
    let (return_id, units): (String, i64) = sqlx::query_as("SELECT id, units FROM outbox_returns")
        .fetch_one(&eu_db.pool)
        .await
        .unwrap();
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
        async || {
            let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_returns")
                .fetch_one(&eu_db.pool)
                .await
                .unwrap();
            left == 0
        },
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
