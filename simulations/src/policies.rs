//! The policies a simulation can run, by name, built from a scenario's settings.
//!
//! These are escrow-core's policies, the ones the coordinator runs, chosen
//! the way an admin chooses them for a SKU ([`PolicyChoice`]); the
//! simulator only fills in the scenario's settings.

use escrow_core::policy::ProportionalShare;
use escrow_core::{Policy, PolicyChoice};

use crate::scenario::PolicySettings;

/// Every policy name, in the order reports list them.
pub const POLICY_NAMES: [&str; 5] = PolicyChoice::NAMES;

/// The policy called `name` with `settings`; `None` if there is no such policy.
pub fn build(
    name: &str,
    settings: &PolicySettings,
    sync_interval_ms: u64,
) -> Option<Box<dyn Policy>> {
    let choice = match name {
        "refill" => PolicyChoice::Refill(settings.refill.to_core(sync_interval_ms)),
        "proportional" => PolicyChoice::Proportional(ProportionalShare {
            reserve_fraction: settings.proportional.reserve_fraction,
            recall_min_units: settings.proportional.recall_min_units,
        }),
        "tail-merge" => PolicyChoice::TailMerge(settings.tail_merge.to_core(sync_interval_ms)),
        other => PolicyChoice::defaults(other, sync_interval_ms).ok()?,
    };
    Some(choice.build())
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
