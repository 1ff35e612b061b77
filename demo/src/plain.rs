//! The view as plain lines, one every [`PLAIN_INTERVAL`], for a stdout
//! that is not a terminal (CI, a pipe, a file) or `--plain`.

use std::fmt::Write as _;
use std::time::Duration;

use bench::outcome::Outcome;

use crate::live::Snapshot;

/// How often a line is printed.
pub const PLAIN_INTERVAL: Duration = Duration::from_secs(1);

/// What the columns of [`line`] mean.
pub fn legend() -> &'static str {
    "t, stage, the coordinator's mode, pool, units in transit and audit drift; per region \
     available/held/sold (its last report) and units held per second; the buyers' answers so far"
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
