//! The servers of one `bench tail` run (or of the demo): a coordinator and
//! one agent per region, each a child process on its own database, talking
//! over loopback exactly as `scripts/cluster` starts them. Each database is
//! a scratch PostgreSQL database (dropped when the cluster stops) or a
//! SQLite file in a directory, as [`Storage`] says.
//!
//! Only the contract's flags and HTTP API are used: the SKU is created
//! with `PUT /v1/admin/skus/{tenant}/{sku}` on the coordinator, readiness
//! and settling are read from `GET /v1/admin/skus/...`, the final check
//! from `GET /v1/admin/audit`, counters from `/metrics`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use hyper::{Method, StatusCode};
use serde_json::json;

use super::link::Link;
use super::sampler::{self, Origin, SkuView};
use super::shape::{Sale, HOLD_TTL_MS};
use super::{TailSettings, SETTLE_TIMEOUT, SKU};
use crate::client::{self, Bearer};
use crate::database::ScratchDb;
use crate::metrics::{read_text, series_sum};
use crate::process::{free_addr, ServerProcess, Terminal};
use crate::{ADMIN_TOKEN, TENANT, TENANT_KEY};

/// Longest the agents may take to learn of a new SKU and receive their
/// first grants.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A sale starts only once every region reported this long after the SKU
/// was created (its agent has the SKU and its first grants).
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Flags of the coordinator and the agents.
#[derive(Debug, Clone, Copy)]
pub struct ClusterFlags {
    /// `--sync-interval-ms` of the agents and the coordinator.
    pub sync_interval_ms: u64,
    /// The agents' `--max-in-flight`.
    pub max_in_flight: u32,
    /// The agents' `--max-waiting`.
    pub max_waiting: u32,
    /// The agents' `--wait-timeout-ms`, where set (else the agent's default).
    pub wait_timeout_ms: Option<u64>,
    /// `--db-pool-size` of every process (six processes share one PostgreSQL).
    pub db_pool_size: u32,
}

/// Counters read from `/metrics` at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Sum of the agents' `escrow_reservations_total{outcome="HELD"}`.
    pub agent_holds: f64,
    /// The coordinator's `coordinator_takes_total`.
    pub takes: f64,
    /// The coordinator's `coordinator_take_granted_units_total`; `None`
    /// where the coordinator does not export it.
    pub take_granted_units: Option<f64>,
    /// The coordinator's `coordinator_tail_merges_total`.
    pub tail_merges: f64,
    /// Sum of the agents' `escrow_holds_total{path="take"}`: holds decided
    /// in a batch that asked the coordinator (paid a round trip).
    pub take_path_holds: f64,
    /// Sum of the agents' `escrow_holds_total{path="local"}`.
    pub local_path_holds: f64,
}

impl Counters {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            agent_holds: self.agent_holds - earlier.agent_holds,
            takes: self.takes - earlier.takes,
            take_granted_units: self
                .take_granted_units
                .map(|n| n - earlier.take_granted_units.unwrap_or(0.0)),
            tail_merges: self.tail_merges - earlier.tail_merges,
            take_path_holds: self.take_path_holds - earlier.take_path_holds,
            local_path_holds: self.local_path_holds - earlier.local_path_holds,
        }
    }
}

/// The final state after the sale.
#[derive(Debug, Clone)]
pub struct Settled {
    /// The SKU view once every region reported after the last answer.
    pub view: SkuView,
    /// `drift_total` of `GET /v1/admin/audit`.
    pub drift_total: i64,
}

/// What `GET /v1/admin/audit` says about every SKU together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Audit {
    /// `drift_total`: the sum over SKUs of |drift| + |ledger drift|.
    pub drift_total: i64,
    /// `stale_skus`: SKUs with a region whose report is stale.
    pub stale_skus: i64,
}

/// The coordinator's audit now.
pub async fn audit(coordinator: SocketAddr) -> anyhow::Result<Audit> {
    let admin = Bearer::new(ADMIN_TOKEN)?;
    let (status, body) =
        client::once(coordinator, Method::GET, "/v1/admin/audit", &admin, None).await?;
    anyhow::ensure!(status == StatusCode::OK, "audit answered {status}: {body}");
    Ok(Audit {
        drift_total: body["drift_total"]
            .as_i64()
            .context("audit body has drift_total")?,
        stale_skus: body["stale_skus"].as_i64().unwrap_or(0),
    })
}

