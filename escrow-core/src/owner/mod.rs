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

pub mod gate;
pub mod messages;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use crate::admission::{plan_reserves, Deadline, ReservePlan};
use crate::batch::{Batch, BatchOutcome, NewHold, SkuRecord, StockChange};
use crate::ids::{RequestKey, Sku, SkuSettings, Tenant};
use crate::ledger::{Ledger, LedgerError};
use crate::policy::{units_to_return, Mode};
use crate::protocol::{merge_transfers, SkuDirective, TakeRequest, TakeResponse, TransferMsg};
use crate::rate::RateMeter;
use crate::reservation::{Refusal, Reservation, Status, Transition};

pub use gate::{gate, GateView};
pub use messages::{
    ActReply, Action, AdminChange, AdminReply, Command, CommitError, Io, PauseReason, Reply,
    ReserveReply, ReserveRequest, Ticket,
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
    /// owner numbers its transfer ids after it, so they never repeat.
    pub transfer_id_prefix: String,
}

/// A reserve request waiting in the owner.
#[derive(Debug)]
struct PendingReserve {
    ticket: Ticket,
    request: ReserveRequest,
    deadline: Deadline,
    known: bool,
}

/// An action waiting in the owner.
#[derive(Debug)]
struct PendingAct {
    ticket: Ticket,
    key: RequestKey,
    action: Action,
}

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

/// How the take of a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TakeEnd {
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
struct Work {
    now_ms: u64,
    admins: VecDeque<(Ticket, AdminChange)>,
    /// Reserves that try to hold, in arrival order.
    fresh: Vec<PendingReserve>,
    /// Reserves of keys known to be committed: answered from their rows.
    lookups: Vec<PendingReserve>,
    /// Second copies of a key in this batch: next batch, when the first's fate is known.
    later: Vec<PendingReserve>,
    acts: Vec<PendingAct>,
    rows: HashMap<RequestKey, Reservation>,
    plan: ReservePlan,
    granted: u64,
    take: TakeEnd,
    batch: Batch,
    /// `fresh` split by the plan, in the order of `batch.holds`.
    holding: Vec<PendingReserve>,
    overflow: Vec<PendingReserve>,
    act_results: Vec<Option<(Result<(), Refusal>, Reservation)>>,
    /// Reserves answered from their rows after the commit.
    existing: Vec<PendingReserve>,
}

impl Work {
    fn new(tenant: Tenant, sku: Sku, now_ms: u64) -> Self {
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
            overflow: Vec::new(),
            act_results: Vec::new(),
            existing: Vec::new(),
        }
    }
}

