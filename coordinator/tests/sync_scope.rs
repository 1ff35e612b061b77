//! What a sync touches: each SKU in its own short transaction, never a
//! lock across SKUs, and in a delta sync only the SKUs that changed or
//! have news for the region.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

coordinator_tests!(a_delta_sync_answers_what_changed_and_the_news);
postgres_only!(
    migrator: coordinator::store::POSTGRES_MIGRATOR;
    a_sync_never_holds_a_lock_across_skus,
);

/// A sync at (1, `seq`) reporting `available` units of each SKU named.
fn sync_body(seq: u64, full: bool, reports: &[(&str, u64)], acks: Vec<Value>) -> Value {
    let skus: Vec<Value> = reports
        .iter()
        .map(|(sku, available)| {
            json!({"tenant": "acme", "sku": sku, "available": available, "held": 0, "sold": 0,
                   "sale_rate_per_s": 0.0})
        })
        .collect();
    json!({"epoch": 1, "seq": seq, "rtt_ms": 0, "acks": acks, "returns": [], "skus": skus,
           "full": full})
}

/// The SKU names of a sync answer's directives.
fn directed(body: &Value) -> Vec<&str> {
    body["skus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["sku"].as_str().unwrap())
        .collect()
}

/// Goal: a full sync answers every SKU's directive (those that did not
/// change from one read, without locks); a delta sync answers only the
/// SKUs it reports, those with grants in transit and the region's news
/// (here an admin's pause, once); a region first seen since the
/// coordinator started gets everything. The audit stays exact.
async fn a_delta_sync_answers_what_changed_and_the_news(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let (status, body) = admin
        .put_sku(
            "acme",
            "gift",
            json!({"total": 50, "regions": {"eu": 1, "us": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let (status, first) = region_call(&coord, "eu", "sync", sync_body(1, true, &[], vec![])).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(directed(&first), ["drop", "gift"]);
    let grants = first["grants"].as_array().unwrap();
    let units = |sku: &str| -> u64 {
        grants
            .iter()
            .filter(|g| g["sku"] == sku)
            .map(|g| g["units"].as_u64().unwrap())
            .sum()
    };
    let acks: Vec<Value> = grants.iter().map(|g| g["id"].clone()).collect();
    let credited = [("drop", units("drop")), ("gift", units("gift"))];
    let (status, body) =
        region_call(&coord, "eu", "sync", sync_body(2, false, &credited, acks)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(directed(&body), ["drop", "gift"], "both reported");
    assert_eq!(body["grants"], json!([]));

    let (status, body) = region_call(&coord, "eu", "sync", sync_body(3, false, &[], vec![])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        directed(&body),
        Vec::<&str>::new(),
        "nothing changed, nothing owed"
    );

    let (status, body) = admin
        .admin_post("/v1/admin/skus/acme/drop/pause", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = region_call(&coord, "eu", "sync", sync_body(4, false, &[], vec![])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(directed(&body), ["drop"], "the pause is news");
    assert_eq!(body["skus"][0]["paused"], true);
    let (status, body) = region_call(&coord, "eu", "sync", sync_body(5, false, &[], vec![])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(directed(&body), Vec::<&str>::new(), "news is answered once");

    let (status, body) =
        region_call(&coord, "eu", "sync", sync_body(6, true, &credited, vec![])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(directed(&body), ["drop", "gift"], "full: every directive");
    assert_eq!(
        body["skus"][0]["paused"], true,
        "read, not locked, and current"
    );

    let (status, body) = region_call(&coord, "us", "sync", sync_body(1, false, &[], vec![])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(directed(&body), ["drop", "gift"], "first seen: everything");
    let eu = admin.admin_sku("acme", "drop").await["regions"]["eu"].clone();
    assert_eq!(eu["available"].as_u64(), Some(credited[0].1));
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a sync locks one SKU at a time. With one SKU's row held by the
/// test, a full sync of eu waits on that SKU, and meanwhile a take on a
/// SKU that sorts before it (which a sync locking every SKU of its region
/// would still hold) and another region's sync over the same SKUs are
/// answered; once the row is free the waiting sync completes with every
/// directive, and the audit is exact.
async fn a_sync_never_holds_a_lock_across_skus(pool: PgPool) {
    let db = TestDb::postgres(pool.clone());
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    let names: Vec<String> = (0..12).map(|i| format!("s{i:02}")).collect();
    for sku in &names {
        let (status, body) = admin
            .put_sku(
                "acme",
                sku,
                // A take must find units in the pool: keep a fifth there.
                json!({"total": 100, "regions": {"eu": 1, "us": 1},
                       "settings": {"refill": {"reserve_fraction": 0.2}}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    for region in ["eu", "us"] {
        let (status, first) =
            region_call(&coord, region, "sync", sync_body(1, true, &[], vec![])).await;
        assert_eq!(status, StatusCode::OK, "{first}");
        let grants = first["grants"].as_array().unwrap();
        let credited: Vec<(&str, u64)> = grants
            .iter()
            .map(|g| (g["sku"].as_str().unwrap(), g["units"].as_u64().unwrap()))
            .collect();
        let acks = grants.iter().map(|g| g["id"].clone()).collect();
        let (status, body) =
            region_call(&coord, region, "sync", sync_body(2, false, &credited, acks)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM skus WHERE sku = 's05' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // Every SKU's demand moved, so eu's full sync has each SKU to apply.
    let reports: Vec<(&str, u64)> = names.iter().map(|sku| (sku.as_str(), 40)).collect();
    let mut busy = sync_body(3, true, &reports, vec![]);
    for report in busy["skus"].as_array_mut().unwrap() {
        report["sale_rate_per_s"] = json!(2.0);
    }
    let waiting = {
        let coord_url = coord.url.clone();
        tokio::spawn(async move {
            let r = client()
                .post(format!("{coord_url}/v1/regions/eu/sync"))
                .bearer_auth(region_token("eu"))
                .json(&busy)
                .send()
                .await
                .unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        })
    };
    eventually(
        "eu's sync waits on s05",
        Duration::from_secs(10),
        async || {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            waiting >= 1
        },
    )
    .await;

    let take = json!({"id": "t-us-1", "tenant": "acme", "sku": "s00", "units": 1});
    let (status, body) = region_call(&coord, "us", "take", take).await;
    assert_eq!(status, StatusCode::OK, "a take on s00 is answered: {body}");
    assert_eq!(body["grant"]["units"], 1);
    let (status, body) = region_call(
        &coord,
        "us",
        "sync",
        sync_body(3, false, &[("s00", 41), ("s11", 40)], vec![json!("t-us-1")]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "us's sync is answered: {body}");
    assert!(!waiting.is_finished(), "eu's sync still waits on s05");

    lock.commit().await.unwrap();
    let (status, body) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(directed(&body).len(), names.len());
    admin.assert_no_drift().await;
    coord.stop().await;
}
