//! Retention: `POST /v1/admin/prune` deletes released and expired
//! reservations (and confirmed grants) older than a window, and their keys
//! leave memory; sales, live holds and the counters stay as they were.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

conformance!(
    prune_deletes_only_what_ended_before_the_window,
    prune_needs_the_admin_and_a_window_of_a_minute,
);

async fn prune(api: &Api, older_than_s: u64) -> (StatusCode, Value) {
    api.admin_post(
        "/v1/admin/prune",
        Some(json!({"older_than_s": older_than_s})),
    )
    .await
}

/// Goal: six holds of 1 s: two confirmed (SOLD), two released, two left to
/// expire; and two carts, one released, one confirmed. An hour and a
/// second later, a prune of what ended over an hour ago deletes exactly
/// the four released or expired holds and the released cart with its item;
/// the sold ones stay (the counters are checked against them); a pruned
/// key is unknown (404) and the audit is clean. A second prune finds nothing; holds newer
/// than the window are kept.
async fn prune_deletes_only_what_ended_before_the_window(db: TestDb) {
    let agent = TestAgent::start_manual(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 10, "hold_ttl_ms": 1000}))
        .await;
    for i in 0..6 {
        assert_eq!(
            api.reserve(&format!("k{i}"), &format!("u{i}"), "drop")
                .await
                .0,
            StatusCode::CREATED
        );
    }
    for (cart, then) in [("c1", "release"), ("c2", "confirm")] {
        let body =
            json!({"request_key": cart, "user_id": format!("u{cart}"), "items": [{"sku": "drop"}]});
        assert_eq!(
            api.buyer_post("/v1/carts", body).await.0,
            StatusCode::CREATED
        );
        let (status, _) = api
            .buyer_post(&format!("/v1/carts/{cart}/{then}"), json!({}))
            .await;
        assert_eq!(status, StatusCode::OK, "{cart} {then}");
    }
    for (key, action) in [
        ("k0", "confirm"),
        ("k1", "confirm"),
        ("k2", "release"),
        ("k3", "release"),
    ] {
        assert_eq!(
            api.action(key, action).await.0,
            StatusCode::OK,
            "{key} {action}"
        );
    }
    agent.advance(3_600_000 + 1_001);
    eventually(
        "the last two holds expire",
        Duration::from_secs(5),
        async || stored(&db, "drop").await.rows_expired == 2,
    )
    .await;
    // A hold made now ends within the window: it stays.
    assert_eq!(
        api.reserve("fresh", "u9", "drop").await.0,
        StatusCode::CREATED
    );

    let (status, body) = prune(&api, 3_600).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"reservations": 5, "grants": 0, "carts": 1}));
    assert_eq!(
        reservation_keys(&db).await,
        ["c2/drop", "fresh", "k0", "k1"]
    );
    assert_eq!(api.buyer_get("/v1/carts/c1").await.0, StatusCode::NOT_FOUND);
    assert_eq!(api.buyer_get("/v1/carts/c2").await.1["status"], "SOLD");
    for key in ["k2", "k3", "k4", "k5"] {
        assert_eq!(api.get(key).await.0, StatusCode::NOT_FOUND, "{key}");
    }
    assert_eq!(api.get("k0").await.1["status"], "SOLD");
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.sold, s.held, s.available), (3, 1, 6));
    api.assert_no_drift().await;

    let (_, again) = prune(&api, 3_600).await;
    assert_eq!(again, json!({"reservations": 0, "grants": 0, "carts": 0}));
    agent.stop().await;
}

/// Goal: a prune without the admin token is 401, one with a window under
/// a minute (or none) is 400, and neither deletes anything.
async fn prune_needs_the_admin_and_a_window_of_a_minute(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 2})).await;
    api.reserve("k", "u", "drop").await;
    api.action("k", "release").await;
    let url = format!("{}/v1/admin/prune", api.url);
    let anonymous = api
        .client
        .post(&url)
        .json(&json!({"older_than_s": 3600}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(prune(&api, 59).await.0, StatusCode::BAD_REQUEST);
    let (status, _) = api.admin_post("/v1/admin/prune", Some(json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(reservation_keys(&db).await, ["k"]);
    agent.stop().await;
}
