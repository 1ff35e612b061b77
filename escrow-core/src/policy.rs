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

use serde::{Deserialize, Serialize};

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

    fn split(&self, total: u64, weights: &[u32]) -> Vec<u64> {
        let reserve = (total as f64 * self.reserve_fraction.clamp(0.0, 1.0)).ceil() as u64;
        split_by_weight(total - reserve.min(total), weights)
    }

    /// Grants from the pool to every region below its low-water mark, each
    /// up to its target; when the pool cannot cover them all, it is shared
    /// in proportion to what each lacks (the busiest region does not take
    /// it all while a quieter one's buyers wait too).
    fn refills(&self, sku: &SkuState) -> Refills {
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
        let grants: Vec<(usize, u64)> = needy
            .iter()
            .zip(units)
            .filter(|(_, units)| *units > 0)
            .map(|((i, _), units)| (*i, units))
            .collect();
        Refills {
            grants,
            needy: needy.iter().map(|(i, _)| *i).collect(),
            covered: wanted <= sku.pool,
        }
    }
}

/// What [`RefillSettings::refills`] decided.
struct Refills {
    /// Units from the pool, by region index.
    grants: Vec<(usize, u64)>,
    /// Regions below their low-water mark.
    needy: Vec<usize>,
    /// Whether the pool covered every region's want.
    covered: bool,
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
            grants: self.settings.refills(sku).grants,
            ..Plan::default()
        }
    }
}

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
            } else if *share + self.recall_min_units < r.available.saturating_sub(r.recall_pending)
            {
                plan.recalls
                    .push((i, r.available - r.recall_pending - share));
            }
        }
        plan
    }
}

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

/// In central mode every free unit belongs in the pool: recall all of it.
fn central_plan(sku: &SkuState) -> Plan {
    Plan {
        grants: Vec::new(),
        recalls: sku
            .regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.available > r.recall_pending)
            .map(|(i, r)| (i, r.available - r.recall_pending))
            .collect(),
        central: true,
    }
}

/// Every sale asks the coordinator: all units stay in the pool.
#[derive(Debug, Clone, Default)]
pub struct CentralOnly;

impl Policy for CentralOnly {
    fn name(&self) -> &'static str {
        "central"
    }
    fn initial_split(&self, _total: u64, weights: &[u32]) -> Vec<u64> {
        vec![0; weights.len()]
    }
    fn plan(&self, sku: &SkuState) -> Plan {
        central_plan(sku)
    }
    fn starts_central(&self) -> bool {
        true
    }
}

/// The answer to a region asking for units it does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeDecision {
    /// Units granted from the pool now.
    pub granted: u64,
    /// No unit is free anywhere: not in the pool, not in transit, not in
    /// any region. Only then may a buyer be told SOLD_OUT.
    pub exhausted: bool,
}

/// Decides a synchronous take of `units` for region `asking`, plus up to
/// `prefetch` units for its next buyers: grant what the pool has of
/// `units`, and of `prefetch` no more than brings the region to its share
/// of the remainder by recent demand (so a busy region's prefetch does not
/// drain the pool that other short regions wait on); report exhaustion only
/// when nothing is free anywhere after the grant.
///
/// Every other region's last report and grants in transit count. The
/// asking region speaks for itself: it asks because what it has is not
/// enough, so only `asker_unseen` counts for it: grants to it that it has
/// not credited yet and its returns that have not reached the pool (both
/// from the take's own counters). Counting its stale report or the grants
/// it already sold from would call units free that are gone, and send its
/// buyers away to wait for nothing.
pub fn decide_take(
    sku: &SkuState,
    asking: usize,
    units: u64,
    prefetch: u64,
    asker_unseen: u64,
) -> TakeDecision {
    assert!(asking < sku.regions.len(), "the asking region takes part");
    let for_buyers = units.min(sku.pool);
    let room =
        demand_shares(sku)[asking].saturating_sub(sku.regions[asking].on_hand() + for_buyers);
    let granted = for_buyers + prefetch.min(sku.pool - for_buyers).min(room);
    let others: u64 = sku
        .regions
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != asking)
        .map(|(_, r)| r.on_hand())
        .sum();
    // asker_unseen comes from the taker's own counters: saturate rather
    // than trust them not to overflow (only whether it is 0 matters).
    let elsewhere = others.saturating_add(asker_unseen);
    TakeDecision {
        granted,
        exhausted: for_buyers < units && sku.pool == for_buyers && elsewhere == 0,
    }
}

