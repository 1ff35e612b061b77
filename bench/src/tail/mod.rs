//! `bench tail`: the tail of a flash sale, measured on the real binaries.
//!
//! For each policy it starts a `coordinator` and one `region-agent` per
//! region as child processes, each on its own scratch database, creates one
//! SKU through the coordinator's admin API, and lets a crowd of buyers loose
//! on the agents. Buyers behave like browsers: one request key each, a 503
//! is retried with the same key after `Retry-After`, HELD or SOLD_OUT ends
//! it. While they buy, the coordinator's SKU view is sampled every
//! [`sampler::SAMPLE_INTERVAL`] so the analysis can tell whether units were
//! free when a buyer was turned away. Only the contract's HTTP API and the
//! binaries' flags are used, so the tool keeps measuring while the
//! internals change.
//!
//! - [`shape`]: the sales: presets, flags, a simulator scenario.
//! - [`cluster`]: the coordinator and agents of one run.
//! - [`link`]: the round trip between a region and the coordinator.
//! - [`buyers`]: the crowd, its connections, its retries and its payments.
//! - [`sampler`]: the coordinator's view of the SKU over time.
//! - [`analysis`]: from logs and samples to the table's numbers.
//! - [`report`]: the Markdown table.

pub mod analysis;
pub mod buyers;
pub mod cluster;
pub mod link;
pub mod report;
pub mod sampler;
pub mod shape;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::process::Binaries;
use analysis::{TailStats, Totals};
use cluster::{Cluster, ClusterFlags, Counters, Logs, Storage};
use shape::Sale;

/// The SKU every run sells.
pub const SKU: &str = "tail";

/// Policies run when `--policies` is not given.
pub const DEFAULT_POLICIES: [&str; 3] = ["central", "tail-merge", "static"];

/// Longest the regions may take to settle after the last buyer is done
/// (every region reported after it, nothing in transit, no drift).
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// What every run of a `bench tail` invocation shares.
#[derive(Debug, Clone)]
pub struct TailSettings {
    /// Where the processes keep their databases.
    pub storage: Storage,
    /// Where the processes write their logs.
    pub logs: Logs,
    /// Where the binaries are.
    pub binaries: Binaries,
    /// Most requests in flight at once, over all buyers.
    pub in_flight: usize,
    /// Flags of the coordinator and the agents.
    pub cluster: ClusterFlags,
    /// Round trip between each region and the coordinator; regions not
    /// named talk over plain loopback.
    pub distances: link::Distances,
}

/// One policy's run of one sale.
#[derive(Debug, Clone)]
pub struct TailRun {
    /// The coordinator's `--policy`.
    pub policy: String,
    /// What the buyers saw, and the checks.
    pub stats: TailStats,
    /// Wall time of the sale, from the first arrival to the last answer.
    pub sale_wall: Duration,
    /// The coordinator's view, sampled during the sale, oldest first.
    pub samples: Vec<sampler::SkuView>,
    /// The coordinator's view once every region reported after the sale.
    pub settled: sampler::SkuView,
}

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
    let open = open_sale(cluster, sale).await?;
    let logs = buyers::run(crowd(settings, cluster, None), sale, open.origin)
        .await
        .context("running the buyers")?;
    close_sale(cluster, sale, open, &logs, policy).await
}

/// A sale under way on a cluster: the SKU exists, every agent can sell
/// it, and the coordinator's view is being sampled.
pub struct OpenSale {
    /// The sale's start: the buyers' clock and the samples' run from it.
    pub origin: sampler::Origin,
    started: Instant,
    before: Counters,
    sampling: sampler::Sampling,
}

impl OpenSale {
    /// The coordinator's latest view of the SKU, as it changes.
    pub fn latest_view(&self) -> tokio::sync::watch::Receiver<Option<sampler::SkuView>> {
        self.sampling.latest()
    }
}

/// Creates the sale's SKU on the coordinator, waits until every agent can
/// sell it, and starts sampling: the sale starts now.
pub async fn open_sale(cluster: &Cluster, sale: &Sale) -> anyhow::Result<OpenSale> {
    cluster.put_sku(sale).await?;
    cluster.wait_sku_ready(sale).await?;
    let before = cluster.counters().await?;
    let origin = sampler::Origin::now();
    Ok(OpenSale {
        origin,
        started: Instant::now(),
        before,
        sampling: sampler::start(cluster.coordinator_addr(), origin),
    })
}

/// The crowd that buys from `cluster`'s agents, counted into `progress`
/// if given.
pub fn crowd(
    settings: &TailSettings,
    cluster: &Cluster,
    progress: Option<std::sync::Arc<buyers::Progress>>,
) -> buyers::Crowd {
    buyers::Crowd {
        agents: cluster.agent_addrs(),
        in_flight: settings.in_flight,
        run_id: format!("t{}", std::process::id()),
        progress,
    }
}

/// Ends a sale whose buyers are all done (`logs`): stops sampling, waits
/// until every region reported after the last answer, reads the audit and
/// the counters, and analyses.
pub async fn close_sale(
    cluster: &Cluster,
    sale: &Sale,
    open: OpenSale,
    logs: &[buyers::BuyerLog],
    policy: &str,
) -> anyhow::Result<TailRun> {
    let sale_wall = open.started.elapsed();
    let last_answer_us = logs.iter().map(|l| l.last_answer_us).max().unwrap_or(0);
    let samples = open.sampling.stop().await;
    let settled = cluster.settle(open.origin, last_answer_us).await?;
    let after = cluster.counters().await?;
    let totals = Totals {
        units: sale.units,
        regions: sale.regions.iter().map(|r| r.name.clone()).collect(),
        final_view: settled.view.clone(),
        drift_total: settled.drift_total,
        counters: after.since(&open.before),
        rtt_ms: cluster.rtt_ms().to_vec(),
    };
    let stats = analysis::analyse(logs, &samples, &totals);
    Ok(TailRun {
        policy: policy.to_owned(),
        stats,
        sale_wall,
        samples,
        settled: settled.view,
    })
}
