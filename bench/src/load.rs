//! The load generator: concurrent buyers, each on its own keep-alive
//! connection, counting outcomes and recording latency.
//!
//! A closed loop: each of `clients` buyers sends a request, waits for the
//! answer, and sends the next, so the offered load adapts to the server and
//! the number of requests in flight equals the number of clients. Every
//! request carries a fresh request key and a fresh user id (distinct buyers,
//! never replays or per-user refusals). Counts and latencies are taken over
//! a measurement window after a warm-up; totals over the whole run are kept
//! too, so a run's counts can be checked exactly (see the smoke test).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use harness::client::{Bearer, Conn};
use harness::outcome::{Outcome, Tally};
use hdrhistogram::Histogram;
use tokio::sync::Barrier;

use crate::metrics::CommitStats;

/// Highest latency the histograms track, in microseconds (one minute).
pub const LATENCY_US_MAX: u64 = 60_000_000;

/// Pause after a request that got no answer, before the next.
pub const TRANSPORT_BACKOFF: Duration = Duration::from_millis(10);

/// What each buyer does in a loop.
#[derive(Debug, Clone)]
pub enum Workload {
    /// Reserve one unit of a SKU drawn uniformly from `skus` (one SKU: the hot SKU).
    Reserve {
        /// The SKUs on sale.
        skus: Vec<String>,
    },
    /// Reserve one unit of `sku`, then settle the hold: confirm every
    /// other one, release the rest.
    Settle {
        /// The SKU on sale.
        sku: String,
    },
    /// A whole drop: half the buyers want the hot SKU, the others one of
    /// the warm SKUs drawn uniformly; of the holds, half are confirmed, a
    /// tenth released, and the rest left to expire.
    Drop {
        /// The SKU most buyers want.
        hot: String,
        /// The other SKUs on sale.
        warm: Vec<String>,
    },
    /// Hold a cart of one unit of each of `skus`, all or nothing
    /// (`POST /v1/carts`); holds are kept.
    Cart {
        /// The cart's SKUs.
        skus: Vec<String>,
    },
}

impl Workload {
    /// The SKU a buyer asks for, given a random number.
    fn sku(&self, random: u64) -> &str {
        match self {
            Workload::Reserve { skus } => &skus[(random % skus.len() as u64) as usize],
            Workload::Settle { sku } => sku,
            Workload::Drop { hot, warm } => match random % 2 {
                0 => hot,
                _ => &warm[((random / 2) % warm.len() as u64) as usize],
            },
            Workload::Cart { skus } => &skus[0],
        }
    }

    /// The path and JSON body of the request that asks for units, under
    /// `key`, for the SKU drawn by `random`.
    fn ask(&self, key: &str, random: u64, body: &mut String) -> &'static str {
        body.clear();
        // Writing to a String cannot fail.
        if let Workload::Cart { skus } = self {
            let _ = write!(
                body,
                r#"{{"request_key":"{key}","user_id":"u{key}","items":["#
            );
            for (i, sku) in skus.iter().enumerate() {
                let comma = if i == 0 { "" } else { "," };
                let _ = write!(body, r#"{comma}{{"sku":"{sku}"}}"#);
            }
            body.push_str("]}");
            return "/v1/carts";
        }
        let sku = self.sku(random);
        let _ = write!(
            body,
            r#"{{"request_key":"{key}","user_id":"u{key}","sku":"{sku}"}}"#
        );
        "/v1/reservations"
    }

    /// What the buyer of loop `seq` does with a hold: `Some(true)` confirms,
    /// `Some(false)` releases, `None` keeps it.
    fn settle(&self, seq: u64) -> Option<bool> {
        match self {
            Workload::Reserve { .. } | Workload::Cart { .. } => None,
            Workload::Settle { .. } => Some(seq % 2 == 0),
            Workload::Drop { .. } => match seq % 10 {
                0..=4 => Some(true),
                5 => Some(false),
                _ => None,
            },
        }
    }
}

