//! The coordinator's test harness: a real coordinator and real region
//! agents, each on its own database (all PostgreSQL or all SQLite, see
//! [`coordinator_tests!`]), talking HTTP on loopback, with a wire between
//! them that can count and disturb messages. The API client, polling,
//! process helpers and the backend handle [`TestDb`] come from
//! `test-support`.

#![allow(dead_code, clippy::unwrap_used)] // Each test binary uses part of the harness; tests fail loudly.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use coordinator::auth::Auth as CoordAuth;
use coordinator::store::Store;
use escrow_core::protocol::{
    LimitsDown, LimitsUp, SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchRequest,
    WatchResponse,
};
use escrow_core::{RegionName, Tenant};
use region_agent::auth::Auth as AgentAuth;
use region_agent::clock::SystemClock;
use region_agent::coordinator_client::{
    ClientError, CoordinatorClient, CoordinatorLink, HttpCoordinator,
};
use region_agent::owner::Limits;
use reqwest::StatusCode;
use serde_json::Value;
pub use test_support::*;

/// Runs each `async fn NAME(db: TestDb)` named as `NAME::postgres` and
/// `NAME::sqlite`, each on a fresh database with the coordinator's schema;
/// the test's agents get databases of the same backend ([`agent_db`]).
#[macro_export]
macro_rules! coordinator_tests {
    ($($name:ident),+ $(,)?) => {
        test_support::on_both_backends!(
            postgres: coordinator::store::POSTGRES_MIGRATOR,
            sqlite: coordinator::store::SQLITE_MIGRATOR;
            $($name),+
        );
    };
}

pub const SYNC_MS: u64 = 50;

pub fn region_token(region: &str) -> String {
    format!("token-{region}")
}

