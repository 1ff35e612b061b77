//! The `bench tail` table: one Markdown row per policy, the checks under
//! it, and for a scenario the simulator's command for the same sale.

use std::fmt::Write as _;

use harness::analysis::HELD_SHARES;
use harness::outcome::{Outcome, Tally};
use harness::report::thousands;
use harness::sale::{TailRun, TailSettings};
use harness::sampler::SkuView;
use harness::shape::{Sale, UserLimit};

use crate::report::Machine;

/// The lines above every table: machine, code, flags.
pub fn header(machine: &Machine, settings: &TailSettings, commit: &str) -> String {
    let mut out = String::new();
    let pg = &machine.postgres;
    let _ = writeln!(
        out,
        "Machine: {} cores ({}), {} (synchronous_commit={}, fsync={}); servers, PostgreSQL and buyers on the same machine.",
        machine.cores, machine.cpu, pg.version, pg.synchronous_commit, pg.fsync
    );
    let c = &settings.cluster;
    let flag = |value: Option<u64>| value.map_or("default".to_owned(), |v| v.to_string());
    let _ = writeln!(
        out,
        "Code: {commit}. Coordinator and agents --sync-interval-ms {}; agents --max-in-flight {} --max-waiting {} --wait-timeout-ms {}; --db-pool-size {}; buyers: at most {} requests in flight per region.",
        c.sync_interval_ms,
        flag(c.max_in_flight.map(u64::from)),
        flag(c.max_waiting.map(u64::from)),
        flag(c.wait_timeout_ms),
        flag(c.db_pool_size.map(u64::from)),
        settings.in_flight
    );
    out
}

fn seconds(us: Option<i64>) -> String {
    us.map_or("never".into(), |us| format!("{:.2} s", us as f64 / 1e6))
}

fn percent(share: f64) -> String {
    let label = 100.0 * share;
    if label.fract() == 0.0 {
        format!("{label:.0}%")
    } else {
        format!("{label:.1}%")
    }
}

