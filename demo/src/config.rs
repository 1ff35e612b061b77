//! The demo's flags, each also read from the environment, and the sale and
//! storage they describe.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use harness::cluster::{Backend, Storage};
use harness::link::{parse_distances, Distances};
use harness::shape::{parse_skew, Arrivals, Sale, Shape, BUYERS_MAX, REGION_NAMES};

/// The demo's regions: the first this many of [`REGION_NAMES`] (eu, us,
/// ap), in the sale's order.
pub const REGIONS: usize = 3;
/// Units on sale when `--units` is not given.
pub const UNITS_DEFAULT: u64 = 2_000;
/// Most units `--units` accepts (the live view and the crowd stay small).
pub const UNITS_MAX: u64 = 1_000_000;
/// Buyers per unit when `--buyers` is not given: enough for a sell-out
/// and a tail of buyers told SOLD_OUT.
pub const BUYERS_PER_UNIT_DEFAULT: f64 = 1.5;
/// Share of the buyers spread evenly over the sale (the long tail); the
/// rest come in the hot start.
pub const TAIL_SHARE: f64 = 0.2;
/// The hot start's rate decays with this fraction of `--seconds` as its
/// time constant.
pub const HOT_START_FRACTION: f64 = 0.25;
/// A buyer pays for its hold this long after the HELD, at the least and at
/// the most (drawn per buyer).
pub const CHECKOUT: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(3_000)];
/// A buyer retries 503s with its request key for at most this long.
pub const RETRYING_MAX: Duration = Duration::from_secs(60);

/// A flash sale on a coordinator and three region agents (eu, us, ap),
/// shown live: the agents sell, run dry, and rebalance through the
/// coordinator while a crowd of buyers hits their HTTP API.
#[derive(Debug, Clone, Parser)]
#[command(name = "demo", version)]
pub struct Config {
    /// Units on sale.
    #[arg(long, env = "DEMO_UNITS", default_value_t = UNITS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=UNITS_MAX))]
    pub units: u64,
    /// Buyers in all (default: 1.5 per unit).
    #[arg(long, env = "DEMO_BUYERS", value_parser = clap::value_parser!(u64).range(1..=BUYERS_MAX))]
    pub buyers: Option<u64>,
    /// Each region's share of the buyers, eu,us,ap.
    #[arg(long, env = "DEMO_SKEW", default_value = "85,10,5", value_parser = parse_three_shares)]
    pub skew: Skew,
    /// The coordinator's --policy: tail-merge, refill, proportional, static or central.
    #[arg(long, env = "DEMO_POLICY", default_value = "tail-merge")]
    pub policy: String,
    /// Buyers keep arriving for this long: a hot start, then a long tail.
    #[arg(long, env = "DEMO_SECONDS", default_value_t = 20.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Round trip between a region's agent and the coordinator, ms, as
    /// eu=20,us=80,ap=230: every call between them goes through a link
    /// that holds each direction for half of it. A region not named talks
    /// over loopback.
    #[arg(long, env = "DEMO_RTT", value_name = "REGION=MS,...", value_parser = parse_rtt)]
    pub rtt: Option<Distances>,
    /// After the summary, leave the cluster up (for escrowctl and curl)
    /// until Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
    /// Plain periodic lines instead of the live view (the default when
    /// stdout is not a terminal).
    #[arg(long)]
    pub plain: bool,
    /// Each run gets a fresh directory `<runs-dir>/<timestamp>/` holding
    /// every process's SQLite file and log.
    #[arg(long, env = "DEMO_RUNS_DIR", default_value = "demo-runs")]
    pub runs_dir: PathBuf,
    /// Run every process on PostgreSQL instead: a superuser URL of the
    /// server on which to create one database per process (kept after the
    /// run, named escrow_demo_<timestamp>_<process>).
    #[arg(long, env = "DEMO_POSTGRES", conflicts_with = "coordinator_postgres")]
    pub postgres: Option<String>,
    /// Run only the coordinator on PostgreSQL (a superuser URL, as for
    /// --postgres); the agents stay on SQLite files.
    #[arg(long, env = "DEMO_COORDINATOR_POSTGRES")]
    pub coordinator_postgres: Option<String>,
    /// Directory holding `coordinator`, `region-agent` and `escrowctl`
    /// (default: beside this binary).
    #[arg(long, env = "DEMO_BIN_DIR")]
    pub bin_dir: Option<PathBuf>,
}

/// Shares of the buyers in eu, us and ap, in that order.
#[derive(Debug, Clone, PartialEq)]
pub struct Skew(pub Vec<f64>);

fn parse_three_shares(text: &str) -> Result<Skew, String> {
    let skew = parse_skew(text)?;
    if skew.len() != REGIONS {
        return Err("three shares, for eu, us and ap".into());
    }
    Ok(Skew(skew))
}

