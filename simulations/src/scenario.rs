//! Scenarios: what a simulation run models, read from TOML.
//!
//! A scenario names the SKU, the regions (stock weight, demand share, round
//! trip to the coordinator), the demand curve, how buyers behave once they
//! hold units, the agents' and coordinator's timings, network faults, fault
//! windows and each policy's settings. Every field except the SKU, regions
//! and demand has a default, so a scenario file states only what it is about.
//! Times in a scenario are relative to the sale's start.

use std::path::Path;

use escrow_core::policy::{RefillSettings, TailMergeSettings};
use serde::{Deserialize, Serialize};

/// The standard scenarios, compiled in so `simulate run flash-1m` works from any directory.
pub const BUILT_IN: &[(&str, &str)] = &[
    ("flash-1m", include_str!("../scenarios/flash-1m.toml")),
    (
        "partition-1m",
        include_str!("../scenarios/partition-1m.toml"),
    ),
    (
        "coordinator-down",
        include_str!("../scenarios/coordinator-down.toml"),
    ),
    ("abandon-30", include_str!("../scenarios/abandon-30.toml")),
    ("tiny", include_str!("../scenarios/tiny.toml")),
    ("tail-701", include_str!("../scenarios/tail-701.toml")),
    (
        "tail-spread-700",
        include_str!("../scenarios/tail-spread-700.toml"),
    ),
    (
        "tail-five-10k",
        include_str!("../scenarios/tail-five-10k.toml"),
    ),
    ("tail-20x", include_str!("../scenarios/tail-20x.toml")),
    ("dist-spread", include_str!("../scenarios/dist-spread.toml")),
    ("dist-skewed", include_str!("../scenarios/dist-skewed.toml")),
    (
        "dist-spread-fit",
        include_str!("../scenarios/dist-spread-fit.toml"),
    ),
    (
        "dist-skewed-fit",
        include_str!("../scenarios/dist-skewed-fit.toml"),
    ),
    ("dist-five", include_str!("../scenarios/dist-five.toml")),
    ("dist-burst", include_str!("../scenarios/dist-burst.toml")),
];

/// Why a scenario could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Neither a file nor a built-in scenario of that name.
    #[error("no scenario file or built-in scenario named {0:?} (built-in: {1})")]
    NotFound(String, String),
    /// The file could not be read.
    #[error("reading {0}: {1}")]
    Io(String, std::io::Error),
    /// The TOML does not describe a scenario.
    #[error("parsing {0}: {1}")]
    Parse(String, toml::de::Error),
    /// The values do not make sense together.
    #[error("scenario {0}: {1}")]
    Invalid(String, String),
}

/// Everything one run models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in reports and output folders.
    pub name: String,
    /// One or two sentences on what the scenario is about.
    #[serde(default)]
    pub description: String,
    /// Seed used when none is given on the command line.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The SKU on sale.
    pub sku: SkuConfig,
    /// The regions selling it; the coordinator is a separate node.
    pub regions: Vec<RegionConfig>,
    /// When buyers arrive.
    pub demand: DemandConfig,
    /// What buyers do after they arrive.
    #[serde(default)]
    pub buyers: BuyerConfig,
    /// Region agents' timings and bounds.
    #[serde(default)]
    pub agent: AgentConfig,
    /// The coordinator's timings.
    #[serde(default)]
    pub coordinator: CoordinatorConfig,
    /// Message loss, duplication and reordering between agents and coordinator.
    #[serde(default)]
    pub network: NetworkConfig,
    /// Windows of partition, coordinator outage and agent crash.
    #[serde(default)]
    pub faults: Vec<FaultConfig>,
    /// Settings of every policy.
    #[serde(default)]
    pub policies: PolicySettings,
    /// How long to run around the sale.
    #[serde(default)]
    pub run: RunConfig,
}

fn default_seed() -> u64 {
    1
}

/// The SKU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkuConfig {
    /// Units on sale.
    pub total: u64,
    /// Most units one reservation may hold.
    #[serde(default = "one")]
    pub max_per_user: u32,
    /// How long a hold lasts before it expires.
    #[serde(default = "default_hold_ttl_ms")]
    pub hold_ttl_ms: u64,
}

