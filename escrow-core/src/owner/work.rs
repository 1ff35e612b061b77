//! The batch in progress and the requests it carries between its steps.
//!
//! A batch moves through [`Phase`]s, one I/O at a time; its [`Work`] goes
//! with it from phase to phase, so each step finds what the earlier ones
//! decided without the owner keeping it in fields of its own.

use std::collections::{HashMap, VecDeque};

use super::{Action, AdminChange, ReserveRequest, Ticket};
use crate::admission::{Deadline, ReservePlan};
use crate::batch::{Batch, NewHold};
use crate::ids::{RequestKey, Sku, Tenant};
use crate::reservation::{Refusal, Reservation};

/// A reserve request waiting in the owner.
#[derive(Debug)]
pub(super) struct PendingReserve {
    pub(super) ticket: Ticket,
    pub(super) request: ReserveRequest,
    pub(super) deadline: Deadline,
    pub(super) known: bool,
    /// Its hold was in a commit that failed and may have happened anyway:
    /// a row found for its key afterwards is its hold.
    pub(super) in_failed_commit: bool,
    /// A cart's item ([`super::Command::SetAside`]): its units are set
    /// aside once the batch is durable, and nothing of it is written.
    pub(super) aside: bool,
}

/// An action waiting in the owner.
#[derive(Debug)]
pub(super) struct PendingAct {
    pub(super) ticket: Ticket,
    pub(super) key: RequestKey,
    pub(super) action: Action,
    pub(super) deadline: Deadline,
}

/// How the take of a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TakeEnd {
    /// No unit is free anywhere: what did not fit is sold out.
    Exhausted,
    /// The coordinator answered and units are free elsewhere: they are on
    /// their way, so what did not fit waits for them.
    Moving,
    /// The coordinator could not be asked: what did not fit is paused.
    Unreachable,
    /// No take was due this batch: what did not fit keeps waiting.
    NotAsked,
}

/// The batch in progress.
#[derive(Debug)]
pub(super) struct Work {
    pub(super) now_ms: u64,
    pub(super) admins: VecDeque<(Ticket, AdminChange)>,
    /// Reserves that try to hold, in arrival order.
    pub(super) fresh: Vec<PendingReserve>,
    /// Reserves of keys known to be committed: answered from their rows.
    pub(super) lookups: Vec<PendingReserve>,
    /// Second copies of a key in this batch: next batch, when the first's fate is known.
    pub(super) later: Vec<PendingReserve>,
    pub(super) acts: Vec<PendingAct>,
    pub(super) rows: HashMap<RequestKey, Reservation>,
    pub(super) plan: ReservePlan,
    pub(super) granted: u64,
    pub(super) take: TakeEnd,
    pub(super) batch: Batch,
    /// `fresh` split by the plan, in the order of `batch.holds`.
    pub(super) holding: Vec<PendingReserve>,
    /// Cart items that fit, with the holds their carts will write: set
    /// aside once the batch is durable.
    pub(super) setting_aside: Vec<(PendingReserve, NewHold)>,
    pub(super) overflow: Vec<PendingReserve>,
    pub(super) act_results: Vec<Option<(Result<(), Refusal>, Reservation)>>,
    /// Reserves answered from their rows after the commit.
    pub(super) existing: Vec<PendingReserve>,
    /// Holds found by their keys after a commit of unknown outcome: the
    /// rows were read, but answered HELD only once this batch's own commit
    /// is durable (a row read from a primary may not be on its standby).
    pub(super) confirmed: Vec<(PendingReserve, Reservation)>,
    /// The batch again, after its commit failed: a second failure is final
    /// unless the batch is settling.
    pub(super) retrying: bool,
    /// Settling a commit of unknown outcome until then (ms): failures
    /// before then reload and commit again; at it, PAUSED.
    pub(super) settle_until_ms: Option<u64>,
}

impl Work {
    pub(super) fn new(tenant: Tenant, sku: Sku, now_ms: u64) -> Self {
        Self {
            now_ms,
            admins: VecDeque::new(),
            fresh: Vec::new(),
            lookups: Vec::new(),
            later: Vec::new(),
            acts: Vec::new(),
            rows: HashMap::new(),
            plan: ReservePlan::default(),
            granted: 0,
            take: TakeEnd::Exhausted,
            batch: Batch::new(tenant, sku, now_ms),
            holding: Vec::new(),
            setting_aside: Vec::new(),
            overflow: Vec::new(),
            act_results: Vec::new(),
            existing: Vec::new(),
            confirmed: Vec::new(),
            retrying: false,
            settle_until_ms: None,
        }
    }
}

/// Where the batch in progress stands.
#[derive(Debug)]
pub(super) enum Phase {
    Idle,
    Reloading(Work),
    /// An admin change's commit, with its ticket.
    Admin(Work, Ticket),
    ReadingActs(Work),
    Taking(Work),
    Committing(Work),
    ReadingExisting(Work),
}

/// What each of the batch's fresh reserves asks for, in their order.
pub(super) fn quantities(work: &Work) -> Vec<u64> {
    work.fresh.iter().map(|p| p.request.qty.units()).collect()
}
