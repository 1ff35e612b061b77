//! Retention at the coordinator: `POST /v1/admin/prune` deletes grants
//! delivered and admin idempotency keys recorded before a window; the
//! books, the audit and selling are untouched.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::json;

coordinator_tests!(prune_deletes_delivered_grants_and_old_admin_keys);

/// Goal: a SKU split to eu and us (two grants, delivered) and created with
/// an idempotency key. Made two hours old behind the coordinator's back, a
/// prune of what is over an hour old deletes both grants and the key, and
/// nothing else: the audit stays at drift 0 and eu still sells. Without
/// the admin token 401; a window under a minute 400; neither deletes.
async fn prune_deletes_delivered_grants_and_old_admin_keys(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    let created = admin
        .client
        .put(format!("{}/v1/admin/skus/acme/drop", coord.url))
        .bearer_auth(ADMIN)
        .header("Idempotency-Key", "create-drop")
        .json(&json!({"total": 100, "regions": {"eu": 1, "us": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let eu_db = agent_db(&db, "eu").await;
    let us_db = agent_db(&db, "us").await;
    let eu = Agent::start(&eu_db, "eu", &coord.url, None).await;
    let us = Agent::start(&us_db, "us", &coord.url, None).await;
    settled_audit(&admin, Duration::from_secs(20)).await;
    let delivered = "SELECT count(*) FROM transfers WHERE kind = 'GRANT' AND state = 'DELIVERED'";
    let grants = db.int(delivered).await;
    assert!(grants >= 2, "the initial split's grants are delivered");
    let age = match db.backend() {
        Backend::Postgres => [
            "UPDATE transfers SET delivered_at = delivered_at - interval '2 hours'",
            "UPDATE admin_requests SET created_at = created_at - interval '2 hours'",
        ],
        Backend::Sqlite => [
            "UPDATE transfers SET delivered_at = delivered_at - 7200000",
            "UPDATE admin_requests SET created_at = created_at - 7200000",
        ],
    };
    for sql in age {
        db.execute(sql).await;
    }

    let prune = async |body| admin.admin_post("/v1/admin/prune", Some(body)).await;
    assert_eq!(
        prune(json!({"older_than_s": 59})).await.0,
        StatusCode::BAD_REQUEST
    );
    let anonymous = admin
        .client
        .post(format!("{}/v1/admin/prune", coord.url))
        .json(&json!({"older_than_s": 3600}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        db.int(delivered).await,
        grants,
        "refused prunes delete nothing"
    );

    let (status, body) = prune(json!({"older_than_s": 3600})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Grants delivered within the last hour (refills after the split) stay.
    let left = db.int(delivered).await;
    assert_eq!(body["grants"].as_i64().unwrap(), grants - left);
    assert!(left < grants);
    assert_eq!(body["admin_keys"], 1);
    assert_eq!(db.int("SELECT count(*) FROM admin_requests").await, 0);

    admin.assert_no_drift().await;
    assert_eq!(
        eu.buyer().reserve("k", "u", "drop").await.0,
        StatusCode::CREATED
    );
    settled_audit(&admin, Duration::from_secs(20)).await;
    eu.stop().await;
    us.stop().await;
    coord.stop().await;
}
