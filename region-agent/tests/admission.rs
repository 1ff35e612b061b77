//! Admission and the cheap paths: bounded queues answered with 503 before
//! anything is written, sold out and SKU status answered from memory, and
//! the operational endpoints.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use region_agent::owner::Limits;
use reqwest::StatusCode;
use serde_json::json;

conformance!(
    full_queue_and_wait_timeout_refuse_before_writing,
    sold_out_is_answered_without_the_database,
    pause_stops_selling_and_resume_restarts,
    admin_changes_never_oversell,
    health_readiness_and_metrics,
);

/// Goal: with the owner busy and its queue full, a request is refused at
/// once with REJECTED_QUEUE_FULL; one that waited past its deadline gets
/// REJECTED_WAIT_TIMEOUT; neither wrote anything, and both keys succeed on retry.
async fn full_queue_and_wait_timeout_refuse_before_writing(db: TestDb) {
    let limits = Limits {
        max_in_flight: 1,
        max_waiting: 1,
        wait_timeout_ms: 1_000,
    };
    let clock = std::sync::Arc::new(region_agent::clock::ManualClock::new(1_800_000_000_000));
    let agent = TestAgent::start_with(&db, limits, Some(clock.clone())).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 10})).await;

    let (locker, first) = agent.reserve_held_at_commit(&db, "a", "ua", "drop").await;
    let second = api.spawn_reserve("b", "ub", "drop");
    let handle = agent.owner("acme", "drop");
    eventually(
        "the second request is queued",
        Duration::from_secs(10),
        async || handle.queue.capacity() == 0,
    )
    .await;
    // A held queue sender would keep the owner alive past shutdown.
    drop(handle);

    let r = api
        .client
        .post(format!("{}/v1/reservations", api.url))
        .bearer_auth(ACME_KEY)
        .json(&json!({"request_key": "c", "user_id": "uc", "sku": "drop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["outcome"],
        "REJECTED_QUEUE_FULL"
    );

    clock.advance(1_001);
    locker.release().await;
    let (s1, b1) = first.await.unwrap();
    let (s2, b2) = second.await.unwrap();
    assert_eq!(
        (s1, b1["outcome"].as_str()),
        (StatusCode::CREATED, Some("HELD"))
    );
    assert_eq!(
        (s2, b2["outcome"].as_str()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("REJECTED_WAIT_TIMEOUT")
        )
    );

    let keys = reservation_keys(&db).await;
    assert_eq!(
        keys,
        vec!["a".to_owned()],
        "the refused requests wrote nothing"
    );
    assert_eq!(api.reserve("b", "ub", "drop").await.0, StatusCode::CREATED);
    assert_eq!(api.reserve("c", "uc", "drop").await.0, StatusCode::CREATED);
    assert_balanced(&stored(&db, "drop").await);
    agent.stop().await;
}

/// Goal: once sold out, SOLD_OUT and the SKU status are answered while the
/// database is completely locked: the rejection path never touches it. A
/// retry of a key that holds a reservation still gets REPLAY, not SOLD_OUT.
async fn sold_out_is_answered_without_the_database(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 1})).await;
    assert_eq!(
        api.reserve("winner", "w", "drop").await.0,
        StatusCode::CREATED
    );

    // On SQLite, readers are never blocked (WAL): there the test shows
    // that the rejection path waits for no write.
    let locker = db.lock_all().await;

    let answer = tokio::time::timeout(Duration::from_secs(3), async {
        let mut outcomes = Vec::new();
        for i in 0..200 {
            let (status, body) = api
                .reserve(&format!("loser-{i}"), &format!("l{i}"), "drop")
                .await;
            outcomes.push((status, body["outcome"].as_str().map(str::to_owned)));
        }
        let r = api
            .client
            .get(format!("{}/v1/skus/drop", api.url))
            .bearer_auth(ACME_KEY)
            .send()
            .await
            .unwrap();
        (
            outcomes,
            r.headers()["cache-control"].clone(),
            r.json::<serde_json::Value>().await.unwrap(),
        )
    })
    .await
    .expect("answered while the database was locked");
    let (outcomes, cache, status) = answer;
    assert!(outcomes
        .iter()
        .all(|(s, o)| *s == StatusCode::CONFLICT && o.as_deref() == Some("SOLD_OUT")));
    assert_eq!(cache, "public, max-age=1");
    assert_eq!(
        status,
        json!({"sku": "drop", "available": 0, "sold_out": true})
    );
    locker.release().await;

    let (s, body) = api.reserve("winner", "w", "drop").await;
    assert_eq!(
        (s, body["outcome"].as_str()),
        (StatusCode::OK, Some("REPLAY"))
    );
    assert_eq!(db.int("SELECT count(*) FROM reservations").await, 1);
    assert_balanced(&stored(&db, "drop").await);
    agent.stop().await;
}

