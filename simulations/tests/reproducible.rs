//! Runs are a pure function of scenario, policy and seed.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use escrow_core::UserLimitScope;
use simulations::policies::POLICY_NAMES;
use simulations::scenario::{FaultConfig, FaultKind};
use simulations::{run, Scenario};

/// A scaled-down flash sale with every kind of fault, so reproducibility
/// covers the network's random choices and the fault paths too.
fn faulty_scenario() -> Scenario {
    let mut s = Scenario::load("flash-1m").unwrap();
    s.sku.total = 300;
    s.sku.hold_ttl_ms = 20_000;
    s.demand.buyers = 6_000;
    s.demand.duration_s = 40.0;
    s.demand.decay_s = 10.0;
    s.demand.bots[0].bots = 300;
    s.buyers.confirm_delay_ms = [500, 15_000];
    s.buyers.abandon = 0.2;
    s.network.loss = 0.05;
    s.network.duplicate = 0.05;
    s.network.reorder = 0.1;
    s.network.reorder_ms = 80.0;
    s.faults = vec![
        FaultConfig {
            kind: FaultKind::Partition,
            region: Some("ap".into()),
            start_s: None,
            start_sold: Some(0.3),
            end_sold: Some(0.6),
            duration_s: 20.0,
        },
        FaultConfig {
            kind: FaultKind::AgentCrash,
            region: Some("us".into()),
            start_s: Some(1.0),
            start_sold: None,
            end_sold: None,
            duration_s: 2.0,
        },
        FaultConfig {
            kind: FaultKind::CoordinatorDown,
            region: None,
            start_s: None,
            start_sold: Some(0.9),
            end_sold: None,
            duration_s: 5.0,
        },
    ];
    s.validate().unwrap();
    s
}

/// Goal: the same seed gives identical metrics, every field compared, for every policy.
#[test]
fn same_seed_same_metrics() {
    let s = faulty_scenario();
    for policy in POLICY_NAMES {
        let a = run(&s, policy, 7, None).unwrap().metrics;
        let b = run(&s, policy, 7, None).unwrap().metrics;
        assert_eq!(a, b, "policy {policy}");
        assert!(a.events > 10_000, "the run did something");
        assert_eq!(a.oversold_units, 0);
    }
}

/// Goal: under a global per-user limit too, with users coming back in
/// other regions, the same seed gives identical metrics: borrows relayed
/// over the faulty network, through the crash and the outages, reproduce,
/// and nobody holds twice (the world checks it after every event).
#[test]
fn same_seed_same_metrics_with_borrows() {
    let mut s = faulty_scenario();
    s.sku.user_limit_scope = UserLimitScope::Global;
    s.buyers.users_max = 2_000;
    s.validate().unwrap();
    let a = run(&s, "tail-merge", 7, None).unwrap().metrics;
    let b = run(&s, "tail-merge", 7, None).unwrap().metrics;
    assert_eq!(a, b);
    assert!(a.borrowed_holds > 0 && a.borrows_refused > 0, "{a:?}");
    assert_eq!(a.oversold_units, 0);
}

/// Goal: the seed matters: another seed gives other arrivals and so other metrics.
#[test]
fn other_seed_other_metrics() {
    let s = faulty_scenario();
    let a = run(&s, "tail-merge", 7, None).unwrap().metrics;
    let b = run(&s, "tail-merge", 8, None).unwrap().metrics;
    assert_ne!(a.series, b.series);
}

/// Goal: the source chapter's experiment holds under every policy: 150
/// buyers for 40 units in one region give exactly 40 holds and 40 sales,
/// and nothing is oversold.
#[test]
fn tiny_sells_exactly_forty() {
    let s = Scenario::load("tiny").unwrap();
    for policy in POLICY_NAMES {
        let m = run(&s, policy, 1, None).unwrap().metrics;
        assert_eq!(m.buyers, 150, "{policy}");
        assert_eq!(m.buyers_served, 40, "{policy}");
        assert_eq!(m.sold_units, 40, "{policy}");
        assert_eq!(m.oversold_units, 0, "{policy}");
        assert_eq!(m.held_units_at_end, 0, "{policy}");
        assert_eq!(m.buyers_turned_away, 110, "{policy}");
    }
}
