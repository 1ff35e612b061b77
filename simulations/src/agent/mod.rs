//! The simulated region agent: escrow-core's [`SkuOwner`] driven under the
//! simulated clock, network and database, as `region-agent` drives it
//! under tokio, HTTP and PostgreSQL.
//!
//! Every decision is the owner's; this driver only carries out its I/O with
//! simulated costs: a commit takes `commit_us` and is applied to the
//! simulated database (escrow-core's [`Book`] plus the transfer tables) when
//! it ends; a read is answered from the database at once; a take travels the
//! simulated network and may time out. The gate in front of the queue is
//! escrow-core's [`gate`](fn@escrow_core::owner::gate), as in the agent's
//! HTTP handler. The sync loop reports every `sync_interval_ms` from the
//! database (a delta or a full report, as escrow-core's [`Reports`]
//! decides) and hands the answer's directive to the owner on its own slot,
//! which a full queue cannot refuse.
//!
//! What survives a crash is what the real agent keeps in its database: the
//! book, the ids of grants credited, grants not yet confirmed, returns not
//! yet applied, the mode, and the places borrowed and lent. Queues, the
//! owner's memory, the batch in progress, takes, syncs and borrows in
//! flight, and what the coordinator answered of the reports are lost.
//!
//! This file holds the agent's state, its timers, the loop that carries
//! out the owner's I/O, and crash and restart; what buyers ask and are
//! answered is in `buyers.rs`, what the agent asks of the world in
//! `effects.rs`, its calls to the coordinator in `link.rs`, and the places
//! it borrows and lends under a global per-user limit in `borrows.rs`.

mod borrows;
mod buyers;
mod carts;
mod effects;
mod link;

use std::collections::{HashSet, VecDeque};

use escrow_core::batch::{Batch, SkuRecord};
use escrow_core::owner::{
    ActReply, Command, Io, OwnerConfig, PauseReason, ReserveReply, SkuOwner, Ticket,
    SWEEP_INTERVAL_MS,
};
use escrow_core::protocol::{SkuDirective, TransferMsg};
use escrow_core::{
    Book, Mode, RegionName, Reports, RequestKey, Reservation, RoundTrip, Sku, SkuSettings, Tenant,
    TransferId,
};

use crate::database::Database;
use crate::network::{Envelope, Payload};
use crate::scenario::AgentConfig;
use borrows::Borrowing;
use buyers::{command_ticket, decode, reserve_ticket};
use link::SyncCall;

pub use buyers::{Answer, BuyerAction};
pub use carts::{cart_attempt, cart_ticket};
pub use effects::{Effect, Timer};

/// Milliseconds since the Unix epoch at simulated time zero: escrow-core
/// takes wall-clock milliseconds, the simulation counts microseconds from 0.
pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// escrow-core's `now_ms` at simulated time `t_us`.
pub fn now_ms(t_us: u64) -> u64 {
    EPOCH_MS + t_us / 1_000
}

/// The request key of buyer `b`: one key per buyer, reused on every retry.
pub fn request_key(b: u32) -> RequestKey {
    RequestKey::parse(&format!("b{b}")).expect("b<digits> is a valid request key")
}

/// Counters of the agent's work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Units that went back to available through expiry.
    pub expired_units: u64,
    /// Take calls sent.
    pub takes: u64,
    /// Sync calls sent.
    pub syncs: u64,
    /// Batches committed.
    pub commits: u64,
    /// Borrows the home lent.
    pub borrows_lent: u64,
    /// Borrows the home refused: the user held, had bought or had lent
    /// their place already.
    pub borrows_refused: u64,
    /// Borrows not answered within their buyer's queue wait.
    pub borrows_unanswered: u64,
}

