//! The runs the `bench` command performs, each against fresh servers.
//!
//! [`compare`] is the side-by-side table: the HTTP ceiling, the
//! database's own rate at the agent's commit (`limit.rs`), the naive
//! baseline and the agent (hot SKU, sold-out path, 100 SKUs, confirm and
//! release mix), each a separate process on loopback, the two storing
//! servers on their own scratch databases of the same PostgreSQL; then the
//! agent again on its embedded SQLite backend (hot SKU, sold-out path, 100
//! SKUs), on a scratch file, durable the same way (WAL synced at commit);
//! and on a formation with a synchronous standby (hot SKU, 100 SKUs, a
//! failover).
//! [`sweep_batch`] and [`sweep_clients`] show how the agent's throughput
//! moves with its batch bound (`--max-in-flight`) and with the number of
//! concurrent buyers.
//!
//! This file holds what every run shares: the settings, the stock of each
//! phase, creating SKUs, the audit, and a load run with its measurements.
//! The servers under test are started in `servers.rs`, the comparison's
//! phases run in `comparison.rs` (the coordinated ones in
//! `coordinated.rs`, the standby's in `standby.rs`), and the sweeps in
//! `sweeps.rs`.

mod comparison;
mod coordinated;
mod limit;
mod servers;
mod standby;
mod sweeps;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use harness::client::{self, Bearer};
use harness::outcome::Outcome;
use harness::process::Binaries;
use harness::{ADMIN_TOKEN, TENANT, TENANT_KEY};
use hyper::{Method, StatusCode};
use serde_json::json;

use crate::interference::Watch;
use crate::load::{self, LoadReport, LoadSpec, Workload};
use crate::metrics::CommitCounters;

pub use comparison::{compare, hot_only, Comparison, CART_SKUS};
pub use limit::{DatabaseLimit, LIMIT_BATCH};
pub use standby::StandbyPhases;
pub use sweeps::{sweep_batch, sweep_clients, SweepPoint, SWEEP_CLIENTS, SWEEP_MAX_IN_FLIGHT};

/// Units of the hot SKU: far more than any run on this machine sells, so
/// the hot phase measures selling, never selling out.
pub const HOT_STOCK: u64 = 100_000_000;
/// Units of the SKU the sold-out phase sells out during its warm-up.
pub const SOLD_OUT_STOCK: u64 = 1_000;
/// SKUs in the multi-SKU phase.
pub const MULTI_SKUS: usize = 100;
/// Units of each SKU in the multi-SKU phase.
pub const MULTI_STOCK: u64 = 10_000_000;
/// Warm SKUs beside the hot one in the whole-drop phase.
pub const DROP_WARM_SKUS: usize = 99;

/// The region agent's flags that shape its hot path.
#[derive(Debug, Clone, Copy)]
pub struct AgentFlags {
    /// `--max-in-flight`: most requests one SKU owner commits per transaction.
    pub max_in_flight: u32,
    /// `--db-pool-size`.
    pub db_pool_size: u32,
    /// `--max-waiting`: most requests queued per SKU owner.
    pub max_waiting: u32,
}

impl AgentFlags {
    /// The flags as the agent's command line.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--max-in-flight".into(),
            self.max_in_flight.to_string(),
            "--db-pool-size".into(),
            self.db_pool_size.to_string(),
            "--max-waiting".into(),
            self.max_waiting.to_string(),
        ]
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A superuser URL of the PostgreSQL to use (scratch databases are made there).
    pub database_url: String,
    /// Concurrent buyers.
    pub clients: usize,
    /// Warm-up before each measurement window.
    pub warmup: Duration,
    /// Each measurement window of the comparison.
    pub measure: Duration,
    /// Each measurement window of the sweeps.
    pub sweep_measure: Duration,
    /// The agent's flags.
    pub agent: AgentFlags,
    /// The naive server's connection pool.
    pub naive_pool_size: u32,
    /// Whether the comparison runs the agent on a synchronous standby too
    /// (`scripts/ha-region`; needs pg_auto_failover).
    pub standby: bool,
    /// Where the server binaries are.
    pub binaries: Binaries,
}

/// Where an agent under test stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentBackend {
    /// A scratch database on the run's PostgreSQL.
    Postgres,
    /// A scratch SQLite file.
    Sqlite,
    /// An empty database at this URL, neither created nor dropped here
    /// (a highly available formation's multi-host URL).
    Url(String),
}

/// Creates (or resets) a SKU through the admin API.
pub async fn put_sku(addr: SocketAddr, sku: &str, total: u64) -> anyhow::Result<()> {
    let admin = Bearer::new(ADMIN_TOKEN)?;
    let path = format!("/v1/admin/skus/{TENANT}/{sku}");
    let (status, body) = client::once(
        addr,
        Method::PUT,
        &path,
        &admin,
        Some(json!({"total": total})),
    )
    .await?;
    anyhow::ensure!(status.is_success(), "PUT {path} answered {status}: {body}");
    Ok(())
}

/// The agent's audit: the sum of |drift| over every SKU (must be 0).
pub async fn audit_drift(addr: SocketAddr) -> anyhow::Result<i64> {
    let admin = Bearer::new(ADMIN_TOKEN)?;
    let (status, body) = client::once(addr, Method::GET, "/v1/admin/audit", &admin, None).await?;
    anyhow::ensure!(status == StatusCode::OK, "audit answered {status}: {body}");
    body["drift_total"]
        .as_i64()
        .context("audit body has drift_total")
}

fn spec(
    settings: &Settings,
    addr: SocketAddr,
    clients: usize,
    measure: Duration,
    workload: Workload,
    run_id: &str,
) -> LoadSpec {
    LoadSpec {
        addr,
        token: TENANT_KEY.into(),
        clients,
        warmup: settings.warmup,
        measure,
        loops_per_client: None,
        workload,
        run_id: run_id.into(),
    }
}

/// Runs `spec`, noting how much of the machine other processes used meanwhile.
async fn watched_load(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let watch = Watch::start();
    let report = load::run(spec).await;
    let others = watch.stop();
    let mut report = report?;
    report.others_share = Some(others.foreign_share(cores));
    Ok(report)
}

/// Runs `spec` against an agent, with its commit counters over the run.
async fn agent_load(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    let addr = spec.addr;
    let before = CommitCounters::read(addr).await?;
    let mut report = watched_load(spec).await?;
    let after = CommitCounters::read(addr).await?;
    report.commits = Some(after.since(&before));
    Ok(report)
}

fn hot(sku: &str) -> Workload {
    Workload::Reserve {
        skus: vec![sku.to_owned()],
    }
}

/// Outcomes that count as a sale in a hot or multi-SKU phase.
pub const SALES: [Outcome; 1] = [Outcome::Held];
/// Outcomes that count as a rejection in the sold-out phase.
pub const REJECTIONS: [Outcome; 1] = [Outcome::SoldOut];
/// Outcomes that count as a settled hold in the mix.
pub const SETTLES: [Outcome; 2] = [Outcome::Confirmed, Outcome::Released];