fn one() -> u32 {
    1
}

fn default_hold_ttl_ms() -> u64 {
    600_000
}

/// One region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    /// Region name, `[a-z0-9-]{1,32}`.
    pub name: String,
    /// Stock weight given to the policy's initial split.
    #[serde(default = "one")]
    pub weight: u32,
    /// Share of all buyers that arrive here (normalised over regions).
    pub demand: f64,
    /// Round trip to the coordinator.
    pub rtt_ms: f64,
    /// Extra one-way delay, uniform in `0..jitter_ms`.
    #[serde(default)]
    pub jitter_ms: f64,
}

/// The demand curve: a linear ramp to a peak, exponential decay, and a flat base.
///
/// Arrivals are a Poisson process with that time-varying rate, conditioned
/// on its total count, so a scenario of 1,000,000 buyers has exactly that many.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemandConfig {
    /// Buyers in all (first attempts, bots excluded).
    pub buyers: u64,
    /// Arrivals happen in `0..duration_s`.
    pub duration_s: f64,
    /// Seconds from sale start to the peak rate.
    #[serde(default)]
    pub ramp_s: f64,
    /// Time constant of the decay after the peak.
    #[serde(default = "default_decay_s")]
    pub decay_s: f64,
    /// Share of buyers arriving at a flat rate over the whole window.
    #[serde(default = "default_base_share")]
    pub base_share: f64,
    /// Share of buyers asking for more than one unit (2..=max_per_user).
    #[serde(default)]
    pub multi_unit_share: f64,
    /// Bursts of bots that retry.
    #[serde(default)]
    pub bots: Vec<BotBurst>,
}

fn default_decay_s() -> f64 {
    30.0
}

fn default_base_share() -> f64 {
    0.2
}

/// A burst of bots in one region: each retries on any answer but HELD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotBurst {
    /// Region the bots hit.
    pub region: String,
    /// Burst start.
    pub start_s: f64,
    /// Burst length; bots arrive uniformly within it.
    pub duration_s: f64,
    /// Number of bots.
    pub bots: u64,
    /// Pause between a bot's attempts.
    pub retry_ms: u64,
    /// Attempts after the first.
    pub retries: u32,
}

/// How buyers behave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuyerConfig {
    /// Share of holds never confirmed: they expire after the hold TTL.
    pub abandon: f64,
    /// Share of holds released (cancelled) instead of confirmed.
    pub release: f64,
    /// Share of confirming buyers that extend their hold once (payment starts).
    pub extend: f64,
    /// Time from HELD to confirm or release, uniform in this range.
    pub confirm_delay_ms: [u64; 2],
    /// A human told PAUSED (or refused by a full queue) retries after this.
    pub retry_after_ms: u64,
    /// A human retries at most this many times, then gives up.
    pub retries: u32,
}

impl Default for BuyerConfig {
    fn default() -> Self {
        Self {
            abandon: 0.05,
            release: 0.02,
            extend: 0.2,
            confirm_delay_ms: [5_000, 120_000],
            retry_after_ms: 1_000,
            retries: 3,
        }
    }
}

/// A region agent's timings and bounds (defaults: `region-agent`'s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// How often the agent reports to the coordinator (after the last report ended).
    pub sync_interval_ms: u64,
    /// How long a call to the coordinator (sync or take) may take before it fails.
    pub client_timeout_ms: u64,
    /// One commit of a batch (holds, grants, returns, expiries) in the agent's database.
    pub commit_us: u64,
    /// What each hold or transition adds to its batch's commit (statements,
    /// rows, the HTTP work around it), µs.
    pub commit_row_us: u64,
    /// An answer given before the queue (the gate: sold-out flag, full queue).
    pub gate_us: u64,
    /// Every agent runs on one machine (as `bench tail` runs them on
    /// loopback): the per-row work of their commits (`commit_row_us`)
    /// queues for that machine's CPU, one commit's rows at a time, instead
    /// of each agent having its own.
    pub one_machine: bool,
    /// Most requests in one batch (`--max-in-flight`).
    pub max_in_flight: usize,
    /// Most commands waiting in the owner's queue (`--max-waiting`).
    pub max_waiting: usize,
    /// Longest a request waits in the queue (`--wait-timeout-ms`).
    pub wait_timeout_ms: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            sync_interval_ms: 200,
            client_timeout_ms: 2_000,
            commit_us: 2_000,
            commit_row_us: 50,
            gate_us: 50,
            one_machine: false,
            max_in_flight: 256,
            max_waiting: 4_096,
            wait_timeout_ms: 2_000,
        }
    }
}