/// One region's agent for the simulated SKU.
#[derive(Debug)]
pub struct Agent {
    /// Region index.
    pub index: usize,
    /// Region name.
    region: RegionName,
    /// What the agent keeps in its database (survives a crash).
    pub db: Database,
    /// Whether the process runs.
    pub up: bool,
    /// Incarnation, bumped on restart (the fencing epoch).
    pub epoch: u32,
    /// The last call to the coordinator failed (memory; down until the first sync succeeds).
    pub link_down: bool,
    /// Work done.
    pub stats: AgentStats,
    cfg: AgentConfig,
    tenant: Tenant,
    owner: SkuOwner,
    queue: VecDeque<Command>,
    control: Option<(SkuDirective, Vec<TransferMsg>)>,
    /// Tickets the owner has and has not answered.
    waiting: HashSet<Ticket>,
    committing: Option<Batch>,
    /// When a [`Timer::Wake`] is scheduled, ms since the epoch.
    wake_at_ms: Option<u64>,
    take_call: Option<u64>,
    /// The take in flight was bounded by buyers with less than
    /// [`TAKE_BUDGET_MIN_MS`](escrow_core::owner::TAKE_BUDGET_MIN_MS) left:
    /// its deadline is not the coordinator's fault.
    take_late_possible: bool,
    call_seq: u64,
    sync_call: Option<SyncCall>,
    /// What the coordinator answered of this incarnation's reports.
    reports: Reports,
    /// Which scheduled [`Timer::SyncTick`] is the live one.
    sync_gen: u64,
    /// A sync was asked for while one was in flight: the next starts at once.
    sync_again: bool,
    sync_seq: u64,
    /// The round trip its syncs report.
    round_trip: RoundTrip,
    /// Borrows and loans under a global per-user limit, in memory.
    borrowing: Borrowing,
}

impl Agent {
    /// A fresh agent with an empty book.
    pub fn new(
        index: usize,
        region: RegionName,
        tenant: &Tenant,
        sku: &Sku,
        settings: SkuSettings,
        mode: Mode,
        cfg: &AgentConfig,
    ) -> Self {
        let tenant = tenant.clone();
        let book = Book::new(sku.clone(), settings);
        let db = Database::new(tenant.clone(), book, mode);
        let owner = Self::start_owner(index, 1, db.record(), cfg, now_ms(0));
        Self {
            index,
            region,
            db,
            up: true,
            epoch: 1,
            link_down: true,
            stats: AgentStats::default(),
            cfg: cfg.clone(),
            tenant,
            owner,
            queue: VecDeque::new(),
            control: None,
            waiting: HashSet::new(),
            committing: None,
            wake_at_ms: None,
            take_call: None,
            take_late_possible: false,
            call_seq: 0,
            sync_call: None,
            reports: Reports::default(),
            sync_gen: 0,
            sync_again: false,
            sync_seq: 0,
            round_trip: RoundTrip::default(),
            borrowing: Borrowing::default(),
        }
    }

    /// An owner loaded from the database, as the agent starts one.
    fn start_owner(
        index: usize,
        epoch: u32,
        record: SkuRecord,
        cfg: &AgentConfig,
        now_ms: u64,
    ) -> SkuOwner {
        let owner_cfg = OwnerConfig {
            max_in_flight: cfg.max_in_flight,
            parked_max: cfg.max_waiting,
            coordinated: true,
            transfer_id_prefix: format!("{index}-{epoch}"),
        };
        SkuOwner::new(owner_cfg, record, now_ms)
    }

    /// The timers that start the agent's loops.
    pub fn start(&self, sync_at_us: u64, tick_at_us: u64, out: &mut Vec<Effect>) {
        out.push(self.timer(sync_at_us, Timer::SyncTick(self.sync_gen)));
        out.push(self.timer(tick_at_us, Timer::OwnerTick));
    }

    fn timer(&self, at_us: u64, timer: Timer) -> Effect {
        Effect::Timer {
            region: self.index,
            epoch: self.epoch,
            at_us,
            timer,
        }
    }

