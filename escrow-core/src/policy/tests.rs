//! The policies on hand-built SKU states, and what every policy keeps: no
//! plan grants more than the pool holds or recalls more than a region has
//! free.

use proptest::prelude::*;

use super::*;

fn region(weight: u32, available: u64, rate: f64) -> RegionState {
    RegionState {
        weight,
        leased: available,
        in_transit: 0,
        available,
        sale_rate_per_s: rate,
        rtt_ms: 100,
        recall_pending: 0,
        set_aside: 0,
    }
}

/// A region of weight 1 `rtt_ms` from the coordinator.
fn far(available: u64, rate: f64, rtt_ms: u64) -> RegionState {
    RegionState {
        rtt_ms,
        ..region(1, available, rate)
    }
}

/// Goal: splits by weight sum exactly to the units, for any weights.
#[test]
fn split_by_weight_is_exact() {
    assert_eq!(split_by_weight(10, &[2, 1]), vec![7, 3]);
    assert_eq!(split_by_weight(10, &[1, 1, 1]).iter().sum::<u64>(), 10);
    assert_eq!(split_by_weight(5, &[0, 0]), vec![0, 0]);
    assert_eq!(split_by_weight(3, &[0, 1]), vec![0, 3]);
}

/// Goal: a region short of its share of the remainder by demand gets
/// the pool, and what a slow region holds beyond its share (units it
/// would take far longer than a move to sell) is asked back for it.
#[test]
fn the_pool_and_a_slow_regions_surplus_go_where_demand_is() {
    let policy = TailMerge::default();
    let sku = SkuState {
        total: 10_000,
        pool: 1_000,
        mode: Mode::Escrow,
        regions: vec![region(1, 5, 50.0), region(1, 5_000, 1.0)],
    };
    let plan = policy.plan(&sku);
    assert!(!plan.central);
    assert_eq!(plan.grants, vec![(0, 1_000)]);
    // Remainder 6,005 shared 50:1: the slow region keeps its 118.
    assert_eq!(plan.recalls, vec![(1, 5_000 - 118)]);
}

/// Goal: a region with a little more than its share, which it would
/// sell itself before a move out of it landed, keeps it while a
/// region that is dry before any move could reach it waits: no buyer
/// pays another region's distance for units that sell where they are.
#[test]
fn units_that_sell_where_they_are_before_a_move_lands_stay() {
    let policy = TailMerge::default();
    // 600 left: shared 3:1, the far region's share is 150; it has 300,
    // which it sells in 0.3 s at 1,000/s, and a move out of it takes
    // 280 ms (230 ms + 50 ms) plus half the near region's round trip.
    let sku = SkuState {
        total: 10_000,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![far(300, 3_000.0, 20), far(300, 1_000.0, 230)],
    };
    let plan = policy.plan(&sku);
    assert!(plan.recalls.is_empty(), "{plan:?}");
    // The same units, selling at a tenth of the rate, would be there
    // for 3 s: they move.
    let slow = SkuState {
        regions: vec![far(300, 3_000.0, 20), far(300, 100.0, 230)],
        ..sku
    };
    assert!(!policy.plan(&slow).recalls.is_empty());
}

/// Goal: a region's units move to a region that will run short while
/// they can still arrive before its buyers would wait longer than its
/// own round trip, from the nearest region with units to spare first.
#[test]
fn units_move_ahead_of_need_from_the_nearest_spare_first() {
    let policy = TailMerge::default();
    // The near region has 1.6 s of its 400/s and lacks about 200 of
    // its share; the 80 ms and the 230 ms regions have units beyond theirs.
    let sku = SkuState {
        total: 10_000,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![
            far(650, 400.0, 20),
            far(450, 150.0, 80),
            far(400, 150.0, 230),
        ],
    };
    // Shares are of the remainder now: each report is half its region's
    // round trip old, and its buyers held 4, 6 and 17 units meanwhile.
    let mut now = sku.clone();
    for (r, sold) in now.regions.iter_mut().zip([4, 6, 17]) {
        r.available -= sold;
    }
    let shares = demand_shares(&now);
    let lack = shares[0] - 646;
    let plan = policy.plan(&sku);
    // Each source gives what it has now beyond its share, less what it
    // sells while the recall travels (half its round trip): 6 units at
    // 80 ms, 17 at 230 ms. The near region lacks more than both spare.
    let spare = [444 - 6 - shares[1], 383 - 17 - shares[2]];
    assert!(spare[0] + spare[1] < lack);
    assert_eq!(plan.recalls, vec![(1, spare[0]), (2, spare[1])], "{plan:?}");
}

