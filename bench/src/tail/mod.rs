//! `bench tail`: the tail of a flash sale, measured on the real binaries.
//!
//! For each policy it starts a `coordinator` and one `region-agent` per
//! region as child processes, each on its own scratch database, creates one
//! SKU through the coordinator's admin API, and lets a crowd of buyers loose
//! on the agents. Buyers behave like browsers: one request key each, a 503
//! is retried with the same key after `Retry-After`, HELD or SOLD_OUT ends
//! it. While they buy, the coordinator's SKU view is sampled every
//! [`harness::sampler::SAMPLE_INTERVAL`] so the analysis can tell whether
//! units were free when a buyer was turned away. Only the contract's HTTP
//! API and the binaries' flags are used, so the tool keeps measuring while
//! the internals change.
//!
//! The cluster, the crowd, the sales' shapes, the sampler and the analysis
//! are the [`harness`]'s (the demo runs the same sale); this module runs a
//! sale once per policy and [`report`] prints the Markdown table; for a
//! simulator scenario, [`fidelity`] puts the simulator's figures of the
//! same sale beside the real ones.

pub mod fidelity;
pub mod report;

use std::sync::atomic::{AtomicU32, Ordering};

use harness::cluster::Cluster;
use harness::sale::{self, TailRun, TailSettings};
use harness::shape::Sale;

/// Policies run when `--policies` is not given.
pub const DEFAULT_POLICIES: [&str; 3] = ["central", "tail-merge", "static"];

/// Makes every run's database names unique within this process (tests run
/// clusters side by side).
static RUNS: AtomicU32 = AtomicU32::new(0);

/// Runs `sale` once under `policy` on a cluster of its own, which is
/// stopped (and its databases dropped, if the storage says so) whatever
/// happens.
pub async fn run_policy(
    settings: &TailSettings,
    sale: &Sale,
    policy: &str,
) -> anyhow::Result<TailRun> {
    let regions: Vec<String> = sale.regions.iter().map(|r| r.name.clone()).collect();
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let tag = format!("bench_tail_{}_{run}", std::process::id());
    let settings = &TailSettings {
        distances: sale.distances(&settings.distances),
        ..settings.clone()
    };
    let cluster = Cluster::start(settings, policy, &regions, &tag).await?;
    let result = drive(settings, &cluster, sale, policy).await;
    let stopped = cluster.stop().await;
    let run = result?;
    stopped?;
    Ok(run)
}

async fn drive(
    settings: &TailSettings,
    cluster: &Cluster,
    sale: &Sale,
    policy: &str,
) -> anyhow::Result<TailRun> {
    let open = sale::open_sale(cluster, sale).await?;
    let crowd = sale::crowd(settings, cluster, None);
    let logs = sale::buy(crowd, sale, open.origin).await?;
    sale::close_sale(cluster, sale, open, &logs, policy).await
}
