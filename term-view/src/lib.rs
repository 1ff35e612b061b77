//! What the live terminal views share: the demo's view of a sale and
//! `escrowctl sku watch`.
//!
//! - [`Screen`]: the terminal in raw mode (ratatui over crossterm) with a
//!   thread that reads the keys. Raw mode turns Ctrl-C into a key, so the
//!   thread asks the view's owner to stop on `q`, Esc or Ctrl-C, and the
//!   terminal is given back however the view ends.
//! - [`RegionBars`]: one region's available, held and sold units as three
//!   bars on one scale, so regions compare at a glance.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::symbols;
use ratatui::widgets::{LineGauge, Widget};
use ratatui::{DefaultTerminal, Frame, TerminalOptions, Viewport};
use tokio::sync::watch;

/// How often a key is looked for, so the key thread notices the view closing.
const KEY_POLL: Duration = Duration::from_millis(100);

/// Rows of [`RegionBars`].
pub const BAR_ROWS: u16 = 3;

/// The open view: the terminal in raw mode and the thread reading its keys.
pub struct Screen {
    terminal: DefaultTerminal,
    inline: bool,
    closed: Arc<AtomicBool>,
    keys: Option<JoinHandle<()>>,
}

impl Screen {
    /// Puts the terminal in raw mode with `viewport`; `stop` is set when
    /// `q`, Esc or Ctrl-C is pressed.
    pub fn open(viewport: Viewport, stop: watch::Sender<bool>) -> io::Result<Self> {
        let inline = matches!(viewport, Viewport::Inline(_));
        let terminal = ratatui::try_init_with_options(TerminalOptions { viewport })?;
        let closed = Arc::new(AtomicBool::new(false));
        let keys = {
            let closed = closed.clone();
            std::thread::spawn(move || read_keys(&closed, &stop))
        };
        Ok(Self {
            terminal,
            inline,
            closed,
            keys: Some(keys),
        })
    }

    /// Draws one frame with `draw`.
    pub fn draw(&mut self, draw: impl FnOnce(&mut Frame)) -> io::Result<()> {
        self.terminal.draw(draw).map(|_| ())
    }

    /// Draws a last frame with `draw` and gives the terminal back as it
    /// was. An inline view stays on the screen, and what is printed next
    /// goes under it; a full screen one goes away.
    pub fn close(mut self, draw: impl FnOnce(&mut Frame)) -> io::Result<()> {
        let drawn = self.draw(draw);
        self.stop_keys();
        ratatui::restore();
        if self.inline {
            // The cursor is left on the view's last row.
            println!();
        }
        drawn
    }

    fn stop_keys(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(keys) = self.keys.take() {
            if keys.join().is_err() {
                tracing::warn!("the key thread panicked");
            }
        }
    }
}

impl Drop for Screen {
    /// A view dropped without [`Screen::close`] (an error) still gives the
    /// terminal back.
    fn drop(&mut self) {
        if self.keys.is_some() {
            self.stop_keys();
            ratatui::restore();
        }
    }
}

/// Sets `stop` on `q`, Esc or Ctrl-C, until `closed`.
fn read_keys(closed: &AtomicBool, stop: &watch::Sender<bool>) {
    while !closed.load(Ordering::Relaxed) {
        match event::poll(KEY_POLL) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(error) => {
                tracing::warn!(%error, "reading keys failed; only signals stop the view now");
                return;
            }
        }
        let Ok(Event::Key(key)) = event::read() else {
            continue;
        };
        let ctrl_c =
            key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
        if key.kind == KeyEventKind::Press
            && (ctrl_c || matches!(key.code, KeyCode::Char('q') | KeyCode::Esc))
        {
            stop.send_replace(true);
        }
    }
}

/// One region's available, held and sold units as three bars, one a row,
/// each filled to its share of `scale` (the SKU's total, the same for every
/// region) and labelled with its value as `number` writes it.
pub struct RegionBars<'a> {
    /// Units the region can sell.
    pub available: i64,
    /// Units held.
    pub held: i64,
    /// Units sold.
    pub sold: i64,
    /// The units a full bar stands for.
    pub scale: u64,
    /// How a value is written in its label.
    pub number: &'a dyn Fn(i64) -> String,
}

impl Widget for RegionBars<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let rows = Layout::vertical([Constraint::Length(1); BAR_ROWS as usize]).split(area);
        let bars = [
            ("available", self.available, Color::Cyan),
            ("held", self.held, Color::Yellow),
            ("sold", self.sold, Color::Green),
        ];
        for ((label, value, colour), row) in bars.into_iter().zip(rows.iter()) {
            let ratio = (value as f64 / self.scale.max(1) as f64).clamp(0.0, 1.0);
            LineGauge::default()
                .filled_style(Style::new().fg(colour))
                .unfilled_style(Style::new().fg(Color::DarkGray))
                .line_set(symbols::line::THICK)
                .label(format!("{label:<9} {:>7}", (self.number)(value)))
                .ratio(ratio)
                .render(*row, buf);
        }
    }
}
