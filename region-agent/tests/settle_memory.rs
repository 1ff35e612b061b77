//! Each SKU owner settles and expires its holds from memory: the HELD
//! reservations it loads at start and keeps as it commits. Nothing sweeps
//! the database for due holds any more, so a hold the owner did not load
//! would never expire.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use region_agent::clock::{Clock, ManualClock, SystemClock};
use reqwest::StatusCode;
use serde_json::json;

conformance!(holds_made_before_a_restart_settle_and_expire_after_it);

/// Goal: holds committed by one process are settled and expired by the
/// next one, which reads them into memory at start: a confirm and a release
/// find their holds, an extended hold keeps its later deadline, and the
/// others expire when due, none early; counters equal rows throughout.
async fn holds_made_before_a_restart_settle_and_expire_after_it(db: TestDb) {
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let agent = TestAgent::start_with(&db, limits(), Some(clock.clone())).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 6, "hold_ttl_ms": 1000}))
        .await;
    for i in 0..5 {
        let (status, body) = api
            .reserve(&format!("k{i}"), &format!("u{i}"), "drop")
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    clock.advance(500);
    assert_eq!(api.action("k3", "extend").await.0, StatusCode::OK);
    agent.stop().await;

    let agent = TestAgent::start_with(&db, limits(), Some(clock.clone())).await;
    let api = agent.api();
    let (status, body) = api.action("k0", "confirm").await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("SOLD")));
    let (status, body) = api.action("k1", "release").await;
    assert_eq!(
        (status, &body["status"]),
        (StatusCode::OK, &json!("RELEASED"))
    );

    clock.advance(499);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let s = stored(&db, "drop").await;
    assert_eq!((s.rows_held, s.rows_expired), (3, 0), "none expired early");

    clock.advance(1);
    eventually(
        "the two holds due expire",
        Duration::from_secs(5),
        async || stored(&db, "drop").await.rows_expired == 2,
    )
    .await;
    assert_eq!(api.get("k3").await.1["status"], "HELD", "extended: not due");
    for key in ["k2", "k4"] {
        assert_eq!(api.get(key).await.1["status"], "EXPIRED", "{key}");
    }

    clock.advance(500);
    eventually(
        "the extended hold expires",
        Duration::from_secs(5),
        async || stored(&db, "drop").await.rows_expired == 3,
    )
    .await;
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.sold), (5, 0, 1));
    api.assert_no_drift().await;
    agent.stop().await;
}
