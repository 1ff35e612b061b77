//! The side-by-side comparison: the HTTP ceiling, the naive baseline,
//! the agent's phases on PostgreSQL (with the whole drop) and on SQLite;
//! and the agent's hot phase alone, to profile.

use std::net::SocketAddr;

use anyhow::Context;
use harness::client::{self, Bearer};
use harness::{ADMIN_TOKEN, TENANT};
use hyper::{Method, StatusCode};

use crate::interference::cpu_seconds_of;
use crate::load::{LoadReport, Workload};

use super::coordinated::coordinated;
use super::limit::{database_limit, DatabaseLimit};
use super::servers::{start_agent, start_ceiling, start_naive};
use super::standby::{standby_phases, StandbyPhases};
use super::{
    agent_load, audit_drift, hot, put_sku, spec, watched_load, AgentBackend, Settings,
    DROP_WARM_SKUS, HOT_STOCK, MULTI_SKUS, MULTI_STOCK, SOLD_OUT_STOCK,
};

/// The side-by-side comparison.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The HTTP ceiling's 201s.
    pub ceiling: LoadReport,
    /// CPU seconds the ceiling's server used over its run (warm-up included).
    pub ceiling_cpu_s: f64,
    /// The database's rate at the agent's group commit, without HTTP.
    pub limit: DatabaseLimit,
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
    /// The agent's carts of [`CART_SKUS`] SKUs, one unit each, kept.
    pub agent_carts: LoadReport,
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
    /// The agent on a database with a synchronous standby, or why not.
    pub standby: Result<StandbyPhases, String>,
}

/// The agent's runs of one backend: sold-out path, hot SKU, 100 SKUs.
struct AgentPhases {
    sold_out: LoadReport,
    hot: LoadReport,
    multi: LoadReport,
}

/// Items in each cart of the cart phase.
pub const CART_SKUS: usize = 3;

/// The SKUs of the cart phase.
fn cart_skus() -> Vec<String> {
    (0..CART_SKUS).map(|i| format!("cart-{i}")).collect()
}

/// Creates the phases' SKUs on the agent at `addr`: `hot`, `gone` (sold
/// out in the warm-up), `mix`, the carts' and the 100 SKUs, whose names
/// it returns.
async fn agent_skus(addr: SocketAddr) -> anyhow::Result<Vec<String>> {
    put_sku(addr, "hot", HOT_STOCK).await?;
    put_sku(addr, "gone", SOLD_OUT_STOCK).await?;
    put_sku(addr, "mix", HOT_STOCK).await?;
    for sku in cart_skus() {
        put_sku(addr, &sku, HOT_STOCK).await?;
    }
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
    let ceiling_cpu_before = cpu_seconds_of("bench-server");
    let ceiling_report = watched_load(spec(
        settings,
        ceiling.addr(),
        clients,
        measure,
        hot("hot"),
        "c",
    ))
    .await?;
    let ceiling_cpu_s = cpu_seconds_of("bench-server") - ceiling_cpu_before;
    ceiling.stop().await?;

    eprintln!("bench: the database at the agent's commit, without HTTP ...");
    let limit = database_limit(settings).await?;

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
    eprintln!("bench: agent, carts of {CART_SKUS} SKUs ...");
    let agent_carts = agent_load(spec(
        settings,
        addr,
        clients,
        measure,
        Workload::Cart { skus: cart_skus() },
        "k",
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

    let standby = if !settings.standby {
        Err("not run (--no-standby)".to_owned())
    } else if !harness::ha_region::Formation::installed() {
        Err("not run: pg_autoctl is missing (apt-get install postgresql-15-auto-failover pg-auto-failover-cli)".to_owned())
    } else {
        Ok(standby_phases(settings).await?)
    };

    Ok(Comparison {
        ceiling: ceiling_report,
        ceiling_cpu_s,
        limit,
        naive: naive_report,
        agent_hot: pg.hot,
        agent_sold_out: pg.sold_out,
        agent_multi: pg.multi,
        agent_mix,
        agent_carts,
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
        standby,
    })
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

/// The agent alone on one hot SKU, on PostgreSQL or (`sqlite`) SQLite: the phase to profile.
pub async fn hot_only(settings: &Settings, sqlite: bool) -> anyhow::Result<LoadReport> {
    let backend = if sqlite {
        AgentBackend::Sqlite
    } else {
        AgentBackend::Postgres
    };
    let agent = start_agent(settings, settings.agent, backend, "hot").await?;
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
