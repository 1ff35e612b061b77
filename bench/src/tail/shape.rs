//! The sales `bench tail` runs: named presets, a shape given by flags, or a
//! simulator scenario.
//!
//! A [`Sale`] is fully decided before any server starts: every buyer's
//! arrival time, region, quantity, patience and checkout, drawn from a
//! fixed seed, so each policy meets the same crowd. A scenario's crowd is the simulator's
//! own ([`simulations::demand::Demand`] with the scenario's seed), so the
//! two tools can be run on the same sale and their numbers put side by side.

use std::time::Duration;

use simulations::demand::{choices, Demand, HUMAN};

use super::link::Distances;
use simulations::Scenario;

/// Region names, in the order regions are added.
pub const REGION_NAMES: [&str; 5] = ["eu", "us", "ap", "sa", "af"];

/// Default wait before a retry when an answer carries no `Retry-After`.
pub const RETRY_AFTER_DEFAULT: Duration = Duration::from_secs(1);

/// Default bound on a browser buyer's retrying, from its first attempt.
pub const RETRYING_MAX_DEFAULT: Duration = Duration::from_secs(60);

/// Default window the crowd arrives in.
pub const ARRIVAL_WINDOW_DEFAULT: Duration = Duration::from_millis(500);

/// Hold TTL of the SKU: the contract's longest, so no hold expires and no
/// unit comes back during a run (the analysis relies on it).
pub const HOLD_TTL_MS: u64 = 3_600_000;

/// Most buyers one sale may have (memory of the logs, spawn rate).
pub const BUYERS_MAX: u64 = 2_000_000;

/// One region of a sale.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionSpec {
    /// Its name (`--region` of its agent).
    pub name: String,
    /// Its stock weight in the SKU's `regions`.
    pub weight: u32,
    /// Its share of the buyers.
    pub share: f64,
    /// Round trip between its agent and the coordinator, ms (0: loopback).
    pub rtt_ms: u64,
}

/// When a buyer stops retrying.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Patience {
    /// Wait before a retry when the answer says nothing (or always, if `fixed_wait`).
    pub wait: Duration,
    /// Always wait `wait`, ignoring `Retry-After` (the simulator's buyers do).
    pub fixed_wait: bool,
    /// Retry a SOLD_OUT too (the simulator's bots).
    pub retry_sold_out: bool,
    /// At most this many retries, if bounded by count.
    pub retries_max: Option<u32>,
    /// No retry starts later than this after the first attempt.
    pub retrying_max: Duration,
}

impl Patience {
    /// A browser: honours `Retry-After` (1 s without one), retries a 503
    /// with the same key for up to `retrying_max`, stops at SOLD_OUT.
    pub fn browser(retrying_max: Duration) -> Self {
        Self {
            wait: RETRY_AFTER_DEFAULT,
            fixed_wait: false,
            retry_sold_out: false,
            retries_max: None,
            retrying_max,
        }
    }
}

/// One buyer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// When the buyer arrives, after the sale's start.
    pub at: Duration,
    /// Index of the region it buys in.
    pub region: u8,
    /// Units asked for.
    pub qty: u32,
    /// Index of its [`Patience`] in [`Sale::patience`].
    pub patience: u8,
    /// After a hold, the buyer pays (confirms it) this long after the
    /// HELD; `None`: the hold is kept unconfirmed.
    pub pay_after: Option<Duration>,
}

/// One sale, decided in full before it runs.
#[derive(Debug, Clone)]
pub struct Sale {
    /// What the table is titled.
    pub label: String,
    /// The regions.
    pub regions: Vec<RegionSpec>,
    /// Units on sale.
    pub units: u64,
    /// The SKU's `max_per_user`.
    pub max_per_user: u32,
    /// Every buyer, in arrival order.
    pub arrivals: Vec<Arrival>,
    /// Kinds of buyers: people first, then one per bot burst.
    pub patience: Vec<Patience>,
    /// Things the run does not reproduce (of a scenario), to print.
    pub notes: Vec<String>,
    /// The scenario it came from, to print the simulator's command.
    pub scenario: Option<String>,
}

impl Sale {
    /// Buyers in all.
    pub fn buyers(&self) -> usize {
        self.arrivals.len()
    }

