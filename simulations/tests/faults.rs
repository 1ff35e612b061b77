//! Faults with a known right outcome: whatever the coordinator went
//! through, every unit sells while buyers still want one.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use simulations::{run, Scenario};

/// Goal: a coordinator frozen for a second early in a sale (its process
/// stopped, then serving the stale calls that waited) leaves no unit
/// behind under the policies that move units: eu's buyers get us's spare
/// units, all 300 sell, and nobody is turned away while one is free.
/// Before a short take asked back surpluses under `recall_min_units`,
/// `proportional` left 2 units in us for ever on this seed.
#[test]
fn a_frozen_coordinator_strands_no_unit() {
    let s = Scenario::load("coordinator-frozen").unwrap();
    for policy in ["tail-merge", "proportional"] {
        let m = run(&s, policy, s.seed, None).unwrap().metrics;
        assert_eq!(
            (m.sold_units, m.turned_away_while_free, m.oversold_units),
            (300, 0, 0),
            "{policy}: sold, turned away while free, oversold"
        );
    }
}
