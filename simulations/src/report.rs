//! Reports: the summary table printed after a run, and the Markdown + SVG
//! reports written for `run` and `compare`.
//!
//! A report should be something a person would rather look at than read
//! about: one table with the numbers that decide between policies, then
//! plots of where the units were over time, how long buyers waited, and
//! when buyers were wrongly told the sale was over. A SKU under a global
//! per-user limit adds how many holds paid a borrow, overall and per region.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use escrow_core::UserLimitScope;

use crate::metrics::{CartMetrics, LatencySummary, Metrics, RegionMetrics};
use crate::scenario::Scenario;
use crate::svg::{Axis, Chart, Line};

fn ms(us: u64) -> String {
    let v = us as f64 / 1_000.0;
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn secs(ms: Option<f64>) -> String {
    ms.map_or_else(|| "never".to_owned(), |v| format!("{:.2}", v / 1_000.0))
}

fn lat(l: &LatencySummary) -> String {
    if l.count == 0 {
        return "-".into();
    }
    format!("{} / {} / {}", ms(l.p50_us), ms(l.p99_us), ms(l.p999_us))
}

/// A plain-text table with left-aligned first column and right-aligned others.
fn text_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = width[i] - c.chars().count();
            if i == 0 {
                let _ = write!(s, "{c}{}", " ".repeat(pad));
            } else {
                let _ = write!(s, "  {}{c}", " ".repeat(pad));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    out += &line(
        width
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    );
    for r in rows {
        out += &line(r.iter().map(String::as_str).collect());
    }
    out
}

/// A Markdown table.
fn md_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n", header.join(" | "));
    let _ = writeln!(
        s,
        "|{}",
        header
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---|" } else { "---:|" })
            .collect::<String>()
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

fn summary_rows(m: &Metrics) -> Vec<Vec<String>> {
    let kv = |k: &str, v: String| vec![k.to_owned(), v];
    let mut rows = vec![
        kv("units on sale", m.total_units.to_string()),
        kv("buyers (bots included)", m.buyers.to_string()),
        kv("reserve requests", m.attempts.to_string()),
        kv("units sold", m.sold_units.to_string()),
        kv("oversold units (must be 0)", m.oversold_units.to_string()),
        kv("false sold-outs", m.false_sold_outs.to_string()),
        kv("SOLD_OUT answers", m.sold_out_answers.to_string()),
        kv("PAUSED answers", m.paused_answers.to_string()),
        kv(
            "rejected (queue, timeout, down)",
            m.rejected_answers.to_string(),
        ),
        kv(
            "buyers served / turned away",
            format!("{} / {}", m.buyers_served, m.buyers_turned_away),
        ),
        kv(
            "turned away while units were free",
            m.turned_away_while_free.to_string(),
        ),
        kv("order inversions", m.order_inversions.to_string()),
        kv("stranded units", m.stranded_units.to_string()),
        kv("time to sell-out (s)", secs(m.sell_out_ms)),
        kv("last hold (s)", secs(m.last_hold_ms)),
        kv(
            "central mode from (s)",
            if m.central_from_start() {
                "central from the start".to_owned()
            } else {
                secs(m.central_at_ms)
            },
        ),
        kv("hold wait p50 / p99 / p999 (ms)", lat(&m.hold_wait)),
        kv(
            "holds under rtt (no round trip)",
            percent_of(m.holds_under_rtt, m.hold_wait.count).map_or_else(
                || "-".to_owned(),
                |share| format!("{} of {} ({share})", m.holds_under_rtt, m.hold_wait.count),
            ),
        ),
    ];
    if m.user_limit_scope == UserLimitScope::Global {
        rows.extend(borrow_rows(m));
    }
    rows.extend([
        kv(
            "HELD answer latency p50 / p99 / p999 (ms)",
            lat(&m.held_latency),
        ),
        kv(
            "answer latency p50 / p99 / p999 (ms)",
            lat(&m.answer_latency),
        ),
        kv(
            "coordinator messages per sale",
            format!("{:.3}", m.messages_per_sale),
        ),
        kv("takes per sale", format!("{:.3}", m.takes_per_sale)),
        kv(
            "syncs / takes",
            format!("{} / {}", m.sync_requests, m.take_requests),
        ),
        kv(
            "messages lost / duplicated",
            format!("{} / {}", m.messages_lost, m.messages_duplicated),
        ),
        kv(
            "expired units / released holds / late confirms",
            format!(
                "{} / {} / {}",
                m.expired_units, m.released_holds, m.confirms_refused
            ),
        ),
        kv(
            "simulated time (s) / events",
            format!("{:.1} / {}", m.end_ms / 1_000.0, m.events),
        ),
    ]);
    if let Some(c) = &m.carts {
        rows.extend(cart_rows(m.skus, c));
    }
    rows
}

/// The summary's rows on a shop's carts.
fn cart_rows(skus: u32, c: &CartMetrics) -> Vec<Vec<String>> {
    let kv = |k: &str, v: String| vec![k.to_owned(), v];
    vec![
        kv(
            "SKUs on sale (figures above: all of them)",
            skus.to_string(),
        ),
        kv("cart buyers", c.buyers.to_string()),
        kv(
            "carts held (items in them)",
            format!("{} ({})", c.held, c.items_held),
        ),
        kv(
            "cart items held per s (to the last cart)",
            c.items_per_s()
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.0}")),
        ),
        kv(
            "carts sold / released / expired",
            format!("{} / {} / {}", c.sold, c.released, c.expired),
        ),
        kv(
            "cart buyers turned away / told an item SOLD_OUT",
            format!("{} / {}", c.turned_away, c.sold_out_answers),
        ),
        kv("cart commits (many carts to one)", c.commits.to_string()),
        kv("last cart held (s)", secs(c.last_hold_ms)),
        kv("cart hold wait p50 / p99 / p999 (ms)", lat(&c.hold_wait)),
        kv(
            "carts held under rtt (no round trip)",
            percent_of(c.holds_under_rtt, c.hold_wait.count).map_or_else(
                || "-".to_owned(),
                |share| format!("{} of {} ({share})", c.holds_under_rtt, c.hold_wait.count),
            ),
        ),
    ]
}

/// Header of the per-region table of carts.
const CART_REGION_HEADER: [&str; 8] = [
    "region",
    "rtt (ms)",
    "cart buyers",
    "carts HELD",
    "SOLD_OUT",
    "PAUSED / rejected",
    "cart hold wait p50 / p99 / p999 (ms)",
    "carts under rtt",
];

fn cart_region_rows(c: &CartMetrics) -> Vec<Vec<String>> {
    c.regions
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                num(r.rtt_ms),
                r.buyers.to_string(),
                r.holds.to_string(),
                r.sold_out_answers.to_string(),
                format!("{} / {}", r.paused_answers, r.rejected_answers),
                lat(&r.hold_wait),
                percent_of(r.holds_under_rtt, r.hold_wait.count).unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect()
}

/// The summary's rows on borrowing under a global per-user limit: the
/// holds that paid a borrow and how the borrows ended.
fn borrow_rows(m: &Metrics) -> [Vec<String>; 2] {
    let kv = |k: &str, v: String| vec![k.to_owned(), v];
    [
        kv(
            "holds that paid a borrow",
            percent_of(m.borrowed_holds, m.hold_wait.count).map_or_else(
                || "-".to_owned(),
                |share| format!("{} of {} ({share})", m.borrowed_holds, m.hold_wait.count),
            ),
        ),
        kv(
            "borrows lent / refused / unanswered / unsettled at the end",
            format!(
                "{} / {} / {} / {}",
                m.borrows_lent, m.borrows_refused, m.borrows_unanswered, m.borrows_unsettled
            ),
        ),
    ]
}

/// One region's row over one or more runs of the same scenario: counts
/// and percentiles are means over the runs (one run: its own figures), the
/// share under rtt is pooled over their holds.
fn region_row(r: usize, runs: &[Metrics]) -> Vec<String> {
    let regions: Vec<&RegionMetrics> = runs.iter().map(|m| &m.regions[r]).collect();
    let avg = |f: &dyn Fn(&RegionMetrics) -> f64| mean(regions.iter().map(|x| f(x)));
    let count = |f: fn(&RegionMetrics) -> u64| num(avg(&|x| f(x) as f64));
    // Percentiles are averaged over the runs that have any.
    let latencies = |l: fn(&RegionMetrics) -> &LatencySummary| {
        let with: Vec<&LatencySummary> = regions
            .iter()
            .map(|x| l(x))
            .filter(|l| l.count > 0)
            .collect();
        if with.is_empty() {
            return "-".to_owned();
        }
        let p = |q: fn(&LatencySummary) -> u64| ms(mean(with.iter().map(|l| q(l) as f64)) as u64);
        format!(
            "{} / {} / {}",
            p(|l| l.p50_us),
            p(|l| l.p99_us),
            p(|l| l.p999_us)
        )
    };
    let under: u64 = regions.iter().map(|x| x.holds_under_rtt).sum();
    let holds: u64 = regions.iter().map(|x| x.hold_wait.count).sum();
    let under_rtt = match percent_of(under, holds) {
        Some(share) => format!("{} ({share})", count(|x| x.holds_under_rtt)),
        None => "-".to_owned(),
    };
    let borrowed: u64 = regions.iter().map(|x| x.borrowed_holds).sum();
    let paid_borrow = match percent_of(borrowed, holds) {
        Some(share) => format!("{} ({share})", count(|x| x.borrowed_holds)),
        None => "-".to_owned(),
    };
    let mut row = vec![
        regions[0].name.clone(),
        num(regions[0].rtt_ms),
        count(|x| x.buyers),
        count(|x| x.holds),
        count(|x| x.sold_out_answers),
        count(|x| x.false_sold_outs),
        count(|x| x.paused_answers),
        count(|x| x.rejected_answers),
        latencies(|x| &x.hold_wait),
        under_rtt,
        latencies(|x| &x.held_latency),
    ];
    if runs[0].user_limit_scope == UserLimitScope::Global {
        row.insert(BORROW_COLUMN, paid_borrow);
    }
    row
}

/// Rows of the per-region table over `runs` (the same scenario, so the same regions).
fn region_rows(runs: &[Metrics]) -> Vec<Vec<String>> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    (0..first.regions.len())
        .map(|r| region_row(r, runs))
        .collect()
}

