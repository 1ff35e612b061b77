//! Units a region asks for or gives back between plans: the coordinator's
//! answer to a synchronous take, and what a region returns after a batch.

use serde::{Deserialize, Serialize};

use super::{demand_shares, Mode, SkuState};

/// The answer to a region asking for units it does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeDecision {
    /// Units granted from the pool now.
    pub granted: u64,
    /// No unit is free anywhere: not in the pool, not in transit, not in
    /// any region. Only then may a buyer be told SOLD_OUT.
    pub sold_out_everywhere: bool,
}

/// Decides a synchronous take of `units` for region `asking`, plus up to
/// `prefetch` units for its next buyers: grant what the pool has of
/// `units`, and of `prefetch` no more than brings the region to its share
/// of the remainder by recent demand (so a busy region's prefetch does not
/// drain the pool that other short regions wait on); report exhaustion only
/// when nothing is free anywhere after the grant and no region has units
/// set aside for a cart (which may let them go).
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
    let set_aside: u64 = sku.regions.iter().map(|r| r.set_aside).sum();
    let elsewhere = others
        .saturating_add(asker_unseen)
        .saturating_add(set_aside);
    TakeDecision {
        granted,
        sold_out_everywhere: for_buyers < units && sku.pool == for_buyers && elsewhere == 0,
    }
}

/// How long a central-mode region keeps units a release or an expiry freed
/// for its own buyers before it gives them back to the pool.
pub const CENTRAL_RETURN_GRACE_MS: u64 = 1_000;

/// Units a region gives back to the pool after a batch, given `free`
/// units left after the batch's holds: what the coordinator recalled
/// (`return_until` is cumulative, so a repeated directive never returns
/// twice). In central mode only once the region's own buyers are not
/// asking (`local_demand`) and no release or expiry freed units here
/// within [`CENTRAL_RETURN_GRACE_MS`] (`freed_ms_ago`): freed units first
/// sell where they are, as in escrow mode, instead of travelling to the
/// pool and back while every region's cached sold-out flag still says no.
/// The coordinator recalls every free unit in central mode but what a far
/// region's own buyers take before the recall could serve anyone else
/// (`TailMerge`): returning those too made that region's next buyers pay
/// two of its round trips for units it had.
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
        Mode::Central | Mode::Escrow => {
            return_until.map_or(0, |until| until.saturating_sub(returned))
        }
    };
    wanted.min(free)
}