/// The coordinator's timings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoordinatorConfig {
    /// Time one request occupies the coordinator (its transaction); requests queue behind it.
    pub service_us: u64,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self { service_us: 250 }
    }
}

/// Faults on every agent-coordinator message.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Probability a message is lost.
    pub loss: f64,
    /// Probability a message is delivered twice.
    pub duplicate: f64,
    /// Probability a message is held back by up to `reorder_ms` (overtaken).
    pub reorder: f64,
    /// Longest hold-back of a reordered message.
    pub reorder_ms: f64,
}

/// What a fault window does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A region cannot reach the coordinator (and vice versa); buyers still reach it.
    Partition,
    /// The coordinator is unreachable; its state survives (it is in its database).
    CoordinatorDown,
    /// A region agent crashes and restarts; its database survives, memory does not.
    AgentCrash,
}

/// One fault window. It starts at `start_s` or when `start_sold` of the
/// units are held or sold, and ends after `duration_s` or when `end_sold`
/// of the units are held or sold, whichever comes first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// What happens.
    pub kind: FaultKind,
    /// The region (partition, agent crash).
    #[serde(default)]
    pub region: Option<String>,
    /// Start at this time.
    #[serde(default)]
    pub start_s: Option<f64>,
    /// Start when this share of units is held or sold.
    #[serde(default)]
    pub start_sold: Option<f64>,
    /// End when this share of units is held or sold.
    #[serde(default)]
    pub end_sold: Option<f64>,
    /// End at the latest this long after the start.
    pub duration_s: f64,
}

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
    /// ...where every region is at most this far (round trip, ms).
    pub merge_rtt_max_ms: u64,
    /// A region keeps what its buyers take during this many of its round
    /// trips plus `move_overhead_ms`, beyond its share of the remainder.
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

/// How long to simulate around the sale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Time before the sale for initial grants to reach the regions.
    pub warmup_ms: u64,
    /// Time after the last buyer is done for quota to settle.
    pub settle_ms: u64,
    /// Hard stop, seconds after sale start.
    pub max_s: f64,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            warmup_ms: 3_000,
            settle_ms: 3_000,
            max_s: 7_200.0,
        }
    }
}