/// One load run.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The server.
    pub addr: SocketAddr,
    /// The buyer API key.
    pub token: String,
    /// Concurrent buyers (= connections = requests in flight).
    pub clients: usize,
    /// Time before the window opens: connections warm, queues filled.
    pub warmup: Duration,
    /// The measurement window.
    pub measure: Duration,
    /// Stop each buyer after this many loops (the smoke test's fixed
    /// count); `None` runs until the window closes.
    pub loops_per_client: Option<u64>,
    /// What the buyers do.
    pub workload: Workload,
    /// Makes this run's request keys and user ids unique in the database.
    pub run_id: String,
}

/// What a load run saw.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Concurrent buyers.
    pub clients: usize,
    /// Length of the measurement window.
    pub measured: Duration,
    /// Outcomes completed inside the window.
    pub window: Tally,
    /// Outcomes of the whole run, warm-up and stragglers included.
    pub total: Tally,
    /// Reserve latency inside the window, microseconds.
    pub reserve_latency: Histogram<u64>,
    /// Confirm and release latency inside the window, microseconds.
    pub action_latency: Histogram<u64>,
    /// The agent's commit counters over the run, where the server is an agent.
    pub commits: Option<CommitStats>,
    /// Share of the machine other processes used during the run, where watched.
    pub others_share: Option<f64>,
}

impl LoadReport {
    /// Window outcomes of any of `outcomes` per second.
    pub fn rate(&self, outcomes: &[Outcome]) -> f64 {
        let n: u64 = outcomes.iter().map(|&o| self.window[o]).sum();
        n as f64 / self.measured.as_secs_f64().max(1e-9)
    }

    /// A reserve latency quantile in milliseconds.
    pub fn reserve_ms(&self, quantile: f64) -> f64 {
        self.reserve_latency.value_at_quantile(quantile) as f64 / 1000.0
    }
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).context("histogram bounds")
}

/// A tiny deterministic generator (splitmix64) for the SKU each buyer picks.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// One buyer's results.
struct ClientResult {
    window: Tally,
    total: Tally,
    reserve_latency: Histogram<u64>,
    action_latency: Histogram<u64>,
}

/// The time bounds shared by all buyers.
#[derive(Clone, Copy)]
struct Window {
    opens: Instant,
    closes: Instant,
}

impl Window {
    fn contains(&self, t: Instant) -> bool {
        t >= self.opens && t <= self.closes
    }
}

/// Which of a buyer's two latencies an answer counts in.
#[derive(Clone, Copy)]
enum Call {
    Reserve,
    Action,
}

impl ClientResult {
    /// Counts an answer that came now to a call started at `started`: in
    /// the totals, and in the window and the call's latency if it came
    /// within `window`.
    fn record(&mut self, window: &Window, call: Call, outcome: Outcome, started: Instant) {
        let done = Instant::now();
        self.total.add(outcome);
        if window.contains(done) {
            self.window.add(outcome);
            let latency = match call {
                Call::Reserve => &mut self.reserve_latency,
                Call::Action => &mut self.action_latency,
            };
            latency.saturating_record(micros(done - started));
        }
    }
}

/// Runs `spec` on the current tokio runtime and returns what it saw.
pub async fn run(spec: LoadSpec) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(spec.clients > 0, "at least one client");
    let spec = Arc::new(spec);
    let bearer = Bearer::new(&spec.token)?;
    // Every buyer connects first; the clock starts when all are connected.
    let start = Arc::new(Barrier::new(spec.clients + 1));
    let (window_tx, window_rx) = tokio::sync::watch::channel(None::<Window>);
    let mut tasks = Vec::with_capacity(spec.clients);
    for client in 0..spec.clients {
        let spec = spec.clone();
        let bearer = bearer.clone();
        let start = start.clone();
        let mut window_rx = window_rx.clone();
        tasks.push(tokio::spawn(async move {
            let conn = Conn::connect(spec.addr).await;
            start.wait().await;
            let window = window_rx
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|w| *w)
                .context("load run abandoned before it started")?;
            buyer(&spec, client, conn, &bearer, window).await
        }));
    }
    start.wait().await;
    let began = Instant::now();
    let opens = began + spec.warmup;
    let closes = opens + spec.measure;
    window_tx.send_replace(Some(Window { opens, closes }));

    let mut report = LoadReport {
        clients: spec.clients,
        measured: spec.measure,
        window: Tally::default(),
        total: Tally::default(),
        reserve_latency: histogram()?,
        action_latency: histogram()?,
        commits: None,
        others_share: None,
    };
    for task in tasks {
        let result = task.await.context("buyer task panicked")??;
        report.window.merge(&result.window);
        report.total.merge(&result.total);
        report.reserve_latency.add(&result.reserve_latency)?;
        report.action_latency.add(&result.action_latency)?;
    }
    if spec.loops_per_client.is_some() {
        // A fixed-count run ends when the last buyer does.
        report.measured = began
            .elapsed()
            .saturating_sub(spec.warmup)
            .min(spec.measure);
    }
    Ok(report)
}