/// Where one process keeps its database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A database of its own, created on the PostgreSQL server this
    /// superuser URL points at.
    Postgres(String),
    /// A SQLite file of its own in this directory (which must exist).
    Sqlite(PathBuf),
}

/// Where the processes of a cluster keep their databases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    /// The coordinator's.
    pub coordinator: Backend,
    /// Every agent's.
    pub agents: Backend,
    /// Drop the PostgreSQL databases when the cluster stops. SQLite files
    /// are never removed: their directory is the caller's.
    pub drop_postgres: bool,
}

impl Storage {
    /// `bench tail`'s: every process on a scratch database of one
    /// PostgreSQL server, dropped when the cluster stops.
    pub fn scratch(server_url: &str) -> Self {
        Self {
            coordinator: Backend::Postgres(server_url.to_owned()),
            agents: Backend::Postgres(server_url.to_owned()),
            drop_postgres: true,
        }
    }
}

/// Where a cluster's processes write their logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Logs {
    /// On our stderr (the processes share our terminal).
    Stderr,
    /// One file per process in this directory, `NAME.log` (the processes
    /// are detached from our terminal).
    Dir(PathBuf),
}

/// The name of a process's SQLite file and log file: `coordinator`,
/// `region-agent-{region}`.
pub fn process_name(region: Option<&str>) -> String {
    region.map_or("coordinator".into(), |r| format!("region-agent-{r}"))
}

/// A database the cluster made for one process.
#[derive(Debug)]
enum Database {
    Postgres(ScratchDb),
    Sqlite(String),
}

impl Database {
    /// Creates the database of process `name` (`{tag}_{suffix}` on
    /// PostgreSQL, `{name}.db` in SQLite's directory).
    async fn create(
        backend: &Backend,
        tag: &str,
        suffix: &str,
        name: &str,
    ) -> anyhow::Result<Self> {
        Ok(match backend {
            Backend::Postgres(server) => {
                Database::Postgres(ScratchDb::create(server, &format!("{tag}_{suffix}")).await?)
            }
            Backend::Sqlite(dir) => Database::Sqlite(sqlite_url(dir, name)),
        })
    }

    fn url(&self) -> &str {
        match self {
            Database::Postgres(db) => &db.url,
            Database::Sqlite(url) => url,
        }
    }
}

/// `sqlite://` and the absolute path of `{name}.db` in `dir`.
fn sqlite_url(dir: &Path, name: &str) -> String {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    format!("sqlite://{}", dir.join(format!("{name}.db")).display())
}

/// A coordinator and its agents.
#[derive(Debug)]
pub struct Cluster {
    coordinator_addr: SocketAddr,
    coordinator: Option<ServerProcess>,
    agents: Vec<ServerProcess>,
    links: Vec<Link>,
    rtt_ms: Vec<u64>,
    databases: Vec<Database>,
    drop_postgres: bool,
}

fn args(pairs: &[(&str, String)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(flag, value)| [(*flag).to_owned(), value.clone()])
        .collect()
}

impl Cluster {
    /// Creates the databases and starts the coordinator under `policy`,
    /// then one agent per region, each ready (`/readyz`). PostgreSQL
    /// databases are named `{tag}_coordinator` and `{tag}_{region}` (`tag`
    /// is `[a-z0-9_]`, unique on the server); SQLite files and logs
    /// `coordinator` and `region-agent-{region}` ([`process_name`]).
    pub async fn start(
        settings: &TailSettings,
        policy: &str,
        regions: &[String],
        tag: &str,
    ) -> anyhow::Result<Self> {
        let mut cluster = Self {
            coordinator_addr: free_addr()?,
            coordinator: None,
            agents: Vec::new(),
            links: Vec::new(),
            rtt_ms: Vec::new(),
            databases: Vec::new(),
            drop_postgres: settings.storage.drop_postgres,
        };
        match cluster.spawn(settings, policy, regions, tag).await {
            Ok(()) => Ok(cluster),
            Err(error) => {
                if let Err(stop) = cluster.stop().await {
                    tracing::warn!(%stop, "cleaning up a cluster that did not start");
                }
                Err(error)
            }
        }
    }

