//! Harness for multi-region tests: a real coordinator and real region
//! agents, each on its own PostgreSQL database, talking HTTP on loopback.

#![allow(dead_code, clippy::unwrap_used)] // Each test binary uses part of the harness; tests fail loudly.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use coordinator::auth::Auth as CoordAuth;
use coordinator::store::{Store, MIGRATOR as COORD_MIGRATOR};
use escrow_core::protocol::{SyncRequest, SyncResponse, TakeRequest, TakeResponse};
use escrow_core::{RegionName, Tenant};
use region_agent::auth::Auth as AgentAuth;
use region_agent::clock::SystemClock;
use region_agent::coordinator_client::{
    ClientError, CoordinatorClient, CoordinatorLink, HttpCoordinator,
};
use region_agent::owner::Limits;
use region_agent::store::postgres::{PgStore, MIGRATOR as AGENT_MIGRATOR};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const ADMIN: &str = "admin-secret";
pub const TENANT_KEY: &str = "acme-key";
pub const SYNC_MS: u64 = 50;

pub fn region_token(region: &str) -> String {
    format!("token-{region}")
}

pub fn client() -> Client {
    Client::builder()
        .pool_max_idle_per_host(4096)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The server part of DATABASE_URL, e.g. `postgres://postgres@127.0.0.1:5432`.
pub fn server_url() -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    base.rsplit_once('/').unwrap().0.to_owned()
}

/// A fresh database with the region agent's migrations. It stays after the
/// test (for inspection) and is dropped when the same test runs again.
pub struct AgentDb {
    pub name: String,
    pub pool: PgPool,
}

impl AgentDb {
    pub async fn create(coordinator_pool: &PgPool, region: &str) -> Self {
        let base = coordinator_pool
            .connect_options()
            .get_database()
            .unwrap()
            .to_owned();
        // PostgreSQL truncates names at 63 bytes: keep a short, unique suffix of the test's database.
        let name = format!(
            "agent_{}_{}",
            &base[base.len().saturating_sub(24)..],
            region.replace('-', "_")
        );
        let mut admin = PgConnection::connect(&format!("{}/postgres", server_url()))
            .await
            .unwrap();
        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut admin)
            .await
            .unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&format!("{}/{name}", server_url()))
            .await
            .unwrap();
        AGENT_MIGRATOR.run(&pool).await.unwrap();
        Self { name, pool }
    }

    pub fn url(&self) -> String {
        format!("{}/{}", server_url(), self.name)
    }
}

/// Counts and optionally disturbs the agent's calls to the coordinator.
pub struct Wire {
    inner: HttpCoordinator,
    pub syncs: AtomicU64,
    pub takes: AtomicU64,
    faults: Option<Mutex<Faults>>,
}

struct Faults {
    rng: u64,
    held_back: Option<SyncRequest>,
}

impl Faults {
    fn roll(&mut self, percent: u64) -> bool {
        // xorshift64: deterministic per seed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % 100 < percent
    }
}

impl Wire {
    pub fn new(inner: HttpCoordinator, fault_seed: Option<u64>) -> Self {
        Self {
            inner,
            syncs: AtomicU64::new(0),
            takes: AtomicU64::new(0),
            faults: fault_seed.map(|seed| {
                Mutex::new(Faults {
                    rng: seed | 1,
                    held_back: None,
                })
            }),
        }
    }

    pub fn messages(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed) + self.takes.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl CoordinatorClient for Wire {
    async fn sync(&self, req: &SyncRequest) -> Result<SyncResponse, ClientError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let Some(faults) = &self.faults else {
            return self.inner.sync(req).await;
        };
        let (duplicate, delay, reorder, lose) = {
            let mut f = faults.lock().unwrap();
            (f.roll(50), f.roll(50), f.roll(30), f.roll(25))
        };
        if delay {
            tokio::time::sleep(Duration::from_millis(5 + req.seq % 20)).await;
        }
        let late = if reorder {
            let mut f = faults.lock().unwrap();
            f.held_back.replace(req.clone())
        } else {
            None
        };
        let answer = self.inner.sync(req).await;
        if let Some(old) = late {
            // An older request delivered after a newer one.
            let _ = self.inner.sync(&old).await;
        }
        if duplicate {
            let _ = self.inner.sync(req).await;
        }
        if lose && answer.is_ok() {
            return Err(ClientError::Unreachable("response lost (injected)".into()));
        }
        answer
    }

    async fn take(&self, req: &TakeRequest) -> Result<TakeResponse, ClientError> {
        self.takes.fetch_add(1, Ordering::Relaxed);
        let Some(faults) = &self.faults else {
            return self.inner.take(req).await;
        };
        let (duplicate, lose) = {
            let mut f = faults.lock().unwrap();
            (f.roll(50), f.roll(25))
        };
        let answer = self.inner.take(req).await;
        if duplicate {
            let _ = self.inner.take(req).await;
        }
        if lose && answer.is_ok() {
            return Err(ClientError::Unreachable("response lost (injected)".into()));
        }
        answer
    }
}

