//! A region's first figure of demand reaches the coordinator with the sync
//! it asks for, not a sync interval later: the coordinator shares the
//! remainder by every region's demand, and plans a region that reports
//! none as silent (its units frozen where they are).

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use escrow_core::protocol::{
    LimitsDown, LimitsUp, SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchRequest,
    WatchResponse,
};
use escrow_core::Mode;
use region_agent::coordinator_client::{ClientError, CoordinatorClient, CoordinatorLink};
use reqwest::StatusCode;

/// The agent's sync interval: long beside the test, so a sync within it
/// is one the agent asked for at once.
const SYNC_INTERVAL_MS: u64 = 3_000;

/// Units the coordinator grants.
const STOCK: u64 = 100;

/// A coordinator that grants [`STOCK`] units of `tee` once and writes
/// down, for each sync reporting `tee`, when it came, the units held and
/// the demand reported.
#[derive(Default)]
struct Recording {
    reports: Mutex<Vec<(Instant, u64, f64)>>,
}

#[async_trait]
impl CoordinatorClient for Recording {
    async fn sync(&self, req: &SyncRequest) -> Result<SyncResponse, ClientError> {
        for report in req.skus.iter().filter(|r| r.sku.as_str() == "tee") {
            self.reports.lock().unwrap().push((
                Instant::now(),
                report.held,
                report.sale_rate_per_s,
            ));
        }
        let grants = grant_until_acked(req, "g-tee", "tee", STOCK);
        Ok(sync_answer(
            req,
            grants,
            vec![directive("tee", Mode::Escrow, 0)],
        ))
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

conformance!(the_first_sync_that_reports_sales_reports_their_demand);

/// Goal: buyers begin to buy (one every 5 ms for 150 ms) right after the
/// sync that acknowledged the grant; the first sync that reports units
/// held comes before the next interval and carries a demand above 0; the
/// counters equal the rows. Before 2026-12-07 the sync the owner asked
/// for when its demand became reportable read the demand the owner had
/// published after its previous batch, 0, and the coordinator heard the
/// region's demand only a round trip and an interval later.
async fn the_first_sync_that_reports_sales_reports_their_demand(db: TestDb) {
    let coordinator = Arc::new(Recording::default());
    let mut agent_settings = settings(limits());
    agent_settings.coordinator = Some(Arc::new(CoordinatorLink::new(
        coordinator.clone(),
        SYNC_INTERVAL_MS,
    )));
    let agent = TestAgent::start_with_settings(&db, agent_settings, None).await;
    let api = agent.api();
    eventually(
        "the grant is credited and acknowledged",
        Duration::from_secs(20),
        async || {
            let available = "SELECT COALESCE(max(available), -1) FROM sku_stock \
                             WHERE tenant = 'acme' AND sku = 'tee'";
            db.int(available).await == STOCK as i64
                && !coordinator.reports.lock().unwrap().is_empty()
        },
    )
    .await;

    let first_buyer = Instant::now();
    for i in 0..30 {
        let (status, body) = api.reserve(&format!("k{i}"), &format!("u{i}"), "tee").await;
        assert_eq!(status, StatusCode::CREATED, "buyer {i}: {body}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eventually(
        "a sync reports units held",
        Duration::from_secs(10),
        async || {
            coordinator
                .reports
                .lock()
                .unwrap()
                .iter()
                .any(|&(_, held, _)| held > 0)
        },
    )
    .await;
    let reports = coordinator.reports.lock().unwrap().clone();
    let (at, held, rate) = reports.into_iter().find(|&(_, held, _)| held > 0).unwrap();
    let after_ms = at.duration_since(first_buyer).as_millis();
    assert!(
        after_ms < u128::from(SYNC_INTERVAL_MS) / 2,
        "the first report of {held} units held came {after_ms} ms after the first buyer: \
         not a sync asked for at once"
    );
    assert!(
        rate > 0.0,
        "the first sync reporting {held} units held, {after_ms} ms after the first buyer, \
         reported a demand of {rate}/s"
    );
    agent.stop().await;
    let tee = stored(&db, "tee").await;
    assert_eq!(
        (tee.available, tee.held),
        (STOCK as i64 - 30, 30),
        "{tee:?}"
    );
    assert_balanced(&tee);
}
