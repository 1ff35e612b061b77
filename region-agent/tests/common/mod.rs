//! The region agent's test harness: an agent on a loopback socket over a
//! real database (PostgreSQL or SQLite, see [`conformance!`]), and what
//! its database says. The API client, polling, process helpers and the
//! backend handle [`TestDb`] come from `test-support`.

#![allow(dead_code, clippy::unwrap_used)] // Each test binary uses part of the harness; tests fail loudly.

use std::sync::Arc;
use std::time::Duration;

use escrow_core::protocol::{SkuDirective, SyncRequest, SyncResponse, TakeResponse, TransferMsg};
use escrow_core::{Mode, RegionName, Sku, SkuSettings, Tenant, TransferId};
use region_agent::auth::Auth;
use region_agent::clock::{Clock, ManualClock, SystemClock};
use region_agent::coordinator_client::ClientError;
use region_agent::owner::{Limits, OwnerHandle};
use region_agent::store::postgres::PgStore;
use region_agent::store::sqlite::SqliteStore;
use region_agent::store::{Batch, Epoch, Store};
use region_agent::{start, AgentSettings, AppState};
use reqwest::StatusCode;
use serde_json::Value;
pub use test_support::*;
use tokio::task::JoinHandle;

/// Runs each `async fn NAME(db: TestDb)` named as `NAME::postgres` and
/// `NAME::sqlite`, each on a fresh database with the agent's schema.
#[macro_export]
macro_rules! conformance {
    ($($name:ident),+ $(,)?) => {
        test_support::on_both_backends!(
            postgres: region_agent::store::postgres::MIGRATOR,
            sqlite: region_agent::store::sqlite::MIGRATOR;
            $($name),+
        );
    };
}

/// A store on the test's database. On SQLite the concrete store too, which
/// alone can tell whether a commit waits for the write lock.
pub async fn open_store(db: &TestDb) -> (Arc<dyn Store>, Option<Arc<SqliteStore>>) {
    match db.postgres_pool() {
        Some(pool) => (Arc::new(PgStore::new(pool.clone())), None),
        None => {
            let store = Arc::new(SqliteStore::open(db.url(), 4).await.unwrap());
            (store.clone(), Some(store))
        }
    }
}

pub fn limits() -> Limits {
    Limits {
        max_in_flight: 256,
        max_waiting: 4096,
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
        keys: region_agent::KeyMemory::default(),
    }
}

/// What a scripted coordinator says of acme's `sku`: in `mode`, one per
/// user, holds of 10 minutes, units above `return_until` given back.
pub fn directive(sku: &str, mode: Mode, return_until: u64) -> SkuDirective {
    SkuDirective {
        user_limit_scope: Default::default(),
        limit_regions: Vec::new(),
        tenant: Tenant::parse("acme").unwrap(),
        sku: Sku::parse(sku).unwrap(),
        mode,
        paused: false,
        max_per_user: 1,
        hold_ttl_ms: 600_000,
        return_until,
        sold_out_everywhere: false,
    }
}

/// A scripted coordinator's answer to a watch: it sends no notices, so
/// the agent learns everything from its syncs.
pub fn no_notices() -> ClientError {
    ClientError::Unreachable("no notices from this coordinator".into())
}

/// A scripted coordinator's grant `id` of `units` of acme's `sku`, sent
/// with every answer until `req` acknowledges it (as the coordinator does).
pub fn grant_until_acked(req: &SyncRequest, id: &str, sku: &str, units: u64) -> Vec<TransferMsg> {
    let id = TransferId::parse(id).unwrap();
    if req.acks.contains(&id) {
        return Vec::new();
    }
    vec![TransferMsg {
        id,
        tenant: Tenant::parse("acme").unwrap(),
        sku: Sku::parse(sku).unwrap(),
        units,
    }]
}