/// Goal: a paused SKU answers 503 PAUSED (reason `admin_pause`) with
/// Retry-After and writes nothing; resumed, it sells; confirm still works while paused.
async fn pause_stops_selling_and_resume_restarts(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 5})).await;
    assert_eq!(api.reserve("k1", "u1", "drop").await.0, StatusCode::CREATED);
    assert_eq!(
        api.admin_post("/v1/admin/skus/acme/drop/pause", None)
            .await
            .0,
        StatusCode::OK
    );
    let r = api
        .client
        .post(format!("{}/v1/reservations", api.url))
        .bearer_auth(ACME_KEY)
        .json(&json!({"request_key": "k2", "user_id": "u2", "sku": "drop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let body = r.json::<serde_json::Value>().await.unwrap();
    assert_eq!(body["outcome"], "PAUSED");
    assert_eq!(body["reason"], "admin_pause", "{body}");
    assert_eq!(api.action("k1", "confirm").await.0, StatusCode::OK);
    assert_eq!(
        api.admin_post("/v1/admin/skus/acme/drop/resume", None)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(api.reserve("k2", "u2", "drop").await.0, StatusCode::CREATED);
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.sold, s.held, s.available), (1, 1, 3));
    agent.stop().await;
}

/// Goal: admin changes keep the invariant: add-stock adds to available,
/// lowering the total below what is held or sold is 409 and changes
/// nothing, lowering it within available works, settings apply.
async fn admin_changes_never_oversell(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 3})).await;
    for i in 0..3 {
        api.reserve(&format!("k{i}"), &format!("u{i}"), "drop")
            .await;
    }
    let (s, body) = api.put_sku("acme", "drop", json!({"total": 2})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    let (s, body) = api
        .admin_post(
            "/v1/admin/skus/acme/drop/add-stock",
            Some(json!({"qty": 5})),
        )
        .await;
    assert_eq!(
        (s, body["available"].as_u64(), body["total"].as_u64()),
        (StatusCode::OK, Some(5), Some(8))
    );
    let (s, body) = api
        .put_sku("acme", "drop", json!({"total": 4, "max_per_user": 2}))
        .await;
    assert_eq!(
        (s, body["available"].as_u64(), body["max_per_user"].as_u64()),
        (StatusCode::OK, Some(1), Some(2))
    );
    let (s, body) = api.admin_get("/v1/admin/skus/acme/drop").await;
    assert_eq!(
        (s, body["held"].as_u64(), body["total"].as_u64()),
        (StatusCode::OK, Some(3), Some(4))
    );
    assert_eq!(
        api.admin_get("/v1/admin/skus/acme/nope").await.0,
        StatusCode::NOT_FOUND
    );
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.total, s.available), (4, 1));
    api.assert_no_drift().await;
    agent.stop().await;
}

/// Goal: the operational endpoints answer and the metrics the issue names exist.
async fn health_readiness_and_metrics(db: TestDb) {
    let agent = TestAgent::start_manual(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 1, "hold_ttl_ms": 1000}))
        .await;
    api.reserve("k", "u", "drop").await;
    api.reserve("k2", "u2", "drop").await;
    agent.advance(1_000);
    eventually("the hold expires", Duration::from_secs(5), async || {
        stored(&db, "drop").await.available == 1
    })
    .await;
    for path in ["/healthz", "/readyz"] {
        let r = api
            .client
            .get(format!("{}{path}", api.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let text = api
        .client
        .get(format!("{}/metrics", api.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "escrow_reservations_total{outcome=\"HELD\"}",
        "escrow_reservations_total{outcome=\"SOLD_OUT\"}",
        "escrow_batch_size_bucket",
        "escrow_commit_seconds_bucket",
        "escrow_queue_depth",
        "escrow_expired_units_total",
        "escrow_drift_units",
    ] {
        assert!(text.contains(name), "metrics lack {name}");
    }
    assert_balanced(&stored(&db, "drop").await);
    agent.stop().await;
}
