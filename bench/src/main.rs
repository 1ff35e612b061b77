//! `bench`: runs the benchmark and prints its tables.
//!
//! `cargo run --release -p bench -- all` builds the agent and the baseline
//! server, starts each as its own process on loopback with its own scratch
//! database, drives them, and prints Markdown tables.
//! `cargo run --release -p bench -- tail` runs the tail of a sale on a
//! coordinator and its agents, once per policy (see `bench::tail`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bench::load::{LoadSpec, Workload};
use bench::report::{self, Machine};
use bench::scenario::{self, AgentFlags, Settings};
use clap::{Parser, Subcommand};
use harness::cluster::{ClusterFlags, Logs, Storage};
use harness::link::{parse_distances, Distances};
use harness::process::Binaries;
use harness::sale::TailSettings;
use harness::shape::{
    default_skew, parse_skew, scenario_sale, Sale, Shape, UserLimit, DISTANCE_PRESETS, PRESETS,
};

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
    /// Skip the comparison's phases on a synchronous standby
    /// (`scripts/ha-region`, about a minute and a half).
    #[arg(long, global = true)]
    no_standby: bool,
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
    Hot {
        /// The agent on an embedded SQLite file instead of PostgreSQL.
        #[arg(long)]
        sqlite: bool,
    },
    /// The tail of a sale on a coordinator and its agents (started here,
    /// on scratch databases), once per policy: time to 50/90/99/100% of
    /// the units held, 503s, buyers turned away while units were free.
    Tail(Box<TailArgs>),
    /// How many regions and SKUs one coordinator serves: the real
    /// coordinator on a scratch PostgreSQL database, region agents played
    /// here speaking the real protocol; syncs per second back to back, then
    /// takes per second in central mode while the agents sync at their
    /// interval, with latencies.
    Coordinator(CapacityArgs),
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
        #[arg(long, default_value = harness::TENANT_KEY)]
        tenant_key: String,
    },
}

/// `bench coordinator`'s flags.
#[derive(Debug, Clone, clap::Args)]
struct CapacityArgs {
    /// Region agents played.
    #[arg(long, default_value_t = 20)]
    regions: usize,
    /// Escrow-mode SKUs, each in every region.
    #[arg(long, default_value_t = 1_000)]
    skus: usize,
    /// Central-mode SKUs, each in every region, that the takers take from.
    #[arg(long, default_value_t = 100)]
    central_skus: usize,
    /// Takers per region in the take phase.
    #[arg(long, default_value_t = 4)]
    takers: usize,
    /// Length of each phase, seconds.
    #[arg(long, default_value_t = 10.0)]
    phase_seconds: f64,
    /// The played agents' sync interval in the take phase, ms.
    #[arg(long, default_value_t = 200)]
    sync_interval_ms: u64,
    /// Escrow SKUs each played agent sells a unit of before each sync:
    /// the SKUs its delta report carries.
    #[arg(long, default_value_t = 10)]
    changes_per_sync: usize,
}

