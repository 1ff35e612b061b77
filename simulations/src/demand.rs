//! Demand: when buyers arrive, where, who they are, and what they do once
//! they hold units.
//!
//! Each region's arrivals are a Poisson process whose rate ramps up to a
//! peak at sale start, decays exponentially, and sits on a flat base;
//! bursts of bots come on top. The process is conditioned on its count (the
//! scenario says how many buyers), which makes arrival times independent
//! draws from the rate curve: each component of the curve is generated as
//! sorted order statistics mapped through its inverse CDF, one arrival at a
//! time, so a million buyers cost no memory up front.
//!
//! A buyer's own choices (quantity, abandon, release, confirm delay) come
//! from a stream keyed by the buyer's number, so every policy in a
//! comparison meets the same buyers making the same choices. A buyer's
//! user id is a function of its number and region alone ([`user_id`]).

use escrow_core::UserId;

use crate::rng::{streams, Rng};
use crate::scenario::{BuyerConfig, Scenario, UserIds};

/// `Buyer::burst` of a human buyer.
pub const HUMAN: u8 = u8::MAX;

/// One buyer and their current attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buyer {
    /// When the buyer first arrived (its place in line) and sent its first
    /// reserve request: the start of its hold wait.
    pub arrived_us: u64,
    /// When the current request was sent.
    pub started_us: u64,
    /// Region the buyer reaches.
    pub region: u8,
    /// Bot burst index, or [`HUMAN`].
    pub burst: u8,
    /// Units asked for.
    pub qty: u16,
    /// Reserve attempts made so far.
    pub attempts: u16,
    /// Confirm or release attempts refused because the agent was down.
    pub action_tries: u8,
}

impl Buyer {
    /// Whether the buyer is a bot.
    pub fn is_bot(&self) -> bool {
        self.burst != HUMAN
    }
}

/// What a buyer does once they hold units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterHold {
    /// Never comes back; the hold expires.
    Abandon,
    /// Releases the hold after a while.
    Release {
        /// Delay after HELD.
        after_us: u64,
    },
    /// Confirms after a while, maybe extending the hold first.
    Confirm {
        /// Delay after HELD.
        after_us: u64,
        /// Extend this long after HELD (payment starts), if at all.
        extend_after_us: Option<u64>,
    },
}

/// A buyer's choices, drawn from their own stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choices {
    /// Units asked for.
    pub qty: u16,
    /// What happens after HELD.
    pub after_hold: AfterHold,
}

/// The choices of buyer `index` under `seed`.
pub fn choices(seed: u64, index: u32, cfg: &BuyerConfig, max_per_user: u32, multi: f64) -> Choices {
    let mut rng = Rng::stream(seed, streams::BUYER, u64::from(index));
    let qty = if max_per_user > 1 && rng.chance(multi) {
        rng.range(2, u64::from(max_per_user)) as u16
    } else {
        1
    };
    let roll = rng.unit();
    let delay_us = rng.range(cfg.confirm_delay_ms[0], cfg.confirm_delay_ms[1]) * 1_000;
    let extend = rng.chance(cfg.extend);
    let after_hold = if roll < cfg.abandon {
        AfterHold::Abandon
    } else if roll < cfg.abandon + cfg.release {
        AfterHold::Release { after_us: delay_us }
    } else {
        AfterHold::Confirm {
            after_us: delay_us,
            extend_after_us: extend.then_some(delay_us / 2),
        }
    };
    Choices { qty, after_hold }
}

/// The user id of buyer `index`, who buys in `region`: `u{n}`, or
/// `{region}:u{n}` under named ids, where `n` is the buyer's number, or
/// that number modulo `users_max` when users come back.
pub fn user_id(cfg: &BuyerConfig, index: u32, region: &str) -> UserId {
    let n = match cfg.users_max {
        0 => u64::from(index),
        max => u64::from(index) % max,
    };
    let id = match cfg.users {
        UserIds::Hashed => format!("u{n}"),
        UserIds::Named => format!("{region}:u{n}"),
    };
    UserId::parse(&id).expect("validated: a region name and a number make a valid user id")
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Flat over `[start, start + len)`.
    Uniform { start_s: f64, len_s: f64 },
    /// Density rising linearly over `[0, len)`.
    Ramp { len_s: f64 },
    /// Exponential decay with time constant `tau` over `[start, start + len)`.
    Decay {
        start_s: f64,
        len_s: f64,
        tau_s: f64,
    },
}

