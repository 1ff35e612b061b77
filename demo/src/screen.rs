//! The live view on a terminal (ratatui over crossterm), drawn inline
//! below what was printed before it, so its last frame stays on the
//! screen above the summary.
//!
//! Per region: available, held and sold as bars (each out of the SKU's
//! total, so the regions compare at a glance), the sale rate, the answers
//! its buyers got, and under it its round trip to the coordinator and how
//! long its holds took so far (p50, p99, and the share faster than the
//! round trip, which cannot have waited for the coordinator); above them the coordinator's pool, units in
//! transit, mode, and the audit's drift. The terminal is in raw mode while
//! the view is open, so Ctrl-C arrives as a key: [`term_view::Screen`]'s
//! thread reads the keys and asks the demo to stop on `q`, Esc or Ctrl-C.

use std::fmt::Write as _;
use std::io;

use harness::outcome::Outcome;
use harness::report::thousands;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Gauge, Paragraph};
use ratatui::{Frame, Viewport};
use term_view::RegionBars;
use tokio::sync::watch;

use crate::live::{ms, percent, RegionLine, Snapshot};

/// Rows of the header block (two lines and its borders).
const HEADER_ROWS: u16 = 4;
/// Rows of the whole sale's gauge.
const TOTAL_ROWS: u16 = 3;
/// Rows of one region's block (three bars and its borders).
const REGION_ROWS: u16 = term_view::BAR_ROWS + 2;
/// Rows of the key help under the regions.
const FOOTER_ROWS: u16 = 1;

/// The view's rows for `regions` regions.
pub fn height(regions: usize) -> u16 {
    let regions = u16::try_from(regions).unwrap_or(u16::MAX);
    HEADER_ROWS + TOTAL_ROWS + REGION_ROWS.saturating_mul(regions) + FOOTER_ROWS
}

/// The open view.
pub struct Screen {
    screen: term_view::Screen,
    footer: String,
}

impl Screen {
    /// Puts the terminal in raw mode with an inline viewport for
    /// `regions` regions; `stop` is set when a stop key is pressed.
    /// `footer` is shown under the regions.
    pub fn open(regions: usize, stop: watch::Sender<bool>, footer: String) -> io::Result<Self> {
        let screen = term_view::Screen::open(Viewport::Inline(height(regions)), stop)?;
        Ok(Self { screen, footer })
    }

    /// Draws `snapshot`.
    pub fn draw(&mut self, snapshot: &Snapshot) -> io::Result<()> {
        let footer = &self.footer;
        self.screen.draw(|frame| draw(frame, snapshot, footer))
    }

    /// Draws `snapshot` one last time, without the key help, and gives
    /// the terminal back as it was; what is printed next goes under the view.
    pub fn close(self, snapshot: &Snapshot) -> io::Result<()> {
        self.screen.close(|frame| draw(frame, snapshot, ""))
    }
}

fn draw(frame: &mut Frame, s: &Snapshot, footer: &str) {
    let mut rows = vec![
        Constraint::Length(HEADER_ROWS),
        Constraint::Length(TOTAL_ROWS),
    ];
    rows.extend(s.regions.iter().map(|_| Constraint::Length(REGION_ROWS)));
    rows.push(Constraint::Length(FOOTER_ROWS));
    let areas = Layout::vertical(rows).split(frame.area());
    frame.render_widget(header(s), areas[0]);
    frame.render_widget(total(s), areas[1]);
    for (region, area) in s.regions.iter().zip(areas.iter().skip(2)) {
        draw_region(frame, region, s.units, *area);
    }
    if let Some(area) = areas.last() {
        frame.render_widget(
            Paragraph::new(footer).style(Style::new().fg(Color::DarkGray)),
            *area,
        );
    }
}

fn header(s: &Snapshot) -> Paragraph<'static> {
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let waiting = s.arrived() - s.ended();
    let first = Line::from(vec![
        Span::styled(format!("{:6.1} s ", s.elapsed.as_secs_f64()), bold),
        Span::raw(format!(
            "{}   policy {}   {} units   buyers: {} of {} arrived, {} still buying",
            s.stage.name(),
            s.policy,
            thousands(s.units as f64),
            thousands(s.arrived() as f64),
            thousands(s.buyers as f64),
            thousands(waiting as f64),
        )),
    ]);
    let mut second = vec![Span::raw("coordinator: ")];
    match &s.view {
        Some(view) => {
            let mode_colour = if view.mode == "CENTRAL" {
                Color::Magenta
            } else {
                Color::Cyan
            };
            second.push(Span::raw("mode "));
            second.push(Span::styled(view.mode.clone(), bold.fg(mode_colour)));
            second.push(Span::raw(format!(
                "   pool {}   in transit {}   ",
                thousands(view.pool as f64),
                thousands(view.in_transit as f64)
            )));
        }
        None => second.push(Span::raw("no view yet   ")),
    }
    second.push(Span::raw("audit drift "));
    second.push(match s.audit {
        Some(audit) if audit.drift_total == 0 => Span::styled("0", bold.fg(Color::Green)),
        Some(audit) => Span::styled(audit.drift_total.to_string(), bold.fg(Color::Red)),
        None => Span::raw("?"),
    });
    Paragraph::new(vec![first, Line::from(second)]).block(Block::bordered().title(Span::styled(
        " escrow: a flash sale in three regions ",
        bold,
    )))
}

