//! The agent's storage, behind a narrow interface.
//!
//! Everything the agent persists goes through [`Store`]: taking the region's
//! fencing epoch, loading SKUs at start, committing one owner's batch in a
//! single transaction, and the reads that answer buyers and admins. The
//! PostgreSQL implementation is in [`postgres`]; an embedded backend can
//! implement the same trait without touching the owners or the HTTP layer.

pub mod postgres;

use async_trait::async_trait;
use escrow_core::protocol::TransferMsg;
use escrow_core::{
    Ledger, Mode, Qty, RegionName, RequestKey, Reservation, Sku, SkuSettings, Tenant, Transition,
    UserId,
};

/// The fencing token this process holds for its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(pub i64);

/// Why a storage call failed.
#[derive(Debug, thiserror::Error)]
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
    /// The database could not be reached or failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// One SKU as stored: counters, settings, and what its rows add up to.
#[derive(Debug, Clone)]
pub struct SkuRecord {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// The SKU.
    pub sku: Sku,
    /// The stored counters.
    pub ledger: Ledger,
    /// The admin's settings.
    pub settings: SkuSettings,
    /// Whether an admin paused it.
    pub paused: bool,
    /// Escrow or central (coordinator mode).
    pub mode: Mode,
    /// Units in HELD rows.
    pub rows_held: u64,
    /// Units in SOLD rows.
    pub rows_sold: u64,
}

impl SkuRecord {
    /// Whether the stored counters agree with the reservation rows.
    pub fn rows_agree(&self) -> bool {
        self.ledger.is_balanced()
            && self.ledger.held == self.rows_held
            && self.ledger.sold == self.rows_sold
    }
}

/// A hold the owner wants to create.
#[derive(Debug, Clone)]
pub struct NewHold {
    /// The buyer's key.
    pub request_key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// Units.
    pub qty: Qty,
    /// Expiry, ms since the epoch.
    pub expires_at_ms: u64,
}

/// An admin change to a SKU's counters or settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockChange {
    /// New units arrive in available.
    Receive(u64),
    /// Available units leave the region.
    GiveBack(u64),
    /// New settings.
    Settings(SkuSettings),
    /// Stop or resume selling.
    Pause(bool),
    /// Switch between escrow and central selling.
    Mode(Mode),
}

/// Everything one owner commits in one transaction.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// The SKU.
    pub sku: Sku,
    /// The owner's clock at decision time, ms since the epoch.
    pub now_ms: u64,
    /// Holds to insert if their key and user are free.
    pub holds: Vec<NewHold>,
    /// Decided transitions of existing reservations, with their quantities.
    pub transitions: Vec<(RequestKey, Qty, Transition)>,
    /// Whether to expire every due hold of the SKU.
    pub sweep: bool,
    /// Admin changes.
    pub changes: Vec<StockChange>,
    /// Grants from the coordinator to credit, each at most once.
    pub grants: Vec<TransferMsg>,
    /// Returns to the coordinator to debit and put in the outbox.
    pub returns: Vec<TransferMsg>,
}

impl Batch {
    /// An empty batch for one SKU at `now_ms`.
    pub fn new(tenant: Tenant, sku: Sku, now_ms: u64) -> Self {
        Self {
            tenant,
            sku,
            now_ms,
            holds: Vec::new(),
            transitions: Vec::new(),
            sweep: false,
            changes: Vec::new(),
            grants: Vec::new(),
            returns: Vec::new(),
        }
    }

    /// Whether committing it would change nothing.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
            && self.transitions.is_empty()
            && !self.sweep
            && self.changes.is_empty()
            && self.grants.is_empty()
            && self.returns.is_empty()
    }
}

/// What a committed batch did that the owner could not know in advance.
#[derive(Debug, Clone, Default)]
pub struct BatchOutcome {
    /// For each of `Batch::holds`, whether its row was inserted.
    pub inserted: Vec<bool>,
    /// Holds the sweep expired, with their quantities.
    pub expired: Vec<(RequestKey, Qty)>,
    /// Ids of grants credited now (not seen before).
    pub applied_grants: Vec<String>,
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
    pub unconfirmed_grants: Vec<String>,
    /// Returns debited and not yet confirmed applied.
    pub pending_returns: Vec<TransferMsg>,
}

/// A SKU's line in the audit.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditRow {
    /// The SKU's tenant.
    pub tenant: String,
    /// The SKU.
    pub sku: String,
    /// The region's quota: received - returned.
    pub total: i64,
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
    /// Every request key a tenant has used for a SKU.
    async fn keys_of(&self, tenant: &Tenant, sku: &Sku) -> Result<Vec<RequestKey>, StoreError>;
    /// Creates a SKU holding `total` units; false if it already exists.
    async fn create_sku(
        &self,
        epoch: Epoch,
        tenant: &Tenant,
        sku: &Sku,
        settings: SkuSettings,
        total: u64,
    ) -> Result<bool, StoreError>;
    /// Commits one batch in one transaction, or nothing.
    async fn commit(&self, epoch: Epoch, batch: &Batch) -> Result<BatchOutcome, StoreError>;
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
    /// Counters against totals and rows, for every SKU.
    async fn audit(&self) -> Result<Vec<AuditRow>, StoreError>;
    /// Where this database's stock came from: SKUs holding units received
    /// otherwise than as grants (a standalone agent's), and whether any
    /// grant was ever credited (a coordinator-managed agent's).
    async fn provenance(&self) -> Result<Provenance, StoreError>;
    /// Counters, unconfirmed grants and pending returns, in one snapshot.
    async fn sync_snapshot(&self) -> Result<SyncSnapshot, StoreError>;
    /// Records that the coordinator has these grants' acknowledgements.
    async fn confirm_grants(&self, ids: &[String]) -> Result<(), StoreError>;
    /// Forgets returns the coordinator has applied.
    async fn forget_returns(&self, ids: &[String]) -> Result<(), StoreError>;
}
