//! The policies a simulation can run, by name, built from a scenario's settings.
//!
//! These are escrow-core's policies, the ones the coordinator runs; the
//! simulator only chooses one and fills in its settings.

use escrow_core::policy::{
    CentralOnly, ProportionalShare, RefillOnLowWater, StaticSplit, TailMerge,
};
use escrow_core::Policy;

use crate::scenario::PolicySettings;

/// Every policy name, in the order reports list them.
pub const POLICY_NAMES: [&str; 5] = ["static", "refill", "proportional", "tail-merge", "central"];

/// The policy called `name` with `settings`; `None` if there is no such policy.
pub fn build(
    name: &str,
    settings: &PolicySettings,
    sync_interval_ms: u64,
) -> Option<Box<dyn Policy>> {
    let policy: Box<dyn Policy> = match name {
        "static" => Box::new(StaticSplit),
        "refill" => Box::new(RefillOnLowWater {
            settings: settings.refill.to_core(sync_interval_ms),
        }),
        "proportional" => Box::new(ProportionalShare {
            reserve_fraction: settings.proportional.reserve_fraction,
            recall_min_units: settings.proportional.recall_min_units,
        }),
        "tail-merge" => Box::new(TailMerge {
            settings: settings.tail_merge.to_core(sync_interval_ms),
        }),
        "central" => Box::new(CentralOnly),
        _ => return None,
    };
    debug_assert_eq!(policy.name(), name);
    Some(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every listed name builds the policy of that name, and nothing else builds.
    #[test]
    fn names_round_trip() {
        for name in POLICY_NAMES {
            let p = build(name, &PolicySettings::default(), 200).unwrap();
            assert_eq!(p.name(), name);
        }
        assert!(build("nope", &PolicySettings::default(), 200).is_none());
    }
}
