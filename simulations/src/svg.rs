//! Line charts as hand-written SVG: no plotting dependency, small files.
//!
//! Reports need three kinds of plot: values over time on a log time axis
//! (a flash sale happens in the first seconds, its tail over minutes),
//! latency percentile curves (HdrHistogram style: the x axis stretches the
//! tail), and counts. One chart type with linear or log axes covers them.

use std::fmt::Write as _;

/// Colours of series, in order.
const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 380.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 48.0;
/// Most points drawn per series; longer series are thinned.
const POINTS_MAX: usize = 400;

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Linear, plain numbers.
    Linear,
    /// Log scale, plain numbers.
    Log,
    /// Log scale of milliseconds, labelled as durations.
    LogMs,
    /// Log scale of microseconds, labelled as durations.
    LogUs,
    /// Percentiles: the value is `1 / (1 - q)` on a log scale, labelled as a percentage.
    Percentile,
}

impl Axis {
    fn is_log(self) -> bool {
        !matches!(self, Axis::Linear)
    }

    fn label(self, v: f64) -> String {
        match self {
            Axis::Linear | Axis::Log => plain(v),
            Axis::LogMs => duration_us(v * 1_000.0),
            Axis::LogUs => duration_us(v),
            Axis::Percentile => {
                let p = 100.0 * (1.0 - 1.0 / v);
                let s = format!("{p:.4}");
                let s = s.trim_end_matches('0').trim_end_matches('.');
                format!("{s}%")
            }
        }
    }
}

fn plain(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn duration_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", trim(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", trim(us / 1e3))
    } else {
        format!("{} µs", trim(us))
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One line.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Legend text.
    pub name: String,
    /// (x, y) points in data units.
    pub points: Vec<(f64, f64)>,
    /// Draw dashed.
    pub dashed: bool,
}

/// A chart with one or more lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// X axis caption.
    pub x_label: String,
    /// Y axis caption.
    pub y_label: String,
    /// X axis mapping.
    pub x_axis: Axis,
    /// Y axis mapping.
    pub y_axis: Axis,
    /// The lines.
    pub lines: Vec<Line>,
}

struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    px_lo: f64,
    px_hi: f64,
}

impl Scale {
    fn new(values: impl Iterator<Item = f64>, log: bool, px_lo: f64, px_hi: f64) -> Self {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = if log { (1.0, 10.0) } else { (0.0, 1.0) };
        }
        if log {
            // Start at a decade; end at the data, so no empty decade is drawn.
            lo = 10f64.powf(lo.log10().floor());
            if hi <= lo * 1.5 {
                hi = lo * 10.0;
            }
        } else {
            lo = lo.min(0.0);
            if hi <= lo {
                hi = lo + 1.0;
            }
            let step = nice_step((hi - lo) / 5.0);
            hi = (hi / step).ceil() * step;
        }
        Self {
            lo,
            hi,
            log,
            px_lo,
            px_hi,
        }
    }

    fn px(&self, v: f64) -> f64 {
        let f = if self.log {
            let v = v.max(self.lo);
            (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        self.px_lo + f.clamp(0.0, 1.0) * (self.px_hi - self.px_lo)
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().round() as i32,
                self.hi.log10().round() as i32,
            );
            let every = ((b - a) / 8 + 1).max(1);
            (a..=b)
                .filter(|k| (k - a) % every == 0)
                .map(|k| 10f64.powi(k))
                .collect()
        } else {
            let step = nice_step((self.hi - self.lo) / 5.0);
            let mut t = (self.lo / step).ceil() * step;
            let mut out = Vec::new();
            while t <= self.hi + step * 1e-9 && out.len() < 12 {
                out.push(t);
                t += step;
            }
            out
        }
    }
}

fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    (nice * mag).max(1.0)
}

fn thin(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if points.len() <= POINTS_MAX {
        return points.to_vec();
    }
    let every = points.len().div_ceil(POINTS_MAX);
    let mut out: Vec<(f64, f64)> = points.iter().step_by(every).copied().collect();
    if let Some(last) = points.last() {
        if out.last() != Some(last) {
            out.push(*last);
        }
    }
    out
}

impl Chart {
    /// The chart as an SVG document.
    pub fn to_svg(&self) -> String {
        let plot_right = WIDTH - RIGHT;
        let plot_bottom = HEIGHT - BOTTOM;
        let xs = Scale::new(
            self.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)),
            self.x_axis.is_log(),
            LEFT,
            plot_right,
        );
        let ys = Scale::new(
            self.lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)),
            self.y_axis.is_log(),
            plot_bottom,
            TOP,
        );
        let mut s = String::new();
        let _ = write!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="20" font-size="14" font-weight="bold">{}</text>
"##,
            LEFT,
            escape(&self.title)
        );
        for t in xs.ticks() {
            let x = xs.px(t);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{plot_bottom}" stroke="#e5e5e5"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                plot_bottom + 15.0,
                escape(&self.x_axis.label(t))
            );
        }
        for t in ys.ticks() {
            let y = ys.px(t);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{plot_right}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT - 6.0,
                y + 4.0,
                escape(&self.y_axis.label(t))
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}" fill="none" stroke="#444"/>"##,
            plot_right - LEFT,
            plot_bottom - TOP
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            (LEFT + plot_right) / 2.0,
            HEIGHT - 10.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            s,
            r##"<text transform="translate(16,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            (TOP + plot_bottom) / 2.0,
            escape(&self.y_label)
        );
        for (i, line) in self.lines.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let pts: Vec<(f64, f64)> = thin(&line.points)
                .into_iter()
                .filter(|(x, y)| {
                    x.is_finite() && y.is_finite() && (!xs.log || *x > 0.0) && (!ys.log || *y > 0.0)
                })
                .collect();
            if !pts.is_empty() {
                let mut path = String::new();
                for (x, y) in &pts {
                    let _ = write!(path, "{:.1},{:.1} ", xs.px(*x), ys.px(*y));
                }
                let dash = if line.dashed {
                    r#" stroke-dasharray="5,3""#
                } else {
                    ""
                };
                let _ = writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{colour}" stroke-width="1.6"{dash} points="{}"/>"#,
                    path.trim_end()
                );
            }
            let ly = TOP + 8.0 + 18.0 * i as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="2.5"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                plot_right + 10.0,
                plot_right + 30.0,
                plot_right + 36.0,
                ly + 4.0,
                escape(&line.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a chart renders as one SVG document with every line and legend entry, log axes included.
    #[test]
    fn renders_lines_and_legend() {
        let chart = Chart {
            title: "a < b".into(),
            x_label: "time".into(),
            y_label: "units".into(),
            x_axis: Axis::LogMs,
            y_axis: Axis::Linear,
            lines: vec![
                Line {
                    name: "eu".into(),
                    points: (1..2000)
                        .map(|i| (f64::from(i), f64::from(i % 7)))
                        .collect(),
                    dashed: false,
                },
                Line {
                    name: "pool".into(),
                    points: vec![(0.0, 1.0), (10.0, 2.0)],
                    dashed: true,
                },
            ],
        };
        let svg = chart.to_svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &lt; b"));
        assert!(svg.contains(">1 s<"));
        assert_eq!(Axis::Percentile.label(100.0), "99%");
        assert_eq!(Axis::LogUs.label(1500.0), "1.5 ms");
    }
}
