//! One sale on a cluster, through the contract's HTTP API only: the SKU is
//! created with `PUT /v1/admin/skus/{tenant}/{sku}` on the coordinator,
//! the sale opens once every agent can sell it, the crowd buys while the
//! coordinator's view is sampled, and the sale closes once every region
//! reported after the last answer: the audit (`GET /v1/admin/audit`) and
//! the counters (`/metrics`) are read and the run analysed. `bench tail`
//! runs one per policy; the demo runs one and shows it live.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hyper::{Method, StatusCode};
use serde_json::json;

use crate::analysis::{self, TailStats, Totals};
use crate::client::{self, Bearer};
use crate::cluster::{Cluster, ClusterFlags, Logs, Storage};
use crate::crowd::{self, BuyerLog, Crowd, Progress};
use crate::link::Distances;
use crate::metrics::Counters;
use crate::process::Binaries;
use crate::sampler::{self, Origin, SkuView};
use crate::shape::{Sale, UserLimit, HOLD_TTL_MS};

/// The SKU every sale sells.
pub const SKU: &str = "tail";

/// Longest the agents may take to learn of a new SKU and receive their
/// first grants.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Longest the regions may take to settle after the last buyer is done
/// (every region reported after it, nothing in transit, no drift).
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// How often the coordinator's view is read while waiting for the agents
/// to be ready, or for the regions to settle.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// What every sale of a `bench tail` invocation (or the demo's one)
/// shares.
#[derive(Debug, Clone)]
pub struct TailSettings {
    /// Where the processes keep their databases.
    pub storage: Storage,
    /// Where the processes write their logs.
    pub logs: Logs,
    /// Where the binaries are.
    pub binaries: Binaries,
    /// Most requests in flight at once, per region.
    pub in_flight: usize,
    /// Flags of the coordinator and the agents.
    pub cluster: ClusterFlags,
    /// Round trip between each region and the coordinator; regions not
    /// named talk over plain loopback.
    pub distances: Distances,
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
    pub samples: Vec<SkuView>,
    /// The coordinator's view once every region reported after the sale.
    pub settled: SkuView,
}

/// A sale under way on a cluster: the SKU exists, every agent can sell
/// it, and the coordinator's view is being sampled.
pub struct OpenSale {
    /// The sale's start: the buyers' clock and the samples' run from it.
    pub origin: Origin,
    started: Instant,
    before: Counters,
    sampling: sampler::Sampling,
}

impl OpenSale {
    /// The coordinator's latest view of the SKU, as it changes.
    pub fn latest_view(&self) -> tokio::sync::watch::Receiver<Option<SkuView>> {
        self.sampling.latest()
    }
}

/// Creates the sale's SKU on the coordinator, waits until every agent can
/// sell it, and starts sampling: the sale starts now.
pub async fn open_sale(cluster: &Cluster, sale: &Sale) -> anyhow::Result<OpenSale> {
    put_sku(cluster, sale).await?;
    wait_sku_ready(cluster, sale).await?;
    let before = Counters::read(cluster.coordinator_addr(), &cluster.agent_addrs()).await?;
    let origin = Origin::now();
    Ok(OpenSale {
        origin,
        started: Instant::now(),
        before,
        sampling: sampler::start(cluster.coordinator_addr(), cluster.credentials(), origin)?,
    })
}

/// The crowd that buys the sale's SKU from `cluster`'s agents, counted
/// into `progress` if given.
pub fn crowd(settings: &TailSettings, cluster: &Cluster, progress: Option<Arc<Progress>>) -> Crowd {
    Crowd {
        agents: cluster.agent_addrs(),
        in_flight: settings.in_flight,
        run_id: format!("t{}", std::process::id()),
        tenant_key: cluster.credentials().tenant_key.clone(),
        sku: SKU.to_owned(),
        progress,
        witness: None,
        home_prefixes: None,
    }
}

/// Runs the sale's buyers as `crowd` says from `origin` (the sale's
/// start, [`OpenSale::origin`]); one log per buyer, in arrival order.
pub async fn buy(crowd: Crowd, sale: &Sale, origin: Origin) -> anyhow::Result<Vec<BuyerLog>> {
    anyhow::ensure!(
        crowd.agents.len() == sale.regions.len(),
        "one agent per region"
    );
    let crowd = Crowd {
        home_prefixes: (sale.user_limit == UserLimit::GlobalNamed)
            .then(|| sale.regions.iter().map(|r| r.name.clone()).collect()),
        ..crowd
    };
    crowd::run(crowd, &sale.arrivals, &sale.patience, origin)
        .await
        .context("running the buyers")
}

