//! A coordinator and one region agent per region, each a child process on
//! its own database, talking over loopback exactly as `scripts/cluster`
//! starts them. Each agent reaches the coordinator directly or through a
//! [`Link`] that can make the connection long or break it.
//!
//! A cluster is launched from a [`Plan`], whose databases are the
//! caller's (a test makes its own), or started by [`Cluster::start`] on
//! databases it makes as a [`Storage`] says: a scratch PostgreSQL database
//! per process (dropped when the cluster stops) or a SQLite file per
//! process in a directory. Only the services' flags are used.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::database::ScratchDb;
use crate::link::Link;
use crate::process::{free_addr, Binaries, Env, Launch, ServerProcess, Terminal};
use crate::sale::TailSettings;
use crate::{ADMIN_TOKEN, TENANT, TENANT_KEY};

/// Flags of the coordinator and the agents; a flag left `None` is the
/// service's own default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterFlags {
    /// `--sync-interval-ms` of the agents and the coordinator.
    pub sync_interval_ms: u64,
    /// The agents' `--max-in-flight`.
    pub max_in_flight: Option<u32>,
    /// The agents' `--max-waiting`.
    pub max_waiting: Option<u32>,
    /// The agents' `--wait-timeout-ms`.
    pub wait_timeout_ms: Option<u64>,
    /// `--db-pool-size` of every process (six processes may share one
    /// PostgreSQL).
    pub db_pool_size: Option<u32>,
}

impl ClusterFlags {
    /// Every flag at the services' own default but the sync interval.
    pub fn syncing_every(sync_interval_ms: u64) -> Self {
        Self {
            sync_interval_ms,
            max_in_flight: None,
            max_waiting: None,
            wait_timeout_ms: None,
            db_pool_size: None,
        }
    }
}

/// Who a cluster's processes trust: an admin token, and one tenant with
/// its buyer key. Region `r` speaks to the coordinator with
/// [`region_token`]`(r)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `--admin-token` of every process.
    pub admin_token: String,
    /// The tenant the agents sell for.
    pub tenant: String,
    /// Its buyer API key.
    pub tenant_key: String,
}

impl Default for Credentials {
    /// [`ADMIN_TOKEN`], [`TENANT`] and [`TENANT_KEY`].
    fn default() -> Self {
        Self {
            admin_token: ADMIN_TOKEN.to_owned(),
            tenant: TENANT.to_owned(),
            tenant_key: TENANT_KEY.to_owned(),
        }
    }
}

/// The token region `region` speaks to the coordinator with.
pub fn region_token(region: &str) -> String {
    format!("token-{region}")
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

/// How an agent reaches the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Over plain loopback.
    Direct,
    /// Through a [`Link`] adding `rtt_ms` to every round trip (0: none),
    /// which [`Agent::link`] can break later.
    Link {
        /// The round trip it adds, ms.
        rtt_ms: u64,
    },
}

/// One agent to start.
#[derive(Debug, Clone)]
pub struct AgentPlan {
    /// Its `--region`.
    pub region: String,
    /// Its `--database-url`.
    pub database_url: String,
    /// Its own environment variables.
    pub env: Env,
    /// How it reaches the coordinator.
    pub route: Route,
}

impl AgentPlan {
    /// Region `region` on `database_url`, straight to the coordinator.
    pub fn new(region: &str, database_url: &str) -> Self {
        Self {
            region: region.to_owned(),
            database_url: database_url.to_owned(),
            env: Env::new(),
            route: Route::Direct,
        }
    }
}

/// What a cluster is launched from.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Where the binaries are.
    pub binaries: Binaries,
    /// Who the processes trust.
    pub credentials: Credentials,
    /// Flags of every process.
    pub flags: ClusterFlags,
    /// The coordinator's `--policy` (`None`: its default).
    pub policy: Option<String>,
    /// Where the processes write their logs.
    pub logs: Logs,
    /// The coordinator's `--database-url`.
    pub coordinator_database_url: String,
    /// The coordinator's own environment variables.
    pub coordinator_env: Env,
    /// The agents, in region order.
    pub agents: Vec<AgentPlan>,
}

