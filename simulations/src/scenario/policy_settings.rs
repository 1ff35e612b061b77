//! The policies' settings as a scenario states them in TOML, with the
//! conversions to escrow-core's own.

use escrow_core::policy::{RefillSettings, TailMergeSettings};
use serde::{Deserialize, Serialize};

/// Settings of [`escrow_core::policy::ProportionalShare`], readable from TOML.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProportionalSettings {
    /// Share of the total kept in the pool at creation.
    pub reserve_fraction: f64,
    /// Surplus below which a region is not asked to give back.
    pub recall_min_units: u64,
}

impl Default for ProportionalSettings {
    fn default() -> Self {
        let d = escrow_core::policy::ProportionalShare::default();
        Self {
            reserve_fraction: d.reserve_fraction,
            recall_min_units: d.recall_min_units,
        }
    }
}

/// Refill settings with every field optional in TOML.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RefillConfig {
    /// Share of the total kept in the pool at creation.
    pub reserve_fraction: f64,
    /// Seconds of sales on hand beyond the round trip before refilling.
    pub low_water_s: f64,
    /// Seconds of sales a refill tops up to.
    pub refill_s: f64,
    /// Fewest units a region is left with while the pool has some.
    pub min_units: u64,
}

impl Default for RefillConfig {
    fn default() -> Self {
        Self::from(RefillSettings::default())
    }
}

impl From<RefillSettings> for RefillConfig {
    fn from(d: RefillSettings) -> Self {
        Self {
            reserve_fraction: d.reserve_fraction,
            low_water_s: d.low_water_s,
            refill_s: d.refill_s,
            min_units: d.min_units,
        }
    }
}

impl RefillConfig {
    /// The core settings; the sync interval is the agents'.
    pub fn to_core(self, sync_interval_ms: u64) -> RefillSettings {
        RefillSettings {
            reserve_fraction: self.reserve_fraction,
            low_water_s: self.low_water_s,
            refill_s: self.refill_s,
            min_units: self.min_units,
            sync_interval_ms,
        }
    }
}

/// Tail-merge settings with every field optional in TOML.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TailMergeConfig {
    /// Refill behaviour before the tail.
    pub refill: RefillConfig,
    /// Merge when the remainder is at most this many units...
    pub merge_units: u64,
    /// ...or at most this share of the total...
    pub merge_fraction: f64,
    /// ...or at most what the regions sell in this many ms...
    pub merge_horizon_ms: u64,
    /// ...plus this many round trips of the farthest region...
    pub merge_round_trips: u64,
    /// ...where every region is at most this far (round trip, ms); also
    /// the least wait a move may cost a region's buyers.
    pub merge_rtt_max_ms: u64,
    /// A region keeps what its buyers take during this many of its round
    /// trips plus `move_overhead_ms`, where its share of the remainder is less.
    pub keep_round_trips: f64,
    /// What a move costs besides round trips, ms.
    pub move_overhead_ms: u64,
}

impl Default for TailMergeConfig {
    fn default() -> Self {
        let d = TailMergeSettings::default();
        Self {
            refill: RefillConfig::from(d.refill),
            merge_units: d.merge_units,
            merge_fraction: d.merge_fraction,
            merge_horizon_ms: d.merge_horizon_ms,
            merge_round_trips: d.merge_round_trips,
            merge_rtt_max_ms: d.merge_rtt_max_ms,
            keep_round_trips: d.keep_round_trips,
            move_overhead_ms: d.move_overhead_ms,
        }
    }
}

impl TailMergeConfig {
    /// The core settings; the sync interval is the agents'.
    pub fn to_core(self, sync_interval_ms: u64) -> TailMergeSettings {
        TailMergeSettings {
            refill: self.refill.to_core(sync_interval_ms),
            merge_units: self.merge_units,
            merge_fraction: self.merge_fraction,
            merge_horizon_ms: self.merge_horizon_ms,
            merge_round_trips: self.merge_round_trips,
            merge_rtt_max_ms: self.merge_rtt_max_ms,
            keep_round_trips: self.keep_round_trips,
            move_overhead_ms: self.move_overhead_ms,
        }
    }
}

/// Settings of every policy that has any.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySettings {
    /// `refill`.
    pub refill: RefillConfig,
    /// `proportional`.
    pub proportional: ProportionalSettings,
    /// `tail-merge`.
    #[serde(rename = "tail-merge")]
    pub tail_merge: TailMergeConfig,
}