/// One buyer's loop until the window closes (or its loops are done).
async fn buyer(
    spec: &LoadSpec,
    client: usize,
    conn: anyhow::Result<Conn>,
    bearer: &Bearer,
    window: Window,
) -> anyhow::Result<ClientResult> {
    let mut result = ClientResult {
        window: Tally::default(),
        total: Tally::default(),
        reserve_latency: histogram()?,
        action_latency: histogram()?,
    };
    let mut conn = match conn {
        Ok(conn) => Some(conn),
        Err(error) => {
            tracing::warn!(%error, "buyer could not connect");
            None
        }
    };
    let mut rng = SplitMix(client as u64 ^ 0x5EED);
    let mut key = String::with_capacity(64);
    let mut body = String::with_capacity(160);
    let mut path = String::with_capacity(96);
    let mut seq: u64 = 0;
    loop {
        if spec.loops_per_client.is_some_and(|n| seq >= n) || Instant::now() >= window.closes {
            break;
        }
        seq += 1;
        key.clear();
        // Writing to a String cannot fail.
        let _ = write!(key, "{}-{client}-{seq}", spec.run_id);
        let ask = spec.workload.ask(&key, rng.next(), &mut body);
        let json = Bytes::copy_from_slice(body.as_bytes());
        let started = Instant::now();
        let outcome = match request(&mut conn, spec.addr, ask, bearer, json).await {
            Some((status, body)) => Outcome::of_reserve(status, &body),
            None => Outcome::Transport,
        };
        result.record(&window, Call::Reserve, outcome, started);
        if outcome == Outcome::Transport {
            // A server that is gone must not turn the buyers into a busy loop.
            tokio::time::sleep(TRANSPORT_BACKOFF).await;
            continue;
        }
        let Some(confirm) = spec
            .workload
            .settle(seq)
            .filter(|_| outcome == Outcome::Held)
        else {
            continue;
        };
        path.clear();
        let verb = if confirm { "confirm" } else { "release" };
        let _ = write!(path, "/v1/reservations/{key}/{verb}");
        let started = Instant::now();
        let outcome = match request(&mut conn, spec.addr, &path, bearer, Bytes::new()).await {
            Some((status, body)) => Outcome::of_action(confirm, status, &body),
            None => Outcome::Transport,
        };
        result.record(&window, Call::Action, outcome, started);
    }
    Ok(result)
}

/// Sends a POST on the buyer's connection, reconnecting once if it broke;
/// `None` when no answer came.
async fn request(
    conn: &mut Option<Conn>,
    addr: SocketAddr,
    path: &str,
    bearer: &Bearer,
    json: Bytes,
) -> Option<(hyper::StatusCode, Bytes)> {
    if conn.is_none() {
        *conn = Conn::connect(addr).await.ok();
    }
    let live = conn.as_mut()?;
    let sent = if json.is_empty() {
        live.send(hyper::Method::POST, path, bearer, None).await
    } else {
        live.post(path, bearer, json).await
    };
    match sent {
        Ok(answer) => Some(answer),
        Err(error) => {
            tracing::debug!(%error, "request failed; reconnecting");
            *conn = None;
            None
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}