impl Shape {
    /// The time at CDF value `u`.
    fn inverse(self, u: f64) -> f64 {
        match self {
            Shape::Uniform { start_s, len_s } => start_s + u * len_s,
            Shape::Ramp { len_s } => len_s * u.sqrt(),
            Shape::Decay {
                start_s,
                len_s,
                tau_s,
            } => start_s - tau_s * (1.0 - u * (1.0 - (-len_s / tau_s).exp())).ln(),
        }
    }
}

#[derive(Debug, Clone)]
struct Component {
    shape: Shape,
    count: u64,
    emitted: u64,
    /// Last order statistic drawn.
    u: f64,
    rng: Rng,
    burst: u8,
    next_us: Option<u64>,
}

impl Component {
    fn new(shape: Shape, count: u64, rng: Rng, burst: u8, origin_us: u64) -> Self {
        let mut c = Self {
            shape,
            count,
            emitted: 0,
            u: 0.0,
            rng,
            burst,
            next_us: None,
        };
        c.advance(origin_us);
        c
    }

    /// Draws the next arrival: the next of `count` sorted uniforms, mapped.
    fn advance(&mut self, origin_us: u64) {
        if self.emitted >= self.count {
            self.next_us = None;
            return;
        }
        let left = (self.count - self.emitted) as f64;
        let v = 1.0 - self.rng.unit(); // (0, 1]
        self.u += (1.0 - self.u) * (1.0 - v.powf(1.0 / left));
        self.emitted += 1;
        let t_s = self.shape.inverse(self.u.min(1.0)).max(0.0);
        let at = origin_us + (t_s * 1e6) as u64;
        // Order statistics increase; rounding must not make time run backwards.
        self.next_us = Some(at.max(self.next_us.unwrap_or(0)));
    }
}

/// One arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// When.
    pub at_us: u64,
    /// Bot burst index, or [`HUMAN`].
    pub burst: u8,
}

/// Arrivals of every region.
#[derive(Debug, Clone)]
pub struct Demand {
    regions: Vec<Vec<Component>>,
    origin_us: u64,
    /// Buyers (humans and bots) this demand will produce in all.
    pub total: u64,
}

/// Splits `n` by `shares` (largest remainder), summing exactly to `n`.
pub fn split_by_share(n: u64, shares: &[f64]) -> Vec<u64> {
    let sum: f64 = shares.iter().sum();
    if sum <= 0.0 {
        return vec![0; shares.len()];
    }
    let exact: Vec<f64> = shares.iter().map(|s| n as f64 * s / sum).collect();
    let mut out: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = exact[a] - exact[a].floor();
        let rb = exact[b] - exact[b].floor();
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    let mut left = n.saturating_sub(out.iter().sum());
    for i in order.iter().cycle().take(shares.len() * 2) {
        if left == 0 {
            break;
        }
        out[*i] += 1;
        left -= 1;
    }
    out
}

