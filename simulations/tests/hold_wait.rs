//! The hold wait a buyer sees, from its first reserve request to its HELD
//! across retries, and the holds decided without a round trip to the
//! coordinator (faster than the region's `rtt_ms`): what `bench tail`
//! reports per region, counted here on sales small enough to work out.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use simulations::scenario::{FaultConfig, FaultKind};
use simulations::{run, Metrics, Scenario};

/// One region 50 ms from the coordinator, 20 units, 20 buyers at a flat
/// rate over 2 s (one every 100 ms on average), who retry a 503 after 1 s
/// and confirm every hold.
fn far_region() -> Scenario {
    let mut s = common::by_hand("far-region");
    s.sku.total = 20;
    s.regions[0].name = "far".into();
    s.regions[0].rtt_ms = 50.0;
    s.demand.buyers = 20;
    s.buyers.retry_after_ms = 1_000;
    s.buyers.retries = 60;
    s.validate().unwrap();
    s
}

fn run_far(s: &Scenario, policy: &str) -> Metrics {
    let m = run(s, policy, 1, None).unwrap().metrics;
    assert_eq!(m.sold_units, 20, "{policy}: everything sells");
    assert_eq!(m.buyers_served, 20, "{policy}: every buyer is served");
    assert_eq!(m.oversold_units, 0, "{policy}: oversold");
    let r = &m.regions[0];
    assert_eq!(r.hold_wait.count, 20, "{policy}: one hold wait per buyer");
    assert_eq!(m.hold_wait.count, 20, "{policy}: over all regions too");
    m
}

/// Goal: a hold served from the region's own quota is under its round
/// trip, a hold that needed a take is not. Under `static` the region holds
/// all 20 units from before the sale and never asks the coordinator, so
/// every hold is under 50 ms; under `central` every hold is a take, a round
/// trip to the coordinator, so none is.
#[test]
fn local_holds_are_under_rtt_and_takes_are_not() {
    let s = far_region();
    let local = run_far(&s, "static");
    assert_eq!(local.take_requests, 0, "static never takes");
    assert_eq!(local.regions[0].holds_under_rtt, 20);
    assert_eq!(local.holds_under_rtt, 20);
    assert_eq!(local.holds_under_rtt_share(), Some(1.0));
    assert!(!local.central_from_start());

    let central = run_far(&s, "central");
    assert!(central.take_requests > 0, "central sells through takes");
    assert_eq!(central.regions[0].holds_under_rtt, 0);
    assert_eq!(central.holds_under_rtt, 0);
    assert_eq!(central.holds_under_rtt_share(), Some(0.0));
    assert!(central.central_from_start());
}

/// Goal: the hold wait spans a buyer's retries while the HELD answer
/// latency is its last request's alone. Under `central` with the
/// coordinator down for the first 2.5 s, every buyer's first request
/// (all within the first 2 s) is refused and retried after 1 s, so each
/// waits at least the 1 s Retry-After for its hold although the request
/// that got it took about one round trip.
#[test]
fn hold_wait_spans_the_retries() {
    let mut s = far_region();
    s.faults = vec![FaultConfig {
        kind: FaultKind::CoordinatorDown,
        region: None,
        start_s: Some(0.0),
        start_sold: None,
        end_sold: None,
        duration_s: 2.5,
    }];
    s.validate().unwrap();
    let m = run_far(&s, "central");
    let r = &m.regions[0];
    assert!(
        r.paused_answers >= 20,
        "every buyer was told PAUSED at least once"
    );
    assert_eq!(r.holds_under_rtt, 0);
    // Simulated time: a function of the scenario and seed, not of the machine.
    assert!(r.hold_wait.p50_us >= 1_000_000, "{:?}", r.hold_wait);
    assert!(r.held_latency.max_us < 1_000_000, "{:?}", r.held_latency);
    assert!(r.hold_wait.p50_us > r.held_latency.p50_us);
}