/// The table of one sale: a row per policy, then the checks.
pub fn table(sale: &Sale, runs: &[TailRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### {}\n", sale.label);
    if sale.user_limit != UserLimit::Region {
        let borrowed: Vec<String> = runs
            .iter()
            .map(|r| format!("`{}` {}", r.policy, thousands(r.stats.counters.borrowed)))
            .collect();
        let _ = writeln!(
            out,
            "{}: places borrowed from a home region {}.\n",
            sale.user_limit.label(),
            borrowed.join(", ")
        );
    }
    let held: Vec<String> = HELD_SHARES
        .iter()
        .map(|s| format!("{} held", percent(*s)))
        .collect();
    let _ = writeln!(
        out,
        "| policy | {} | held | requests | PAUSED | REJECTED | SOLD_OUT | gave up | turned away while free | inversions | held per region | local holds | oversold | drift |",
        held.join(" | ")
    );
    let _ = writeln!(
        out,
        "|---|{}---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
        "---:|".repeat(HELD_SHARES.len())
    );
    for run in runs {
        let s = &run.stats;
        let times: Vec<String> = s.held_after_us.iter().map(|t| seconds(*t)).collect();
        let regions: Vec<String> = s
            .held_per_region
            .iter()
            .map(|(name, n)| format!("{name} {}", thousands(*n as f64)))
            .collect();
        let local = s
            .local_holds
            .map_or("n/a".into(), |l| format!("{:.1}%", 100.0 * l));
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {local} | {} | {} |",
            run.policy,
            times.join(" | "),
            thousands(s.held_units as f64),
            thousands(s.requests() as f64),
            thousands(s.answers[Outcome::Paused] as f64),
            thousands(s.rejected() as f64),
            thousands(s.answers[Outcome::SoldOut] as f64),
            thousands(s.gave_up as f64),
            thousands(s.turned_away_free as f64),
            thousands(s.inversions as f64),
            regions.join(", "),
            s.oversold,
            s.drift_total,
        );
    }
    out.push('\n');
    for run in runs {
        let s = &run.stats;
        let problems = s.problems();
        let verdict = if problems.is_empty() {
            format!(
                "ok: oversold 0, audit drift 0, {} units held once + {} free = {}",
                s.held_units, s.final_free, s.units
            )
        } else {
            format!("FAILED: {}", problems.join("; "))
        };
        let c = &s.counters;
        let granted = c.take_granted_units.map_or("n/a".into(), thousands);
        let locked = if c.takes > 0.0 {
            format!(
                " (each holding the SKU's row {:.1} ms)",
                1e3 * c.take_locked_seconds / c.takes
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "- `{}`: {verdict}. {} buyers: {} SOLD_OUT, {} gave up; {} errors; agents counted {} HELD; {} takes carrying {granted} units{locked}; {} tail merges; sale {:.1} s wall.",
            run.policy,
            thousands(s.buyers as f64),
            thousands(s.sold_out_buyers as f64),
            thousands(s.gave_up as f64),
            s.errors(),
            thousands(c.agent_holds),
            thousands(c.takes),
            c.tail_merges,
            run.sale_wall.as_secs_f64(),
        );
    }
    for note in &sale.notes {
        let _ = writeln!(out, "- Not reproduced: {note}.");
    }
    if runs
        .iter()
        .any(|r| r.stats.regions.iter().any(|g| g.rtt_ms > 0))
    {
        out.push('\n');
        out.push_str(&distance_table(runs));
    }
    if let Some(path) = &sale.scenario {
        let policies: Vec<&str> = runs.iter().map(|r| r.policy.as_str()).collect();
        let _ = writeln!(
            out,
            "\nThe same sale in the simulator: `cargo run --release -p simulations --bin simulate -- run {path} --policy POLICY` for POLICY in {} (or `-- compare {path}` for every policy).",
            policies.join(", ")
        );
    }
    out
}

fn ms(us: i64) -> String {
    format!("{:.0}", us as f64 / 1e3)
}

/// The answers of one region, by outcome, those that occurred.
fn answers(tally: &Tally) -> String {
    let named: Vec<String> = Outcome::ALL
        .iter()
        .filter(|o| tally[**o] > 0)
        .map(|o| format!("{} {}", o.name(), thousands(tally[*o] as f64)))
        .collect();
    named.join(", ")
}

/// Share of all holds of a run answered faster than their region's round trip.
pub fn under_rtt_share(run: &TailRun) -> Option<f64> {
    let far = || run.stats.regions.iter().filter(|r| r.rtt_ms > 0);
    let holds: u64 = far().map(|r| r.holds).sum();
    (holds > 0).then(|| far().map(|r| r.holds_under_rtt).sum::<u64>() as f64 / holds as f64)
}

/// Per policy and region: the round trip, the holds' waits from a buyer's
/// first send to its HELD, the share answered faster than the round trip,
/// how long buyers told SOLD_OUT waited for it, and every answer; then
/// the distance targets against `central` in the same run.
pub fn distance_table(runs: &[TailRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| policy | region (round trip) | holds | p50 ms | p99 ms | p99.9 ms | faster than its round trip | SOLD_OUT p50 / p99 ms | answers |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---|");
    for run in runs {
        for r in &run.stats.regions {
            let share = r.under_rtt_share().map_or("n/a".into(), percent_1);
            let [p50, p99, p999] = r.hold_wait_us;
            let sold_out = match r.sold_out_wait_us {
                _ if r.sold_outs == 0 => "-".to_owned(),
                [p50, p99] => format!("{} / {}", ms(p50), ms(p99)),
            };
            let _ = writeln!(
                out,
                "| `{}` | {} ({} ms) | {} | {} | {} | {} | {share} | {sold_out} | {} |",
                run.policy,
                r.name,
                r.rtt_ms,
                thousands(r.holds as f64),
                ms(p50),
                ms(p99),
                ms(p999),
                answers(&r.answers),
            );
        }
        if let Some(share) = under_rtt_share(run) {
            let _ = writeln!(
                out,
                "| `{}` | all | {} | | | | {} | | |",
                run.policy,
                thousands(run.stats.held_units as f64),
                percent_1(share)
            );
        }
    }
    out.push('\n');
    if let Some(central) = runs.iter().find(|r| r.policy == "central") {
        for run in runs.iter().filter(|r| r.policy != "central") {
            let missed = distance_targets_missed(run, central);
            let verdict = if missed.is_empty() {
                "every distance target met".to_owned()
            } else {
                format!("targets missed: {}", missed.join("; "))
            };
            let _ = writeln!(out, "- `{}` against `central`: {verdict}.", run.policy);
        }
    }
    out
}

fn percent_1(share: f64) -> String {
    format!("{:.1}%", 100.0 * share)
}

/// Which of issue 19's targets `run` misses against `central` in the same
/// run: 95% of holds faster than their round trip, every region's p50 at
/// most 15 ms and p99 below its p99 under `central`, the last unit within
/// 1.25x of `central`'s, and none paused, turned away while free, inverted,
/// oversold or drifted.
pub fn distance_targets_missed(run: &TailRun, central: &TailRun) -> Vec<String> {
    let mut missed = Vec::new();
    let s = &run.stats;
    if let Some(share) = under_rtt_share(run) {
        if share < 0.95 {
            missed.push(format!(
                "{} of holds faster than their round trip (95%)",
                percent_1(share)
            ));
        }
    }
    for (mine, theirs) in s.regions.iter().zip(&central.stats.regions) {
        let [p50, p99, _] = mine.hold_wait_us;
        if p50 > 15_000 {
            missed.push(format!("{} p50 {} ms (15)", mine.name, ms(p50)));
        }
        if mine.holds > 0 && p99 >= theirs.hold_wait_us[1] {
            missed.push(format!(
                "{} p99 {} ms, not below central's {} ms",
                mine.name,
                ms(p99),
                ms(theirs.hold_wait_us[1])
            ));
        }
    }
    match (s.held_after_us[3], central.stats.held_after_us[3]) {
        (Some(last), Some(c)) if last as f64 > 1.25 * c as f64 => missed.push(format!(
            "last unit {} against central's {} (1.25x)",
            seconds(Some(last)),
            seconds(Some(c))
        )),
        (None, Some(_)) => missed.push("the last unit was never held".into()),
        _ => {}
    }
    let counts = [
        ("PAUSED", s.answers[Outcome::Paused]),
        ("turned away while free", s.turned_away_free),
        ("inversions", s.inversions),
        ("oversold", s.oversold.unsigned_abs()),
        ("drift", s.drift_total.unsigned_abs()),
    ];
    for (name, n) in counts {
        if n > 0 {
            missed.push(format!("{name} {n}"));
        }
    }
    missed
}

/// Issue 19's verdicts over several seeds: per shape and policy (against
/// `central` in the same run), the seeds that met every distance target
/// and what the others missed.
#[derive(Debug, Default)]
pub struct Verdicts {
    rows: Vec<VerdictRow>,
}

/// One shape and policy's verdicts.
#[derive(Debug)]
struct VerdictRow {
    shape: String,
    policy: String,
    seeds: u64,
    /// Each seed that missed a target: "seed N: what".
    misses: Vec<String>,
}

impl Verdicts {
    /// Adds one seed's runs of `sale`; nothing without a `central` run or
    /// for a sale without round trips (loopback has no distance targets).
    pub fn add(&mut self, sale: &Sale, seed: u64, runs: &[TailRun]) {
        let Some(central) = runs.iter().find(|r| r.policy == "central") else {
            return;
        };
        if runs
            .iter()
            .all(|r| r.stats.regions.iter().all(|g| g.rtt_ms == 0))
        {
            return;
        }
        let shape = sale.label.split(':').next().unwrap_or(&sale.label);
        for run in runs.iter().filter(|r| r.policy != "central") {
            let missed = distance_targets_missed(run, central);
            let index = match self
                .rows
                .iter()
                .position(|row| row.shape == shape && row.policy == run.policy)
            {
                Some(index) => index,
                None => {
                    self.rows.push(VerdictRow {
                        shape: shape.to_owned(),
                        policy: run.policy.clone(),
                        seeds: 0,
                        misses: Vec::new(),
                    });
                    self.rows.len() - 1
                }
            };
            let row = &mut self.rows[index];
            row.seeds += 1;
            if !missed.is_empty() {
                row.misses
                    .push(format!("seed {seed}: {}", missed.join("; ")));
            }
        }
    }

    /// One row per shape and policy: seeds that met every target, of those
    /// run, and each miss.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "| shape | policy | seeds meeting every distance target | misses |"
        );
        let _ = writeln!(out, "|---|---|---:|---|");
        for row in &self.rows {
            let met = row.seeds - row.misses.len() as u64;
            let _ = writeln!(
                out,
                "| {} | `{}` | {met} of {} | {} |",
                row.shape,
                row.policy,
                row.seeds,
                row.misses.join("<br>")
            );
        }
        out
    }
}

