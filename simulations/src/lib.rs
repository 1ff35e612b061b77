//! Deterministic discrete-event simulations of the allocator's tail behaviour.
//!
//! The simulator drives escrow-core's decision code, the code the region
//! agents and the coordinator run, under a simulated clock, network and
//! crowd of buyers: [`agent`] drives escrow-core's `SkuOwner` (the agent's
//! single writer) over a simulated [`database`]; [`coordinator`] drives the
//! coordinator's rules (`escrow_core::allocation`) and the `Policy` trait,
//! and relays places borrowed under a global per-user limit
//! (`escrow_core::user_limit`); they talk in escrow-core's protocol
//! messages over [`network`]. One seed reproduces a run bit for bit (see
//! [`rng`]); every failure prints its seed.
//!
//! - [`database`]: the agent's stored state for one SKU, in memory, with
//!   the places it borrowed and lent.
//! - [`scenario`]: what a run models, read from TOML.
//! - [`demand`]: when buyers arrive and what they do once they hold units.
//! - [`queue`]: the event queue, ordered by (time, sequence).
//! - [`world`]: the event loop and the safety checks run after every event.
//! - [`shop`]: several SKUs' worlds in one time order, and carts of them
//!   held all or nothing.
//! - [`metrics`]: what a run measured.
//! - [`run`]: running one policy and seed, or a matrix of them.
//! - [`report`], [`svg`]: summary tables, Markdown reports and plots.
//! - [`swarm`]: random configurations per seed, safety then liveness.
//! - [`policies`]: escrow-core's policies by name.

pub mod agent;
pub mod coordinator;
pub mod database;
pub mod demand;
pub mod metrics;
pub mod network;
pub mod policies;
pub mod queue;
pub mod report;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod shop;
pub mod svg;
pub mod swarm;
pub mod world;

pub use metrics::Metrics;
pub use run::{run, run_matrix, RunError, RunOutput};
pub use scenario::Scenario;
pub use world::{Violation, World};
