//! Carts in the simulator: a shop of several SKUs whose cart buyers hold
//! all or nothing. The run itself checks, after every cart commit, that
//! every cart's items are stored with its status and that no item is
//! stored without its cart; these tests add the counts.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use simulations::metrics::{CartMetrics, Metrics};
use simulations::scenario::{CartConfig, FaultConfig, FaultKind};
use simulations::{run, Scenario};

fn carts_of(m: &Metrics) -> &CartMetrics {
    m.carts.as_ref().unwrap()
}

/// Every cart held was settled once, whole: sold, released or expired.
fn assert_settled(m: &Metrics) {
    let c = carts_of(m);
    assert_eq!(m.oversold_units, 0);
    assert_eq!(
        m.held_units_at_end, 0,
        "every hold, cart items too, resolved"
    );
    assert_eq!(c.sold + c.released + c.expired, c.held, "{c:?}");
    assert_eq!(
        c.regions.iter().map(|r| r.holds).sum::<u64>(),
        c.held,
        "each cart held is counted once, in its region"
    );
}

/// Goal: 30 carts of the same two SKUs, 10 units each, in one region:
/// exactly 10 carts are held, each with one unit of both, and the other
/// 20 hold nothing and are told SOLD_OUT; every unit is sold through the
/// carts (nobody else buys).
#[test]
fn carts_racing_for_the_last_units_hold_all_or_nothing() {
    let mut s = common::by_hand("carts-race");
    s.sku.total = 10;
    s.demand.buyers = 30;
    s.carts = Some(CartConfig {
        skus: 2,
        share: 1.0,
        items: [2, 2],
    });
    s.validate().unwrap();
    let m = run(&s, "tail-merge", 1, None).unwrap().metrics;
    let c = carts_of(&m);
    assert_eq!((m.skus, m.total_units, m.buyers), (2, 20, 0));
    assert_eq!((c.buyers, c.held, c.items_held), (30, 10, 20));
    assert_eq!((c.turned_away, c.sold_out_answers), (20, 20));
    assert_eq!((c.sold, m.sold_units), (10, 20));
    assert_settled(&m);
}

/// Goal: the shop at a distance, under the default policy and under
/// `central`: carts are held (2 to 4 items each), every one settled
/// whole, single-SKU buyers served beside them, nothing oversold.
#[test]
fn a_shop_at_a_distance_holds_carts_whole() {
    let s = Scenario::load("dist-carts").unwrap();
    for policy in ["tail-merge", "central"] {
        let m = run(&s, policy, 1, None).unwrap().metrics;
        let c = carts_of(&m);
        assert_eq!((m.skus, c.buyers, m.buyers), (4, 600, 2_400), "{policy}");
        assert!(c.held > 50, "{policy}: {c:?}");
        assert!(
            (2 * c.held..=4 * c.held).contains(&c.items_held),
            "{policy}: {c:?}"
        );
        assert!(m.buyers_served > 500, "{policy}");
        assert!(m.sold_units <= m.total_units);
        assert_settled(&m);
    }
}

/// Goal: carts of four items neither keep single buyers waiting out
/// their queue wait nor send them away while units may come back: a
/// cart asks its items in SKU order (no two carts wait for each other's
/// units), units set aside are reported held and named set aside (not
/// free, not gone), and a cart holding units aside waits for its next
/// item at most `ASIDE_WAIT_MS` before letting them go (it is refused and
/// retries). Asked all at once and reported available, 898 buyers were
/// refused after 2 s and the sell-out came at 6.5 s; reported only as
/// held, buyers were told sold out while carts still had units aside;
/// with carts waiting out the whole queue wait for a later item, single
/// buyers of the items they held were refused after theirs on seeds 2, 4
/// and 5 (5, 15 and 78 of them), while the same carts were held.
#[test]
fn carts_of_many_items_keep_nobody_waiting_for_units_set_aside() {
    let mut s = Scenario::load("dist-carts").unwrap();
    s.carts.as_mut().unwrap().items = [4, 4];
    for seed in 1..=8 {
        let m = run(&s, "tail-merge", seed, None).unwrap().metrics;
        assert_eq!(m.rejected_answers, 0, "seed {seed}: refused after waiting");
        // Sold out in 1.9-2.5 s (a take holding the coordinator 2 ms);
        // 6.5 s when carts kept buyers waiting.
        assert!(
            m.sell_out_ms.unwrap() < 3_000.0,
            "seed {seed}: {:?}",
            m.sell_out_ms
        );
        // The carts held before the brief wait (120 to 146 a seed) are
        // held still: a cart refused after it retries.
        assert!(carts_of(&m).held >= 120, "seed {seed}: {:?}", carts_of(&m));
        if seed == 1 {
            assert_eq!((m.false_sold_outs, m.turned_away_while_free), (0, 0));
        }
        assert_settled(&m);
    }
}

/// Goal: an agent crash and a partition in the middle of the sale lose
/// no cart in part: carts whose commit died with the agent hold nothing,
/// their buyers retry, and every cart held is still settled whole.
#[test]
fn carts_survive_a_crash_and_a_partition_whole() {
    let mut s = Scenario::load("dist-carts").unwrap();
    s.faults = vec![
        FaultConfig {
            kind: FaultKind::AgentCrash,
            region: Some("eu".into()),
            start_s: Some(0.5),
            start_sold: None,
            end_sold: None,
            duration_s: 1.0,
        },
        FaultConfig {
            kind: FaultKind::Partition,
            region: Some("ap".into()),
            start_s: Some(0.3),
            start_sold: None,
            end_sold: None,
            duration_s: 2.0,
        },
    ];
    s.validate().unwrap();
    let m = run(&s, "tail-merge", 7, None).unwrap().metrics;
    let c = carts_of(&m);
    assert!(c.held > 50, "{c:?}");
    assert!(
        c.regions[0].rejected_answers > 0,
        "eu's cart buyers met the crash"
    );
    assert_settled(&m);
}

/// Goal: a shop's run is a pure function of scenario, policy and seed,
/// and another seed is another run.
#[test]
fn a_shop_run_is_reproducible() {
    let s = Scenario::load("dist-carts").unwrap();
    let a = run(&s, "tail-merge", 3, None).unwrap().metrics;
    let b = run(&s, "tail-merge", 3, None).unwrap().metrics;
    assert_eq!(a, b);
    let other = run(&s, "tail-merge", 4, None).unwrap().metrics;
    assert_ne!(a.carts, other.carts);
}

/// Goal: carts are refused where the simulator does not model them: a
/// global per-user limit, or more items than SKUs.
#[test]
fn carts_are_checked() {
    let mut s = Scenario::load("dist-carts").unwrap();
    s.carts.as_mut().unwrap().items = [2, 5];
    assert!(s.validate().is_err());
    let mut s = Scenario::load("dist-carts").unwrap();
    s.sku.user_limit_scope = escrow_core::UserLimitScope::Global;
    assert!(s.validate().is_err());
}
