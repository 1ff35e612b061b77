//! Command-line flags, each also read from the environment.

use std::net::SocketAddr;

use clap::Parser;
use escrow_core::{RegionName, Tenant};

use crate::auth::parse_tenant_key;

/// Sells one region's quota to buyers.
#[derive(Debug, Parser)]
#[command(name = "region-agent", version)]
pub struct Config {
    /// The region served, `[a-z0-9-]{1,32}`.
    #[arg(long, env = "REGION", value_parser = |s: &str| RegionName::parse(s).map_err(|e| e.to_string()))]
    pub region: RegionName,
    /// Address to listen on.
    #[arg(long, env = "AGENT_LISTEN", default_value = "127.0.0.1:7100")]
    pub listen: SocketAddr,
    /// The agent's own database: `postgres://...` (the production choice)
    /// or `sqlite://PATH` (an embedded file, created if missing). Without
    /// it, the SQLite file `./region-agent-<region>.db`.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// The coordinator; absent means standalone (this agent owns the whole total).
    #[arg(long, env = "COORDINATOR_URL")]
    pub coordinator_url: Option<String>,
    /// This region's credential at the coordinator.
    #[arg(long, env = "ESCROW_REGION_TOKEN", hide_env_values = true)]
    pub region_token: Option<String>,
    /// Bearer token for /v1/admin/*.
    #[arg(long, env = "ESCROW_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Buyer API keys, `TENANT=KEY`, repeatable.
    #[arg(long = "tenant-key", env = "ESCROW_TENANT_KEYS", value_delimiter = ',', hide_env_values = true,
          value_parser = parse_tenant_key)]
    pub tenant_keys: Vec<(Tenant, String)>,
    /// Most requests one SKU owner commits in one transaction (its requests in flight to the database).
    #[arg(long, env = "AGENT_MAX_IN_FLIGHT", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_in_flight: u32,
    /// Most requests waiting in one SKU owner's queue; beyond it, 503 REJECTED_QUEUE_FULL.
    #[arg(long, env = "AGENT_MAX_WAITING", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_waiting: u32,
    /// Longest a request may wait in the queue; beyond it, 503 REJECTED_WAIT_TIMEOUT.
    #[arg(long, env = "AGENT_WAIT_TIMEOUT_MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub wait_timeout_ms: u64,
    /// How often to sync with the coordinator, ms.
    #[arg(long, env = "AGENT_SYNC_INTERVAL_MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub sync_interval_ms: u64,
    /// Database connections in the pool (on SQLite: readers beside the one writer).
    #[arg(long, env = "AGENT_DB_POOL_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub db_pool_size: u32,
    /// Idempotency window, seconds: request keys stay in memory for one to
    /// two windows after their reservation was created; a retry after that
    /// is answered from the database.
    #[arg(long, env = "AGENT_IDEMPOTENCY_WINDOW_S", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    pub idempotency_window_s: u64,
    /// Request keys the fixed-size filter of every key ever committed holds
    /// at a 1% false positive rate (about 1.2 bytes each); beyond it, more
    /// new buyers on a sold-out SKU cost one database read.
    #[arg(long, env = "AGENT_KEY_FILTER_CAPACITY", default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1_000..=1_000_000_000))]
    pub key_filter_capacity: u64,
}

impl Config {
    /// The database URL given, or the default SQLite file of this region.
    pub fn database_url(&self) -> String {
        match &self.database_url {
            Some(url) if !url.is_empty() => url.clone(),
            _ => format!("sqlite://./region-agent-{}.db", self.region),
        }
    }
}
