//! The coordinator's view of the SKU over a run, sampled every
//! [`SAMPLE_INTERVAL`].
//!
//! `GET /v1/admin/skus/{tenant}/{sku}` gives the pool and units in transit
//! as of now, and each region's available, held and sold as of its last
//! report (one sync interval old at most, while it syncs). Units free
//! anywhere are `pool + in_transit + sum(available)`. Times are kept on
//! one clock, microseconds since the run's [`Origin`]: the coordinator
//! stamps reports with the same machine's wall clock, which the origin ties
//! to the benchmark's monotonic one.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use hyper::Method;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{Bearer, Conn};
use crate::cluster::Credentials;
use crate::sale::SKU;

/// How often the view is sampled during a sale.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(50);

/// A report stamped this long after a moment is taken to describe the
/// region after that moment: the agent reads its counters just before it
/// sends the sync, and the coordinator stamps it on arrival.
pub const REPORT_LAG_MARGIN_US: i64 = 100_000;

/// The moment a run's clock starts, on both the monotonic and the wall clock.
#[derive(Debug, Clone, Copy)]
pub struct Origin {
    instant: Instant,
    wall: DateTime<Utc>,
}

impl Origin {
    /// Now.
    pub fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall: Utc::now(),
        }
    }

    /// Microseconds from the origin to `at`.
    pub fn us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.instant).as_micros()).unwrap_or(i64::MAX)
    }

    /// Microseconds from the origin to now.
    pub fn now_us(&self) -> i64 {
        self.us(Instant::now())
    }

    /// The monotonic instant `us` after the origin.
    pub fn instant(&self, us: u64) -> Instant {
        self.instant + Duration::from_micros(us)
    }

    /// Microseconds from the origin to a wall-clock time (negative before it).
    pub fn us_of_wall(&self, at: DateTime<Utc>) -> i64 {
        (at - self.wall).num_microseconds().unwrap_or(i64::MIN)
    }
}

/// One region in the view.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionView {
    /// Its name.
    pub name: String,
    /// Units it could sell, as of its last report.
    pub available: i64,
    /// Units held there, as of its last report.
    pub held: i64,
    /// Units sold there, as of its last report.
    pub sold: i64,
    /// Its demand, units per second, as of its last report.
    pub rate_per_s: f64,
    /// When it last reported, on the run's clock.
    pub last_report_us: Option<i64>,
}

/// The coordinator's view of the SKU at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct SkuView {
    /// When the answer arrived, on the run's clock.
    pub at_us: i64,
    /// Units in all.
    pub total: i64,
    /// Units not leased to any region.
    pub pool: i64,
    /// Units on their way between the pool and a region.
    pub in_transit: i64,
    /// |drift| + |ledger drift| of the view (0 when consistent).
    pub drift: i64,
    /// How the SKU sells (`ESCROW` or `CENTRAL`), as the coordinator says.
    pub mode: String,
    /// The regions.
    pub regions: Vec<RegionView>,
    /// The oldest region report, if every region has reported.
    pub reports_from_us: Option<i64>,
}

impl SkuView {
    /// Units free anywhere: `pool + in_transit + sum(available)`.
    pub fn free(&self) -> i64 {
        self.pool + self.in_transit + self.regions.iter().map(|r| r.available).sum::<i64>()
    }

    /// Units held or sold, over all regions.
    pub fn committed(&self) -> i64 {
        self.regions.iter().map(|r| r.held + r.sold).sum()
    }

    /// Reads the admin API's JSON.
    pub fn parse(body: &serde_json::Value, origin: &Origin, at_us: i64) -> anyhow::Result<Self> {
        let int = |v: &serde_json::Value, field: &str| {
            v[field]
                .as_i64()
                .with_context(|| format!("SKU view has no integer {field}: {v}"))
        };
        let mut regions = Vec::new();
        for (name, r) in body["regions"]
            .as_object()
            .context("SKU view has regions")?
        {
            let last_report_us = r["last_report_at"]
                .as_str()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| origin.us_of_wall(t.with_timezone(&Utc)));
            regions.push(RegionView {
                name: name.clone(),
                available: int(r, "available")?,
                held: int(r, "held")?,
                sold: int(r, "sold")?,
                rate_per_s: r["sale_rate_per_s"].as_f64().unwrap_or(0.0),
                last_report_us,
            });
        }
        let reports_from_us = regions
            .iter()
            .map(|r| r.last_report_us)
            .collect::<Option<Vec<i64>>>()
            .and_then(|times| times.into_iter().min());
        Ok(Self {
            at_us,
            total: int(body, "total")?,
            pool: int(body, "pool")?,
            in_transit: int(body, "in_transit")?,
            drift: int(body, "drift")?.abs() + body["ledger_drift"].as_i64().unwrap_or(0).abs(),
            mode: body["mode"].as_str().unwrap_or("?").to_owned(),
            regions,
            reports_from_us,
        })
    }
}

