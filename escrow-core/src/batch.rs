//! What a SKU owner writes in one transaction and what it reads back.
//!
//! The owner decides in memory; a driver commits the decisions as one
//! [`Batch`] whose statements re-check every condition, and hands back a
//! [`BatchOutcome`] with what the database decided that memory could not
//! know (a key taken meanwhile, grants already credited). The region agent's store and the simulator's book both take
//! these types, so both drivers commit the same decisions.

use crate::ids::{Qty, RequestKey, Sku, SkuSettings, Tenant, TransferId, UserId};
use crate::ledger::Ledger;
use crate::policy::Mode;
use crate::protocol::TransferMsg;
use crate::reservation::{Reservation, Status, Transition};

/// A hold the owner wants to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHold {
    /// The buyer's key.
    pub request_key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// Units.
    pub qty: Qty,
    /// Expiry, ms since the epoch.
    pub expires_at_ms: u64,
    /// The borrowed place the hold uses, if its user is at home elsewhere
    /// ([`crate::user_limit`]): marked used in the same commit.
    pub borrow: Option<TransferId>,
}

impl NewHold {
    /// The reservation this hold is once inserted.
    pub fn reservation(&self, sku: &Sku) -> Reservation {
        Reservation {
            request_key: self.request_key.clone(),
            user_id: self.user_id.clone(),
            sku: sku.clone(),
            qty: self.qty,
            status: Status::Held,
            expires_at_ms: self.expires_at_ms,
            extended: false,
        }
    }
}

/// A change to a SKU's counters or settings that is not a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockChange {
    /// New units arrive in available.
    Receive(u64),
    /// Available units leave the region.
    Return(u64),
    /// New settings.
    Settings(SkuSettings),
    /// Stop or resume selling.
    Pause(bool),
    /// Switch between escrow and central selling.
    Mode(Mode),
}

/// Everything one owner commits in one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// The SKU.
    pub sku: Sku,
    /// The owner's clock at decision time, ms since the epoch.
    pub now_ms: u64,
    /// Holds to insert if their key and user are free.
    pub holds: Vec<NewHold>,
    /// Decided transitions of existing reservations, with their quantities,
    /// in the order they were decided: two on one key apply one after the
    /// other. The expiry of due holds is among them, decided from the
    /// owner's deadline queue.
    pub transitions: Vec<(RequestKey, Qty, Transition)>,
    /// Admin and directive changes.
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
            changes: Vec::new(),
            grants: Vec::new(),
            returns: Vec::new(),
        }
    }

    /// Units whose holds this batch expires.
    pub fn expired_units(&self) -> u64 {
        self.transitions
            .iter()
            .filter(|(_, _, change)| *change == Transition::Expire)
            .map(|(_, qty, _)| qty.units())
            .sum()
    }

    /// Whether committing it would change nothing.
    pub fn is_empty(&self) -> bool {
        self.holds.is_empty()
            && self.transitions.is_empty()
            && self.changes.is_empty()
            && self.grants.is_empty()
            && self.returns.is_empty()
    }
}

/// What a committed batch did that the owner could not know in advance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// For each of `Batch::holds`, whether its row was inserted.
    pub inserted: Vec<bool>,
    /// Ids of grants credited now (not seen before).
    pub applied_grants: Vec<TransferId>,
}

/// One SKU as stored: counters, settings, and what its rows add up to.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The HELD reservations: the owner settles and expires them from
    /// memory.
    pub holds: Vec<Reservation>,
}

impl SkuRecord {
    /// Whether the stored counters agree with the reservation rows.
    pub fn rows_agree(&self) -> bool {
        self.ledger.is_balanced()
            && self.ledger.held == self.rows_held
            && self.ledger.sold == self.rows_sold
    }

    /// `|rows held - held| + |rows sold - sold|`: 0 unless something is broken.
    pub fn rows_drift(&self) -> u64 {
        self.rows_held.abs_diff(self.ledger.held) + self.rows_sold.abs_diff(self.ledger.sold)
    }
}