    async fn spawn(
        &mut self,
        settings: &TailSettings,
        policy: &str,
        regions: &[String],
        tag: &str,
    ) -> anyhow::Result<()> {
        let flags = settings.cluster;
        let storage = &settings.storage;
        let terminal = |name: &str| match &settings.logs {
            Logs::Stderr => Terminal::Shared,
            Logs::Dir(dir) => Terminal::Detached {
                log: dir.join(format!("{name}.log")),
            },
        };
        let name = process_name(None);
        let db = Database::create(&storage.coordinator, tag, "coordinator", &name).await?;
        let addr = self.coordinator_addr;
        let tokens: Vec<String> = regions.iter().map(|r| format!("{r}=token-{r}")).collect();
        let mut coordinator_args = args(&[
            ("--listen", addr.to_string()),
            ("--database-url", db.url().to_owned()),
            ("--admin-token", ADMIN_TOKEN.to_owned()),
            ("--policy", policy.to_owned()),
            ("--sync-interval-ms", flags.sync_interval_ms.to_string()),
            ("--db-pool-size", flags.db_pool_size.to_string()),
        ]);
        for token in &tokens {
            coordinator_args.extend(["--region-token".to_owned(), token.clone()]);
        }
        self.databases.push(db);
        self.coordinator = Some(
            ServerProcess::spawn(
                &format!("coordinator ({policy})"),
                &settings.binaries.coordinator,
                &coordinator_args,
                addr,
                &terminal(&name),
            )
            .await?,
        );
        for region in regions {
            let name = process_name(Some(region));
            let db = Database::create(&storage.agents, tag, region, &name).await?;
            let agent_addr = free_addr()?;
            // A region at a distance reaches the coordinator through a link
            // that delays every byte by half its round trip each way.
            let rtt_ms = settings.distances.get(region).copied().unwrap_or(0);
            self.rtt_ms.push(rtt_ms);
            let coordinator = if rtt_ms > 0 {
                let link = Link::start(addr, Duration::from_millis(rtt_ms)).await?;
                let via = link.addr;
                self.links.push(link);
                via
            } else {
                addr
            };
            let mut agent_args = args(&[
                ("--region", region.clone()),
                ("--listen", agent_addr.to_string()),
                ("--database-url", db.url().to_owned()),
                ("--coordinator-url", format!("http://{coordinator}")),
                ("--region-token", format!("token-{region}")),
                ("--admin-token", ADMIN_TOKEN.to_owned()),
                ("--tenant-key", format!("{TENANT}={TENANT_KEY}")),
                ("--sync-interval-ms", flags.sync_interval_ms.to_string()),
                ("--max-in-flight", flags.max_in_flight.to_string()),
                ("--max-waiting", flags.max_waiting.to_string()),
                ("--db-pool-size", flags.db_pool_size.to_string()),
            ]);
            if let Some(ms) = flags.wait_timeout_ms {
                agent_args.extend(["--wait-timeout-ms".to_owned(), ms.to_string()]);
            }
            self.databases.push(db);
            let agent = ServerProcess::spawn(
                &format!("region-agent {region} ({policy})"),
                &settings.binaries.agent,
                &agent_args,
                agent_addr,
                &terminal(&name),
            )
            .await?;
            self.agents.push(agent);
        }
        Ok(())
    }

    /// Each process's database URL: the coordinator's, then the agents' in
    /// region order.
    pub fn database_urls(&self) -> Vec<String> {
        self.databases.iter().map(|d| d.url().to_owned()).collect()
    }

    /// The coordinator's address.
    pub fn coordinator_addr(&self) -> SocketAddr {
        self.coordinator_addr
    }

    /// Each agent's round trip to the coordinator, ms, in region order
    /// (0: loopback).
    pub fn rtt_ms(&self) -> &[u64] {
        &self.rtt_ms
    }

    /// The agents' addresses, in region order.
    pub fn agent_addrs(&self) -> Vec<SocketAddr> {
        self.agents.iter().map(|a| a.addr).collect()
    }

    /// Creates the SKU on the coordinator with the sale's regions and weights.
    pub async fn put_sku(&self, sale: &Sale) -> anyhow::Result<()> {
        let admin = Bearer::new(ADMIN_TOKEN)?;
        let path = format!("/v1/admin/skus/{TENANT}/{SKU}");
        let weights: serde_json::Map<String, serde_json::Value> = sale
            .regions
            .iter()
            .map(|r| (r.name.clone(), json!(r.weight)))
            .collect();
        let body = json!({
            "total": sale.units,
            "regions": weights,
            "max_per_user": sale.max_per_user,
            "hold_ttl_ms": HOLD_TTL_MS,
        });
        let (status, answer) = client::once(
            self.coordinator_addr,
            Method::PUT,
            &path,
            &admin,
            Some(body),
        )
        .await?;
        anyhow::ensure!(
            status.is_success(),
            "PUT {path} answered {status}: {answer}"
        );
        Ok(())
    }