/// `bench tail`'s flags.
#[derive(Debug, Clone, clap::Args)]
struct TailArgs {
    /// A preset (skewed-701, spread-700, five-10k, skewed-20x on
    /// loopback; dist-spread, dist-spread-fit, dist-skewed,
    /// dist-skewed-fit, dist-five, dist-burst at a distance), `all` (the
    /// loopback ones) or `distance` (the distance ones); the flags below
    /// change a preset's values.
    #[arg(long)]
    shape: Option<String>,
    /// Round trip between each region and the coordinator, e.g.
    /// eu=20,us=80,ap=230 (ms): a user-space delay on every agent-coordinator
    /// connection. Overrides the shape's or the scenario's `rtt_ms`.
    #[arg(long, value_parser = parse_distances)]
    rtt: Option<Distances>,
    /// Stock weight per region, e.g. 5,3,2 (default: the preset's, or 1 each).
    #[arg(long, value_delimiter = ',')]
    weights: Option<Vec<u32>>,
    /// Regions, 1..=5, named eu, us, ap, sa, af in that order (default 3).
    #[arg(long)]
    regions: Option<usize>,
    /// Demand share per region, e.g. 85,10,5 (default by region count:
    /// 85,10,5 for 3, 60,20,10,5,5 for 5).
    #[arg(long)]
    skew: Option<String>,
    /// Units on sale (default 701).
    #[arg(long)]
    units: Option<u64>,
    /// Buyers (default 2,600).
    #[arg(long)]
    buyers: Option<u64>,
    /// The coordinator's --policy of each run, comma-separated (central,
    /// tail-merge, static, refill, proportional).
    #[arg(long, value_delimiter = ',', default_values_t = bench::tail::DEFAULT_POLICIES.map(String::from))]
    policies: Vec<String>,
    /// Most reserve requests in flight at once, per region (a region's
    /// buyers wait for none of another region's).
    #[arg(long, default_value_t = 300)]
    in_flight: usize,
    /// Every buyer arrives within this window, evenly spaced, ms (default:
    /// the preset's, 500 on loopback).
    #[arg(long)]
    window_ms: Option<u64>,
    /// A buyer stops retrying 503s this long after its first request, s.
    #[arg(long, default_value_t = 60.0)]
    retry_for_s: f64,
    /// Seed of the buyers' order over regions (with --scenario: of its
    /// crowd, by default the scenario's own).
    #[arg(long)]
    seed: Option<u64>,
    /// Runs every shape this many times, on seeds --seed, --seed + 1, ...,
    /// and ends with how many seeds met every distance target per shape
    /// (one seed's p99 of a small region is one buyer; judge on several);
    /// with --scenario, also the simulator's median figures over the seeds
    /// beside the real ones'.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// --sync-interval-ms of the agents and the coordinator (default 200,
    /// or the scenario's).
    #[arg(long)]
    sync_interval_ms: Option<u64>,
    /// The agents' --wait-timeout-ms (default: the agent's own, or the scenario's).
    #[arg(long)]
    wait_timeout_ms: Option<u64>,
    /// --db-pool-size of the coordinator and each agent (six processes
    /// share one PostgreSQL).
    #[arg(long, default_value_t = 8)]
    db_pool_size: u32,
    /// A simulator scenario (a TOML file or a built-in name): the same sale
    /// as `simulate run`, instead of a shape.
    #[arg(long, conflicts_with = "shape")]
    scenario: Option<String>,
    /// With --scenario: buyers arriving later than this are not sent, s.
    #[arg(long, default_value_t = 120.0)]
    cut_s: f64,
    /// After each table, the coordinator's view over each run (mode, pool,
    /// in transit, each region's available and held).
    #[arg(long)]
    timeline: bool,
    /// The SKU's per-user limit: `region`, or `global` with each buyer's
    /// home hashed from its id (`global-hashed`: most buy away from home)
    /// or named by it (`global-named`: everybody buys at home).
    #[arg(long, value_parser = UserLimit::parse, default_value = "region")]
    user_limit: UserLimit,
}

