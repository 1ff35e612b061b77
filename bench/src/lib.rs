//! A benchmark that proves the region agent's hot path, side by side with
//! what a user would otherwise build.
//!
//! The `bench` binary drives real servers over HTTP on loopback with
//! keep-alive connections and reports, in one run: the agent's durable
//! reservations per second on one hot SKU, its sold-out rejections per
//! second, a naive server doing one PostgreSQL transaction per sale, and an
//! HTTP ceiling that parses the same JSON and stores nothing. Every server
//! is a separate process on the same machine and the same PostgreSQL, so
//! the ratios between them are what the numbers mean.
//!
//! - [`load`]: the load generator: concurrent buyers, outcomes, latency.
//! - [`client`]: one keep-alive HTTP/1 connection.
//! - [`outcome`]: what each answer means, and their tallies.
//! - [`metrics`]: the agent's group-commit counters around a phase.
//! - [`wire`]: the buyer API's JSON, shared by the baseline servers.
//! - [`naive`] and [`ceiling`]: the two baseline servers (`bench-server`).
//! - [`database`]: scratch databases created and dropped per run.
//! - [`interference`]: CPU used by other processes during a run.
//! - [`process`]: servers started as child processes.
//! - [`scenario`]: the runs and sweeps the `bench` command performs.
//! - [`report`]: the tables and ratios printed at the end.
//! - [`tail`]: `bench tail`, the tail of a sale on a coordinator and its
//!   agents, per policy.

pub mod capacity;
pub mod ceiling;
pub mod client;
pub mod database;
pub mod interference;
pub mod load;
pub mod metrics;
pub mod naive;
pub mod outcome;
pub mod process;
pub mod report;
pub mod scenario;
pub mod tail;
pub mod wire;

/// The tenant every benchmark run sells for.
pub const TENANT: &str = "bench";
/// The tenant's buyer API key.
pub const TENANT_KEY: &str = "bench-key";
/// The admin token of every server the benchmark starts.
pub const ADMIN_TOKEN: &str = "bench-admin";
