//! The tables the `bench` command prints: Markdown, so a run's output can
//! be pasted into `docs/performance.md` as it is.

use std::fmt::Write as _;

use harness::outcome::{Outcome, Tally};
use harness::report::thousands;

use crate::database::ServerFacts;
use crate::interference::FOREIGN_SHARE_MAX;
use crate::load::LoadReport;
use crate::scenario::{
    Comparison, Settings, SweepPoint, CART_SKUS, LIMIT_BATCH, REJECTIONS, SALES, SETTLES,
    SOLD_OUT_STOCK,
};

/// The targets.
pub mod targets {
    /// Agent hot-SKU holds/s over naive holds/s, at least.
    pub const AGENT_OVER_NAIVE_MIN: f64 = 10.0;
    /// Agent hot-SKU holds/s over the HTTP ceiling, at least (issue 23).
    pub const AGENT_OVER_CEILING_MIN: f64 = 0.4;
    /// Agent hot-SKU holds/s over the composed limit of a durable hold,
    /// at least (issue 23).
    pub const AGENT_OVER_LIMIT_MIN: f64 = 0.75;
    /// Agent sold-out rejections/s over the HTTP ceiling, at least.
    pub const SOLD_OUT_OVER_CEILING_MIN: f64 = 0.8;
    /// Agent p99 latency below this in every phase, milliseconds, at
    /// [`P99_CLIENTS`] clients (issue 23).
    pub const P99_MS_MAX: f64 = 20.0;
    /// The client count the p99 target is set at.
    pub const P99_CLIENTS: usize = 64;
    /// Agent holds/s over 100 SKUs over the hot SKU's, at least (issue 23).
    pub const MULTI_OVER_HOT_MIN: f64 = 0.9;
    /// Agent holds/s in the mix over the hot SKU's, at least (issue 23).
    pub const MIX_OVER_HOT_MIN: f64 = 0.8;
    /// Agent holds/s in the whole drop over the hot SKU's, at least
    /// (issue 23).
    pub const DROP_OVER_HOT_MIN: f64 = 0.7;
    /// Agent holds/s in central mode through a coordinator over the hot
    /// SKU's, at least (issue 23).
    pub const CENTRAL_OVER_HOT_MIN: f64 = 0.7;
    /// The agent's hot-SKU holds/s on SQLite over its holds/s on
    /// PostgreSQL, at least (issue 23).
    pub const SQLITE_OVER_POSTGRES_MIN: f64 = 0.75;
    /// Settlements/s over holds/s in the mix, at least ("as many").
    pub const MIX_SETTLED_OVER_HELD_MIN: f64 = 0.95;
    /// Hot-SKU holds/s on a synchronous standby over the single server's,
    /// at least (issue 21).
    pub const STANDBY_OVER_SINGLE_MIN: f64 = 0.5;
}

/// The machine a run was on.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Cores the process may use.
    pub cores: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu: String,
    /// The PostgreSQL server.
    pub postgres: ServerFacts,
}

impl Machine {
    /// Reads the local machine's description.
    pub fn detect(postgres: ServerFacts) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        Self {
            cores,
            cpu,
            postgres,
        }
    }
}

fn ms(report: &LoadReport, quantile: f64, actions: bool) -> String {
    let h = if actions {
        &report.action_latency
    } else {
        &report.reserve_latency
    };
    if h.is_empty() {
        return "-".into();
    }
    format!("{:.2}", h.value_at_quantile(quantile) as f64 / 1000.0)
}

/// Which calls of a run a table row shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Every call.
    All,
    /// Reserve calls only (latency and outcomes).
    Reserves,
    /// Confirm and release calls only.
    Actions,
}

fn is_action(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Confirmed | Outcome::Released | Outcome::Refused | Outcome::NotFound
    )
}

fn row(out: &mut String, label: &str, report: &LoadReport, rate: f64, unit: &str, part: Part) {
    let actions = part == Part::Actions;
    let mut shown = Tally::default();
    for o in Outcome::ALL {
        if part == Part::All || is_action(o) == actions {
            shown[o] = report.window[o];
        }
    }
    let _ = writeln!(
        out,
        "| {label} | {} | {} {unit} | {} | {} | {} | {} | {shown} | {} |",
        report.clients,
        thousands(rate),
        ms(report, 0.5, actions),
        ms(report, 0.99, actions),
        ms(report, 0.999, actions),
        group_commit(report),
        others(report),
    );
}

