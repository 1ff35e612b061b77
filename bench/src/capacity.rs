//! How many regions and SKUs one coordinator serves.
//!
//! Starts the real `coordinator` on a scratch PostgreSQL database with R
//! region tokens, creates S SKUs spread over every region (escrow mode,
//! the default policy) and C more in central mode, and then plays R region
//! agents itself, speaking the real protocol over HTTP as the real agent
//! does: each agent's first sync is full (every SKU), its second
//! acknowledges the grants the first brought back, and from then on it
//! sells one unit of K of its escrow SKUs before each sync (`--changes-per-sync`)
//! and reports what escrow-core's [`Reports`] decides, as the real agent
//! does: the SKUs whose counters changed since its last answered sync, with
//! a full sync every `FULL_SYNC_EVERY` syncs and after a failed one. Phases:
//!
//! - **syncs, back to back**: every agent syncs again as soon as its last
//!   sync was answered, for the phase's length: the most syncs per second
//!   the coordinator sustains, and their latency;
//! - **takes in central mode, with syncs at the agents' interval**: every
//!   agent syncs every `--sync-interval-ms` (200 ms) while T takers per
//!   agent take one unit of a random central SKU in a loop: takes per
//!   second and their latency, and the syncs' latency meanwhile.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use escrow_core::protocol::{SkuReport, SyncRequest, SyncResponse, TakeRequest};
use escrow_core::{IdError, Reports, TransferId};
use harness::client::{Bearer, Conn};
use harness::database::ScratchDb;
use harness::process::{free_addr, ServerProcess, Terminal};
use hdrhistogram::Histogram;
use hyper::{Method, StatusCode};

/// The tenant of every SKU.
const TENANT: &str = "cap";
/// The coordinator's admin token here.
const ADMIN_TOKEN: &str = "capacity-admin";
/// Units of each SKU: far more than the takes of a run use.
const UNITS_PER_SKU: u64 = 1_000_000;
/// Attempts at a region's first two answered syncs.
const FIRST_SYNC_ATTEMPTS_MAX: usize = 20;

/// What to measure.
#[derive(Debug, Clone)]
pub struct CapacitySettings {
    /// The PostgreSQL server (`postgres://user@host:port/db`) to make the
    /// scratch database on.
    pub server_url: String,
    /// The coordinator binary.
    pub coordinator: PathBuf,
    /// Region agents played.
    pub regions: usize,
    /// Escrow-mode SKUs, each in every region.
    pub skus: usize,
    /// Central-mode SKUs, each in every region, that the takers take from.
    pub central_skus: usize,
    /// Takers per region in the take phase.
    pub takers_per_region: usize,
    /// Length of each phase.
    pub phase: Duration,
    /// The agents' sync interval in the take phase.
    pub sync_interval: Duration,
    /// Escrow SKUs each agent sells a unit of before each sync (their
    /// counters change, so the sync reports them).
    pub changes_per_sync: usize,
}

/// One phase's figures.
#[derive(Debug, Clone)]
pub struct Phase {
    /// What ran.
    pub name: String,
    /// Calls answered 200 per second.
    pub per_s: f64,
    /// Latency percentiles of the answered calls, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Answers other than 200 (shed, refused), and failed calls.
    pub failed: u64,
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct Capacity {
    /// Setup: SKUs created per second (each a transaction granting to every region).
    pub creates_per_s: f64,
    /// A region's first two answered syncs (every SKU reported and its
    /// grants back, then acknowledged), slowest, ms.
    pub first_sync_ms: f64,
    /// The phases.
    pub phases: Vec<Phase>,
}

/// One played region agent.
struct Agent {
    region: String,
    bearer: Bearer,
    conn: Conn,
    seq: u64,
    /// Per SKU (escrow ones first, then central ones): units available.
    available: Vec<u64>,
    /// Per SKU: units sold.
    sold: Vec<u64>,
    /// What the coordinator answered of this agent's reports.
    reports: Reports,
    acks: Vec<TransferId>,
    /// Grants credited, so a grant listed again is credited once.
    credited: HashSet<TransferId>,
}

impl Agent {
    fn sku_name(index: usize, escrow: usize) -> String {
        if index < escrow {
            format!("s{index:05}")
        } else {
            format!("c{:05}", index - escrow)
        }
    }