    fn send(&self, at_us: u64, call: u64, payload: Payload, out: &mut Vec<Effect>) {
        out.push(Effect::Send {
            at_us,
            envelope: Envelope {
                region: self.index,
                call,
                epoch: self.epoch,
                payload,
            },
        });
    }

    fn client_timeout_us(&self) -> u64 {
        self.cfg.client_timeout_ms * 1_000
    }

    /// Handles one of the agent's timers.
    pub fn on_timer(&mut self, now_us: u64, timer: Timer, out: &mut Vec<Effect>) {
        match timer {
            Timer::CommitDone => self.commit_done(now_us, out),
            Timer::OwnerTick => {
                out.push(self.timer(now_us + SWEEP_INTERVAL_MS * 1_000, Timer::OwnerTick));
                let now = now_ms(now_us);
                if self.owner.is_idle() && self.queue.is_empty() && now >= self.owner.poll_timeout()
                {
                    self.owner.handle_timeout(now);
                }
                self.pump(now_us, out);
            }
            Timer::Wake => {
                let now = now_ms(now_us);
                if self.wake_at_ms.is_some_and(|at| at <= now) {
                    self.wake_at_ms = None;
                }
                if self.owner.is_idle() && self.queue.is_empty() && now >= self.owner.poll_timeout()
                {
                    self.owner.handle_timeout(now);
                }
                self.pump(now_us, out);
            }
            Timer::SyncTick(gen) => {
                if gen == self.sync_gen {
                    self.on_sync_tick(now_us, out);
                }
            }
            Timer::SyncTimeout(call) => {
                if self.sync_call.as_ref().map(|c| c.call) == Some(call) {
                    self.sync_failed(now_us, out);
                }
            }
            Timer::TakeTimeout(call) => self.take_failed(now_us, call, true, out),
            Timer::TakeDeadline(call) => self.take_failed(now_us, call, false, out),
            Timer::BorrowWritten(n) => self.borrow_written(now_us, n, out),
            Timer::BorrowTimeout(n) => self.borrow_timed_out(now_us, n, out),
            Timer::LoansWritten => self.loans_written(now_us, out),
            Timer::LimitsTimeout(call) => self.limits_failed(now_us, call, out),
        }
    }

    /// Carries out the owner's I/O and starts batches while there is work.
    fn pump(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        loop {
            self.deliver(now_us, out);
            if self.owner.take_sync_due() {
                self.request_sync(now_us, out);
            }
            match self.owner.poll_io() {
                Some(Io::Read(keys)) => {
                    let rows: Vec<Reservation> = keys
                        .iter()
                        .filter_map(|k| self.db.book.get(k))
                        .cloned()
                        .collect();
                    self.owner.handle_read(Some(rows));
                }
                Some(Io::Take(request)) => return self.send_take(now_us, request, out),
                Some(Io::Commit(batch)) => {
                    let rows = (batch.holds.len() + batch.transitions.len()) as u64;
                    self.committing = Some(batch);
                    return out.push(Effect::Commit {
                        region: self.index,
                        epoch: self.epoch,
                        from_us: now_us,
                        cpu_us: rows * self.cfg.commit_row_us,
                        wait_us: self.cfg.commit_us,
                        done: Timer::CommitDone,
                    });
                }
                Some(Io::Reload) => {
                    let record = self.db.record();
                    self.owner.handle_reload(now_ms(now_us), Some(record));
                }
                None => {
                    if !self.owner.is_idle() {
                        return;
                    }
                    if let Some((directive, grants)) = self.control.take() {
                        self.owner.handle_directive(&directive, grants);
                    }
                    if self.queue.is_empty() && !self.owner.has_overflow() {
                        let now = now_ms(now_us);
                        if self.owner.poll_timeout() <= now {
                            self.owner.handle_timeout(now);
                            continue;
                        }
                        return self.schedule_wake(now_us, out);
                    }
                    let room = self.owner.batch_room();
                    let commands: Vec<Command> =
                        (0..room).map_while(|_| self.queue.pop_front()).collect();
                    for c in &commands {
                        self.waiting.insert(command_ticket(c));
                    }
                    self.owner.handle_commands(now_ms(now_us), commands);
                }
            }
        }
    }

