//! A shape given by flags (or a preset): regions by skew, units, buyers
//! and how they arrive, and the crowd drawn from it with a fixed seed.

use std::time::Duration;

use super::{Arrival, Patience, RegionSpec, Sale, UserLimit, BUYERS_MAX, REGION_NAMES};

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
            user_limit: UserLimit::Region,
            arrivals,
            patience: vec![Patience::browser(self.retrying_max)],
            notes: Vec::new(),
            scenario: None,
        })
    }
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
