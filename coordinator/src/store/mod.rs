//! The coordinator's books in PostgreSQL.
//!
//! Every operation is one transaction: lock the rows it concerns (`FOR
//! UPDATE`, SKUs in (tenant, sku) order, so concurrent syncs of different
//! regions never deadlock), load each SKU into escrow-core's
//! [`Allocation`], let the rules decide, and write the difference back,
//! each write a conditional statement whose affected-row count is checked.
//! Nothing here decides how units move; see `escrow_core::allocation`.
//!
//! - [`books`]: loading an [`Allocation`] from its rows and writing it back.
//! - [`region`]: the region API's sync and take.
//! - [`admin`]: the admin API's changes and read-only summaries.

pub mod admin;
mod books;
pub mod region;

use std::sync::Arc;

use escrow_core::allocation::{AllocationError, Moves};
use escrow_core::{Allocation, RegionName};
use sqlx::PgPool;

use crate::notices::Notices;

pub use admin::{parse_weights, RegionSummary, RegionSync, SkuSpec, SkuSummary};

/// The embedded migrations of the coordinator.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/coordinator");

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
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
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
    pool: PgPool,
    notices: Arc<Notices>,
}

impl Store {
    /// Wraps a pool whose database has the coordinator's migrations applied.
    pub fn new(pool: PgPool) -> Self {
        let base =
            u64::try_from(chrono::Utc::now().timestamp_millis()).expect("the clock is after 1970");
        Self {
            pool,
            notices: Arc::new(Notices::new(base)),
        }
    }

    /// The regions' notice numbers, for their watch calls.
    pub fn notices(&self) -> &Notices {
        &self.notices
    }

    /// After a commit: counts what a rebalance did, logs a tail merge, and
    /// tells each region with something to do (`names` by region index).
    fn observe(&self, allocation: &Allocation, names: &[RegionName], moves: &Moves) {
        observe(allocation, moves);
        for i in moves.regions_to_notify(names.len()) {
            self.notices.notify(&names[i]);
        }
    }

    /// Whether the database answers and the schema is in place.
    pub async fn ready(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1 FROM regions LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(())
    }
}

/// A grant id no other transfer has.
fn new_grant_id() -> String {
    format!("g-{}", uuid::Uuid::new_v4())
}

/// Counts what a rebalance did in the metrics and logs a tail merge.
fn observe(allocation: &Allocation, moves: &Moves) {
    metrics::counter!("coordinator_granted_units_total").increment(moves.granted_units());
    if moves.merged {
        tracing::info!(tenant = %allocation.tenant, sku = %allocation.sku, "tail merge: SKU switched to central mode");
        metrics::counter!("coordinator_tail_merges_total").increment(1);
    }
}