    /// Each region's round trip to the coordinator: the sale's own, with
    /// `overrides` (`--rtt`) taking precedence.
    pub fn distances(&self, overrides: &Distances) -> Distances {
        let mut distances: Distances = self
            .regions
            .iter()
            .filter(|r| r.rtt_ms > 0)
            .map(|r| (r.name.clone(), r.rtt_ms))
            .collect();
        distances.extend(overrides.iter().map(|(name, ms)| (name.clone(), *ms)));
        distances
    }

    /// Region `index`'s round trip to the coordinator under `distances`, ms.
    pub fn rtt_ms(&self, distances: &Distances, index: usize) -> u64 {
        self.regions
            .get(index)
            .and_then(|r| distances.get(&r.name))
            .copied()
            .unwrap_or(0)
    }
}

/// How a shape's buyers arrive over its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Evenly spaced.
    Even,
    /// A hot start and a long tail: `base_share` of the buyers evenly
    /// spaced, the rest at a rate that peaks at the start and decays
    /// exponentially with time constant `decay` (cut at the window's end).
    /// Each buyer arrives at its quantile of that curve, so the times need
    /// no randomness.
    HotStart {
        /// Time constant of the decay.
        decay: Duration,
        /// Share of the buyers spread evenly, 0..=1.
        base_share: f64,
    },
}

impl Arrivals {
    /// `n` arrival times within `window`, in order.
    pub fn times(self, n: u64, window: Duration) -> Vec<Duration> {
        let w = window.as_secs_f64();
        let even =
            |count: u64| -> Vec<f64> { (0..count).map(|i| w * i as f64 / count as f64).collect() };
        let mut times = match self {
            Arrivals::Even => even(n),
            Arrivals::HotStart { decay, base_share } => {
                let base = ((n as f64 * base_share.clamp(0.0, 1.0)).round() as u64).min(n);
                let hot = n - base;
                let tau = decay.as_secs_f64().max(1e-6);
                let mass = 1.0 - (-w / tau).exp();
                let mut times = even(base);
                times.extend((0..hot).map(|i| {
                    let u = (i as f64 + 0.5) / hot as f64;
                    -tau * (1.0 - u * mass).ln()
                }));
                times.sort_by(f64::total_cmp);
                times
            }
        };
        times.iter_mut().for_each(|t| *t = t.clamp(0.0, w));
        times.into_iter().map(Duration::from_secs_f64).collect()
    }
}

/// A shape given by flags or a preset.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Preset name, or `custom`.
    pub name: String,
    /// Demand share per region, in [`REGION_NAMES`] order.
    pub skew: Vec<f64>,
    /// Units on sale.
    pub units: u64,
    /// Buyers in all.
    pub buyers: u64,
    /// Every buyer arrives within this window.
    pub window: Duration,
    /// How they arrive over it.
    pub arrivals: Arrivals,
    /// After a hold each buyer pays after a delay drawn from this range;
    /// `None`: holds are kept unconfirmed.
    pub checkout: Option<[Duration; 2]>,
    /// Bound on each buyer's retrying.
    pub retrying_max: Duration,
    /// Seed of the crowd's order.
    pub seed: u64,
    /// Stock weight per region, in [`REGION_NAMES`] order; empty: 1 each.
    pub weights: Vec<u32>,
    /// Round trip between each region and the coordinator, ms, in
    /// [`REGION_NAMES`] order; empty (or a region left out): loopback.
    pub rtt_ms: Vec<u64>,
}

/// A preset: name, what it is, skew, units, buyers.
pub struct Preset {
    /// `--shape NAME`.
    pub name: &'static str,
    /// One line.
    pub about: &'static str,
    /// Demand share per region.
    pub skew: &'static [f64],
    /// Units on sale.
    pub units: u64,
    /// Buyers in all.
    pub buyers: u64,
    /// Part of `--shape all` (loopback) or `--shape distance` (at a distance).
    pub in_all: bool,
    /// Every buyer arrives within this window, ms (0: the default window).
    pub window_ms: u64,
    /// Stock weights (empty: 1 each).
    pub weights: &'static [u32],
    /// Round trips to the coordinator, ms (empty: loopback).
    pub rtt_ms: &'static [u64],
}

/// Round trips of the distance presets' three regions: about eu-west-1 to
/// eu-central-1, us-east-1 and ap-southeast-1.
pub const RTT_3: &[u64] = &[20, 80, 230];

/// Round trips of the five-region distance preset: two more far regions.
pub const RTT_5: &[u64] = &[20, 80, 230, 150, 180];

