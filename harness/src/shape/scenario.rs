//! The sale of a simulator scenario: the simulator's own crowd, so the
//! two tools can be run on the same sale.

use std::time::Duration;

use simulations::demand::{choices, Demand, HUMAN};
use simulations::Scenario;

use super::{Arrival, Patience, RegionSpec, Sale, UserLimit, BUYERS_MAX};

/// The sale of a simulator scenario: its regions (weights and demand
/// shares), total, and the simulator's own crowd under the scenario's seed
/// (arrival times, regions, quantities, bot bursts), each buyer retrying
/// as the simulator's do (`buyers.retries` after `buyers.retry_after_ms`;
/// bots every `retry_ms`, SOLD_OUT included). Arrivals after `cut` are
/// left out (the run is in real time).
pub fn scenario_sale(path: &str, scenario: &Scenario, cut: Duration) -> anyhow::Result<Sale> {
    let seed = scenario.seed;
    let mut demand = Demand::new(scenario, seed, 0);
    anyhow::ensure!(
        demand.total <= BUYERS_MAX,
        "the scenario has {} buyers; bench tail runs at most {BUYERS_MAX}",
        demand.total
    );
    let mut merged: Vec<(u64, u8, u8)> = Vec::with_capacity(demand.total as usize);
    for r in 0..scenario.regions.len() {
        // The scenario validated at most 32 regions.
        let region = r as u8;
        while let Some(a) = demand.next(r) {
            merged.push((a.at_us, region, a.burst));
        }
    }
    merged.sort_by_key(|&(at, region, _)| (at, region));
    let cut_us = cut.as_micros() as u64;
    let total = merged.len();
    let mut arrivals = Vec::with_capacity(total);
    let mut people = 0u32;
    for &(at_us, region, burst) in merged.iter().filter(|(at, _, _)| *at <= cut_us) {
        let qty = if burst == HUMAN {
            let c = choices(
                seed,
                people,
                &scenario.buyers,
                scenario.sku.max_per_user,
                scenario.demand.multi_unit_share,
            );
            people += 1;
            u32::from(c.qty)
        } else {
            1
        };
        arrivals.push(Arrival {
            at: Duration::from_micros(at_us),
            region,
            qty,
            patience: if burst == HUMAN { 0 } else { burst + 1 },
            pay_after: None,
        });
    }
    let b = &scenario.buyers;
    let mut patience = vec![Patience {
        wait: Duration::from_millis(b.retry_after_ms.max(1)),
        fixed_wait: true,
        retry_sold_out: false,
        retries_max: Some(b.retries),
        retrying_max: Duration::MAX,
    }];
    for bot in &scenario.demand.bots {
        patience.push(Patience {
            wait: Duration::from_millis(bot.retry_ms.max(1)),
            fixed_wait: true,
            retry_sold_out: true,
            retries_max: Some(bot.retries),
            retrying_max: Duration::MAX,
        });
    }
    let mut notes = Vec::new();
    if arrivals.len() < total {
        notes.push(format!(
            "{} of {} buyers arrive after {:.0} s and are not sent (--cut-s)",
            total - arrivals.len(),
            total,
            cut.as_secs_f64()
        ));
    }
    if !scenario.faults.is_empty() || scenario.network != Default::default() {
        notes.push("faults and network loss are not reproduced: the cluster is healthy".into());
    }
    if scenario.regions.iter().any(|r| r.jitter_ms > 0.0) {
        notes.push("round trips are the scenario's rtt_ms, without its jitter".into());
    }
    if b.abandon > 0.0 || b.release > 0.0 {
        notes.push("holds are kept: none is abandoned or released during the run".into());
    }
    Ok(Sale {
        label: format!(
            "scenario {} ({path}): {} regions, {} units, {} buyers",
            scenario.name,
            scenario.regions.len(),
            crate::report::thousands(scenario.sku.total as f64),
            crate::report::thousands(arrivals.len() as f64),
        ),
        regions: scenario
            .regions
            .iter()
            .map(|r| RegionSpec {
                name: r.name.clone(),
                weight: r.weight,
                share: r.demand,
                rtt_ms: r.rtt_ms.round() as u64,
            })
            .collect(),
        units: scenario.sku.total,
        max_per_user: scenario.sku.max_per_user,
        user_limit: UserLimit::Region,
        arrivals,
        patience,
        notes,
        scenario: Some(path.to_owned()),
    })
}
