//! The single writer of one SKU in one region, as a state machine without I/O.
//!
//! Modelled on quinn-proto's `Connection`: the owner owns no socket, no
//! database and no clock. A driver feeds it commands and the results of the
//! I/O it asked for, each with the current time (`handle_*`), and asks it
//! what to do next (`poll_io`, `poll_reply`, `poll_timeout`). The region
//! agent drives it with tokio, a database and HTTP; the simulator drives the
//! very same code under a simulated clock, network and database. So every
//! decision (first-fit planning, overflow, when to take, what to return, the
//! central-mode grace, the sweep) is written once.
//!
//! One batch is in progress at a time. Its life:
//! 1. `handle_commands` takes up to `max_in_flight` commands (plus the
//!    overflow of the last batch); requests past their deadline are refused
//!    unserved, admin changes commit first, one at a time.
//! 2. Actions decide on the live holds the owner keeps in memory; only a
//!    key it does not hold (final, or unknown) needs its row: [`Io::Read`].
//! 3. Holds are planned first fit; what does not fit asks the coordinator
//!    for the missing units with one [`Io::Take`].
//! 4. One [`Io::Commit`] carries holds, transitions in decision order
//!    (the expiry of due holds, from the owner's deadline queue, among
//!    them), grants and returns; buyers are answered only once it is
//!    durable. Keys that were not inserted are read back to answer REPLAY,
//!    KEY_REUSED or USER_LIMIT.
//!
//! A failed commit answers its batch PAUSED (nothing of it was written) and
//! reloads the SKU before deciding again.
//!
//! This file holds the owner's state, what a driver may read of it and
//! its outputs (`poll_*`); the inputs (`handle_*`) are in `inputs.rs`, the
//! steps up to a commit in `decide.rs`, the end of a batch in `settle.rs`,
//! the demand it reports in `demand.rs`, and the batch in progress in
//! `work.rs`.

pub mod gate;
pub mod messages;

mod decide;
mod demand;
mod inputs;
mod settle;
mod work;

use std::collections::{BTreeSet, HashMap, VecDeque};

use crate::batch::{NewHold, SkuRecord, StockChange};
use crate::ids::{RequestKey, Sku, SkuSettings, Tenant, TransferId};
use crate::ledger::Ledger;
use crate::policy::Mode;
use crate::protocol::TransferMsg;
use crate::rate::RateMeter;
use crate::reservation::Reservation;
use work::{PendingReserve, Phase};

pub use gate::{gate, GateView};
pub use messages::{
    ActReply, Action, AdminChange, AdminReply, CartEnd, Command, CommitError, Io, PauseReason,
    Reply, ReserveReply, ReserveRequest, Ticket,
};

/// How often an idle owner wakes to expire due holds and return units.
pub const SWEEP_INTERVAL_MS: u64 = 250;

/// Half-life of the owner's demand meter (units asked for per second: what
/// the policy shares the remainder by, and what a take prefetches).
pub const RATE_HALF_LIFE_MS: u64 = 2_000;

/// How long a spell of demand runs before the region reports its rate:
/// the meter's 20 ms floor, enough to tell 50/s from 2,000/s (one unit in
/// the first moment reads as 50/s whatever the true rate), and short
/// beside a far region's round trip, so its first figure is not late (on
/// loopback, 30 ms let the busiest region run dry before the others'
/// figures arrived: `tail-701` 0.18 s against central's 0.14 s).
pub const RATE_REPORT_AFTER_MS: u64 = 20;

/// What an owner needs to know about where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerConfig {
    /// Most commands decided and committed in one batch.
    pub max_in_flight: usize,
    /// Most requests waiting for units from elsewhere; beyond it a request
    /// is refused unserved (REJECTED_WAIT_TIMEOUT) rather than parked.
    pub parked_max: usize,
    /// The agent has a coordinator to take from and return to.
    pub coordinated: bool,
    /// Unique to this owner's incarnation (region, process and SKU): the
    /// owner numbers its transfer ids after it, so they never repeat. Only
    /// identifier characters (`[A-Za-z0-9._:-]`), at most 100 of them.
    pub transfer_id_prefix: String,
}