/// Whether every run passed its checks.
pub fn all_ok(runs: &[TailRun]) -> bool {
    runs.iter().all(|r| r.stats.problems().is_empty())
}

/// Most rows a timeline shows; longer ones show every n-th change.
pub const TIMELINE_ROWS_MAX: usize = 40;

/// What the coordinator saw while the buyers bought: one row per sample
/// that differs from the last row shown (mode, pool, in transit, each
/// region's available and held as last reported).
pub fn timeline(run: &TailRun) -> String {
    let key = |v: &SkuView| {
        let regions: Vec<(i64, i64)> = v.regions.iter().map(|r| (r.available, r.held)).collect();
        (v.mode.clone(), v.pool, v.in_transit, regions)
    };
    let mut changes: Vec<&SkuView> = Vec::new();
    for sample in &run.samples {
        if changes.last().is_none_or(|last| key(last) != key(sample)) {
            changes.push(sample);
        }
    }
    let step = changes.len().div_ceil(TIMELINE_ROWS_MAX).max(1);
    let mut out = String::new();
    let Some(first) = changes.first() else {
        return "(no samples)\n".into();
    };
    let names: Vec<String> = first
        .regions
        .iter()
        .map(|r| format!("{} available / held (demand /s)", r.name))
        .collect();
    let _ = writeln!(
        out,
        "`{}`, the coordinator's view while buyers bought ({} samples, {} changes{}):\n",
        run.policy,
        run.samples.len(),
        changes.len(),
        if step > 1 {
            format!(", every {step}th shown")
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "| t | mode | pool | in transit | {} |",
        names.join(" | ")
    );
    let _ = writeln!(out, "|---:|---|---:|---:|{}", "---:|".repeat(names.len()));
    let last = changes.len() - 1;
    for (i, v) in changes.iter().enumerate() {
        if i % step != 0 && i != last {
            continue;
        }
        let regions: Vec<String> = v
            .regions
            .iter()
            .map(|r| format!("{} / {} ({:.0})", r.available, r.held, r.rate_per_s))
            .collect();
        let _ = writeln!(
            out,
            "| {:.2} s | {} | {} | {} | {} |",
            v.at_us as f64 / 1e6,
            v.mode,
            v.pool,
            v.in_transit,
            regions.join(" | ")
        );
    }
    out
}
