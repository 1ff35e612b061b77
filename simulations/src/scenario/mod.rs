//! Scenarios: what a simulation run models, read from TOML.
//!
//! A scenario names the SKU, the regions (stock weight, demand share, round
//! trip to the coordinator), the demand curve, how buyers behave once they
//! hold units, the agents' and coordinator's timings, network faults, fault
//! windows and each policy's settings. Every field except the SKU, regions
//! and demand has a default, so a scenario file states only what it is about.
//! Times in a scenario are relative to the sale's start.
//!
//! This file holds the scenario as a whole, loading and validating it; the
//! sale it models (SKU, regions, demand, buyers) is in `sale.rs`, the
//! system that sells it (agents, coordinator, network, faults) in
//! `system.rs`, and the policies' settings in `policy_settings.rs`.

mod policy_settings;
mod sale;
mod system;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use policy_settings::{PolicySettings, ProportionalSettings, RefillConfig, TailMergeConfig};
pub use sale::{BotBurst, BuyerConfig, CartConfig, DemandConfig, RegionConfig, SkuConfig, UserIds};
pub use system::{AgentConfig, CoordinatorConfig, FaultConfig, FaultKind, NetworkConfig};

/// The standard scenarios, compiled in so `simulate run flash-1m` works from any directory.
pub const BUILT_IN: &[(&str, &str)] = &[
    ("flash-1m", include_str!("../../scenarios/flash-1m.toml")),
    (
        "partition-1m",
        include_str!("../../scenarios/partition-1m.toml"),
    ),
    (
        "coordinator-down",
        include_str!("../../scenarios/coordinator-down.toml"),
    ),
    (
        "coordinator-frozen",
        include_str!("../../scenarios/coordinator-frozen.toml"),
    ),
    (
        "abandon-30",
        include_str!("../../scenarios/abandon-30.toml"),
    ),
    ("tiny", include_str!("../../scenarios/tiny.toml")),
    ("tail-701", include_str!("../../scenarios/tail-701.toml")),
    (
        "tail-spread-700",
        include_str!("../../scenarios/tail-spread-700.toml"),
    ),
    (
        "tail-five-10k",
        include_str!("../../scenarios/tail-five-10k.toml"),
    ),
    ("tail-20x", include_str!("../../scenarios/tail-20x.toml")),
    (
        "dist-spread",
        include_str!("../../scenarios/dist-spread.toml"),
    ),
    (
        "dist-skewed",
        include_str!("../../scenarios/dist-skewed.toml"),
    ),
    (
        "dist-spread-fit",
        include_str!("../../scenarios/dist-spread-fit.toml"),
    ),
    (
        "dist-skewed-fit",
        include_str!("../../scenarios/dist-skewed-fit.toml"),
    ),
    ("dist-five", include_str!("../../scenarios/dist-five.toml")),
    (
        "dist-five-short",
        include_str!("../../scenarios/dist-five-short.toml"),
    ),
    (
        "dist-burst",
        include_str!("../../scenarios/dist-burst.toml"),
    ),
    (
        "dist-global-hashed",
        include_str!("../../scenarios/dist-global-hashed.toml"),
    ),
    (
        "dist-global-named",
        include_str!("../../scenarios/dist-global-named.toml"),
    ),
    (
        "dist-carts",
        include_str!("../../scenarios/dist-carts.toml"),
    ),
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
    /// Several SKUs, and buyers checking out carts of them (none: one SKU).
    #[serde(default)]
    pub carts: Option<CartConfig>,
    /// Region agents' timings and bounds.
    #[serde(default)]
    pub agent: AgentConfig,
    /// The coordinator's timings.
    #[serde(default)]
    pub coordinator: CoordinatorConfig,
    /// Message loss, duplication and reordering between agents and coordinator.
    #[serde(default)]
    pub network: NetworkConfig,
    /// Windows of partition, coordinator outage or freeze, and agent crash.
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
        for (i, r) in self.regions.iter().enumerate() {
            if escrow_core::RegionName::parse(&r.name).is_err() {
                return bad(format!("region name {:?} is not [a-z0-9-]{{1,32}}", r.name));
            }
            if self.region_index(&r.name) != Some(i) {
                return bad(format!("two regions are named {}", r.name));
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
        if b.users == UserIds::Named && b.users_max > 0 {
            // A named id names the region bought in: the same user number
            // in two regions would be two users.
            return bad("users_max needs hashed user ids".into());
        }
        if let Some(c) = &self.carts {
            let [least, most] = c.items;
            if !(1 <= least && least <= most && most <= c.skus) {
                return bad("carts need 1 <= items[0] <= items[1] <= skus".into());
            }
            if c.skus as usize > escrow_core::cart::ITEMS_MAX || !share(c.share) {
                return bad(format!(
                    "carts need at most {} SKUs and a share in 0..=1",
                    escrow_core::cart::ITEMS_MAX
                ));
            }
            if self.sku.user_limit_scope == escrow_core::UserLimitScope::Global {
                // A cart's borrows are not simulated (docs/simulations.md).
                return bad("carts need the per-region user limit".into());
            }
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
                (FaultKind::CoordinatorDown | FaultKind::CoordinatorFrozen, _) => {}
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

    /// Goal: a scenario without the per-user settings keeps the per-region
    /// limit and ids that name no region; one whose ids could not mean what
    /// it says is refused: a region name twice (whose home would it be?),
    /// or users coming back under ids that name the region bought in.
    #[test]
    fn user_settings_default_and_are_checked() {
        let spread = Scenario::load("dist-spread").unwrap();
        assert_eq!(
            spread.sku.user_limit_scope,
            escrow_core::UserLimitScope::Region
        );
        assert_eq!(spread.buyers.users, UserIds::Hashed);
        let mut named = Scenario::load("dist-global-named").unwrap();
        assert_eq!(named.buyers.users, UserIds::Named);
        named.buyers.users_max = 10;
        assert!(named.validate().is_err());
        let mut hashed = Scenario::load("dist-global-hashed").unwrap();
        hashed.buyers.users_max = 10;
        hashed.validate().unwrap();
        hashed.regions[1].name = "eu".into();
        assert!(hashed.validate().is_err());
    }
}