/// Goal: with the pool empty and a region starved, surplus comes back from a slow region.
#[test]
fn surplus_is_recalled_when_the_pool_is_empty() {
    let policy = TailMerge::default();
    let sku = SkuState {
        total: 10_000,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![region(1, 0, 50.0), region(1, 5_000, 1.0)],
    };
    let plan = policy.plan(&sku);
    assert_eq!(plan.recalls.len(), 1);
    assert_eq!(plan.recalls[0].0, 1);
}

/// Goal: near the end the tail merges: central mode, every free unit recalled.
#[test]
fn tail_merges_below_threshold() {
    let policy = TailMerge::default();
    let sku = SkuState {
        total: 1_000,
        pool: 3,
        mode: Mode::Escrow,
        regions: vec![region(1, 4, 5.0), region(1, 6, 1.0)],
    };
    let plan = policy.plan(&sku);
    assert!(plan.central);
    assert_eq!(plan.recalls, vec![(0, 4), (1, 6)]);
}

/// Goal: once merged, a far region keeps what its own buyers take before
/// a recall could serve anyone else's (a round trip of its sales, after
/// what it sells while the recall travels); a near one gives all back.
#[test]
fn a_merged_far_region_keeps_its_next_round_trip_of_sales() {
    let policy = TailMerge::default();
    let sku = SkuState {
        total: 1_000,
        pool: 0,
        mode: Mode::Central,
        regions: vec![far(0, 400.0, 20), far(3, 1.0, 20), far(30, 45.0, 230)],
    };
    let plan = policy.plan(&sku);
    assert!(plan.central);
    // 45/s for 230 ms: 10 units sold while the recall travels, 10 kept.
    assert_eq!(plan.recalls, vec![(1, 3), (2, 30 - 10 - 10)]);
    let few = SkuState {
        regions: vec![far(0, 400.0, 20), far(0, 1.0, 20), far(15, 45.0, 230)],
        ..sku
    };
    assert!(
        policy.plan(&few).recalls.is_empty(),
        "its own buyers take them"
    );
}

/// Goal: at a distance the merge does not wait on the farthest round
/// trip: a region that still has units keeps selling them locally, and
/// only what its own buyers will not use during a move is asked back.
#[test]
fn far_regions_keep_their_tail() {
    let policy = TailMerge::default();
    // 40 units left of 1,000, above the merge threshold of 20 (a
    // region is farther than 50 ms: no round trips count).
    let sku = SkuState {
        total: 1_000,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![far(0, 400.0, 20), far(40, 200.0, 230)],
    };
    let plan = policy.plan(&sku);
    assert!(!plan.central);
    assert_eq!(policy.threshold(&sku), 20);
    // The far region's share of 40 by demand is 13, and it sells 56 more
    // during a move (230 ms + 50 ms at 200/s): it keeps all 40.
    assert!(plan.recalls.is_empty(), "{plan:?}");
    let short = policy.plan_short(&sku);
    assert!(short.recalls.is_empty(), "{short:?}");
}

/// Goal: a region that has not reported any demand yet is not stripped
/// by the first region to report (its own buyers may be on their way),
/// even while buyers elsewhere wait (a short take); a region with
/// known demand keeps its share of the remainder by demand plus what
/// it sells during a move.
#[test]
fn recalls_spare_regions_whose_demand_is_unknown() {
    let policy = TailMerge::default();
    let sku = SkuState {
        total: 1_000,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![
            region(1, 10, 300.0),
            region(1, 400, 0.0),
            region(1, 400, 100.0),
        ],
    };
    let plan = policy.plan(&sku);
    // Remainder now 785 (each report half a round trip old: the first
    // region's 10 units gone, 10 and 5 held since) shared 3:2:1 (the
    // silent region counted at the others' 200/s per weight): the third
    // region keeps its 131 (more than the 15 it sells during a move:
    // 100 ms round trip + 50 ms at 100/s) and the 5 it sells while the
    // recall travels; the rest would take it 2.6 s to sell, far longer
    // than a move, so it goes although the first region is dry before it
    // lands.
    assert_eq!(plan.recalls, vec![(2, 395 - 5 - 131)]);
    let short = policy.plan_short(&sku);
    assert_eq!(short.recalls, plan.recalls);
}

