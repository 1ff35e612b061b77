//! Shared test harness: an agent on a loopback socket over a real
//! PostgreSQL database, and a small HTTP client for its API.

#![allow(dead_code, clippy::unwrap_used)] // Each test binary uses part of the harness; tests fail loudly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use escrow_core::{RegionName, Tenant};
use region_agent::auth::Auth;
use region_agent::clock::{Clock, ManualClock, SystemClock};
use region_agent::owner::Limits;
use region_agent::store::postgres::PgStore;
use region_agent::{start, AgentSettings, AppState};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const ADMIN: &str = "admin-secret";
pub const ACME_KEY: &str = "acme-key";
pub const OTHER_KEY: &str = "other-key";

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
    pub client: Client,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
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
        let store = Arc::new(PgStore::new(pool.clone()));
        let dyn_clock: Arc<dyn Clock> = match &clock {
            Some(c) => c.clone(),
            None => Arc::new(SystemClock),
        };
        let state = start(store, dyn_clock, settings(limits)).await.unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let server = tokio::spawn(region_agent::run(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        Self {
            url,
            state,
            clock,
            client: client(),
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    /// Graceful shutdown: waits until every in-flight request is answered.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap().unwrap();
        }
    }

    pub fn api(&self) -> Api {
        Api {
            url: self.url.clone(),
            client: self.client.clone(),
        }
    }

    pub fn advance(&self, ms: u64) {
        self.clock.as_ref().expect("manual clock").advance(ms);
    }
}

pub fn client() -> Client {
    Client::builder()
        .pool_max_idle_per_host(4096)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A client for one agent (or any process speaking its API).
#[derive(Clone)]
pub struct Api {
    pub url: String,
    pub client: Client,
}

impl Api {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: client(),
        }
    }

    pub async fn put_sku(&self, tenant: &str, sku: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .client
            .put(format!("{}/v1/admin/skus/{tenant}/{sku}", self.url))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn admin_post(&self, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self
            .client
            .post(format!("{}{path}", self.url))
            .bearer_auth(ADMIN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.url))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    /// One reserve attempt.
    pub async fn try_reserve(
        &self,
        key: &str,
        user: &str,
        sku: &str,
    ) -> reqwest::Result<(StatusCode, Value)> {
        let r = self
            .client
            .post(format!("{}/v1/reservations", self.url))
            .bearer_auth(ACME_KEY)
            .json(&json!({"request_key": key, "user_id": user, "sku": sku}))
            .send()
            .await?;
        let status = r.status();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    pub async fn reserve(&self, key: &str, user: &str, sku: &str) -> (StatusCode, Value) {
        self.try_reserve(key, user, sku).await.unwrap()
    }

    /// Reserves, retrying with the same key while the answer is a 503.
    pub async fn reserve_until_final(
        &self,
        key: &str,
        user: &str,
        sku: &str,
    ) -> (StatusCode, Value, u32) {
        let mut retries = 0;
        loop {
            let (status, body) = self.reserve(key, user, sku).await;
            if status != StatusCode::SERVICE_UNAVAILABLE {
                return (status, body, retries);
            }
            retries += 1;
            assert!(retries < 1_000, "no final answer for {key}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn action(&self, key: &str, action: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .post(format!("{}/v1/reservations/{key}/{action}", self.url))
            .bearer_auth(ACME_KEY)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, key: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .get(format!("{}/v1/reservations/{key}", self.url))
            .bearer_auth(ACME_KEY)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    /// The audit's drift for every SKU, asserting it is 0 everywhere.
    pub async fn assert_no_drift(&self) -> Value {
        let (status, audit) = self.admin_get("/v1/admin/audit").await;
        assert_eq!(status, StatusCode::OK, "{audit}");
        for sku in audit["skus"].as_array().unwrap() {
            assert_eq!(sku["drift"], 0, "drift in {sku}");
            assert_eq!(sku["rows_drift"], 0, "rows drift in {sku}");
        }
        assert_eq!(audit["drift_total"], 0);
        audit
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

/// Polls `check` until it returns true or the deadline passes.
pub async fn eventually(what: &str, deadline: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
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
