//! What the processes count, read from their `/metrics`: any series summed
//! over its labels, and the counters a sale's table reports (holds by path,
//! takes, tail merges), before and after it.

use std::net::SocketAddr;

use hyper::Method;

use crate::client::{Bearer, Conn};

/// A server's `/metrics` text now.
pub async fn read_text(addr: SocketAddr) -> anyhow::Result<String> {
    let mut conn = Conn::connect(addr).await?;
    let bearer = Bearer::new("metrics")?;
    let (status, body) = conn.send(Method::GET, "/metrics", &bearer, None).await?;
    anyhow::ensure!(status.is_success(), "/metrics answered {status}");
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The sum of every series named `name` (over all its labels, or only
/// those carrying `label="value"`), or `None` if the text has no such
/// series: a counter not yet incremented is absent, so callers that know
/// the counter exists read `None` as zero.
pub fn series_sum(text: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        if let Some((key, wanted)) = label {
            let pair = format!("{key}=\"{wanted}\"");
            if !labels.split(',').any(|l| l.trim() == pair) {
                continue;
            }
        }
        if let Ok(value) = value.parse::<f64>() {
            *sum.get_or_insert(0.0) += value;
        }
    }
    sum
}

/// Counters read from `/metrics` at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Sum of the agents' `escrow_reservations_total{outcome="HELD"}`.
    pub agent_holds: f64,
    /// The coordinator's `coordinator_takes_total`.
    pub takes: f64,
    /// The coordinator's `coordinator_take_granted_units_total`; `None`
    /// where the coordinator does not export it.
    pub take_granted_units: Option<f64>,
    /// The coordinator's `coordinator_tail_merges_total`.
    pub tail_merges: f64,
    /// The sum of the coordinator's `coordinator_take_locked_seconds`:
    /// how long its takes held their SKU's row, in all.
    pub take_locked_seconds: f64,
    /// Sum of the agents' `escrow_holds_total{path="take"}`: holds decided
    /// in a batch that asked the coordinator (paid a round trip).
    pub take_path_holds: f64,
    /// Sum of the agents' `escrow_holds_total{path="local"}`.
    pub local_path_holds: f64,
    /// Sum of the agents' `escrow_borrows_total{outcome="lent"}`: places
    /// borrowed from a home region under a global per-user limit (a
    /// round trip to the coordinator and the home while the buyer waited).
    pub borrowed: f64,
}

impl Counters {
    /// The counters of a coordinator and its agents now.
    pub async fn read(coordinator: SocketAddr, agents: &[SocketAddr]) -> anyhow::Result<Self> {
        let text = read_text(coordinator).await?;
        let mut counters = Counters {
            takes: series_sum(&text, "coordinator_takes_total", None).unwrap_or(0.0),
            // Registered with the first take: absent before it, present
            // (from 0) once the coordinator exports it.
            take_granted_units: series_sum(&text, "coordinator_take_granted_units_total", None),
            tail_merges: series_sum(&text, "coordinator_tail_merges_total", None).unwrap_or(0.0),
            take_locked_seconds: series_sum(&text, "coordinator_take_locked_seconds_sum", None)
                .unwrap_or(0.0),
            agent_holds: 0.0,
            take_path_holds: 0.0,
            local_path_holds: 0.0,
            borrowed: 0.0,
        };
        if counters.take_granted_units.is_none() && counters.takes == 0.0 {
            counters.take_granted_units = Some(0.0);
        }
        for &agent in agents {
            let text = read_text(agent).await?;
            counters.agent_holds += series_sum(
                &text,
                "escrow_reservations_total",
                Some(("outcome", "HELD")),
            )
            .unwrap_or(0.0);
            let path =
                |p| series_sum(&text, "escrow_holds_total", Some(("path", p))).unwrap_or(0.0);
            counters.take_path_holds += path("take");
            counters.local_path_holds += path("local");
            counters.borrowed +=
                series_sum(&text, "escrow_borrows_total", Some(("outcome", "lent"))).unwrap_or(0.0);
        }
        Ok(counters)
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            agent_holds: self.agent_holds - earlier.agent_holds,
            takes: self.takes - earlier.takes,
            take_granted_units: self
                .take_granted_units
                .map(|n| n - earlier.take_granted_units.unwrap_or(0.0)),
            tail_merges: self.tail_merges - earlier.tail_merges,
            take_locked_seconds: self.take_locked_seconds - earlier.take_locked_seconds,
            take_path_holds: self.take_path_holds - earlier.take_path_holds,
            local_path_holds: self.local_path_holds - earlier.local_path_holds,
            borrowed: self.borrowed - earlier.borrowed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a series is summed over its labels, or filtered by one label,
    /// and an absent series is told apart from a zero one.
    #[test]
    fn sums_one_series() {
        let text = "# TYPE escrow_reservations_total counter\n\
            escrow_reservations_total{outcome=\"HELD\"} 7\n\
            escrow_reservations_total{outcome=\"SOLD_OUT\"} 3\n\
            coordinator_take_granted_units_total 0\n";
        let all = series_sum(text, "escrow_reservations_total", None);
        assert_eq!(all, Some(10.0));
        let held = series_sum(text, "escrow_reservations_total", Some(("outcome", "HELD")));
        assert_eq!(held, Some(7.0));
        let none = series_sum(
            text,
            "escrow_reservations_total",
            Some(("outcome", "PAUSED")),
        );
        assert_eq!(none, None);
        let zero = series_sum(text, "coordinator_take_granted_units_total", None);
        assert_eq!(zero, Some(0.0));
    }
}
