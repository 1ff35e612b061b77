//! A sale on the real binaries: a coordinator and region agents started as
//! child processes on loopback, each on a database of its own, and a crowd
//! of buyers sent at the agents' HTTP API as browsers would send them.
//!
//! `bench tail`, `scripts/demo` and the coordinator's process tests start
//! and drive their clusters with it, so a service's command line, its
//! readiness, the links between processes and the buyers' retries are
//! written once. Only the binaries' flags and the contract's HTTP API are
//! used, never a service's internals.
//!
//! - [`process`]: a service as a child process: started, ready, signalled,
//!   restarted, stopped; where the binaries are.
//! - [`cluster`]: a coordinator and one agent per region, as [`process`]es.
//! - [`link`]: the connection between an agent and the coordinator, which
//!   can be made long (a round trip) or broken (faults) on command.
//! - [`crowd`]: the buyers, their connections, retries and payments.
//! - [`client`]: one keep-alive HTTP/1 connection.
//! - [`outcome`]: what each answer means, and their tallies.
//! - [`database`]: scratch PostgreSQL databases, created and dropped per run.
//! - [`ha_region`]: one region's highly available database
//!   (`scripts/ha-region`), started and stopped.
//! - [`metrics`]: the processes' `/metrics`, and the counters of a sale.
//! - [`shape`]: the sales: presets, flags, a simulator scenario.
//! - [`sale`]: one sale on a cluster, from the SKU's creation to the
//!   settled books.
//! - [`sampler`]: the coordinator's view of the SKU over a sale.
//! - [`analysis`]: from the buyers' logs and the samples to the checks
//!   and the numbers of a sale.
//! - [`report`]: numbers as the tables print them.

pub mod analysis;
pub mod client;
pub mod cluster;
pub mod crowd;
pub mod database;
pub mod ha_region;
pub mod link;
pub mod metrics;
pub mod outcome;
pub mod process;
pub mod report;
pub mod sale;
pub mod sampler;
pub mod shape;

/// The tenant a cluster started from [`sale::TailSettings`] sells for
/// (`bench`'s and the demo's).
pub const TENANT: &str = "bench";
/// That tenant's buyer API key.
pub const TENANT_KEY: &str = "bench-key";
/// The admin token of every server `bench` and the demo start.
pub const ADMIN_TOKEN: &str = "bench-admin";
