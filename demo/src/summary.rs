//! What the demo prints once the sale is over: what sold, how fast, who
//! was turned away and whether wrongly, how long each region's holds took
//! against its round trip to the coordinator, the checks (oversold, audit
//! drift), and the commands to look further.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use harness::crowd::{request_key, BuyerLog, End};
use harness::outcome::Outcome;
use harness::report::thousands;
use harness::sale::{TailRun, SKU};
use harness::shape::Sale;
use harness::{ADMIN_TOKEN, TENANT, TENANT_KEY};

use crate::live::{ms, other_answers, percent};

/// Where the run's processes and files are, for the commands to look further.
#[derive(Debug, Clone)]
pub struct Places {
    /// The run directory (databases and logs).
    pub run_dir: PathBuf,
    /// The coordinator's address.
    pub coordinator: SocketAddr,
    /// Each region's name and agent address.
    pub agents: Vec<(String, SocketAddr)>,
    /// Each process's database URL: the coordinator's, then the agents'.
    pub databases: Vec<String>,
    /// The `escrowctl` binary.
    pub escrowctl: PathBuf,
    /// The request key and region of one buyer that got a hold.
    pub held_key: Option<(String, usize)>,
}

/// Units sold (confirmed) at the end, by the coordinator's settled view.
pub fn sold(run: &TailRun) -> i64 {
    run.settled.regions.iter().map(|r| r.sold).sum()
}

/// Whether the sale passed its checks: nothing oversold, no drift, the
/// buyers' answers agree with the coordinator; and the line that says so.
pub fn verdict(run: &TailRun) -> (bool, String) {
    let s = &run.stats;
    let problems = s.problems();
    if problems.is_empty() {
        let line = format!(
            "demo: ok: {} of {} units sold, oversold {}, audit drift {}",
            thousands(sold(run) as f64),
            thousands(s.units as f64),
            s.oversold,
            s.drift_total
        );
        (true, line)
    } else {
        (false, format!("demo: FAILED: {}", problems.join("; ")))
    }
}

fn seconds(us: Option<i64>) -> Option<String> {
    us.map(|us| format!("{:.2} s", us as f64 / 1e6))
}

/// The summary of the sale.
pub fn summary(sale: &Sale, run: &TailRun, logs: &[BuyerLog]) -> String {
    let s = &run.stats;
    let v = &run.settled;
    let mut out = String::new();
    let shares: Vec<String> = sale
        .regions
        .iter()
        .map(|r| {
            let total: f64 = sale.regions.iter().map(|r| r.share).sum();
            format!("{} {:.0}%", r.name, 100.0 * r.share / total)
        })
        .collect();
    let _ = writeln!(
        out,
        "Sale over: {} units, {} buyers ({}), policy {}, {:.1} s.",
        thousands(s.units as f64),
        thousands(s.buyers as f64),
        shares.join(", "),
        run.policy,
        run.sale_wall.as_secs_f64()
    );
    let per_region: Vec<String> = sale
        .regions
        .iter()
        .map(|spec| {
            let sold = v
                .regions
                .iter()
                .find(|r| r.name == spec.name)
                .map_or(0, |r| r.sold);
            format!("{} {}", spec.name, thousands(sold as f64))
        })
        .collect();
    let held: i64 = v.regions.iter().map(|r| r.held).sum();
    let row = |out: &mut String, label: &str, text: String| {
        let _ = writeln!(out, "  {label:<24} {text}");
    };
    row(
        &mut out,
        "sold",
        format!(
            "{} of {} units ({}); {} still held, {} free",
            thousands(sold(run) as f64),
            thousands(s.units as f64),
            per_region.join(", "),
            held,
            v.free()
        ),
    );
    let sell_out = match seconds(s.held_after_us[3]) {
        Some(at) => format!(
            "{at} (the last unit held; half of them by {})",
            seconds(s.held_after_us[0]).unwrap_or_else(|| "?".into())
        ),
        None => format!("not sold out: {} units left free", s.final_free),
    };
    row(&mut out, "time to sell out", sell_out);
    let paid: u64 = logs
        .iter()
        .filter(|l| l.paid == Some(Outcome::Confirmed))
        .map(|l| u64::from(l.qty))
        .sum();
    row(
        &mut out,
        "buyers",
        format!(
            "{} held a unit ({} paid), {} told SOLD_OUT, {} gave up on 503s",
            thousands((s.buyers - s.sold_out_buyers - s.gave_up - s.refused) as f64),
            thousands(paid as f64),
            thousands(s.sold_out_buyers as f64),
            thousands(s.gave_up as f64)
        ),
    );
    row(
        &mut out,
        "false sold-outs",
        format!(
            "{} (turned away while units were free: {}; later buyers served first: {})",
            s.false_sold_outs, s.turned_away_free, s.inversions
        ),
    );
    let other = other_answers(&s.answers);
    row(
        &mut out,
        "answers",
        format!(
            "HELD {}, SOLD_OUT {}, PAUSED {}, other {}{}",
            thousands(s.answers[Outcome::Held] as f64),
            thousands(s.answers[Outcome::SoldOut] as f64),
            thousands(s.answers[Outcome::Paused] as f64),
            thousands(other as f64),
            if other > 0 {
                format!(" (all: {})", s.answers)
            } else {
                String::new()
            }
        ),
    );
    row(
        &mut out,
        "rebalancing",
        format!(
            "{} takes from the pool, {} tail merges; mode at the end {}",
            thousands(s.counters.takes),
            s.counters.tail_merges,
            v.mode
        ),
    );
    row(
        &mut out,
        "hold wait",
        "per region, from a buyer's first request to its HELD:".into(),
    );
    for region in &s.regions {
        let distance = if region.rtt_ms > 0 {
            format!("rtt {} ms", region.rtt_ms)
        } else {
            "loopback".to_owned()
        };
        let mut text = format!("{distance}, {} holds", thousands(region.holds as f64));
        if region.holds > 0 {
            let [p50, p99, _] = region.hold_wait_us.map(|us| u64::try_from(us).unwrap_or(0));
            let _ = write!(text, ", p50 {}, p99 {}", ms(p50), ms(p99));
        }
        if let Some(under) = region.under_rtt_share() {
            let _ = write!(text, ", {} faster than the rtt", percent(under));
        }
        row(&mut out, &format!("  {}", region.name), text);
    }
    row(&mut out, "oversold", s.oversold.to_string());
    row(&mut out, "audit drift", s.drift_total.to_string());
    out
}

