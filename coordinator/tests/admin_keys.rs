//! Admin changes with an `Idempotency-Key`: a retried change is applied
//! once, concurrent retries too, and a key reused for another change is
//! refused without applying it.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

coordinator_tests!(
    a_retried_admin_change_applies_once,
    a_key_reused_for_another_change_is_refused,
);

/// Sends an admin POST with `key` as its Idempotency-Key: status, body and
/// whether the answer says the change was applied before.
async fn post_with_key(
    admin: &Api,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (StatusCode, Value, bool) {
    let mut request = admin
        .client
        .post(format!("{}{path}", admin.url))
        .bearer_auth(ADMIN)
        .header("Idempotency-Key", key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    (response.status(), response.json().await.unwrap(), replayed)
}

/// Goal: add-stock sent three times in a row and eight times at once with
/// one key adds its units once (without a key each call adds); a retried
/// create answers 200 replayed, a retried pause with its key too.
async fn a_retried_admin_change_applies_once(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    admin.put_sku("acme", "drop", json!({"total": 100})).await;
    let add = "/v1/admin/skus/acme/drop/add-stock";

    let mut replays = 0;
    for _ in 0..3 {
        let (status, body, replayed) =
            post_with_key(&admin, add, "restock-1", Some(json!({"qty": 5}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["total"], 105);
        replays += usize::from(replayed);
    }
    assert_eq!(replays, 2);

    let at_once: Vec<_> = (0..8)
        .map(|_| {
            let admin = admin.clone();
            tokio::spawn(async move {
                post_with_key(&admin, add, "restock-2", Some(json!({"qty": 7}))).await
            })
        })
        .collect();
    let mut applied = 0;
    for call in at_once {
        let (status, _, replayed) = call.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        applied += usize::from(!replayed);
    }
    assert_eq!(applied, 1);
    assert_eq!(admin.admin_sku("acme", "drop").await["total"], 112);

    // Without a key, each call is a change of its own.
    admin.admin_post(add, Some(json!({"qty": 1}))).await;
    admin.admin_post(add, Some(json!({"qty": 1}))).await;
    assert_eq!(admin.admin_sku("acme", "drop").await["total"], 114);

    let (status, _, replayed) =
        post_with_key(&admin, "/v1/admin/skus/acme/drop/pause", "p-1", None).await;
    assert_eq!((status, replayed), (StatusCode::OK, false));
    admin
        .admin_post("/v1/admin/skus/acme/drop/resume", None)
        .await;
    let (_, body, replayed) =
        post_with_key(&admin, "/v1/admin/skus/acme/drop/pause", "p-1", None).await;
    assert!(replayed);
    assert_eq!(
        body["paused"], false,
        "the replayed pause did not pause again"
    );

    let put = |key: &'static str| {
        let admin = admin.clone();
        async move {
            let response = admin
                .client
                .put(format!("{}/v1/admin/skus/acme/new", admin.url))
                .bearer_auth(ADMIN)
                .header("Idempotency-Key", key)
                .json(&json!({"total": 10}))
                .send()
                .await
                .unwrap();
            response.status()
        }
    };
    assert_eq!(put("create-1").await, StatusCode::CREATED);
    assert_eq!(put("create-1").await, StatusCode::OK);
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a key already used for one change, sent with another change (other
/// quantity, other SKU, other verb), is 409 and nothing of it is applied.
async fn a_key_reused_for_another_change_is_refused(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    admin.put_sku("acme", "drop", json!({"total": 100})).await;
    admin.put_sku("acme", "other", json!({"total": 100})).await;
    let (status, _, _) = post_with_key(
        &admin,
        "/v1/admin/skus/acme/drop/add-stock",
        "k",
        Some(json!({"qty": 5})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    for (path, body) in [
        (
            "/v1/admin/skus/acme/drop/add-stock",
            Some(json!({"qty": 6})),
        ),
        (
            "/v1/admin/skus/acme/other/add-stock",
            Some(json!({"qty": 5})),
        ),
        ("/v1/admin/skus/acme/drop/pause", None),
    ] {
        let (status, body, _) = post_with_key(&admin, path, "k", body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains("Idempotency-Key"),
            "{body}"
        );
    }
    let drop = admin.admin_sku("acme", "drop").await;
    assert_eq!(
        (&drop["total"], &drop["paused"]),
        (&json!(105), &json!(false))
    );
    assert_eq!(admin.admin_sku("acme", "other").await["total"], 100);
    coord.stop().await;
}
