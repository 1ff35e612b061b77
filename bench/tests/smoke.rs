//! CI smoke of the benchmark harness: the load generator, the baseline
//! servers and the agent run for a fixed number of requests (a second or
//! two) against a real database, and every count is checked exactly: the
//! agent on PostgreSQL and on SQLite, the naive baseline on PostgreSQL. Speed
//! is never asserted; the benchmark itself is `cargo run --release -p bench -- all`.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bench::load::{self, LoadReport, LoadSpec, Workload};
use bench::naive::{self, Naive};
use bench::scenario::{audit_drift, put_sku};
use escrow_core::{RegionName, Tenant};
use harness::outcome::Outcome;
use harness::{ADMIN_TOKEN, TENANT, TENANT_KEY};
use region_agent::auth::Auth;
use region_agent::clock::SystemClock;
use region_agent::owner::Limits;
use region_agent::store::postgres::PgStore;
use region_agent::store::Store;
use region_agent::AgentSettings;
use sqlx::PgPool;
use test_support::TestDb;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

test_support::on_both_backends!(
    postgres: region_agent::store::postgres::MIGRATOR,
    sqlite: region_agent::store::sqlite::MIGRATOR;
    agent_sells_exactly_its_stock
);
test_support::postgres_only!(naive_sells_exactly_its_stock);

/// Buyers in every smoke run.
const CLIENTS: usize = 16;
/// Reserve calls per buyer.
const LOOPS: u64 = 10;

/// A server on a loopback port until `stop`.
struct Served {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

async fn serve_agent(db: &TestDb) -> Served {
    let settings = AgentSettings {
        region: RegionName::parse("eu").unwrap(),
        auth: Auth::new(
            vec![(Tenant::parse(TENANT).unwrap(), TENANT_KEY.to_owned())],
            Some(ADMIN_TOKEN.to_owned()),
        ),
        limits: Limits {
            max_in_flight: 256,
            max_waiting: 4096,
            wait_timeout_ms: 10_000,
        },
        coordinator: None,
        keys: region_agent::KeyMemory::default(),
    };
    let store: Arc<dyn Store> = match db.postgres_pool() {
        Some(pool) => Arc::new(PgStore::new(pool.clone())),
        None => region_agent::store::open(db.url(), 4).await.unwrap(),
    };
    let state = region_agent::start(store, Arc::new(SystemClock), settings)
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(region_agent::run(listener, state, async move {
        let _ = stopped.await;
    }));
    Served { addr, stop, task }
}

async fn serve_router(router: axum::Router) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    Served { addr, stop, task }
}

/// A fixed-count run: every buyer makes `LOOPS` loops, however long it takes.
async fn fixed(addr: SocketAddr, workload: Workload, run_id: &str) -> LoadReport {
    load::run(LoadSpec {
        addr,
        token: TENANT_KEY.into(),
        clients: CLIENTS,
        warmup: Duration::ZERO,
        measure: Duration::from_secs(120),
        loops_per_client: Some(LOOPS),
        workload,
        run_id: run_id.into(),
    })
    .await
    .unwrap()
}

