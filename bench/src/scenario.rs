//! The runs the `bench` command performs, each against fresh servers.
//!
//! [`compare`] is the side-by-side table: the HTTP ceiling, the naive
//! baseline and the agent (hot SKU, sold-out path, 100 SKUs, confirm and
//! release mix), each a separate process on loopback, the two storing
//! servers on their own scratch databases of the same PostgreSQL; then the
//! agent again on its embedded SQLite backend (hot SKU, sold-out path, 100
//! SKUs), on a scratch file, durable the same way (WAL synced at commit).
//! [`sweep_batch`] and [`sweep_clients`] show how the agent's throughput
//! moves with its batch bound (`--max-in-flight`) and with the number of
//! concurrent buyers.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use hyper::{Method, StatusCode};
use serde_json::json;

use crate::client::{self, Bearer};
use crate::database::{ScratchDb, ScratchFile};
use crate::interference::Watch;
use crate::load::{self, LoadReport, LoadSpec, Workload};
use crate::metrics::CommitCounters;
use crate::outcome::Outcome;
use crate::process::{free_addr, Binaries, ServerProcess};
use crate::{ADMIN_TOKEN, TENANT, TENANT_KEY};

/// Units of the hot SKU: far more than any run on this machine sells, so
/// the hot phase measures selling, never selling out.
pub const HOT_STOCK: u64 = 100_000_000;
/// Units of the SKU the sold-out phase sells out during its warm-up.
pub const SOLD_OUT_STOCK: u64 = 1_000;
/// SKUs in the multi-SKU phase.
pub const MULTI_SKUS: usize = 100;
/// Units of each SKU in the multi-SKU phase.
pub const MULTI_STOCK: u64 = 10_000_000;
/// Warm SKUs beside the hot one in the whole-drop phase.
pub const DROP_WARM_SKUS: usize = 99;

/// The region agent's flags that shape its hot path.
#[derive(Debug, Clone, Copy)]
pub struct AgentFlags {
    /// `--max-in-flight`: most requests one SKU owner commits per transaction.
    pub max_in_flight: u32,
    /// `--db-pool-size`.
    pub db_pool_size: u32,
    /// `--max-waiting`: most requests queued per SKU owner.
    pub max_waiting: u32,
}

impl AgentFlags {
    /// The flags as the agent's command line.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--max-in-flight".into(),
            self.max_in_flight.to_string(),
            "--db-pool-size".into(),
            self.db_pool_size.to_string(),
            "--max-waiting".into(),
            self.max_waiting.to_string(),
        ]
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A superuser URL of the PostgreSQL to use (scratch databases are made there).
    pub database_url: String,
    /// Concurrent buyers.
    pub clients: usize,
    /// Warm-up before each measurement window.
    pub warmup: Duration,
    /// Each measurement window of the comparison.
    pub measure: Duration,
    /// Each measurement window of the sweeps.
    pub sweep_measure: Duration,
    /// The agent's flags.
    pub agent: AgentFlags,
    /// The naive server's connection pool.
    pub naive_pool_size: u32,
    /// Where the server binaries are.
    pub binaries: Binaries,
}

/// Where an agent under test stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentBackend {
    /// A scratch database on the run's PostgreSQL.
    Postgres,
    /// A scratch SQLite file.
    Sqlite,
}

/// A server under test and its scratch database or file.
struct Target {
    process: ServerProcess,
    db: Option<ScratchDb>,
    file: Option<ScratchFile>,
}

impl Target {
    fn addr(&self) -> SocketAddr {
        self.process.addr
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.process.stop().await?;
        if let Some(db) = self.db {
            db.drop().await?;
        }
        if let Some(file) = self.file {
            file.remove()?;
        }
        Ok(())
    }
}

fn db_name(kind: &str, tag: &str) -> String {
    format!("bench_{kind}_{}_{tag}", std::process::id())
}

async fn start_agent(
    settings: &Settings,
    flags: AgentFlags,
    backend: AgentBackend,
    tag: &str,
) -> anyhow::Result<Target> {
    start_agent_with(settings, flags, backend, tag, &[]).await
}