/// `path` relative to the working directory where it lies under it.
fn shown(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_owned))
        .unwrap_or_else(|| path.to_owned())
        .display()
        .to_string()
}

/// The commands to look further, and where the files are.
pub fn look_further(places: &Places, keep_running: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run directory: {} (logs; SQLite databases, if any). Databases:",
        shown(&places.run_dir)
    );
    for url in &places.databases {
        // sqlx adds its connection options to a PostgreSQL URL.
        let url = url.split('?').next().unwrap_or(url);
        let _ = writeln!(out, "  {url}");
    }
    let _ = writeln!(
        out,
        "{}",
        if keep_running {
            "The cluster stays up until Ctrl-C. Look further:"
        } else {
            "Look further (with --keep-running, which leaves the cluster up after the summary):"
        }
    );
    let coordinator = format!("http://{}", places.coordinator);
    let escrowctl = format!(
        "{} --url {coordinator} --token {ADMIN_TOKEN}",
        shown(&places.escrowctl)
    );
    let admin = format!("-H 'Authorization: Bearer {ADMIN_TOKEN}'");
    let buyer = format!("-H 'Authorization: Bearer {TENANT_KEY}'");
    let mut commands = vec![
        format!("{escrowctl} sku show {TENANT}/{SKU}"),
        format!("{escrowctl} audit"),
        format!("curl -s {coordinator}/v1/admin/audit {admin}"),
    ];
    for (name, addr) in &places.agents {
        commands.push(format!(
            "curl -s http://{addr}/v1/skus/{SKU} {buyer}    # {name}: what its buyers see"
        ));
    }
    if let Some((key, region)) = &places.held_key {
        if let Some((name, addr)) = places.agents.get(*region) {
            commands.push(format!(
                "curl -s http://{addr}/v1/reservations/{key} {buyer}    # a buyer's reservation in {name}"
            ));
        }
    }
    for command in commands {
        let _ = writeln!(out, "  {command}");
    }
    out
}

/// The request key and region of the first buyer of crowd `run_id` that
/// got a hold.
pub fn held_key(run_id: &str, logs: &[BuyerLog]) -> Option<(String, usize)> {
    logs.iter()
        .enumerate()
        .find(|(_, l)| l.end == End::Held)
        .map(|(i, l)| (request_key(run_id, i), usize::from(l.region)))
}
