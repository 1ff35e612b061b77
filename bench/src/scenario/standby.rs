//! The agent on a region database with a synchronous standby, as
//! production runs it (`scripts/ha-region`: pg_auto_failover, three nodes
//! on this machine, `number-sync-standbys 1`, so every commit waits for a
//! standby's flush): the hot SKU and the 100 SKUs, to set beside the single
//! server's; then the primary's machine killed with -9 under the hot SKU,
//! and how long until a standby takes writes and the agent holds again.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use harness::client::{self, Bearer};
use harness::ha_region::Formation;
use harness::outcome::Outcome;
use harness::TENANT_KEY;
use hyper::Method;
use serde_json::json;

use crate::load::{LoadReport, Workload};

use super::servers::start_agent;
use super::{agent_load, audit_drift, hot, put_sku, spec, AgentBackend, Settings};
use super::{HOT_STOCK, MULTI_SKUS, MULTI_STOCK};

/// Longest the failover may take before the run gives up on it.
const FAILOVER_LIMIT: Duration = Duration::from_secs(90);
/// Pause between the failover buyer's requests.
const BUYER_PAUSE: Duration = Duration::from_millis(20);

/// The agent's phases on a database with a synchronous standby.
#[derive(Debug, Clone)]
pub struct StandbyPhases {
    /// Holds on one hot SKU.
    pub hot: LoadReport,
    /// Holds over 100 SKUs.
    pub multi: LoadReport,
    /// From the primary's death to a standby taking writes.
    pub promoted: Duration,
    /// From the primary's death to the first HELD of a request sent after it.
    pub first_hold: Duration,
    /// The agent's audit after the failover.
    pub drift_total: i64,
}

/// Starts the formation, runs the phases on an agent given its multi-host
/// URL, kills the primary and times the failover; stops everything.
pub(super) async fn standby_phases(settings: &Settings) -> anyhow::Result<StandbyPhases> {
    eprintln!("bench: region agent on a synchronous standby (scripts/ha-region) ...");
    let formation = tokio::task::spawn_blocking(|| Formation::start(false)).await??;
    let backend = AgentBackend::Url(formation.url().to_owned());
    let agent = start_agent(settings, settings.agent, backend, "standby").await?;
    let addr = agent.addr();
    put_sku(addr, "hot", HOT_STOCK).await?;
    let multi: Vec<String> = (0..MULTI_SKUS).map(|i| format!("m{i:03}")).collect();
    for sku in &multi {
        put_sku(addr, sku, MULTI_STOCK).await?;
    }
    let (clients, measure) = (settings.clients, settings.measure);
    eprintln!("bench: agent on a synchronous standby, hot SKU ...");
    let hot_report = agent_load(spec(settings, addr, clients, measure, hot("hot"), "sh")).await?;
    eprintln!("bench: agent on a synchronous standby, {MULTI_SKUS} SKUs ...");
    let workload = Workload::Reserve { skus: multi };
    let multi_report = agent_load(spec(settings, addr, clients, measure, workload, "sm")).await?;
    eprintln!("bench: agent on a synchronous standby, the primary killed under the hot SKU ...");
    let (promoted, first_hold) = fail_over(&formation, addr, settings).await?;
    let drift_total = audit_drift(addr).await?;
    agent.stop().await?;
    tokio::task::spawn_blocking(move || drop(formation)).await?;
    Ok(StandbyPhases {
        hot: hot_report,
        multi: multi_report,
        promoted,
        first_hold,
        drift_total,
    })
}

/// Under the hot SKU's load, kills the primary's machine (its process
/// group, -9); answers how long until another node took writes and until
/// a request sent after the kill was answered HELD.
async fn fail_over(
    formation: &Formation,
    addr: SocketAddr,
    settings: &Settings,
) -> anyhow::Result<(Duration, Duration)> {
    let old = formation
        .primary()
        .await
        .ok_or_else(|| anyhow::anyhow!("the formation has no primary"))?;
    let mut load = spec(
        settings,
        addr,
        settings.clients,
        FAILOVER_LIMIT,
        hot("hot"),
        "sf",
    );
    load.warmup = Duration::ZERO;
    let background = tokio::spawn(crate::load::run(load));
    tokio::time::sleep(Duration::from_secs(1)).await;
    formation.signal_node(old, "-KILL")?;
    let killed = Instant::now();
    let promoted = async {
        formation.promotion(old, FAILOVER_LIMIT).await?;
        anyhow::Ok(killed.elapsed())
    };
    let (promoted, first_hold) = tokio::join!(promoted, first_hold_after(addr, killed));
    background.abort();
    Ok((promoted?, first_hold?))
}

/// Sends one hot-SKU reserve after another, each with a fresh key, until
/// one is answered HELD; answers how long after `since` that was.
async fn first_hold_after(addr: SocketAddr, since: Instant) -> anyhow::Result<Duration> {
    let bearer = Bearer::new(TENANT_KEY)?;
    let mut n = 0u64;
    loop {
        n += 1;
        anyhow::ensure!(
            since.elapsed() < FAILOVER_LIMIT,
            "no HELD within {FAILOVER_LIMIT:?} of the primary's death"
        );
        let key = format!("failover-{n}");
        let body = json!({"request_key": key, "user_id": key, "sku": "hot"});
        if let Ok((status, answer)) =
            client::once(addr, Method::POST, "/v1/reservations", &bearer, Some(body)).await
        {
            if Outcome::of_reserve(status, answer.to_string().as_bytes()) == Outcome::Held {
                return Ok(since.elapsed());
            }
        }
        tokio::time::sleep(BUYER_PAUSE).await;
    }
}