/// Where the view is read, and with what token.
struct Source {
    coordinator: SocketAddr,
    admin: Bearer,
    path: String,
}

impl Source {
    fn new(coordinator: SocketAddr, credentials: &Credentials) -> anyhow::Result<Self> {
        Ok(Self {
            coordinator,
            admin: Bearer::new(&credentials.admin_token)?,
            path: format!("/v1/admin/skus/{}/{SKU}", credentials.tenant),
        })
    }
}

async fn read_view(conn: &mut Conn, source: &Source, origin: &Origin) -> anyhow::Result<SkuView> {
    let path = &source.path;
    let (status, body) = conn.send(Method::GET, path, &source.admin, None).await?;
    let at_us = origin.now_us();
    anyhow::ensure!(status.is_success(), "GET {path} answered {status}");
    let json: serde_json::Value = serde_json::from_slice(&body)?;
    SkuView::parse(&json, origin, at_us)
}

/// The view now, on a fresh connection.
pub async fn sku_view(
    coordinator: SocketAddr,
    credentials: &Credentials,
    origin: Origin,
) -> anyhow::Result<SkuView> {
    let source = Source::new(coordinator, credentials)?;
    let mut conn = Conn::connect(coordinator).await?;
    read_view(&mut conn, &source, &origin).await
}

/// A sampler running in the background.
pub struct Sampling {
    stop: watch::Sender<bool>,
    latest: watch::Receiver<Option<SkuView>>,
    task: JoinHandle<Vec<SkuView>>,
}

/// Starts sampling the view every [`SAMPLE_INTERVAL`] on one keep-alive
/// connection; a failed sample is skipped (and the connection renewed).
pub fn start(
    coordinator: SocketAddr,
    credentials: &Credentials,
    origin: Origin,
) -> anyhow::Result<Sampling> {
    let source = Source::new(coordinator, credentials)?;
    let (stop, mut stopped) = watch::channel(false);
    let (latest_sender, latest) = watch::channel(None);
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut conn: Option<Conn> = None;
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped.changed() => break,
            }
            if conn.is_none() {
                conn = Conn::connect(source.coordinator).await.ok();
            }
            let Some(live) = conn.as_mut() else {
                continue;
            };
            match read_view(live, &source, &origin).await {
                Ok(view) => {
                    latest_sender.send_replace(Some(view.clone()));
                    samples.push(view);
                }
                Err(error) => {
                    tracing::debug!(%error, "SKU view sample failed");
                    conn = None;
                }
            }
        }
        samples
    });
    Ok(Sampling { stop, latest, task })
}

impl Sampling {
    /// The latest sample, as it changes (`None` before the first).
    pub fn latest(&self) -> watch::Receiver<Option<SkuView>> {
        self.latest.clone()
    }

    /// Stops sampling and returns the samples, oldest first.
    pub async fn stop(self) -> Vec<SkuView> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the admin view's JSON is read into free units and report times
    /// on the run's clock; a region that never reported leaves no common
    /// report time.
    #[test]
    fn parses_the_admin_view() {
        let origin = Origin::now();
        let later = (origin.wall + chrono::Duration::milliseconds(250)).to_rfc3339();
        let body = serde_json::json!({
            "total": 10, "pool": 2, "in_transit": 1, "drift": 0, "ledger_drift": 0,
            "regions": {
                "eu": {"available": 3, "held": 4, "sold": 0, "last_report_at": later},
                "us": {"available": 0, "held": 0, "sold": 0, "last_report_at": null},
            }
        });
        let view = SkuView::parse(&body, &origin, 7).unwrap();
        assert_eq!(view.free(), 6);
        assert_eq!(view.committed(), 4);
        assert_eq!(view.reports_from_us, None);
        let eu = view.regions.iter().find(|r| r.name == "eu").unwrap();
        assert_eq!(eu.last_report_us, Some(250_000));
    }
}