/// A scripted coordinator's answer to `req`: every ack confirmed and
/// every return applied, with `grants` and the directives `skus`.
pub fn sync_answer(
    req: &SyncRequest,
    grants: Vec<TransferMsg>,
    skus: Vec<SkuDirective>,
) -> SyncResponse {
    SyncResponse {
        limits: Default::default(),
        grants,
        confirmed: req.acks.clone(),
        applied_returns: req.returns.iter().map(|r| r.id.clone()).collect(),
        skus,
    }
}

/// A scripted coordinator's answer to a take: no units, and whether none
/// is left anywhere.
pub fn nothing_taken(sold_out_everywhere: bool) -> TakeResponse {
    TakeResponse {
        grant: None,
        sold_out_everywhere,
        paused: false,
    }
}

/// An empty batch of acme/drop at `now_ms`, for a test to fill.
pub fn batch_at(now_ms: u64) -> Batch {
    Batch::new(
        Tenant::parse("acme").unwrap(),
        Sku::parse("drop").unwrap(),
        now_ms,
    )
}

/// A store whose region lease is taken, holding SKU acme/drop of `total` units.
pub async fn store_with_sku(db: &TestDb, total: u64) -> (Arc<dyn Store>, Epoch) {
    let (store, _) = open_store(db).await;
    let epoch = store
        .take_lease(&RegionName::parse("eu").unwrap())
        .await
        .unwrap();
    let (tenant, sku) = (Tenant::parse("acme").unwrap(), Sku::parse("drop").unwrap());
    assert!(store
        .create_sku(epoch, &tenant, &sku, SkuSettings::default(), total)
        .await
        .unwrap());
    (store, epoch)
}

/// An agent serving on a loopback port.
pub struct TestAgent {
    pub url: String,
    pub state: AppState,
    pub clock: Option<Arc<ManualClock>>,
    sqlite: Option<Arc<SqliteStore>>,
    served: Served,
}

impl TestAgent {
    /// An agent on the system clock.
    pub async fn start(db: &TestDb) -> Self {
        Self::start_with(db, limits(), None).await
    }

    /// An agent on a manual clock starting at the current time.
    pub async fn start_manual(db: &TestDb) -> Self {
        let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
        Self::start_with(db, limits(), Some(clock)).await
    }

    pub async fn start_with(db: &TestDb, limits: Limits, clock: Option<Arc<ManualClock>>) -> Self {
        Self::start_with_settings(db, settings(limits), clock).await
    }

    pub async fn start_with_settings(
        db: &TestDb,
        settings: AgentSettings,
        clock: Option<Arc<ManualClock>>,
    ) -> Self {
        let (store, sqlite) = open_store(db).await;
        let dyn_clock: Arc<dyn Clock> = match &clock {
            Some(c) => c.clone(),
            None => Arc::new(SystemClock),
        };
        let state = start(store, dyn_clock, settings).await.unwrap();
        let served = Served::start(None, |listener, shutdown| {
            region_agent::run(listener, state.clone(), shutdown)
        })
        .await;
        Self {
            url: served.url.clone(),
            state,
            clock,
            sqlite,
            served,
        }
    }

    /// Waits until one of this agent's commits waits on a lock
    /// ([`TestDb::lock_writes`]).
    pub async fn wait_for_blocked_commit(&self, db: &TestDb) {
        match &self.sqlite {
            Some(store) => {
                eventually(
                    "a commit waits for the write lock",
                    Duration::from_secs(10),
                    async || store.writes_waiting() > 0,
                )
                .await
            }
            None => db.wait_for_lock_waiter().await,
        }
    }

    /// A reserve of `key` for `user` (of tenant `acme`) whose commit waits
    /// on a lock the test holds: until the lock is released the SKU's owner
    /// stays in that commit, and what is sent meanwhile queues behind it.
    pub async fn reserve_held_at_commit(
        &self,
        db: &TestDb,
        key: &str,
        user: &str,
        sku: &str,
    ) -> (Locked, JoinHandle<(StatusCode, Value)>) {
        let locked = db.lock_writes().await;
        let reserve = self.api().spawn_reserve(key, user, sku);
        self.wait_for_blocked_commit(db).await;
        (locked, reserve)
    }