/// `mean batch / mean commit ms` of an agent run, `-` for the baselines.
fn group_commit(report: &LoadReport) -> String {
    match report.commits {
        Some(c) if c.commits > 0.0 => {
            format!("{:.0} / {:.2}", c.mean_batch(), c.mean_commit_ms())
        }
        _ => "-".into(),
    }
}

/// Other processes' share of the machine during a run; `!` marks a busy one.
fn others(report: &LoadReport) -> String {
    match report.others_share {
        Some(share) if share > FOREIGN_SHARE_MAX => format!("{:.0}% !", 100.0 * share),
        Some(share) => format!("{:.0}%", 100.0 * share),
        None => "-".into(),
    }
}

const TABLE_HEAD: &str = "| run | clients | rate | p50 ms | p99 ms | p99.9 ms | batch / commit ms | outcomes in window | others' CPU |\n|---|---:|---:|---:|---:|---:|---:|---|---:|\n";

/// The header lines: machine, durability, flags.
pub fn header(machine: &Machine, settings: &Settings) -> String {
    let mut out = String::new();
    let pg = &machine.postgres;
    let _ = writeln!(
        out,
        "Machine: {} cores ({}), {}; load generator on the same machine.",
        machine.cores, machine.cpu, pg.version
    );
    let durable = if pg.is_durable() {
        "every 201 was flushed to the WAL on disk before it was sent (durable)"
    } else {
        "WARNING: NOT durable; numbers are not comparable"
    };
    let _ = writeln!(
        out,
        "PostgreSQL synchronous_commit={}, fsync={}: {durable}.",
        pg.synchronous_commit, pg.fsync
    );
    let _ = writeln!(
        out,
        "Agent on SQLite: WAL journal, synchronous=FULL: every 201 was synced to disk before it was sent (durable)."
    );
    let _ = writeln!(
        out,
        "Agent flags: {}; naive pool {} connections; {} clients, {:.1} s windows after {:.1} s warm-up.",
        settings.agent.args().join(" "),
        settings.naive_pool_size,
        settings.clients,
        settings.measure.as_secs_f64(),
        settings.warmup.as_secs_f64(),
    );
    out
}

