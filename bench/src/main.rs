//! `bench`: runs the benchmark and prints its tables.
//!
//! `cargo run --release -p bench -- all` builds the agent and the baseline
//! server, starts each as its own process on loopback with its own scratch
//! database, drives them, and prints Markdown tables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bench::load::{LoadSpec, Workload};
use bench::process::{Binaries, HOT_PATH_PACKAGES};
use bench::report::{self, Machine};
use bench::scenario::{self, AgentFlags, Settings};
use clap::{Parser, Subcommand};

/// Benchmarks the region agent's hot path against a naive
/// one-transaction-per-sale server and an HTTP ceiling.
#[derive(Debug, Parser)]
#[command(name = "bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// A superuser URL of the PostgreSQL to use; scratch databases are
    /// created there and dropped afterwards.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        global = true
    )]
    database_url: String,
    /// Concurrent buyers, each on its own keep-alive connection.
    #[arg(long, default_value_t = 256, global = true, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    clients: u32,
    /// Length of each measurement window of the comparison, seconds.
    #[arg(long, default_value_t = 3.0, global = true)]
    seconds: f64,
    /// Length of each measurement window of the sweeps, seconds.
    #[arg(long, default_value_t = 2.0, global = true)]
    sweep_seconds: f64,
    /// Warm-up before each window, milliseconds.
    #[arg(long, default_value_t = 500, global = true)]
    warmup_ms: u64,
    /// The agent's --max-in-flight (requests per group commit).
    #[arg(long, default_value_t = 256, global = true)]
    agent_max_in_flight: u32,
    /// The agent's --db-pool-size.
    #[arg(long, default_value_t = 16, global = true)]
    agent_db_pool_size: u32,
    /// The agent's --max-waiting (queue per SKU).
    #[arg(long, default_value_t = 4096, global = true)]
    agent_max_waiting: u32,
    /// The naive server's connection pool.
    #[arg(long, default_value_t = 16, global = true)]
    naive_pool_size: u32,
    /// Worker threads of the load generator's runtime.
    #[arg(long, default_value_t = 2, global = true)]
    client_threads: usize,
    /// Directory holding `region-agent` and `bench-server` (default: beside this binary).
    #[arg(long, global = true)]
    bin_dir: Option<PathBuf>,
    /// Do not run `cargo build` for the server binaries first.
    #[arg(long, global = true)]
    no_build: bool,
}

#[derive(Debug, Clone, Subcommand)]
enum Command {
    /// The comparison table, then both sweeps.
    All,
    /// The comparison table only: ceiling, naive, agent phases, ratios.
    Compare,
    /// The sweeps only: throughput by --max-in-flight and by client count.
    Sweep,
    /// The agent alone on one hot SKU (the phase to profile; prints its pid).
    Hot,
    /// Drives an already running server (e.g. `scripts/run`) on one existing
    /// SKU; nothing is built, started or created.
    Load {
        /// The server's address.
        #[arg(long, default_value = "127.0.0.1:7100")]
        addr: SocketAddr,
        /// The SKU to buy; repeat to spread buyers uniformly over several.
        #[arg(long, default_values_t = ["hot".to_owned()])]
        sku: Vec<String>,
        /// The buyer API key.
        #[arg(long, default_value = bench::TENANT_KEY)]
        tenant_key: String,
    },
}

fn seconds(s: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(s > 0.0 && s <= 600.0, "seconds must be in (0, 600]");
    Ok(Duration::from_secs_f64(s))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    anyhow::ensure!(
        cli.client_threads >= 1,
        "--client-threads must be at least 1"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.client_threads)
        .enable_all()
        .build()
        .context("building the load generator's runtime")?;
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Load {
        addr,
        sku,
        tenant_key,
    } = &cli.command
    {
        let spec = LoadSpec {
            addr: *addr,
            token: tenant_key.clone(),
            clients: cli.clients as usize,
            warmup: Duration::from_millis(cli.warmup_ms),
            measure: seconds(cli.seconds)?,
            loops_per_client: None,
            workload: Workload::Reserve { skus: sku.clone() },
            run_id: format!("load{}", std::process::id()),
        };
        let report = bench::load::run(spec).await?;
        let label = format!("{addr} {}", sku.join(","));
        println!("{}", report::single(&label, &report));
        return Ok(());
    }
    if !cli.no_build && cli.bin_dir.is_none() {
        Binaries::build(&HOT_PATH_PACKAGES).await?;
    }
    let binaries = Binaries::locate(cli.bin_dir.as_deref())?;
    binaries.check()?;
    let settings = Settings {
        database_url: cli.database_url.clone(),
        clients: cli.clients as usize,
        warmup: Duration::from_millis(cli.warmup_ms),
        measure: seconds(cli.seconds)?,
        sweep_measure: seconds(cli.sweep_seconds)?,
        agent: AgentFlags {
            max_in_flight: cli.agent_max_in_flight,
            db_pool_size: cli.agent_db_pool_size,
            max_waiting: cli.agent_max_waiting,
        },
        naive_pool_size: cli.naive_pool_size,
        binaries,
    };
    let facts = bench::database::server_facts(&settings.database_url).await?;
    let machine = Machine::detect(facts);
    println!("{}", report::header(&machine, &settings));
    let watch = bench::interference::Watch::start();
    if matches!(cli.command, Command::All | Command::Compare) {
        let comparison = scenario::compare(&settings).await?;
        println!("{}", report::comparison(&comparison));
    }
    if matches!(cli.command, Command::Hot) {
        let hot = scenario::hot_only(&settings).await?;
        println!("{}", report::single("agent: hot SKU", &hot));
    }
    if matches!(cli.command, Command::All | Command::Sweep) {
        let batch = scenario::sweep_batch(&settings).await?;
        println!("{}", report::sweep_batch(&batch));
        let clients = scenario::sweep_clients(&settings).await?;
        println!("{}", report::sweep_clients(&clients));
    }
    println!("{}", watch.stop().summary(machine.cores));
    Ok(())
}
