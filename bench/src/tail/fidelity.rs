//! The simulator beside the real binaries, on the same sale: issue 19's
//! point 3 in one run of `bench tail --scenario`.
//!
//! The scenario's own crowd (the same buyers, arrival times and keys) has
//! just been sold on the real binaries; here the simulator runs the same
//! scenario and seed under each policy, and the table puts each figure of
//! one beside the other's: the last unit held, the share of holds faster
//! than their region's round trip, and each region's p50 and p99 of the
//! wait from a buyer's first send to its HELD. A figure agrees when the
//! simulator's is within 25% of the real one, or within 10 ms for a
//! latency, whichever is larger.

use std::fmt::Write as _;

use harness::sale::TailRun;
use simulations::metrics::Metrics;
use simulations::Scenario;

/// How far apart the simulator's figure and the real one may be, as a
/// share of the real one.
pub const RELATIVE_BOUND: f64 = 0.25;

/// How far apart two latencies may be in any case, ms.
pub const LATENCY_BOUND_MS: f64 = 10.0;

/// The figures one side gives for a sale under one policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// When the last unit was held, s from the sale's start.
    pub last_unit_s: Option<f64>,
    /// Share of holds faster than their region's round trip (regions at
    /// a distance only).
    pub under_rtt: Option<f64>,
    /// Per region: its name, p50 and p99 of the hold wait, ms (`None`
    /// without holds).
    pub regions: Vec<(String, Option<(f64, f64)>)>,
}

impl Figures {
    /// The real binaries' figures of `run`.
    pub fn of_run(run: &TailRun) -> Self {
        let s = &run.stats;
        Self {
            last_unit_s: s.held_after_us[3].map(|us| us as f64 / 1e6),
            under_rtt: super::report::under_rtt_share(run),
            regions: s
                .regions
                .iter()
                .map(|r| {
                    let [p50, p99, _] = r.hold_wait_us;
                    let waits = (r.holds > 0).then(|| (p50 as f64 / 1e3, p99 as f64 / 1e3));
                    (r.name.clone(), waits)
                })
                .collect(),
        }
    }

    /// The simulator's figures of `metrics`.
    pub fn of_simulation(metrics: &Metrics) -> Self {
        let far = || metrics.regions.iter().filter(|r| r.rtt_ms > 0.0);
        let holds: u64 = far().map(|r| r.holds).sum();
        let under: u64 = far().map(|r| r.holds_under_rtt).sum();
        Self {
            last_unit_s: metrics.last_hold_ms.map(|ms| ms / 1e3),
            under_rtt: (holds > 0).then(|| under as f64 / holds as f64),
            regions: metrics
                .regions
                .iter()
                .map(|r| {
                    let w = &r.hold_wait;
                    let waits =
                        (r.holds > 0).then(|| (w.p50_us as f64 / 1e3, w.p99_us as f64 / 1e3));
                    (r.name.clone(), waits)
                })
                .collect(),
        }
    }

    fn cell(&self) -> String {
        let mut parts = vec![
            self.last_unit_s
                .map_or("never".into(), |s| format!("{s:.2} s")),
            self.under_rtt
                .map_or("n/a".into(), |share| format!("{:.1}%", 100.0 * share)),
        ];
        for (name, waits) in &self.regions {
            parts.push(match waits {
                Some((p50, p99)) => format!("{name} {}/{}", ms(*p50), ms(*p99)),
                None => format!("{name} -"),
            });
        }
        parts.join(", ")
    }

    /// Each figure's median over `seeds` (the lower middle one of an even
    /// count); `None` where fewer than half of the seeds have it.
    pub fn median(seeds: &[Figures]) -> Figures {
        let last_unit_s = median(seeds.iter().map(|f| f.last_unit_s), seeds.len());
        let under_rtt = median(seeds.iter().map(|f| f.under_rtt), seeds.len());
        let names = seeds.first().map_or(&[][..], |f| &f.regions[..]);
        let regions = names
            .iter()
            .enumerate()
            .map(|(i, (name, _))| {
                let waits = || seeds.iter().map(|f| f.regions.get(i).and_then(|r| r.1));
                let p50 = median(waits().map(|w| w.map(|(p50, _)| p50)), seeds.len());
                let p99 = median(waits().map(|w| w.map(|(_, p99)| p99)), seeds.len());
                (name.clone(), p50.zip(p99))
            })
            .collect();
        Figures {
            last_unit_s,
            under_rtt,
            regions,
        }
    }
}

