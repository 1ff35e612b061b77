//! [`TailMerge`], the policy the services run by default: units shared
//! by measured demand, moved only while they can arrive in time, and the
//! last units merged into central mode.

use serde::{Deserialize, Serialize};

use super::central::central_plan;
use super::refill::RefillSettings;
use super::{demand_shares, split_by_weight, Mode, Plan, Policy, RegionState, SkuState};

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
    /// It is also the least wait a move may cost a region's buyers
    /// (`TailMerge::recalls_in_time`): on loopback a round trip is 0.
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
/// a region short of its share of the remainder by demand gets the pool,
/// shared by what each short region lacks, and units asked back from the
/// regions above what they keep (their share, or what they sell
/// themselves during a move out, whichever is more), nearest first, but
/// only units that arrive before the short region's buyers would wait
/// longer than its own round trip for them. The last few units merge into
/// central mode, where a region still sells its own units locally while
/// its buyers ask and only a region without any pays its own round trip
/// (see docs/protocol.md, "Distance").
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

    /// What region `r` sells while units move out of it: during
    /// [`TailMergeSettings::keep_round_trips`] of its round trips plus
    /// [`TailMergeSettings::move_overhead_ms`].
    fn cushion(&self, r: &RegionState) -> u64 {
        (r.sale_rate_per_s * self.move_out_ms(r) / 1_000.0).ceil() as u64
    }

    /// How long units asked back from `r` take to reach the pool, ms.
    fn move_out_ms(&self, r: &RegionState) -> f64 {
        self.settings.keep_round_trips * r.rtt_ms as f64 + self.settings.move_overhead_ms as f64
    }

    /// Per region, the most free units it keeps when others need units:
    /// its share of the remainder by demand, or what it sells itself
    /// while units asked back would travel (its cushion), whichever is
    /// more; at least `min_units`.
    fn keeps(&self, sku: &SkuState) -> Vec<u64> {
        let min_units = self.settings.refill.min_units;
        sku.regions
            .iter()
            .zip(demand_shares(sku))
            .map(|(r, share)| {
                if r.weight == 0 {
                    0
                } else {
                    share.max(self.cushion(r)).max(min_units)
                }
            })
            .collect()
    }

    /// Grants from the pool to the regions short of their share of the
    /// remainder by demand, and recalls, from the regions above what
    /// they keep, of what those short regions lack beyond the pool.
    ///
    /// A unit moves from region `i` to region `j` only if it reaches
    /// `j` before `j`'s buyers would wait longer for it than `j`'s own
    /// round trip (at least [`TailMergeSettings::merge_rtt_max_ms`]):
    /// no buyer pays another region's distance. A move takes `i`'s
    /// move out ([`TailMerge::move_out_ms`]) and half of `j`'s round
    /// trip (the grant rides `j`'s watch answer); `j` runs dry after
    /// its units on hand at its rate. Sources are taken nearest first.
    /// A move that would land too late is not made: `j`'s buyers then
    /// wait for the last units or hear sold out, and the units sell
    /// where they are, to their own region's buyers.
    ///
    /// A region that has not reported demand while others have is planned
    /// for as selling at the others' rate per unit of weight: nothing is
    /// recalled from it and nothing granted to it, as its buyers' first
    /// report may still be on its way, from farther than the others'
    /// (agents report a spell of demand only once it is
    /// `RATE_REPORT_AFTER_MS` old). Stripping it moved a far region's
    /// units from under its own buyers in a burst (docs/protocol.md,
    /// "Distance").
    fn escrow_plan(&self, reported: &SkuState) -> Plan {
        let sku = aged(&with_prior_demand(reported));
        let known: Vec<bool> = sku
            .regions
            .iter()
            .zip(&reported.regions)
            .map(|(r, seen)| r.weight > 0 && seen.sale_rate_per_s > 0.0)
            .collect();
        let mut lacks: Vec<(usize, u64)> = demand_shares(&sku)
            .into_iter()
            .enumerate()
            .filter(|(j, _)| known[*j])
            .map(|(j, share)| (j, share.saturating_sub(sku.regions[j].on_hand())))
            .filter(|(_, lack)| *lack > 0)
            .collect();
        let grants = grants_by_lack(sku.pool, &mut lacks);
        let spare: Vec<u64> = sku
            .regions
            .iter()
            .zip(self.keeps(&sku))
            .zip(&known)
            .map(|((r, keep), known)| {
                let free = self.free_when_recalled(r);
                if *known {
                    free.saturating_sub(keep)
                } else {
                    0
                }
            })
            .collect();
        Plan {
            grants,
            recalls: self.recalls_in_time(&sku, &lacks, spare),
            central: false,
        }
    }

    /// Central mode: every free unit recalled to the pool, but what a
    /// region's own buyers take during its round trip (units it would sell
    /// before a recall could bring them to anyone else's buyers).
    fn merged_plan(&self, reported: &SkuState) -> Plan {
        let sku = &aged(reported);
        let mut plan = central_plan(sku);
        for (i, units) in &mut plan.recalls {
            let r = &sku.regions[*i];
            let keep = sold_during(r, self.settings.keep_round_trips * r.rtt_ms as f64);
            *units = self.free_when_recalled(r).saturating_sub(keep);
        }
        plan.recalls.retain(|(_, units)| *units > 0);
        plan
    }

    /// Free units region `r`, as it is now ([`aged`]), still has when a
    /// recall sent now reaches it half its round trip later: its buyers
    /// hold units meanwhile.
    fn free_when_recalled(&self, r: &RegionState) -> u64 {
        r.available
            .saturating_sub(r.recall_pending)
            .saturating_sub(sold_during(r, r.rtt_ms as f64 / 2.0))
    }

    /// Whether region `r` would still be selling its own free units long
    /// after a move of `move_ms` landed elsewhere ([`LATE_MOVE_FACTOR`]
    /// moves): units it would sell itself by then are not worth a move
    /// that makes another region's buyers wait, but units it would hold
    /// long after are stranded there.
    fn sells_long_after(&self, r: &RegionState, move_ms: f64) -> bool {
        let free = self.free_when_recalled(r) as f64;
        free * 1_000.0 > r.sale_rate_per_s * move_ms * LATE_MOVE_FACTOR
    }

    /// Recalls of `spare` units for the regions that still `lack` some,
    /// each from the nearest sources whose units reach it in time (see
    /// [`TailMerge::escrow_plan`]), by region index.
    fn recalls_in_time(
        &self,
        sku: &SkuState,
        lacks: &[(usize, u64)],
        mut spare: Vec<u64>,
    ) -> Vec<(usize, u64)> {
        let mut recalls = vec![0u64; sku.regions.len()];
        for &(j, lack) in lacks {
            let to = &sku.regions[j];
            let dry_ms = to.on_hand() as f64 * 1_000.0 / to.sale_rate_per_s;
            let wait_ms = to.rtt_ms.max(self.settings.merge_rtt_max_ms) as f64;
            let mut sources: Vec<(usize, f64)> = (0..sku.regions.len())
                .filter(|&i| i != j && spare[i] > 0)
                .map(|i| {
                    (
                        i,
                        self.move_out_ms(&sku.regions[i]) + to.rtt_ms as f64 / 2.0,
                    )
                })
                .filter(|&(i, move_ms)| {
                    let in_time = move_ms - dry_ms * DRY_TIME_TRUSTED <= wait_ms;
                    in_time || self.sells_long_after(&sku.regions[i], move_ms)
                })
                .collect();
            sources.sort_by(|a, b| a.1.total_cmp(&b.1));
            let mut lack = lack;
            for (i, _) in sources {
                let units = spare[i].min(lack);
                spare[i] -= units;
                recalls[i] += units;
                lack -= units;
            }
        }
        recalls
            .into_iter()
            .enumerate()
            .filter(|(_, units)| *units > 0)
            .collect()
    }
}

