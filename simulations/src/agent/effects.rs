//! What an agent asks of the world: answers to buyers, messages to the
//! coordinator, commits and timers, each at a simulated time.

use escrow_core::owner::{ActReply, ReserveReply, Ticket};

use super::{Answer, BuyerAction};
use crate::network::Envelope;

/// An agent timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The batch's commit finished.
    CommitDone,
    /// The idle owner wakes up.
    OwnerTick,
    /// The owner asked to be woken (parked requests: a take or a deadline is due).
    Wake,
    /// Time to report (stale unless it carries the current sync generation).
    SyncTick(u64),
    /// A sync call got no answer within the client timeout.
    SyncTimeout(u64),
    /// A take call got no answer within the client timeout.
    TakeTimeout(u64),
    /// A take call got no answer before its buyers' deadline.
    TakeDeadline(u64),
    /// Borrow number `n`'s ask is written: it may leave.
    BorrowWritten(u64),
    /// Borrow number `n`'s buyer has waited its queue wait for an answer.
    BorrowTimeout(u64),
    /// The loans being written (as the home of their users) are durable.
    LoansWritten,
    /// A limits call got no answer within the client timeout.
    LimitsTimeout(u64),
}

/// What an agent asks the world to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Answer a buyer's reserve.
    Answer {
        /// The buyer.
        buyer: u32,
        /// When the answer reaches them.
        at_us: u64,
        /// The answer.
        answer: Answer,
        /// The request held on a place borrowed from the user's home
        /// region (a global per-user limit, the user away from home).
        borrowed: bool,
    },
    /// Answer a buyer's action.
    Acted {
        /// The buyer.
        buyer: u32,
        /// When the answer reaches them.
        at_us: u64,
        /// What they asked.
        action: BuyerAction,
        /// The answer.
        reply: ActReply,
    },
    /// Answer the cart that asked for an item's units to be set aside.
    CartItem {
        /// The cart attempt's ticket ([`super::cart_ticket`]).
        ticket: Ticket,
        /// When the answer reaches the cart.
        at_us: u64,
        /// The owner's answer: `Held` is units set aside, not written.
        reply: ReserveReply,
    },
    /// Send a message to the coordinator.
    Send {
        /// When it leaves.
        at_us: u64,
        /// The message.
        envelope: Envelope,
    },
    /// A commit: `cpu_us` of work on the agent's CPU (shared by every agent
    /// when the scenario puts them on one machine), then `wait_us` for the
    /// flush; then `done`.
    Commit {
        /// Which agent.
        region: usize,
        /// Its incarnation.
        epoch: u32,
        /// When the work is ready to run.
        from_us: u64,
        /// CPU time the commit's rows take.
        cpu_us: u64,
        /// The flush after the work.
        wait_us: u64,
        /// The timer that says it is durable: [`Timer::CommitDone`] for
        /// the owner's batch, or a borrow's or loans' own write.
        done: Timer,
    },
    /// Wake the agent.
    Timer {
        /// Which agent.
        region: usize,
        /// Its incarnation; a restart makes older timers stale.
        epoch: u32,
        /// When.
        at_us: u64,
        /// Why.
        timer: Timer,
    },
}
