//! What goes into a SKU owner and what comes out of it.
//!
//! Buyers and admins send [`Command`]s, each with a [`Ticket`] the driver
//! chose; the owner answers each ticket exactly once with a [`Reply`]. The
//! owner asks its driver for I/O with [`Io`] and is told how it ended
//! through the owner's `handle_*` methods.

use crate::admission::Deadline;
use crate::batch::Batch;
use crate::ids::{Qty, RequestKey, SkuSettings, TransferId, TtlMs, UserId};
use crate::protocol::TakeRequest;
use crate::reservation::{Reservation, Transition};
use serde::{Deserialize, Serialize};

/// The driver's name for one command, echoed in its reply.
pub type Ticket = u64;

/// A buyer's request for new units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveRequest {
    /// The buyer's key.
    pub request_key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// Units asked for.
    pub qty: Qty,
    /// Hold duration asked for, else the SKU's.
    pub ttl: Option<TtlMs>,
    /// The place this hold uses, borrowed from the user's home region
    /// under a global per-user limit ([`crate::user_limit`]); the commit
    /// that inserts the hold marks the borrow used.
    pub borrow: Option<TransferId>,
}

/// Why a SKU answers PAUSED: each PAUSED means one of these, so a buyer
/// and an operator can tell an admin's decision from a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PauseReason {
    /// An admin paused the SKU (new holds only).
    AdminPause,
    /// The owner stopped itself: drift, fencing, a reload pending, or the
    /// owner is gone.
    Halted,
    /// The coordinator could not be asked (a take failed, the link is down).
    CoordinatorUnreachable,
    /// A commit or a read of the database failed.
    Storage,
}

impl PauseReason {
    /// The wire name, also the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::AdminPause => "admin_pause",
            PauseReason::Halted => "halted",
            PauseReason::CoordinatorUnreachable => "coordinator_unreachable",
            PauseReason::Storage => "storage",
        }
    }
}

/// The answer to a [`ReserveRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveReply {
    /// A new hold.
    Held(Reservation),
    /// The key's existing reservation.
    Replay(Reservation),
    /// Nothing available anywhere; nothing written.
    SoldOut,
    /// The user already has an active reservation; nothing written.
    UserLimit,
    /// The key was used for another user, SKU or quantity.
    KeyReused,
    /// The SKU cannot sell now, for the reason given; nothing written.
    Paused(PauseReason),
    /// The SKU's list of requests waiting for units is full; nothing
    /// written, and the request never waited.
    QueueFull,
    /// Waited in the queue too long; nothing written.
    WaitTimeout,
}

impl ReserveReply {
    /// The contract's outcome name.
    pub fn outcome(&self) -> &'static str {
        match self {
            ReserveReply::Held(_) => "HELD",
            ReserveReply::Replay(_) => "REPLAY",
            ReserveReply::SoldOut => "SOLD_OUT",
            ReserveReply::UserLimit => "USER_LIMIT",
            ReserveReply::KeyReused => "KEY_REUSED",
            ReserveReply::Paused(_) => "PAUSED",
            ReserveReply::QueueFull => "REJECTED_QUEUE_FULL",
            ReserveReply::WaitTimeout => "REJECTED_WAIT_TIMEOUT",
        }
    }
}

/// A buyer action on an existing reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// HELD -> SOLD.
    Confirm,
    /// HELD -> RELEASED.
    Release,
    /// Later expiry, once.
    Extend(Option<TtlMs>),
}

/// The answer to an [`Action`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActReply {
    /// Done (or already done); the reservation now.
    Accepted(Reservation),
    /// Not possible in the reservation's state; the reservation now.
    Refused(Reservation),
    /// No such reservation.
    NotFound,
    /// The SKU cannot be written now, for the reason given; nothing written.
    Paused(PauseReason),
    /// Waited in the queue too long; nothing written.
    WaitTimeout,
}