    /// Waits until every region reported the SKU after it was created,
    /// nothing is in transit, and every agent's buyer API knows it.
    pub async fn wait_sku_ready(&self, sale: &Sale) -> anyhow::Result<()> {
        let origin = Origin::now();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let view = sampler::sku_view(self.coordinator_addr, origin).await;
            if let Ok(view) = &view {
                if view.regions.len() == sale.regions.len()
                    && view.reports_from_us.is_some_and(|t| t >= 0)
                    && view.in_transit == 0
                    && self.agents_know_sku().await
                {
                    return Ok(());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the agents were not ready to sell within {READY_TIMEOUT:?}: {view:?}"
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn agents_know_sku(&self) -> bool {
        let Ok(bearer) = Bearer::new(TENANT_KEY) else {
            return false;
        };
        for agent in &self.agents {
            let path = format!("/v1/skus/{SKU}");
            match client::once(agent.addr, Method::GET, &path, &bearer, None).await {
                Ok((StatusCode::OK, _)) => {}
                _ => return false,
            }
        }
        true
    }

    /// Waits until every region reported after `last_answer_us` (plus the
    /// report lag margin), nothing is in transit and the view shows no
    /// drift; then reads the audit.
    pub async fn settle(&self, origin: Origin, last_answer_us: i64) -> anyhow::Result<Settled> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let after = last_answer_us + sampler::REPORT_LAG_MARGIN_US;
        let view = loop {
            let view = sampler::sku_view(self.coordinator_addr, origin).await;
            if let Ok(view) = &view {
                if view.reports_from_us.is_some_and(|t| t >= after)
                    && view.in_transit == 0
                    && view.drift == 0
                {
                    break view.clone();
                }
            }
            if Instant::now() >= deadline {
                // Report what there is: the table shows the drift.
                tracing::warn!(?view, "regions did not settle within {SETTLE_TIMEOUT:?}");
                break view.context("reading the SKU view after the sale")?;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        };
        let drift_total = audit(self.coordinator_addr).await?.drift_total;
        Ok(Settled { view, drift_total })
    }

    /// The counters of every process now.
    pub async fn counters(&self) -> anyhow::Result<Counters> {
        let text = read_text(self.coordinator_addr).await?;
        let mut counters = Counters {
            takes: series_sum(&text, "coordinator_takes_total", None).unwrap_or(0.0),
            // Registered with the first take: absent before it, present
            // (from 0) once the coordinator exports it.
            take_granted_units: series_sum(&text, "coordinator_take_granted_units_total", None),
            tail_merges: series_sum(&text, "coordinator_tail_merges_total", None).unwrap_or(0.0),
            agent_holds: 0.0,
            take_path_holds: 0.0,
            local_path_holds: 0.0,
        };
        if counters.take_granted_units.is_none() && counters.takes == 0.0 {
            counters.take_granted_units = Some(0.0);
        }
        for agent in &self.agents {
            let text = read_text(agent.addr).await?;
            counters.agent_holds += series_sum(
                &text,
                "escrow_reservations_total",
                Some(("outcome", "HELD")),
            )
            .unwrap_or(0.0);
            let path =
                |p| series_sum(&text, "escrow_holds_total", Some(("path", p))).unwrap_or(0.0);
            counters.take_path_holds += path("take");
            counters.local_path_holds += path("local");
        }
        Ok(counters)
    }

    /// Stops every process (SIGTERM, drain), agents first, and drops the
    /// PostgreSQL databases if the storage says so.
    pub async fn stop(self) -> anyhow::Result<()> {
        let mut first_error = None;
        for agent in self.agents {
            if let Err(e) = agent.stop().await {
                first_error.get_or_insert(e);
            }
        }
        drop(self.links);
        if let Some(coordinator) = self.coordinator {
            if let Err(e) = coordinator.stop().await {
                first_error.get_or_insert(e);
            }
        }
        for db in self.databases {
            let Database::Postgres(db) = db else { continue };
            if !self.drop_postgres {
                db.keep().await;
            } else if let Err(e) = db.drop().await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
