//! `scripts/demo`: a flash sale on a real coordinator and three real
//! region agents (eu, us, ap), shown live in the terminal.
//!
//! It runs the sale `bench tail` runs, with the [`harness`]: the cluster
//! of child processes, the crowd of browser-like buyers (one request key
//! each, a 503 retried with it after `Retry-After`), the sampler of the
//! coordinator's view and the analysis. Every process runs on a SQLite
//! file in a fresh run directory (or on PostgreSQL, by flag) and logs
//! there; the directory is kept. With `--rtt`, each named agent reaches
//! the coordinator through a link that delays every call by its round
//! trip (the harness's [`harness::link::Link`]).
//! While the crowd buys, a live view (a terminal) or plain lines (anything
//! else) show each region's stock, answers and hold wait, the
//! coordinator's pool and mode, and the audit; then a summary with the
//! checks and the commands to look further.
//!
//! - [`config`]: the flags, the sale and the storage they describe.
//! - [`live`]: what the view shows at one moment, from its sources.
//! - [`screen`]: the live view (ratatui).
//! - [`plain`]: the same as periodic lines.
//! - [`summary`]: the summary and the commands to look further.

pub mod config;
pub mod live;
pub mod plain;
pub mod screen;
pub mod summary;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use harness::cluster::{process_name, Cluster, ClusterFlags, Logs};
use harness::crowd::{BuyerLog, Progress};
use harness::link::Distances;
use harness::process::Binaries;
use harness::sale::{buy, close_sale, crowd, open_sale, TailRun, TailSettings};
use harness::shape::Sale;
use tokio::sync::watch;

use config::Config;
use live::{Live, Snapshot, Stage};
use screen::Screen;
use summary::Places;

/// Most reserve and confirm requests in flight at once, per region.
pub const IN_FLIGHT: usize = 300;
/// Flags of the coordinator and the agents.
pub const CLUSTER_FLAGS: ClusterFlags = ClusterFlags {
    sync_interval_ms: 200,
    max_in_flight: Some(256),
    max_waiting: Some(4_096),
    wait_timeout_ms: None,
    db_pool_size: Some(4),
};
/// How often the live view is redrawn.
pub const SCREEN_INTERVAL: Duration = Duration::from_millis(200);
/// Exit status when the sale's checks failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit status when a signal or a key stopped the demo.
pub const EXIT_INTERRUPTED: u8 = 130;

/// Runs the demo: starts the cluster, sells, shows, summarises, and stops
/// the cluster whatever happened (its run directory is kept). Exit status
/// 0 when every check passed, [`EXIT_FAILED`] when one failed,
/// [`EXIT_INTERRUPTED`] when stopped early.
pub async fn run(config: Config) -> anyhow::Result<ExitCode> {
    let sale = config.sale()?;
    let binaries = Binaries::locate(config.bin_dir.as_deref())?;
    binaries.check_cluster()?;
    let run_dir = make_run_dir(&config.runs_dir)?;
    init_tracing(&run_dir)?;
    let (stop, stopped) = watch::channel(false);
    watch_signals(stop.clone())?;

    let regions: Vec<String> = sale.regions.iter().map(|r| r.name.clone()).collect();
    let settings = TailSettings {
        storage: config.storage(&run_dir),
        logs: Logs::Dir(run_dir.clone()),
        binaries: binaries.clone(),
        in_flight: IN_FLIGHT,
        cluster: CLUSTER_FLAGS,
        distances: config.distances(),
    };
    println!("demo: run directory {}", run_dir.display());
    println!(
        "demo: starting a coordinator (--policy {}) and agents {}; logs in {}/{}.log and beside it",
        config.policy,
        regions.join(", "),
        run_dir.display(),
        process_name(None)
    );
    if !settings.distances.is_empty() {
        println!(
            "demo: round trips between the agents and the coordinator (a delay link each): {}",
            round_trips(&regions, &settings.distances)
        );
    }
    let tag = postgres_tag(&run_dir);
    let cluster = Cluster::start(&settings, &config.policy, &regions, &tag)
        .await
        .context(
            "starting the cluster (--postgres URL runs every process on PostgreSQL instead, \
             --coordinator-postgres URL only the coordinator)",
        )?;
    let demo = Demo {
        config: &config,
        settings: &settings,
        cluster: &cluster,
        sale: &sale,
        run_dir: &run_dir,
        stop,
    };
    let result = demo.sell(stopped).await;
    println!("demo: stopping the cluster (each process drains)");
    let stopped = cluster.stop().await;
    println!(
        "demo: stopped; the run directory is kept: {}",
        run_dir.display()
    );
    let code = result?;
    stopped?;
    Ok(code)
}

