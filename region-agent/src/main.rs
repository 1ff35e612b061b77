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
use region_agent::store::postgres::{PgStore, MIGRATOR};
use region_agent::{run, start, AgentSettings};
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
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
    // A statement that hangs must fail rather than hold an owner (and shutdown) forever.
    let options = PgConnectOptions::from_str(&config.database_url)
        .context("parsing --database-url")?
        .options([("statement_timeout", "10s")]);
    let pool = PgPoolOptions::new()
        .max_connections(config.db_pool_size)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .context("connecting to the database")?;
    MIGRATOR.run(&pool).await.context("applying migrations")?;
    let settings = AgentSettings {
        region: config.region,
        auth: Auth::new(config.tenant_keys, config.admin_token),
        limits: Limits {
            batch_size_max: config.max_in_flight as usize,
            queue_max: config.max_waiting as usize,
            wait_timeout_ms: config.wait_timeout_ms,
        },
        coordinator,
    };
    let state = start(
        Arc::new(PgStore::new(pool)),
        Arc::new(SystemClock),
        settings,
    )
    .await
    .context("starting the agent")?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, "serving");
    run(listener, state, service_kit::shutdown_signal()).await?;
    Ok(())
}