/// `part` of `whole` as a percentage, `None` without a whole.
fn percent_of(part: u64, whole: u64) -> Option<String> {
    (whole > 0).then(|| format!("{:.1}%", 100.0 * part as f64 / whole as f64))
}

/// Header of the per-region table. "hold wait" is the buyer's, from its
/// first reserve request to the HELD across retries; "under rtt" counts the
/// holds whose wait was shorter than the region's round trip to the
/// coordinator; "HELD answer" is per request, from its own send.
const REGION_HEADER: [&str; 11] = [
    "region",
    "rtt (ms)",
    "buyers",
    "HELD",
    "SOLD_OUT",
    "false SOLD_OUT",
    "PAUSED",
    "rejected",
    "hold wait p50 / p99 / p999 (ms)",
    "holds under rtt",
    "HELD answer p50 / p99 / p999 (ms)",
];

/// Where a global SKU's per-region table puts "holds that paid a borrow":
/// after "holds under rtt". The share is of the region's holds whose
/// request first borrowed its place from the user's home region; their
/// hold wait includes the borrow.
const BORROW_COLUMN: usize = 10;

/// Header of the per-region table over `runs`: a SKU under a global
/// per-user limit adds the holds that paid a borrow.
fn region_header(runs: &[Metrics]) -> Vec<&'static str> {
    let mut header = REGION_HEADER.to_vec();
    if runs
        .first()
        .is_some_and(|m| m.user_limit_scope == UserLimitScope::Global)
    {
        header.insert(BORROW_COLUMN, "holds that paid a borrow");
    }
    header
}

