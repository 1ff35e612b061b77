//! [`TailMerge`], the policy the services run by default: refills by
//! measured demand, recalls of surplus when the pool runs short, and the
//! last units merged into central mode.

use serde::{Deserialize, Serialize};

use super::central::central_plan;
use super::refill::RefillSettings;
use super::{demand_shares, Mode, Plan, Policy, RegionState, SkuState};

/// Settings of [`TailMerge`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailMergeSettings {
    /// Refill behaviour before the tail.
    pub refill: RefillSettings,
    /// Merge when the remainder is at most this many units...
    pub merge_units: u64,
    /// ...or at most this share of the total, whichever is larger...
    pub merge_fraction: f64,
    /// ...or at most what all regions together sell at their recent rates
    /// in this many ms...
    pub merge_horizon_ms: u64,
    /// ...plus this many round trips of the nearest region, where every
    /// region is within [`TailMergeSettings::merge_rtt_max_ms`]...
    #[serde(default = "default_merge_round_trips")]
    pub merge_round_trips: u64,
    /// ...a round trip, ms. In central mode every sale a region cannot
    /// serve from its own units pays that region's round trip: where all
    /// are near that costs no more than a commit, and merging a few round
    /// trips of sales early lets the last units sell from one counter. At a
    /// distance a tail merged by the farthest round trip (across oceans, the
    /// last ~45% of a sale) makes every region pay it, so there only the
    /// last units merge and each region sells its own locally until then.
    #[serde(default = "default_merge_rtt_max_ms")]
    pub merge_rtt_max_ms: u64,
    /// A region keeps at least what its own buyers take during this many
    /// of its round trips plus [`TailMergeSettings::move_overhead_ms`]
    /// (about how long units asked back would take to reach buyers
    /// elsewhere), even where its share of the remainder by demand is less:
    /// such units sell sooner where they are than anywhere else.
    #[serde(default = "default_keep_round_trips")]
    pub keep_round_trips: f64,
    /// What a move costs besides round trips (batches, commits, a sync), ms.
    #[serde(default = "default_move_overhead_ms")]
    pub move_overhead_ms: u64,
}

fn default_merge_round_trips() -> u64 {
    TailMergeSettings::default().merge_round_trips
}

fn default_merge_rtt_max_ms() -> u64 {
    TailMergeSettings::default().merge_rtt_max_ms
}

fn default_keep_round_trips() -> f64 {
    TailMergeSettings::default().keep_round_trips
}

fn default_move_overhead_ms() -> u64 {
    TailMergeSettings::default().move_overhead_ms
}

impl Default for TailMergeSettings {
    fn default() -> Self {
        Self {
            refill: RefillSettings {
                reserve_fraction: 0.0,
                ..RefillSettings::default()
            },
            merge_units: 20,
            merge_fraction: 0.02,
            merge_horizon_ms: 0,
            merge_round_trips: 3,
            merge_rtt_max_ms: 50,
            keep_round_trips: 1.0,
            move_overhead_ms: 50,
        }
    }
}

/// Our policy. Units follow each region's measured demand ahead of need:
/// a region below its low-water mark (what it sells while a refill
/// travels its own round trip) is refilled from the pool, shared by what
/// each short region lacks; when the pool cannot cover them, regions with
/// known demand give back what they hold beyond their share of the
/// remainder by demand plus what they sell during a move. The
/// last few units merge into central mode, where a region still sells
/// its own units locally while its buyers ask and only a region without
/// any pays its own round trip (see docs/protocol.md, "Distance").
#[derive(Debug, Clone, Default)]
pub struct TailMerge {
    /// Settings.
    pub settings: TailMergeSettings,
}

impl TailMerge {
    /// The remainder at or below which the tail is merged.
    pub fn threshold(&self, sku: &SkuState) -> u64 {
        let rate: f64 = sku.regions.iter().map(|r| r.sale_rate_per_s).sum();
        let farthest_ms = sku.regions.iter().map(|r| r.rtt_ms).max().unwrap_or(0);
        let nearest_ms = sku.regions.iter().map(|r| r.rtt_ms).min().unwrap_or(0);
        let rtt_ms = if farthest_ms <= self.settings.merge_rtt_max_ms {
            nearest_ms
        } else {
            0
        };
        let horizon_ms =
            self.settings.merge_horizon_ms + self.settings.merge_round_trips.saturating_mul(rtt_ms);
        let horizon = (rate * horizon_ms as f64 / 1_000.0).ceil() as u64;
        self.settings
            .merge_units
            .max((sku.total as f64 * self.settings.merge_fraction).ceil() as u64)
            .max(horizon)
    }