/// One running agent.
#[derive(Debug)]
pub struct Agent {
    /// Its region.
    pub region: String,
    /// Its process.
    pub process: ServerProcess,
    /// The link it reaches the coordinator through, if any.
    pub link: Option<Link>,
    /// The round trip its link adds, ms (0: none).
    pub rtt_ms: u64,
    /// Its database.
    pub database_url: String,
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

/// Drops the PostgreSQL databases of `databases` (or only closes the
/// connections that made them, unless `drop_postgres`); the first error.
async fn release(databases: Vec<Database>, drop_postgres: bool) -> anyhow::Result<()> {
    let mut first_error = None;
    for db in databases {
        let Database::Postgres(db) = db else { continue };
        if !drop_postgres {
            db.keep().await;
        } else if let Err(e) = db.drop().await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// A coordinator and its agents.
#[derive(Debug)]
pub struct Cluster {
    coordinator: ServerProcess,
    coordinator_database_url: String,
    credentials: Credentials,
    agents: Vec<Agent>,
    databases: Vec<Database>,
    drop_postgres: bool,
}

/// `--flag value` pairs as arguments.
fn args(pairs: &[(&str, String)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(flag, value)| [(*flag).to_owned(), value.clone()])
        .collect()
}

/// `--flag value` where `value` is set.
fn optional(args: &mut Vec<String>, flag: &str, value: Option<impl ToString>) {
    if let Some(value) = value {
        args.extend([flag.to_owned(), value.to_string()]);
    }
}

impl Cluster {
    /// `bench tail`'s and the demo's cluster: creates the databases as
    /// `settings.storage` says and starts the coordinator under `policy`,
    /// then one agent per region (at the distance `settings.distances`
    /// gives it), each ready (`/readyz`), with the default
    /// [`Credentials`]. PostgreSQL databases are named
    /// `{tag}_coordinator` and `{tag}_{region}` (`tag` is `[a-z0-9_]`,
    /// unique on the server); SQLite files and logs `coordinator` and
    /// `region-agent-{region}` ([`process_name`]).
    pub async fn start(
        settings: &TailSettings,
        policy: &str,
        regions: &[String],
        tag: &str,
    ) -> anyhow::Result<Self> {
        let storage = &settings.storage;
        let mut databases = Vec::new();
        let created = async {
            let name = process_name(None);
            databases
                .push(Database::create(&storage.coordinator, tag, "coordinator", &name).await?);
            for region in regions {
                let name = process_name(Some(region));
                databases.push(Database::create(&storage.agents, tag, region, &name).await?);
            }
            anyhow::Ok(())
        }
        .await;
        if let Err(error) = created {
            if let Err(e) = release(databases, storage.drop_postgres).await {
                tracing::warn!(%e, "dropping the databases of a cluster that did not start");
            }
            return Err(error);
        }
        let plan = Plan {
            binaries: settings.binaries.clone(),
            credentials: Credentials::default(),
            flags: settings.cluster,
            policy: Some(policy.to_owned()),
            logs: settings.logs.clone(),
            coordinator_database_url: databases[0].url().to_owned(),
            coordinator_env: Env::new(),
            agents: regions
                .iter()
                .zip(&databases[1..])
                .map(|(region, db)| {
                    // A region at a distance reaches the coordinator
                    // through a link that delays every byte by half its
                    // round trip each way.
                    let rtt_ms = settings.distances.get(region).copied().unwrap_or(0);
                    AgentPlan {
                        route: if rtt_ms > 0 {
                            Route::Link { rtt_ms }
                        } else {
                            Route::Direct
                        },
                        ..AgentPlan::new(region, db.url())
                    }
                })
                .collect(),
        };
        match Self::launch(plan).await {
            Ok(mut cluster) => {
                cluster.databases = databases;
                cluster.drop_postgres = storage.drop_postgres;
                Ok(cluster)
            }
            Err(error) => {
                if let Err(e) = release(databases, storage.drop_postgres).await {
                    tracing::warn!(%e, "dropping the databases of a cluster that did not start");
                }
                Err(error)
            }
        }
    }

    /// Starts the coordinator, then each agent in turn, as `plan` says,
    /// each ready (`/readyz`) before the next; what started is stopped
    /// again if one does not.
    pub async fn launch(plan: Plan) -> anyhow::Result<Self> {
        let terminal = |name: &str| match &plan.logs {
            Logs::Stderr => Terminal::Shared,
            Logs::Dir(dir) => Terminal::Detached {
                log: dir.join(format!("{name}.log")),
            },
        };
        let flags = plan.flags;
        let named = |what: String| match &plan.policy {
            Some(policy) => format!("{what} ({policy})"),
            None => what,
        };
        let addr = free_addr()?;
        let tokens: Vec<String> = plan
            .agents
            .iter()
            .map(|a| format!("{}={}", a.region, region_token(&a.region)))
            .collect();
        let mut coordinator_args = args(&[
            ("--listen", addr.to_string()),
            ("--database-url", plan.coordinator_database_url.clone()),
            ("--admin-token", plan.credentials.admin_token.clone()),
            ("--sync-interval-ms", flags.sync_interval_ms.to_string()),
        ]);
        optional(&mut coordinator_args, "--policy", plan.policy.as_ref());
        optional(&mut coordinator_args, "--db-pool-size", flags.db_pool_size);
        for token in &tokens {
            coordinator_args.extend(["--region-token".to_owned(), token.clone()]);
        }
        let coordinator = ServerProcess::launch(Launch {
            name: named("coordinator".into()),
            program: plan.binaries.coordinator.clone(),
            args: coordinator_args,
            env: plan.coordinator_env.clone(),
            addr,
            terminal: terminal(&process_name(None)),
        })
        .await?;
        let mut cluster = Self {
            coordinator,
            coordinator_database_url: plan.coordinator_database_url.clone(),
            credentials: plan.credentials.clone(),
            agents: Vec::new(),
            databases: Vec::new(),
            drop_postgres: false,
        };
        for agent in &plan.agents {
            let started = async {
                let (link, rtt_ms) = match agent.route {
                    Route::Direct => (None, 0),
                    Route::Link { rtt_ms } => (
                        Some(Link::start(addr, Duration::from_millis(rtt_ms)).await?),
                        rtt_ms,
                    ),
                };
                let coordinator_url = link
                    .as_ref()
                    .map_or(format!("http://{addr}"), |link| link.url());
                let agent_addr = free_addr()?;
                let credentials = &plan.credentials;
                let mut agent_args = args(&[
                    ("--region", agent.region.clone()),
                    ("--listen", agent_addr.to_string()),
                    ("--database-url", agent.database_url.clone()),
                    ("--coordinator-url", coordinator_url),
                    ("--region-token", region_token(&agent.region)),
                    ("--admin-token", credentials.admin_token.clone()),
                    (
                        "--tenant-key",
                        format!("{}={}", credentials.tenant, credentials.tenant_key),
                    ),
                    ("--sync-interval-ms", flags.sync_interval_ms.to_string()),
                ]);
                optional(&mut agent_args, "--max-in-flight", flags.max_in_flight);
                optional(&mut agent_args, "--max-waiting", flags.max_waiting);
                optional(&mut agent_args, "--db-pool-size", flags.db_pool_size);
                optional(&mut agent_args, "--wait-timeout-ms", flags.wait_timeout_ms);
                let process = ServerProcess::launch(Launch {
                    name: named(format!("region-agent {}", agent.region)),
                    program: plan.binaries.agent.clone(),
                    args: agent_args,
                    env: agent.env.clone(),
                    addr: agent_addr,
                    terminal: terminal(&process_name(Some(&agent.region))),
                })
                .await?;
                anyhow::Ok(Agent {
                    region: agent.region.clone(),
                    process,
                    link,
                    rtt_ms,
                    database_url: agent.database_url.clone(),
                })
            }
            .await;
            match started {
                Ok(agent) => cluster.agents.push(agent),
                Err(error) => {
                    if let Err(stop) = cluster.stop().await {
                        tracing::warn!(%stop, "cleaning up a cluster that did not start");
                    }
                    return Err(error);
                }
            }
        }
        Ok(cluster)
    }

    /// Each process's database URL: the coordinator's, then the agents' in
    /// region order.
    pub fn database_urls(&self) -> Vec<String> {
        std::iter::once(self.coordinator_database_url.clone())
            .chain(self.agents.iter().map(|a| a.database_url.clone()))
            .collect()
    }

    /// Who the processes trust.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// The coordinator's address.
    pub fn coordinator_addr(&self) -> SocketAddr {
        self.coordinator.addr
    }

    /// The coordinator's process.
    pub fn coordinator(&self) -> &ServerProcess {
        &self.coordinator
    }

    /// The agents, in region order.
    pub fn agents(&self) -> &[Agent] {
        &self.agents
    }

    /// The agent of `region`, if the cluster has one.
    pub fn agent(&self, region: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.region == region)
    }

    /// The agent of `region`, to restart, if the cluster has one.
    pub fn agent_mut(&mut self, region: &str) -> Option<&mut Agent> {
        self.agents.iter_mut().find(|a| a.region == region)
    }

    /// Each agent's round trip to the coordinator, ms, in region order
    /// (0: loopback).
    pub fn rtt_ms(&self) -> Vec<u64> {
        self.agents.iter().map(|a| a.rtt_ms).collect()
    }

    /// The agents' addresses, in region order.
    pub fn agent_addrs(&self) -> Vec<SocketAddr> {
        self.agents.iter().map(|a| a.process.addr).collect()
    }

    /// Stops every process (SIGTERM, drain), agents first, and drops the
    /// PostgreSQL databases it made if its storage says so.
    pub async fn stop(self) -> anyhow::Result<()> {
        let mut first_error = None;
        for agent in self.agents {
            if let Err(e) = agent.process.stop().await {
                first_error.get_or_insert(e);
            }
            drop(agent.link);
        }
        if let Err(e) = self.coordinator.stop().await {
            first_error.get_or_insert(e);
        }
        if let Err(e) = release(self.databases, self.drop_postgres).await {
            first_error.get_or_insert(e);
        }
        first_error.map_or(Ok(()), Err)
    }
}
