//! The agent selling through a real coordinator: a hot SKU in escrow
//! mode, then one in central mode, and the coordinator's audit once the
//! regions' reports have caught up.

use std::net::SocketAddr;
use std::time::Duration;

use harness::client::{self, Bearer};
use harness::database::ScratchDb;
use harness::process::{free_addr, ServerProcess};
use harness::{ADMIN_TOKEN, TENANT, TENANT_KEY};
use hyper::{Method, StatusCode};
use serde_json::json;

use crate::load::LoadReport;

use super::servers::{db_name, start_agent_with, Target};
use super::{agent_load, audit_drift, hot, spec, AgentBackend, Settings, HOT_STOCK};

/// An agent selling through a real coordinator, both on scratch
/// databases: a hot SKU in escrow mode (the default policy: the region
/// sells its quota locally), then one in central mode (every unit stays in
/// the coordinator's pool: each batch takes what it sells). Returns both
/// runs and the coordinator's audit afterwards.
pub(super) async fn coordinated(
    settings: &Settings,
) -> anyhow::Result<(LoadReport, LoadReport, i64)> {
    let (clients, measure) = (settings.clients, settings.measure);
    eprintln!("bench: agent through a coordinator ...");
    let db = ScratchDb::create(&settings.database_url, &db_name("coordinator", "cmp")).await?;
    let coordinator_addr = free_addr()?;
    let args: Vec<String> = [
        "--listen",
        &coordinator_addr.to_string(),
        "--database-url",
        &db.url,
        "--admin-token",
        ADMIN_TOKEN,
        "--region-token",
        "eu=token-eu",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let coordinator = ServerProcess::start(
        "coordinator",
        &settings.binaries.coordinator,
        &args,
        coordinator_addr,
    )
    .await?;
    let coordinator = Target {
        process: coordinator,
        db: Some(db),
        file: None,
    };
    let extra = [
        "--coordinator-url".to_owned(),
        format!("http://{coordinator_addr}"),
        "--region-token".to_owned(),
        "token-eu".to_owned(),
    ];
    let agent = start_agent_with(
        settings,
        settings.agent,
        AgentBackend::Postgres,
        "coord",
        &extra,
    )
    .await?;
    let admin = Bearer::new(ADMIN_TOKEN)?;
    for (sku, policy) in [("escrow", None), ("central", Some("central"))] {
        let mut body = json!({"total": HOT_STOCK, "regions": {"eu": 1}});
        if let Some(policy) = policy {
            body["policy"] = policy.into();
        }
        let path = format!("/v1/admin/skus/{TENANT}/{sku}");
        let (status, answer) =
            client::once(coordinator_addr, Method::PUT, &path, &admin, Some(body)).await?;
        anyhow::ensure!(
            status.is_success(),
            "PUT {path} answered {status}: {answer}"
        );
        wait_for_sku(agent.addr(), sku).await?;
    }
    eprintln!("bench: agent through a coordinator, escrow mode ...");
    let escrow = agent_load(spec(
        settings,
        agent.addr(),
        clients,
        measure,
        hot("escrow"),
        "ce",
    ))
    .await?;
    eprintln!("bench: agent through a coordinator, central mode ...");
    let central = agent_load(spec(
        settings,
        agent.addr(),
        clients,
        measure,
        hot("central"),
        "cc",
    ))
    .await?;
    let drift_total = settled_drift(coordinator_addr).await?;
    agent.stop().await?;
    coordinator.stop().await?;
    Ok((escrow, central, drift_total))
}

/// Waits until the agent at `addr` sells `sku` (the coordinator's directive reached it).
async fn wait_for_sku(addr: SocketAddr, sku: &str) -> anyhow::Result<()> {
    let bearer = Bearer::new(TENANT_KEY)?;
    let path = format!("/v1/skus/{sku}");
    for _ in 0..200 {
        if let Ok((StatusCode::OK, _)) = client::once(addr, Method::GET, &path, &bearer, None).await
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("the agent at {addr} did not learn of {sku} within 10 s")
}

/// The coordinator's audit once every region's report has caught up: the
/// sum of |drift| over every SKU (must be 0).
async fn settled_drift(coordinator: SocketAddr) -> anyhow::Result<i64> {
    let mut drift = audit_drift(coordinator).await?;
    for _ in 0..100 {
        if drift == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        drift = audit_drift(coordinator).await?;
    }
    Ok(drift)
}