impl Scenario {
    /// Parses a scenario from TOML text; `origin` names it in errors.
    pub fn parse(origin: &str, text: &str) -> Result<Self, ScenarioError> {
        let scenario: Scenario =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(origin.to_owned(), e))?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Loads `name_or_path`: a TOML file if one exists there, else a built-in scenario.
    pub fn load(name_or_path: &str) -> Result<Self, ScenarioError> {
        let path = Path::new(name_or_path);
        if path.is_file() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ScenarioError::Io(name_or_path.to_owned(), e))?;
            return Self::parse(name_or_path, &text);
        }
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(name_or_path);
        match BUILT_IN.iter().find(|(n, _)| *n == name) {
            Some((n, text)) => Self::parse(n, text),
            None => Err(ScenarioError::NotFound(
                name_or_path.to_owned(),
                BUILT_IN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }

    /// Index of the region named `name`.
    pub fn region_index(&self, name: &str) -> Option<usize> {
        self.regions.iter().position(|r| r.name == name)
    }

    /// Checks that the values make sense together.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |why: String| Err(ScenarioError::Invalid(self.name.clone(), why));
        let share = |x: f64| (0.0..=1.0).contains(&x);
        if self.regions.is_empty() || self.regions.len() > 32 {
            return bad("1..=32 regions".into());
        }
        for r in &self.regions {
            if escrow_core::RegionName::parse(&r.name).is_err() {
                return bad(format!("region name {:?} is not [a-z0-9-]{{1,32}}", r.name));
            }
            if !(r.demand >= 0.0 && r.rtt_ms >= 0.0 && r.jitter_ms >= 0.0) {
                return bad(format!("region {}: negative demand or latency", r.name));
            }
        }
        if self.regions.iter().map(|r| r.demand).sum::<f64>() <= 0.0 && self.demand.buyers > 0 {
            return bad("demand shares sum to zero".into());
        }
        if self.regions.iter().all(|r| r.weight == 0) {
            return bad("every region has weight 0".into());
        }
        if escrow_core::SkuSettings::parse(
            Some(i64::from(self.sku.max_per_user)),
            Some(self.sku.hold_ttl_ms as i64),
        )
        .is_err()
        {
            return bad("max_per_user or hold_ttl_ms outside the contract's ranges".into());
        }
        if self.sku.max_per_user > u32::from(u16::MAX) {
            return bad("max_per_user too large for the simulator".into());
        }
        let d = &self.demand;
        if d.buyers > u64::from(u32::MAX / 2) {
            return bad("too many buyers".into());
        }
        if !(d.duration_s > 0.0 && d.ramp_s >= 0.0 && d.ramp_s < d.duration_s && d.decay_s > 0.0) {
            return bad("demand needs 0 <= ramp_s < duration_s and decay_s > 0".into());
        }
        if !share(d.base_share) || !share(d.multi_unit_share) {
            return bad("demand shares must be in 0..=1".into());
        }
        for b in &d.bots {
            if self.region_index(&b.region).is_none() {
                return bad(format!("bot burst in unknown region {}", b.region));
            }
            if !(b.start_s >= 0.0 && b.duration_s > 0.0) || b.retries > 1_000 {
                return bad("bot burst needs start_s >= 0, duration_s > 0, retries <= 1000".into());
            }
        }
        let b = &self.buyers;
        if !share(b.abandon) || !share(b.release) || !share(b.extend) || b.abandon + b.release > 1.0
        {
            return bad("buyer shares must be in 0..=1 and abandon + release <= 1".into());
        }
        if b.confirm_delay_ms[0] > b.confirm_delay_ms[1] || b.retries > 1_000 {
            return bad("confirm_delay_ms must be [min, max]; retries <= 1000".into());
        }
        let a = &self.agent;
        if a.sync_interval_ms == 0
            || a.client_timeout_ms == 0
            || a.max_in_flight == 0
            || a.max_waiting == 0
        {
            return bad("agent intervals, timeouts and bounds must be positive".into());
        }
        let n = &self.network;
        if !share(n.loss) || !share(n.duplicate) || !share(n.reorder) || n.loss >= 1.0 {
            return bad("network probabilities must be in 0..1".into());
        }
        for (name, r) in [
            ("refill", &self.policies.refill),
            ("tail-merge", &self.policies.tail_merge.refill),
        ] {
            // RefillSettings::refills computes target - on_hand for regions below
            // low water; a target below low water underflows (see docs/simulations.md).
            if !(r.refill_s >= r.low_water_s && r.low_water_s >= 0.0 && share(r.reserve_fraction)) {
                return bad(format!(
                    "policies.{name}: need refill_s >= low_water_s >= 0 and reserve_fraction in 0..=1"
                ));
            }
        }
        for f in &self.faults {
            if f.start_s.is_some() == f.start_sold.is_some() {
                return bad("a fault needs exactly one of start_s and start_sold".into());
            }
            if f.duration_s <= 0.0 {
                return bad("a fault needs duration_s > 0".into());
            }
            match (f.kind, &f.region) {
                (FaultKind::CoordinatorDown, _) => {}
                (_, Some(r)) if self.region_index(r).is_some() => {}
                _ => return bad("partition and agent-crash faults need a known region".into()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every built-in scenario parses and validates.
    #[test]
    fn built_in_scenarios_are_valid() {
        for (name, _) in BUILT_IN {
            let s = Scenario::load(name).unwrap();
            assert_eq!(&s.name, name);
        }
        assert!(Scenario::load("no-such-scenario").is_err());
    }
}
