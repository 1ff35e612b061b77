//! `coordinator`: parses configuration and runs the coordinator.

use anyhow::Context;
use clap::Parser;
use coordinator::auth::Auth;
use coordinator::config::Config;
use coordinator::policies::Policies;
use coordinator::store::Store;
use coordinator::{run, AppState};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    service_kit::init_tracing();
    let config = Config::parse();
    let policies = Policies::new(&config.policy, config.sync_interval_ms).context("--policy")?;
    let store = Store::open(&config.database_url(), config.db_pool_size)
        .await
        .context("opening the database")?;
    let state = AppState::new(
        store,
        Auth::new(config.admin_token, config.region_tokens),
        policies,
        config.stale_report_ms,
    );
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, policy = %config.policy, "serving");
    run(listener, state, service_kit::shutdown_signal()).await?;
    Ok(())
}
