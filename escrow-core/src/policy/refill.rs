//! Refilling a region from the pool before it runs dry: the low-water mark
//! and target every refilling policy shares, and [`RefillOnLowWater`].

use serde::{Deserialize, Serialize};

use super::{split_by_weight, Plan, Policy, RegionState, SkuState};

/// Refill settings shared by the refilling policies.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefillSettings {
    /// Share of the total kept in the pool at creation, 0.0..=1.0.
    pub reserve_fraction: f64,
    /// Seconds of sales a region should have on hand beyond its round trip.
    pub low_water_s: f64,
    /// Seconds of sales a refill tops a region up to.
    pub refill_s: f64,
    /// A region is never left with fewer units than this while the pool has some.
    pub min_units: u64,
    /// How often agents report, ms; part of how long a refill takes to arrive.
    pub sync_interval_ms: u64,
}

impl Default for RefillSettings {
    fn default() -> Self {
        Self {
            reserve_fraction: 0.2,
            low_water_s: 1.0,
            refill_s: 3.0,
            min_units: 2,
            sync_interval_ms: 200,
        }
    }
}

impl RefillSettings {
    /// Units below which a region asks for more: what it sells while a
    /// refill travels (one sync interval and a round trip), times a margin.
    pub fn low_water(&self, r: &RegionState) -> u64 {
        let travel_s = (r.rtt_ms + self.sync_interval_ms) as f64 / 1000.0;
        (r.sale_rate_per_s * (travel_s + self.low_water_s)).ceil() as u64 + self.min_units
    }

    /// Units a refill tops a region up to.
    pub fn target(&self, r: &RegionState) -> u64 {
        let travel_s = (r.rtt_ms + self.sync_interval_ms) as f64 / 1000.0;
        (r.sale_rate_per_s * (travel_s + self.refill_s)).ceil() as u64 + self.min_units
    }

    pub(super) fn split(&self, total: u64, weights: &[u32]) -> Vec<u64> {
        let reserve = (total as f64 * self.reserve_fraction.clamp(0.0, 1.0)).ceil() as u64;
        split_by_weight(total - reserve.min(total), weights)
    }

    /// Grants from the pool to every region below its low-water mark, each
    /// up to its target; when the pool cannot cover them all, it is shared
    /// in proportion to what each lacks (the busiest region does not take
    /// it all while a quieter one's buyers wait too).
    pub(super) fn refills(&self, sku: &SkuState) -> Vec<(usize, u64)> {
        let needy: Vec<(usize, u64)> = sku
            .regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.weight > 0 && r.on_hand() < self.low_water(r))
            .map(|(i, r)| (i, self.target(r).saturating_sub(r.on_hand())))
            .filter(|(_, want)| *want > 0)
            .collect();
        let wanted: u64 = needy.iter().map(|(_, want)| want).sum();
        let units: Vec<u64> = if wanted <= sku.pool {
            needy.iter().map(|(_, want)| *want).collect()
        } else {
            let weights: Vec<u32> = needy
                .iter()
                .map(|(_, want)| u32::try_from(*want).unwrap_or(u32::MAX))
                .collect();
            split_by_weight(sku.pool, &weights)
        };
        needy
            .iter()
            .zip(units)
            .filter(|(_, units)| *units > 0)
            .map(|((i, _), units)| (*i, units))
            .collect()
    }
}

/// Refill from the pool when a region falls below its low-water mark.
#[derive(Debug, Clone, Default)]
pub struct RefillOnLowWater {
    /// Settings.
    pub settings: RefillSettings,
}

impl Policy for RefillOnLowWater {
    fn name(&self) -> &'static str {
        "refill"
    }
    fn initial_split(&self, total: u64, weights: &[u32]) -> Vec<u64> {
        self.settings.split(total, weights)
    }
    fn plan(&self, sku: &SkuState) -> Plan {
        Plan {
            grants: self.settings.refills(sku),
            ..Plan::default()
        }
    }
}
