//! The system a scenario runs the sale on: the region agents' and the
//! coordinator's timings and bounds, the network between them, and the
//! windows of faults.

use serde::{Deserialize, Serialize};

/// A region agent's timings and bounds (defaults: `region-agent`'s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// How often the agent reports to the coordinator (after the last report ended).
    pub sync_interval_ms: u64,
    /// How long a call to the coordinator (sync or take) may take before it fails.
    pub client_timeout_ms: u64,
    /// One commit of a batch (holds, grants, returns, expiries) in the agent's database.
    pub commit_us: u64,
    /// What each hold or transition adds to its batch's commit (statements,
    /// rows, the HTTP work around it), µs.
    pub commit_row_us: u64,
    /// An answer given before the queue (the gate: sold-out flag, full queue).
    pub gate_us: u64,
    /// Every agent runs on one machine (as `bench tail` runs them on
    /// loopback): the per-row work of their commits (`commit_row_us`)
    /// queues for that machine's CPU, one commit's rows at a time, instead
    /// of each agent having its own.
    pub one_machine: bool,
    /// Most requests in one batch (`--max-in-flight`).
    pub max_in_flight: usize,
    /// Most commands waiting in the owner's queue (`--max-waiting`).
    pub max_waiting: usize,
    /// Longest a request waits in the queue (`--wait-timeout-ms`).
    pub wait_timeout_ms: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            sync_interval_ms: 200,
            client_timeout_ms: 2_000,
            commit_us: 2_000,
            commit_row_us: 50,
            gate_us: 50,
            one_machine: false,
            max_in_flight: 256,
            max_waiting: 4_096,
            wait_timeout_ms: 2_000,
        }
    }
}

/// The coordinator's timings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoordinatorConfig {
    /// Time one request occupies the coordinator (its transaction); requests queue behind it.
    pub service_us: u64,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self { service_us: 250 }
    }
}

/// Faults on every agent-coordinator message.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Probability a message is lost.
    pub loss: f64,
    /// Probability a message is delivered twice.
    pub duplicate: f64,
    /// Probability a message is held back by up to `reorder_ms` (overtaken).
    pub reorder: f64,
    /// Longest hold-back of a reordered message.
    pub reorder_ms: f64,
}

/// What a fault window does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A region cannot reach the coordinator (and vice versa); buyers still reach it.
    Partition,
    /// The coordinator is unreachable; its state survives (it is in its database).
    CoordinatorDown,
    /// The coordinator's process is stopped (`SIGSTOP`, a long pause):
    /// what reaches it waits unanswered and is served, in the order it
    /// came, when the process resumes, including calls whose callers have
    /// given up by then.
    CoordinatorFrozen,
    /// A region agent crashes and restarts; its database survives, memory does not.
    AgentCrash,
}

/// One fault window. It starts at `start_s` or when `start_sold` of the
/// units are held or sold, and ends after `duration_s` or when `end_sold`
/// of the units are held or sold, whichever comes first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultConfig {
    /// What happens.
    pub kind: FaultKind,
    /// The region (partition, agent crash).
    #[serde(default)]
    pub region: Option<String>,
    /// Start at this time.
    #[serde(default)]
    pub start_s: Option<f64>,
    /// Start when this share of units is held or sold.
    #[serde(default)]
    pub start_sold: Option<f64>,
    /// End when this share of units is held or sold.
    #[serde(default)]
    pub end_sold: Option<f64>,
    /// End at the latest this long after the start.
    pub duration_s: f64,
}
