//! The database's side of a durable hold, without HTTP: the agent's own
//! store (`region_agent::store`, the same statements, indexes and
//! transaction as the agent's group commit) driven from this process, one
//! batch of holds of one SKU after another, as the hot SKU's owner commits
//! them. With the HTTP ceiling's rate it gives the composed limit of a
//! durable hold on this machine, `1 / (1/ceiling + 1/database)`, against
//! which every phase is a share.

use std::time::{Duration, Instant};

use escrow_core::batch::{Batch, NewHold};
use escrow_core::ids::{Qty, RegionName, RequestKey, Sku, SkuSettings, Tenant, UserId};
use harness::database::ScratchDb;

use super::servers::db_name;
use super::{Settings, HOT_STOCK};
use crate::interference::{cpu_seconds_of, own_cpu_seconds};

/// Holds in each committed batch: about what the agent's hot SKU commits
/// at 256 buyers (its `batch / commit ms` column).
pub const LIMIT_BATCH: usize = 128;
/// How long a hold of the phase lasts; far beyond the run.
const HOLD_TTL_MS: u64 = 3_600_000;

/// The database's rate at the agent's commit, and what it cost.
#[derive(Debug, Clone)]
pub struct DatabaseLimit {
    /// Holds committed in the window.
    pub rows: u64,
    /// Transactions committed in the window.
    pub commits: u64,
    /// The window.
    pub elapsed: Duration,
    /// CPU seconds PostgreSQL's processes used in the window.
    pub database_cpu_s: f64,
    /// CPU seconds this process (the store's client side) used in the window.
    pub client_cpu_s: f64,
}

impl DatabaseLimit {
    /// Holds committed per second.
    pub fn rate(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Mean milliseconds per commit.
    pub fn commit_ms(&self) -> f64 {
        1000.0 * self.elapsed.as_secs_f64() / (self.commits as f64).max(1.0)
    }

    /// CPU microseconds per hold, PostgreSQL's and the client's.
    pub fn cpu_us_per_row(&self) -> (f64, f64) {
        let per = |s: f64| 1e6 * s / (self.rows as f64).max(1.0);
        (per(self.database_cpu_s), per(self.client_cpu_s))
    }
}

/// Commits batches of [`LIMIT_BATCH`] new holds of one SKU back to back
/// on a scratch database for the warm-up, then for the measurement window.
pub(super) async fn database_limit(settings: &Settings) -> anyhow::Result<DatabaseLimit> {
    let db = ScratchDb::create(&settings.database_url, &db_name("limit", "db")).await?;
    let measured = commit_back_to_back(settings, &db.url).await;
    db.drop().await?;
    measured
}

async fn commit_back_to_back(settings: &Settings, url: &str) -> anyhow::Result<DatabaseLimit> {
    let store = region_agent::store::open(url, settings.agent.db_pool_size).await?;
    let epoch = store.take_lease(&RegionName::parse("eu")?).await?;
    let (tenant, sku) = (Tenant::parse("bench")?, Sku::parse("limit")?);
    let sku_settings = SkuSettings::parse(None, None)?;
    store
        .create_sku(epoch, &tenant, &sku, sku_settings, HOT_STOCK)
        .await?;
    let mut next = 0u64;
    let mut batch = || -> anyhow::Result<Batch> {
        let now_ms = u64::try_from(chrono::Utc::now().timestamp_millis())?;
        let mut batch = Batch::new(tenant.clone(), sku.clone(), now_ms);
        for _ in 0..LIMIT_BATCH {
            next += 1;
            batch.holds.push(NewHold {
                borrow: None,
                request_key: RequestKey::parse(&format!("limit-{next}"))?,
                user_id: UserId::parse(&format!("u{next}"))?,
                qty: Qty::parse(1, 1)?,
                expires_at_ms: now_ms + HOLD_TTL_MS,
            });
        }
        Ok(batch)
    };
    let warm_until = Instant::now() + settings.warmup;
    while Instant::now() < warm_until {
        store.commit(epoch, &batch()?).await?;
    }
    let (database_before, client_before) = (cpu_seconds_of("postgres"), own_cpu_seconds());
    let started = Instant::now();
    let (mut rows, mut commits) = (0u64, 0u64);
    while started.elapsed() < settings.measure {
        let outcome = store.commit(epoch, &batch()?).await?;
        rows += outcome
            .inserted
            .iter()
            .filter(|&&inserted| inserted)
            .count() as u64;
        commits += 1;
    }
    let elapsed = started.elapsed();
    Ok(DatabaseLimit {
        rows,
        commits,
        elapsed,
        database_cpu_s: (cpu_seconds_of("postgres") - database_before).max(0.0),
        client_cpu_s: own_cpu_seconds() - client_before,
    })
}
