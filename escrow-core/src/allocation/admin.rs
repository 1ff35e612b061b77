//! The admin changes of one SKU (create, add stock, set the total or the
//! weights) and the rebalance that carries out the policy's plan.

use super::{Allocation, AllocationError, Moves, RegionAllocation};
use crate::ids::{Sku, SkuSettings, Tenant, TransferId};
use crate::policy::{retired_recalls, Mode, Policy};

impl Allocation {
    /// A new SKU: `total` units in the pool, then the policy's initial split
    /// granted to regions of `weights`. Grant ids come from `new_id`.
    pub fn create(
        tenant: Tenant,
        sku: Sku,
        total: u64,
        settings: SkuSettings,
        weights: &[u32],
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> TransferId,
    ) -> (Self, Moves) {
        let mut allocation = Self {
            tenant,
            sku,
            total,
            pool: total,
            mode: if policy.starts_central() {
                Mode::Central
            } else {
                Mode::Escrow
            },
            paused: false,
            settings,
            regions: weights
                .iter()
                .map(|&weight| RegionAllocation {
                    weight,
                    ..RegionAllocation::default()
                })
                .collect(),
        };
        let split = policy.initial_split(total, weights);
        assert_eq!(split.len(), weights.len(), "one share per region");
        assert!(
            split.iter().sum::<u64>() <= total,
            "initial split exceeds total"
        );
        let mut moves = Moves::default();
        for (region, units) in split.into_iter().enumerate() {
            if units > 0 {
                moves.grants.push(allocation.grant(region, new_id(), units));
            }
        }
        (allocation, moves)
    }

    /// Runs the policy (none while paused) plus the recalls of retired
    /// regions, and carries out the plan.
    pub fn rebalance(
        &mut self,
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> TransferId,
    ) -> Moves {
        self.rebalance_as(policy, new_id, false)
    }

    /// [`Allocation::rebalance`], planned by [`Policy::plan_short`] when
    /// `short` (a take could not be granted in full).
    pub(super) fn rebalance_as(
        &mut self,
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> TransferId,
        short: bool,
    ) -> Moves {
        self.assert_balanced();
        let state = self.policy_view();
        let mut plan = if self.paused {
            Default::default()
        } else if short {
            policy.plan_short(&state)
        } else {
            policy.plan(&state)
        };
        plan.recalls.extend(retired_recalls(&state));
        let mut moves = Moves::default();
        for (region, units) in plan.grants {
            if units > 0 {
                moves.grants.push(self.grant(region, new_id(), units));
            }
        }
        for &(region, units) in &plan.recalls {
            self.regions[region].recall_pending += units;
        }
        moves.recalls = plan.recalls;
        if plan.central && self.mode != Mode::Central {
            self.mode = Mode::Central;
            moves.merged = true;
        }
        self.assert_balanced();
        moves
    }

    /// Adds `units` of new stock to the pool and the total.
    pub fn add_stock(&mut self, units: u64) {
        self.assert_balanced();
        self.total += units;
        self.pool += units;
        self.assert_balanced();
    }

    /// Sets the total; lowering it takes units out of the pool only.
    pub fn set_total(&mut self, total: u64) -> Result<(), AllocationError> {
        self.assert_balanced();
        if total >= self.total {
            self.add_stock(total - self.total);
            return Ok(());
        }
        let cut = self.total - total;
        if cut > self.pool {
            return Err(AllocationError::TotalBelowPool { pool: self.pool });
        }
        self.total = total;
        self.pool -= cut;
        self.assert_balanced();
        Ok(())
    }

    /// Sets every region's weight: `weights` has one per region known so
    /// far (0 retires it) and one per region joining, which starts empty.
    pub fn set_weights(&mut self, weights: &[u32]) {
        assert!(
            weights.len() >= self.regions.len(),
            "a region is never dropped, only given weight 0"
        );
        for (i, &weight) in weights.iter().enumerate() {
            match self.regions.get_mut(i) {
                Some(r) => r.weight = weight,
                None => self.regions.push(RegionAllocation {
                    weight,
                    ..RegionAllocation::default()
                }),
            }
        }
    }
}