impl Demand {
    /// The demand of `scenario` under `seed`, with the sale starting at `origin_us`.
    pub fn new(scenario: &Scenario, seed: u64, origin_us: u64) -> Self {
        let d = &scenario.demand;
        let shares: Vec<f64> = scenario.regions.iter().map(|r| r.demand).collect();
        let per_region = split_by_share(d.buyers, &shares);
        let t = d.duration_s;
        let decay_len = t - d.ramp_s;
        let ramp_mass = d.ramp_s / 2.0;
        let decay_mass = d.decay_s * (1.0 - (-decay_len / d.decay_s).exp());
        let mut stream = 0u64;
        let mut rng = || {
            stream += 1;
            Rng::stream(seed, streams::ARRIVALS, stream)
        };
        let mut regions: Vec<Vec<Component>> = Vec::new();
        for &n in &per_region {
            let base = (n as f64 * d.base_share).round() as u64;
            let spike = n - base.min(n);
            let ramp = (spike as f64 * ramp_mass / (ramp_mass + decay_mass)).round() as u64;
            let decay = spike - ramp.min(spike);
            let mut comps = vec![Component::new(
                Shape::Uniform {
                    start_s: 0.0,
                    len_s: t,
                },
                base,
                rng(),
                HUMAN,
                origin_us,
            )];
            if ramp > 0 {
                comps.push(Component::new(
                    Shape::Ramp { len_s: d.ramp_s },
                    ramp,
                    rng(),
                    HUMAN,
                    origin_us,
                ));
            }
            comps.push(Component::new(
                Shape::Decay {
                    start_s: d.ramp_s,
                    len_s: decay_len,
                    tau_s: d.decay_s,
                },
                decay,
                rng(),
                HUMAN,
                origin_us,
            ));
            regions.push(comps);
        }
        let mut total = d.buyers;
        for (i, b) in d.bots.iter().enumerate() {
            let r = scenario
                .region_index(&b.region)
                .expect("validated: bot bursts name known regions");
            let burst = u8::try_from(i).unwrap_or(HUMAN - 1).min(HUMAN - 1);
            regions[r].push(Component::new(
                Shape::Uniform {
                    start_s: b.start_s,
                    len_s: b.duration_s,
                },
                b.bots,
                rng(),
                burst,
                origin_us,
            ));
            total += b.bots;
        }
        Self {
            regions,
            origin_us,
            total,
        }
    }

    /// When region `r`'s next buyer arrives, if any is left.
    pub fn peek(&self, r: usize) -> Option<u64> {
        self.regions[r].iter().filter_map(|c| c.next_us).min()
    }

    /// Region `r`'s next buyer, removed.
    pub fn next(&mut self, r: usize) -> Option<Arrival> {
        let origin = self.origin_us;
        let comp = self.regions[r]
            .iter_mut()
            .filter(|c| c.next_us.is_some())
            .min_by_key(|c| c.next_us)?;
        let at_us = comp.next_us?;
        let burst = comp.burst;
        comp.advance(origin);
        Some(Arrival { at_us, burst })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: hashed ids name no region, named ids name the region bought
    /// in, and `users_max` makes later buyers come back as earlier users.
    #[test]
    fn user_ids_follow_the_scenario() {
        let mut cfg = BuyerConfig::default();
        assert_eq!(user_id(&cfg, 7, "eu").as_str(), "u7");
        cfg.users = UserIds::Named;
        assert_eq!(user_id(&cfg, 7, "eu").as_str(), "eu:u7");
        cfg.users = UserIds::Hashed;
        cfg.users_max = 5;
        assert_eq!(user_id(&cfg, 7, "ap").as_str(), "u2");
        assert_eq!(user_id(&cfg, 2, "eu"), user_id(&cfg, 7, "ap"));
    }

    /// Goal: the demand yields exactly the buyers asked for, in time order, within the window.
    #[test]
    fn exact_count_in_order_within_window() {
        let s = Scenario::load("flash-1m").unwrap();
        let mut s = s;
        s.demand.buyers = 20_000;
        s.demand.bots.clear();
        let mut d = Demand::new(&s, 3, 1_000);
        let mut n = 0;
        for r in 0..s.regions.len() {
            let mut last = 0;
            while let Some(a) = d.next(r) {
                assert!(a.at_us >= last);
                assert!(a.at_us <= 1_000 + (s.demand.duration_s * 1e6) as u64);
                last = a.at_us;
                n += 1;
            }
        }
        assert_eq!(n, 20_000);
        assert_eq!(split_by_share(10, &[0.5, 0.3, 0.2]), vec![5, 3, 2]);
        assert_eq!(split_by_share(7, &[1.0, 1.0, 1.0]).iter().sum::<u64>(), 7);
    }
}
