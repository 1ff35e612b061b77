//! A cart holding units aside for one item waits only briefly for the
//! next (`escrow_core::cart::ASIDE_WAIT_MS`), on the real agent with a
//! coordinator: the single buyers of the units it holds aside must not
//! wait out their whole queue wait for a cart that cannot complete.
//! PostgreSQL only: the simulator checks the same rule over whole sales
//! (`simulations/tests/carts.rs`), SQLite's cart path is the same code.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use escrow_core::protocol::{
    LimitsDown, LimitsUp, SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchRequest,
    WatchResponse,
};
use escrow_core::Mode;
use region_agent::coordinator_client::{ClientError, CoordinatorClient, CoordinatorLink};
use region_agent::owner::Limits;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

/// Units the coordinator grants the SKU with stock.
const STOCK: u64 = 5;

/// A coordinator with two SKUs for the region: `aaa`, granted [`STOCK`]
/// units once and none left anywhere after them, and `zzz`, of which it
/// grants nothing, saying each time that units are free elsewhere (so a
/// buyer of `zzz` waits for them).
struct Stingy;

#[async_trait]
impl CoordinatorClient for Stingy {
    async fn sync(&self, req: &SyncRequest) -> Result<SyncResponse, ClientError> {
        let grants = grant_until_acked(req, "g-aaa", "aaa", STOCK);
        let skus = vec![
            directive("aaa", Mode::Escrow, 0),
            directive("zzz", Mode::Escrow, 0),
        ];
        Ok(sync_answer(req, grants, skus))
    }

    async fn watch(&self, _req: &WatchRequest) -> Result<WatchResponse, ClientError> {
        Err(no_notices())
    }

    async fn take(&self, req: &TakeRequest) -> Result<TakeResponse, ClientError> {
        Ok(nothing_taken(req.sku.as_str() == "aaa"))
    }

    async fn limits(&self, _req: &LimitsUp) -> Result<LimitsDown, ClientError> {
        Ok(LimitsDown::default())
    }
}

test_support::postgres_only!(
    migrator: region_agent::store::postgres::MIGRATOR;
    a_cart_lets_units_it_set_aside_go_after_a_brief_wait,
);

/// Goal: a cart of [`aaa`, `zzz`] with a 30-s queue wait sets one unit of
/// `aaa` aside, then waits for `zzz`, whose units are elsewhere; it is
/// refused with REJECTED_WAIT_TIMEOUT after the brief wait, not the
/// queue's 30 s (the request must be answered within 10 s), and the unit
/// of `aaa` is free again: nothing written, and a single buyer holds all
/// of `aaa`'s units.
async fn a_cart_lets_units_it_set_aside_go_after_a_brief_wait(pool: PgPool) {
    let db = TestDb::postgres(pool);
    let mut agent_settings = settings(Limits {
        max_in_flight: 64,
        max_waiting: 256,
        wait_timeout_ms: 30_000,
    });
    agent_settings.coordinator = Some(Arc::new(CoordinatorLink::new(Arc::new(Stingy), 20)));
    let agent = TestAgent::start_with_settings(&db, agent_settings, None).await;
    let api = agent.api();
    eventually(
        "aaa's grant is credited and the agent knows zzz",
        Duration::from_secs(10),
        async || {
            // No row until the coordinator's directive is committed; the
            // directives are handed over one SKU after the other, so aaa's
            // grant can be credited before zzz is known.
            let available = "SELECT COALESCE(max(available), -1) FROM sku_stock \
                             WHERE tenant = 'acme' AND sku = 'aaa'";
            db.int(available).await == STOCK as i64
                && api.buyer_get("/v1/skus/zzz").await.0 == StatusCode::OK
        },
    )
    .await;

    let body = json!({
        "request_key": "cart-1",
        "user_id": "u-cart",
        "items": [{ "sku": "zzz" }, { "sku": "aaa" }],
    });
    let answer = tokio::time::timeout(Duration::from_secs(10), api.buyer_post("/v1/carts", body))
        .await
        .expect("the cart is answered after the brief wait, not the queue's 30 s");
    let (status, body) = answer;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["outcome"], "REJECTED_WAIT_TIMEOUT", "{body}");
    let written = (
        db.int("SELECT count(*) FROM carts").await,
        db.int("SELECT count(*) FROM reservations").await,
    );
    assert_eq!(written, (0, 0), "a refused cart writes nothing");

    for i in 0..STOCK {
        let (status, body) = api.reserve(&format!("k{i}"), &format!("u{i}"), "aaa").await;
        assert_eq!(status, StatusCode::CREATED, "unit {i} of aaa: {body}");
    }
    let (status, body) = api.reserve("k-last", "u-last", "aaa").await;
    assert_eq!(body["outcome"], "SOLD_OUT", "{status} {body}");
    let aaa = stored(&db, "aaa").await;
    assert_eq!((aaa.available, aaa.held), (0, STOCK as i64), "{aaa:?}");
    assert_balanced(&aaa);
    assert_balanced(&stored(&db, "zzz").await);
    api.assert_no_drift().await;
    agent.stop().await;
}
