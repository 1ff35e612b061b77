//! `coordinator`: parses configuration and runs the coordinator.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use coordinator::auth::Auth;
use coordinator::config::Config;
use coordinator::policies::Policies;
use coordinator::store::{Store, MIGRATOR};
use coordinator::{run, AppState};
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    service_kit::init_tracing();
    let config = Config::parse();
    let policies = Policies::new(&config.policy, config.sync_interval_ms).context("--policy")?;
    // A statement that hangs must fail rather than hold SKU locks forever.
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
    let state = AppState::new(
        Store::new(pool),
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