/// Sends `body` to `region`'s `call` (`sync`, `take`) with that region's token.
pub async fn region_call(
    coord: &Coord,
    region: &str,
    call: &str,
    body: Value,
) -> (StatusCode, Value) {
    let r = client()
        .post(format!("{}/v1/regions/{region}/{call}", coord.url))
        .bearer_auth(region_token(region))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

/// A fresh database with the region agent's schema, on the backend of the
/// coordinator's `db`.
pub async fn agent_db(db: &TestDb, region: &str) -> TestDb {
    db.sibling(
        &format!("agent-{region}"),
        &region_agent::store::postgres::MIGRATOR,
        &region_agent::store::sqlite::MIGRATOR,
    )
    .await
}

/// Counts and optionally disturbs the agent's calls to the coordinator.
pub struct Wire {
    inner: HttpCoordinator,
    pub syncs: AtomicU64,
    pub takes: AtomicU64,
    faults: Option<Mutex<Faults>>,
    /// While set, every call is lost: no request reaches the coordinator
    /// and the caller hears nothing until its timeout.
    pub black_hole: AtomicBool,
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
            black_hole: AtomicBool::new(false),
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

    /// A lost call: silence for the client's timeout, then no answer.
    async fn swallowed<T>(&self) -> Result<T, ClientError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Err(ClientError::Unreachable("black-holed (injected)".into()))
    }

    fn is_black_holed(&self) -> bool {
        self.black_hole.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl CoordinatorClient for Wire {
    async fn watch(&self, req: &WatchRequest) -> Result<WatchResponse, ClientError> {
        if self.is_black_holed() {
            return self.swallowed().await;
        }
        self.inner.watch(req).await
    }

    async fn sync(&self, req: &SyncRequest) -> Result<SyncResponse, ClientError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if self.is_black_holed() {
            return self.swallowed().await;
        }
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

    async fn limits(&self, req: &LimitsUp) -> Result<LimitsDown, ClientError> {
        if self.is_black_holed() {
            return self.swallowed().await;
        }
        self.inner.limits(req).await
    }

    async fn take(&self, req: &TakeRequest) -> Result<TakeResponse, ClientError> {
        self.takes.fetch_add(1, Ordering::Relaxed);
        if self.is_black_holed() {
            return self.swallowed().await;
        }
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
    served: Served,
}

pub async fn coordinator_state(db: &TestDb) -> coordinator::AppState {
    let regions = ["eu", "us", "ap"]
        .iter()
        .map(|r| (RegionName::parse(r).unwrap(), region_token(r)))
        .collect();
    coordinator::AppState::new(
        Store::open(db.url(), 8).await.unwrap(),
        CoordAuth::new(Some(ADMIN.to_owned()), regions),
        coordinator::policies::Policies::new("tail-merge", SYNC_MS).unwrap(),
        10_000,
    )
}

impl Coord {
    /// A coordinator with SKU `drop`: 100 units over eu and us, equal weights.
    pub async fn with_drop(db: &TestDb) -> (Self, Api) {
        let coord = Self::start(db, None).await;
        let admin = Api::new(&coord.url);
        // These tests take units from the pool: the SKU keeps a fifth of
        // its total there (the default policy keeps none), 40 for each region.
        let (status, body) = admin
            .put_sku(
                "acme",
                "drop",
                serde_json::json!({"total": 100, "regions": {"eu": 1, "us": 1},
                                   "settings": {"refill": {"reserve_fraction": 0.2}}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        (coord, admin)
    }

    pub async fn start(db: &TestDb, addr: Option<std::net::SocketAddr>) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let state = coordinator_state(db).await;
        let served = Served::start(addr, |listener, shutdown| {
            coordinator::run(listener, state, shutdown)
        })
        .await;
        Self {
            url: served.url.clone(),
            addr: served.addr,
            served,
        }
    }

    pub async fn stop(self) {
        self.served.stop().await;
    }
}

/// A region agent served in this process.
pub struct Agent {
    pub region: String,
    pub url: String,
    pub wire: Arc<Wire>,
    pub state: region_agent::AppState,
    served: Served,
}

impl Agent {
    pub async fn start(
        db: &TestDb,
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
                vec![(Tenant::parse("acme").unwrap(), ACME_KEY.to_owned())],
                Some(ADMIN.to_owned()),
            ),
            limits: Limits {
                max_in_flight: 256,
                max_waiting: 8192,
                wait_timeout_ms: 10_000,
            },
            coordinator: Some(link),
            keys: region_agent::KeyMemory::default(),
        };
        let state = region_agent::start(
            region_agent::store::open(db.url(), 8).await.unwrap(),
            Arc::new(SystemClock),
            settings,
        )
        .await
        .unwrap();
        let served = Served::start(None, |listener, shutdown| {
            region_agent::run(listener, state.clone(), shutdown)
        })
        .await;
        Self {
            region: region.to_owned(),
            url: served.url.clone(),
            wire,
            state,
            served,
        }
    }

    /// A buyer's client for this agent.
    pub fn buyer(&self) -> Api {
        Api::new(&self.url)
    }

    pub async fn stop(self) {
        self.served.stop().await;
    }
}

/// Waits until every SKU has drift 0, no grant in transit and every region
/// agreeing with its lease; then returns the audit.
pub async fn settled_audit(admin: &Api, deadline: Duration) -> Value {
    let mut audit = Value::Null;
    let settled = test_support::poll::within(deadline, async || {
        let (status, now) = admin.admin_get("/v1/admin/audit").await;
        assert_eq!(status, StatusCode::OK, "{now}");
        let quiet = now["skus"].as_array().unwrap().iter().all(|s| {
            s["in_transit"] == 0
                && s["regions"]
                    .as_object()
                    .unwrap()
                    .values()
                    .all(|r| r["region_drift"] == 0)
        });
        let settled = quiet && now["drift_total"] == 0;
        audit = now;
        settled
    })
    .await;
    assert!(settled, "did not settle within {deadline:?}: {audit:#}");
    audit
}

pub const REGIONS: [&str; 3] = ["eu", "us", "ap"];

/// A real coordinator and one real agent per region of [`REGIONS`], each
/// on its own database.
pub struct Cluster {
    pub coord: Coord,
    pub admin: Api,
    pub agents: Vec<Agent>,
    /// The agents' databases, kept for as long as the cluster lives.
    pub dbs: Vec<TestDb>,
}

/// Starts a [`Cluster`]; with `fault_seed`, each agent's wire disturbs its
/// messages.
pub async fn cluster(db: &TestDb, fault_seed: Option<u64>) -> Cluster {
    let coord = Coord::start(db, None).await;
    let admin = Api::new(&coord.url);
    let mut dbs = Vec::new();
    let mut agents = Vec::new();
    for (i, region) in REGIONS.iter().enumerate() {
        let region_db = agent_db(db, region).await;
        agents.push(
            Agent::start(
                &region_db,
                region,
                &coord.url,
                fault_seed.map(|s| s + i as u64),
            )
            .await,
        );
        dbs.push(region_db);
    }
    Cluster {
        coord,
        admin,
        agents,
        dbs,
    }
}

impl Cluster {
    pub async fn stop(self) {
        for agent in self.agents {
            agent.stop().await;
        }
        self.coord.stop().await;
    }

    pub fn messages(&self) -> u64 {
        self.agents.iter().map(|a| a.wire.messages()).sum()
    }

    /// Puts tenant acme's `sku` at the coordinator as `spec` says.
    pub async fn put_sku(&self, sku: &str, spec: Value) -> (StatusCode, Value) {
        self.admin.put_sku("acme", sku, spec).await
    }

    /// Waits until every unit of `sku` granted to a region has arrived.
    pub async fn grants_delivered(&self, sku: &str) {
        eventually(
            "initial grants delivered",
            Duration::from_secs(20),
            async || self.admin.admin_sku("acme", sku).await["in_transit"] == 0,
        )
        .await;
    }
}
