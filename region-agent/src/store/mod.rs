//! The agent's storage, behind a narrow interface.
//!
//! Everything the agent persists goes through [`Store`]: taking the region's
//! fencing epoch, loading SKUs at start, committing one owner's batch in a
//! single transaction, and the reads that answer buyers and admins. One
//! implementation, [`SqlStore`], serves both backends with the same
//! guarantees, its SQL written once over `service_kit::sql`: [`postgres`]
//! (the production choice, a server) and [`sqlite`] (an embedded file, the
//! default when no URL is given) say what each does its own way. [`open`]
//! picks one by the URL's scheme. No driver's error type crosses this
//! interface: its errors arrive as [`StoreError`]s.
//!
//! - [`sql_store`]: the store, its reads and its small writes.
//! - [`commit`]: a group of batches committed in one transaction.
//! - [`holds`]: the INSERT of a group's new holds, which both ways of
//!   committing a group share.
//! - [`rows`]: stored rows into domain types.

mod carts;
mod commit;
mod holds;
mod limits;
pub mod postgres;
mod rows;
mod sql_store;
pub mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;
use escrow_core::cart::{Cart, CartCommit, CartWritten};
use escrow_core::protocol::{Borrow, LendAnswer, TransferMsg};
use escrow_core::{
    Ledger, RegionName, RequestKey, Reservation, Sku, SkuSettings, Tenant, TransferId,
};

pub use escrow_core::batch::{Batch, BatchOutcome, NewHold, SkuRecord, StockChange};
pub use sql_store::SqlStore;

/// The fencing token this process holds for its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(pub i64);

/// Why a storage call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Another process took the region's lease; this one must stop writing.
    #[error("fenced: region lease is held by a newer epoch")]
    Fenced,
    /// A conditional write changed fewer rows than decided, or a constraint
    /// refused it: memory and database disagree.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The database belongs to another region.
    #[error("database belongs to region {0}")]
    WrongRegion(String),
    /// The database could not be reached or failed; the backend's message.
    #[error("database error: {0}")]
    Database(String),
    /// A commit was asked for and not answered (the connection broke, or
    /// no answer came in time): it may have happened, on the primary alone
    /// or on its standby too.
    #[error("commit outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// A cart's item (by its place in the cart) could not be inserted: its
    /// user has an active reservation of the SKU. Nothing was written.
    #[error("the cart's item {item} was refused")]
    CartItemRefused {
        /// The item's place in the cart.
        item: usize,
    },
}

/// Why [`Store::commit_all`] committed nothing.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error}")]
pub struct BatchError {
    /// The batch (by index) whose own writes failed; `None` if the
    /// transaction failed as a whole (connection, lease, commit).
    pub batch: Option<usize>,
    /// What failed.
    pub error: StoreError,
}

impl BatchError {
    /// A failure of the transaction, not of one batch.
    pub fn whole(error: StoreError) -> Self {
        Self { batch: None, error }
    }
}

/// Opens the store `url` names, creating and migrating its schema:
/// `postgres://` or `postgresql://` with `pool_size` connections,
/// `sqlite://PATH` (the file is created if missing) with `pool_size`
/// readers beside its one writer.
pub async fn open(url: &str, pool_size: u32) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(SqlStore::open(url, pool_size).await?))
}

impl From<service_kit::sql::Error> for StoreError {
    fn from(error: service_kit::sql::Error) -> Self {
        use service_kit::sql::Error;
        match error {
            Error::Corrupt(why) => rows::bad_row(&why),
            Error::CheckViolation(message)
            | Error::Database(message)
            | Error::Unanswered(message) => StoreError::Database(message),
        }
    }
}

/// A write to a SKU's counter row must change exactly that row; anything
/// else means memory believes in a SKU the database does not hold.
pub(crate) fn one_sku_row(changed: u64) -> Result<(), StoreError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::Conflict(format!(
            "the SKU's row: {changed} rows changed"
        )))
    }
}

/// Where a database's stock came from (see [`Store::provenance`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// `tenant/sku` of SKUs whose received units are not all grants.
    pub not_granted: Vec<String>,
    /// Whether any grant from a coordinator was ever credited here.
    pub has_grants: bool,
}

/// What the agent tells the coordinator, read in one snapshot so counters,
/// applied grants and debited returns agree with each other.
#[derive(Debug, Clone, Default)]
pub struct SyncSnapshot {
    /// Every SKU's counters.
    pub skus: Vec<(Tenant, Sku, Ledger)>,
    /// Grants credited and not yet confirmed by the coordinator.
    pub unconfirmed_grants: Vec<TransferId>,
    /// Returns debited and not yet confirmed applied.
    pub pending_returns: Vec<TransferMsg>,
    /// Borrowed places asked for and not yet used or given back.
    pub borrow_asks: Vec<Borrow>,
    /// Borrowed places to give back.
    pub borrow_returns: Vec<Borrow>,
}

/// A SKU's line in the audit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditRow {
    /// The SKU's tenant.
    pub tenant: String,
    /// The SKU.
    pub sku: String,
    /// The region's quota: received - returned (standalone: the SKU's
    /// total, which is what the audit calls it).
    #[serde(rename = "total")]
    pub quota: i64,
    /// Stored counter.
    pub available: i64,
    /// Stored counter.
    pub held: i64,
    /// Stored counter.
    pub sold: i64,
    /// `available + held + sold - total`; 0 unless something is broken.
    pub drift: i64,
    /// `|rows held - held| + |rows sold - sold|`: counters against reservation rows.
    pub rows_drift: i64,
}

