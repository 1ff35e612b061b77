//! [`ProportionalShare`]: the remainder shared by recent demand.

use serde::{Deserialize, Serialize};

use super::{demand_milli, split_by_weight, Plan, Policy, SkuState};

/// Share the remainder in proportion to recent demand (as capacity
/// allocators such as Doorman do): regions above their share give back the
/// surplus, regions below get the difference from the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProportionalShare {
    /// Share of the total kept in the pool at creation.
    pub reserve_fraction: f64,
    /// Surplus below which a region is not asked to give back (avoids churn).
    pub recall_min_units: u64,
}

impl Default for ProportionalShare {
    fn default() -> Self {
        Self {
            reserve_fraction: 0.2,
            recall_min_units: 5,
        }
    }
}

impl Policy for ProportionalShare {
    fn name(&self) -> &'static str {
        "proportional"
    }
    fn initial_split(&self, total: u64, weights: &[u32]) -> Vec<u64> {
        let reserve = (total as f64 * self.reserve_fraction.clamp(0.0, 1.0)).ceil() as u64;
        split_by_weight(total - reserve.min(total), weights)
    }
    fn plan(&self, sku: &SkuState) -> Plan {
        self.plan_with(sku, self.recall_min_units)
    }

    /// A region's buyers wait now: churn is no reason to leave a surplus
    /// where it is, however small. Without this, the last few units of a
    /// region above its share (fewer than `recall_min_units`) never moved,
    /// and the buyers of a region that ran dry waited for them until they
    /// gave up (the simulator's frozen coordinator, seed 4: 2 units
    /// stranded, 97,000 REJECTED_WAIT_TIMEOUT answers).
    fn plan_short(&self, sku: &SkuState) -> Plan {
        self.plan_with(sku, 0)
    }
}

impl ProportionalShare {
    /// The plan, asking back from a region only a surplus larger than
    /// `recall_min_units` (and granting a region only a lack larger than
    /// `self.recall_min_units`).
    fn plan_with(&self, sku: &SkuState, recall_min_units: u64) -> Plan {
        let free = sku.remainder();
        // Demand with a floor of 1 for every region taking part, so idle regions keep a share.
        let demand: Vec<u32> = sku
            .regions
            .iter()
            .map(|r| demand_milli(r).max(u32::from(r.weight > 0)))
            .collect();
        let shares = split_by_weight(free, &demand);
        let mut plan = Plan::default();
        let mut pool = sku.pool;
        for (i, (r, share)) in sku.regions.iter().zip(&shares).enumerate() {
            let on_hand = r.on_hand();
            if on_hand + self.recall_min_units < *share {
                let units = (share - on_hand).min(pool);
                if units > 0 {
                    pool -= units;
                    plan.grants.push((i, units));
                }
            } else if *share + recall_min_units < r.available.saturating_sub(r.recall_pending) {
                plan.recalls
                    .push((i, r.available - r.recall_pending - share));
            }
        }
        plan
    }
}
