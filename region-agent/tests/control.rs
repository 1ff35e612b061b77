//! The coordinator's directives reach a SKU's owner on their own channel:
//! a buyer queue that is full cannot make the agent drop a recall or a
//! mode change. PostgreSQL only: the owner is held up by a row lock.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use escrow_core::protocol::{
    LimitsDown, LimitsUp, SkuDirective, SyncRequest, SyncResponse, TakeRequest, TakeResponse,
    WatchRequest, WatchResponse,
};
use escrow_core::Mode;
use region_agent::coordinator_client::{ClientError, CoordinatorClient, CoordinatorLink};
use region_agent::owner::Limits;
use reqwest::StatusCode;
use sqlx::PgPool;

/// A coordinator that says what the test tells it to: a standing directive
/// with a grant until it is acknowledged, and then one single directive
/// more, sent once and never repeated.
#[derive(Default)]
struct Scripted {
    standing: Mutex<Option<SkuDirective>>,
    once: Mutex<Option<SkuDirective>>,
    sent_once: AtomicU32,
    returned: Mutex<u64>,
}

const GRANT: &str = "g-initial";

#[async_trait]
impl CoordinatorClient for Scripted {
    async fn sync(&self, req: &SyncRequest) -> Result<SyncResponse, ClientError> {
        *self.returned.lock().unwrap() += req.returns.iter().map(|r| r.units).sum::<u64>();
        let mut resp = sync_answer(req, Vec::new(), Vec::new());
        if let Some(d) = self.once.lock().unwrap().take() {
            self.sent_once.fetch_add(1, Ordering::SeqCst);
            resp.skus.push(d);
        } else if let Some(d) = self.standing.lock().unwrap().clone() {
            resp.skus.push(d);
            resp.grants = grant_until_acked(req, GRANT, "tee", 100);
        }
        Ok(resp)
    }

    async fn watch(&self, _req: &WatchRequest) -> Result<WatchResponse, ClientError> {
        Err(no_notices())
    }

    async fn take(&self, _req: &TakeRequest) -> Result<TakeResponse, ClientError> {
        Ok(nothing_taken(false))
    }

    async fn limits(&self, _req: &LimitsUp) -> Result<LimitsDown, ClientError> {
        Ok(LimitsDown::default())
    }
}

test_support::postgres_only!(
    migrator: region_agent::store::postgres::MIGRATOR;
    a_full_queue_never_drops_a_directive,
);

/// Goal: with the SKU's buyer queue full (its owner stuck on a locked row),
/// a recall and a switch to central mode sent in ONE sync, never repeated,
/// still reach the owner and are committed once the row is free; every
/// buyer gets a definite answer and the counters equal the rows.
async fn a_full_queue_never_drops_a_directive(pool: PgPool) {
    let coordinator = Arc::new(Scripted::default());
    *coordinator.standing.lock().unwrap() = Some(directive("tee", Mode::Escrow, 0));
    let link = Arc::new(CoordinatorLink::new(coordinator.clone(), 20));
    let mut agent_settings = settings(Limits {
        max_in_flight: 8,
        max_waiting: 16,
        wait_timeout_ms: 30_000,
    });
    agent_settings.coordinator = Some(link);
    let db = TestDb::postgres(pool.clone());
    let agent = TestAgent::start_with_settings(&db, agent_settings, None).await;
    let api = agent.api();
    eventually(
        "the grant is credited",
        Duration::from_secs(10),
        async || {
            let available = "SELECT COALESCE(max(available), -1) FROM sku_stock \
                             WHERE tenant = 'acme' AND sku = 'tee'";
            db.int(available).await == 100
        },
    )
    .await;
    *coordinator.standing.lock().unwrap() = None;

    // The owner's next commit waits on this lock; its queue fills behind it.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sku_stock WHERE tenant = 'acme' AND sku = 'tee' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    // More buyers than the batch and the queue hold: the rest are refused at once.
    let queue_full = Arc::new(AtomicU32::new(0));
    let mut buyers = Vec::new();
    for i in 0..60 {
        let (api, queue_full) = (api.clone(), queue_full.clone());
        buyers.push(tokio::spawn(async move {
            let (status, body) = api.reserve(&format!("k{i}"), &format!("u{i}"), "tee").await;
            if body["outcome"] == "REJECTED_QUEUE_FULL" {
                queue_full.fetch_add(1, Ordering::SeqCst);
            }
            (status, body)
        }));
    }
    eventually("the queue is full", Duration::from_secs(10), async || {
        queue_full.load(Ordering::SeqCst) > 0
    })
    .await;

    *coordinator.once.lock().unwrap() = Some(directive("tee", Mode::Central, 5));
    eventually(
        "the directive was sent",
        Duration::from_secs(10),
        async || coordinator.sent_once.load(Ordering::SeqCst) == 1,
    )
    .await;
    lock.rollback().await.unwrap();

    eventually(
        "central mode is committed",
        Duration::from_secs(10),
        async || {
            let central = "SELECT count(*) FROM sku_stock \
                           WHERE tenant = 'acme' AND sku = 'tee' AND mode = 'CENTRAL'";
            db.int(central).await == 1
        },
    )
    .await;
    for buyer in buyers {
        let (status, body) = buyer.await.unwrap();
        assert!(
            status == StatusCode::CREATED || status == StatusCode::SERVICE_UNAVAILABLE,
            "{status} {body}"
        );
    }
    eventually(
        "the recall is returned",
        Duration::from_secs(10),
        async || *coordinator.returned.lock().unwrap() >= 5,
    )
    .await;
    agent.stop().await;
    assert_balanced(&stored(&db, "tee").await);
}