    /// The owner of `tenant`'s `sku`, which must exist; dropped before the
    /// agent stops (its queue sender would keep the owner alive).
    pub fn owner(&self, tenant: &str, sku: &str) -> OwnerHandle {
        let (tenant, sku) = (Tenant::parse(tenant).unwrap(), Sku::parse(sku).unwrap());
        self.state.registry().get(&tenant, &sku).unwrap()
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

pub async fn stored(db: &TestDb, sku: &str) -> Stored {
    let counters = db
        .ints(&format!(
            "SELECT available, held, sold, received - returned FROM sku_stock \
             WHERE tenant = 'acme' AND sku = '{sku}'"
        ))
        .await;
    let sum = async |status: &str| {
        db.int(&format!(
            "SELECT COALESCE(sum(qty), 0) FROM reservations \
             WHERE tenant = 'acme' AND sku = '{sku}' AND status = '{status}'"
        ))
        .await
    };
    Stored {
        available: counters[0],
        held: counters[1],
        sold: counters[2],
        total: counters[3],
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

/// The request keys of every reservation, sorted.
pub async fn reservation_keys(db: &TestDb) -> Vec<String> {
    db.texts("SELECT request_key FROM reservations ORDER BY request_key")
        .await
}

/// On PostgreSQL, asserts that the SKU's counter row and the reservations
/// of `keys` were last written by one statement: one transaction (`xmin`)
/// and one command id (`cmin`). A transaction of several statements writes
/// its INSERT and its counter UPDATE under different command ids. SQLite
/// commits every group in such a transaction and shows neither column, so
/// there this checks nothing.
pub async fn assert_one_statement(db: &TestDb, sku: &str, keys: &[&str]) {
    if db.postgres_pool().is_none() {
        return;
    }
    let keys = keys
        .iter()
        .map(|key| format!("'{key}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let rows = db
        .texts(&format!(
            "SELECT r.request_key || ': ' || (r.xmin = s.xmin AND r.cmin = s.cmin)
             FROM reservations r JOIN sku_stock s ON s.tenant = r.tenant AND s.sku = r.sku
             WHERE s.tenant = 'acme' AND s.sku = '{sku}' AND r.request_key IN ({keys})
             ORDER BY r.request_key"
        ))
        .await;
    assert!(
        !rows.is_empty() && rows.iter().all(|row| row.ends_with("true")),
        "{sku}: not written with its counters by one statement: {rows:?}"
    );
}

/// Runs `n` futures made by `make` concurrently and collects their results in order.
pub async fn futures_join<F, T>(n: usize, make: impl Fn(usize) -> F) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = (0..n).map(|i| tokio::spawn(make(i))).collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Asserts that no cart lacks one of its items and no item (a reservation
/// keyed `{cart}/{sku}`) lacks its cart.
pub async fn assert_carts_whole(db: &TestDb) {
    let half = db
        .int(
            "SELECT count(*) FROM carts c WHERE c.items <> (SELECT count(*) FROM reservations r
               WHERE r.tenant = c.tenant AND r.request_key >= c.request_key || '/'
                 AND r.request_key < c.request_key || '0')",
        )
        .await;
    let orphans = db
        .int(
            "SELECT count(*) FROM reservations r WHERE r.request_key LIKE '%/%' AND NOT EXISTS (
               SELECT 1 FROM carts c WHERE c.tenant = r.tenant
                 AND r.request_key >= c.request_key || '/' AND r.request_key < c.request_key || '0')",
        )
        .await;
    assert_eq!(
        (half, orphans),
        (0, 0),
        "no half cart, no item without its cart"
    );
}