/// Where the batch in progress stands.
#[derive(Debug)]
enum Phase {
    Idle,
    Reloading(Work),
    /// An admin change's commit, with its ticket.
    Admin(Work, Ticket),
    ReadingActs(Work),
    Taking(Work),
    Committing(Work),
    ReadingExisting(Work),
}

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
    /// The coordinator should hear from this region now: see [`Self::take_sync_due`].
    sync_due: bool,
    /// When a release or an expiry last freed units here.
    freed_at_ms: Option<u64>,
    /// The SKU's HELD reservations, by key, as committed: actions decide
    /// on them without reading the database.
    holds: HashMap<RequestKey, Reservation>,
    /// The same holds by expiry: what is due expires with the next batch.
    expiry: BTreeSet<(u64, RequestKey)>,
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
            pending_changes: Vec::new(),
            rate: RateMeter::new(now_ms, RATE_HALF_LIFE_MS),
            rate_per_s: 0.0,
            woke_at_ms: None,
            reported_rate_per_s: 0.0,
            sync_due: false,
            freed_at_ms: None,
            holds: HashMap::new(),
            expiry: BTreeSet::new(),
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
    /// epoch: the next tick, the first hold to fall due, or the next take
    /// for requests waiting on units from elsewhere, or the first of their
    /// deadlines. A hold already due when the last batch was decided (that
    /// batch could not expire it) waits for the tick, not a busy loop.
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
        [parked, due]
            .into_iter()
            .flatten()
            .fold(self.next_tick_ms, u64::min)
    }

    /// Requests waiting for units from elsewhere.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    // ----- inputs -----

    /// A directive (and the grants not yet acknowledged) from a sync; may
    /// arrive at any time. Changes are persisted with the next batch.
    pub fn handle_directive(&mut self, d: &SkuDirective, grants: Vec<TransferMsg>) {
        if d.paused != self.paused {
            self.paused = d.paused;
            self.pending_changes.push(StockChange::Pause(d.paused));
        }
        if d.mode != self.mode {
            self.mode = d.mode;
            self.pending_changes.push(StockChange::Mode(d.mode));
        }
        // Settings the coordinator could not have meant are not guessed at:
        // the owner keeps its own until a valid directive comes.
        let parsed = i64::try_from(d.hold_ttl_ms)
            .ok()
            .and_then(|ttl| SkuSettings::parse(Some(i64::from(d.max_per_user)), Some(ttl)).ok());
        if let Some(settings) = parsed {
            if settings != self.settings {
                self.settings = settings;
                self.pending_changes.push(StockChange::Settings(settings));
            }
        }
        let recalled = d.return_until > self.return_until.unwrap_or(0).max(self.ledger.returned);
        self.return_until = Some(d.return_until);
        self.sold_out_everywhere = d.sold_out;
        // Something moved: waiting requests may ask again at once.
        self.next_take_ms = 0;
        merge_transfers(&mut self.pending_grants, grants);
        // A recall, a grant or a change to persist is worth a batch now,
        // not at the next tick: another region's buyers may be waiting.
        if recalled || !self.pending_grants.is_empty() || !self.pending_changes.is_empty() {
            self.next_tick_ms = 0;
        }
    }

    /// Starts a batch with `commands` (at most `max_in_flight` of them,
    /// fewer when overflow is waiting). Only while idle.
    pub fn handle_commands(&mut self, now_ms: u64, commands: Vec<Command>) {
        assert!(self.is_idle(), "one batch at a time");
        self.next_tick_ms = now_ms + SWEEP_INTERVAL_MS;
        self.decided_ms = now_ms;
        let mut work = Work::new(self.tenant.clone(), self.sku.clone(), now_ms);
        let mut reserves: Vec<PendingReserve> = self.parked.drain(..).collect();
        reserves.extend(self.overflow.drain(..));
        let mut asked = 0;
        for command in commands {
            match command {
                Command::Reserve {
                    ticket,
                    request,
                    deadline,
                    known,
                } => reserves.push({
                    if !known {
                        asked += request.qty.units();
                    }
                    PendingReserve {
                        ticket,
                        request,
                        deadline,
                        known,
                    }
                }),
                Command::Act {
                    ticket,
                    key,
                    action,
                    deadline,
                } => {
                    if deadline.passed(now_ms) {
                        self.reply(ticket, Reply::Act(ActReply::WaitTimeout));
                    } else {
                        work.acts.push(PendingAct {
                            ticket,
                            key,
                            action,
                        });
                    }
                }
                Command::Admin { ticket, change } => work.admins.push_back((ticket, change)),
            }
        }
        // Demand, not sales: a region starved of units still wants them.
        self.rate.record(now_ms, asked);
        self.measure(now_ms);
        for p in reserves {
            if p.deadline.passed(now_ms) {
                self.reply(p.ticket, Reply::Reserve(ReserveReply::WaitTimeout));
            } else {
                work.fresh.push(p);
            }
        }
        if self.fenced || self.drifted {
            return self.refuse(work, PauseReason::Halted);
        }
        if self.needs_reload {
            self.phase = Phase::Reloading(work);
            self.io = Some(Io::Reload);
            return;
        }
        self.next_admin(work);
    }

    /// A newer process holds the region: this owner never writes again.
    pub fn handle_fenced(&mut self) {
        self.fenced = true;
    }

    /// The driver stops: requests left over from the last batch are
    /// answered PAUSED (nothing of theirs was written). Only while idle.
    pub fn handle_close(&mut self) {
        assert!(self.is_idle(), "close between batches");
        let waiting: Vec<PendingReserve> = self
            .parked
            .drain(..)
            .chain(self.overflow.drain(..))
            .collect();
        for p in waiting {
            self.reply(
                p.ticket,
                Reply::Reserve(ReserveReply::Paused(PauseReason::Halted)),
            );
        }
    }

    /// Nothing came for a while: expire due holds and return units if due.
    /// Only while idle.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        if self.is_idle() {
            self.handle_commands(now_ms, Vec::new());
        }
    }

    /// The stored state after [`Io::Reload`], or `None` if it could not be read.
    pub fn handle_reload(&mut self, record: Option<SkuRecord>) {
        let Phase::Reloading(work) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            panic!("a reload answer without a reload");
        };
        match record {
            Some(record) => {
                self.needs_reload = false;
                self.adopt(record);
                if self.drifted {
                    return self.refuse(work, PauseReason::Halted);
                }
                self.next_admin(work);
            }
            None => self.refuse(work, PauseReason::Storage),
        }
    }

    /// The rows asked for by [`Io::Read`] (missing keys have none), or
    /// `None` if they could not be read.
    pub fn handle_read(&mut self, rows: Option<Vec<Reservation>>) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::ReadingActs(mut work) => match rows {
                Some(rows) => {
                    work.rows.extend(
                        rows.into_iter()
                            .filter(|r| r.sku == self.sku)
                            .map(|r| (r.request_key.clone(), r)),
                    );
                    self.plan(work);
                }
                // Unknown is not "not found": refuse, nothing was written.
                None => self.refuse(work, PauseReason::Storage),
            },
            Phase::ReadingExisting(mut work) => {
                match rows {
                    Some(rows) => {
                        let rows: HashMap<&RequestKey, &Reservation> =
                            rows.iter().map(|r| (&r.request_key, r)).collect();
                        for p in std::mem::take(&mut work.existing) {
                            let reply = match rows.get(&p.request.request_key) {
                                Some(r)
                                    if r.user_id == p.request.user_id
                                        && r.sku == self.sku
                                        && r.qty == p.request.qty =>
                                {
                                    ReserveReply::Replay((*r).clone())
                                }
                                Some(_) => ReserveReply::KeyReused,
                                None => ReserveReply::UserLimit,
                            };
                            self.reply(p.ticket, Reply::Reserve(reply));
                        }
                    }
                    None => {
                        for p in std::mem::take(&mut work.existing) {
                            let reply = ReserveReply::Paused(PauseReason::Storage);
                            self.reply(p.ticket, Reply::Reserve(reply));
                        }
                    }
                }
                self.settle_overflow(work);
            }
            other => panic!("a read answer in phase {other:?}"),
        }
    }

    /// The coordinator's answer to [`Io::Take`], or `None` if it could not be asked.
    pub fn handle_take_answer(&mut self, answer: Option<TakeResponse>) {
        let Phase::Taking(mut work) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            panic!("a take answer without a take");
        };
        work.take = TakeEnd::Unreachable;
        self.next_take_ms = work.now_ms + TAKE_RETRY_MS;
        if let Some(resp) = answer {
            work.take = TakeEnd::Moving;
            if let Some(grant) = resp.grant {
                work.granted = grant.units;
                work.batch.grants.push(grant);
            }
            if resp.exhausted {
                self.sold_out_everywhere = true;
                work.take = TakeEnd::Exhausted;
            } else {
                let quantities = quantities(&work);
                let needed: u64 = work.plan.overflow.iter().map(|&i| quantities[i]).sum();
                if work.granted < needed {
                    // Buyers wait for units elsewhere: report the demand now.
                    self.sync_due = true;
                } else {
                    // Everything asked for came: the next batch may ask at once.
                    self.next_take_ms = 0;
                }
            }
            if work.granted > 0 {
                work.plan = plan_reserves(self.ledger.available + work.granted, &quantities(&work));
            }
        }
        self.build(work);
    }

    /// Updates the region's demand at `now_ms`, and what it reports: a
    /// spell of demand younger than [`RATE_REPORT_AFTER_MS`] reports none
    /// yet, as its first units say little of its rate (one unit in the
    /// meter's first 20 ms reads as 50/s in a region about to sell 2,000/s,
    /// and the coordinator would recall the region's units for others). Its
    /// first real figure asks for a sync at once.
    fn measure(&mut self, now_ms: u64) {
        self.rate_per_s = self.demand_per_s(now_ms);
        if self.rate_per_s == 0.0 {
            self.woke_at_ms = None;
        } else if self.woke_at_ms.is_none() {
            self.woke_at_ms = Some(now_ms);
        }
        let was_silent = self.reported_rate_per_s == 0.0;
        self.reported_rate_per_s = match self.woke_at_ms {
            Some(at) if now_ms >= at + RATE_REPORT_AFTER_MS => self.rate_per_s,
            _ => 0.0,
        };
        self.sync_due |= was_silent && self.reported_rate_per_s > 0.0;
    }

    /// The region's demand now: the meter's, except that buyers parked
    /// here waiting for units are demand still, however long ago they came.
    fn demand_per_s(&mut self, now_ms: u64) -> f64 {
        if self.parked.is_empty() {
            self.rate.demand_per_s(now_ms)
        } else {
            self.rate.rate_per_s(now_ms)
        }
    }

    /// The take was not answered before the earliest deadline of the
    /// buyers it was for: the coordinator is slow, not known to be gone.
    /// Nothing of theirs was written; what the take may have granted
    /// arrives by sync. Those past their deadline are answered
    /// REJECTED_WAIT_TIMEOUT (they waited); the others keep waiting and
    /// ask again, instead of all being told PAUSED.
    pub fn handle_take_late(&mut self) {
        let Phase::Taking(mut work) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            panic!("a late take without a take");
        };
        work.take = TakeEnd::NotAsked;
        self.next_take_ms = work.now_ms + TAKE_RETRY_MS;
        self.build(work);
    }

    /// How [`Io::Commit`] ended, with the batch handed back (the owner
    /// lends it to the driver rather than copy it on every commit).
    pub fn handle_commit_result(
        &mut self,
        batch: Batch,
        result: Result<BatchOutcome, CommitError>,
    ) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Admin(work, ticket) => match result {
                Ok(_) => {
                    for change in &batch.changes {
                        self.apply_change(*change);
                    }
                    self.reply(ticket, Reply::Admin(AdminReply::Done));
                    self.next_admin(work);
                }
                Err(error) => {
                    let reason = self.commit_failed(error);
                    self.reply(ticket, Reply::Admin(AdminReply::Paused(reason)));
                    self.refuse(work, reason);
                }
            },
            Phase::Committing(mut work) => match result {
                Ok(outcome) => {
                    self.sync_due |= !batch.returns.is_empty() || !batch.grants.is_empty();
                    work.batch = batch;
                    self.committed(work, outcome)
                }
                Err(error) => {
                    let reason = self.commit_failed(error);
                    self.refuse(work, reason);
                }
            },
            other => panic!("a commit result in phase {other:?}"),
        }
    }

    // ----- the batch's steps -----

    /// Takes stored state as the truth, refusing to sell on drift.
    fn adopt(&mut self, record: SkuRecord) {
        self.ledger = record.ledger;
        self.settings = record.settings;
        self.paused = record.paused;
        self.mode = record.mode;
        self.drifted = !record.rows_agree();
        self.rows_drift = record.rows_drift();
        self.expiry = record
            .holds
            .iter()
            .map(|r| (r.expires_at_ms, r.request_key.clone()))
            .collect();
        self.holds = record
            .holds
            .into_iter()
            .map(|r| (r.request_key.clone(), r))
            .collect();
    }

    /// Keeps memory's live holds as a committed transition left them.
    fn settle(&mut self, key: &RequestKey, change: Transition) {
        let Some(r) = self.holds.get_mut(key) else {
            return;
        };
        self.expiry.remove(&(r.expires_at_ms, key.clone()));
        r.apply(change);
        if r.status == Status::Held {
            self.expiry.insert((r.expires_at_ms, key.clone()));
        } else {
            self.holds.remove(key);
        }
    }

    /// Commits the next admin change, or goes on to serve buyers.
    fn next_admin(&mut self, mut work: Work) {
        while let Some((ticket, change)) = work.admins.pop_front() {
            match self.admin_changes(change) {
                Err(reply) => self.reply(ticket, Reply::Admin(reply)),
                Ok(changes) if changes.is_empty() => {
                    self.reply(ticket, Reply::Admin(AdminReply::Done));
                }
                Ok(changes) => {
                    let mut batch = Batch::new(self.tenant.clone(), self.sku.clone(), work.now_ms);
                    batch.changes = changes;
                    self.io = Some(Io::Commit(batch));
                    self.phase = Phase::Admin(work, ticket);
                    return;
                }
            }
        }
        self.serve(work);
    }

    /// The stored changes an admin change needs, or why it is refused.
    fn admin_changes(&self, change: AdminChange) -> Result<Vec<StockChange>, AdminReply> {
        let mut changes = Vec::with_capacity(2);
        match change {
            AdminChange::Configure { total, settings } => {
                let quota = self.ledger.quota();
                if total >= quota {
                    changes.push(StockChange::Receive(total - quota));
                } else if quota - total <= self.ledger.available {
                    changes.push(StockChange::Return(quota - total));
                } else {
                    return Err(AdminReply::BelowCommitted {
                        committed: self.ledger.held + self.ledger.sold,
                    });
                }
                if settings != self.settings {
                    changes.push(StockChange::Settings(settings));
                }
            }
            AdminChange::AddStock(units) => changes.push(StockChange::Receive(units)),
            AdminChange::Pause(paused) => changes.push(StockChange::Pause(paused)),
        }
        changes.retain(|c| !matches!(c, StockChange::Receive(0) | StockChange::Return(0)));
        Ok(changes)
    }

    /// Sorts the reserves: a known key is answered from its row; the first
    /// copy of a new key tries to hold; a second copy waits for the next batch.
    fn serve(&mut self, mut work: Work) {
        let mut seen = HashSet::new();
        for p in std::mem::take(&mut work.fresh) {
            if self.paused {
                let reply = ReserveReply::Paused(PauseReason::AdminPause);
                self.reply(p.ticket, Reply::Reserve(reply));
            } else if p.known {
                work.lookups.push(p);
            } else if seen.insert(p.request.request_key.clone()) {
                work.fresh.push(p);
            } else {
                work.later.push(p);
            }
        }
        // Live holds are in memory; only keys this owner does not hold
        // (final reservations, or none at all) are read.
        let mut unheld = Vec::new();
        for a in &work.acts {
            if work.rows.contains_key(&a.key) || unheld.contains(&a.key) {
                continue;
            }
            match self.holds.get(&a.key) {
                Some(r) => {
                    work.rows.insert(a.key.clone(), r.clone());
                }
                None => unheld.push(a.key.clone()),
            }
        }
        if unheld.is_empty() {
            return self.plan(work);
        }
        self.io = Some(Io::Read(unheld));
        self.phase = Phase::ReadingActs(work);
    }

    /// Plans holds first fit; asks the coordinator for what does not fit.
    fn plan(&mut self, mut work: Work) {
        let quantities = quantities(&work);
        work.plan = plan_reserves(self.ledger.available, &quantities);
        work.take = TakeEnd::Exhausted;
        if !work.plan.overflow.is_empty() && self.cfg.coordinated && !self.sold_out_everywhere {
            // What fits is committed now and what did not waits for the
            // next batch's take, right after this commit: the buyers this
            // region can serve do not wait for a round trip to the
            // coordinator that only the others need (across an ocean, a
            // quarter of a second for a whole batch when a region runs out).
            if work.now_ms < self.next_take_ms || !work.plan.try_hold.is_empty() {
                work.take = TakeEnd::NotAsked;
                return self.build(work);
            }
            let wanted: u64 = work.plan.overflow.iter().map(|&i| quantities[i]).sum();
            // In escrow mode a take also brings a little of the region's
            // near-term demand, so the next buyers sell locally instead of
            // each batch asking again; central mode keeps every unit central.
            let prefetch = match self.mode {
                Mode::Escrow => (self.rate_per_s * TAKE_PREFETCH_MS as f64 / 1_000.0).ceil() as u64,
                Mode::Central => 0,
            };
            let id = self.next_transfer_id("t");
            self.io = Some(Io::Take(TakeRequest {
                id,
                tenant: self.tenant.to_string(),
                sku: self.sku.to_string(),
                units: wanted,
                prefetch,
                received: self.ledger.received,
                returned: self.ledger.returned,
            }));
            self.phase = Phase::Taking(work);
            return;
        }
        self.build(work);
    }

    /// Writes the batch: holds, actions in decision order, the expiry of
    /// due holds, grants, directive changes and returns.
    fn build(&mut self, mut work: Work) {
        let now_ms = work.now_ms;
        let local_demand = !work.fresh.is_empty();
        let mut slots: Vec<Option<PendingReserve>> = std::mem::take(&mut work.fresh)
            .into_iter()
            .map(Some)
            .collect();
        for &index in &work.plan.try_hold {
            // Plan indices are distinct positions in `fresh`.
            let Some(p) = slots[index].take() else {
                unreachable!("a plan names each request once");
            };
            let ttl = p.request.ttl.unwrap_or(self.settings.hold_ttl);
            work.batch.holds.push(NewHold {
                request_key: p.request.request_key.clone(),
                user_id: p.request.user_id.clone(),
                qty: p.request.qty,
                expires_at_ms: now_ms + ttl.get(),
            });
            work.holding.push(p);
        }
        work.overflow = work
            .plan
            .overflow
            .iter()
            .filter_map(|&i| slots[i].take())
            .collect();

        // Actions decide on the rows as each earlier action of this batch left them.
        for a in &work.acts {
            let Some(row) = work.rows.get_mut(&a.key) else {
                work.act_results.push(None);
                continue;
            };
            let verdict = match a.action {
                Action::Confirm => row.confirm(now_ms),
                Action::Release => row.release(now_ms),
                Action::Extend(ttl) => row.extend(now_ms, ttl.unwrap_or(self.settings.hold_ttl)),
            };
            if let Some(change) = verdict.change {
                work.batch
                    .transitions
                    .push((a.key.clone(), row.qty, change));
                row.apply(change);
            }
            work.act_results.push(Some((verdict.result, row.clone())));
        }

        for grant in self.pending_grants.drain(..) {
            if !work.batch.grants.iter().any(|g| g.id == grant.id) {
                work.batch.grants.push(grant);
            }
        }
        work.batch.changes.append(&mut self.pending_changes);
        if self.cfg.coordinated {
            let free = (self.ledger.available + work.granted)
                .checked_sub(work.plan.units)
                .expect("a plan holds no more than is available");
            // Units this batch's own buyers could not get are not given
            // away under them: while there is overflow, nothing is spare.
            let spare = if work.overflow.is_empty() { free } else { 0 };
            let freed_ms_ago = self
                .freed_at_ms
                .map_or(u64::MAX, |at| now_ms.saturating_sub(at));
            let units = units_to_return(
                self.mode,
                spare,
                self.return_until,
                self.ledger.returned,
                local_demand,
                freed_ms_ago,
            );
            if units > 0 {
                let id = self.next_transfer_id("r");
                work.batch.returns.push(TransferMsg {
                    id,
                    tenant: self.tenant.to_string(),
                    sku: self.sku.to_string(),
                    units,
                });
            }
        }
        // Due holds expire; one an action of this batch touched was
        // decided by the action (which expires what it finds due).
        let any_due = self.expiry.first().is_some_and(|(at, _)| *at <= now_ms);
        let acted: HashSet<&RequestKey> = if any_due {
            work.acts.iter().map(|a| &a.key).collect()
        } else {
            HashSet::new()
        };
        let due: Vec<RequestKey> = self
            .expiry
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .map(|(_, key)| key)
            .filter(|key| !acted.contains(key))
            .cloned()
            .collect();
        for key in due {
            let qty = self.holds[&key].qty;
            work.batch.transitions.push((key, qty, Transition::Expire));
        }
        if work.batch.is_empty() {
            return self.committed(work, BatchOutcome::default());
        }
        let batch = std::mem::replace(
            &mut work.batch,
            Batch::new(self.tenant.clone(), self.sku.clone(), work.now_ms),
        );
        self.io = Some(Io::Commit(batch));
        self.phase = Phase::Committing(work);
    }

    /// The batch is durable: move the same units in memory, then answer.
    fn committed(&mut self, mut work: Work, outcome: BatchOutcome) {
        assert_eq!(
            outcome.inserted.len(),
            work.batch.holds.len(),
            "one insert verdict per hold"
        );
        let now_ms = work.now_ms;
        for id in &outcome.applied_grants {
            let grant = work
                .batch
                .grants
                .iter()
                .find(|g| &g.id == id)
                .expect("the store credits only grants of this batch");
            self.ledger.receive(grant.units);
        }
        for (hold, inserted) in work.batch.holds.iter().zip(&outcome.inserted) {
            if *inserted {
                let moved = self.ledger.hold(hold.qty.units());
                self.check(moved);
                self.expiry
                    .insert((hold.expires_at_ms, hold.request_key.clone()));
                self.holds
                    .insert(hold.request_key.clone(), hold.reservation(&self.sku));
            }
        }
        self.measure(now_ms);
        for ret in &work.batch.returns {
            let moved = self.ledger.return_units(ret.units);
            self.check(moved);
            // Those units are free in the pool now: not sold out everywhere.
            self.sold_out_everywhere = false;
        }
        for (key, qty, change) in &work.batch.transitions {
            let moved = change.apply_to_ledger(&mut self.ledger, *qty);
            self.check(moved);
            self.settle(key, *change);
            if matches!(change, Transition::Release | Transition::Expire) {
                self.freed_at_ms = Some(now_ms);
            }
        }

        for (a, result) in std::mem::take(&mut work.acts)
            .into_iter()
            .zip(std::mem::take(&mut work.act_results))
        {
            let reply = match result {
                None => ActReply::NotFound,
                Some((Ok(()), r)) => ActReply::Accepted(r),
                Some((Err(_), r)) => ActReply::Refused(r),
            };
            self.reply(a.ticket, Reply::Act(reply));
        }

        let mut existing = std::mem::take(&mut work.lookups);
        let holding = std::mem::take(&mut work.holding);
        for ((p, hold), inserted) in holding
            .into_iter()
            .zip(&work.batch.holds)
            .zip(&outcome.inserted)
        {
            if *inserted {
                let r = hold.reservation(&self.sku);
                self.reply(p.ticket, Reply::Reserve(ReserveReply::Held(r)));
            } else {
                existing.push(p);
            }
        }
        if existing.is_empty() {
            return self.settle_overflow(work);
        }
        let keys = existing
            .iter()
            .map(|p| p.request.request_key.clone())
            .collect();
        work.existing = existing;
        self.io = Some(Io::Read(keys));
        self.phase = Phase::ReadingExisting(work);
    }

    /// What did not fit: units freed by replays may still serve it next
    /// batch; otherwise it is sold out only if nothing is free anywhere,
    /// else paused.
    fn settle_overflow(&mut self, mut work: Work) {
        self.overflow.extend(std::mem::take(&mut work.later));
        let mut overflow = std::mem::take(&mut work.overflow);
        overflow.sort_by_key(|p| p.request.qty);
        for p in overflow {
            if p.request.qty.units() <= self.ledger.available {
                self.overflow.push_back(p);
            } else {
                match work.take {
                    TakeEnd::Exhausted => {
                        self.reply(p.ticket, Reply::Reserve(ReserveReply::SoldOut));
                    }
                    TakeEnd::Unreachable => {
                        let reply = ReserveReply::Paused(PauseReason::CoordinatorUnreachable);
                        self.reply(p.ticket, Reply::Reserve(reply));
                    }
                    TakeEnd::Moving | TakeEnd::NotAsked
                        if self.parked.len() < self.cfg.parked_max =>
                    {
                        self.parked.push_back(p);
                    }
                    // Never waited: the list of waiting requests is full.
                    TakeEnd::Moving | TakeEnd::NotAsked => {
                        self.reply(p.ticket, Reply::Reserve(ReserveReply::QueueFull));
                    }
                }
            }
        }
        // Parked requests keep their arrival order: the oldest is served first.
        self.parked.make_contiguous().sort_by_key(|p| p.ticket);
        self.phase = Phase::Idle;
    }

    /// Answers every command of a batch that was not committed PAUSED,
    /// for `reason`: nothing of theirs was written.
    fn refuse(&mut self, mut work: Work, reason: PauseReason) {
        for (ticket, _) in std::mem::take(&mut work.admins) {
            self.reply(ticket, Reply::Admin(AdminReply::Paused(reason)));
        }
        for a in std::mem::take(&mut work.acts) {
            self.reply(a.ticket, Reply::Act(ActReply::Paused(reason)));
        }
        let reserves = [
            std::mem::take(&mut work.fresh),
            std::mem::take(&mut work.holding),
            std::mem::take(&mut work.overflow),
            std::mem::take(&mut work.lookups),
            std::mem::take(&mut work.later),
            std::mem::take(&mut work.existing),
        ];
        for p in reserves.into_iter().flatten() {
            self.reply(p.ticket, Reply::Reserve(ReserveReply::Paused(reason)));
        }
        self.phase = Phase::Idle;
    }

    /// Stops the owner after a failed commit; the reason its buyers are told.
    fn commit_failed(&mut self, error: CommitError) -> PauseReason {
        match error {
            CommitError::Fenced => {
                self.fenced = true;
                PauseReason::Halted
            }
            CommitError::Failed => {
                self.needs_reload = true;
                PauseReason::Storage
            }
        }
    }

    fn apply_change(&mut self, change: StockChange) {
        let applied = match change {
            StockChange::Receive(units) => {
                self.ledger.receive(units);
                Ok(())
            }
            StockChange::Return(units) => self.ledger.return_units(units),
            StockChange::Settings(settings) => {
                self.settings = settings;
                Ok(())
            }
            StockChange::Pause(paused) => {
                self.paused = paused;
                Ok(())
            }
            StockChange::Mode(mode) => {
                self.mode = mode;
                Ok(())
            }
        };
        self.check(applied);
    }

    /// Records a ledger move that must succeed after a commit; a failure
    /// means memory and database disagree, so the SKU stops selling.
    fn check(&mut self, moved: Result<(), LedgerError>) {
        if moved.is_err() {
            self.drifted = true;
        }
    }

    fn reply(&mut self, ticket: Ticket, reply: Reply) {
        self.replies.push_back((ticket, reply));
    }

    fn next_transfer_id(&mut self, kind: &str) -> String {
        self.transfer_seq += 1;
        format!(
            "{kind}-{}-{}",
            self.cfg.transfer_id_prefix, self.transfer_seq
        )
    }
}

fn quantities(work: &Work) -> Vec<u64> {
    work.fresh.iter().map(|p| p.request.qty.units()).collect()
}

#[cfg(test)]
mod tests;
