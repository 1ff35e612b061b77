//! The simulated region agent's database: what `region-agent`'s store keeps
//! for one SKU, in memory.
//!
//! Reservations and counters are escrow-core's [`Book`], which judges a
//! batch with the same conditions as the store's SQL; around it, the
//! transfer tables: grant ids credited (so a duplicate is ignored), grants
//! not yet confirmed, returns debited and not yet applied, and the mode;
//! and the places borrowed and lent under a global per-user limit
//! (`limits.rs`). A commit applies a batch in the store's order and answers
//! with the same [`BatchOutcome`]. The fidelity test runs one recorded
//! stream through this database and through PostgreSQL and compares every
//! decision.

mod limits;

use std::collections::{BTreeMap, HashSet};

use escrow_core::batch::{Batch, BatchOutcome, SkuRecord, StockChange};
use escrow_core::{Book, Mode, RequestKey, Reservation, Status, Tenant, TransferId};

pub use limits::{BorrowRow, BorrowerState, Limits};

/// One SKU's stored state in one region.
#[derive(Debug, Clone)]
pub struct Database {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// Reservations and counters.
    pub book: Book,
    /// Escrow or central, as stored.
    pub mode: Mode,
    /// Ids of grants credited: a duplicate grant is recognised and ignored.
    pub applied_grants: HashSet<TransferId>,
    /// Grants credited and not yet confirmed by the coordinator.
    pub pending_acks: Vec<TransferId>,
    /// Returns debited and not yet confirmed applied, by id.
    pub returns: BTreeMap<TransferId, u64>,
    /// Places borrowed and lent under a global per-user limit.
    pub limits: Limits,
    /// Transactions committed, of every kind: who holds what changes only
    /// with one.
    pub writes: u64,
}

impl Database {
    /// A database holding `book` for `tenant`, in `mode`.
    pub fn new(tenant: Tenant, book: Book, mode: Mode) -> Self {
        Self {
            tenant,
            book,
            mode,
            applied_grants: HashSet::new(),
            pending_acks: Vec::new(),
            returns: BTreeMap::new(),
            limits: Limits::default(),
            writes: 0,
        }
    }

    /// The SKU as the store loads it.
    pub fn record(&self) -> SkuRecord {
        let units = |status: Status| -> u64 {
            self.book
                .reservations()
                .filter(|r| r.status == status)
                .map(|r| r.qty.units())
                .sum()
        };
        SkuRecord {
            tenant: self.tenant.clone(),
            sku: self.book.sku.clone(),
            ledger: self.book.ledger,
            settings: self.book.settings,
            paused: self.book.paused,
            mode: self.mode,
            rows_held: units(Status::Held),
            rows_sold: units(Status::Sold),
            holds: self
                .book
                .reservations()
                .filter(|r| r.status == Status::Held)
                .cloned()
                .collect(),
        }
    }

    /// The committed reservations of `keys` (keys without one are left out).
    pub fn read(&self, keys: &[RequestKey]) -> Vec<Reservation> {
        keys.iter()
            .filter_map(|k| self.book.get(k))
            .cloned()
            .collect()
    }

    /// Commits a batch in the store's order: grants credited once, mode,
    /// the book's transitions, sweep, changes and holds (a hold of a user
    /// whose place this region lent is not inserted; the borrows of those
    /// inserted are marked used), then returns debited into the outbox. A
    /// batch the book refuses is a bug in the owner: the run stops loudly.
    pub fn commit(&mut self, batch: &Batch) -> BatchOutcome {
        self.writes += 1;
        let mut applied = Vec::new();
        for g in &batch.grants {
            if self.applied_grants.insert(g.id.clone()) {
                self.book.ledger.receive(g.units);
                self.pending_acks.push(g.id.clone());
                applied.push(g.id.clone());
            }
        }
        for change in &batch.changes {
            if let StockChange::Mode(mode) = change {
                self.mode = *mode;
            }
        }
        let mut outcome = self
            .commit_book(batch)
            .and_then(|outcome| self.mark_used(batch, &outcome).map(|()| outcome))
            .unwrap_or_else(|e| panic!("the database refused an owner's batch: {e}"));
        for r in &batch.returns {
            self.book
                .ledger
                .return_units(r.units)
                .expect("a return never exceeds available");
            self.returns.insert(r.id.clone(), r.units);
        }
        outcome.applied_grants = applied;
        outcome
    }
}