/// The agent's persistence.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Takes a new epoch for `region`, fencing off any earlier holder.
    async fn take_lease(&self, region: &RegionName) -> Result<Epoch, StoreError>;
    /// Whether the database answers and the schema is in place.
    async fn ready(&self) -> Result<(), StoreError>;
    /// Every SKU with its counters and row sums.
    async fn load_skus(&self) -> Result<Vec<SkuRecord>, StoreError>;
    /// One SKU with its counters and row sums.
    async fn load_sku(&self, tenant: &Tenant, sku: &Sku) -> Result<Option<SkuRecord>, StoreError>;
    /// Calls `each` with every request key a tenant has used for a SKU and
    /// when its reservation was created (ms since the epoch), row by row as
    /// they stream in: millions of keys never sit in memory at once.
    async fn for_each_key(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        each: &mut (dyn FnMut(RequestKey, u64) + Send),
    ) -> Result<(), StoreError>;
    /// Creates a SKU holding `total` units; false if it already exists.
    async fn create_sku(
        &self,
        epoch: Epoch,
        tenant: &Tenant,
        sku: &Sku,
        settings: SkuSettings,
        total: u64,
    ) -> Result<bool, StoreError>;
    /// Commits several batches (of different SKUs) in one transaction,
    /// one durable flush for all of them, all or nothing: on failure no
    /// batch is committed, and the error says which batch failed, if one did.
    async fn commit_all(
        &self,
        epoch: Epoch,
        batches: &[&Batch],
    ) -> Result<Vec<BatchOutcome>, BatchError>;

    /// Waits until the database's primary moves to another host (never, by
    /// default): a commit in flight on the old one will not be answered.
    async fn primary_moved(&self) {
        std::future::pending::<()>().await;
    }

    /// Commits one batch in one transaction, or nothing.
    async fn commit(&self, epoch: Epoch, batch: &Batch) -> Result<BatchOutcome, StoreError> {
        let mut outcomes = self
            .commit_all(epoch, &[batch])
            .await
            .map_err(|e| e.error)?;
        Ok(outcomes.pop().expect("one outcome per batch"))
    }
    /// The reservation a tenant's key created.
    async fn reservation(
        &self,
        tenant: &Tenant,
        key: &RequestKey,
    ) -> Result<Option<Reservation>, StoreError>;
    /// The reservations of several keys of one tenant.
    async fn reservations(
        &self,
        tenant: &Tenant,
        keys: &[RequestKey],
    ) -> Result<Vec<Reservation>, StoreError>;
    /// Writes several carts' steps and their items' rows and counters in
    /// one transaction, or nothing; a cart whose item was refused is named
    /// ([`StoreError::CartItemRefused`]).
    async fn commit_carts(
        &self,
        epoch: Epoch,
        carts: &[&CartCommit],
    ) -> Result<Vec<CartWritten>, BatchError>;
    /// The cart a tenant's key created.
    async fn cart(&self, tenant: &Tenant, key: &RequestKey) -> Result<Option<Cart>, StoreError>;
    /// Every held cart's tenant, key and expiry (ms since the epoch).
    async fn held_carts(&self) -> Result<Vec<(Tenant, RequestKey, u64)>, StoreError>;
    /// Counters against totals and rows, for every SKU.
    async fn audit(&self) -> Result<Vec<AuditRow>, StoreError>;
    /// Where this database's stock came from: SKUs holding units received
    /// otherwise than as grants (a standalone agent's), and whether any
    /// grant was ever credited (a coordinator-managed agent's).
    async fn provenance(&self) -> Result<Provenance, StoreError>;
    /// Counters, unconfirmed grants and pending returns, in one snapshot.
    async fn sync_snapshot(&self) -> Result<SyncSnapshot, StoreError>;
    /// Records that the coordinator has these grants' acknowledgements.
    async fn confirm_grants(&self, ids: &[TransferId]) -> Result<(), StoreError>;
    /// Forgets returns the coordinator has applied.
    async fn forget_returns(&self, ids: &[TransferId]) -> Result<(), StoreError>;
    /// Records a borrow for the hold of `key` as asked, before the ask is
    /// sent ([`escrow_core::user_limit`]).
    async fn ask_borrow(
        &self,
        epoch: Epoch,
        borrow: &Borrow,
        key: &RequestKey,
    ) -> Result<(), StoreError>;
    /// Marks a borrow no hold used for return; a used one stays.
    async fn give_back_borrow(&self, epoch: Epoch, id: &TransferId) -> Result<(), StoreError>;
    /// Forgets borrows that are settled: refused, or home again.
    async fn forget_borrows(&self, ids: &[TransferId]) -> Result<(), StoreError>;
    /// As a home region: lends the places asked for where each user holds
    /// nothing of the SKU here, and answers each ask, durably.
    async fn lend(
        &self,
        epoch: Epoch,
        asks: &[Borrow],
        now_ms: u64,
    ) -> Result<Vec<LendAnswer>, StoreError>;
    /// As a home region: takes lent places back.
    async fn take_back(
        &self,
        epoch: Epoch,
        loans: &[Borrow],
        now_ms: u64,
    ) -> Result<(), StoreError>;
    /// Deletes at most `limit` released or expired reservations whose hold
    /// ended before `before_ms` (their `expires_at`: a hold ends at the
    /// latest then), as many such carts, and at most `limit` grants the
    /// coordinator confirmed before it. SOLD reservations stay: they are the sales, the per-user
    /// limit counts them, and the counters are checked against them. Call
    /// again until fewer than `limit` of each are deleted.
    async fn prune(&self, before_ms: u64, limit: u32) -> Result<Pruned, StoreError>;
}

/// What one call of [`Store::prune`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The reservations' tenants and keys, to forget in memory too.
    pub reservations: Vec<(Tenant, RequestKey)>,
    /// Confirmed grants deleted.
    pub grants: u64,
    /// Released or expired carts deleted (their items are among
    /// `reservations`).
    pub carts: u64,
}