/// The per-region table over `runs` of one policy, as plain text (what
/// `simulate run` and `simulate compare` print).
pub fn region_table(runs: &[Metrics]) -> String {
    text_table(&region_header(runs), &region_rows(runs))
}

/// The summary printed after `simulate run`.
pub fn summary_table(m: &Metrics) -> String {
    let mut s = format!(
        "scenario {}  policy {}  seed {}\n\n",
        m.scenario, m.policy, m.seed
    );
    s += &text_table(&["metric", "value"], &summary_rows(m));
    s.push('\n');
    s += &region_table(std::slice::from_ref(m));
    if let Some(c) = &m.carts {
        s.push('\n');
        s += &text_table(&CART_REGION_HEADER, &cart_region_rows(c));
    }
    s
}

fn available_chart(m: &Metrics) -> Chart {
    let t = &m.series.t_ms;
    let line = |name: &str, v: &[u64], dashed: bool| Line {
        name: name.to_owned(),
        points: t.iter().zip(v).map(|(x, y)| (*x, *y as f64)).collect(),
        dashed,
    };
    let mut lines: Vec<Line> = m
        .regions
        .iter()
        .zip(&m.series.available)
        .map(|(r, v)| line(&r.name, v, false))
        .collect();
    lines.push(line("pool", &m.series.pool, true));
    lines.push(line("in transit", &m.series.in_transit, true));
    Chart {
        title: format!("Available per region, {} / {}", m.scenario, m.policy),
        x_label: "time since sale start (log)".into(),
        y_label: "units".into(),
        x_axis: Axis::LogMs,
        y_axis: Axis::Linear,
        lines,
    }
}