/// Longest, from its batch's start, the owner keeps settling a commit of
/// unknown outcome ([`CommitError::Unknown`]: reload, commit again) before
/// its requests are told PAUSED; it stops sooner when the last of them
/// stops waiting (its deadline). A request answered PAUSED so learns the
/// truth from its retry with the same key (REPLAY with the hold if the
/// lost commit happened).
pub const SETTLE_MS: u64 = 30_000;

/// How long a driver waits before a reload that follows a failed one.
pub const RELOAD_RETRY_MS: u64 = 250;

/// How long parked requests wait before the owner asks the coordinator
/// again after a take that failed or fell short, unless a directive or
/// grant arrives first. After a take that brought everything it asked for
/// (every batch's take in central mode) the next batch asks at once.
pub const TAKE_RETRY_MS: u64 = 20;

/// A take cut short by its buyers' deadline with less than this left to
/// wait says nothing about the coordinator (the buyers had waited almost
/// their whole time already): the driver reports it with
/// [`SkuOwner::handle_take_late`]. With more left and still no answer the
/// coordinator counts as unreachable ([`SkuOwner::handle_take_answer`]
/// with `None`: PAUSED).
pub const TAKE_BUDGET_MIN_MS: u64 = 500;

/// How much of its recent sale rate a region asks for on top of what its
/// waiting buyers need when it takes, in ms of sales (escrow mode only).
pub const TAKE_PREFETCH_MS: u64 = 250;

/// How many of the last committed grants' ids an owner remembers, to
/// know a grant sent again (the coordinator resends one until it reads
/// the region's ack, about a round trip) from a new one. A copy it has
/// forgotten costs one batch: the store credits each id once.
pub const CREDITED_GRANTS_KEPT: usize = 256;

/// The single writer of one SKU.
#[derive(Debug)]
pub struct SkuOwner {
    cfg: OwnerConfig,
    tenant: Tenant,
    sku: Sku,
    ledger: Ledger,
    settings: SkuSettings,
    paused: bool,
    mode: Mode,
    /// Counters disagree with rows: never sell until an operator looks.
    drifted: bool,
    rows_drift: u64,
    /// A commit failed with an unknown outcome: reload before deciding again.
    needs_reload: bool,
    /// A newer process holds the region.
    fenced: bool,
    /// Cumulative returned units the coordinator asked for; `None` until told.
    return_until: Option<u64>,
    sold_out_everywhere: bool,
    /// Grants from directives, credited with the next batch.
    pending_grants: Vec<TransferMsg>,
    /// Ids of the grants the last batches committed, newest last (at most
    /// [`CREDITED_GRANTS_KEPT`]): the coordinator sends a grant again until
    /// it reads the region's ack, and such a copy is not a new unit.
    credited_grants: VecDeque<TransferId>,
    /// Directive changes to persist with the next batch.
    pending_changes: Vec<StockChange>,
    rate: RateMeter,
    rate_per_s: f64,
    /// When the current spell of demand began (the meter's rate turned
    /// from 0), if there is one.
    woke_at_ms: Option<u64>,
    /// The demand this region reports: [`Self::rate_per_s`] once the
    /// spell is [`RATE_REPORT_AFTER_MS`] old, 0 before.
    reported_rate_per_s: f64,
    /// When the spell of demand reads as stopped if no units are asked for
    /// until then (the owner wakes to tell the coordinator at once); `None`
    /// while none is reported, it has stopped, or buyers are parked here.
    demand_stops_at_ms: Option<u64>,
    /// The coordinator should hear from this region now: see [`Self::take_sync_due`].
    sync_due: bool,
    /// When a release or an expiry last freed units here.
    freed_at_ms: Option<u64>,
    /// The SKU's HELD reservations, by key, as committed: actions decide
    /// on them without reading the database.
    holds: HashMap<RequestKey, Reservation>,
    /// The same holds by expiry: what is due expires with the next batch.
    /// A cart's items are not here: their cart expires them all at once.
    expiry: BTreeSet<(u64, RequestKey)>,
    /// Units set aside for carts whose commit has not ended, by item key:
    /// counted as held in the ledger, written by nobody yet. A reload
    /// forgets them (the database's counters are the truth then).
    aside: HashMap<RequestKey, NewHold>,
    /// When the last batch was decided.
    decided_ms: u64,
    next_tick_ms: u64,
    overflow: VecDeque<PendingReserve>,
    /// Requests waiting for units to arrive from elsewhere, oldest first.
    parked: VecDeque<PendingReserve>,
    /// When parked requests may ask the coordinator again.
    next_take_ms: u64,
    phase: Phase,
    io: Option<Io>,
    replies: VecDeque<(Ticket, Reply)>,
    transfer_seq: u64,
}

