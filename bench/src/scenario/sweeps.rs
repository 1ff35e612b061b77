//! The sweeps: the agent's hot-SKU throughput against its batch bound,
//! and the agent's and the naive server's against the number of buyers.

use crate::load::LoadReport;

use super::servers::{start_agent, start_naive};
use super::{
    agent_load, hot, put_sku, spec, watched_load, AgentBackend, AgentFlags, Settings, HOT_STOCK,
};

/// One point of a sweep.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// The swept value (batch bound or clients).
    pub value: u64,
    /// The agent on one hot SKU.
    pub agent: LoadReport,
    /// The naive server on one hot SKU, where the sweep runs it.
    pub naive: Option<LoadReport>,
}

/// Batch bounds the batch sweep tries.
pub const SWEEP_MAX_IN_FLIGHT: [u32; 5] = [1, 4, 16, 64, 256];
/// Client counts the client sweep tries.
pub const SWEEP_CLIENTS: [usize; 5] = [1, 16, 64, 256, 1024];

/// Agent hot-SKU throughput for each `--max-in-flight` in [`SWEEP_MAX_IN_FLIGHT`].
pub async fn sweep_batch(settings: &Settings) -> anyhow::Result<Vec<SweepPoint>> {
    let mut points = Vec::new();
    for max_in_flight in SWEEP_MAX_IN_FLIGHT {
        eprintln!("bench: sweep, --max-in-flight {max_in_flight} ...");
        let flags = AgentFlags {
            max_in_flight,
            ..settings.agent
        };
        let agent = start_agent(
            settings,
            flags,
            AgentBackend::Postgres,
            &format!("b{max_in_flight}"),
        )
        .await?;
        put_sku(agent.addr(), "hot", HOT_STOCK).await?;
        let report = agent_load(spec(
            settings,
            agent.addr(),
            settings.clients,
            settings.sweep_measure,
            hot("hot"),
            "b",
        ))
        .await?;
        agent.stop().await?;
        points.push(SweepPoint {
            value: u64::from(max_in_flight),
            agent: report,
            naive: None,
        });
    }
    Ok(points)
}

/// Agent and naive hot-SKU throughput for each client count in [`SWEEP_CLIENTS`].
pub async fn sweep_clients(settings: &Settings) -> anyhow::Result<Vec<SweepPoint>> {
    let agent = start_agent(settings, settings.agent, AgentBackend::Postgres, "clients").await?;
    let naive = start_naive(settings, "clients").await?;
    let mut points = Vec::new();
    for clients in SWEEP_CLIENTS {
        eprintln!("bench: sweep, {clients} clients ...");
        // A fresh SKU per point, so every point starts from an idle owner.
        let sku = format!("hot{clients}");
        put_sku(agent.addr(), &sku, HOT_STOCK).await?;
        put_sku(naive.addr(), &sku, HOT_STOCK).await?;
        let run_id = format!("k{clients}");
        let agent_report = agent_load(spec(
            settings,
            agent.addr(),
            clients,
            settings.sweep_measure,
            hot(&sku),
            &run_id,
        ))
        .await?;
        let naive_report = watched_load(spec(
            settings,
            naive.addr(),
            clients,
            settings.sweep_measure,
            hot(&sku),
            &run_id,
        ))
        .await?;
        points.push(SweepPoint {
            value: clients as u64,
            agent: agent_report,
            naive: Some(naive_report),
        });
    }
    agent.stop().await?;
    naive.stop().await?;
    Ok(points)
}
