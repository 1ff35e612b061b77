//! The view as plain lines, one every [`PLAIN_INTERVAL`], for a stdout
//! that is not a terminal (CI, a pipe, a file) or `--plain`.

use std::fmt::Write as _;
use std::time::Duration;

use harness::outcome::Outcome;

use crate::live::{ms, percent, Snapshot};

/// How often a line is printed.
pub const PLAIN_INTERVAL: Duration = Duration::from_secs(1);

/// What the columns of [`line`] mean.
pub fn legend() -> &'static str {
    "t, stage, the coordinator's mode, pool, units in transit and audit drift; per region \
     available/held/sold (its last report), units held per second, the p50 and p99 of its \
     holds' waits so far (first send to HELD) and, at a distance, the share of holds faster \
     than its round trip; the buyers' answers so far"
}

/// One line of the view.
pub fn line(s: &Snapshot) -> String {
    let mut out = format!("{:6.1} s {:<8}", s.elapsed.as_secs_f64(), s.stage.name());
    match &s.view {
        Some(v) => {
            let _ = write!(
                out,
                " {:<7} pool {} in transit {}",
                v.mode, v.pool, v.in_transit
            );
        }
        None => out.push_str(" (no view yet)"),
    }
    match s.audit {
        Some(a) => {
            let _ = write!(out, " drift {}", a.drift_total);
        }
        None => out.push_str(" drift ?"),
    }
    for r in &s.regions {
        let _ = write!(
            out,
            " | {} {}/{}/{} {:.0}/s",
            r.name, r.available, r.held, r.sold, r.rate_per_s
        );
        match r.hold_wait_us() {
            Some([p50, p99]) => {
                let _ = write!(out, " hold p50 {} p99 {}", ms(p50), ms(p99));
            }
            None => out.push_str(" hold -"),
        }
        match (r.rtt_ms(), r.buyers.under_rtt_share()) {
            (0, _) => {}
            (rtt_ms, Some(under)) => {
                let _ = write!(out, ", {} < rtt {rtt_ms} ms", percent(under));
            }
            (rtt_ms, None) => {
                let _ = write!(out, " (rtt {rtt_ms} ms)");
            }
        }
    }
    let a = s.answers();
    let _ = write!(
        out,
        " | HELD {} SOLD_OUT {} PAUSED {} other {}",
        a[Outcome::Held],
        a[Outcome::SoldOut],
        a[Outcome::Paused],
        crate::live::other_answers(&a)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: each region's part of the line names its hold waits so far
    /// and, at a distance, its round trip and the share of holds faster.
    #[test]
    fn line_shows_hold_waits() {
        let line = line(&crate::live::tests::example());
        assert!(
            line.contains(" | eu 10/3/0 3/s hold p50 20 ms p99 100 ms, 67% < rtt 80 ms |"),
            "{line}"
        );
        assert!(line.contains(" | us 10/3/0 3/s hold - |"), "{line}");
    }
}
