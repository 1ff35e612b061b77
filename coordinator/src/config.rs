//! Command-line flags, each also read from the environment.

use std::net::SocketAddr;

use clap::Parser;
use escrow_core::RegionName;

use crate::auth::parse_region_token;

/// Owns each SKU's total and leases quota to region agents.
#[derive(Debug, Parser)]
#[command(name = "coordinator", version)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "COORDINATOR_LISTEN", default_value = "127.0.0.1:7000")]
    pub listen: SocketAddr,
    /// The coordinator's database: `postgres://...` (the production
    /// choice) or `sqlite://PATH` (an embedded file, created if missing).
    /// Without it, the SQLite file `./coordinator.db`.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Bearer token for /v1/admin/*.
    #[arg(long, env = "ESCROW_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Region credentials, `REGION=TOKEN`, repeatable.
    #[arg(long = "region-token", env = "ESCROW_REGION_TOKENS", value_delimiter = ',', hide_env_values = true,
          value_parser = parse_region_token)]
    pub region_tokens: Vec<(RegionName, String)>,
    /// Rebalancing policy of SKUs that do not choose one: tail-merge,
    /// refill, proportional, static or central.
    #[arg(long, env = "COORDINATOR_POLICY", default_value = "tail-merge")]
    pub policy: String,
    /// How often agents sync, ms (the policy's refill lead time).
    #[arg(long, env = "COORDINATOR_SYNC_INTERVAL_MS", default_value_t = 200)]
    pub sync_interval_ms: u64,
    /// A region report older than this counts as stale in the audit.
    #[arg(long, env = "COORDINATOR_STALE_REPORT_MS", default_value_t = 10_000)]
    pub stale_report_ms: u64,
    /// Database connections in the pool (on SQLite: readers beside the one writer).
    #[arg(long, env = "COORDINATOR_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,
}

impl Config {
    /// The database URL given, or the default SQLite file.
    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) if !url.is_empty() => url.clone(),
            _ => "sqlite://./coordinator.db".to_owned(),
        }
    }
}