fn one(sku: &str) -> Workload {
    Workload::Reserve {
        skus: vec![sku.into()],
    }
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Asserts that a fixed race of every client's requests for one SKU of
/// `units` held exactly `units` and answered every other SOLD_OUT.
fn assert_sells_exactly(race: &LoadReport, units: u64) {
    let requests = CLIENTS as u64 * LOOPS;
    let t = &race.total;
    assert_eq!(t.total(), requests, "{t}");
    assert_eq!(
        (t[Outcome::Held], t[Outcome::SoldOut]),
        (units, requests - units),
        "{t}"
    );
}

/// Goal: 160 distinct buyers racing for 40 units of the real agent get
/// exactly 40 HELD and 120 SOLD_OUT, the rows and counters agree, and a
/// reserve-then-settle loop confirms and releases exactly what it says.
async fn agent_sells_exactly_its_stock(db: TestDb) {
    let agent = serve_agent(&db).await;
    put_sku(agent.addr, "drop", 40).await.unwrap();

    let race = fixed(agent.addr, one("drop"), "race").await;
    let requests = CLIENTS as u64 * LOOPS;
    assert_sells_exactly(&race, 40);
    assert_eq!(race.window, race.total, "a fixed run counts everything");
    assert_eq!(race.reserve_latency.len(), requests);
    let held_rows = "SELECT count(*) FROM reservations WHERE sku = 'drop' AND status = 'HELD'";
    assert_eq!(db.int(held_rows).await, 40);
    let available = "SELECT available FROM sku_stock WHERE sku = 'drop'";
    assert_eq!(db.int(available).await, 0);

    put_sku(agent.addr, "mix", 1_000).await.unwrap();
    let mix = fixed(agent.addr, Workload::Settle { sku: "mix".into() }, "mix").await;
    let t = &mix.total;
    assert_eq!(t[Outcome::Held], requests, "{t}");
    assert_eq!(
        t[Outcome::Confirmed] + t[Outcome::Released],
        requests,
        "{t}"
    );
    assert_eq!(t[Outcome::Confirmed], requests / 2, "{t}");
    assert_eq!(t.failures(), 0, "{t}");
    let sold_rows = "SELECT count(*) FROM reservations WHERE sku = 'mix' AND status = 'SOLD'";
    assert_eq!(db.int(sold_rows).await, (requests / 2) as i64);
    let available = "SELECT available FROM sku_stock WHERE sku = 'mix'";
    assert_eq!(db.int(available).await, 1_000 - (requests / 2) as i64);

    assert_eq!(audit_drift(agent.addr).await.unwrap(), 0);
    agent.stop().await;
}

/// Goal: the naive baseline is a correct server too: 40 units give exactly
/// 40 HELD and 120 SOLD_OUT, 40 rows and nothing left.
async fn naive_sells_exactly_its_stock(pool: PgPool) {
    naive::prepare(&pool).await.unwrap();
    let server = serve_router(naive::app(Naive {
        pool: pool.clone(),
        tenant: TENANT.into(),
        tenant_key: TENANT_KEY.into(),
        admin_token: ADMIN_TOKEN.into(),
    }))
    .await;
    put_sku(server.addr, "drop", 40).await.unwrap();

    let race = fixed(server.addr, one("drop"), "race").await;
    assert_sells_exactly(&race, 40);
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM naive_reservations").await,
        40
    );
    assert_eq!(scalar(&pool, "SELECT available FROM naive_stock").await, 0);
    server.stop().await;
}

/// Goal: the HTTP ceiling answers every valid request 201 and refuses a
/// wrong key, so its rate counts only well-formed work.
#[tokio::test]
async fn ceiling_answers_every_request() {
    let server = serve_router(bench::ceiling::app(bench::ceiling::Ceiling {
        tenant_key: TENANT_KEY.into(),
    }))
    .await;
    let run = fixed(server.addr, one("drop"), "c").await;
    assert_eq!(
        run.total[Outcome::Held],
        CLIENTS as u64 * LOOPS,
        "{}",
        run.total
    );

    let mut wrong = LoadSpec {
        addr: server.addr,
        token: "wrong".into(),
        clients: 1,
        warmup: Duration::ZERO,
        measure: Duration::from_secs(60),
        loops_per_client: Some(3),
        workload: one("drop"),
        run_id: "w".into(),
    };
    let refused = load::run(wrong.clone()).await.unwrap();
    assert_eq!(refused.total[Outcome::Unauthorized], 3, "{}", refused.total);
    wrong.token = TENANT_KEY.into();
    wrong.workload = one("not a sku");
    let bad = load::run(wrong).await.unwrap();
    assert_eq!(bad.total[Outcome::BadRequest], 3, "{}", bad.total);
    server.stop().await;
}