/// Goal: when the whole remainder sells within less than the low-water
/// mark's second, every region is below its mark; a region that would
/// hold its units for more than two moves' time still gives back to the
/// one that ran dry, and is not refilled meanwhile.
#[test]
fn a_region_below_low_water_but_above_its_ceiling_gives_back() {
    let policy = TailMerge::default();
    let sku = SkuState {
        total: 701,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![
            region(1, 0, 4_400.0),
            region(1, 240, 440.0),
            region(1, 225, 290.0),
        ],
    };
    let refill = &policy.settings.refill;
    assert!(sku
        .regions
        .iter()
        .all(|r| r.on_hand() < refill.low_water(r)));
    let plan = policy.plan(&sku);
    assert!(!plan.central);
    let recalled: Vec<usize> = plan.recalls.iter().map(|(i, _)| *i).collect();
    assert_eq!(recalled, vec![1, 2], "{plan:?}");
    assert!(plan.grants.iter().all(|(i, _)| !recalled.contains(i)));
    for &(i, units) in &plan.recalls {
        assert!(units <= sku.regions[i].available);
    }
}

/// Goal: a take says sold_out_everywhere only when no unit is free anywhere.
#[test]
fn take_is_sold_out_everywhere_only_when_nothing_is_free() {
    let mut sku = SkuState {
        total: 10,
        pool: 1,
        mode: Mode::Central,
        regions: vec![region(1, 0, 0.0), region(1, 0, 0.0)],
    };
    assert_eq!(
        decide_take(&sku, 0, 1, 0, 0),
        TakeDecision {
            granted: 1,
            sold_out_everywhere: false
        }
    );
    assert_eq!(
        decide_take(&sku, 0, 2, 0, 0),
        TakeDecision {
            granted: 1,
            sold_out_everywhere: true
        }
    );
    sku.regions[0].available = 3;
    sku.regions[0].in_transit = 3;
    assert!(
        decide_take(&sku, 0, 2, 0, 0).sold_out_everywhere,
        "the asker's own stale report and credited grants are not free"
    );
    assert!(
        !decide_take(&sku, 0, 2, 0, 1).sold_out_everywhere,
        "a grant the asker has not credited yet is"
    );
    sku.regions[1].available = 1;
    assert_eq!(
        decide_take(&sku, 0, 2, 0, 0),
        TakeDecision {
            granted: 1,
            sold_out_everywhere: false
        }
    );
    sku.pool = 0;
    sku.regions[1].available = 0;
    sku.regions[1].in_transit = 1;
    assert_eq!(
        decide_take(&sku, 0, 1, 0, 0),
        TakeDecision {
            granted: 0,
            sold_out_everywhere: false
        }
    );
}

/// Goal: units a region set aside for a cart are not free (a take gets
/// none of them) but not gone either: while any region has some, the SKU
/// is not sold out everywhere, for a take or for the directive.
#[test]
fn units_set_aside_keep_a_sku_from_selling_out() {
    let mut sku = SkuState {
        total: 2,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![region(1, 0, 0.0), region(1, 0, 0.0)],
    };
    assert!(is_sold_out_everywhere(&sku));
    assert!(decide_take(&sku, 0, 1, 0, 0).sold_out_everywhere);
    sku.regions[1].set_aside = 1;
    assert!(!is_sold_out_everywhere(&sku));
    assert_eq!(
        decide_take(&sku, 0, 1, 0, 0),
        TakeDecision {
            granted: 0,
            sold_out_everywhere: false
        }
    );
}