fn seconds(s: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(s > 0.0 && s <= 600.0, "seconds must be in (0, 600]");
    Ok(Duration::from_secs_f64(s))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            // Creating and dropping scratch databases takes seconds; sqlx's
            // slow-statement warnings about it say nothing about the servers.
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,sqlx::query=error".into()),
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
    if let Command::Tail(args) = &cli.command {
        return tail(&cli, args).await;
    }
    if let Command::Coordinator(args) = &cli.command {
        return coordinator_capacity(&cli, args).await;
    }
    if !cli.no_build && cli.bin_dir.is_none() {
        Binaries::build().await?;
    }
    let binaries = Binaries::locate(cli.bin_dir.as_deref())?;
    bench::check_hot_path(&binaries)?;
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
        standby: !cli.no_standby,
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
    if let Command::Hot { sqlite } = cli.command {
        let hot = scenario::hot_only(&settings, sqlite).await?;
        let label = if sqlite {
            "agent on SQLite: hot SKU"
        } else {
            "agent: hot SKU"
        };
        println!("{}", report::single(label, &hot));
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

/// The sales a `bench tail` invocation runs.
fn tail_sales(args: &TailArgs, seed: u64) -> anyhow::Result<Vec<Sale>> {
    if let Some(path) = &args.scenario {
        let mut scenario = simulations::Scenario::load(path)?;
        scenario.seed = seed;
        anyhow::ensure!(args.cut_s > 0.0, "--cut-s must be positive");
        let mut sale = scenario_sale(path, &scenario, Duration::from_secs_f64(args.cut_s))?;
        sale.user_limit = args.user_limit;
        return Ok(vec![sale]);
    }
    let mut shapes = match args.shape.as_deref() {
        Some("all") => PRESETS
            .iter()
            .filter(|p| p.in_all)
            .map(|p| Shape::preset(p.name))
            .collect::<anyhow::Result<Vec<_>>>()?,
        Some("distance") => DISTANCE_PRESETS
            .iter()
            .filter(|p| p.in_all)
            .map(|p| Shape::preset(p.name))
            .collect::<anyhow::Result<Vec<_>>>()?,
        Some(name) => vec![Shape::preset(name)?],
        None => {
            let mut shape = Shape::preset(PRESETS[0].name)?;
            shape.name = "custom".into();
            vec![shape]
        }
    };
    anyhow::ensure!(
        args.retry_for_s >= 0.0 && args.retry_for_s <= 3_600.0,
        "--retry-for-s must be in 0..=3600"
    );
    let skew = args
        .skew
        .as_deref()
        .map(parse_skew)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--skew: {e}"))?;
    for shape in &mut shapes {
        match (args.regions, &skew) {
            (Some(n), Some(skew)) => {
                anyhow::ensure!(skew.len() == n, "--skew needs one share per region");
                shape.skew = skew.clone();
            }
            (None, Some(skew)) => shape.skew = skew.clone(),
            (Some(n), None) => shape.skew = default_skew(n)?,
            (None, None) => {}
        }
        if let Some(units) = args.units {
            shape.units = units;
        }
        if let Some(buyers) = args.buyers {
            shape.buyers = buyers;
        }
        if let Some(weights) = &args.weights {
            shape.weights = weights.clone();
        }
        if let Some(ms) = args.window_ms {
            shape.window = Duration::from_millis(ms);
        }
        shape.retrying_max = Duration::from_secs_f64(args.retry_for_s);
        shape.seed = seed;
    }
    shapes
        .iter()
        .map(|shape| {
            let mut sale = shape.sale()?;
            sale.user_limit = args.user_limit;
            Ok(sale)
        })
        .collect()
}

/// `git describe` of the workspace the binaries were built from.
fn code_version() -> String {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::process::Command::new("git")
        .arg("-C")
        .arg(workspace)
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or("unknown commit".into(), |o| {
            format!("commit {}", String::from_utf8_lossy(&o.stdout).trim())
        })
}

async fn coordinator_capacity(cli: &Cli, args: &CapacityArgs) -> anyhow::Result<()> {
    if !cli.no_build && cli.bin_dir.is_none() {
        Binaries::build().await?;
    }
    let binaries = Binaries::locate(cli.bin_dir.as_deref())?;
    binaries.check_cluster()?;
    let settings = bench::capacity::CapacitySettings {
        server_url: cli.database_url.clone(),
        coordinator: binaries.coordinator,
        regions: args.regions,
        skus: args.skus,
        central_skus: args.central_skus,
        takers_per_region: args.takers,
        phase: seconds(args.phase_seconds)?,
        sync_interval: Duration::from_millis(args.sync_interval_ms),
        changes_per_sync: args.changes_per_sync,
    };
    let facts = bench::database::server_facts(&cli.database_url).await?;
    let machine = Machine::detect(facts);
    let watch = bench::interference::Watch::start();
    let capacity = bench::capacity::run(&settings).await?;
    println!("{}", bench::capacity::table(&settings, &capacity));
    println!("{}", watch.stop().summary(machine.cores));
    Ok(())
}

async fn tail(cli: &Cli, args: &TailArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=1_000).contains(&args.seeds),
        "--seeds must be in 1..=1000"
    );
    let scenario = match &args.scenario {
        Some(path) => Some(simulations::Scenario::load(path)?),
        None => None,
    };
    let first = args.seed.unwrap_or(scenario.as_ref().map_or(1, |s| s.seed));
    let seeded: Vec<(u64, Vec<Sale>)> = (first..first + args.seeds)
        .map(|seed| tail_sales(args, seed).map(|sales| (seed, sales)))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!args.policies.is_empty(), "--policies names at least one");
    if !cli.no_build && cli.bin_dir.is_none() {
        Binaries::build().await?;
    }
    let binaries = Binaries::locate(cli.bin_dir.as_deref())?;
    binaries.check_cluster()?;
    let agent = scenario.as_ref().map(|s| s.agent.clone());
    let settings = TailSettings {
        storage: Storage::scratch(&cli.database_url),
        logs: Logs::Stderr,
        binaries,
        in_flight: args.in_flight,
        cluster: ClusterFlags {
            sync_interval_ms: args
                .sync_interval_ms
                .or(agent.as_ref().map(|a| a.sync_interval_ms))
                .unwrap_or(200),
            max_in_flight: Some(
                agent
                    .as_ref()
                    .map_or(cli.agent_max_in_flight, |a| a.max_in_flight as u32),
            ),
            max_waiting: Some(
                agent
                    .as_ref()
                    .map_or(cli.agent_max_waiting, |a| a.max_waiting as u32),
            ),
            wait_timeout_ms: args
                .wait_timeout_ms
                .or(agent.as_ref().map(|a| a.wait_timeout_ms)),
            db_pool_size: Some(args.db_pool_size),
        },
        distances: args.rtt.clone().unwrap_or_default(),
    };
    let facts = bench::database::server_facts(&cli.database_url).await?;
    let machine = Machine::detect(facts);
    println!(
        "{}",
        bench::tail::report::header(&machine, &settings, &code_version())
    );
    let watch = bench::interference::Watch::start();
    let mut ok = true;
    let mut verdicts = bench::tail::report::Verdicts::default();
    let mut fidelity = bench::tail::fidelity::OverSeeds::default();
    for (seed, sales) in &seeded {
        for sale in sales {
            let mut runs = Vec::new();
            for policy in &args.policies {
                eprintln!("bench tail: {} / {policy} / seed {seed} ...", sale.label);
                runs.push(bench::tail::run_policy(&settings, sale, policy).await?);
            }
            println!("{}", bench::tail::report::table(sale, &runs));
            if let Some(scenario) = &scenario {
                let simulated = runs
                    .iter()
                    .map(|run| bench::tail::fidelity::simulate(scenario, &run.policy, *seed))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                println!("{}", bench::tail::fidelity::table(&runs, &simulated));
                fidelity.add(&runs, &simulated);
            }
            if args.timeline {
                for run in &runs {
                    println!("{}", bench::tail::report::timeline(run));
                }
            }
            verdicts.add(sale, *seed, &runs);
            ok &= bench::tail::report::all_ok(&runs);
        }
    }
    if args.seeds > 1 {
        println!("{}", verdicts.table());
        if scenario.is_some() {
            println!("{}", fidelity.table());
        }
    }
    println!("{}", watch.stop().summary(machine.cores));
    anyhow::ensure!(ok, "a run failed its checks (see FAILED above)");
    Ok(())
}
