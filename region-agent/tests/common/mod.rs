//! The region agent's test harness: an agent on a loopback socket over a
//! real PostgreSQL database, and what its database says. The API client,
//! polling and process helpers come from `test-support`.

#![allow(dead_code, clippy::unwrap_used)] // Each test binary uses part of the harness; tests fail loudly.

use std::sync::Arc;
use std::time::Duration;

use escrow_core::{RegionName, Tenant};
use region_agent::auth::Auth;
use region_agent::clock::{Clock, ManualClock, SystemClock};
use region_agent::owner::Limits;
use region_agent::store::postgres::PgStore;
use region_agent::store::Store;
use region_agent::{start, AgentSettings, AppState};
use sqlx::PgPool;
pub use test_support::*;

pub fn limits() -> Limits {
    Limits {
        batch_size_max: 256,
        queue_max: 4096,
        wait_timeout_ms: 5_000,
    }
}

pub fn settings(limits: Limits) -> AgentSettings {
    AgentSettings {
        region: RegionName::parse("eu").unwrap(),
        auth: Auth::new(
            vec![
                (Tenant::parse("acme").unwrap(), ACME_KEY.to_owned()),
                (Tenant::parse("other").unwrap(), OTHER_KEY.to_owned()),
            ],
            Some(ADMIN.to_owned()),
        ),
        limits,
        coordinator: None,
    }
}

/// An agent serving on a loopback port.
pub struct TestAgent {
    pub url: String,
    pub state: AppState,
    pub clock: Option<Arc<ManualClock>>,
    served: Served,
}

impl TestAgent {
    /// An agent on the system clock.
    pub async fn start(pool: &PgPool) -> Self {
        Self::start_with(pool, limits(), None).await
    }

    /// An agent on a manual clock starting at the current time.
    pub async fn start_manual(pool: &PgPool) -> Self {
        let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
        Self::start_with(pool, limits(), Some(clock)).await
    }

    pub async fn start_with(
        pool: &PgPool,
        limits: Limits,
        clock: Option<Arc<ManualClock>>,
    ) -> Self {
        let store: Arc<dyn Store> = Arc::new(PgStore::new(pool.clone()));
        let dyn_clock: Arc<dyn Clock> = match &clock {
            Some(c) => c.clone(),
            None => Arc::new(SystemClock),
        };
        let state = start(store, dyn_clock, settings(limits)).await.unwrap();
        let served = Served::start(None, |listener, shutdown| {
            region_agent::run(listener, state.clone(), shutdown)
        })
        .await;
        Self {
            url: served.url.clone(),
            state,
            clock,
            served,
        }
    }

    /// Graceful shutdown: waits until every in-flight request is answered.
    pub async fn stop(self) {
        self.served.stop().await;
    }

    pub fn api(&self) -> Api {
        Api::new(&self.url)
    }

    pub fn advance(&self, ms: u64) {
        self.clock.as_ref().expect("manual clock").advance(ms);
    }
}

/// Counters and row sums of one SKU, straight from the database.
#[derive(Debug, PartialEq, Eq)]
pub struct Stored {
    pub available: i64,
    pub held: i64,
    pub sold: i64,
    pub total: i64,
    pub rows_held: i64,
    pub rows_sold: i64,
    pub rows_released: i64,
    pub rows_expired: i64,
}

pub async fn stored(pool: &PgPool, sku: &str) -> Stored {
    let (available, held, sold, total): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT available, held, sold, received - returned FROM sku_stock WHERE tenant = 'acme' AND sku = $1",
    )
    .bind(sku)
    .fetch_one(pool)
    .await
    .unwrap();
    let sum = |status: &'static str| {
        let pool = pool.clone();
        let sku = sku.to_owned();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT COALESCE(sum(qty), 0)::bigint FROM reservations WHERE tenant = 'acme' AND sku = $1 AND status = $2",
            )
            .bind(sku)
            .bind(status)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    Stored {
        available,
        held,
        sold,
        total,
        rows_held: sum("HELD").await,
        rows_sold: sum("SOLD").await,
        rows_released: sum("RELEASED").await,
        rows_expired: sum("EXPIRED").await,
    }
}

/// Asserts the region invariant and that counters match rows.
pub fn assert_balanced(s: &Stored) {
    assert_eq!(s.available + s.held + s.sold, s.total, "{s:?}");
    assert_eq!(s.held, s.rows_held, "{s:?}");
    assert_eq!(s.sold, s.rows_sold, "{s:?}");
}

/// A connection holding every SKU's counter row locked, so an owner's next
/// commit waits until `COMMIT` (or the connection's end) releases it.
pub async fn lock_counters(pool: &PgPool) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query("SELECT 1 FROM sku_stock FOR UPDATE")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// Waits until some statement waits on a lock (an owner's commit on
/// [`lock_counters`]).
pub async fn wait_for_lock_waiter(pool: &PgPool) {
    eventually(
        "a commit waits on the lock",
        Duration::from_secs(10),
        async || {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted")
                .fetch_one(pool)
                .await
                .unwrap();
            n > 0
        },
    )
    .await;
}
