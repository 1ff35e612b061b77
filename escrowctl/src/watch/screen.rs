//! `sku watch` on a terminal: the whole screen (the regions a SKU has may
//! change while it is watched, so no fixed height fits), redrawn at every
//! refresh. On top the SKU's numbers, then per region its available, held
//! and sold units as the demo's bars ([`term_view::RegionBars`], each out
//! of the SKU's total), with its weight, lease, reported sale rate and
//! report age.

use std::io;
use std::time::Duration;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::{Frame, Viewport};
use term_view::RegionBars;
use tokio::sync::watch;

use super::{optional, rate, report_age, RegionView, Shown, SkuView};

/// Rows of the header block (two lines and its borders).
const HEADER_ROWS: u16 = 4;
/// Rows of one region's block (its bars and its borders).
const REGION_ROWS: u16 = term_view::BAR_ROWS + 2;
/// Rows of the key help.
const FOOTER_ROWS: u16 = 1;

/// The open view; dropping it gives the terminal back as it was.
pub struct Screen {
    screen: term_view::Screen,
}

impl Screen {
    /// Takes the whole terminal; `stop` is set when a stop key is pressed.
    pub fn open(stop: watch::Sender<bool>) -> io::Result<Self> {
        Ok(Self {
            screen: term_view::Screen::open(Viewport::Fullscreen, stop)?,
        })
    }

    /// Draws `shown`, refreshed every `interval`.
    pub fn draw(&mut self, shown: &Shown, interval: Duration) -> io::Result<()> {
        self.screen.draw(|frame| draw(frame, shown, interval))
    }
}

fn draw(frame: &mut Frame, s: &Shown, interval: Duration) {
    let regions = s.view.as_ref().map_or(0, |v| v.regions.len());
    let mut rows = vec![Constraint::Length(HEADER_ROWS)];
    rows.extend((0..regions).map(|_| Constraint::Length(REGION_ROWS)));
    rows.push(Constraint::Length(FOOTER_ROWS));
    rows.push(Constraint::Min(0));
    let areas = Layout::vertical(rows).split(frame.area());
    frame.render_widget(header(s), areas[0]);
    if let Some(view) = &s.view {
        for ((name, region), area) in view.regions.iter().zip(areas.iter().skip(1)) {
            draw_region(frame, name, region, view.total, *area);
        }
    }
    frame.render_widget(
        Paragraph::new(format!(
            " q, Esc or Ctrl-C quits   refreshed every {} ms",
            interval.as_millis()
        ))
        .style(Style::new().fg(Color::DarkGray)),
        areas[regions + 1],
    );
}

fn header(s: &Shown) -> Paragraph<'static> {
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let title = Span::styled(format!(" {} ", s.id), bold);
    let Some(v) = &s.view else {
        let line = match &s.unreachable {
            Some(reason) => unreachable(reason),
            None => Line::from("reading the SKU"),
        };
        return Paragraph::new(line)
            .wrap(Wrap { trim: true })
            .block(Block::bordered().title(title));
    };
    let first = Line::from(numbers(v, bold));
    let second = match &s.unreachable {
        Some(reason) => unreachable(reason),
        None => Line::from(format!(
            "sales {}   sold {}   held {}   available {}   at {:.1} s",
            rate(s.sales_per_s),
            v.sold(),
            v.regions.values().map(|r| r.held).sum::<i64>(),
            v.regions.values().map(|r| r.available).sum::<i64>(),
            s.elapsed.as_secs_f64(),
        )),
    };
    Paragraph::new(vec![first, second]).block(Block::bordered().title(title))
}

/// The SKU's mode, pause, pool, transit and drift.
fn numbers(v: &SkuView, bold: Style) -> Vec<Span<'static>> {
    let mode = v.mode.clone().unwrap_or_else(|| "-".to_owned());
    let mode_colour = if mode == "CENTRAL" {
        Color::Magenta
    } else {
        Color::Cyan
    };
    let (paused, paused_colour) = if v.paused {
        ("PAUSED", Color::Yellow)
    } else {
        ("selling", Color::Green)
    };
    let healthy = v.drift.unwrap_or(0) == 0 && v.ledger_drift.unwrap_or(0) == 0;
    vec![
        Span::raw("mode "),
        Span::styled(mode, bold.fg(mode_colour)),
        Span::raw("   "),
        Span::styled(paused, bold.fg(paused_colour)),
        Span::raw(format!(
            "   total {}   pool {}   in transit {}   drift ",
            v.total, v.pool, v.in_transit
        )),
        Span::styled(
            format!(
                "{} (ledger {})",
                optional(v.drift),
                optional(v.ledger_drift)
            ),
            bold.fg(if healthy { Color::Green } else { Color::Red }),
        ),
    ]
}

fn unreachable(reason: &str) -> Line<'static> {
    Line::from(Span::styled(
        format!("coordinator unreachable, retrying: {reason}"),
        Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
    ))
}

fn draw_region(frame: &mut Frame, name: &str, r: &RegionView, total: u64, area: Rect) {
    let mut title = vec![
        Span::styled(
            format!(" {name} "),
            Style::new().add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!(
            "weight {}   leased {}   rate {}   report {} ",
            r.weight,
            r.leased,
            rate(r.sale_rate_per_s),
            report_age(r.report_age_ms)
        )),
    ];
    if r.stale {
        title.push(Span::styled(
            "STALE ",
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
    }
    let block = Block::bordered().title(Line::from(title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [bars, side] =
        Layout::horizontal([Constraint::Percentage(62), Constraint::Percentage(38)]).areas(inner);
    frame.render_widget(
        RegionBars {
            available: r.available,
            held: r.held,
            sold: r.sold,
            scale: total,
            number: &|value| value.to_string(),
        },
        bars,
    );
    let lines = vec![
        Line::from(format!(" in transit {:>8}", r.in_transit)),
        Line::from(format!(" recall pending {:>4}", r.recall_pending)),
        Line::from(format!(" region drift {:>6}", r.region_drift)),
    ];
    frame.render_widget(Paragraph::new(lines), side);
}