fn curve_line(name: &str, curve: &[(f64, u64)]) -> Line {
    Line {
        name: name.to_owned(),
        points: curve
            .iter()
            .filter(|(q, _)| *q < 1.0)
            .map(|(q, v)| (1.0 / (1.0 - q), *v as f64))
            .collect(),
        dashed: false,
    }
}

fn latency_chart(title: String, lines: Vec<Line>) -> Chart {
    Chart {
        title,
        x_label: "percentile".into(),
        y_label: "HELD latency (log)".into(),
        x_axis: Axis::Percentile,
        y_axis: Axis::LogUs,
        lines,
    }
}

fn time_chart(title: String, y_label: &str, y_axis: Axis, lines: Vec<Line>) -> Chart {
    Chart {
        title,
        x_label: "time since sale start (log)".into(),
        y_label: y_label.into(),
        x_axis: Axis::LogMs,
        y_axis,
        lines,
    }
}

fn series_line(name: &str, m: &Metrics, v: &[u64]) -> Line {
    Line {
        name: name.to_owned(),
        points: m
            .series
            .t_ms
            .iter()
            .zip(v)
            .map(|(x, y)| (*x, *y as f64))
            .collect(),
        dashed: false,
    }
}

/// Writes `report.md` and its plots for one run into `dir`.
pub fn write_run_report(
    dir: &Path,
    scenario: &Scenario,
    m: &Metrics,
    command: &str,
) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("available.svg"), available_chart(m).to_svg())?;
    let lines = m
        .regions
        .iter()
        .map(|r| curve_line(&r.name, &r.held_latency_curve))
        .collect();
    std::fs::write(
        dir.join("latency.svg"),
        latency_chart(
            format!("HELD latency per region, {} / {}", m.scenario, m.policy),
            lines,
        )
        .to_svg(),
    )?;
    std::fs::write(
        dir.join("false_sold_outs.svg"),
        time_chart(
            format!("False sold-outs so far, {} / {}", m.scenario, m.policy),
            "false SOLD_OUT answers (log)",
            Axis::Log,
            vec![series_line("false sold-outs", m, &m.series.false_sold_outs)],
        )
        .to_svg(),
    )?;
    let mut md = format!(
        "# {} under `{}` (seed {})\n\n{}\n\nRegenerate: `{command}`\n\n## Summary\n\n",
        m.scenario,
        m.policy,
        m.seed,
        scenario.description.trim()
    );
    md += &md_table(&["metric", "value"], &summary_rows(m));
    md += "\n## Per region\n\n";
    let one = std::slice::from_ref(m);
    md += &md_table(&region_header(one), &region_rows(one));
    if let Some(c) = &m.carts {
        md += "\n## Carts per region\n\n";
        md += &md_table(&CART_REGION_HEADER, &cart_region_rows(c));
    }
    md += "\n## Available per region over time\n\n![available](available.svg)\n\n";
    md += "## HELD latency distribution\n\n![latency](latency.svg)\n\n";
    md += "## False sold-outs over time\n\n![false sold-outs](false_sold_outs.svg)\n";
    std::fs::write(dir.join("report.md"), md)
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0u32), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / f64::from(n)
    }
}