/// Ends a sale whose buyers are all done (`logs`): stops sampling, waits
/// until every region reported after the last answer, reads the audit and
/// the counters, and analyses.
pub async fn close_sale(
    cluster: &Cluster,
    sale: &Sale,
    open: OpenSale,
    logs: &[BuyerLog],
    policy: &str,
) -> anyhow::Result<TailRun> {
    let sale_wall = open.started.elapsed();
    let last_answer_us = logs.iter().map(|l| l.last_answer_us).max().unwrap_or(0);
    let samples = open.sampling.stop().await;
    let settled = settle(cluster, open.origin, last_answer_us).await?;
    let after = Counters::read(cluster.coordinator_addr(), &cluster.agent_addrs()).await?;
    let totals = Totals {
        units: sale.units,
        regions: sale.regions.iter().map(|r| r.name.clone()).collect(),
        final_view: settled.view.clone(),
        drift_total: settled.drift_total,
        counters: after.since(&open.before),
        rtt_ms: cluster.rtt_ms(),
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

/// What `GET /v1/admin/audit` says about every SKU together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Audit {
    /// `drift_total`: the sum over SKUs of |drift| + |ledger drift|.
    pub drift_total: i64,
    /// `stale_skus`: SKUs with a region whose report is stale.
    pub stale_skus: i64,
}

/// The audit of the coordinator at `coordinator` now, asked with
/// `admin_token`.
pub async fn audit(coordinator: SocketAddr, admin_token: &str) -> anyhow::Result<Audit> {
    let admin = Bearer::new(admin_token)?;
    let (status, body) =
        client::once(coordinator, Method::GET, "/v1/admin/audit", &admin, None).await?;
    anyhow::ensure!(status == StatusCode::OK, "audit answered {status}: {body}");
    Ok(Audit {
        drift_total: body["drift_total"]
            .as_i64()
            .context("audit body has drift_total")?,
        stale_skus: body["stale_skus"].as_i64().unwrap_or(0),
    })
}

/// Creates the SKU on the coordinator with the sale's regions and weights.
async fn put_sku(cluster: &Cluster, sale: &Sale) -> anyhow::Result<()> {
    let credentials = cluster.credentials();
    let admin = Bearer::new(&credentials.admin_token)?;
    let path = format!("/v1/admin/skus/{}/{SKU}", credentials.tenant);
    let weights: serde_json::Map<String, serde_json::Value> = sale
        .regions
        .iter()
        .map(|r| (r.name.clone(), json!(r.weight)))
        .collect();
    let scope = match sale.user_limit {
        UserLimit::Region => "region",
        UserLimit::GlobalHashed | UserLimit::GlobalNamed => "global",
    };
    let body = json!({
        "total": sale.units,
        "regions": weights,
        "max_per_user": sale.max_per_user,
        "hold_ttl_ms": HOLD_TTL_MS,
        "user_limit_scope": scope,
    });
    let coordinator = cluster.coordinator_addr();
    let (status, answer) =
        client::once(coordinator, Method::PUT, &path, &admin, Some(body)).await?;
    anyhow::ensure!(
        status.is_success(),
        "PUT {path} answered {status}: {answer}"
    );
    Ok(())
}

/// Waits until every region reported the SKU after it was created,
/// nothing is in transit, and every agent's buyer API knows it.
async fn wait_sku_ready(cluster: &Cluster, sale: &Sale) -> anyhow::Result<()> {
    let origin = Origin::now();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let view =
            sampler::sku_view(cluster.coordinator_addr(), cluster.credentials(), origin).await;
        if let Ok(view) = &view {
            if view.regions.len() == sale.regions.len()
                && view.reports_from_us.is_some_and(|t| t >= 0)
                && view.in_transit == 0
                && agents_know_sku(cluster).await
            {
                return Ok(());
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the agents were not ready to sell within {READY_TIMEOUT:?}: {view:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Whether every agent's buyer API answers the SKU.
async fn agents_know_sku(cluster: &Cluster) -> bool {
    let Ok(bearer) = Bearer::new(&cluster.credentials().tenant_key) else {
        return false;
    };
    let path = format!("/v1/skus/{SKU}");
    for addr in cluster.agent_addrs() {
        match client::once(addr, Method::GET, &path, &bearer, None).await {
            Ok((StatusCode::OK, _)) => {}
            _ => return false,
        }
    }
    true
}

/// The final state after the sale.
#[derive(Debug, Clone)]
struct Settled {
    /// The SKU view once every region reported after the last answer.
    view: SkuView,
    /// `drift_total` of `GET /v1/admin/audit`.
    drift_total: i64,
}

/// Waits until every region reported after `last_answer_us` (plus the
/// report lag margin), nothing is in transit and the view shows no
/// drift; then reads the audit.
async fn settle(cluster: &Cluster, origin: Origin, last_answer_us: i64) -> anyhow::Result<Settled> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let after = last_answer_us + sampler::REPORT_LAG_MARGIN_US;
    let coordinator = cluster.coordinator_addr();
    let view = loop {
        let view = sampler::sku_view(coordinator, cluster.credentials(), origin).await;
        if let Ok(view) = &view {
            if view.reports_from_us.is_some_and(|t| t >= after)
                && view.in_transit == 0
                && view.drift == 0
            {
                break view.clone();
            }
        }
        if Instant::now() >= deadline {
            // Report what there is: the table shows the drift.
            tracing::warn!(?view, "regions did not settle within {SETTLE_TIMEOUT:?}");
            break view.context("reading the SKU view after the sale")?;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    let drift_total = audit(coordinator, &cluster.credentials().admin_token)
        .await?
        .drift_total;
    Ok(Settled { view, drift_total })
}