    fn new(region: String, bearer: Bearer, conn: Conn, skus: usize) -> Self {
        Self {
            region,
            bearer,
            conn,
            seq: 0,
            available: vec![0; skus],
            sold: vec![0; skus],
            reports: Reports::default(),
            acks: Vec::new(),
            credited: HashSet::new(),
        }
    }

    /// Sells one unit of `changes` escrow SKUs, spread by the sync's number.
    fn sell(&mut self, escrow: usize, changes: usize) {
        for k in 0..changes.min(escrow) {
            let i = (self.seq as usize * 7_919 + k * 104_729) % escrow;
            if self.available[i] > 0 {
                self.available[i] -= 1;
                self.sold[i] += 1;
            }
        }
    }

    /// One sync, as the real agent makes it: the SKUs whose counters
    /// changed since the last answered sync (all of them when full), and
    /// acknowledgements of what the last sync brought.
    async fn sync(&mut self, escrow: usize) -> anyhow::Result<StatusCode> {
        self.seq += 1;
        let all = (0..self.available.len())
            .map(|i| SkuReport {
                tenant: ident(TENANT),
                sku: ident(Self::sku_name(i, escrow)),
                available: self.available[i],
                held: 0,
                sold: self.sold[i],
                sale_rate_per_s: 0.0,
                set_aside: 0,
            })
            .collect();
        let (skus, full) = self.reports.to_send(all, &[]);
        let req = SyncRequest {
            limits: Default::default(),
            epoch: 1,
            seq: self.seq,
            rtt_ms: 1,
            skus,
            acks: std::mem::take(&mut self.acks),
            returns: Vec::new(),
            full,
        };
        let path = format!("/v1/regions/{}/sync", self.region);
        let body = Bytes::from(serde_json::to_vec(&req)?);
        let (status, bytes) = match self.conn.post(&path, &self.bearer, body).await {
            Ok(answer) => answer,
            Err(error) => {
                self.reports.failed();
                return Err(error);
            }
        };
        if status != StatusCode::OK {
            self.acks = req.acks;
            self.reports.failed();
            return Ok(status);
        }
        self.reports.answered(&req);
        let resp: SyncResponse = serde_json::from_slice(&bytes)?;
        for grant in resp.grants {
            if self.credited.insert(grant.id.clone()) {
                let index = sku_index(grant.sku.as_str(), escrow)?;
                self.available[index] += grant.units;
            }
            self.acks.push(grant.id);
        }
        Ok(status)
    }
}

fn sku_index(sku: &str, escrow: usize) -> anyhow::Result<usize> {
    let n: usize = sku[1..].parse().context("a SKU name this run made")?;
    Ok(if sku.starts_with('s') { n } else { escrow + n })
}

/// A name this run makes, as the identifier type a message carries.
fn ident<T: TryFrom<String, Error = IdError>>(raw: impl Into<String>) -> T {
    T::try_from(raw.into()).expect("the names this run makes are valid identifiers")
}

fn region_name(i: usize) -> String {
    format!("r{i:02}")
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

fn phase(name: &str, hist: &Histogram<u64>, failed: u64, took: Duration) -> Phase {
    Phase {
        name: name.to_owned(),
        per_s: hist.len() as f64 / took.as_secs_f64(),
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1_000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1_000.0,
        failed,
    }
}

/// Runs the measurement; the coordinator and its database are gone after.
pub async fn run(settings: &CapacitySettings) -> anyhow::Result<Capacity> {
    let db = ScratchDb::create(
        &settings.server_url,
        &format!("bench_capacity_{}", std::process::id()),
    )
    .await?;
    let addr = free_addr()?;
    let tokens: Vec<String> = (0..settings.regions)
        .map(|i| format!("{r}=token-{r}", r = region_name(i)))
        .collect();
    let args: Vec<String> = [
        "--listen",
        &addr.to_string(),
        "--database-url",
        &db.url,
        "--admin-token",
        ADMIN_TOKEN,
        "--region-token",
        &tokens.join(","),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let coordinator = ServerProcess::spawn(
        "coordinator",
        &settings.coordinator,
        &args,
        addr,
        &Terminal::Shared,
    )
    .await?;
    let result = measure(settings, addr).await;
    coordinator.stop().await?;
    db.drop().await?;
    result
}

async fn measure(settings: &CapacitySettings, addr: SocketAddr) -> anyhow::Result<Capacity> {
    let admin = Bearer::new(ADMIN_TOKEN)?;
    let regions: serde_json::Map<String, serde_json::Value> = (0..settings.regions)
        .map(|i| (region_name(i), serde_json::json!(1)))
        .collect();
    let started = Instant::now();
    let mut conn = Conn::connect(addr).await?;
    let total = settings.skus + settings.central_skus;
    for i in 0..total {
        let sku = Agent::sku_name(i, settings.skus);
        let mut body = serde_json::json!({"total": UNITS_PER_SKU, "regions": regions});
        if i >= settings.skus {
            body["policy"] = "central".into();
        }
        let path = format!("/v1/admin/skus/{TENANT}/{sku}");
        let (status, answer) = conn
            .send(
                Method::PUT,
                &path,
                &admin,
                Some(Bytes::from(body.to_string())),
            )
            .await?;
        if status != StatusCode::CREATED {
            bail!("PUT {path}: {status} {}", String::from_utf8_lossy(&answer));
        }
    }
    let creates_per_s = total as f64 / started.elapsed().as_secs_f64();

    let mut agents = Vec::new();
    for i in 0..settings.regions {
        let region = region_name(i);
        let bearer = Bearer::new(&format!("token-{region}"))?;
        agents.push(Agent::new(
            region,
            bearer,
            Conn::connect(addr).await?,
            total,
        ));
    }
    // Every region's first sync (grants come back) and the one that acks
    // them, each sent again, as an agent does, until it is answered: a sync
    // cut off by the coordinator's request timeout keeps the SKUs it
    // committed, so a repeat has less to do.
    let mut first_sync_ms: f64 = 0.0;
    for agent in &mut agents {
        let at = Instant::now();
        let mut answered = 0;
        for _ in 0..FIRST_SYNC_ATTEMPTS_MAX {
            if agent.sync(settings.skus).await? == StatusCode::OK {
                answered += 1;
            }
            if answered == 2 {
                break;
            }
        }
        if answered < 2 {
            bail!("first syncs of {} not answered", agent.region);
        }
        first_sync_ms = first_sync_ms.max(at.elapsed().as_secs_f64() * 1_000.0);
    }

    let mut phases = Vec::new();
    let (hist, failed, took) = back_to_back(&mut agents, settings).await?;
    phases.push(phase(
        &format!(
            "syncs back to back ({} agents x {total} SKUs)",
            settings.regions
        ),
        &hist,
        failed,
        took,
    ));
    if settings.central_skus > 0 && settings.takers_per_region > 0 {
        let (takes, syncs) = takes_with_syncs(agents, settings, addr).await?;
        phases.push(takes);
        phases.push(syncs);
    }
    Ok(Capacity {
        creates_per_s,
        first_sync_ms,
        phases,
    })
}

/// Every agent syncs again as soon as its last sync is answered.
async fn back_to_back(
    agents: &mut Vec<Agent>,
    settings: &CapacitySettings,
) -> anyhow::Result<(Histogram<u64>, u64, Duration)> {
    let until = Instant::now() + settings.phase;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut agent in agents.drain(..) {
        let (escrow, changes) = (settings.skus, settings.changes_per_sync);
        tasks.push(tokio::spawn(async move {
            let (hist, failed) = sync_until(&mut agent, escrow, changes, until, None).await?;
            anyhow::Ok((agent, hist, failed))
        }));
    }
    let mut all = histogram();
    let mut failed = 0;
    for task in tasks {
        let (agent, hist, f) = task.await??;
        all.add(&hist)?;
        failed += f;
        agents.push(agent);
    }
    Ok((all, failed, started.elapsed()))
}

/// One played agent sells and syncs until `until`, each sync starting
/// `interval` after the last one started, or at once without one.
async fn sync_until(
    agent: &mut Agent,
    escrow: usize,
    changes: usize,
    until: Instant,
    interval: Option<Duration>,
) -> Calls {
    let mut hist = histogram();
    let mut failed = 0;
    while Instant::now() < until {
        agent.sell(escrow, changes);
        let at = Instant::now();
        match agent.sync(escrow).await {
            Ok(StatusCode::OK) => hist.record(at.elapsed().as_micros() as u64)?,
            _ => failed += 1,
        }
        if let Some(interval) = interval {
            tokio::time::sleep(interval.saturating_sub(at.elapsed())).await;
        }
    }
    Ok((hist, failed))
}

/// Agents sync at their interval while takers take from central SKUs.
async fn takes_with_syncs(
    agents: Vec<Agent>,
    settings: &CapacitySettings,
    addr: SocketAddr,
) -> anyhow::Result<(Phase, Phase)> {
    let until = Instant::now() + settings.phase;
    let started = Instant::now();
    let mut syncers = Vec::new();
    for mut agent in agents {
        let (escrow, interval) = (settings.skus, settings.sync_interval);
        let changes = settings.changes_per_sync;
        syncers.push(tokio::spawn(async move {
            sync_until(&mut agent, escrow, changes, until, Some(interval)).await
        }));
    }
    let mut takers = Vec::new();
    let mut seq = 0u64;
    for r in 0..settings.regions {
        for t in 0..settings.takers_per_region {
            let region = region_name(r);
            let bearer = Bearer::new(&format!("token-{region}"))?;
            let mut conn = Conn::connect(addr).await?;
            let central = settings.central_skus;
            seq += 1;
            let taker = seq;
            takers.push(tokio::spawn(async move {
                let mut hist = histogram();
                let mut failed = 0;
                let mut n = 0u64;
                while Instant::now() < until {
                    n += 1;
                    let req = TakeRequest {
                        id: ident(format!("t-{region}-{t}-{n}")),
                        tenant: ident(TENANT),
                        sku: ident(format!("c{:05}", (taker * 7_919 + n) as usize % central)),
                        units: 1,
                        prefetch: 0,
                        received: 0,
                        returned: 0,
                    };
                    let body = Bytes::from(serde_json::to_vec(&req)?);
                    let path = format!("/v1/regions/{region}/take");
                    let at = Instant::now();
                    match conn.post(&path, &bearer, body).await {
                        Ok((StatusCode::OK, _)) => hist.record(at.elapsed().as_micros() as u64)?,
                        _ => failed += 1,
                    }
                }
                anyhow::Ok((hist, failed))
            }));
        }
    }
    let (takes, failed) = gather(takers).await?;
    let (syncs, sync_failed) = gather(syncers).await?;
    let took = started.elapsed();
    let takers = settings.regions * settings.takers_per_region;
    let take_phase = phase(
        &format!(
            "takes, central mode ({takers} takers over {} SKUs)",
            settings.central_skus
        ),
        &takes,
        failed,
        took,
    );
    let sync_phase = phase(
        &format!(
            "syncs every {} ms meanwhile ({} agents)",
            settings.sync_interval.as_millis(),
            settings.regions
        ),
        &syncs,
        sync_failed,
        took,
    );
    Ok((take_phase, sync_phase))
}

/// A played agent's or taker's latencies (µs) of answered calls, and its failed calls.
type Calls = anyhow::Result<(Histogram<u64>, u64)>;

/// Every task's histogram merged, and their failures summed.
async fn gather(tasks: Vec<tokio::task::JoinHandle<Calls>>) -> Calls {
    let mut all = histogram();
    let mut failed = 0;
    for task in tasks {
        let (hist, f) = task.await??;
        all.add(&hist)?;
        failed += f;
    }
    Ok((all, failed))
}

/// The figures as a Markdown table.
pub fn table(settings: &CapacitySettings, c: &Capacity) -> String {
    let mut out = format!(
        "{} regions, {} escrow SKUs + {} central SKUs, each in every region; {} SKUs sold from per agent sync; phases of {:.0} s\n\n\
         SKUs created: {:.0}/s; a region's first two answered syncs (every SKU reported and its grants back, then acknowledged), slowest: {:.0} ms\n\n\
         | phase | per second | p50 | p99 | failed |\n|---|---:|---:|---:|---:|\n",
        settings.regions,
        settings.skus,
        settings.central_skus,
        settings.changes_per_sync,
        settings.phase.as_secs_f64(),
        c.creates_per_s,
        c.first_sync_ms,
    );
    for p in &c.phases {
        out.push_str(&format!(
            "| {} | {:.0} | {:.1} ms | {:.1} ms | {} |\n",
            p.name, p.per_s, p.p50_ms, p.p99_ms, p.failed
        ));
    }
    out
}