impl ActReply {
    /// The metric label of this answer.
    pub fn outcome(&self) -> &'static str {
        match self {
            ActReply::Accepted(_) => "ACCEPTED",
            ActReply::Refused(_) => "REFUSED",
            ActReply::NotFound => "NOT_FOUND",
            ActReply::Paused(_) => "PAUSED",
            ActReply::WaitTimeout => "REJECTED_WAIT_TIMEOUT",
        }
    }
}

/// An admin change routed through the owner so the counters keep one writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminChange {
    /// Set the SKU's total and settings together (standalone), all or nothing.
    Configure {
        /// The new total.
        total: u64,
        /// The new settings.
        settings: SkuSettings,
    },
    /// Add units.
    AddStock(u64),
    /// Stop or resume selling.
    Pause(bool),
}

/// The answer to an [`AdminChange`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminReply {
    /// Applied.
    Done,
    /// The new total is below what is held or sold.
    BelowCommitted {
        /// Units held or sold, the lowest total allowed.
        committed: u64,
    },
    /// The SKU cannot be written now, for the reason given.
    Paused(PauseReason),
}

/// A command for the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A buyer wants units.
    Reserve {
        /// Echoed in the reply.
        ticket: Ticket,
        /// What the buyer asks for.
        request: ReserveRequest,
        /// When the request stops waiting.
        deadline: Deadline,
        /// The driver knows the key has a committed reservation: answer
        /// from its row instead of trying to hold.
        known: bool,
    },
    /// A buyer acts on a reservation.
    Act {
        /// Echoed in the reply.
        ticket: Ticket,
        /// The reservation's key.
        key: RequestKey,
        /// What to do.
        action: Action,
        /// When the request stops waiting.
        deadline: Deadline,
    },
    /// An admin changes the SKU.
    Admin {
        /// Echoed in the reply.
        ticket: Ticket,
        /// The change.
        change: AdminChange,
    },
    /// A cart wants units of this SKU: decided as a reserve is (it waits
    /// for units from elsewhere the same way), but nothing is written. The
    /// units are set aside in memory, answered `Held` with the hold the
    /// cart will write, until the cart's own commit ends and the driver
    /// says how ([`super::SkuOwner::handle_cart_end`]).
    SetAside {
        /// Echoed in the reply.
        ticket: Ticket,
        /// The item: its key ([`crate::RequestKey::cart_item`]), the
        /// cart's user, the item's units and the cart's hold duration.
        request: ReserveRequest,
        /// When the request stops waiting.
        deadline: Deadline,
    },
}

/// How a cart's commit ended for one of its items, as its driver tells
/// the item's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CartEnd {
    /// The cart was written: the units set aside are its item's hold.
    Held,
    /// Nothing was written: the units set aside are free again.
    Dropped,
    /// Whether the cart was written is not known: the units set aside are
    /// let go and the SKU is read again before the next decision.
    Unknown,
    /// The cart's committed transition, made on this item's row too.
    Moved(Transition),
}

/// The owner's answer to one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// To a reserve.
    Reserve(ReserveReply),
    /// To an action.
    Act(ActReply),
    /// To an admin change.
    Admin(AdminReply),
}

/// I/O the owner needs done before it can go on.
#[derive(Debug, Clone, PartialEq)]
pub enum Io {
    /// Read these keys' committed reservations; then `handle_read`.
    Read(Vec<RequestKey>),
    /// Ask the coordinator for units; then `handle_take_answer`.
    Take(TakeRequest),
    /// Commit this batch in one transaction; then `handle_commit_result`.
    Commit(Batch),
    /// Load the SKU's stored state again; then `handle_reload`. A driver
    /// waits [`super::RELOAD_RETRY_MS`] before a reload that follows a
    /// failed one.
    Reload,
}

/// Why a commit did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitError {
    /// A newer process holds the region: this one never writes again.
    Fenced,
    /// Refused, or failed before the commit was asked for: memory may be
    /// wrong, reload first.
    Failed,
    /// The commit itself got no answer (the connection broke, or the
    /// database did not answer in time): it may have happened, on the
    /// primary alone or everywhere. Settled from the database (reload,
    /// commit again) for up to [`super::SETTLE_MS`], never guessed.
    Unknown,
}