fn num(x: f64) -> String {
    if x == x.round() || x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// Header of the comparison table ("hold wait" and "under rtt" as in the per-region table).
pub const COMPARE_HEADER: [&str; 16] = [
    "policy",
    "sold",
    "oversold",
    "false SOLD_OUT",
    "stranded",
    "sell-out (s)",
    "PAUSED",
    "turned away",
    "turned away while free",
    "inversions",
    "hold wait p50 / p99 / p999 (ms)",
    "holds under rtt",
    "HELD answer p50 / p99 / p999 (ms)",
    "worst region p99 (ms)",
    "msgs / sale",
    "takes / sale",
];

/// One row of the comparison table: a policy's metrics averaged over seeds (oversold: the worst).
pub fn compare_row(policy: &str, runs: &[Metrics]) -> Vec<String> {
    let avg = |f: &dyn Fn(&Metrics) -> f64| mean(runs.iter().map(f));
    let sold_out: Vec<f64> = runs.iter().filter_map(|m| m.sell_out_ms).collect();
    let sell_out = if sold_out.is_empty() {
        "never".to_owned()
    } else {
        let s = format!("{:.2}", mean(sold_out.iter().copied()) / 1_000.0);
        if sold_out.len() < runs.len() {
            format!("{s} ({}/{} runs)", sold_out.len(), runs.len())
        } else {
            s
        }
    };
    let lat_ms = |f: &dyn Fn(&Metrics) -> u64| ms(avg(&|m| f(m) as f64) as u64);
    vec![
        format!("`{policy}`"),
        num(avg(&|m| m.sold_units as f64)),
        runs.iter()
            .map(|m| m.oversold_units)
            .max()
            .unwrap_or(0)
            .to_string(),
        num(avg(&|m| m.false_sold_outs as f64)),
        num(avg(&|m| m.stranded_units as f64)),
        sell_out,
        num(avg(&|m| m.paused_answers as f64)),
        num(avg(&|m| m.buyers_turned_away as f64)),
        num(avg(&|m| m.turned_away_while_free as f64)),
        num(avg(&|m| m.order_inversions as f64)),
        format!(
            "{} / {} / {}",
            lat_ms(&|m| m.hold_wait.p50_us),
            lat_ms(&|m| m.hold_wait.p99_us),
            lat_ms(&|m| m.hold_wait.p999_us)
        ),
        percent_of(
            runs.iter().map(|m| m.holds_under_rtt).sum(),
            runs.iter().map(|m| m.hold_wait.count).sum(),
        )
        .unwrap_or_else(|| "-".to_owned()),
        format!(
            "{} / {} / {}",
            lat_ms(&|m| m.held_latency.p50_us),
            lat_ms(&|m| m.held_latency.p99_us),
            lat_ms(&|m| m.held_latency.p999_us)
        ),
        lat_ms(&|m| {
            m.regions
                .iter()
                .map(|r| r.held_latency.p99_us)
                .max()
                .unwrap_or(0)
        }),
        format!("{:.3}", avg(&|m| m.messages_per_sale)),
        format!("{:.3}", avg(&|m| m.takes_per_sale)),
    ]
}

/// The comparison table as Markdown.
pub fn compare_table(results: &[(String, Vec<Metrics>)]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(p, runs)| compare_row(p, runs))
        .collect();
    let mut table = md_table(&COMPARE_HEADER, &rows);
    let carts: Vec<Vec<String>> = results
        .iter()
        .filter_map(|(p, runs)| cart_compare_row(p, runs))
        .collect();
    if !carts.is_empty() {
        table += "\nCarts (means over the seeds):\n\n";
        table += &md_table(&CART_COMPARE_HEADER, &carts);
    }
    table
}

/// Header of the comparison of a shop's carts.
const CART_COMPARE_HEADER: [&str; 6] = [
    "policy",
    "carts held",
    "items held",
    "cart items held per s",
    "cart hold wait p50 / p99 / p999 (ms)",
    "carts under rtt",
];

