//! Scenarios whose outcome can be worked out by hand: the simulator must
//! reproduce them within 3%, or its figures cannot be trusted for the
//! cases nobody can work out.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use simulations::scenario::RegionConfig;
use simulations::{run, Scenario};

/// Two regions of equal weight share 1,000 units (500 each, a static split:
/// nothing ever moves); 2,200 buyers arrive at a flat rate, 2,000 in `a`
/// and 200 in `b`, and never retry.
fn uneven_static_split() -> Scenario {
    let mut s = common::by_hand("uneven-static");
    let a = RegionConfig {
        demand: 10.0,
        ..s.regions[0].clone()
    };
    let b = RegionConfig {
        name: "b".into(),
        demand: 1.0,
        ..a.clone()
    };
    s.regions = vec![a, b];
    s.demand.buyers = 2_200;
    s.validate().unwrap();
    s
}

fn within_3_percent(what: &str, measured: f64, expected: f64) {
    let error = (measured - expected).abs() / expected;
    assert!(
        error <= 0.03,
        "{what}: measured {measured}, worked out {expected} ({:.1}% off)",
        error * 100.0
    );
}

/// Goal: a static split under uneven flat demand. By hand: `a` sells its
/// 500 and turns the other 1,500 of its buyers away while `b`'s 300 unsold
/// units sit idle, so 700 are sold, 300 stranded, and all 1,500 are turned
/// away while units are free; `b` sells one unit to each of its 200 buyers.
#[test]
fn static_split_strands_the_quiet_regions_units() {
    let s = uneven_static_split();
    let m = run(&s, "static", 1, None).unwrap().metrics;
    within_3_percent("units sold", m.sold_units as f64, 700.0);
    within_3_percent("stranded units", m.stranded_units as f64, 300.0);
    within_3_percent(
        "turned away while free",
        m.turned_away_while_free as f64,
        1_500.0,
    );
    within_3_percent("buyers served", m.buyers_served as f64, 700.0);
    assert_eq!(m.oversold_units, 0);
}

/// Goal: one counter under flat demand. By hand: 5,000 units, 10,000 buyers
/// arriving at a flat 5,000 per second in one region: the stock lasts
/// 5,000 / 5,000 = 1.0 s, then every later buyer is told SOLD_OUT with no
/// unit free anywhere.
#[test]
fn one_counter_sells_out_when_demand_has_taken_the_total() {
    let mut s = uneven_static_split();
    s.name = "flat-central".into();
    s.sku.total = 5_000;
    s.regions.truncate(1);
    s.demand.buyers = 10_000;
    s.validate().unwrap();
    let m = run(&s, "central", 1, None).unwrap().metrics;
    within_3_percent("units sold", m.sold_units as f64, 5_000.0);
    within_3_percent(
        "time to sell-out (s)",
        m.sell_out_ms.unwrap() / 1_000.0,
        1.0,
    );
    within_3_percent("buyers turned away", m.buyers_turned_away as f64, 5_000.0);
    assert_eq!(m.oversold_units, 0);
}

/// Goal: agents on one machine share its CPU. Four regions selling 8,000
/// units from one counter (`central`), 32,000 buyers at a flat 8,000 per
/// second split evenly, and each hold costs 200 µs of CPU in its commit.
/// On separate machines each region's CPU could hold 5,000 per second, so
/// demand sets the pace: 8,000 / 8,000 = 1.0 s. On one machine the CPU
/// holds at most 1 / 200 µs = 5,000 units per second for all four, so the
/// units last 8,000 / 5,000 = 1.6 s.
#[test]
fn one_machine_sells_at_its_cpu_rate() {
    let mut s = uneven_static_split();
    s.name = "one-machine".into();
    s.sku.total = 8_000;
    let region = s.regions[0].clone();
    s.regions = ["a", "b", "c", "d"]
        .into_iter()
        .map(|name| RegionConfig {
            name: name.into(),
            demand: 1.0,
            ..region.clone()
        })
        .collect();
    s.demand.buyers = 32_000;
    s.demand.duration_s = 4.0;
    s.agent.commit_us = 1_000;
    s.agent.commit_row_us = 200;
    s.validate().unwrap();
    let apart = run(&s, "central", 1, None).unwrap().metrics;
    within_3_percent(
        "sell-out apart (s)",
        apart.sell_out_ms.unwrap() / 1_000.0,
        1.0,
    );
    s.agent.one_machine = true;
    let shared = run(&s, "central", 1, None).unwrap().metrics;
    within_3_percent(
        "sell-out on one machine (s)",
        shared.sell_out_ms.unwrap() / 1_000.0,
        1.6,
    );
    assert_eq!(shared.sold_units, 8_000);
    assert_eq!(shared.oversold_units, 0);
}
