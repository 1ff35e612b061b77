//! Pure decision code for the regional quota allocator.
//!
//! Nothing in this crate performs I/O, reads a clock or draws random numbers:
//! time arrives as an argument (`now_ms`, milliseconds since the Unix epoch)
//! and every function returns a decision that a driver (the region agent, or
//! the simulator) carries out. That is what lets the simulator run exactly
//! the code the services run.
//!
//! - [`ids`]: typed, validated identifiers and quantities (parse, don't validate).
//! - [`ledger`]: a region's per-SKU counters and their invariant.
//! - [`reservation`]: the reservation lifecycle HELD -> SOLD | RELEASED | EXPIRED.
//! - [`admission`]: which queued reserve requests a batch may try to hold.
//! - [`batch`]: what an owner commits in one transaction and reads back.
//! - [`owner`]: the single writer of one SKU as a state machine without I/O,
//!   driven by the region agent and by the simulator.
//! - [`book`]: a complete in-memory SKU book combining the above; the model
//!   the property tests and the simulator drive.
//! - [`policy`]: how the coordinator splits and moves quota between regions.
//! - [`policy_choice`]: a SKU's policy by name, with settings an admin may override.
//! - [`allocation`]: the coordinator's rules for one SKU: syncs, takes and
//!   admin changes over the pool, grants in transit and leases.
//! - [`protocol`]: the messages between region agents and the coordinator.
//! - [`rate`]: a region's recent sale rate, for the policy.
//! - [`reports`]: which SKU reports an agent's sync carries, and when it is full.
//! - [`round_trip`]: the round trip to the coordinator an agent's syncs report.
//! - [`user_limit`]: who judges a user's one reservation of a SKU across regions.

pub mod admission;
pub mod allocation;
pub mod batch;
pub mod book;
pub mod cart;
pub mod ids;
pub mod ledger;
pub mod owner;
pub mod policy;
pub mod policy_choice;
pub mod protocol;
pub mod rate;
pub mod reports;
pub mod reservation;
pub mod round_trip;
pub mod user_limit;

pub use admission::{plan_reserves, Deadline, ReservePlan};
pub use allocation::{
    AgentSession, Allocation, AllocationError, Moves, RegionAllocation, Report, SkuSynced,
    TakeHistory, Taken,
};
pub use book::Book;
pub use ids::{
    IdError, Qty, RegionName, RequestKey, Sku, SkuSettings, Tenant, TransferId, TtlMs, UserId,
};
pub use ledger::{Ledger, LedgerError};
pub use policy::{Mode, Plan, Policy, RegionState, SkuState, TakeDecision};
pub use policy_choice::{ChoiceError, PolicyChoice};
pub use rate::RateMeter;
pub use reports::Reports;
pub use reservation::{Lifecycle, Refusal, Reservation, Status, Transition};
pub use round_trip::RoundTrip;
pub use user_limit::UserLimitScope;
