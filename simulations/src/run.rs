//! Running a scenario: one policy and seed, or every policy over several seeds.
//!
//! A run goes until the sale is quiet (every buyer done, no unit held),
//! then a settle period for quota to come home, bounded by the scenario's
//! hard stop. Any broken safety property or panic inside escrow-core ends
//! the run with an error that names the seed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::metrics::Metrics;
use crate::scenario::Scenario;
use crate::shop::Shop;
use crate::world::{Violation, World};

/// Why a run produced no metrics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The scenario or policy could not be set up.
    #[error("setup: {0}")]
    Setup(String),
    /// A safety property broke.
    #[error("safety violated, {0}")]
    Violation(Violation),
    /// Decision code panicked (an escrow-core assertion).
    #[error("seed {seed}: panicked: {message}")]
    Panic {
        /// Seed that reproduces it.
        seed: u64,
        /// The panic message.
        message: String,
    },
}

impl RunError {
    /// The seed to reproduce the failure with, if it got that far.
    pub fn seed(&self) -> Option<u64> {
        match self {
            RunError::Setup(_) => None,
            RunError::Violation(v) => Some(v.seed),
            RunError::Panic { seed, .. } => Some(*seed),
        }
    }
}

impl From<Violation> for RunError {
    fn from(v: Violation) -> Self {
        RunError::Violation(v)
    }
}

/// Turns a caught panic payload into text.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".to_owned())
}

/// A run's metrics and how long it took on the wall clock.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// What was measured (a function of scenario, policy and seed alone).
    pub metrics: Metrics,
    /// Wall-clock time of the run; not part of the metrics.
    pub wall: Duration,
}

/// A progress bar over a scenario's buyers, drawn only on a terminal.
pub fn buyers_bar(scenario: &Scenario, label: &str) -> ProgressBar {
    let total = scenario.demand.buyers + scenario.demand.bots.iter().map(|b| b.bots).sum::<u64>();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>24} [{bar:40}] {human_pos}/{human_len} buyers {elapsed}",
        )
        .expect("constant template is valid")
        .progress_chars("=> "),
    );
    bar.set_message(label.to_owned());
    bar
}

/// Runs `scenario` under `policy` with `seed`.
pub fn run(
    scenario: &Scenario,
    policy: &str,
    seed: u64,
    progress: Option<&ProgressBar>,
) -> Result<RunOutput, RunError> {
    let started = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<Metrics, RunError> {
        if scenario.carts.is_some() {
            return run_shop(scenario, policy, seed, progress);
        }
        let mut w = World::new(scenario, policy, seed).map_err(RunError::Setup)?;
        let max_us = w.sale_start_us() + (scenario.run.max_s * 1e6) as u64;
        w.run_until(World::quiet, max_us, progress)?;
        let end = (w.now_us() + scenario.run.settle_ms * 1_000).min(max_us);
        w.run_until(|_| false, end, progress)?;
        w.check_books()?;
        Ok(w.finish(end))
    }));
    let metrics = match result {
        Ok(r) => r?,
        Err(payload) => {
            return Err(RunError::Panic {
                seed,
                message: panic_message(payload.as_ref()),
            })
        }
    };
    Ok(RunOutput {
        metrics,
        wall: started.elapsed(),
    })
}

/// Runs a scenario with carts: its SKUs' worlds and its cart buyers.
fn run_shop(
    scenario: &Scenario,
    policy: &str,
    seed: u64,
    progress: Option<&ProgressBar>,
) -> Result<Metrics, RunError> {
    let mut shop = Shop::new(scenario, policy, seed).map_err(RunError::Setup)?;
    let max_us = shop.sale_start_us() + (scenario.run.max_s * 1e6) as u64;
    shop.run_until(Shop::quiet, max_us, progress)?;
    let end = (shop.now_us() + scenario.run.settle_ms * 1_000).min(max_us);
    shop.run_until(|_| false, end, progress)?;
    shop.check_books()?;
    Ok(shop.finish(end))
}

/// Runs every (policy, seed) pair on up to `threads` threads; results come
/// back grouped by policy in the order given, seeds in order.
pub fn run_matrix(
    scenario: &Scenario,
    policies: &[&str],
    seeds: &[u64],
    threads: usize,
    progress: Option<&ProgressBar>,
) -> Result<Vec<(String, Vec<RunOutput>)>, RunError> {
    let jobs: Vec<(usize, usize)> = (0..policies.len())
        .flat_map(|p| (0..seeds.len()).map(move |s| (p, s)))
        .collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RunOutput, RunError>>>> =
        Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1).min(jobs.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(p, s)) = jobs.get(i) else {
                    break;
                };
                let out = run(scenario, policies[p], seeds[s], None);
                if let Some(bar) = progress {
                    bar.inc(1);
                }
                results
                    .lock()
                    .expect("no worker panics while holding the lock")[i] = Some(out);
            });
        }
    });
    let mut results = results.into_inner().expect("workers are done");
    let mut grouped = Vec::new();
    for (p, name) in policies.iter().enumerate() {
        let mut runs = Vec::new();
        for s in 0..seeds.len() {
            let out = results[p * seeds.len() + s]
                .take()
                .expect("every job ran")?;
            runs.push(out);
        }
        grouped.push(((*name).to_owned(), runs));
    }
    Ok(grouped)
}
