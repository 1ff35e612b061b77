//! The agent's own group-commit counters, read from its `/metrics` around
//! a phase: how many commits it made, how long they took, how many requests
//! each carried. They explain a throughput number (batch size times commits
//! per second) without attaching a profiler.

use std::net::SocketAddr;

use harness::metrics::read_text;

/// Cumulative commit counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommitCounters {
    /// Commits made (`escrow_commit_seconds_count`).
    pub commits: f64,
    /// Seconds spent committing (`escrow_commit_seconds_sum`).
    pub commit_seconds: f64,
    /// Batches with at least one write (`escrow_batch_size_count`).
    pub batches: f64,
    /// Holds and transitions in those batches (`escrow_batch_size_sum`).
    pub batched: f64,
}

impl CommitCounters {
    /// Parses the Prometheus text; missing series count as zero.
    pub fn parse(text: &str) -> Self {
        let mut c = Self::default();
        for line in text.lines() {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            // Labelled series (one per SKU would be summed the same way).
            let name = name.split('{').next().unwrap_or(name);
            match name {
                "escrow_commit_seconds_count" => c.commits += value,
                "escrow_commit_seconds_sum" => c.commit_seconds += value,
                "escrow_batch_size_count" => c.batches += value,
                "escrow_batch_size_sum" => c.batched += value,
                _ => {}
            }
        }
        c
    }

    /// Reads the agent's counters now.
    pub async fn read(addr: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self::parse(&read_text(addr).await?))
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> CommitStats {
        CommitStats {
            commits: self.commits - earlier.commits,
            commit_seconds: self.commit_seconds - earlier.commit_seconds,
            batches: self.batches - earlier.batches,
            batched: self.batched - earlier.batched,
        }
    }
}

/// Commit counters over one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommitStats {
    /// Commits made.
    pub commits: f64,
    /// Seconds spent committing, summed over SKU owners.
    pub commit_seconds: f64,
    /// Batches with at least one write.
    pub batches: f64,
    /// Holds and transitions in them.
    pub batched: f64,
}

impl CommitStats {
    /// Mean writes per batch.
    pub fn mean_batch(&self) -> f64 {
        self.batched / self.batches.max(1.0)
    }

    /// Mean commit duration in milliseconds.
    pub fn mean_commit_ms(&self) -> f64 {
        1000.0 * self.commit_seconds / self.commits.max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the counters are summed from the Prometheus text, labelled or not.
    #[test]
    fn parses_prometheus_text() {
        let text = "# TYPE escrow_commit_seconds histogram\n\
            escrow_commit_seconds_bucket{le=\"0.001\"} 3\n\
            escrow_commit_seconds_sum 0.5\n\
            escrow_commit_seconds_count 10\n\
            escrow_batch_size_sum{sku=\"a\"} 300\n\
            escrow_batch_size_sum{sku=\"b\"} 100\n\
            escrow_batch_size_count 8\n";
        let c = CommitCounters::parse(text);
        assert_eq!(c.commits, 10.0);
        assert_eq!(c.batched, 400.0);
        let stats = c.since(&CommitCounters::default());
        assert_eq!(stats.mean_batch(), 50.0);
        assert_eq!(stats.mean_commit_ms(), 50.0);
    }
}