/// Goal: a take gets what its buyers need from the pool, and a prefetch
/// only up to its share of the remainder by demand.
#[test]
fn prefetch_stops_at_the_share_by_demand() {
    let sku = SkuState {
        total: 100,
        pool: 40,
        mode: Mode::Escrow,
        // Remainder 40 + 10 + 50 = 100, shared 60 / 40 by demand.
        regions: vec![region(1, 10, 60.0), region(1, 50, 40.0)],
    };
    let granted = |units, prefetch| decide_take(&sku, 0, units, prefetch, 0).granted;
    assert_eq!(granted(5, 100), 40, "share 60, on hand 10: room for 50");
    let sku = SkuState { pool: 80, ..sku };
    // Remainder 140: region 0's share is 84, it has 10.
    let granted = |units, prefetch| decide_take(&sku, 0, units, prefetch, 0).granted;
    assert_eq!(granted(5, 100), 74);
    assert_eq!(granted(5, 10), 15);
    assert_eq!(granted(80, 100), 80, "what buyers wait for is not capped");
    let greedy = |units, prefetch| decide_take(&sku, 1, units, prefetch, 0).granted;
    assert_eq!(greedy(1, 100), 6, "share 56, on hand 50");
}

/// Goal: returns follow recalls, in central mode only while the region's
/// own buyers are not asking; never more than free.
#[test]
fn returns_follow_mode_and_demand() {
    let later = CENTRAL_RETURN_GRACE_MS;
    assert_eq!(units_to_return(Mode::Escrow, 10, None, 0, false, 0), 0);
    assert_eq!(units_to_return(Mode::Escrow, 10, Some(7), 3, false, 0), 4);
    assert_eq!(units_to_return(Mode::Escrow, 2, Some(7), 3, true, 0), 2);
    assert_eq!(units_to_return(Mode::Escrow, 10, Some(2), 3, false, 0), 0);
    assert_eq!(units_to_return(Mode::Central, 5, None, 0, false, later), 0);
    assert_eq!(
        units_to_return(Mode::Central, 5, Some(3), 0, false, later),
        3
    );
    assert_eq!(
        units_to_return(Mode::Central, 5, Some(5), 0, false, later - 1),
        0
    );
    assert_eq!(
        units_to_return(Mode::Central, 5, Some(100), 0, true, later),
        0
    );
}

fn policies() -> Vec<Box<dyn Policy>> {
    vec![
        Box::new(StaticSplit),
        Box::new(RefillOnLowWater::default()),
        Box::new(ProportionalShare::default()),
        Box::new(TailMerge::default()),
        Box::new(CentralOnly),
    ]
}

proptest! {
    /// Goal: no policy ever plans to grant more than the pool holds or
    /// to recall more than a region has free, and initial splits never
    /// exceed the total.
    #[test]
    fn plans_stay_within_what_exists(
        total in 0..100_000u64,
        pool_share in 0.0..1.0f64,
        regions in proptest::collection::vec((0..5u32, 0..5_000u64, 0.0..500.0f64, 0..300u64, 0..100u64), 1..6),
    ) {
        let pool = (total as f64 * pool_share) as u64;
        let sku = SkuState {
            total,
            pool,
            mode: Mode::Escrow,
            regions: regions.iter().map(|&(w, a, rate, rtt, pending)| RegionState {
                weight: w, leased: a, in_transit: 0, available: a, sale_rate_per_s: rate, rtt_ms: rtt,
                recall_pending: pending.min(a), set_aside: 0,
            }).collect(),
        };
        let weights: Vec<u32> = sku.regions.iter().map(|r| r.weight).collect();
        for policy in policies() {
            prop_assert!(policy.initial_split(total, &weights).iter().sum::<u64>() <= total);
            let plan = policy.plan(&sku);
            prop_assert!(plan.grants.iter().map(|g| g.1).sum::<u64>() <= pool, "{}", policy.name());
            for &(i, units) in &plan.recalls {
                let r = &sku.regions[i];
                prop_assert!(units <= r.available - r.recall_pending, "{}", policy.name());
            }
        }
    }
}

/// Goal: under `proportional`, a surplus smaller than `recall_min_units`
/// stays where it is after a report (no churn), but a take that came back
/// short (a region's buyers waiting now) asks it back, so the last units
/// move instead of leaving those buyers to wait until they give up.
#[test]
fn proportional_recalls_a_small_surplus_when_buyers_wait() {
    let policy = ProportionalShare::default();
    let sku = SkuState {
        total: 300,
        pool: 0,
        mode: Mode::Escrow,
        regions: vec![region(1, 0, 0.25), region(1, 2, 0.0)],
    };
    assert!(policy.plan(&sku).recalls.is_empty());
    assert_eq!(policy.plan_short(&sku).recalls, vec![(1, 2)]);
}