    /// Wakes the owner when it wants, if that is before its next tick and
    /// no earlier wake is already set.
    fn schedule_wake(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        let at = self.owner.poll_timeout();
        let now = now_ms(now_us);
        if self.owner.parked() == 0 || at <= now || self.wake_at_ms.is_some_and(|w| w <= at) {
            return;
        }
        self.wake_at_ms = Some(at);
        let at_us = (at - EPOCH_MS) * 1_000;
        out.push(self.timer(at_us, Timer::Wake));
    }

    /// The batch is durable: apply it to the database, then tell the owner.
    fn commit_done(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        let batch = self
            .committing
            .take()
            .expect("a commit timer belongs to a commit");
        self.stats.commits += 1;
        let outcome = self.db.commit(&batch);
        self.stats.expired_units += batch.expired_units();
        self.owner.handle_commit_result(batch, Ok(outcome));
        self.pump(now_us, out);
    }

    /// The process dies: memory is lost; waiting buyers see a reset connection.
    pub fn crash(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.up = false;
        let mut lost: Vec<Ticket> = self.queue.drain(..).map(|c| command_ticket(&c)).collect();
        lost.extend(self.waiting.drain());
        lost.extend(self.buyers_borrowing().map(reserve_ticket));
        lost.sort_unstable();
        for t in lost {
            if carts::cart_attempt(t).is_some() {
                out.push(Effect::CartItem {
                    ticket: t,
                    at_us: now_us,
                    reply: ReserveReply::Paused(PauseReason::Halted),
                });
                continue;
            }
            let (buyer, action) = decode(t);
            out.push(match action {
                None => Effect::Answer {
                    buyer,
                    at_us: now_us,
                    answer: Answer::Unreachable,
                    borrowed: false,
                },
                Some(action) => Effect::Acted {
                    buyer,
                    at_us: now_us,
                    action,
                    reply: ActReply::Paused(PauseReason::Halted),
                },
            });
        }
        self.control = None;
        self.committing = None;
        self.wake_at_ms = None;
        self.take_call = None;
        self.sync_call = None;
        self.reports = Reports::default();
        self.sync_again = false;
        self.link_down = true;
        self.borrowing = Borrowing::default();
    }

    /// The process starts again from its database, as a new incarnation.
    /// No request of the one before waits for a borrow any more, and none
    /// can use one: every borrow still asked goes home.
    pub fn restart(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.up = true;
        self.epoch += 1;
        self.sync_seq = 0;
        self.db.give_back_unused();
        let record = self.db.record();
        self.owner = Self::start_owner(self.index, self.epoch, record, &self.cfg, now_ms(now_us));
        self.start(
            now_us + self.cfg.sync_interval_ms * 1_000,
            now_us + SWEEP_INTERVAL_MS * 1_000,
            out,
        );
    }

    /// Units this agent returned that the coordinator has not applied.
    pub fn returns_in_flight(&self, applied: &HashSet<TransferId>) -> u64 {
        self.db
            .returns
            .iter()
            .filter(|(id, _)| !applied.contains(*id))
            .map(|(_, u)| *u)
            .sum()
    }

    /// Units the batch being committed holds: decided for buyers, so no
    /// longer free, though the database still counts them available.
    pub fn units_being_held(&self) -> u64 {
        self.committing
            .as_ref()
            .map_or(0, |b| b.holds.iter().map(|h| h.qty.units()).sum())
    }

    /// Whether the agent holds no transfer state: nothing to ack, nothing
    /// returned unconfirmed, no borrow asked or to give back.
    pub fn transfers_settled(&self) -> bool {
        self.db.pending_acks.is_empty()
            && self.db.returns.is_empty()
            && self.db.borrow_asks().is_empty()
            && self.db.borrow_returns().is_empty()
    }
}
