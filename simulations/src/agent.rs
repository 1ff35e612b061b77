//! The simulated region agent: escrow-core's [`SkuOwner`] driven under the
//! simulated clock, network and database, as `region-agent` drives it
//! under tokio, HTTP and PostgreSQL.
//!
//! Every decision is the owner's; this driver only carries out its I/O with
//! simulated costs: a commit takes `commit_us` and is applied to the
//! simulated database (escrow-core's [`Book`] plus the transfer tables) when
//! it ends; a read is answered from the database at once; a take travels the
//! simulated network and may time out. The gate in front of the queue is
//! escrow-core's [`gate`], as in the agent's HTTP handler. The sync loop
//! reports every `sync_interval_ms` from the database (a delta or a full
//! report, as escrow-core's [`Reports`] decides) and hands the answer's
//! directive to the owner on its own slot, which a full queue cannot refuse.
//!
//! What survives a crash is what the real agent keeps in its database: the
//! book, the ids of grants credited, grants not yet confirmed, returns not
//! yet applied, and the mode. Queues, the owner's memory, the batch in
//! progress, takes and syncs in flight, and what the coordinator answered of
//! the reports are lost.

use std::collections::{HashSet, VecDeque};

use escrow_core::batch::{Batch, SkuRecord};
use escrow_core::owner::{
    gate, ActReply, Action, Command, Io, OwnerConfig, PauseReason, Reply, ReserveReply,
    ReserveRequest, SkuOwner, Ticket, SWEEP_INTERVAL_MS, TAKE_BUDGET_MIN_MS,
};
use escrow_core::protocol::{
    merge_transfers, SkuDirective, SkuReport, SyncRequest, SyncResponse, TakeRequest, TakeResponse,
    TransferMsg, WatchResponse,
};
use escrow_core::{
    Book, Deadline, Mode, Qty, Reports, RequestKey, Reservation, Sku, SkuSettings, Tenant, UserId,
};

use crate::database::Database;
use crate::network::{Envelope, Payload};
use crate::scenario::AgentConfig;

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

/// The user id of buyer `b`.
pub fn user_id(b: u32) -> UserId {
    UserId::parse(&format!("u{b}")).expect("u<digits> is a valid user id")
}

/// The answer a buyer gets to a reserve request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    /// 201 HELD.
    Held,
    /// 200 REPLAY.
    Replay,
    /// 409 SOLD_OUT.
    SoldOut,
    /// 503 PAUSED: the units' owner could not be asked, or had none to give yet.
    Paused,
    /// 503 REJECTED_QUEUE_FULL.
    QueueFull,
    /// 503 REJECTED_WAIT_TIMEOUT.
    WaitTimeout,
    /// 409 USER_LIMIT.
    UserLimit,
    /// 422 KEY_REUSED.
    KeyReused,
    /// The agent is down: connection refused.
    Unreachable,
}

impl Answer {
    fn of(reply: &ReserveReply) -> Self {
        match reply {
            ReserveReply::Held(_) => Answer::Held,
            ReserveReply::Replay(_) => Answer::Replay,
            ReserveReply::SoldOut => Answer::SoldOut,
            ReserveReply::UserLimit => Answer::UserLimit,
            ReserveReply::KeyReused => Answer::KeyReused,
            ReserveReply::Paused(_) => Answer::Paused,
            ReserveReply::QueueFull => Answer::QueueFull,
            ReserveReply::WaitTimeout => Answer::WaitTimeout,
        }
    }
}

/// A buyer's action on the reservation it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuyerAction {
    /// Pay: HELD -> SOLD.
    Confirm,
    /// Give the units up.
    Release,
    /// Keep the hold longer, once.
    Extend,
}

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
    /// Send a message to the coordinator.
    Send {
        /// When it leaves.
        at_us: u64,
        /// The message.
        envelope: Envelope,
    },
    /// A commit: `cpu_us` of work on the agent's CPU (shared by every agent
    /// when the scenario puts them on one machine), then `wait_us` for the
    /// flush; then [`Timer::CommitDone`].
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
}

/// Tickets name the buyer and what they asked: two low bits for the kind.
fn ticket(buyer: u32, kind: u64) -> Ticket {
    (u64::from(buyer) << 2) | kind
}

const KIND_RESERVE: u64 = 0;