/// [`start_agent`] with `extra` flags (a coordinator to sell through).
async fn start_agent_with(
    settings: &Settings,
    flags: AgentFlags,
    backend: AgentBackend,
    tag: &str,
    extra: &[String],
) -> anyhow::Result<Target> {
    let (db, file, url) = match backend {
        AgentBackend::Postgres => {
            let db = ScratchDb::create(&settings.database_url, &db_name("agent", tag)).await?;
            let url = db.url.clone();
            (Some(db), None, url)
        }
        AgentBackend::Sqlite => {
            let file = ScratchFile::create(&db_name("agent", tag))?;
            let url = file.url.clone();
            (None, Some(file), url)
        }
    };
    let addr = free_addr()?;
    let mut args: Vec<String> = [
        "--region",
        "eu",
        "--listen",
        &addr.to_string(),
        "--database-url",
        &url,
        "--admin-token",
        ADMIN_TOKEN,
        "--tenant-key",
        &format!("{TENANT}={TENANT_KEY}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(flags.args());
    args.extend_from_slice(extra);
    let name = format!("region-agent ({tag})");
    let process = ServerProcess::start(&name, &settings.binaries.agent, &args, addr).await?;
    Ok(Target { process, db, file })
}

async fn start_naive(settings: &Settings, tag: &str) -> anyhow::Result<Target> {
    let db = ScratchDb::create(&settings.database_url, &db_name("naive", tag)).await?;
    let addr = free_addr()?;
    let args = vec![
        "--mode".into(),
        "naive".into(),
        "--listen".into(),
        addr.to_string(),
        "--database-url".into(),
        db.url.clone(),
        "--db-pool-size".into(),
        settings.naive_pool_size.to_string(),
    ];
    let process = ServerProcess::start("naive", &settings.binaries.server, &args, addr).await?;
    Ok(Target {
        process,
        db: Some(db),
        file: None,
    })
}

async fn start_ceiling(settings: &Settings) -> anyhow::Result<Target> {
    let addr = free_addr()?;
    let args = vec![
        "--mode".into(),
        "ceiling".into(),
        "--listen".into(),
        addr.to_string(),
    ];
    let process = ServerProcess::start("ceiling", &settings.binaries.server, &args, addr).await?;
    Ok(Target {
        process,
        db: None,
        file: None,
    })
}

/// Creates (or resets) a SKU through the admin API.
pub async fn put_sku(addr: SocketAddr, sku: &str, total: u64) -> anyhow::Result<()> {
    let admin = Bearer::new(ADMIN_TOKEN)?;
    let path = format!("/v1/admin/skus/{TENANT}/{sku}");
    let (status, body) = client::once(
        addr,
        Method::PUT,
        &path,
        &admin,
        Some(json!({"total": total})),
    )
    .await?;
    anyhow::ensure!(status.is_success(), "PUT {path} answered {status}: {body}");
    Ok(())
}

/// The agent's audit: the sum of |drift| over every SKU (must be 0).
pub async fn audit_drift(addr: SocketAddr) -> anyhow::Result<i64> {
    let admin = Bearer::new(ADMIN_TOKEN)?;
    let (status, body) = client::once(addr, Method::GET, "/v1/admin/audit", &admin, None).await?;
    anyhow::ensure!(status == StatusCode::OK, "audit answered {status}: {body}");
    body["drift_total"]
        .as_i64()
        .context("audit body has drift_total")
}

fn spec(
    settings: &Settings,
    addr: SocketAddr,
    clients: usize,
    measure: Duration,
    workload: Workload,
    run_id: &str,
) -> LoadSpec {
    LoadSpec {
        addr,
        token: TENANT_KEY.into(),
        clients,
        warmup: settings.warmup,
        measure,
        loops_per_client: None,
        workload,
        run_id: run_id.into(),
    }
}

/// Runs `spec`, noting how much of the machine other processes used meanwhile.
async fn watched_load(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let watch = Watch::start();
    let report = load::run(spec).await;
    let others = watch.stop();
    let mut report = report?;
    report.others_share = Some(others.foreign_share(cores));
    Ok(report)
}

/// Runs `spec` against an agent, with its commit counters over the run.
async fn agent_load(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    let addr = spec.addr;
    let before = CommitCounters::read(addr).await?;
    let mut report = watched_load(spec).await?;
    let after = CommitCounters::read(addr).await?;
    report.commits = Some(after.since(&before));
    Ok(report)
}

fn hot(sku: &str) -> Workload {
    Workload::Reserve {
        skus: vec![sku.to_owned()],
    }
}

/// The side-by-side comparison.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The HTTP ceiling's 201s.
    pub ceiling: LoadReport,
    /// The naive server's holds on one hot SKU.
    pub naive: LoadReport,
    /// The agent's holds on one hot SKU.
    pub agent_hot: LoadReport,
    /// The agent's answers on a sold-out SKU.
    pub agent_sold_out: LoadReport,
    /// The agent's holds over 100 SKUs.
    pub agent_multi: LoadReport,
    /// The agent's reserve-then-confirm-or-release loop.
    pub agent_mix: LoadReport,
    /// The agent's whole drop: one hot SKU and 99 warm, holds settled or kept.
    pub agent_drop: LoadReport,
    /// The agent's answers on the same SKUs once the drop is closed.
    pub agent_drop_storm: LoadReport,
    /// The agent's audit after all phases.
    pub drift_total: i64,
    /// An agent selling through a coordinator, its hot SKU in escrow mode.
    pub coordinated_escrow: LoadReport,
    /// The same agent, its hot SKU in central mode (every batch takes).
    pub coordinated_central: LoadReport,
    /// The coordinator's audit after both.
    pub coordinated_drift_total: i64,
    /// The agent on SQLite: answers on a sold-out SKU.
    pub sqlite_sold_out: LoadReport,
    /// The agent on SQLite: holds on one hot SKU.
    pub sqlite_hot: LoadReport,
    /// The agent on SQLite: holds over 100 SKUs.
    pub sqlite_multi: LoadReport,
    /// The SQLite agent's audit after its phases.
    pub sqlite_drift_total: i64,
}

/// The agent's runs of one backend: sold-out path, hot SKU, 100 SKUs.
struct AgentPhases {
    sold_out: LoadReport,
    hot: LoadReport,
    multi: LoadReport,
}

/// Creates the phases' SKUs on the agent at `addr`: `hot`, `gone` (sold
/// out in the warm-up), `mix` and the 100 SKUs, whose names it returns.
async fn agent_skus(addr: SocketAddr) -> anyhow::Result<Vec<String>> {
    put_sku(addr, "hot", HOT_STOCK).await?;
    put_sku(addr, "gone", SOLD_OUT_STOCK).await?;
    put_sku(addr, "mix", HOT_STOCK).await?;
    let multi: Vec<String> = (0..MULTI_SKUS).map(|i| format!("m{i:03}")).collect();
    for sku in &multi {
        put_sku(addr, sku, MULTI_STOCK).await?;
    }
    Ok(multi)
}

/// Runs the sold-out, hot and 100-SKU phases on the agent at `addr`.
async fn agent_phases(
    settings: &Settings,
    addr: SocketAddr,
    multi: Vec<String>,
    label: &str,
) -> anyhow::Result<AgentPhases> {
    let (clients, measure) = (settings.clients, settings.measure);
    // Sold out first: no earlier phase's rows for autovacuum to chew on meanwhile.
    eprintln!("bench: {label}, sold out ...");
    let sold_out = agent_load(spec(settings, addr, clients, measure, hot("gone"), "s")).await?;
    eprintln!("bench: {label}, hot SKU ...");
    let hot = agent_load(spec(settings, addr, clients, measure, hot("hot"), "h")).await?;
    eprintln!("bench: {label}, {MULTI_SKUS} SKUs ...");
    let multi = agent_load(spec(
        settings,
        addr,
        clients,
        measure,
        Workload::Reserve { skus: multi },
        "m",
    ))
    .await?;
    Ok(AgentPhases {
        sold_out,
        hot,
        multi,
    })
}

/// Runs the comparison: ceiling, naive, then the agent's phases (sold
/// out, hot SKU, 100 SKUs, mix) on one agent process.
pub async fn compare(settings: &Settings) -> anyhow::Result<Comparison> {
    let clients = settings.clients;
    let measure = settings.measure;

    eprintln!("bench: HTTP ceiling ...");
    let ceiling = start_ceiling(settings).await?;
    put_sku(ceiling.addr(), "hot", HOT_STOCK).await?;
    let ceiling_report = watched_load(spec(
        settings,
        ceiling.addr(),
        clients,
        measure,
        hot("hot"),
        "c",
    ))
    .await?;
    ceiling.stop().await?;

    eprintln!("bench: naive baseline ...");
    let naive = start_naive(settings, "cmp").await?;
    put_sku(naive.addr(), "hot", HOT_STOCK).await?;
    let naive_report = watched_load(spec(
        settings,
        naive.addr(),
        clients,
        measure,
        hot("hot"),
        "n",
    ))
    .await?;
    naive.stop().await?;

    eprintln!("bench: region agent ...");
    let agent = start_agent(settings, settings.agent, AgentBackend::Postgres, "cmp").await?;
    let addr = agent.addr();
    let multi = agent_skus(addr).await?;
    let pg = agent_phases(settings, addr, multi, "agent").await?;
    eprintln!("bench: agent, confirm/release mix ...");
    let agent_mix = agent_load(spec(
        settings,
        addr,
        clients,
        measure,
        Workload::Settle { sku: "mix".into() },
        "x",
    ))
    .await?;
    let (agent_drop, agent_drop_storm) = whole_drop(settings, addr).await?;
    let drift_total = audit_drift(addr).await?;
    agent.stop().await?;

    let (coordinated_escrow, coordinated_central, coordinated_drift_total) =
        coordinated(settings).await?;

    eprintln!("bench: region agent on SQLite ...");
    let agent = start_agent(settings, settings.agent, AgentBackend::Sqlite, "lite").await?;
    let addr = agent.addr();
    let multi = agent_skus(addr).await?;
    let lite = agent_phases(settings, addr, multi, "agent on SQLite").await?;
    let sqlite_drift_total = audit_drift(addr).await?;
    agent.stop().await?;

    Ok(Comparison {
        ceiling: ceiling_report,
        naive: naive_report,
        agent_hot: pg.hot,
        agent_sold_out: pg.sold_out,
        agent_multi: pg.multi,
        agent_mix,
        agent_drop,
        agent_drop_storm,
        drift_total,
        coordinated_escrow,
        coordinated_central,
        coordinated_drift_total,
        sqlite_sold_out: lite.sold_out,
        sqlite_hot: lite.hot,
        sqlite_multi: lite.multi,
        sqlite_drift_total,
    })
}

/// An agent selling through a real coordinator, both on scratch
/// databases: a hot SKU in escrow mode (the default policy: the region
/// sells its quota locally), then one in central mode (every unit stays in
/// the coordinator's pool: each batch takes what it sells). Returns both
/// runs and the coordinator's audit afterwards.
async fn coordinated(settings: &Settings) -> anyhow::Result<(LoadReport, LoadReport, i64)> {
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

/// The whole drop on the agent at `addr`: the sale over one hot SKU and
/// [`DROP_WARM_SKUS`] warm ones, then a sold-out storm on the same SKUs
/// once an admin has closed them.
async fn whole_drop(
    settings: &Settings,
    addr: SocketAddr,
) -> anyhow::Result<(LoadReport, LoadReport)> {
    let (clients, measure) = (settings.clients, settings.measure);
    put_sku(addr, "drop", HOT_STOCK).await?;
    let warm: Vec<String> = (0..DROP_WARM_SKUS).map(|i| format!("w{i:02}")).collect();
    for sku in &warm {
        put_sku(addr, sku, MULTI_STOCK).await?;
    }
    eprintln!("bench: agent, whole drop ...");
    let workload = Workload::Drop {
        hot: "drop".into(),
        warm: warm.clone(),
    };
    let sale = agent_load(spec(settings, addr, clients, measure, workload, "d")).await?;
    let mut skus = warm;
    skus.push("drop".into());
    for sku in &skus {
        close_sku(addr, sku).await?;
    }
    eprintln!("bench: agent, whole drop, sold-out storm ...");
    let storm = Workload::Reserve { skus };
    let storm = agent_load(spec(settings, addr, clients, measure, storm, "ds")).await?;
    Ok((sale, storm))
}

/// Cuts a SKU's total on the agent at `addr` to what is held or sold:
/// nothing is left to sell.
async fn close_sku(addr: SocketAddr, sku: &str) -> anyhow::Result<()> {
    let admin = Bearer::new(ADMIN_TOKEN)?;
    let path = format!("/v1/admin/skus/{TENANT}/{sku}");
    let (status, body) = client::once(addr, Method::GET, &path, &admin, None).await?;
    anyhow::ensure!(
        status == StatusCode::OK,
        "GET {path} answered {status}: {body}"
    );
    let units = |field: &str| {
        body[field]
            .as_u64()
            .with_context(|| format!("{path}: {field}"))
    };
    put_sku(addr, sku, units("held")? + units("sold")?).await
}

/// The agent alone on one hot SKU: the phase to profile.
pub async fn hot_only(settings: &Settings) -> anyhow::Result<LoadReport> {
    let agent = start_agent(settings, settings.agent, AgentBackend::Postgres, "hot").await?;
    put_sku(agent.addr(), "hot", HOT_STOCK).await?;
    eprintln!(
        "bench: agent pid {}, hot SKU ...",
        agent.process.pid().unwrap_or(0)
    );
    let report = agent_load(spec(
        settings,
        agent.addr(),
        settings.clients,
        settings.measure,
        hot("hot"),
        "h",
    ))
    .await?;
    agent.stop().await?;
    Ok(report)
}

/// One point of a sweep.
#[derive(Debug, Clone)]
pub struct SweepPoint {
    /// The swept value (batch bound or clients).
    pub value: u64,
    /// The agent on one hot SKU.
    pub agent: LoadReport,
    /// The naive server on one hot SKU, where the sweep runs it.
    pub naive: Option<LoadReport>,
}

/// Batch bounds the batch sweep tries.
pub const SWEEP_MAX_IN_FLIGHT: [u32; 5] = [1, 4, 16, 64, 256];
/// Client counts the client sweep tries.
pub const SWEEP_CLIENTS: [usize; 5] = [1, 16, 64, 256, 1024];

/// Agent hot-SKU throughput for each `--max-in-flight` in [`SWEEP_MAX_IN_FLIGHT`].
pub async fn sweep_batch(settings: &Settings) -> anyhow::Result<Vec<SweepPoint>> {
    let mut points = Vec::new();
    for max_in_flight in SWEEP_MAX_IN_FLIGHT {
        eprintln!("bench: sweep, --max-in-flight {max_in_flight} ...");
        let flags = AgentFlags {
            max_in_flight,
            ..settings.agent
        };
        let agent = start_agent(
            settings,
            flags,
            AgentBackend::Postgres,
            &format!("b{max_in_flight}"),
        )
        .await?;
        put_sku(agent.addr(), "hot", HOT_STOCK).await?;
        let report = agent_load(spec(
            settings,
            agent.addr(),
            settings.clients,
            settings.sweep_measure,
            hot("hot"),
            "b",
        ))
        .await?;
        agent.stop().await?;
        points.push(SweepPoint {
            value: u64::from(max_in_flight),
            agent: report,
            naive: None,
        });
    }
    Ok(points)
}

/// Agent and naive hot-SKU throughput for each client count in [`SWEEP_CLIENTS`].
pub async fn sweep_clients(settings: &Settings) -> anyhow::Result<Vec<SweepPoint>> {
    let agent = start_agent(settings, settings.agent, AgentBackend::Postgres, "clients").await?;
    let naive = start_naive(settings, "clients").await?;
    let mut points = Vec::new();
    for clients in SWEEP_CLIENTS {
        eprintln!("bench: sweep, {clients} clients ...");
        // A fresh SKU per point, so every point starts from an idle owner.
        let sku = format!("hot{clients}");
        put_sku(agent.addr(), &sku, HOT_STOCK).await?;
        put_sku(naive.addr(), &sku, HOT_STOCK).await?;
        let run_id = format!("k{clients}");
        let agent_report = agent_load(spec(
            settings,
            agent.addr(),
            clients,
            settings.sweep_measure,
            hot(&sku),
            &run_id,
        ))
        .await?;
        let naive_report = watched_load(spec(
            settings,
            naive.addr(),
            clients,
            settings.sweep_measure,
            hot(&sku),
            &run_id,
        ))
        .await?;
        points.push(SweepPoint {
            value: clients as u64,
            agent: agent_report,
            naive: Some(naive_report),
        });
    }
    agent.stop().await?;
    naive.stop().await?;
    Ok(points)
}

/// Outcomes that count as a sale in a hot or multi-SKU phase.
pub const SALES: [Outcome; 1] = [Outcome::Held];
/// Outcomes that count as a rejection in the sold-out phase.
pub const REJECTIONS: [Outcome; 1] = [Outcome::SoldOut];
/// Outcomes that count as a settled hold in the mix.
pub const SETTLES: [Outcome; 2] = [Outcome::Confirmed, Outcome::Released];
