//! The sales `bench tail` runs: named presets, a shape given by flags, or a
//! simulator scenario.
//!
//! A [`Sale`] is fully decided before any server starts: every buyer's
//! arrival time, region, quantity, patience and checkout, drawn from a
//! fixed seed, so each policy meets the same crowd. A scenario's crowd is the simulator's
//! own ([`simulations::demand::Demand`] with the scenario's seed), so the
//! two tools can be run on the same sale and their numbers put side by side.
//!
//! This file holds what a sale is made of; a shape given by flags and its
//! crowd are in `crowd.rs`, the named presets in `presets.rs`, and the sale
//! of a simulator scenario in `scenario.rs`.

mod crowd;
mod presets;
mod scenario;

use std::time::Duration;

use super::link::Distances;

pub use crowd::{default_skew, parse_skew, Arrivals, Shape};
pub use presets::{Preset, DISTANCE_PRESETS, PRESETS};
pub use scenario::scenario_sale;

/// Region names, in the order regions are added.
pub const REGION_NAMES: [&str; 5] = ["eu", "us", "ap", "sa", "af"];

/// Default wait before a retry when an answer carries no `Retry-After`.
pub const RETRY_AFTER_DEFAULT: Duration = Duration::from_secs(1);

/// Default bound on a browser buyer's retrying, from its first attempt.
pub const RETRYING_MAX_DEFAULT: Duration = Duration::from_secs(60);

/// Default window the crowd arrives in.
pub const ARRIVAL_WINDOW_DEFAULT: Duration = Duration::from_millis(500);

/// Hold TTL of the SKU: the contract's longest, so no hold expires and no
/// unit comes back during a run (the analysis relies on it).
pub const HOLD_TTL_MS: u64 = 3_600_000;

/// Most buyers one sale may have (memory of the logs, spawn rate).
pub const BUYERS_MAX: u64 = 2_000_000;

/// One region of a sale.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionSpec {
    /// Its name (`--region` of its agent).
    pub name: String,
    /// Its stock weight in the SKU's `regions`.
    pub weight: u32,
    /// Its share of the buyers.
    pub share: f64,
    /// Round trip between its agent and the coordinator, ms (0: loopback).
    pub rtt_ms: u64,
}

/// When a buyer stops retrying.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Patience {
    /// Wait before a retry when the answer says nothing (or always, if `fixed_wait`).
    pub wait: Duration,
    /// Always wait `wait`, ignoring `Retry-After` (the simulator's buyers do).
    pub fixed_wait: bool,
    /// Retry a SOLD_OUT too (the simulator's bots).
    pub retry_sold_out: bool,
    /// At most this many retries, if bounded by count.
    pub retries_max: Option<u32>,
    /// No retry starts later than this after the first attempt.
    pub retrying_max: Duration,
}

impl Patience {
    /// A browser: honours `Retry-After` (1 s without one), retries a 503
    /// with the same key for up to `retrying_max`, stops at SOLD_OUT.
    pub fn browser(retrying_max: Duration) -> Self {
        Self {
            wait: RETRY_AFTER_DEFAULT,
            fixed_wait: false,
            retry_sold_out: false,
            retries_max: None,
            retrying_max,
        }
    }
}

/// One buyer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// When the buyer arrives, after the sale's start.
    pub at: Duration,
    /// Index of the region it buys in.
    pub region: u8,
    /// Units asked for.
    pub qty: u32,
    /// Index of its [`Patience`] in [`Sale::patience`].
    pub patience: u8,
    /// After a hold, the buyer pays (confirms it) this long after the
    /// HELD; `None`: the hold is kept unconfirmed.
    pub pay_after: Option<Duration>,
}

/// The SKU's per-user limit, and whether buyers' ids name their region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UserLimit {
    /// `"user_limit_scope": "region"`: each region judges its own buyers.
    #[default]
    Region,
    /// `global`, ids without a region (`u...`): each buyer's home is
    /// hashed, so most buy away from home and borrow their place.
    GlobalHashed,
    /// `global`, each id naming the region the buyer buys in
    /// (`eu:u...`): everybody buys at home.
    GlobalNamed,
}

impl UserLimit {
    /// Parses `region`, `global-hashed` or `global-named`.
    pub fn parse(raw: &str) -> anyhow::Result<Self> {
        match raw {
            "region" => Ok(Self::Region),
            "global-hashed" => Ok(Self::GlobalHashed),
            "global-named" => Ok(Self::GlobalNamed),
            _ => anyhow::bail!("expected region, global-hashed or global-named, not {raw}"),
        }
    }

    /// How the table names it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Region => "per-user limit per region",
            Self::GlobalHashed => "global per-user limit, homes hashed from the ids",
            Self::GlobalNamed => "global per-user limit, ids naming the buyer's region",
        }
    }
}

/// One sale, decided in full before it runs.
#[derive(Debug, Clone)]
pub struct Sale {
    /// What the table is titled.
    pub label: String,
    /// The regions.
    pub regions: Vec<RegionSpec>,
    /// Units on sale.
    pub units: u64,
    /// The SKU's `max_per_user`.
    pub max_per_user: u32,
    /// The SKU's per-user limit's scope, and the buyers' ids.
    pub user_limit: UserLimit,
    /// Every buyer, in arrival order.
    pub arrivals: Vec<Arrival>,
    /// Kinds of buyers: people first, then one per bot burst.
    pub patience: Vec<Patience>,
    /// Things the run does not reproduce (of a scenario), to print.
    pub notes: Vec<String>,
    /// The scenario it came from, to print the simulator's command.
    pub scenario: Option<String>,
}

impl Sale {
    /// Buyers in all.
    pub fn buyers(&self) -> usize {
        self.arrivals.len()
    }

    /// Each region's round trip to the coordinator: the sale's own, with
    /// `overrides` (`--rtt`) taking precedence.
    pub fn distances(&self, overrides: &Distances) -> Distances {
        let mut distances: Distances = self
            .regions
            .iter()
            .filter(|r| r.rtt_ms > 0)
            .map(|r| (r.name.clone(), r.rtt_ms))
            .collect();
        distances.extend(overrides.iter().map(|(name, ms)| (name.clone(), *ms)));
        distances
    }

    /// Region `index`'s round trip to the coordinator under `distances`, ms.
    pub fn rtt_ms(&self, distances: &Distances, index: usize) -> u64 {
        self.regions
            .get(index)
            .and_then(|r| distances.get(&r.name))
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