/// How long a central-mode region keeps units a release or an expiry freed
/// for its own buyers before it gives them back to the pool.
pub const CENTRAL_RETURN_GRACE_MS: u64 = 1_000;

/// Units a region gives back to the pool after a batch, given `free`
/// units left after the batch's holds.
///
/// In escrow mode: what the coordinator recalled (`return_until` is
/// cumulative, so a repeated directive never returns twice). In central
/// mode: every free unit once the region's own buyers are not asking
/// (`local_demand`) and no release or expiry freed units here within
/// [`CENTRAL_RETURN_GRACE_MS`] (`freed_ms_ago`): freed units first sell
/// where they are, as in escrow mode, instead of travelling to the pool
/// and back while every region's cached sold-out flag still says no. Units
/// left over from the region's quota when the SKU merged go as soon as its
/// buyers stop asking: buyers elsewhere may be waiting for them.
pub fn units_to_return(
    mode: Mode,
    free: u64,
    return_until: Option<u64>,
    returned: u64,
    local_demand: bool,
    freed_ms_ago: u64,
) -> u64 {
    let wanted = match mode {
        Mode::Central if local_demand || freed_ms_ago < CENTRAL_RETURN_GRACE_MS => 0,
        Mode::Central => free,
        Mode::Escrow => return_until.map_or(0, |until| until.saturating_sub(returned)),
    };
    wanted.min(free)
}