/// A coordinator served in this process.
pub struct Coord {
    pub url: String,
    pub addr: std::net::SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

pub fn coordinator_state(pool: &PgPool) -> coordinator::AppState {
    let regions = ["eu", "us", "ap"]
        .iter()
        .map(|r| (RegionName::parse(r).unwrap(), region_token(r)))
        .collect();
    coordinator::AppState::new(
        Store::new(pool.clone()),
        CoordAuth::new(Some(ADMIN.to_owned()), regions),
        coordinator::policy_named("tail-merge", SYNC_MS).unwrap(),
        10_000,
    )
}

impl Coord {
    /// A coordinator with SKU `drop`: 100 units over eu and us, equal weights.
    pub async fn with_drop(pool: &PgPool) -> (Self, Admin) {
        let coord = Self::start(pool, None).await;
        let admin = Admin::new(&coord.url);
        let (status, body) = admin
            .put_sku("drop", json!({"total": 100, "regions": {"eu": 1, "us": 1}}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        (coord, admin)
    }

    pub async fn start(pool: &PgPool, addr: Option<std::net::SocketAddr>) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        COORD_MIGRATOR.run(pool).await.unwrap();
        let listener = TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let server = tokio::spawn(coordinator::run(
            listener,
            coordinator_state(pool),
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            url: format!("http://{addr}"),
            addr,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap().unwrap();
        }
    }
}

/// A region agent served in this process.
pub struct Agent {
    pub region: String,
    pub url: String,
    pub wire: Arc<Wire>,
    pub state: region_agent::AppState,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl Agent {
    pub async fn start(
        db: &AgentDb,
        region: &str,
        coordinator_url: &str,
        fault_seed: Option<u64>,
    ) -> Self {
        let region_name = RegionName::parse(region).unwrap();
        let http = HttpCoordinator::new(
            coordinator_url,
            region_name.clone(),
            region_token(region),
            Duration::from_secs(2),
        )
        .unwrap();
        let wire = Arc::new(Wire::new(http, fault_seed));
        let link = Arc::new(CoordinatorLink::new(wire.clone(), SYNC_MS));
        let settings = region_agent::AgentSettings {
            region: region_name,
            auth: AgentAuth::new(
                vec![(Tenant::parse("acme").unwrap(), TENANT_KEY.to_owned())],
                Some(ADMIN.to_owned()),
            ),
            limits: Limits {
                batch_size_max: 256,
                queue_max: 8192,
                wait_timeout_ms: 10_000,
            },
            coordinator: Some(link),
        };
        let state = region_agent::start(
            Arc::new(PgStore::new(db.pool.clone())),
            Arc::new(SystemClock),
            settings,
        )
        .await
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let server = tokio::spawn(region_agent::run(listener, state.clone(), async move {
            let _ = rx.await;
        }));
        Self {
            region: region.to_owned(),
            url,
            wire,
            state,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    pub fn buyer(&self) -> Buyer {
        Buyer {
            url: self.url.clone(),
            client: client(),
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap().unwrap();
        }
    }
}

/// A buyer's client for one agent.
#[derive(Clone)]
pub struct Buyer {
    pub url: String,
    pub client: Client,
}

impl Buyer {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: client(),
        }
    }

    pub async fn reserve(&self, key: &str, user: &str, sku: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .post(format!("{}/v1/reservations", self.url))
            .bearer_auth(TENANT_KEY)
            .json(&json!({"request_key": key, "user_id": user, "sku": sku}))
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Retries 503s with the same key until a final answer; returns the
    /// answer, the time its final request was sent and the time it came back.
    pub async fn reserve_until_final(
        &self,
        key: &str,
        user: &str,
        sku: &str,
    ) -> (StatusCode, Value, Instant, Instant) {
        for _ in 0..2_000 {
            let sent = Instant::now();
            let (status, body) = self.reserve(key, user, sku).await;
            if status != StatusCode::SERVICE_UNAVAILABLE {
                return (status, body, sent, Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no final answer for {key}");
    }

    pub async fn action(&self, key: &str, action: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .post(format!("{}/v1/reservations/{key}/{action}", self.url))
            .bearer_auth(TENANT_KEY)
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }
}

/// The admin side of the coordinator.
#[derive(Clone)]
pub struct Admin {
    pub url: String,
    pub client: Client,
}

impl Admin {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: client(),
        }
    }

    pub async fn put_sku(&self, sku: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .client
            .put(format!("{}/v1/admin/skus/acme/{sku}", self.url))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self
            .client
            .post(format!("{}{path}", self.url))
            .bearer_auth(ADMIN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.url))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn sku(&self, sku: &str) -> Value {
        self.get(&format!("/v1/admin/skus/acme/{sku}")).await.1
    }

    /// Waits until every SKU has drift 0, no grant in transit, every region
    /// agreeing with its lease, and `settle` true; then returns the audit.
    pub async fn settled_audit(&self, deadline: Duration) -> Value {
        let start = Instant::now();
        loop {
            let (status, audit) = self.get("/v1/admin/audit").await;
            assert_eq!(status, StatusCode::OK, "{audit}");
            let quiet = audit["skus"].as_array().unwrap().iter().all(|s| {
                s["in_transit"] == 0
                    && s["regions"]
                        .as_object()
                        .unwrap()
                        .values()
                        .all(|r| r["region_drift"] == 0)
            });
            if quiet && audit["drift_total"] == 0 {
                return audit;
            }
            assert!(start.elapsed() < deadline, "did not settle: {audit:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The audit right now, asserting drift 0 (it must hold at every moment).
    pub async fn assert_no_drift(&self) -> Value {
        let (_, audit) = self.get("/v1/admin/audit").await;
        for sku in audit["skus"].as_array().unwrap() {
            assert_eq!(sku["drift"], 0, "drift: {sku:#}");
            assert_eq!(sku["ledger_drift"], 0, "ledger drift: {sku:#}");
        }
        audit
    }
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

/// A workspace binary built next to this test (`cargo build --workspace --bins`).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Self {
        Self(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub async fn wait_ready(url: &str) {
    let c = client();
    eventually("/readyz", Duration::from_secs(30), async || {
        c.get(format!("{url}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == StatusCode::OK)
    })
    .await;
}