/// Whole units region `r` sells at its rate in `ms`.
fn sold_during(r: &RegionState, ms: f64) -> u64 {
    (r.sale_rate_per_s * ms / 1_000.0).floor() as u64
}

/// Share of a region's dry time (units on hand over its rate) a move may
/// count on: the report is up to a sync interval old, and a rate measured
/// in a burst's first tens of milliseconds reads low. Counting the whole
/// of it moved units into regions that were dry before they came (in the
/// simulator's `dist-burst`, 95 units from 80 ms away into a region dry 60
/// ms later, its buyers waiting 130 ms for them).
const DRY_TIME_TRUSTED: f64 = 0.5;

/// How many moves' time a region must take to sell its own free units
/// before they are moved to a region whose buyers would wait for them
/// ([`TailMerge::escrow_plan`]).
const LATE_MOVE_FACTOR: f64 = 2.0;

/// Grants of the `pool` to the regions that `lack` units, in proportion
/// to what each lacks; what each lacks is lowered by its grant.
fn grants_by_lack(pool: u64, lacks: &mut [(usize, u64)]) -> Vec<(usize, u64)> {
    let lacking: u64 = lacks.iter().map(|(_, lack)| lack).sum();
    let weights: Vec<u32> = lacks
        .iter()
        .map(|(_, lack)| u32::try_from(*lack).unwrap_or(u32::MAX))
        .collect();
    let units = split_by_weight(pool.min(lacking), &weights);
    let mut grants = Vec::new();
    for ((j, lack), units) in lacks.iter_mut().zip(units) {
        if units > 0 {
            grants.push((*j, units));
            *lack -= units;
        }
    }
    grants
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
            return self.merged_plan(sku);
        }
        self.escrow_plan(sku)
    }
}

/// `sku` as it is now: each region's report is half its round trip old,
/// and its buyers held units meanwhile.
fn aged(sku: &SkuState) -> SkuState {
    let mut now = sku.clone();
    for r in &mut now.regions {
        r.available = r
            .available
            .saturating_sub(sold_during(r, r.rtt_ms as f64 / 2.0));
    }
    now
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