/// The presets, in the order `--shape all` runs them.
pub const PRESETS: [Preset; 4] = [
    Preset {
        name: "skewed-701",
        about: "issue 9's sale: 3 regions 85/10/5, 701 units, 2,600 buyers",
        skew: &[85.0, 10.0, 5.0],
        units: 701,
        buyers: 2_600,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
    Preset {
        name: "spread-700",
        about: "3 regions 50/30/20, 700 units, 1,400 buyers (2x)",
        skew: &[50.0, 30.0, 20.0],
        units: 700,
        buyers: 1_400,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
    Preset {
        name: "five-10k",
        about: "5 regions 60/20/10/5/5, 10,000 units, 20,000 buyers (2x)",
        skew: &[60.0, 20.0, 10.0, 5.0, 5.0],
        units: 10_000,
        buyers: 20_000,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
    Preset {
        name: "skewed-20x",
        about: "3 regions 85/10/5, 10,000 units, 200,000 buyers (20x)",
        skew: &[85.0, 10.0, 5.0],
        units: 10_000,
        buyers: 200_000,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
];

/// The shapes at a distance, in the order `--shape distance` runs them:
/// open-loop arrivals below capacity (800 buyers/s for 3.75 s) unless
/// named a burst, weights equal (the split misjudges demand) or equal to
/// demand (`-fit`).
pub const DISTANCE_PRESETS: [Preset; 6] = [
    Preset {
        name: "dist-spread",
        about: "3 regions at 20/80/230 ms, 50/30/20, weights 1/1/1, 1,201 units, 3,000 buyers at 800/s",
        skew: &[50.0, 30.0, 20.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-spread-fit",
        about: "as dist-spread, weights 5/3/2 (the split is the demand)",
        skew: &[50.0, 30.0, 20.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[5, 3, 2],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-skewed",
        about: "3 regions at 20/80/230 ms, 85/10/5, weights 1/1/1, 1,201 units, 3,000 buyers at 800/s",
        skew: &[85.0, 10.0, 5.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-skewed-fit",
        about: "as dist-skewed, weights 17/2/1 (the split is the demand)",
        skew: &[85.0, 10.0, 5.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[17, 2, 1],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-five",
        about: "5 regions at 20/80/230/150/180 ms, 60/20/10/5/5, 10,000 units, 20,000 buyers at 2,000/s",
        skew: &[60.0, 20.0, 10.0, 5.0, 5.0],
        units: 10_000,
        buyers: 20_000,
        in_all: true,
        window_ms: 10_000,
        weights: &[],
        rtt_ms: RTT_5,
    },
    Preset {
        name: "dist-burst",
        about: "3 regions at 20/80/230 ms, 50/30/20, 1,201 units, 3,000 buyers within 0.5 s",
        skew: &[50.0, 30.0, 20.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 500,
        weights: &[],
        rtt_ms: RTT_3,
    },
];

/// The default skew of `n` regions.
pub fn default_skew(n: usize) -> anyhow::Result<Vec<f64>> {
    Ok(match n {
        1 => vec![100.0],
        2 => vec![85.0, 15.0],
        3 => vec![85.0, 10.0, 5.0],
        4 => vec![70.0, 15.0, 10.0, 5.0],
        5 => vec![60.0, 20.0, 10.0, 5.0, 5.0],
        _ => anyhow::bail!("--regions must be 1..=5 (eu, us, ap, sa, af)"),
    })
}

/// `85,10,5` as shares.
pub fn parse_skew(text: &str) -> Result<Vec<f64>, String> {
    let skew: Vec<f64> = text
        .split(',')
        .map(|s| s.trim().parse::<f64>().map_err(|e| format!("{s:?}: {e}")))
        .collect::<Result<_, _>>()?;
    if skew.is_empty() || skew.len() > REGION_NAMES.len() {
        return Err(format!("1..={} shares", REGION_NAMES.len()));
    }
    if skew.iter().any(|s| !(s.is_finite() && *s >= 0.0)) || skew.iter().sum::<f64>() <= 0.0 {
        return Err("shares are non-negative and not all zero".into());
    }
    Ok(skew)
}

impl Shape {
    /// The preset named `name`.
    pub fn preset(name: &str) -> anyhow::Result<Self> {
        let p = PRESETS
            .iter()
            .chain(&DISTANCE_PRESETS)
            .find(|p| p.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = PRESETS
                    .iter()
                    .chain(&DISTANCE_PRESETS)
                    .map(|p| p.name)
                    .collect();
                anyhow::anyhow!(
                    "no shape {name:?}; shapes: {}, all, distance",
                    names.join(", ")
                )
            })?;
        Ok(Self {
            name: p.name.to_owned(),
            skew: p.skew.to_vec(),
            units: p.units,
            buyers: p.buyers,
            window: if p.window_ms == 0 {
                ARRIVAL_WINDOW_DEFAULT
            } else {
                Duration::from_millis(p.window_ms)
            },
            arrivals: Arrivals::Even,
            checkout: None,
            retrying_max: RETRYING_MAX_DEFAULT,
            seed: 1,
            weights: p.weights.to_vec(),
            rtt_ms: p.rtt_ms.to_vec(),
        })
    }

    /// The crowd: buyers split over regions by skew (largest remainder,
    /// exact counts), their order shuffled by `seed`, arriving over the
    /// window as [`Shape::arrivals`] says, one unit each, browser
    /// patience, paying after a delay drawn by `seed` if [`Shape::checkout`].
    pub fn sale(&self) -> anyhow::Result<Sale> {
        anyhow::ensure!(
            !self.skew.is_empty() && self.skew.len() <= REGION_NAMES.len(),
            "1..=5 regions"
        );
        anyhow::ensure!(self.units >= 1, "--units must be at least 1");
        anyhow::ensure!(
            (1..=BUYERS_MAX).contains(&self.buyers),
            "--buyers must be 1..={BUYERS_MAX}"
        );
        anyhow::ensure!(
            self.weights.is_empty() || self.weights.len() == self.skew.len(),
            "one weight per region"
        );
        anyhow::ensure!(
            self.rtt_ms.len() <= self.skew.len(),
            "at most one round trip per region"
        );
        let counts = simulations::demand::split_by_share(self.buyers, &self.skew);
        let mut order: Vec<u8> = Vec::with_capacity(self.buyers as usize);
        for (region, &n) in counts.iter().enumerate() {
            // At most 5 regions (checked above).
            order.extend(std::iter::repeat_n(region as u8, n as usize));
        }
        let mut rng = SplitMix(self.seed);
        for i in (1..order.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let times = self.arrivals.times(self.buyers, self.window);
        let arrivals = order
            .into_iter()
            .zip(times)
            .map(|(region, at)| Arrival {
                at,
                region,
                qty: 1,
                patience: 0,
                pay_after: self.checkout.map(|[low, high]| {
                    let spread = high.saturating_sub(low).as_secs_f64();
                    low + Duration::from_secs_f64(spread * rng.unit())
                }),
            })
            .collect();
        let sum: f64 = self.skew.iter().sum();
        let skew: Vec<String> = self
            .skew
            .iter()
            .map(|s| format!("{}", (100.0 * s / sum).round()))
            .collect();
        let mut label = format!(
            "{}: {} regions {}, {} units, {} buyers in {} ms",
            self.name,
            self.skew.len(),
            skew.join("/"),
            crate::report::thousands(self.units as f64),
            crate::report::thousands(self.buyers as f64),
            self.window.as_millis()
        );
        if !self.weights.is_empty() {
            let weights: Vec<String> = self.weights.iter().map(u32::to_string).collect();
            label += &format!(", weights {}", weights.join("/"));
        }
        if self.rtt_ms.iter().any(|ms| *ms > 0) {
            let rtts: Vec<String> = self.rtt_ms.iter().map(u64::to_string).collect();
            label += &format!(", round trips {} ms", rtts.join("/"));
        }
        Ok(Sale {
            label,
            regions: REGION_NAMES
                .iter()
                .zip(&self.skew)
                .enumerate()
                .map(|(i, (name, &share))| RegionSpec {
                    name: (*name).to_owned(),
                    weight: self.weights.get(i).copied().unwrap_or(1),
                    share,
                    rtt_ms: self.rtt_ms.get(i).copied().unwrap_or(0),
                })
                .collect(),
            units: self.units,
            max_per_user: 1,
            arrivals,
            patience: vec![Patience::browser(self.retrying_max)],
            notes: Vec::new(),
            scenario: None,
        })
    }
}

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
        arrivals,
        patience,
        notes,
        scenario: Some(path.to_owned()),
    })
}

/// A tiny deterministic generator (splitmix64) for the crowd's order.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A draw in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
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
}