/// One run's parts.
struct Demo<'a> {
    config: &'a Config,
    settings: &'a TailSettings,
    cluster: &'a Cluster,
    sale: &'a Sale,
    run_dir: &'a Path,
    stop: watch::Sender<bool>,
}

/// Where the view goes.
enum View {
    Screen(Screen),
    Plain,
}

impl View {
    fn show(&mut self, snapshot: &Snapshot) -> anyhow::Result<()> {
        match self {
            View::Screen(screen) => screen.draw(snapshot)?,
            View::Plain => println!("{}", plain::line(snapshot)),
        }
        Ok(())
    }

    fn close(self, snapshot: &Snapshot) -> anyhow::Result<()> {
        match self {
            View::Screen(screen) => screen.close(snapshot)?,
            View::Plain => println!("{}\n", plain::line(snapshot)),
        }
        Ok(())
    }

    fn interval(&self) -> Duration {
        match self {
            View::Screen(_) => SCREEN_INTERVAL,
            View::Plain => plain::PLAIN_INTERVAL,
        }
    }
}

impl Demo<'_> {
    async fn sell(&self, mut stopped: watch::Receiver<bool>) -> anyhow::Result<ExitCode> {
        if *stopped.borrow() {
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        }
        let open = open_sale(self.cluster, self.sale).await?;
        let progress = Arc::new(Progress::new(&self.cluster.rtt_ms()));
        let crowd = crowd(self.settings, self.cluster, Some(progress.clone()));
        let run_id = crowd.run_id.clone();
        let mut live = Live::start(
            self.cluster.coordinator_addr(),
            self.sale,
            &self.config.policy,
            progress,
            open.latest_view(),
        );
        let mut view = self.open_view()?;
        let mut tick = tokio::time::interval(view.interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        let buying = buy(crowd, self.sale, open.origin);
        tokio::pin!(buying);
        let logs = loop {
            tokio::select! {
                logs = &mut buying => break Some(logs?),
                _ = tick.tick() => view.show(&live.snapshot(Stage::Selling))?,
                _ = stop_requested(&mut stopped) => break None,
            }
        };
        let Some(logs) = logs else {
            view.close(&live.snapshot(Stage::Selling))?;
            println!("demo: interrupted; the buyers stopped");
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        };
        let closing = close_sale(self.cluster, self.sale, open, &logs, &self.config.policy);
        tokio::pin!(closing);
        let run = loop {
            tokio::select! {
                run = &mut closing => break Some(run?),
                _ = tick.tick() => view.show(&live.snapshot(Stage::Settling))?,
                _ = stop_requested(&mut stopped) => break None,
            }
        };
        let Some(run) = run else {
            view.close(&live.snapshot(Stage::Settling))?;
            println!("demo: interrupted while the regions settled");
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        };
        view.close(&live.snapshot(Stage::Over))?;
        drop(live);
        let ok = self.report(&run, &logs, &run_id);
        if self.config.keep_running {
            stop_requested(&mut stopped).await;
        }
        Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_FAILED)
        })
    }

    fn open_view(&self) -> anyhow::Result<View> {
        if self.config.plain || !std::io::stdout().is_terminal() {
            println!("demo: one line a second: {}", plain::legend());
            return Ok(View::Plain);
        }
        let footer = format!(
            " q, Esc or Ctrl-C stops the demo   run directory {}",
            self.run_dir.display()
        );
        let screen = Screen::open(self.sale.regions.len(), self.stop.clone(), footer)
            .context("opening the live view")?;
        Ok(View::Screen(screen))
    }

    /// Prints the summary, the verdict and the commands to look further;
    /// whether every check passed.
    fn report(&self, run: &TailRun, logs: &[BuyerLog], run_id: &str) -> bool {
        println!("{}", summary::summary(self.sale, run, logs));
        let (ok, verdict) = summary::verdict(run);
        println!("{verdict}\n");
        let places = Places {
            run_dir: self.run_dir.to_owned(),
            coordinator: self.cluster.coordinator_addr(),
            agents: self
                .sale
                .regions
                .iter()
                .map(|r| r.name.clone())
                .zip(self.cluster.agent_addrs())
                .collect(),
            databases: self.cluster.database_urls(),
            escrowctl: self.settings.binaries.escrowctl.clone(),
            held_key: summary::held_key(run_id, logs),
        };
        println!(
            "{}",
            summary::look_further(&places, self.config.keep_running)
        );
        ok
    }
}

