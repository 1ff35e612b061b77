//! `region-agent`: parses configuration and runs the agent.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use region_agent::auth::Auth;
use region_agent::clock::SystemClock;
use region_agent::config::Config;
use region_agent::coordinator_client::{CoordinatorLink, HttpCoordinator};
use region_agent::owner::Limits;
use region_agent::{run, start, store, AgentSettings, KeyMemory};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    service_kit::init_tracing();
    let config = Config::parse();
    let coordinator = match &config.coordinator_url {
        None => None,
        Some(url) => {
            let Some(token) = config.region_token.clone() else {
                bail!("--coordinator-url needs --region-token");
            };
            let client =
                HttpCoordinator::new(url, config.region.clone(), token, Duration::from_secs(2))
                    .context("building the coordinator client")?;
            Some(Arc::new(CoordinatorLink::new(
                Arc::new(client),
                config.sync_interval_ms,
            )))
        }
    };
    let store = store::open(&config.database_url(), config.db_pool_size)
        .await
        .context("opening the database")?;
    let settings = AgentSettings {
        region: config.region,
        auth: Auth::new(config.tenant_keys, config.admin_token),
        limits: Limits {
            max_in_flight: config.max_in_flight as usize,
            max_waiting: config.max_waiting as usize,
            wait_timeout_ms: config.wait_timeout_ms,
        },
        coordinator,
        keys: KeyMemory {
            window_ms: config.idempotency_window_s * 1_000,
            filter_capacity: usize::try_from(config.key_filter_capacity).unwrap_or(usize::MAX),
        },
    };
    let state = start(store, Arc::new(SystemClock), settings)
        .await
        .context("starting the agent")?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, "serving");
    run(listener, state, service_kit::shutdown_signal()).await?;
    Ok(())
}