/// The median of the values present, if at least half of `of` are.
fn median(values: impl Iterator<Item = Option<f64>>, of: usize) -> Option<f64> {
    let mut present: Vec<f64> = values.flatten().collect();
    if present.is_empty() || 2 * present.len() < of {
        return None;
    }
    present.sort_by(f64::total_cmp);
    Some(present[(present.len() - 1) / 2])
}

fn ms(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// Runs the simulator on `scenario` under `policy` with `seed` (the seed
/// of the crowd the real binaries were sold to).
pub fn simulate(scenario: &Scenario, policy: &str, seed: u64) -> anyhow::Result<Metrics> {
    let output = simulations::run(scenario, policy, seed, None)
        .map_err(|e| anyhow::anyhow!("simulating {} under {policy}: {e}", scenario.name))?;
    Ok(output.metrics)
}

fn within(sim: f64, real: f64, floor: f64) -> bool {
    (sim - real).abs() <= (RELATIVE_BOUND * real.abs()).max(floor)
}

/// The figures where the simulator is off the real binaries by more than
/// the bounds, named ("eu p99", "last unit", ...); empty when every
/// figure agrees. A figure one side has and the other lacks is off.
pub fn off(sim: &Figures, real: &Figures) -> Vec<String> {
    let mut off = Vec::new();
    let pair = |a: Option<f64>, b: Option<f64>, floor: f64| match (a, b) {
        (Some(a), Some(b)) => within(a, b, floor),
        (None, None) => true,
        _ => false,
    };
    if !pair(sim.last_unit_s, real.last_unit_s, 0.0) {
        off.push("last unit".to_owned());
    }
    if !pair(sim.under_rtt, real.under_rtt, 0.0) {
        off.push("under rtt".to_owned());
    }
    for ((name, sim_waits), (_, real_waits)) in sim.regions.iter().zip(&real.regions) {
        match (sim_waits, real_waits) {
            (Some((s50, s99)), Some((r50, r99))) => {
                if !within(*s50, *r50, LATENCY_BOUND_MS) {
                    off.push(format!("{name} p50"));
                }
                if !within(*s99, *r99, LATENCY_BOUND_MS) {
                    off.push(format!("{name} p99"));
                }
            }
            (None, None) => {}
            _ => off.push(format!("{name} holds")),
        }
    }
    off
}

/// One row per policy: the simulator's figures, the real binaries', and
/// which are off; then how many rows agree on every figure.
pub fn table(runs: &[TailRun], simulated: &[Metrics]) -> String {
    let rows: Vec<(&str, Figures, Figures)> = runs
        .iter()
        .zip(simulated)
        .map(|(run, metrics)| {
            (
                run.policy.as_str(),
                Figures::of_simulation(metrics),
                Figures::of_run(run),
            )
        })
        .collect();
    side_by_side(
        "The simulator on the same scenario and seed (`simulate run SCENARIO --policy POLICY --seed SEED`), beside the run above",
        &rows,
    )
}

/// The rows of [`table`] under `title`, with the bounds and the count of
/// policies that agree on every figure.
fn side_by_side(title: &str, rows: &[(&str, Figures, Figures)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{title}: last unit, holds faster than their round trip, p50/p99 ms of the hold wait per region; each figure agrees within {:.0}% or {LATENCY_BOUND_MS:.0} ms, whichever is larger.\n",
        100.0 * RELATIVE_BOUND
    );
    let _ = writeln!(out, "| policy | simulator | real binaries | agree |");
    let _ = writeln!(out, "|---|---|---|---|");
    let mut agree = 0;
    for (policy, sim, real) in rows {
        let off = off(sim, real);
        if off.is_empty() {
            agree += 1;
        }
        let verdict = if off.is_empty() {
            "every figure".to_owned()
        } else {
            format!("off: {}", off.join(", "))
        };
        let _ = writeln!(
            out,
            "| `{policy}` | {} | {} | {verdict} |",
            sim.cell(),
            real.cell()
        );
    }
    let _ = writeln!(
        out,
        "\n{agree} of {} policies agree on every figure.",
        rows.len()
    );
    out
}

/// The figures of one scenario over several seeds, per policy: one
/// seed's p99 of a region with a few dozen holds is one buyer's luck, so
/// the two sides are also compared on each figure's median over the seeds.
#[derive(Debug, Default)]
pub struct OverSeeds {
    /// Per policy, in run order: its name, the simulator's figures and the
    /// real binaries', one of each per seed.
    policies: Vec<(String, Vec<Figures>, Vec<Figures>)>,
}

impl OverSeeds {
    /// Adds one seed's runs and the simulator's metrics of the same sale.
    pub fn add(&mut self, runs: &[TailRun], simulated: &[Metrics]) {
        for (run, metrics) in runs.iter().zip(simulated) {
            let at = match self.policies.iter().position(|(p, _, _)| *p == run.policy) {
                Some(at) => at,
                None => {
                    self.policies
                        .push((run.policy.clone(), Vec::new(), Vec::new()));
                    self.policies.len() - 1
                }
            };
            let (_, sim, real) = &mut self.policies[at];
            sim.push(Figures::of_simulation(metrics));
            real.push(Figures::of_run(run));
        }
    }

    /// [`table`] of each figure's median over the seeds.
    pub fn table(&self) -> String {
        let seeds = self.policies.first().map_or(0, |(_, sim, _)| sim.len());
        let rows: Vec<(&str, Figures, Figures)> = self
            .policies
            .iter()
            .map(|(policy, sim, real)| {
                (policy.as_str(), Figures::median(sim), Figures::median(real))
            })
            .collect();
        side_by_side(
            &format!("The medians over the {seeds} seeds above, simulator beside real binaries"),
            &rows,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(last: f64, under: f64, eu: (f64, f64), ap: Option<(f64, f64)>) -> Figures {
        Figures {
            last_unit_s: Some(last),
            under_rtt: Some(under),
            regions: vec![("eu".into(), Some(eu)), ("ap".into(), ap)],
        }
    }

    /// Goal: a figure agrees within 25% of the real one, a latency also
    /// within 10 ms, and each figure beyond its bound is named.
    #[test]
    fn figures_agree_within_a_quarter_or_ten_ms() {
        let real = figures(1.60, 0.99, (2.0, 40.0), Some((3.0, 200.0)));
        let close = figures(1.95, 0.80, (11.5, 49.0), Some((12.0, 249.0)));
        assert_eq!(off(&close, &real), Vec::<String>::new());
        let far = figures(2.01, 0.70, (12.5, 51.0), Some((3.0, 251.0)));
        assert_eq!(
            off(&far, &real),
            ["last unit", "under rtt", "eu p50", "eu p99", "ap p99"]
        );
    }

    /// Goal: each figure's median over seeds is the middle one (the lower
    /// of the two middle ones for an even count), whatever the seeds'
    /// order; a figure fewer than half of the seeds have has none.
    #[test]
    fn medians_over_seeds_take_the_middle_figure() {
        let seeds = [
            figures(1.9, 0.95, (3.0, 300.0), None),
            figures(1.5, 0.99, (2.0, 10.0), Some((2.0, 5.0))),
            figures(1.7, 0.97, (9.0, 50.0), None),
        ];
        let median = Figures::median(&seeds);
        assert_eq!(median, figures(1.7, 0.97, (3.0, 50.0), None));
        let even = Figures::median(&seeds[..2]);
        assert_eq!(even, figures(1.5, 0.95, (2.0, 10.0), Some((2.0, 5.0))));
    }

    /// Goal: a region with holds on one side only is off, as is a sale
    /// whose last unit one side never held.
    #[test]
    fn a_figure_one_side_lacks_is_off() {
        let real = figures(1.6, 1.0, (2.0, 4.0), Some((2.0, 4.0)));
        let mut sim = figures(1.6, 1.0, (2.0, 4.0), None);
        sim.last_unit_s = None;
        assert_eq!(off(&sim, &real), ["last unit", "ap holds"]);
    }
}
