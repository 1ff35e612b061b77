//! `sku watch`: one SKU's view at the coordinator, read again every
//! interval and shown live until `q`, Esc or Ctrl-C (see [`screen`]), or
//! as one plain line per refresh when stdout is not a terminal, with
//! `--plain`, `--once` or `--json`, so it can be piped, logged and tested.
//!
//! A refused request (unknown SKU, wrong token) ends the watch with the
//! answer like any other command; a coordinator that does not answer (no
//! connection, a timeout, a 5xx) is only shown, and asked again at the
//! next refresh, so a watch survives a coordinator restart.

mod screen;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::{Api, Refused};

/// A poll that takes longer than this (or the interval, if longer) counts
/// as the coordinator not answering.
const POLL_TIMEOUT_MIN: Duration = Duration::from_secs(2);

/// The coordinator's view of one SKU (`GET /v1/admin/skus/{tenant}/{sku}`),
/// the fields the watch shows. A standalone agent's view lacks the
/// coordinator's fields: they read as absent or 0.
#[derive(Debug, Deserialize)]
pub struct SkuView {
    /// Units in all.
    pub total: u64,
    /// Units leased to no region.
    pub pool: i64,
    /// Units granted and not yet acknowledged.
    pub in_transit: i64,
    /// `ESCROW` or `CENTRAL`.
    pub mode: Option<String>,
    /// Whether new holds are stopped.
    pub paused: bool,
    /// The invariant's drift, from the regions' last reports.
    pub drift: Option<i64>,
    /// The drift of the coordinator's own books.
    pub ledger_drift: Option<i64>,
    /// The regions by name.
    pub regions: BTreeMap<String, RegionView>,
}

/// One region of [`SkuView`].
#[derive(Debug, Deserialize)]
pub struct RegionView {
    /// Its weight (0: being taken out).
    #[serde(default)]
    pub weight: u64,
    /// Units delivered to it minus units it returned.
    pub leased: i64,
    /// Its share of the units in transit.
    #[serde(default)]
    pub in_transit: i64,
    /// Units it can sell, from its last report.
    pub available: i64,
    /// Units held, from its last report.
    pub held: i64,
    /// Units sold, from its last report.
    pub sold: i64,
    /// Units sold per second, as it reported.
    pub sale_rate_per_s: Option<f64>,
    /// Units asked back and not yet returned.
    #[serde(default)]
    pub recall_pending: i64,
    /// Age of its last report; absent before the first.
    pub report_age_ms: Option<u64>,
    /// Whether its report is stale.
    #[serde(default)]
    pub stale: bool,
    /// `available + held + sold - leased`.
    #[serde(default)]
    pub region_drift: i64,
}

impl SkuView {
    /// Units sold over all regions, by their last reports.
    pub fn sold(&self) -> i64 {
        self.regions.values().map(|r| r.sold).sum()
    }
}

/// What one refresh shows.
#[derive(Debug)]
pub struct Shown {
    /// `TENANT/SKU` as asked.
    pub id: String,
    /// Time since the watch started.
    pub elapsed: Duration,
    /// The latest view read (also while the coordinator does not answer).
    pub view: Option<SkuView>,
    /// Units sold per second between the last two views read; `None`
    /// until there are two.
    pub sales_per_s: Option<f64>,
    /// Why the coordinator did not answer this refresh.
    pub unreachable: Option<String>,
}

/// The views read so far, as much of them as the next refresh needs.
struct Watcher {
    started: Instant,
    shown: Shown,
    /// When the latest view was read, and the units sold in it.
    last: Option<(Instant, i64)>,
}

impl Watcher {
    fn new(id: &str) -> Self {
        Self {
            started: Instant::now(),
            shown: Shown {
                id: id.to_owned(),
                elapsed: Duration::ZERO,
                view: None,
                sales_per_s: None,
                unreachable: None,
            },
            last: None,
        }
    }

    /// A view read at `now`.
    fn read(&mut self, now: Instant, view: SkuView) {
        let sold = view.sold();
        self.shown.sales_per_s = self.last.and_then(|(at, before)| {
            let span = now.duration_since(at).as_secs_f64();
            (span > 0.0).then(|| (sold - before) as f64 / span)
        });
        self.last = Some((now, sold));
        self.shown.elapsed = now.duration_since(self.started);
        self.shown.view = Some(view);
        self.shown.unreachable = None;
    }

    /// No answer at `now`, for `reason`.
    fn unreachable(&mut self, now: Instant, reason: String) {
        self.shown.elapsed = now.duration_since(self.started);
        self.shown.unreachable = Some(reason);
    }
}

/// What a poll got.
enum Polled {
    /// The view, and the API's JSON of it.
    View(Box<SkuView>, Value),
    /// No answer; why.
    Unreachable(String),
}

