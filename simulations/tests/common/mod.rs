//! The sale the tests that work their outcome out by hand start from.

use simulations::Scenario;

/// A sale simple enough to work out by hand, which a test changes into its
/// case: one region `a`, 1 ms from the coordinator, selling 1,000 units to
/// 1,000 buyers who arrive at a flat rate over 2 s, never retry, abandon,
/// release or extend, and confirm every hold after 1 s.
pub fn by_hand(name: &str) -> Scenario {
    let text = format!(
        r#"
name = "{name}"
seed = 1
[sku]
total = 1_000
hold_ttl_ms = 600_000
[[regions]]
name = "a"
weight = 1
demand = 1.0
rtt_ms = 1
[demand]
buyers = 1_000
duration_s = 2.0
base_share = 1.0
[buyers]
abandon = 0.0
release = 0.0
extend = 0.0
confirm_delay_ms = [1_000, 1_000]
retries = 0
"#
    );
    Scenario::parse(name, &text).unwrap()
}