/// The side-by-side table, the ratios against the targets, and the checks.
pub fn comparison(c: &Comparison) -> String {
    let mut out = String::new();
    out.push_str(TABLE_HEAD);
    let ceiling = c.ceiling.rate(&SALES);
    let naive = c.naive.rate(&SALES);
    let hot = c.agent_hot.rate(&SALES);
    let sold_out = c.agent_sold_out.rate(&REJECTIONS);
    let rows: [(&str, &LoadReport, f64, &str, Part); 16] = [
        (
            "HTTP ceiling: parse, answer 201, no storage",
            &c.ceiling,
            ceiling,
            "201/s",
            Part::All,
        ),
        (
            "naive: one transaction per sale",
            &c.naive,
            naive,
            "holds/s",
            Part::All,
        ),
        ("agent: hot SKU", &c.agent_hot, hot, "holds/s", Part::All),
        (
            "agent: sold-out path",
            &c.agent_sold_out,
            sold_out,
            "rejections/s",
            Part::All,
        ),
        (
            "agent: 100 SKUs, uniform",
            &c.agent_multi,
            c.agent_multi.rate(&SALES),
            "holds/s",
            Part::All,
        ),
        (
            "agent: mix, reserve calls",
            &c.agent_mix,
            c.agent_mix.rate(&SALES),
            "holds/s",
            Part::Reserves,
        ),
        (
            "agent: mix, confirm/release calls",
            &c.agent_mix,
            c.agent_mix.rate(&SETTLES),
            "settled/s",
            Part::Actions,
        ),
        (
            "agent: carts of 3 SKUs, items held (3 per 201)",
            &c.agent_carts,
            CART_SKUS as f64 * c.agent_carts.rate(&SALES),
            "items/s",
            Part::All,
        ),
        (
            "agent: whole drop (1 hot + 99 warm SKUs), reserve calls",
            &c.agent_drop,
            c.agent_drop.rate(&SALES),
            "holds/s",
            Part::Reserves,
        ),
        (
            "agent: whole drop, confirm/release calls",
            &c.agent_drop,
            c.agent_drop.rate(&SETTLES),
            "settled/s",
            Part::Actions,
        ),
        (
            "agent: whole drop, sold-out storm",
            &c.agent_drop_storm,
            c.agent_drop_storm.rate(&REJECTIONS),
            "rejections/s",
            Part::All,
        ),
        (
            "agent through a coordinator: hot SKU, escrow mode",
            &c.coordinated_escrow,
            c.coordinated_escrow.rate(&SALES),
            "holds/s",
            Part::All,
        ),
        (
            "agent through a coordinator: hot SKU, central mode (every batch takes)",
            &c.coordinated_central,
            c.coordinated_central.rate(&SALES),
            "holds/s",
            Part::All,
        ),
        (
            "agent on SQLite: hot SKU",
            &c.sqlite_hot,
            c.sqlite_hot.rate(&SALES),
            "holds/s",
            Part::All,
        ),
        (
            "agent on SQLite: sold-out path",
            &c.sqlite_sold_out,
            c.sqlite_sold_out.rate(&REJECTIONS),
            "rejections/s",
            Part::All,
        ),
        (
            "agent on SQLite: 100 SKUs, uniform",
            &c.sqlite_multi,
            c.sqlite_multi.rate(&SALES),
            "holds/s",
            Part::All,
        ),
    ];
    for (label, report, rate, unit, part) in rows {
        row(&mut out, label, report, rate, unit, part);
    }
    if let Ok(standby) = &c.standby {
        let rows = [
            ("agent, synchronous standby: hot SKU", &standby.hot),
            (
                "agent, synchronous standby: 100 SKUs, uniform",
                &standby.multi,
            ),
        ];
        for (label, report) in rows {
            let rate = report.rate(&SALES);
            row(&mut out, label, report, rate, "holds/s", Part::All);
        }
    }

    out.push('\n');
    out.push_str("| ratio | measured | target | met |\n|---|---:|---:|---|\n");
    let multi = c.agent_multi.rate(&SALES);
    let mix = c.agent_mix.rate(&SALES);
    let mix_settled = c.agent_mix.rate(&SETTLES);
    let drop = c.agent_drop.rate(&SALES);
    let central = c.coordinated_central.rate(&SALES);
    let sqlite = c.sqlite_hot.rate(&SALES);
    let composed = composed_limit(c);
    let (slowest, p99) = agent_phases(c)
        .into_iter()
        .map(|(name, r)| (name, r.reserve_ms(0.99).max(action_ms(r, 0.99))))
        .fold(
            ("", 0.0),
            |worst, (name, p99)| if p99 > worst.1 { (name, p99) } else { worst },
        );
    let percent = |part: f64, whole: f64| format!("{:.0}%", 100.0 * part / whole.max(1e-9));
    // A row of `part` as a share of `whole`, met at `min` or more.
    let share = |name: &str, part: f64, whole: f64, min: f64| {
        (
            name.to_owned(),
            percent(part, whole),
            format!(">= {:.0}%", 100.0 * min),
            part >= min * whole,
        )
    };
    let checks = [
        share(
            "agent 100 SKUs / agent hot SKU",
            multi,
            hot,
            targets::MULTI_OVER_HOT_MIN,
        ),
        share(
            "agent mix reserves / agent hot SKU",
            mix,
            hot,
            targets::MIX_OVER_HOT_MIN,
        ),
        share(
            "agent whole drop reserves / agent hot SKU",
            drop,
            hot,
            targets::DROP_OVER_HOT_MIN,
        ),
        share(
            "agent central mode through a coordinator / agent hot SKU",
            central,
            hot,
            targets::CENTRAL_OVER_HOT_MIN,
        ),
        share(
            "agent on SQLite hot SKU / on PostgreSQL",
            sqlite,
            hot,
            targets::SQLITE_OVER_POSTGRES_MIN,
        ),
        (
            "agent cart items / agent hot SKU (no target)".to_owned(),
            percent(CART_SKUS as f64 * c.agent_carts.rate(&SALES), hot),
            "-".to_owned(),
            true,
        ),
        share(
            "agent mix settled / mix reserves",
            mix_settled,
            mix,
            targets::MIX_SETTLED_OVER_HELD_MIN,
        ),
        (
            "agent hot SKU / naive".to_owned(),
            format!("{:.1}x", hot / naive.max(1e-9)),
            format!(">= {:.0}x", targets::AGENT_OVER_NAIVE_MIN),
            hot >= targets::AGENT_OVER_NAIVE_MIN * naive,
        ),
        share(
            "agent hot SKU / HTTP ceiling",
            hot,
            ceiling,
            targets::AGENT_OVER_CEILING_MIN,
        ),
        share(
            "agent hot SKU / composed limit of a durable hold",
            hot,
            composed,
            targets::AGENT_OVER_LIMIT_MIN,
        ),
        share(
            "agent sold-out / HTTP ceiling",
            sold_out,
            ceiling,
            targets::SOLD_OUT_OVER_CEILING_MIN,
        ),
        (
            if c.agent_hot.clients == targets::P99_CLIENTS {
                format!(
                    "agent p99, slowest phase ({slowest}), {} clients",
                    c.agent_hot.clients
                )
            } else {
                format!(
                    "agent p99, slowest phase ({slowest}), {} clients (the target is at {}: --clients {})",
                    c.agent_hot.clients,
                    targets::P99_CLIENTS,
                    targets::P99_CLIENTS
                )
            },
            format!("{p99:.2} ms"),
            format!("< {:.0} ms", targets::P99_MS_MAX),
            p99 < targets::P99_MS_MAX,
        ),
    ];
    let standby = c.standby.as_ref().ok().map(|standby| {
        share(
            "agent hot SKU, synchronous standby / single server",
            standby.hot.rate(&SALES),
            hot,
            targets::STANDBY_OVER_SINGLE_MIN,
        )
    });
    for (name, measured, target, met) in checks.into_iter().chain(standby) {
        let met = if met { "yes" } else { "NO" };
        let _ = writeln!(out, "| {name} | {measured} | {target} | {met} |");
    }
    out.push('\n');
    match &c.standby {
        Ok(standby) => {
            let _ = writeln!(
                out,
                "Failover (the primary's machine killed with -9 under the hot SKU): a standby took writes {:.1} s later; the first HELD of a request sent after the kill came {:.1} s after it.",
                standby.promoted.as_secs_f64(),
                standby.first_hold.as_secs_f64(),
            );
        }
        Err(why) => {
            let _ = writeln!(out, "The agent on a synchronous standby: {why}.");
        }
    }

    out.push('\n');
    out.push_str(&limit(c));
    out.push('\n');
    for line in correctness(c) {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The limit of a durable hold on this machine: the HTTP ceiling, the
/// database at the agent's commit without HTTP, the two composed, and
/// each phase that holds as a share of it.
fn limit(c: &Comparison) -> String {
    let mut out = String::new();
    let ceiling = c.ceiling.rate(&SALES);
    let database = c.limit.rate();
    let composed = composed_limit(c);
    let answered = c.ceiling.total[Outcome::Held] as f64;
    let (database_us, client_us) = c.limit.cpu_us_per_row();
    out.push_str("| limit | rate | CPU per operation |\n|---|---:|---|\n");
    let _ = writeln!(
        out,
        "| HTTP ceiling: parse, answer 201, no storage | {} 201/s | {:.1} µs in the server |",
        thousands(ceiling),
        1e6 * c.ceiling_cpu_s / answered.max(1.0),
    );
    let _ = writeln!(
        out,
        "| database at the agent's commit: 1 SKU, {LIMIT_BATCH} holds a commit, back to back, no HTTP | {} holds/s ({:.2} ms a commit) | {database_us:.1} µs in PostgreSQL, {client_us:.1} µs in the client |",
        thousands(database),
        c.limit.commit_ms(),
    );
    let _ = writeln!(
        out,
        "| composed limit of a durable hold, 1 / (1/ceiling + 1/database) | {} holds/s | |",
        thousands(composed),
    );
    out.push_str("\n| phase | holds/s | share of the composed limit |\n|---|---:|---:|\n");
    let mut phases = vec![
        ("agent: hot SKU", &c.agent_hot),
        ("agent: 100 SKUs", &c.agent_multi),
        ("agent: mix, reserves", &c.agent_mix),
        ("agent: whole drop, reserves", &c.agent_drop),
        (
            "agent through a coordinator, central mode",
            &c.coordinated_central,
        ),
        ("agent on SQLite: hot SKU", &c.sqlite_hot),
    ];
    if let Ok(standby) = &c.standby {
        phases.push(("agent, synchronous standby: hot SKU", &standby.hot));
    }
    for (name, report) in phases {
        let rate = report.rate(&SALES);
        let _ = writeln!(
            out,
            "| {name} | {} | {:.0}% |",
            thousands(rate),
            100.0 * rate / composed.max(1e-9)
        );
    }
    out
}

/// The composed limit of a durable hold, holds/s: the HTTP ceiling and
/// the database at the agent's commit, one after the other
/// (`1 / (1/ceiling + 1/database)`).
fn composed_limit(c: &Comparison) -> f64 {
    let ceiling = c.ceiling.rate(&SALES);
    let database = c.limit.rate();
    1.0 / (1.0 / ceiling.max(1e-9) + 1.0 / database.max(1e-9))
}

/// The agent's phases on PostgreSQL, by name.
fn agent_phases(c: &Comparison) -> [(&'static str, &LoadReport); 9] {
    [
        ("hot SKU", &c.agent_hot),
        ("sold-out", &c.agent_sold_out),
        ("100 SKUs", &c.agent_multi),
        ("mix", &c.agent_mix),
        ("carts", &c.agent_carts),
        ("whole drop", &c.agent_drop),
        ("drop storm", &c.agent_drop_storm),
        ("escrow mode", &c.coordinated_escrow),
        ("central mode", &c.coordinated_central),
    ]
}

/// A confirm/release latency quantile in milliseconds (0 without any).
fn action_ms(report: &LoadReport, quantile: f64) -> f64 {
    report.action_latency.value_at_quantile(quantile) as f64 / 1000.0
}

/// Count checks on the comparison: they must all say "ok".
pub fn correctness(c: &Comparison) -> Vec<String> {
    let mut lines = Vec::new();
    if let Ok(standby) = &c.standby {
        lines.push(format!(
            "- {}: agent on a synchronous standby, audit after the failover, drift_total = {}.",
            if standby.drift_total == 0 {
                "ok"
            } else {
                "WRONG"
            },
            standby.drift_total,
        ));
    }
    for (agent, sold_out, drift_total) in [
        ("agent", &c.agent_sold_out, c.drift_total),
        ("agent on SQLite", &c.sqlite_sold_out, c.sqlite_drift_total),
    ] {
        let held = sold_out.total[Outcome::Held];
        lines.push(format!(
            "- {}: the sold-out SKU had {SOLD_OUT_STOCK} units and the {agent} answered HELD {held} times ({} SOLD_OUT).",
            if held == SOLD_OUT_STOCK { "ok" } else { "WRONG" },
            sold_out.total[Outcome::SoldOut],
        ));
        lines.push(format!(
            "- {}: {agent} audit after its phases, drift_total = {drift_total}.",
            if drift_total == 0 { "ok" } else { "WRONG" },
        ));
    }
    let mut phases = vec![
        ("ceiling", &c.ceiling),
        ("naive", &c.naive),
        ("agent hot", &c.agent_hot),
        ("agent sold-out", &c.agent_sold_out),
        ("agent 100 SKUs", &c.agent_multi),
        ("agent mix", &c.agent_mix),
        ("agent carts", &c.agent_carts),
        ("agent whole drop", &c.agent_drop),
        ("agent drop storm", &c.agent_drop_storm),
        ("escrow mode", &c.coordinated_escrow),
        ("central mode", &c.coordinated_central),
        ("SQLite hot", &c.sqlite_hot),
        ("SQLite sold-out", &c.sqlite_sold_out),
        ("SQLite 100 SKUs", &c.sqlite_multi),
    ];
    if let Ok(standby) = &c.standby {
        phases.push(("standby hot", &standby.hot));
        phases.push(("standby 100 SKUs", &standby.multi));
    }
    let failed: Vec<String> = phases
        .iter()
        .filter(|(_, r)| r.total.failures() > 0)
        .map(|(name, r)| format!("{name}: {} ({})", r.total.failures(), r.total))
        .collect();
    if failed.is_empty() {
        lines.push("- ok: every request got a decision (no 5xx, 503, or transport error).".into());
    } else {
        lines.push(format!(
            "- note: requests without a decision: {}.",
            failed.join("; ")
        ));
    }
    let busy: Vec<String> = phases
        .iter()
        .filter_map(|(name, r)| {
            r.others_share
                .filter(|s| *s > FOREIGN_SHARE_MAX)
                .map(|s| format!("{name} ({:.0}%)", 100.0 * s))
        })
        .collect();
    if busy.is_empty() {
        lines.push(
            "- ok: no other process used more than 5% of the machine during any phase.".into(),
        );
    } else {
        lines.push(format!(
            "- SUSPECT: other processes competed for the CPU during: {}; rerun on a quiet machine.",
            busy.join(", ")
        ));
    }
    lines.push(format!(
        "- {}: coordinator audit after the coordinated phases, drift_total = {}.",
        if c.coordinated_drift_total == 0 {
            "ok"
        } else {
            "WRONG"
        },
        c.coordinated_drift_total,
    ));
    let storm_held = c.agent_drop_storm.total[Outcome::Held];
    lines.push(format!(
        "- {}: the closed drop answered HELD {storm_held} times ({} SOLD_OUT).",
        if storm_held == 0 { "ok" } else { "WRONG" },
        c.agent_drop_storm.total[Outcome::SoldOut],
    ));
    let hot_sold_out = c.agent_hot.total[Outcome::SoldOut]
        + c.sqlite_hot.total[Outcome::SoldOut]
        + c.agent_drop.total[Outcome::SoldOut];
    if hot_sold_out > 0 {
        lines.push(format!(
            "- WRONG: the hot SKU sold out ({hot_sold_out} SOLD_OUT); raise HOT_STOCK."
        ));
    }
    lines
}

/// One hot-SKU run as a table row with its header.
pub fn single(label: &str, report: &LoadReport) -> String {
    let mut out = String::new();
    out.push_str(TABLE_HEAD);
    row(
        &mut out,
        label,
        report,
        report.rate(&SALES),
        "holds/s",
        Part::All,
    );
    out
}

/// The batch-bound sweep as a table.
pub fn sweep_batch(points: &[SweepPoint]) -> String {
    let mut out = String::new();
    out.push_str("| agent --max-in-flight | clients | holds/s | p50 ms | p99 ms | batch / commit ms | not decided | others' CPU |\n");
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for p in points {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            p.value,
            p.agent.clients,
            thousands(p.agent.rate(&SALES)),
            ms(&p.agent, 0.5, false),
            ms(&p.agent, 0.99, false),
            group_commit(&p.agent),
            p.agent.window.failures(),
            others(&p.agent),
        );
    }
    out
}

/// The client-count sweep as a table, agent beside naive.
pub fn sweep_clients(points: &[SweepPoint]) -> String {
    let mut out = String::new();
    out.push_str(
        "| clients | agent holds/s | agent p50 ms | agent p99 ms | batch / commit ms | naive holds/s | naive p99 ms | agent / naive | others' CPU |\n",
    );
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for p in points {
        let agent = p.agent.rate(&SALES);
        let (naive_rate, naive_p99) = match &p.naive {
            Some(n) => (n.rate(&SALES), ms(n, 0.99, false)),
            None => (0.0, "-".into()),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {:.1}x | {} |",
            p.value,
            thousands(agent),
            ms(&p.agent, 0.5, false),
            ms(&p.agent, 0.99, false),
            group_commit(&p.agent),
            thousands(naive_rate),
            naive_p99,
            agent / naive_rate.max(1e-9),
            others(&p.agent),
        );
    }
    out
}