/// Reads the view at `path`; an error is a refusal that ends the watch.
async fn poll(api: &Api, path: &str, timeout: Duration) -> anyhow::Result<Polled> {
    let answer =
        match tokio::time::timeout(timeout, api.call(reqwest::Method::GET, path, None)).await {
            Err(_) => {
                return Ok(Polled::Unreachable(format!(
                    "no answer within {} ms",
                    timeout.as_millis()
                )))
            }
            Ok(Err(error)) if not_answering(&error) => {
                return Ok(Polled::Unreachable(format!("{error:#}")))
            }
            Ok(answer) => answer?,
        };
    let view = serde_json::from_value(answer.clone()).context("the server's SKU view")?;
    Ok(Polled::View(Box::new(view), answer))
}

/// Whether `error` means the coordinator did not answer (or answered that
/// it cannot now), rather than refusing the request.
fn not_answering(error: &anyhow::Error) -> bool {
    match error.downcast_ref::<Refused>() {
        Some(refused) => refused.status.is_server_error(),
        None => error.downcast_ref::<reqwest::Error>().is_some(),
    }
}

/// How the refreshes are shown.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Plain lines even on a terminal.
    pub plain: bool,
    /// One refresh, then exit.
    pub once: bool,
    /// The API's JSON, a line per refresh.
    pub json: bool,
}

/// Watches the SKU `id` (`TENANT/SKU`, at `path`) every `interval`.
pub async fn run(
    api: &Api,
    id: &str,
    path: &str,
    interval: Duration,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let lines = output.plain || output.once || output.json || !std::io::stdout().is_terminal();
    let (stop, mut stopped) = watch::channel(false);
    let mut screen = if lines {
        None
    } else {
        Some(screen::Screen::open(stop).context("opening the terminal")?)
    };
    let mut watcher = Watcher::new(id);
    let timeout = interval.max(POLL_TIMEOUT_MIN);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let polled = tokio::select! {
            polled = async {
                tick.tick().await;
                poll(api, path, timeout).await
            } => polled?,
            _ = stop_requested(&mut stopped) => break,
            _ = &mut ctrl_c => break,
        };
        let now = Instant::now();
        let json = match polled {
            Polled::View(view, answer) => {
                watcher.read(now, *view);
                answer
            }
            Polled::Unreachable(reason) if output.once => {
                anyhow::bail!("coordinator unreachable: {reason}")
            }
            Polled::Unreachable(reason) => {
                watcher.unreachable(now, reason.clone());
                json!({"error": format!("coordinator unreachable: {reason}")})
            }
        };
        let printed = match &mut screen {
            Some(screen) => {
                screen.draw(&watcher.shown, interval)?;
                Ok(())
            }
            None if output.json => print_line(&json.to_string()),
            None => print_line(&line(&watcher.shown)),
        };
        match printed {
            // Whoever read the lines (`| head`, a closed log) stopped reading.
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => break,
            printed => printed.context("printing to stdout")?,
        }
        if output.once {
            break;
        }
    }
    drop(screen);
    Ok(ExitCode::SUCCESS)
}

/// Prints `text` and a newline to stdout, at once (stdout is line
/// buffered), returning the error `println!` would panic on.
fn print_line(text: &str) -> io::Result<()> {
    writeln!(io::stdout().lock(), "{text}")
}

/// Returns once a stop is asked for; never if nothing can ask any more.
async fn stop_requested(stopped: &mut watch::Receiver<bool>) {
    if stopped.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One refresh as a plain line: the SKU's numbers, then each region's.
pub fn line(s: &Shown) -> String {
    let mut out = format!("t {:.1} s {}", s.elapsed.as_secs_f64(), s.id);
    if let Some(reason) = &s.unreachable {
        let _ = write!(out, " coordinator unreachable: {reason}");
        return out;
    }
    let Some(v) = &s.view else {
        return out;
    };
    let mode = v.mode.as_deref().unwrap_or("-");
    let (drift, sold, sales) = (optional(v.drift), v.sold(), rate(s.sales_per_s));
    let (paused, total, pool, in_transit) = (v.paused, v.total, v.pool, v.in_transit);
    let _ = write!(
        out,
        " mode {mode} paused {paused} total {total} pool {pool} in transit {in_transit} \
         drift {drift} sold {sold} sales {sales}"
    );
    for (name, r) in &v.regions {
        let (sale_rate, age) = (rate(r.sale_rate_per_s), report_age(r.report_age_ms));
        let stale = if r.stale { " STALE" } else { "" };
        let (available, held, sold) = (r.available, r.held, r.sold);
        let _ = write!(
            out,
            " | {name} available {available} held {held} sold {sold} rate {sale_rate} report {age}{stale}"
        );
    }
    out
}

/// `value`, or `-` when absent.
fn optional(value: Option<i64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// Units per second, or `-` when not known.
fn rate(per_s: Option<f64>) -> String {
    per_s.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}/s"))
}

/// A report's age, or `-` before the first report.
fn report_age(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"))
}