impl SkuOwner {
    /// The owner of a SKU loaded from storage at `now_ms`.
    pub fn new(cfg: OwnerConfig, record: SkuRecord, now_ms: u64) -> Self {
        assert!(cfg.max_in_flight > 0, "a batch holds at least one command");
        assert!(cfg.parked_max > 0, "a request can wait for units");
        let mut owner = Self {
            cfg,
            tenant: record.tenant.clone(),
            sku: record.sku.clone(),
            ledger: Ledger::default(),
            settings: record.settings,
            paused: record.paused,
            mode: record.mode,
            drifted: false,
            rows_drift: 0,
            needs_reload: false,
            fenced: false,
            return_until: None,
            sold_out_everywhere: false,
            pending_grants: Vec::new(),
            credited_grants: VecDeque::new(),
            pending_changes: Vec::new(),
            rate: RateMeter::new(now_ms, RATE_HALF_LIFE_MS),
            rate_per_s: 0.0,
            woke_at_ms: None,
            reported_rate_per_s: 0.0,
            demand_stops_at_ms: None,
            sync_due: false,
            freed_at_ms: None,
            holds: HashMap::new(),
            expiry: BTreeSet::new(),
            aside: HashMap::new(),
            decided_ms: 0,
            next_tick_ms: now_ms + SWEEP_INTERVAL_MS,
            overflow: VecDeque::new(),
            parked: VecDeque::new(),
            next_take_ms: 0,
            phase: Phase::Idle,
            io: None,
            replies: VecDeque::new(),
            transfer_seq: 0,
        };
        owner.adopt(record);
        owner
    }

    // ----- what the driver may read -----

    /// The SKU's tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }
    /// The SKU.
    pub fn sku(&self) -> &Sku {
        &self.sku
    }
    /// The region's counters as of the last commit.
    pub fn ledger(&self) -> Ledger {
        self.ledger
    }
    /// The SKU's settings.
    pub fn settings(&self) -> SkuSettings {
        self.settings
    }
    /// Paused by an admin.
    pub fn is_paused(&self) -> bool {
        self.paused
    }
    /// Stopped by the owner itself: drift, fencing, or a reload pending.
    pub fn is_halted(&self) -> bool {
        self.drifted || self.needs_reload || self.fenced
    }
    /// Counters disagree with the reservation rows.
    pub fn is_drifted(&self) -> bool {
        self.drifted
    }
    /// Units by which the counters disagreed with the rows at the last load.
    pub fn rows_drift(&self) -> u64 {
        self.rows_drift
    }
    /// Escrow or central.
    pub fn mode(&self) -> Mode {
        self.mode
    }
    /// The coordinator said no unit is free anywhere.
    pub fn is_sold_out_everywhere(&self) -> bool {
        self.sold_out_everywhere
    }
    /// Units held per second, as of the last commit.
    pub fn sale_rate_per_s(&self) -> f64 {
        self.reported_rate_per_s
    }

