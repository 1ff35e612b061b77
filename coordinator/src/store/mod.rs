//! The coordinator's books, in PostgreSQL or in an embedded SQLite file.
//!
//! Every change is made in transactions that lock at most one SKU: lock
//! the rows it concerns (`FOR UPDATE`; on SQLite the file's write lock,
//! taken first), load the SKU into escrow-core's [`Allocation`], let the
//! rules decide, and write the difference back, each write a conditional
//! statement whose affected-row count is checked. A sync is one such
//! transaction per SKU it concerns, after a short one on the region's
//! agent row; no lock is held across SKUs, so nothing waits for a whole
//! region and no two transactions can deadlock. Nothing here decides how
//! units move; see `escrow_core::allocation`.
//!
//! - [`books`]: loading an [`Allocation`] from its rows and writing it back.
//! - [`region`]: the region API's sync and take.
//! - [`limits`]: borrowed places relayed between regions under a global
//!   per-user limit.
//! - [`admin`]: the admin API's changes and read-only summaries.
//! - [`backend`]: the one place that knows the two backends apart; the
//!   transactions above are written once for both.

pub mod admin;
mod backend;
mod books;
mod limits;
pub mod region;
pub mod retention;

use std::sync::Arc;

use escrow_core::allocation::{AllocationError, Moves};
use escrow_core::{Allocation, RegionName, TransferId};

use crate::notices::Notices;
use backend::{sql, Db};

pub use admin::{
    AdminKey, Applied, Listing, RegionSummary, RegionSync, SkuLine, SkuPage, SkuSpec, SkuSummary,
};

/// The embedded migrations of the coordinator on PostgreSQL.
pub static POSTGRES_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/coordinator");

/// The embedded migrations of the coordinator on SQLite: the same schema.
pub static SQLITE_MIGRATOR: sqlx::migrate::Migrator =
    sqlx::migrate!("../migrations/coordinator-sqlite");

/// Why a store operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such SKU (or the region has no part in it).
    #[error("unknown sku")]
    UnknownSku,
    /// The change would need units that are leased, held or sold, or it
    /// raced a creation of the same SKU.
    #[error("{0}")]
    Conflict(String),
    /// A request from an agent process older than one already seen.
    #[error("stale agent epoch")]
    StaleEpoch,
    /// A message that cannot be right (e.g. a transfer id reused for another SKU).
    #[error("invalid: {0}")]
    Invalid(String),
    /// A row did not hold what this transaction read under its lock, or
    /// held a value its schema forbids: a bug or a corrupt database.
    #[error("corrupt or changed under lock: {0}")]
    Corrupt(String),
    /// The database could not be reached or failed; the driver's message.
    #[error("database error: {0}")]
    Database(String),
}

impl From<AllocationError> for StoreError {
    fn from(error: AllocationError) -> Self {
        match error {
            AllocationError::StaleEpoch => StoreError::StaleEpoch,
            AllocationError::TotalBelowPool { .. } => StoreError::Conflict(error.to_string()),
            AllocationError::Invalid(why) => StoreError::Invalid(why),
        }
    }
}

/// The coordinator's persistence.
#[derive(Debug, Clone)]
pub struct Store {
    db: Db,
    notices: Arc<Notices>,
}

impl Store {
    /// Opens the database `url` names, creating and migrating its schema:
    /// `postgres://` or `postgresql://` with `pool_size` connections, or
    /// `sqlite://PATH` (the file is created if missing) with `pool_size`
    /// readers beside its one writer.
    pub async fn open(url: &str, pool_size: u32) -> Result<Self, StoreError> {
        let base =
            u64::try_from(chrono::Utc::now().timestamp_millis()).expect("the clock is after 1970");
        Ok(Self {
            db: Db::open(url, pool_size, &POSTGRES_MIGRATOR, &SQLITE_MIGRATOR).await?,
            notices: Arc::new(Notices::new(base)),
        })
    }

    /// The regions' notice numbers, for their watch calls.
    pub fn notices(&self) -> &Notices {
        &self.notices
    }

    /// Saves the change of `loaded` from `before`, commits `tx`, then
    /// [`Store::observe`]s it: an admin change's or a take's end.
    async fn commit_change(
        &self,
        mut tx: backend::Tx,
        before: &Allocation,
        loaded: &books::Loaded,
        moves: &Moves,
    ) -> Result<(), StoreError> {
        books::save(&mut tx, Some(before), &loaded.allocation, &loaded.names).await?;
        tx.commit().await?;
        self.observe(Some(before), &loaded.allocation, &loaded.names, moves, None);
        Ok(())
    }

    /// After a commit that took the SKU from `before` (`None`: created) to
    /// `after`: counts what a rebalance did, logs a tail merge, tells each
    /// region with something to do (`names` by region index) at once, and
    /// records news for every region whose directive changed, except
    /// `answered`, the syncing region, which has its directive already.
    fn observe(
        &self,
        before: Option<&Allocation>,
        after: &Allocation,
        names: &[RegionName],
        moves: &Moves,
        answered: Option<usize>,
    ) {
        observe(after, moves);
        let notify = moves.regions_to_notify(names.len());
        for i in &notify {
            self.notices.notify(&names[*i]);
        }
        for (i, name) in names.iter().enumerate() {
            let was = before
                .filter(|b| i < b.regions.len())
                .map(|b| b.directive(i));
            let changed = notify.contains(&i) || was != Some(after.directive(i));
            if changed && answered != Some(i) {
                self.notices.record(name, &after.tenant, &after.sku);
            }
        }
    }

    /// Whether the database answers and the schema is in place.
    pub async fn ready(&self) -> Result<(), StoreError> {
        let mut tx = self.db.snapshot().await?;
        sql("SELECT 1 FROM regions LIMIT 1")
            .fetch_optional(&mut tx)
            .await?;
        Ok(tx.commit().await?)
    }
}

/// A grant id no other transfer has.
fn new_grant_id() -> TransferId {
    TransferId::try_from(format!("g-{}", uuid::Uuid::new_v4()))
        .expect("g- and a uuid is a valid id")
}

/// Counts what a rebalance did in the metrics and logs a tail merge.
fn observe(allocation: &Allocation, moves: &Moves) {
    metrics::counter!("coordinator_granted_units_total").increment(moves.granted_units());
    if moves.merged {
        tracing::info!(tenant = %allocation.tenant, sku = %allocation.sku, "tail merge: SKU switched to central mode");
        metrics::counter!("coordinator_tail_merges_total").increment(1);
    }
}
