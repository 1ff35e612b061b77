//! The sale a scenario models: the SKU, the regions selling it, when
//! buyers arrive (with bot bursts), who they are and what they do once
//! they hold units.

use escrow_core::UserLimitScope;
use serde::{Deserialize, Serialize};

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
    /// Whether a user's one reservation counts in each region on its own
    /// (`region`, the default) or across all of them (`global`: a buyer
    /// away from home borrows their place from the home region first;
    /// docs/protocol.md, "Per-user limit across regions").
    #[serde(default)]
    pub user_limit_scope: UserLimitScope,
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

/// Carts: a shop of several SKUs, each like `[sku]`, where a share of
/// the buyers checks out a cart of some of them, held all or nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CartConfig {
    /// SKUs on sale, each with `[sku]`'s total and settings.
    pub skus: u32,
    /// Share of `demand.buyers` that check out a cart; the others buy
    /// one SKU each, spread evenly over the SKUs.
    pub share: f64,
    /// Distinct SKUs in one cart, uniform in this range.
    #[serde(default = "default_cart_items")]
    pub items: [u32; 2],
}

fn default_cart_items() -> [u32; 2] {
    [2, 4]
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
    /// How buyers' user ids are made, which decides their home region
    /// under a global per-user limit.
    pub users: UserIds,
    /// Most distinct users among the buyers (0: every buyer is a user of
    /// their own). Buyer `n` is user `n mod users_max`, so a user comes
    /// back, in any region; only with `hashed` ids.
    pub users_max: u64,
}

/// How a buyer's user id is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UserIds {
    /// `u{n}`: the id names no region, so under a global limit the home
    /// is hashed over the regions and most buyers buy away from it.
    #[default]
    Hashed,
    /// `{region}:u{n}`, naming the region the buyer buys in: every buyer
    /// is at home.
    Named,
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
            users: UserIds::Hashed,
            users_max: 0,
        }
    }
}
