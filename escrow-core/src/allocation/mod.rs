//! The coordinator's rules for one SKU: what a sync, a take or an admin
//! change does to the pool, the grants in transit and each region's lease,
//! and what goes back to the agents.
//!
//! [`Allocation`] is everything the coordinator decides with for one SKU.
//! The coordinator loads it from PostgreSQL under the SKU's row lock, calls
//! one method and writes the difference back in the same transaction; the
//! simulator keeps it in memory. Neither driver decides anything itself, so
//! the simulator measures the rules the service runs.
//!
//! `pool + in_transit + sum(leased) = total` holds before and after every
//! move, and each move asserts it at both ends. A grant moves units pool ->
//! in transit; the region's ack moves them in transit -> leased; a return
//! moves them leased -> pool. A refused input (an error) changes nothing:
//! every check runs before the first move.
//!
//! The rules keep no history. Which return ids were already applied, and
//! what a take's id was used for, live in the driver's store (the
//! `transfers` table, or the simulator's sets); the driver looks up the ids
//! a request names and passes what it found, and records what the rules
//! say was applied.
//!
//! This file holds the limits, the state and the moves every rule is made
//! of; the admin changes and the rebalance are in `admin.rs`, a region's
//! sync in `sync.rs`, and a take in `take.rs`.

mod admin;
mod sync;
mod take;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ids::{Sku, SkuSettings, Tenant, TransferId};
use crate::policy::{Mode, RegionState, SkuState};
use crate::protocol::{SkuDirective, TransferMsg};

pub use sync::{admit, check_sync, AgentSession, SkuSynced};
pub use take::{TakeHistory, Taken};

/// Longest round trip an agent may report, ms; a larger one counts as this.
pub const RTT_MS_MAX: u64 = 60_000;

/// Most units a region may report of one SKU (available + held + sold): a
/// thousand times the largest stock an admin can add at once, so no real
/// report comes near it, and the policy's sums over thousands of regions
/// cannot overflow.
pub const REPORT_UNITS_MAX: u64 = 1_000_000_000_000_000;

/// Why an input was refused. A refused input changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// A request from an agent process older than one already seen.
    #[error("stale agent epoch")]
    StaleEpoch,
    /// Lowering the total would need units that are leased, held or sold.
    #[error(
        "total may only be lowered by what is in the pool ({pool} units); the rest is leased, held or sold"
    )]
    TotalBelowPool {
        /// Units in the pool.
        pool: u64,
    },
    /// A message that cannot be right (no units, a bad id, a return beyond the lease).
    #[error("{0}")]
    Invalid(String),
}

/// A region's last report of one SKU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Report {
    /// Units it could hold.
    pub available: u64,
    /// Units held.
    pub held: u64,
    /// Units sold.
    pub sold: u64,
    /// Units per second it recently held; finite and not negative.
    pub sale_rate_per_s: f64,
    /// Of `held`, units set aside for carts not yet written.
    pub set_aside: u64,
}

impl Report {
    /// Everything the region has of the SKU: available, held and sold.
    pub fn on_hand(&self) -> u64 {
        self.available + self.held + self.sold
    }
}

/// One region's share of one SKU at the coordinator.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RegionAllocation {
    /// Relative share of the total; 0 once removed from the SKU.
    pub weight: u32,
    /// Units delivered to the region minus units it returned.
    pub leased: u64,
    /// Grants to the region not yet acknowledged, units by id.
    pub grants: BTreeMap<TransferId, u64>,
    /// Units the region returned, cumulative.
    pub returned: u64,
    /// Units asked back and not yet returned.
    pub recall_pending: u64,
    /// Its last report.
    pub report: Report,
    /// When its last report was applied, ms since the epoch; `None` before the first.
    pub reported_at_ms: Option<u64>,
    /// Its agent's last measured round trip, ms.
    pub rtt_ms: u64,
    /// `(epoch, seq)` of the sync request whose report is the last one
    /// applied; `(0, 0)` before the first. Orders reports per SKU.
    pub reported_by: (i64, u64),
}

impl RegionAllocation {
    /// Units granted to the region and not yet acknowledged.
    pub fn in_transit(&self) -> u64 {
        self.grants.values().sum()
    }
}

/// The coordinator's state of one SKU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Allocation {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// The SKU.
    pub sku: Sku,
    /// Units the SKU has in all.
    pub total: u64,
    /// Units not leased to any region nor in transit.
    pub pool: u64,
    /// Escrow or central.
    pub mode: Mode,
    /// Paused by an admin: no grants, and agents stop selling.
    pub paused: bool,
    /// Per-user limit and default hold.
    pub settings: SkuSettings,
    /// One entry per region taking part, by index.
    pub regions: Vec<RegionAllocation>,
}

/// What a move did besides the state change: the grants created, the
/// recalls asked, and whether the tail merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moves {
    /// Grants created: region index, grant id, units.
    pub grants: Vec<(usize, TransferId, u64)>,
    /// Units asked back, by region index.
    pub recalls: Vec<(usize, u64)>,
    /// The SKU switched to central mode.
    pub merged: bool,
}

impl Moves {
    /// Units granted in all.
    pub fn granted_units(&self) -> u64 {
        self.grants.iter().map(|g| g.2).sum()
    }

    /// Indices (below `regions`) of the regions these moves give something
    /// to do: a grant to credit, a recall to return, a mode change. Their
    /// agents are told at once (a notice) rather than at their next sync.
    pub fn regions_to_notify(&self, regions: usize) -> Vec<usize> {
        (0..regions)
            .filter(|&i| {
                self.merged
                    || self.grants.iter().any(|g| g.0 == i)
                    || self.recalls.iter().any(|r| r.0 == i && r.1 > 0)
            })
            .collect()
    }
}