fn action_kind(action: BuyerAction) -> u64 {
    match action {
        BuyerAction::Confirm => 1,
        BuyerAction::Release => 2,
        BuyerAction::Extend => 3,
    }
}

fn decode(t: Ticket) -> (u32, Option<BuyerAction>) {
    let buyer = u32::try_from(t >> 2).expect("tickets are made from u32 buyers");
    let action = match t & 3 {
        1 => Some(BuyerAction::Confirm),
        2 => Some(BuyerAction::Release),
        3 => Some(BuyerAction::Extend),
        _ => None,
    };
    (buyer, action)
}

/// The sync in flight: its call, when it left, and what it carried, for
/// [`Reports::answered`] when its answer comes.
#[derive(Debug)]
struct SyncCall {
    call: u64,
    sent_us: u64,
    req: SyncRequest,
}

/// One region's agent for the simulated SKU.
#[derive(Debug)]
pub struct Agent {
    /// Region index.
    pub index: usize,
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
    /// [`TAKE_BUDGET_MIN_MS`] left: its deadline is not the coordinator's fault.
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
    last_rtt_ms: u64,
}

impl Agent {
    /// A fresh agent with an empty book.
    pub fn new(
        index: usize,
        tenant: &str,
        sku: &str,
        settings: SkuSettings,
        mode: Mode,
        cfg: &AgentConfig,
    ) -> Self {
        let tenant = Tenant::parse(tenant).expect("the simulated tenant name is valid");
        let book = Book::new(
            Sku::parse(sku).expect("the simulated SKU name is valid"),
            settings,
        );
        let db = Database::new(tenant.clone(), book, mode);
        let owner = Self::start_owner(index, 1, db.record(), cfg, now_ms(0));
        Self {
            index,
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
            last_rtt_ms: 0,
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

    /// A buyer asks for `qty` units: the HTTP handler's gate, then the owner's queue.
    pub fn reserve(&mut self, now_us: u64, buyer: u32, qty: u64, out: &mut Vec<Effect>) {
        assert!(self.up, "a down agent takes no requests");
        let gate_us = now_us + self.cfg.gate_us;
        if let Some(reply) = gate(&self.owner.gate_view(self.link_down), qty) {
            return out.push(Effect::Answer {
                buyer,
                at_us: gate_us,
                answer: Answer::of(&reply),
            });
        }
        if self.queue.len() >= self.cfg.max_waiting {
            return out.push(Effect::Answer {
                buyer,
                at_us: gate_us,
                answer: Answer::QueueFull,
            });
        }
        let max_per_user = self.owner.settings().max_per_user;
        let request = ReserveRequest {
            request_key: request_key(buyer),
            user_id: user_id(buyer),
            qty: Qty::parse(qty as i64, max_per_user).expect("buyers ask for 1..=max_per_user"),
            ttl: None,
        };
        self.queue.push_back(Command::Reserve {
            ticket: ticket(buyer, KIND_RESERVE),
            request,
            deadline: Deadline::after(now_ms(now_us), self.cfg.wait_timeout_ms),
            known: false,
        });
        self.pump(now_us, out);
    }

    /// A buyer acts on its reservation; the answer comes as [`Effect::Acted`].
    pub fn act(&mut self, now_us: u64, buyer: u32, action: BuyerAction, out: &mut Vec<Effect>) {
        assert!(self.up, "a down agent takes no requests");
        if self.queue.len() >= self.cfg.max_waiting {
            return out.push(Effect::Acted {
                buyer,
                at_us: now_us + self.cfg.gate_us,
                action,
                reply: ActReply::WaitTimeout,
            });
        }
        let owner_action = match action {
            BuyerAction::Confirm => Action::Confirm,
            BuyerAction::Release => Action::Release,
            BuyerAction::Extend => Action::Extend(None),
        };
        self.queue.push_back(Command::Act {
            ticket: ticket(buyer, action_kind(action)),
            key: request_key(buyer),
            action: owner_action,
            deadline: Deadline::after(now_ms(now_us), self.cfg.wait_timeout_ms),
        });
        self.pump(now_us, out);
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
                    });
                }
                Some(Io::Reload) => {
                    let record = self.db.record();
                    self.owner.handle_reload(Some(record));
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

    /// Hands the owner's answers to the world.
    fn deliver(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        while let Some((t, reply)) = self.owner.poll_reply() {
            self.waiting.remove(&t);
            let (buyer, action) = decode(t);
            match (reply, action) {
                (Reply::Reserve(reply), None) => out.push(Effect::Answer {
                    buyer,
                    at_us: now_us,
                    answer: Answer::of(&reply),
                }),
                (Reply::Act(reply), Some(action)) => out.push(Effect::Acted {
                    buyer,
                    at_us: now_us,
                    action,
                    reply,
                }),
                (reply, _) => unreachable!("no admin in the simulation: {reply:?}"),
            }
        }
    }

    fn send_take(&mut self, now_us: u64, request: TakeRequest, out: &mut Vec<Effect>) {
        self.call_seq += 1;
        let call = self.call_seq;
        self.stats.takes += 1;
        self.take_call = Some(call);
        self.send(now_us, call, Payload::Take(request), out);
        let timeout_us = now_us + self.client_timeout_us();
        // As the agent does: no buyer waits past its deadline for a take.
        let deadline_us = self
            .owner
            .take_deadline_ms()
            .map_or(u64::MAX, |at| at.saturating_mul(1_000));
        let timer = if deadline_us < timeout_us {
            let budget_us = deadline_us.saturating_sub(now_us);
            self.take_late_possible = budget_us < TAKE_BUDGET_MIN_MS * 1_000;
            self.timer(deadline_us.max(now_us), Timer::TakeDeadline(call))
        } else {
            self.timer(timeout_us, Timer::TakeTimeout(call))
        };
        out.push(timer);
    }

    /// The coordinator answered a take (a late answer finds no take waiting: dropped).
    pub fn on_take_reply(
        &mut self,
        now_us: u64,
        call: u64,
        resp: &TakeResponse,
        out: &mut Vec<Effect>,
    ) {
        if self.take_call != Some(call) {
            return;
        }
        self.take_call = None;
        self.link_down = false;
        self.owner.handle_take_answer(Some(resp.clone()));
        self.pump(now_us, out);
    }

    /// A take got no answer: the coordinator is unreachable (`link_down`),
    /// or merely slower than the buyers' deadline.
    fn take_failed(&mut self, now_us: u64, call: u64, link_down: bool, out: &mut Vec<Effect>) {
        if self.take_call != Some(call) {
            return;
        }
        self.take_call = None;
        self.link_down |= link_down;
        if !link_down && self.take_late_possible {
            self.owner.handle_take_late();
        } else {
            self.owner.handle_take_answer(None);
        }
        self.pump(now_us, out);
    }

    /// The coordinator refused a call at once (connection refused).
    pub fn on_refused(&mut self, now_us: u64, call: u64, out: &mut Vec<Effect>) {
        if self.sync_call.as_ref().map(|c| c.call) == Some(call) {
            self.sync_failed(now_us, out);
        } else {
            self.take_failed(now_us, call, true, out);
        }
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

    fn on_sync_tick(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.call_seq += 1;
        self.sync_seq += 1;
        let call = self.call_seq;
        let l = self.db.book.ledger;
        let all = vec![SkuReport {
            tenant: self.tenant.to_string(),
            sku: self.db.book.sku.to_string(),
            available: l.available,
            held: l.held,
            sold: l.sold,
            sale_rate_per_s: self.owner.sale_rate_per_s(),
        }];
        let returns: Vec<TransferMsg> = self
            .db
            .returns
            .iter()
            .map(|(id, units)| TransferMsg {
                id: id.clone(),
                tenant: self.tenant.to_string(),
                sku: self.db.book.sku.to_string(),
                units: *units,
            })
            .collect();
        let (skus, full) = self.reports.to_send(all, &returns);
        let req = SyncRequest {
            epoch: i64::from(self.epoch),
            seq: self.sync_seq,
            rtt_ms: self.last_rtt_ms,
            skus,
            acks: self.db.pending_acks.clone(),
            returns,
            full,
        };
        self.stats.syncs += 1;
        self.sync_call = Some(SyncCall {
            call,
            sent_us: now_us,
            req: req.clone(),
        });
        self.send(now_us, call, Payload::Sync(req), out);
        out.push(self.timer(now_us + self.client_timeout_us(), Timer::SyncTimeout(call)));
    }

    fn sync_failed(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.sync_call = None;
        self.reports.failed();
        self.link_down = true;
        self.schedule_sync(now_us, out);
    }

    /// The next sync: at once if one was asked for meanwhile, else after the interval.
    fn schedule_sync(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.sync_gen += 1;
        if std::mem::take(&mut self.sync_again) {
            return self.on_sync_tick(now_us, out);
        }
        let at = now_us + self.cfg.sync_interval_ms * 1_000;
        out.push(self.timer(at, Timer::SyncTick(self.sync_gen)));
    }

    /// Syncs at once (as the agent's sync loop does when asked): units
    /// were returned or received, buyers wait for units, or the
    /// coordinator's notice came. One already in flight: the next follows it.
    pub fn request_sync(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if !self.up {
            return;
        }
        if self.sync_call.is_some() {
            self.sync_again = true;
            return;
        }
        self.sync_gen += 1;
        self.on_sync_tick(now_us, out);
    }

    /// The coordinator's watch answer came with news: its directive and
    /// grants go to the owner as a sync's would, and a sync follows at once.
    pub fn on_notice(&mut self, now_us: u64, news: &WatchResponse, out: &mut Vec<Effect>) {
        if let Some(d) = news.skus.first() {
            self.follow(d, &news.grants);
        }
        self.request_sync(now_us, out);
        self.pump(now_us, out);
    }

    /// Keeps the coordinator's latest directive for the owner's next idle
    /// moment, with every grant not yet handed over (a watch's and a
    /// sync's answers can both arrive between two batches).
    fn follow(&mut self, d: &SkuDirective, grants: &[TransferMsg]) {
        let mut kept = self.control.take().map(|(_, g)| g).unwrap_or_default();
        merge_transfers(&mut kept, grants.iter().cloned());
        self.control = Some((d.clone(), kept));
    }

    /// The coordinator answered a sync (an answer to another call is dropped).
    pub fn on_sync_reply(
        &mut self,
        now_us: u64,
        call: u64,
        resp: &SyncResponse,
        out: &mut Vec<Effect>,
    ) {
        let Some(sent) = self.sync_call.take_if(|c| c.call == call) else {
            return;
        };
        self.reports.answered(&sent.req);
        self.last_rtt_ms = (now_us - sent.sent_us) / 1_000;
        self.link_down = false;
        if let Some(d) = resp.skus.first() {
            self.follow(d, &resp.grants);
        }
        self.db
            .pending_acks
            .retain(|id| !resp.confirmed.contains(id));
        for id in &resp.applied_returns {
            self.db.returns.remove(id);
        }
        self.schedule_sync(now_us, out);
        self.pump(now_us, out);
    }

    /// The process dies: memory is lost; waiting buyers see a reset connection.
    pub fn crash(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.up = false;
        let mut lost: Vec<Ticket> = self.queue.drain(..).map(|c| command_ticket(&c)).collect();
        lost.extend(self.waiting.drain());
        lost.sort_unstable();
        for t in lost {
            let (buyer, action) = decode(t);
            out.push(match action {
                None => Effect::Answer {
                    buyer,
                    at_us: now_us,
                    answer: Answer::Unreachable,
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
    }

    /// The process starts again from its database, as a new incarnation.
    pub fn restart(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.up = true;
        self.epoch += 1;
        self.sync_seq = 0;
        let record = self.db.record();
        self.owner = Self::start_owner(self.index, self.epoch, record, &self.cfg, now_ms(now_us));
        self.start(
            now_us + self.cfg.sync_interval_ms * 1_000,
            now_us + SWEEP_INTERVAL_MS * 1_000,
            out,
        );
    }

    /// Units this agent returned that the coordinator has not applied.
    pub fn returns_in_flight(&self, applied: &HashSet<String>) -> u64 {
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

    /// Whether the agent holds no transfer state: nothing to ack, nothing returned unconfirmed.
    pub fn transfers_settled(&self) -> bool {
        self.db.pending_acks.is_empty() && self.db.returns.is_empty()
    }
}

fn command_ticket(c: &Command) -> Ticket {
    match c {
        Command::Reserve { ticket, .. }
        | Command::Act { ticket, .. }
        | Command::Admin { ticket, .. } => *ticket,
    }
}
