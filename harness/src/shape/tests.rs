//! The crowds of presets, shapes and scenarios: exact counts, order,
//! arrival curves and skews.

use simulations::Scenario;

use super::*;

/// Goal: a preset's crowd has exactly its buyers, split by the skew,
/// in arrival order within the window.
#[test]
fn preset_crowd_is_exact() {
    let sale = Shape::preset("skewed-701").unwrap().sale().unwrap();
    assert_eq!(sale.buyers(), 2_600);
    let per_region = |r: u8| sale.arrivals.iter().filter(|a| a.region == r).count();
    assert_eq!(per_region(0), 2_210);
    assert_eq!(per_region(1), 260);
    assert_eq!(per_region(2), 130);
    assert!(sale.arrivals.windows(2).all(|w| w[0].at <= w[1].at));
    assert!(sale.arrivals.iter().all(|a| a.at < ARRIVAL_WINDOW_DEFAULT));
    assert_eq!(sale.regions.len(), 3);
}

/// Goal: a scenario's crowd is the simulator's: same count, regions
/// by demand share, and people retry as the scenario says.
#[test]
fn scenario_crowd_is_the_simulators() {
    let s = Scenario::load("tiny").unwrap();
    let sale = scenario_sale("tiny", &s, Duration::from_secs(120)).unwrap();
    assert_eq!(sale.buyers(), 150);
    assert_eq!(sale.units, 40);
    assert_eq!(sale.patience[0].retries_max, Some(2));
    assert!(sale
        .arrivals
        .iter()
        .all(|a| a.at <= Duration::from_millis(50)));
}

/// Goal: a hot start puts most buyers early and a long tail keeps some
/// arriving until the window's end, in order, with exact counts; a
/// checkout gives every buyer a payment delay within its range.
#[test]
fn hot_start_and_long_tail() {
    let window = Duration::from_secs(20);
    let times = Arrivals::HotStart {
        decay: Duration::from_secs(4),
        base_share: 0.2,
    }
    .times(1_000, window);
    assert_eq!(times.len(), 1_000);
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert!(times.iter().all(|t| *t <= window));
    let first_quarter = times.iter().filter(|t| **t < window / 4).count();
    assert!(first_quarter > 600, "{first_quarter}");
    assert!(times.iter().any(|t| *t > window * 9 / 10));

    let mut shape = Shape::preset("skewed-701").unwrap();
    shape.checkout = Some([Duration::from_secs(1), Duration::from_secs(3)]);
    let sale = shape.sale().unwrap();
    assert!(sale.arrivals.iter().all(|a| a
        .pay_after
        .is_some_and(|d| d >= Duration::from_secs(1) && d <= Duration::from_secs(3))));
}

/// Goal: skews are read as shares and bad ones refused.
#[test]
fn parses_skew() {
    assert_eq!(parse_skew("85,10,5").unwrap(), vec![85.0, 10.0, 5.0]);
    assert!(parse_skew("1,2,3,4,5,6").is_err());
    assert!(parse_skew("0,0").is_err());
    assert!(parse_skew("a").is_err());
}
