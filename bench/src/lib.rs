//! A benchmark that proves the region agent's hot path, side by side with
//! what a user would otherwise build.
//!
//! The `bench` binary drives real servers over HTTP on loopback with
//! keep-alive connections and reports, in one run: the agent's durable
//! reservations per second on one hot SKU, its sold-out rejections per
//! second, a naive server doing one PostgreSQL transaction per sale, and an
//! HTTP ceiling that parses the same JSON and stores nothing. Every server
//! is a separate process on the same machine and the same PostgreSQL, so
//! the ratios between them are what the numbers mean. Servers are started,
//! and answers classified, by the [`harness`].
//!
//! - [`load`]: the load generator: concurrent buyers, outcomes, latency.
//! - [`metrics`]: the agent's group-commit counters around a phase.
//! - [`wire`]: the buyer API's JSON, shared by the baseline servers.
//! - [`naive`] and [`ceiling`]: the two baseline servers (`bench-server`).
//! - [`database`]: scratch SQLite files, and the PostgreSQL's settings.
//! - [`interference`]: CPU used by other processes during a run.
//! - [`scenario`]: the runs and sweeps the `bench` command performs.
//! - [`report`]: the tables and ratios printed at the end.
//! - [`capacity`]: `bench coordinator`, how many regions and SKUs one
//!   coordinator serves.
//! - [`tail`]: `bench tail`, the tail of a sale on a coordinator and its
//!   agents, per policy.

use std::path::PathBuf;

use harness::process::Binaries;

pub mod capacity;
pub mod ceiling;
pub mod database;
pub mod interference;
pub mod load;
pub mod metrics;
pub mod naive;
pub mod report;
pub mod scenario;
pub mod tail;
pub mod wire;

/// The packages `bench` (all but `tail` and `coordinator`) runs.
pub const HOT_PATH_PACKAGES: [&str; 3] = ["region-agent", "coordinator", "bench"];

/// `bench-server` (the naive baseline and the ceiling), beside the
/// services' binaries.
pub fn bench_server(binaries: &Binaries) -> PathBuf {
    binaries.dir.join("bench-server")
}

/// Fails unless the agent, the coordinator and the baseline server exist.
pub fn check_hot_path(binaries: &Binaries) -> anyhow::Result<()> {
    Binaries::check(
        &[
            &binaries.agent,
            &bench_server(binaries),
            &binaries.coordinator,
        ],
        &HOT_PATH_PACKAGES,
    )
}
