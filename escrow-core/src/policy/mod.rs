//! Rebalancing policy: how a SKU's total is split over regions and moved
//! between them as they sell.
//!
//! The coordinator keeps, per SKU, a pool of units not leased to any region
//! and a [`RegionState`] per region built from the agents' reports. After
//! every report it asks its [`Policy`] for a [`Plan`]: grants from the pool,
//! recalls of free quota, and the SKU's [`Mode`]. The simulator calls the
//! same trait with the same inputs, so a policy chosen by simulation is the
//! policy that runs.
//!
//! Policies never move units themselves; the coordinator turns a plan into
//! transfers, and a plan is only ever bounded by what is in the pool (grants)
//! or free in a region (recalls), so no plan can create or destroy a unit.
//!
//! This file holds what every policy reads and returns, the [`Policy`]
//! trait, the shares they split by, and [`StaticSplit`]; each other policy
//! has its own file, and `take_and_return.rs` the rules for units a region
//! asks for or gives back between plans.

mod central;
mod proportional;
mod refill;
mod tail_merge;
mod take_and_return;

use serde::{Deserialize, Serialize};

pub use central::CentralOnly;
pub use proportional::ProportionalShare;
pub use refill::{RefillOnLowWater, RefillSettings};
pub use tail_merge::{TailMerge, TailMergeSettings};
pub use take_and_return::{decide_take, units_to_return, TakeDecision, CENTRAL_RETURN_GRACE_MS};

/// How a SKU sells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mode {
    /// Regions sell from their own quota; the coordinator refills them.
    Escrow,
    /// Tail merged: free quota lives in the pool and each sale takes exactly
    /// its units from it, synchronously.
    Central,
}

impl Mode {
    /// The mode as stored (`ESCROW`, `CENTRAL`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Escrow => "ESCROW",
            Mode::Central => "CENTRAL",
        }
    }

    /// Parses a stored mode.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "ESCROW" => Some(Mode::Escrow),
            "CENTRAL" => Some(Mode::Central),
            _ => None,
        }
    }
}

/// What the coordinator knows of one region's share of one SKU.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionState {
    /// Relative share of the total this region should get.
    pub weight: u32,
    /// Units granted and delivered minus units returned.
    pub leased: u64,
    /// Units granted to it and not yet acknowledged.
    pub in_transit: u64,
    /// Available units at its last report.
    pub available: u64,
    /// Units it sells per second, recently (reported).
    pub sale_rate_per_s: f64,
    /// Round trip to the coordinator, ms (reported).
    pub rtt_ms: u64,
    /// Units asked back and not yet returned.
    pub recall_pending: u64,
    /// Units it set aside for carts not yet written (reported): not
    /// free, but they may come back.
    pub set_aside: u64,
}

impl RegionState {
    /// Units this region can sell without asking: available plus on the way.
    pub fn on_hand(&self) -> u64 {
        self.available + self.in_transit
    }
}

/// The coordinator's view of one SKU.
#[derive(Debug, Clone, PartialEq)]
pub struct SkuState {
    /// Units the SKU has in all.
    pub total: u64,
    /// Units not leased to any region.
    pub pool: u64,
    /// Current mode.
    pub mode: Mode,
    /// One entry per region taking part.
    pub regions: Vec<RegionState>,
}

impl SkuState {
    /// Units not yet held or sold anywhere: pool, in transit, free in regions.
    pub fn remainder(&self) -> u64 {
        self.pool + self.regions.iter().map(RegionState::on_hand).sum::<u64>()
    }
}

/// What the coordinator should do for one SKU now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Units to grant from the pool, by region index.
    pub grants: Vec<(usize, u64)>,
    /// Units to ask back, by region index (on top of pending recalls).
    pub recalls: Vec<(usize, u64)>,
    /// Switch to central mode (tail merge). Never switches back by itself.
    pub central: bool,
}

/// A rebalancing policy.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// The policy's name, as shown in reports.
    fn name(&self) -> &'static str;

    /// Splits a new SKU's `total` by region `weights`; what is not granted stays in the pool.
    fn initial_split(&self, total: u64, weights: &[u32]) -> Vec<u64>;

    /// Decides grants, recalls and mode for a SKU after a report.
    fn plan(&self, sku: &SkuState) -> Plan;

    /// Decides for a SKU after a take that came back short while units
    /// are free elsewhere: a region's buyers are waiting now.
    fn plan_short(&self, sku: &SkuState) -> Plan {
        self.plan(sku)
    }

    /// Whether a new SKU starts in central mode.
    fn starts_central(&self) -> bool {
        false
    }
}

/// Splits `units` by `weights` (largest remainder), summing exactly to `units`.
pub fn split_by_weight(units: u64, weights: &[u32]) -> Vec<u64> {
    let sum: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let mut shares: Vec<u64> = weights
        .iter()
        .map(|w| (u128::from(units) * u128::from(*w) / u128::from(sum)) as u64)
        .collect();
    let mut left = units - shares.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).filter(|i| weights[*i] > 0).collect();
    order.sort_by_key(|i| {
        std::cmp::Reverse(u128::from(units) * u128::from(weights[*i]) % u128::from(sum))
    });
    for i in order.iter().cycle().take(left as usize) {
        shares[*i] += 1;
        left -= 1;
    }
    assert_eq!(left, 0);
    assert_eq!(shares.iter().sum::<u64>(), units);
    shares
}

/// Never rebalance: the whole total split once by weight.
#[derive(Debug, Clone, Default)]
pub struct StaticSplit;

impl Policy for StaticSplit {
    fn name(&self) -> &'static str {
        "static"
    }
    fn initial_split(&self, total: u64, weights: &[u32]) -> Vec<u64> {
        split_by_weight(total, weights)
    }
    fn plan(&self, _sku: &SkuState) -> Plan {
        Plan::default()
    }
}

/// A region's recent demand in milli-units per second (0 for a region that
/// no longer takes part): the weight the remainder is shared by.
fn demand_milli(r: &RegionState) -> u32 {
    if r.weight == 0 {
        0
    } else {
        // A float cast saturates: a huge rate is u32::MAX, a bad one 0.
        (r.sale_rate_per_s * 1_000.0) as u32
    }
}

/// Each region's share of the remainder in proportion to its recent
/// demand (by weight before any region has reported a rate).
fn demand_shares(sku: &SkuState) -> Vec<u64> {
    let demand: Vec<u32> = sku.regions.iter().map(demand_milli).collect();
    let demand = if demand.iter().all(|d| *d == 0) {
        sku.regions.iter().map(|r| r.weight).collect()
    } else {
        demand
    };
    split_by_weight(sku.remainder(), &demand)
}

/// Recalls of every free unit from regions whose weight is 0 (removed from
/// the SKU). The coordinator adds these to any policy's plan.
pub fn retired_recalls(sku: &SkuState) -> Vec<(usize, u64)> {
    sku.regions
        .iter()
        .enumerate()
        .filter(|(_, r)| r.weight == 0 && r.available > r.recall_pending)
        .map(|(i, r)| (i, r.available - r.recall_pending))
        .collect()
}

/// Whether a SKU has nothing free anywhere and nothing set aside for a
/// cart that may let it go: what agents cache as sold out.
pub fn is_sold_out_everywhere(sku: &SkuState) -> bool {
    sku.remainder() == 0 && sku.regions.iter().all(|r| r.set_aside == 0)
}

#[cfg(test)]
mod tests;
