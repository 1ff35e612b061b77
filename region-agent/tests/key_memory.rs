//! Request keys leave memory once they are older than the idempotency
//! window, and a retry of such a key is still answered as the contract
//! says: from the database, never as a new buyer.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use region_agent::KeyMemory;
use reqwest::StatusCode;
use serde_json::json;

conformance!(a_key_that_left_memory_is_answered_from_the_database);

/// An agent whose keys stay in memory for 300 to 600 ms.
async fn agent_with_short_window(db: &TestDb) -> TestAgent {
    let mut settings = settings(limits());
    settings.keys = KeyMemory {
        window_ms: 300,
        filter_capacity: 10_000,
    };
    TestAgent::start_with_settings(db, settings, None).await
}

/// Goal: once a sold-out SKU's keys have left memory, a retry of a key
/// still gets REPLAY (or KEY_REUSED for another buyer), a confirm of a key
/// memory forgot still sells its hold, and a new buyer still gets
/// SOLD_OUT; after a restart, keys older than the window are not loaded
/// into memory, and their retries are answered the same.
async fn a_key_that_left_memory_is_answered_from_the_database(db: TestDb) {
    let agent = agent_with_short_window(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 2})).await;
    for (key, user) in [("k1", "u1"), ("k2", "u2")] {
        assert_eq!(api.reserve(key, user, "drop").await.0, StatusCode::CREATED);
    }
    assert_eq!(api.action("k1", "confirm").await.0, StatusCode::OK);
    eventually(
        "every key leaves memory",
        Duration::from_secs(5),
        async || agent.state.keys().is_empty(),
    )
    .await;

    let (status, body) = api.reserve("k1", "u1", "drop").await;
    assert_eq!(
        (status, &body["outcome"], &body["reservation"]["status"]),
        (StatusCode::OK, &json!("REPLAY"), &json!("SOLD")),
        "{body}"
    );
    let (status, body) = api.reserve("k1", "someone-else", "drop").await;
    assert_eq!(
        (status, &body["outcome"]),
        (StatusCode::UNPROCESSABLE_ENTITY, &json!("KEY_REUSED")),
        "{body}"
    );
    let (status, body) = api.reserve("new", "u9", "drop").await;
    assert_eq!(
        (status, &body["outcome"]),
        (StatusCode::CONFLICT, &json!("SOLD_OUT")),
        "{body}"
    );
    let (status, body) = api.action("k2", "confirm").await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("SOLD")));
    agent.stop().await;

    tokio::time::sleep(Duration::from_millis(400)).await;
    let agent = agent_with_short_window(&db).await;
    let api = agent.api();
    assert!(agent.state.keys().is_empty(), "old keys are not loaded");
    let (status, body) = api.reserve("k2", "u2", "drop").await;
    assert_eq!(
        (status, &body["outcome"], &body["reservation"]["status"]),
        (StatusCode::OK, &json!("REPLAY"), &json!("SOLD")),
        "{body}"
    );
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.sold, s.rows_sold), (2, 2));
    api.assert_no_drift().await;
    agent.stop().await;
}
