//! The per-user limit across regions (`user_limit_scope = "global"`): a
//! buyer away from home borrows their place from the home region through
//! the coordinator before the hold is decided (docs/protocol.md, "Per-user
//! limit across regions"). How many holds pay that, what it costs in hold
//! wait, and that no user ever holds twice, which the world checks after
//! every event under a global limit.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use escrow_core::user_limit::home_region;
use escrow_core::{RegionName, UserId, UserLimitScope};
use simulations::scenario::RegionConfig;
use simulations::{report, run, Metrics, Scenario};

fn run_tail_merge(s: &Scenario) -> Metrics {
    let m = run(s, "tail-merge", 1, None).unwrap().metrics;
    assert_eq!(m.oversold_units, 0, "{}: oversold", s.name);
    m
}

/// Goal: ids that name the region each buyer buys in put every buyer at
/// home, so a global limit costs nothing: no hold borrows, and the sale is
/// dist-spread's to the microsecond. The reports say so for the global SKU
/// only: dist-spread's tables keep their rows and columns.
#[test]
fn named_ids_never_borrow() {
    let named = run_tail_merge(&Scenario::load("dist-global-named").unwrap());
    let spread = run_tail_merge(&Scenario::load("dist-spread").unwrap());
    assert_eq!(named.user_limit_scope, UserLimitScope::Global);
    assert_eq!(named.borrowed_holds, 0);
    assert_eq!(named.borrows_lent + named.borrows_refused, 0);
    for r in &named.regions {
        assert_eq!(r.borrowed_holds, 0, "{}", r.name);
        assert_eq!(r.borrowed_holds_share(), Some(0.0), "{}", r.name);
    }
    assert_eq!(named.sold_units, 1_201);
    assert_eq!(named.last_hold_ms, spread.last_hold_ms);
    assert_eq!(named.hold_wait, spread.hold_wait);
    assert_eq!(named.holds_under_rtt, spread.holds_under_rtt);

    let borrow = "holds that paid a borrow";
    let named_table = report::region_table(std::slice::from_ref(&named));
    assert!(named_table.starts_with("region") && named_table.contains(borrow));
    assert!(named_table.contains("0 (0.0%)"), "{named_table}");
    assert!(report::summary_table(&named).contains("0 of 1201 (0.0%)"));
    assert!(!report::summary_table(&spread).contains(borrow));
    assert!(!report::region_table(std::slice::from_ref(&spread)).contains(borrow));
}

/// Goal: ids that name no region have their home hashed over the three
/// regions, so about two buyers in three buy away from home and their
/// holds pay a borrow: between 55% and 80% of holds overall (fewer than
/// two in three: a buyer who borrows reaches the units later, and some
/// find them gone), and most in each region. A borrowed hold waited at
/// least its region's round trip plus the home's, so it is never under
/// rtt, and in each region, most of whose holds borrowed, the median wait
/// is at least its round trip plus the nearest other region's. The sale still sells every unit, nobody is
/// paused, and every place borrowed for a request that was not held is
/// home at the end.
#[test]
fn hashed_ids_borrow_about_two_holds_in_three() {
    let s = Scenario::load("dist-global-hashed").unwrap();
    let m = run_tail_merge(&s);
    assert_eq!(m.sold_units, 1_201);
    assert_eq!(m.paused_answers, 0);
    assert_eq!(m.borrows_unanswered, 0);
    assert_eq!(m.borrows_unsettled, 0, "every place came home");
    let share = m.borrowed_holds_share().unwrap();
    assert!((0.55..=0.80).contains(&share), "{share}");
    assert!(m.borrows_lent >= m.borrowed_holds);
    for r in &m.regions {
        let share = r.borrowed_holds_share().unwrap();
        assert!((0.50..=0.80).contains(&share), "{}: {share}", r.name);
        assert!(
            r.holds_under_rtt + r.borrowed_holds <= r.holds,
            "{}: a borrowed hold under rtt",
            r.name
        );
        let nearest_other_ms = m
            .regions
            .iter()
            .filter(|o| o.name != r.name)
            .map(|o| o.rtt_ms)
            .fold(f64::INFINITY, f64::min);
        let floor_us = ((r.rtt_ms + nearest_other_ms) * 1_000.0) as u64;
        assert!(
            r.hold_wait.p50_us >= floor_us,
            "{}: p50 {} us",
            r.name,
            r.hold_wait.p50_us
        );
    }
}