/// `eu=20,us=80,ap=230`, naming only the demo's regions.
fn parse_rtt(text: &str) -> Result<Distances, String> {
    let distances = parse_distances(text)?;
    let regions = &REGION_NAMES[..REGIONS];
    if let Some(name) = distances.keys().find(|n| !regions.contains(&n.as_str())) {
        return Err(format!(
            "{name:?} is not one of the demo's regions ({})",
            regions.join(", ")
        ));
    }
    Ok(distances)
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    let seconds: f64 = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if !(0.5..=600.0).contains(&seconds) {
        return Err("0.5..=600 seconds".into());
    }
    Ok(seconds)
}

impl Config {
    /// Buyers in all: `--buyers`, or 1.5 per unit.
    pub fn buyers(&self) -> u64 {
        self.buyers.unwrap_or_else(|| {
            ((self.units as f64 * BUYERS_PER_UNIT_DEFAULT).round() as u64).max(1)
        })
    }

    /// Each region's round trip to the coordinator, by `--rtt`; empty
    /// (every region on loopback) without it.
    pub fn distances(&self) -> Distances {
        self.rtt.clone().unwrap_or_default()
    }

    /// The sale: three regions of equal weight, demand by `--skew`, a hot
    /// start and a long tail over `--seconds`, every buyer paying for its
    /// hold after a short checkout.
    pub fn sale(&self) -> anyhow::Result<Sale> {
        let window = Duration::from_secs_f64(self.seconds);
        let shape = Shape {
            name: "demo".into(),
            skew: self.skew.0.clone(),
            units: self.units,
            buyers: self.buyers(),
            window,
            arrivals: Arrivals::HotStart {
                decay: window.mul_f64(HOT_START_FRACTION),
                base_share: TAIL_SHARE,
            },
            checkout: Some(CHECKOUT),
            retrying_max: RETRYING_MAX,
            seed: 1,
            weights: Vec::new(),
            rtt_ms: Vec::new(),
        };
        shape.sale()
    }

    /// Where each process keeps its database: SQLite files in `run_dir`
    /// unless `--postgres` or `--coordinator-postgres` says otherwise.
    /// Nothing is dropped after the run.
    pub fn storage(&self, run_dir: &Path) -> Storage {
        let sqlite = Backend::Sqlite(run_dir.to_owned());
        let (coordinator, agents) = match (&self.postgres, &self.coordinator_postgres) {
            (Some(url), _) => (
                Backend::Postgres(url.clone()),
                Backend::Postgres(url.clone()),
            ),
            (None, Some(url)) => (Backend::Postgres(url.clone()), sqlite),
            (None, None) => (sqlite.clone(), sqlite),
        };
        Storage {
            coordinator,
            agents,
            drop_postgres: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the defaults are the sale, all on SQLite files in the
    /// run directory; the PostgreSQL flags move the coordinator, or all.
    #[test]
    fn defaults_and_storage() {
        let config = Config::parse_from(["demo"]);
        assert_eq!(config.units, 2_000);
        assert_eq!(config.buyers(), 3_000);
        assert_eq!(config.skew, Skew(vec![85.0, 10.0, 5.0]));
        let sale = config.sale().unwrap();
        assert_eq!(sale.buyers(), 3_000);
        assert!(sale.arrivals.iter().all(|a| a.pay_after.is_some()));
        let dir = Path::new("runs/1");
        let sqlite = Backend::Sqlite(dir.to_owned());
        let storage = config.storage(dir);
        assert_eq!((&storage.coordinator, &storage.agents), (&sqlite, &sqlite));
        assert!(!storage.drop_postgres);

        let url = "postgres://postgres@127.0.0.1:5432/postgres";
        let config = Config::parse_from(["demo", "--coordinator-postgres", url]);
        let storage = config.storage(dir);
        assert_eq!(storage.coordinator, Backend::Postgres(url.into()));
        assert_eq!(storage.agents, sqlite);
        let storage = Config::parse_from(["demo", "--postgres", url]).storage(dir);
        assert_eq!(storage.agents, Backend::Postgres(url.into()));
        assert!(Config::try_parse_from(["demo", "--skew", "1,2"]).is_err());
    }

    /// Goal: without `--rtt` every region is on loopback; with it, the
    /// named regions get their round trips, and a region the demo does not
    /// have, or a malformed pair, is refused.
    #[test]
    fn round_trips() {
        assert!(Config::parse_from(["demo"]).distances().is_empty());
        let config = Config::parse_from(["demo", "--rtt", "eu=20,us=80,ap=230"]);
        let distances = config.distances();
        assert_eq!(distances.len(), 3);
        assert_eq!(
            (distances["eu"], distances["us"], distances["ap"]),
            (20, 80, 230)
        );
        assert_eq!(
            Config::parse_from(["demo", "--rtt", "ap=230"])
                .distances()
                .len(),
            1
        );
        for bad in ["sa=100", "eu=20,mars=900", "eu", "eu=fast", "eu=1,eu=2"] {
            assert!(
                Config::try_parse_from(["demo", "--rtt", bad]).is_err(),
                "{bad}"
            );
        }
    }
}