    /// What region `r` sells while units move to or from it.
    fn cushion(&self, r: &RegionState) -> u64 {
        let move_ms = self.settings.keep_round_trips * r.rtt_ms as f64
            + self.settings.move_overhead_ms as f64;
        (r.sale_rate_per_s * move_ms / 1_000.0).ceil() as u64
    }

    /// Per region, the most units it should have on hand: its share of
    /// the remainder by demand plus its cushion, at least `min_units`.
    fn ceilings(&self, sku: &SkuState) -> Vec<u64> {
        let min_units = self.settings.refill.min_units;
        sku.regions
            .iter()
            .zip(demand_shares(sku))
            .map(|(r, share)| {
                if r.weight == 0 {
                    0
                } else {
                    (share + self.cushion(r)).max(min_units)
                }
            })
            .collect()
    }

    /// Refills and, when the pool cannot cover the regions that will run
    /// short or a take came back `short` (a region's buyers wait now),
    /// recalls of what regions hold beyond their ceilings.
    ///
    /// A region that has not reported demand while others have is planned
    /// for as selling at the others' rate per unit of weight, and nothing
    /// is recalled from it: its buyers' first report may still be on its
    /// way, from farther than the others' (agents report a spell of demand
    /// only once it is `RATE_REPORT_AFTER_MS` old). Stripping it when
    /// another region's take came back short moved a far region's units
    /// from under its own buyers in a burst where every region had more
    /// buyers than units (docs/protocol.md, "Distance").
    fn escrow_plan(&self, reported: &SkuState, short: bool) -> Plan {
        let expected = with_prior_demand(reported);
        let sku = &expected;
        let refill = &self.settings.refill;
        let ceilings = self.ceilings(sku);
        // Refills go by reported demand only: the prior keeps a silent
        // region's units where they are, but is no reason to send it more
        // (in a sale skewed 85/10/5 it counted the far region as selling
        // at the average rate, and units recalled for the busy region went
        // there instead).
        let refills = refill.refills(reported);
        let mut plan = Plan {
            grants: refills.grants,
            ..Plan::default()
        };
        if !refills.covered || short {
            let surplus = |needy_too: bool| -> Vec<(usize, u64)> {
                sku.regions
                    .iter()
                    .zip(&ceilings)
                    .enumerate()
                    .filter(|(i, _)| reported.regions[*i].sale_rate_per_s > 0.0)
                    .filter(|(i, _)| needy_too || !refills.needy.contains(i))
                    .filter_map(|(i, (r, ceiling))| {
                        let free = r.available.saturating_sub(r.recall_pending);
                        (free > *ceiling).then(|| (i, free - ceiling))
                    })
                    .collect()
            };
            // Regions below their low-water mark keep their units while
            // others have some to spare; when none has, those above their
            // ceiling give back too: when the whole remainder sells within
            // less than the mark's second, every region is below it, and
            // the busiest region's buyers would wait for the tail merge.
            plan.recalls = surplus(false);
            if plan.recalls.is_empty() {
                plan.recalls = surplus(true);
                let recalls = &plan.recalls;
                plan.grants
                    .retain(|(i, _)| !recalls.iter().any(|(j, _)| j == i));
            }
        }
        plan
    }
}

impl Policy for TailMerge {
    fn name(&self) -> &'static str {
        "tail-merge"
    }
    fn initial_split(&self, total: u64, weights: &[u32]) -> Vec<u64> {
        self.settings.refill.split(total, weights)
    }
    fn plan(&self, sku: &SkuState) -> Plan {
        if sku.mode == Mode::Central || sku.remainder() <= self.threshold(sku) {
            return central_plan(sku);
        }
        self.escrow_plan(sku, false)
    }
    fn plan_short(&self, sku: &SkuState) -> Plan {
        if sku.mode == Mode::Central || sku.remainder() <= self.threshold(sku) {
            return central_plan(sku);
        }
        self.escrow_plan(sku, true)
    }
}

/// `sku` with every region taking part that reported no demand, while
/// others did, selling at their rate per unit of weight.
fn with_prior_demand(sku: &SkuState) -> SkuState {
    let known = sku
        .regions
        .iter()
        .filter(|r| r.weight > 0 && r.sale_rate_per_s > 0.0);
    let (rate, weight) = known.fold((0.0, 0u64), |(rate, weight), r| {
        (rate + r.sale_rate_per_s, weight + u64::from(r.weight))
    });
    let mut expected = sku.clone();
    if weight > 0 {
        let per_weight = rate / weight as f64;
        for r in expected
            .regions
            .iter_mut()
            .filter(|r| r.weight > 0 && r.sale_rate_per_s <= 0.0)
        {
            r.sale_rate_per_s = per_weight * f64::from(r.weight);
        }
    }
    expected
}