/// Buyers in `eu` (20 ms from the coordinator) of a global SKU also sold
/// in `ap` (230 ms), where nobody buys: ten buyers over 100 s, so no two
/// borrows meet, buying from `eu`'s own units (`static`).
fn far_home() -> Scenario {
    let mut s = common::by_hand("far-home");
    s.sku.total = 20;
    s.sku.user_limit_scope = UserLimitScope::Global;
    let eu = RegionConfig {
        name: "eu".into(),
        rtt_ms: 20.0,
        ..s.regions[0].clone()
    };
    let ap = RegionConfig {
        name: "ap".into(),
        demand: 0.0,
        rtt_ms: 230.0,
        ..eu.clone()
    };
    s.regions = vec![eu, ap];
    s.demand.buyers = 10;
    s.demand.duration_s = 100.0;
    s.validate().unwrap();
    s
}

/// Goal: one borrow costs what docs/protocol.md says: the borrower's
/// round trip plus the home's, and commits. The buyers whose hashed home
/// is `ap` (escrow-core's `home_region`, the function the services use)
/// borrow, the others hold at once. By hand: the ask's write, half of
/// `eu`'s round trip to the coordinator, half of `ap`'s to its watch, the
/// loan's write, half of `ap`'s back, half of `eu`'s to its watch, the
/// hold's commit: 250 ms of round trips and three commits of 2.05 ms
/// each, plus the coordinator's 0.25 ms per request, so the slowest hold
/// waits 256.15 to 258 ms.
#[test]
fn a_borrow_costs_both_round_trips() {
    let s = far_home();
    let m = run(&s, "static", 1, None).unwrap().metrics;
    let regions = [
        RegionName::parse("eu").unwrap(),
        RegionName::parse("ap").unwrap(),
    ];
    let away = (0..10)
        .filter(|b| {
            let user = UserId::parse(&format!("u{b}")).unwrap();
            home_region(&user, &regions).unwrap().as_str() == "ap"
        })
        .count() as u64;
    assert!(away > 0 && away < 10, "both kinds of buyer: {away} away");
    let eu = &m.regions[0];
    assert_eq!(eu.holds, 10);
    assert_eq!(eu.borrowed_holds, away);
    assert_eq!(eu.holds_under_rtt, 10 - away, "at home: no round trip");
    assert_eq!(m.borrows_lent, away);
    let commit_us = s.agent.commit_us + s.agent.commit_row_us;
    let floor_us = 250_000 + 3 * commit_us;
    assert!(
        (floor_us..=258_000).contains(&eu.hold_wait.max_us),
        "{:?}",
        eu.hold_wait
    );
}

/// The dist-global-hashed sale with 1,000 users among its 3,000 buyers:
/// each comes back about three times, in any region.
fn returning_users(scope: UserLimitScope) -> Scenario {
    let mut s = Scenario::load("dist-global-hashed").unwrap();
    s.sku.user_limit_scope = scope;
    s.buyers.users_max = 1_000;
    s.validate().unwrap();
    s
}

/// Goal: a user holds once across regions under a global limit. Users who
/// come back in other regions get at most 1,000 holds, one each (the
/// world's per-user check passed after every event), their homes refusing
/// the places already held or lent; under the per-region limit the same
/// crowd holds more than once per user, which the check would have caught.
#[test]
fn a_user_holds_once_across_regions() {
    let global = run_tail_merge(&returning_users(UserLimitScope::Global));
    assert!(global.buyers_served <= 1_000, "{}", global.buyers_served);
    assert!(global.borrows_refused > 0);
    assert_eq!(global.borrows_unsettled, 0, "every place came home");

    let region = run_tail_merge(&returning_users(UserLimitScope::Region));
    assert!(region.buyers_served > 1_000, "{}", region.buyers_served);
    assert_eq!(region.borrowed_holds, 0);
}
