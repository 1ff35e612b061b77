//! `simulate`: run a scenario under a policy, compare every policy, or run a swarm.
//!
//! Every failure prints the seed that reproduces it and exits non-zero.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use simulations::policies::POLICY_NAMES;
use simulations::scenario::BUILT_IN;
use simulations::{report, run, run_matrix, swarm, Scenario};

/// Deterministic simulations of tail behaviour: policies, faults, reports.
#[derive(Parser)]
#[command(name = "simulate", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario under one policy; print a summary and write a report.
    Run {
        /// A scenario file, or the name of a built-in scenario.
        scenario: String,
        /// static, refill, proportional, tail-merge or central.
        #[arg(long)]
        policy: String,
        /// Seed (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Report folder (default: sim-out/SCENARIO-POLICY-seedSEED).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run every policy on the same seeds; write one comparison table and plots.
    Compare {
        /// A scenario file, or the name of a built-in scenario.
        scenario: String,
        /// Number of seeds, starting at --first-seed.
        #[arg(long, default_value_t = 3)]
        seeds: u64,
        /// First seed (default: the scenario's).
        #[arg(long)]
        first_seed: Option<u64>,
        /// Report folder (default: sim-out/compare-SCENARIO).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Worker threads (default: available cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Random configuration per seed: safety with faults, then liveness without.
    Swarm {
        /// Number of seeds.
        #[arg(long)]
        seeds: u64,
        /// First seed.
        #[arg(long, default_value_t = 1)]
        first_seed: u64,
        /// Worker threads (default: available cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// List the built-in scenarios and the policies.
    List,
}

fn threads(t: Option<usize>) -> usize {
    t.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

fn load(name: &str) -> Result<Scenario, ExitCode> {
    Scenario::load(name).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    })
}

fn count_bar(len: u64, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} {elapsed}")
            .expect("constant template is valid")
            .progress_chars("=> "),
    );
    bar.set_message(label.to_owned());
    bar
}

fn cmd_run(scenario: &str, policy: &str, seed: Option<u64>, out: Option<PathBuf>) -> ExitCode {
    let s = match load(scenario) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let seed = seed.unwrap_or(s.seed);
    let bar = run::buyers_bar(&s, &format!("{} / {policy}", s.name));
    let result = run::run(&s, policy, seed, Some(&bar));
    bar.finish_and_clear();
    let output = match result {
        Ok(o) => o,
        Err(e) => {
            eprintln!("FAILED: {e}");
            if let Some(seed) = e.seed() {
                eprintln!("reproduce: simulate run {scenario} --policy {policy} --seed {seed}");
            }
            return ExitCode::FAILURE;
        }
    };
    let m = &output.metrics;
    print!("{}", report::summary_table(m));
    println!(
        "\nsimulated {:.1} s ({} events) in {:.2} s wall",
        m.end_ms / 1_000.0,
        m.events,
        output.wall.as_secs_f64()
    );
    let dir = out.unwrap_or_else(|| {
        PathBuf::from("sim-out").join(format!("{}-{}-seed{}", s.name, policy, seed))
    });
    let command = format!("simulate run {scenario} --policy {policy} --seed {seed}");
    if let Err(e) = report::write_run_report(&dir, &s, m, &command) {
        eprintln!("error: writing report to {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    println!("report: {}", dir.join("report.md").display());
    if m.oversold_units > 0 {
        eprintln!("FAILED: oversold {} units, seed {seed}", m.oversold_units);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn cmd_compare(
    scenario: &str,
    seeds: u64,
    first_seed: Option<u64>,
    out: Option<PathBuf>,
    threads_opt: Option<usize>,
) -> ExitCode {
    let s = match load(scenario) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let first = first_seed.unwrap_or(s.seed);
    let seed_list: Vec<u64> = (first..first + seeds.max(1)).collect();
    let bar = count_bar(
        (POLICY_NAMES.len() * seed_list.len()) as u64,
        &format!("compare {}", s.name),
    );
    let started = std::time::Instant::now();
    let result = run_matrix(
        &s,
        &POLICY_NAMES,
        &seed_list,
        threads(threads_opt),
        Some(&bar),
    );
    bar.finish_and_clear();
    let grouped = match result {
        Ok(g) => g,
        Err(e) => {
            eprintln!("FAILED: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = out.unwrap_or_else(|| PathBuf::from("sim-out").join(format!("compare-{}", s.name)));
    let mut command = format!("simulate compare {scenario} --seeds {seeds}");
    if let Some(f) = first_seed {
        command += &format!(" --first-seed {f}");
    }
    command += &format!(" --out {}", dir.display());
    let metrics: Vec<(String, Vec<simulations::Metrics>)> = grouped
        .iter()
        .map(|(p, runs)| (p.clone(), runs.iter().map(|r| r.metrics.clone()).collect()))
        .collect();
    let table = match report::write_compare_report(&dir, &s, &metrics, &seed_list, &command) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: writing report to {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    };
    println!("{} over seeds {:?}\n\n{table}", s.name, seed_list);
    for (p, runs) in &metrics {
        println!(
            "{p}, per region (means over the seeds):\n{}",
            report::region_table(runs)
        );
    }
    for (p, runs) in &grouped {
        let wall: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.2}", r.wall.as_secs_f64()))
            .collect();
        println!("{p:>14}: wall s per run {}", wall.join(", "));
    }
    println!(
        "total {:.1} s wall; report: {}",
        started.elapsed().as_secs_f64(),
        dir.join("compare.md").display()
    );
    let oversold: Vec<u64> = grouped
        .iter()
        .flat_map(|(_, runs)| runs.iter())
        .filter(|r| r.metrics.oversold_units > 0)
        .map(|r| r.metrics.seed)
        .collect();
    if !oversold.is_empty() {
        eprintln!("FAILED: oversold with seeds {oversold:?}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn cmd_swarm(seeds: u64, first_seed: u64, threads_opt: Option<usize>) -> ExitCode {
    let bar = count_bar(seeds, "swarm");
    let started = std::time::Instant::now();
    let summary = swarm::run_swarm(first_seed, seeds, threads(threads_opt), Some(&bar));
    bar.finish_and_clear();
    for f in &summary.failures {
        println!("FAILED {f}");
        let c = swarm::case(f.seed);
        println!(
            "  policy {}, {} regions, {} units, {} buyers, user limit {}, faults {:?}",
            c.policy,
            c.scenario.regions.len(),
            c.scenario.sku.total,
            c.scenario.demand.buyers,
            c.scenario.sku.user_limit_scope,
            c.scenario.faults.iter().map(|f| f.kind).collect::<Vec<_>>()
        );
        println!(
            "  reproduce: simulate swarm --seeds 1 --first-seed {}",
            f.seed
        );
    }
    println!(
        "swarm: {} of {seeds} seeds passed (first seed {first_seed}), {} events, {:.1} s wall",
        summary.passed,
        summary.events,
        started.elapsed().as_secs_f64()
    );
    if summary.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run {
            scenario,
            policy,
            seed,
            out,
        } => cmd_run(&scenario, &policy, seed, out),
        Command::Compare {
            scenario,
            seeds,
            first_seed,
            out,
            threads,
        } => cmd_compare(&scenario, seeds, first_seed, out, threads),
        Command::Swarm {
            seeds,
            first_seed,
            threads,
        } => cmd_swarm(seeds, first_seed, threads),
        Command::List => {
            println!(
                "scenarios: {}",
                BUILT_IN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            println!("policies:  {}", POLICY_NAMES.join(", "));
            ExitCode::SUCCESS
        }
    }
}