/// Waits until a stop is asked for (a signal or a key); never, if nothing
/// can ask any more.
async fn stop_requested(stopped: &mut watch::Receiver<bool>) {
    if stopped.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Asks for a stop on SIGINT (Ctrl-C outside the live view), SIGTERM or
/// SIGHUP. The children are detached from the terminal, so these reach
/// only the demo, which stops them in order.
fn watch_signals(stop: watch::Sender<bool>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
                _ = hangup.recv() => {}
            }
            stop.send_replace(true);
        }
    });
    Ok(())
}

/// `eu 20 ms, us 80 ms, ap loopback`: each region's round trip to the
/// coordinator under `distances`, in `regions`' order.
fn round_trips(regions: &[String], distances: &Distances) -> String {
    let each: Vec<String> = regions
        .iter()
        .map(|name| match distances.get(name) {
            Some(&ms) if ms > 0 => format!("{name} {ms} ms"),
            _ => format!("{name} loopback"),
        })
        .collect();
    each.join(", ")
}

/// Makes `<runs_dir>/<YYYYMMDD-HHMMSS>` (with `-2`, `-3`, ... if taken),
/// absolute.
fn make_run_dir(runs_dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(runs_dir)
        .with_context(|| format!("creating {}", runs_dir.display()))?;
    let runs_dir = std::path::absolute(runs_dir)?;
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    for attempt in 1..=100u32 {
        let name = if attempt == 1 {
            stamp.clone()
        } else {
            format!("{stamp}-{attempt}")
        };
        let dir = runs_dir.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    anyhow::bail!(
        "no free run directory for {stamp} in {}",
        runs_dir.display()
    )
}

/// The prefix of the run's PostgreSQL databases, from its directory's
/// name (unique): `escrow_demo_20260101_120000`.
fn postgres_tag(run_dir: &Path) -> String {
    let name = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name: String = name
        .chars()
        .map(|c| if c.is_ascii_digit() { c } else { '_' })
        .collect();
    format!("escrow_demo_{name}")
}

/// The demo's own log (warnings of the harness) goes to `demo.log` in the
/// run directory: the terminal belongs to the view.
fn init_tracing(run_dir: &Path) -> anyhow::Result<()> {
    let path = run_dir.join("demo.log");
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    tracing_subscriber::fmt()
        .with_writer(std::sync::Mutex::new(file))
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,sqlx::query=error".into()),
        )
        .try_init()
        .map_err(|e| anyhow::anyhow!("setting up the demo's log: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: each run gets a directory of its own even within one second,
    /// and its PostgreSQL prefix is a valid, distinct database name.
    #[test]
    fn run_directories_are_fresh() {
        let runs = std::env::temp_dir().join(format!("demo-runs-test-{}", std::process::id()));
        let first = make_run_dir(&runs).unwrap();
        let second = make_run_dir(&runs).unwrap();
        assert_ne!(first, second);
        assert!(first.is_absolute() && first.is_dir() && second.is_dir());
        let (a, b) = (postgres_tag(&first), postgres_tag(&second));
        assert_ne!(a, b);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_'));
        std::fs::remove_dir_all(runs).unwrap();
    }
}