fn total(s: &Snapshot) -> Gauge<'static> {
    let held = s.held_units();
    let ratio = (held as f64 / s.units.max(1) as f64).clamp(0.0, 1.0);
    let answers = s.answers();
    Gauge::default()
        .block(Block::bordered().title(format!(
            " all regions: HELD {}   SOLD_OUT {}   PAUSED {}   other {} ",
            thousands(answers[Outcome::Held] as f64),
            thousands(answers[Outcome::SoldOut] as f64),
            thousands(answers[Outcome::Paused] as f64),
            thousands(crate::live::other_answers(&answers) as f64),
        )))
        .gauge_style(Style::new().fg(Color::Green).bg(Color::Black))
        .ratio(ratio)
        .label(format!(
            "{} of {} units held or sold",
            thousands(held as f64),
            thousands(s.units as f64)
        ))
}

/// The line under a region: its round trip and its holds' waits so far.
fn hold_wait(r: &RegionLine) -> Line<'static> {
    let mut text = if r.rtt_ms() > 0 {
        format!(" rtt {} ms   ", r.rtt_ms())
    } else {
        " loopback   ".to_owned()
    };
    match r.hold_wait_us() {
        Some([p50, p99]) => {
            let _ = write!(text, "hold wait p50 {}  p99 {}", ms(p50), ms(p99));
            if let Some(under) = r.buyers.under_rtt_share() {
                let _ = write!(text, "   {} faster than the rtt", percent(under));
            }
        }
        None => text.push_str("no holds yet"),
    }
    text.push(' ');
    Line::from(text)
}

fn draw_region(frame: &mut Frame, r: &RegionLine, units: u64, area: Rect) {
    let title = Line::from(vec![
        Span::styled(
            format!(" {} ", r.name),
            Style::new().add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!(
            "{:.0}% of buyers   {} units/s ",
            r.share_percent,
            thousands(r.rate_per_s.round())
        )),
    ]);
    let block = Block::bordered().title(title).title_bottom(hold_wait(r));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [bars, answers] =
        Layout::horizontal([Constraint::Percentage(62), Constraint::Percentage(38)]).areas(inner);
    frame.render_widget(
        RegionBars {
            available: r.available,
            held: r.held,
            sold: r.sold,
            scale: units,
            number: &|value| thousands(value as f64),
        },
        bars,
    );
    let a = &r.buyers.answers;
    let lines = vec![
        Line::from(format!(
            " HELD {:>7}  SOLD_OUT {:>6}",
            thousands(a[Outcome::Held] as f64),
            thousands(a[Outcome::SoldOut] as f64)
        )),
        Line::from(format!(
            " PAUSED {:>5}  other {:>9}",
            thousands(a[Outcome::Paused] as f64),
            thousands(r.other_answers() as f64)
        )),
        Line::from(format!(
            " paid {:>7}  buying {:>8}",
            thousands(r.buyers.paid_units as f64),
            thousands(r.buyers.arrived.saturating_sub(r.buyers.ended) as f64)
        )),
    ];
    frame.render_widget(Paragraph::new(lines), answers);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    use super::*;

    /// Goal: under each region's bars the view names its round trip (or
    /// loopback) and its hold waits so far.
    #[test]
    fn regions_show_round_trip_and_hold_waits() {
        let snapshot = crate::live::tests::example();
        let mut terminal = Terminal::new(TestBackend::new(110, height(2))).unwrap();
        terminal.draw(|frame| draw(frame, &snapshot, "")).unwrap();
        let buffer = terminal.backend().buffer();
        let rows: Vec<String> = (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect()
            })
            .collect();
        let shown = |text: &str| rows.iter().filter(|row| row.contains(text)).count();
        assert_eq!(
            shown(" rtt 80 ms   hold wait p50 20 ms  p99 100 ms   67% faster than the rtt "),
            1,
            "{rows:#?}"
        );
        assert_eq!(shown(" loopback   no holds yet "), 1, "{rows:#?}");
    }
}
