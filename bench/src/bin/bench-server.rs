//! `bench-server`: the benchmark's baseline servers, one per process.
//!
//! `--mode naive` serves the buyer API with one PostgreSQL transaction per
//! sale on its own database; `--mode ceiling` parses the same requests and
//! answers without storage. Both run on the same axum and tokio as the agent.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use bench::ceiling::{self, Ceiling};
use bench::naive::{self, Naive};
use clap::{Parser, ValueEnum};
use harness::{ADMIN_TOKEN, TENANT, TENANT_KEY};
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;

/// Which baseline to serve.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    /// One transaction per sale: insert the row, conditional UPDATE of the stock row.
    Naive,
    /// Parse and answer 201 without storage.
    Ceiling,
}

/// Serves a baseline for the benchmark.
#[derive(Debug, Parser)]
#[command(name = "bench-server", version)]
struct Args {
    /// Which baseline.
    #[arg(long, value_enum)]
    mode: Mode,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7200")]
    listen: SocketAddr,
    /// The naive server's own database (required for `--mode naive`).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The naive server's connection pool.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=512))]
    db_pool_size: u32,
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let app = match args.mode {
        Mode::Ceiling => ceiling::app(Ceiling {
            tenant_key: TENANT_KEY.into(),
        }),
        Mode::Naive => {
            let url = args
                .database_url
                .context("--mode naive needs --database-url")?;
            let pool = PgPoolOptions::new()
                .max_connections(args.db_pool_size)
                .acquire_timeout(Duration::from_secs(30))
                .connect(&url)
                .await
                .context("connecting to the database")?;
            naive::prepare(&pool).await.context("creating tables")?;
            naive::app(Naive {
                pool,
                tenant: TENANT.into(),
                tenant_key: TENANT_KEY.into(),
                admin_token: ADMIN_TOKEN.into(),
            })
        }
    };
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    Ok(())
}