/// A policy's carts averaged over seeds, if its runs had carts.
fn cart_compare_row(policy: &str, runs: &[Metrics]) -> Option<Vec<String>> {
    let carts: Vec<&CartMetrics> = runs.iter().filter_map(|m| m.carts.as_ref()).collect();
    if carts.is_empty() {
        return None;
    }
    let avg = |f: &dyn Fn(&CartMetrics) -> f64| num(mean(carts.iter().map(|c| f(c))));
    let p = |q: fn(&LatencySummary) -> u64| {
        ms(mean(carts.iter().map(|c| q(&c.hold_wait) as f64)) as u64)
    };
    let under: u64 = carts.iter().map(|c| c.holds_under_rtt).sum();
    let held: u64 = carts.iter().map(|c| c.hold_wait.count).sum();
    Some(vec![
        policy.to_owned(),
        avg(&|c| c.held as f64),
        avg(&|c| c.items_held as f64),
        avg(&|c| c.items_per_s().unwrap_or(0.0)),
        format!(
            "{} / {} / {}",
            p(|l| l.p50_us),
            p(|l| l.p99_us),
            p(|l| l.p999_us)
        ),
        percent_of(under, held).unwrap_or_else(|| "-".to_owned()),
    ])
}

/// Writes `compare.md` and its plots into `dir`; returns the comparison table.
pub fn write_compare_report(
    dir: &Path,
    scenario: &Scenario,
    results: &[(String, Vec<Metrics>)],
    seeds: &[u64],
    command: &str,
) -> io::Result<String> {
    std::fs::create_dir_all(dir)?;
    let table = compare_table(results);
    let first: Vec<&Metrics> = results
        .iter()
        .filter_map(|(_, runs)| runs.first())
        .collect();
    let seed = first.first().map_or(0, |m| m.seed);
    for m in &first {
        std::fs::write(
            dir.join(format!("available-{}.svg", m.policy)),
            available_chart(m).to_svg(),
        )?;
    }
    let lat_lines = first
        .iter()
        .map(|m| curve_line(&m.policy, &m.held_latency_curve))
        .collect();
    std::fs::write(
        dir.join("latency.svg"),
        latency_chart(format!("HELD latency, all regions, seed {seed}"), lat_lines).to_svg(),
    )?;
    std::fs::write(
        dir.join("false_sold_outs.svg"),
        time_chart(
            format!("False sold-outs so far, seed {seed}"),
            "false SOLD_OUT answers (log)",
            Axis::Log,
            first
                .iter()
                .map(|m| series_line(&m.policy, m, &m.series.false_sold_outs))
                .collect(),
        )
        .to_svg(),
    )?;
    std::fs::write(
        dir.join("taken.svg"),
        time_chart(
            format!("Units held or sold, seed {seed}"),
            "units",
            Axis::Linear,
            first
                .iter()
                .map(|m| series_line(&m.policy, m, &m.series.taken))
                .collect(),
        )
        .to_svg(),
    )?;
    let mut md = format!(
        "# Policy comparison: {}\n\n{}\n\nSeeds: {}. Numbers are means over the seeds (oversold: the worst). \
         Regenerate: `{command}`\n\n",
        scenario.name,
        scenario.description.trim(),
        seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    );
    md += &table;
    md += &format!(
        "\n{} units, {} buyers (bots included) over {} regions: {}.\n\n",
        scenario.sku.total,
        first.first().map_or(0, |m| m.buyers),
        scenario.regions.len(),
        scenario
            .regions
            .iter()
            .map(|r| format!(
                "{} (weight {}, demand {:.0}%, rtt {} ms)",
                r.name,
                r.weight,
                100.0 * r.demand / scenario.regions.iter().map(|x| x.demand).sum::<f64>(),
                r.rtt_ms
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    md += "## Units held or sold over time\n\n![taken](taken.svg)\n\n";
    md += "## False sold-outs over time\n\n![false sold-outs](false_sold_outs.svg)\n\n";
    md += "## HELD latency distribution\n\n![latency](latency.svg)\n\n";
    md += "## Available per region over time\n\n";
    for m in &first {
        let _ = writeln!(
            md,
            "### `{}`\n\n![available {}](available-{}.svg)\n",
            m.policy, m.policy, m.policy
        );
    }
    md += "## Per region (means over the seeds)\n\n";
    for (policy, runs) in results {
        let _ = writeln!(
            md,
            "### `{policy}`\n\n{}",
            md_table(&region_header(runs), &region_rows(runs))
        );
    }
    std::fs::write(dir.join("compare.md"), md)?;
    Ok(table)
}