fn check_transfer(kind: &str, units: u64) -> Result<(), AllocationError> {
    if units == 0 {
        return Err(AllocationError::Invalid(format!("{kind} needs units >= 1")));
    }
    Ok(())
}

impl Allocation {
    /// Units in transit to all regions.
    pub fn in_transit(&self) -> u64 {
        self.regions.iter().map(RegionAllocation::in_transit).sum()
    }

    /// Units leased to all regions.
    pub fn leased(&self) -> u64 {
        self.regions.iter().map(|r| r.leased).sum()
    }

    /// `pool + in_transit + leased - total`: the coordinator's own books; 0
    /// unless the stored state is corrupt.
    pub fn ledger_drift(&self) -> i128 {
        i128::from(self.pool) + i128::from(self.in_transit()) + i128::from(self.leased())
            - i128::from(self.total)
    }

    /// The contract's audit over the latest reports:
    /// `pool + in_transit + sum(available + held + sold) - total`.
    pub fn drift(&self) -> i128 {
        let reported: u64 = self.regions.iter().map(|r| r.report.on_hand()).sum();
        i128::from(self.pool) + i128::from(self.in_transit()) + i128::from(reported)
            - i128::from(self.total)
    }

    /// Whether `pool + in_transit + leased = total` and no grant is empty.
    pub fn is_balanced(&self) -> bool {
        self.ledger_drift() == 0
            && self
                .regions
                .iter()
                .all(|r| r.grants.values().all(|&u| u > 0))
    }

    fn assert_balanced(&self) {
        assert!(self.is_balanced(), "allocation invariant broken: {self:?}");
    }

    /// The SKU as the policy sees it.
    pub fn policy_view(&self) -> SkuState {
        SkuState {
            total: self.total,
            pool: self.pool,
            mode: self.mode,
            regions: self
                .regions
                .iter()
                .map(|r| RegionState {
                    weight: r.weight,
                    leased: r.leased,
                    in_transit: r.in_transit(),
                    available: r.report.available,
                    sale_rate_per_s: r.report.sale_rate_per_s,
                    rtt_ms: r.rtt_ms,
                    recall_pending: r.recall_pending,
                    set_aside: r.report.set_aside,
                })
                .collect(),
        }
    }

    /// Whether nothing is free anywhere: not in the pool, in transit, or
    /// available in a region's last report.
    pub fn is_sold_out_everywhere(&self) -> bool {
        crate::policy::is_sold_out_everywhere(&self.policy_view())
    }

    /// The directive for `region`: mode, pause, settings, how far to give
    /// back, and whether the SKU is sold out. `limit_regions` is left
    /// empty for the caller, who knows the regions by name.
    pub fn directive(&self, region: usize) -> SkuDirective {
        let r = &self.regions[region];
        SkuDirective {
            tenant: self.tenant.clone(),
            sku: self.sku.clone(),
            mode: self.mode,
            paused: self.paused,
            max_per_user: self.settings.max_per_user,
            hold_ttl_ms: self.settings.hold_ttl.get(),
            return_until: r.returned + r.recall_pending,
            sold_out_everywhere: self.is_sold_out_everywhere(),
            user_limit_scope: self.settings.user_limit_scope,
            limit_regions: Vec::new(),
        }
    }

    fn transfer(&self, id: &TransferId, units: u64) -> TransferMsg {
        TransferMsg {
            id: id.clone(),
            tenant: self.tenant.clone(),
            sku: self.sku.clone(),
            units,
        }
    }

    /// Every grant to `region` not yet acknowledged, as sent to it.
    pub fn pending_grants(&self, region: usize) -> Vec<TransferMsg> {
        self.regions[region]
            .grants
            .iter()
            .map(|(id, &units)| self.transfer(id, units))
            .collect()
    }

    fn is_for(&self, tenant: &Tenant, sku: &Sku) -> bool {
        self.tenant == *tenant && self.sku == *sku
    }

    /// Debits the pool for a grant of `units` to `region` under `id`.
    fn grant(&mut self, region: usize, id: TransferId, units: u64) -> (usize, TransferId, u64) {
        self.assert_balanced();
        assert!(units > 0, "a grant moves at least one unit");
        assert!(
            units <= self.pool,
            "grant of {units} exceeds the pool of {}",
            self.pool
        );
        self.pool -= units;
        let previous = self.regions[region].grants.insert(id.clone(), units);
        assert!(previous.is_none(), "grant id {id} reused");
        self.assert_balanced();
        (region, id, units)
    }

    /// Moves the grant `id` of `region` from in transit to leased, if it is
    /// pending; a repeated ack changes nothing.
    fn deliver(&mut self, region: usize, id: &TransferId) {
        self.assert_balanced();
        let r = &mut self.regions[region];
        if let Some(units) = r.grants.remove(id) {
            r.leased += units;
        }
        self.assert_balanced();
    }

    /// Credits the pool with a return of `units` from `region`'s lease; the
    /// return settles up to as many units of a pending recall.
    fn apply_return(&mut self, region: usize, units: u64) {
        self.assert_balanced();
        let r = &mut self.regions[region];
        assert!(
            units <= r.leased,
            "return of {units} exceeds the lease of {}",
            r.leased
        );
        r.leased -= units;
        r.returned += units;
        r.recall_pending = r.recall_pending.saturating_sub(units);
        self.pool += units;
        self.assert_balanced();
    }
}

#[cfg(test)]
mod tests;