    /// Units set aside for carts whose commit has not ended: out of
    /// `available` in memory, not yet written.
    pub fn units_set_aside(&self) -> u64 {
        self.aside.values().map(|hold| hold.qty.units()).sum()
    }

    /// While a take is out, the earliest deadline (ms) of the requests in
    /// the batch that waits for it. The driver gives up on the take then,
    /// as on a coordinator that cannot be reached, so a coordinator that
    /// hangs keeps no buyer past its deadline.
    pub fn take_deadline_ms(&self) -> Option<u64> {
        let Phase::Taking(work) = &self.phase else {
            return None;
        };
        work.fresh.iter().map(|p| p.deadline.at_ms).min()
    }

    /// Whether the driver should sync with the coordinator now instead of
    /// at its next interval (cleared by the call): demand just began here
    /// (the coordinator shares the remainder by every region's demand, and
    /// an old report says 0), buyers wait for units from elsewhere, or units
    /// arrived or left (acks free the coordinator's outbox; returned units
    /// are free for others only once it has them).
    pub fn take_sync_due(&mut self) -> bool {
        std::mem::take(&mut self.sync_due)
    }
    /// No batch in progress: the owner takes commands.
    pub fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Idle)
    }
    /// Requests left over from the last batch wait to be tried again: the
    /// driver starts the next batch without waiting for new commands.
    pub fn has_overflow(&self) -> bool {
        !self.overflow.is_empty()
    }
    /// How many new commands the next batch takes: the batch bound less
    /// the overflow that is tried again first.
    pub fn batch_room(&self) -> usize {
        self.cfg.max_in_flight.saturating_sub(self.overflow.len())
    }

    /// What the gate in front of this owner may answer from, given the link.
    pub fn gate_view(&self, link_down: bool) -> GateView {
        GateView {
            available: self.ledger.available,
            paused: self.paused,
            halted: self.is_halted(),
            central: self.mode == Mode::Central,
            coordinated: self.cfg.coordinated,
            link_down,
            sold_out_everywhere: self.sold_out_everywhere,
        }
    }

    // ----- outputs -----

    /// The I/O to do next, if any; each is answered by its `handle_*`.
    pub fn poll_io(&mut self) -> Option<Io> {
        self.io.take()
    }

    /// The next answer to a command.
    pub fn poll_reply(&mut self) -> Option<(Ticket, Reply)> {
        self.replies.pop_front()
    }

    /// When the owner wants `handle_timeout` at the latest, ms since the
    /// epoch: the next tick, the first hold to fall due, the moment its
    /// demand reads as stopped, or the next take for requests waiting on
    /// units from elsewhere, or the first of their deadlines. A hold
    /// already due when the last batch was decided (that batch could not
    /// expire it) waits for the tick, not a busy loop.
    pub fn poll_timeout(&self) -> u64 {
        let parked = self
            .parked
            .iter()
            .map(|p| p.deadline.at_ms + 1)
            .min()
            .map(|deadline| deadline.min(self.next_take_ms));
        let due = self
            .expiry
            .first()
            .map(|(at, _)| *at)
            .filter(|at| *at > self.decided_ms);
        [parked, due, self.demand_stops_at_ms]
            .into_iter()
            .flatten()
            .fold(self.next_tick_ms, u64::min)
    }

    /// Requests waiting for units from elsewhere.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    fn reply(&mut self, ticket: Ticket, reply: Reply) {
        self.replies.push_back((ticket, reply));
    }

    fn next_transfer_id(&mut self, kind: &str) -> TransferId {
        self.transfer_seq += 1;
        let id = format!(
            "{kind}-{}-{}",
            self.cfg.transfer_id_prefix, self.transfer_seq
        );
        TransferId::try_from(id).expect("transfer_id_prefix holds only identifier characters")
    }
}

#[cfg(test)]
mod tests;