/// Whether a SKU has nothing free anywhere: what agents cache as sold out.
pub fn is_exhausted(sku: &SkuState) -> bool {
    sku.remainder() == 0
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn region(weight: u32, available: u64, rate: f64) -> RegionState {
        RegionState {
            weight,
            leased: available,
            in_transit: 0,
            available,
            sale_rate_per_s: rate,
            rtt_ms: 100,
            recall_pending: 0,
        }
    }

    /// Goal: splits by weight sum exactly to the units, for any weights.
    #[test]
    fn split_by_weight_is_exact() {
        assert_eq!(split_by_weight(10, &[2, 1]), vec![7, 3]);
        assert_eq!(split_by_weight(10, &[1, 1, 1]).iter().sum::<u64>(), 10);
        assert_eq!(split_by_weight(5, &[0, 0]), vec![0, 0]);
        assert_eq!(split_by_weight(3, &[0, 1]), vec![0, 3]);
    }

    /// Goal: a region selling steadily is refilled before it runs dry, from the pool only.
    #[test]
    fn refill_tops_up_a_region_below_low_water() {
        let policy = TailMerge::default();
        let sku = SkuState {
            total: 10_000,
            pool: 1_000,
            mode: Mode::Escrow,
            regions: vec![region(1, 5, 50.0), region(1, 5_000, 1.0)],
        };
        let plan = policy.plan(&sku);
        assert!(!plan.central);
        assert_eq!(plan.grants.len(), 1);
        assert_eq!(plan.grants[0].0, 0);
        assert!(plan.grants[0].1 > 50);
        assert!(plan.recalls.is_empty());
    }

    /// Goal: with the pool empty and a region starved, surplus comes back from a slow region.
    #[test]
    fn surplus_is_recalled_when_the_pool_is_empty() {
        let policy = TailMerge::default();
        let sku = SkuState {
            total: 10_000,
            pool: 0,
            mode: Mode::Escrow,
            regions: vec![region(1, 0, 50.0), region(1, 5_000, 1.0)],
        };
        let plan = policy.plan(&sku);
        assert_eq!(plan.recalls.len(), 1);
        assert_eq!(plan.recalls[0].0, 1);
    }

    /// Goal: near the end the tail merges: central mode, every free unit recalled.
    #[test]
    fn tail_merges_below_threshold() {
        let policy = TailMerge::default();
        let sku = SkuState {
            total: 1_000,
            pool: 3,
            mode: Mode::Escrow,
            regions: vec![region(1, 4, 5.0), region(1, 6, 1.0)],
        };
        let plan = policy.plan(&sku);
        assert!(plan.central);
        assert_eq!(plan.recalls, vec![(0, 4), (1, 6)]);
    }

    /// Goal: at a distance the merge does not wait on the farthest round
    /// trip: a region that still has units keeps selling them locally, and
    /// only what its own buyers will not use during a move is asked back.
    #[test]
    fn far_regions_keep_their_tail() {
        let policy = TailMerge::default();
        let far = |available, rate, rtt_ms| RegionState {
            rtt_ms,
            ..region(1, available, rate)
        };
        // 40 units left of 1,000, above the merge threshold of 20 (a
        // region is farther than 50 ms: no round trips count).
        let sku = SkuState {
            total: 1_000,
            pool: 0,
            mode: Mode::Escrow,
            regions: vec![far(0, 400.0, 20), far(40, 200.0, 230)],
        };
        let plan = policy.plan(&sku);
        assert!(!plan.central);
        assert_eq!(policy.threshold(&sku), 20);
        // The far region's share of 40 by demand is 13, and it sells 56 more
        // during a move (230 ms + 50 ms at 200/s): it keeps all 40.
        assert!(plan.recalls.is_empty(), "{plan:?}");
        let short = policy.plan_short(&sku);
        assert!(short.recalls.is_empty(), "{short:?}");
    }

    /// Goal: a region that has not reported any demand yet is not stripped
    /// by the first region to report (its own buyers may be on their way),
    /// even while buyers elsewhere wait (a short take); a region with
    /// known demand keeps its share of the remainder by demand plus what
    /// it sells during a move.
    #[test]
    fn recalls_spare_regions_whose_demand_is_unknown() {
        let policy = TailMerge::default();
        let sku = SkuState {
            total: 1_000,
            pool: 0,
            mode: Mode::Escrow,
            regions: vec![
                region(1, 10, 300.0),
                region(1, 400, 0.0),
                region(1, 400, 100.0),
            ],
        };
        let plan = policy.plan(&sku);
        // Remainder 810 shared 3:2:1 (the silent region counted at the
        // others' 200/s per weight): the third region keeps 135, plus 15
        // it sells during a move (100 ms round trip + 50 ms at 100/s).
        assert_eq!(plan.recalls, vec![(2, 400 - 135 - 15)]);
        let short = policy.plan_short(&sku);
        assert_eq!(short.recalls, plan.recalls);
    }

    /// Goal: when the whole remainder sells within less than the low-water
    /// mark's second, every region is below its mark; a region above its
    /// ceiling (its share by demand plus a move's sales) still gives back
    /// to the one that ran dry, and is not refilled meanwhile.
    #[test]
    fn a_region_below_low_water_but_above_its_ceiling_gives_back() {
        let policy = TailMerge::default();
        let sku = SkuState {
            total: 701,
            pool: 0,
            mode: Mode::Escrow,
            regions: vec![
                region(1, 0, 4_400.0),
                region(1, 220, 440.0),
                region(1, 225, 290.0),
            ],
        };
        let refill = &policy.settings.refill;
        assert!(sku
            .regions
            .iter()
            .all(|r| r.on_hand() < refill.low_water(r)));
        let plan = policy.plan(&sku);
        assert!(!plan.central);
        let recalled: Vec<usize> = plan.recalls.iter().map(|(i, _)| *i).collect();
        assert_eq!(recalled, vec![1, 2], "{plan:?}");
        assert!(plan.grants.iter().all(|(i, _)| !recalled.contains(i)));
        for &(i, units) in &plan.recalls {
            assert!(units <= sku.regions[i].available);
        }
    }

    /// Goal: a take says exhausted only when no unit is free anywhere.
    #[test]
    fn take_is_exhausted_only_when_nothing_is_free() {
        let mut sku = SkuState {
            total: 10,
            pool: 1,
            mode: Mode::Central,
            regions: vec![region(1, 0, 0.0), region(1, 0, 0.0)],
        };
        assert_eq!(
            decide_take(&sku, 0, 1, 0, 0),
            TakeDecision {
                granted: 1,
                exhausted: false
            }
        );
        assert_eq!(
            decide_take(&sku, 0, 2, 0, 0),
            TakeDecision {
                granted: 1,
                exhausted: true
            }
        );
        sku.regions[0].available = 3;
        sku.regions[0].in_transit = 3;
        assert!(
            decide_take(&sku, 0, 2, 0, 0).exhausted,
            "the asker's own stale report and credited grants are not free"
        );
        assert!(
            !decide_take(&sku, 0, 2, 0, 1).exhausted,
            "a grant the asker has not credited yet is"
        );
        sku.regions[1].available = 1;
        assert_eq!(
            decide_take(&sku, 0, 2, 0, 0),
            TakeDecision {
                granted: 1,
                exhausted: false
            }
        );
        sku.pool = 0;
        sku.regions[1].available = 0;
        sku.regions[1].in_transit = 1;
        assert_eq!(
            decide_take(&sku, 0, 1, 0, 0),
            TakeDecision {
                granted: 0,
                exhausted: false
            }
        );
    }

    /// Goal: a take gets what its buyers need from the pool, and a prefetch
    /// only up to its share of the remainder by demand.
    #[test]
    fn prefetch_stops_at_the_share_by_demand() {
        let sku = SkuState {
            total: 100,
            pool: 40,
            mode: Mode::Escrow,
            // Remainder 40 + 10 + 50 = 100, shared 60 / 40 by demand.
            regions: vec![region(1, 10, 60.0), region(1, 50, 40.0)],
        };
        let granted = |units, prefetch| decide_take(&sku, 0, units, prefetch, 0).granted;
        assert_eq!(granted(5, 100), 40, "share 60, on hand 10: room for 50");
        let sku = SkuState { pool: 80, ..sku };
        // Remainder 140: region 0's share is 84, it has 10.
        let granted = |units, prefetch| decide_take(&sku, 0, units, prefetch, 0).granted;
        assert_eq!(granted(5, 100), 74);
        assert_eq!(granted(5, 10), 15);
        assert_eq!(granted(80, 100), 80, "what buyers wait for is not capped");
        let greedy = |units, prefetch| decide_take(&sku, 1, units, prefetch, 0).granted;
        assert_eq!(greedy(1, 100), 6, "share 56, on hand 50");
    }

    /// Goal: returns follow recalls in escrow mode and empty the region in
    /// central mode unless its own buyers are asking; never more than free.
    #[test]
    fn returns_follow_mode_and_demand() {
        let later = CENTRAL_RETURN_GRACE_MS;
        assert_eq!(units_to_return(Mode::Escrow, 10, None, 0, false, 0), 0);
        assert_eq!(units_to_return(Mode::Escrow, 10, Some(7), 3, false, 0), 4);
        assert_eq!(units_to_return(Mode::Escrow, 2, Some(7), 3, true, 0), 2);
        assert_eq!(units_to_return(Mode::Escrow, 10, Some(2), 3, false, 0), 0);
        assert_eq!(units_to_return(Mode::Central, 5, None, 0, false, later), 5);
        assert_eq!(
            units_to_return(Mode::Central, 5, None, 0, false, later - 1),
            0
        );
        assert_eq!(
            units_to_return(Mode::Central, 5, Some(100), 0, true, later),
            0
        );
    }

    fn policies() -> Vec<Box<dyn Policy>> {
        vec![
            Box::new(StaticSplit),
            Box::new(RefillOnLowWater::default()),
            Box::new(ProportionalShare::default()),
            Box::new(TailMerge::default()),
            Box::new(CentralOnly),
        ]
    }

    proptest! {
        /// Goal: no policy ever plans to grant more than the pool holds or
        /// to recall more than a region has free, and initial splits never
        /// exceed the total.
        #[test]
        fn plans_stay_within_what_exists(
            total in 0..100_000u64,
            pool_share in 0.0..1.0f64,
            regions in proptest::collection::vec((0..5u32, 0..5_000u64, 0.0..500.0f64, 0..300u64, 0..100u64), 1..6),
        ) {
            let pool = (total as f64 * pool_share) as u64;
            let sku = SkuState {
                total,
                pool,
                mode: Mode::Escrow,
                regions: regions.iter().map(|&(w, a, rate, rtt, pending)| RegionState {
                    weight: w, leased: a, in_transit: 0, available: a, sale_rate_per_s: rate, rtt_ms: rtt,
                    recall_pending: pending.min(a),
                }).collect(),
            };
            let weights: Vec<u32> = sku.regions.iter().map(|r| r.weight).collect();
            for policy in policies() {
                prop_assert!(policy.initial_split(total, &weights).iter().sum::<u64>() <= total);
                let plan = policy.plan(&sku);
                prop_assert!(plan.grants.iter().map(|g| g.1).sum::<u64>() <= pool, "{}", policy.name());
                for &(i, units) in &plan.recalls {
                    let r = &sku.regions[i];
                    prop_assert!(units <= r.available - r.recall_pending, "{}", policy.name());
                }
            }
        }
    }
}
