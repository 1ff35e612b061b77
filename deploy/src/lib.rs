//! The deployment artifacts of this folder (systemd units, Prometheus rules,
//! the Grafana dashboard) and what their check needs: the metric names a
//! PromQL query reads, and the metrics a `/metrics` scrape exports.
//!
//! A query that names a metric no binary exports fails nowhere: the panel
//! stays empty and the alert never fires. `tests/artifacts.rs` runs the
//! real binaries through a small sale and holds every name the rules and
//! the dashboard read against what the services exported.

use std::collections::{BTreeMap, BTreeSet};

/// Prefixes of the metrics the services export: `escrow_` for the region
/// agent's, `coordinator_` for the coordinator's.
pub const PREFIXES: [&str; 2] = ["escrow_", "coordinator_"];

/// The services' metric names a PromQL expression reads, as written
/// (a histogram's `_bucket` suffix and all). Identifiers are PromQL's
/// (`[A-Za-z_:][A-Za-z0-9_:]*`); string literals and comments are skipped,
/// so a label value never counts as a name.
pub fn metric_names(promql: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = promql.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                // Backticks are raw strings: no escapes inside.
                let mut escaped = false;
                for (_, d) in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if d == '\\' && c != '`' {
                        escaped = true;
                    } else if d == c {
                        break;
                    }
                }
            }
            '#' => {
                for (_, d) in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == ':' => {
                // A token starting with a digit is a number or a duration
                // (`5m`), never a name, so it is consumed whole.
                let mut end = start + c.len_utf8();
                while let Some(&(i, d)) = chars.peek() {
                    if !(d.is_ascii_alphanumeric() || d == '_' || d == ':') {
                        break;
                    }
                    end = i + d.len_utf8();
                    chars.next();
                }
                let token = &promql[start..end];
                if !c.is_ascii_digit() && PREFIXES.iter().any(|p| token.starts_with(p)) {
                    names.insert(token.to_owned());
                }
            }
            _ => {}
        }
    }
    names
}

/// The metric families of one scrape (Prometheus text format), by their
/// `# TYPE` lines.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    types: BTreeMap<String, String>,
}

impl Exposition {
    /// Reads the families of a `/metrics` answer.
    pub fn parse(text: &str) -> Self {
        let types = text
            .lines()
            .filter_map(|line| {
                let mut words = line.strip_prefix("# TYPE ")?.split_whitespace();
                Some((words.next()?.to_owned(), words.next()?.to_owned()))
            })
            .collect();
        Self { types }
    }

    /// Whether a query naming `name` finds this family's series: a
    /// counter's, gauge's or summary's own name, a histogram's `_bucket`,
    /// `_sum` or `_count`, or a summary's `_sum` or `_count`. A histogram's
    /// bare name selects nothing, so it does not count.
    pub fn exports(&self, name: &str) -> bool {
        if self.types.get(name).is_some_and(|t| t != "histogram") {
            return true;
        }
        let series = [
            ("_bucket", &["histogram"][..]),
            ("_sum", &["histogram", "summary"][..]),
            ("_count", &["histogram", "summary"][..]),
        ];
        series.iter().any(|(suffix, types)| {
            name.strip_suffix(suffix)
                .and_then(|family| self.types.get(family))
                .is_some_and(|t| types.contains(&t.as_str()))
        })
    }

    /// The families, by name.
    pub fn families(&self) -> impl Iterator<Item = &str> {
        self.types.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(promql: &str) -> Vec<String> {
        metric_names(promql).into_iter().collect()
    }

    /// Goal: only the services' metric names count, wherever they stand in
    /// a query, and nothing inside a string or a comment does.
    #[test]
    fn names_come_from_identifiers_only() {
        assert_eq!(
            names(
                r#"sum by (region, outcome) (rate(escrow_reservations_total{region=~"$region", outcome="PAUSED"}[$__rate_interval]))
                  / ignoring(outcome) coordinator_drift_units"#
            ),
            ["coordinator_drift_units", "escrow_reservations_total"]
        );
        assert_eq!(
            names(
                r#"up{job="escrow_x", l='escrow_y\'s', m=`escrow_z\`} # escrow_comment
                   + escrow_fenced"#
            ),
            ["escrow_fenced"]
        );
        assert_eq!(
            names("histogram_quantile(0.99, sum by (le) (rate(escrow_commit_seconds_bucket[5m])))"),
            ["escrow_commit_seconds_bucket"]
        );
        assert_eq!(
            names("label_values(escrow_fenced, region)"),
            ["escrow_fenced"]
        );
        assert!(names("1escrow_x + not_escrow_y + escrowish").is_empty());
    }

    /// Goal: a histogram is found through its series' suffixes and a
    /// summary through its own name too; a bare histogram name, a suffix on
    /// the wrong type and an unknown name are not.
    #[test]
    fn suffixes_map_to_their_family() {
        let exposition = Exposition::parse(
            "# TYPE escrow_fenced gauge\nescrow_fenced 0\n\n\
             # TYPE escrow_syncs_total counter\nescrow_syncs_total 3\n\n\
             # TYPE escrow_commit_seconds histogram\n\
             escrow_commit_seconds_bucket{le=\"+Inf\"} 1\nescrow_commit_seconds_sum 0.1\nescrow_commit_seconds_count 1\n\n\
             # TYPE escrow_commit_batches summary\n\
             escrow_commit_batches{quantile=\"0.5\"} 1\nescrow_commit_batches_sum 1\nescrow_commit_batches_count 1\n",
        );
        for found in [
            "escrow_fenced",
            "escrow_syncs_total",
            "escrow_commit_seconds_bucket",
            "escrow_commit_seconds_sum",
            "escrow_commit_seconds_count",
            "escrow_commit_batches",
            "escrow_commit_batches_sum",
            "escrow_commit_batches_count",
        ] {
            assert!(exposition.exports(found), "{found}");
        }
        for missing in [
            "escrow_commit_seconds",
            "escrow_commit_batches_bucket",
            "escrow_syncs_total_count",
            "escrow_fence",
        ] {
            assert!(!exposition.exports(missing), "{missing}");
        }
        assert_eq!(exposition.families().count(), 4);
    }
}
