//! The simulated region agent: escrow-core's [`Book`], [`plan_reserves`]
//! and [`RateMeter`] driven the way `region-agent` drives them.
//!
//! It mirrors the real agent's two loops. The SKU owner is the single
//! writer: it drains up to `batch_size_max` commands (reserve requests and
//! the coordinator's directives), plans holds first-fit, and when requests
//! do not fit it asks the coordinator for the missing units with one
//! synchronous take, waiting for the answer before it commits (so a take
//! costs every buyer in the batch a round trip, and the queue grows behind
//! it). The commit credits grants, inserts holds, debits returns (in central
//! mode every free unit; in escrow mode up to the directive's cumulative
//! `return_until`) and expires due holds, all at once; then the batch is
//! answered. The sync loop reports every `sync_interval_ms`, waits for the
//! answer (or the client timeout) and hands the directive to the owner.
//!
//! The HTTP handler's gate answers before the queue: PAUSED in central mode
//! while the coordinator is unreachable, SOLD_OUT when local stock is short
//! and the coordinator said nothing is free anywhere.
//!
//! What survives a crash is what the real agent keeps in its database: the
//! book, the ids of grants credited, grants not yet confirmed, returns not
//! yet applied, and the mode. Queues, the batch in progress, takes and syncs
//! in flight, directives not yet committed, the sold-out flag and the rate
//! meter are memory and are lost.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet, VecDeque};

use escrow_core::policy::units_to_return;
use escrow_core::protocol::{
    SkuDirective, SkuReport, SyncRequest, SyncResponse, TakeRequest, TakeResponse, TransferMsg,
};
use escrow_core::reservation::Verdict;
use escrow_core::{
    plan_reserves, Book, Deadline, Mode, Qty, RateMeter, RequestKey, Reservation, ReserveOutcome,
    ReservePlan, Sku, SkuSettings, TtlMs, UserId,
};

use crate::network::{Envelope, Payload};
use crate::scenario::AgentConfig;

/// Milliseconds since the Unix epoch at simulated time zero: escrow-core
/// takes wall-clock milliseconds, the simulation counts microseconds from 0.
pub const EPOCH_MS: u64 = 1_700_000_000_000;

/// How often an idle owner wakes to sweep and return (the agent's `SWEEP_INTERVAL_MS`).
pub const OWNER_TICK_MS: u64 = 250;

/// Half-life of the agent's sale-rate meter, as in `region-agent`.
pub const RATE_HALF_LIFE_MS: u64 = 2_000;

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

/// An agent timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The batch's commit finished.
    CommitDone,
    /// The idle owner wakes up.
    OwnerTick,
    /// Time to report.
    SyncTick,
    /// A sync call got no answer within the client timeout.
    SyncTimeout(u64),
    /// A take call got no answer within the client timeout.
    TakeTimeout(u64),
}

/// What an agent asks the world to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Answer a buyer.
    Answer {
        /// The buyer.
        buyer: u32,
        /// When the answer reaches them.
        at_us: u64,
        /// The answer.
        answer: Answer,
    },
    /// Send a message to the coordinator.
    Send {
        /// When it leaves.
        at_us: u64,
        /// The message.
        envelope: Envelope,
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

#[derive(Debug, Clone, Copy)]
struct Request {
    buyer: u32,
    qty: u64,
    deadline: Deadline,
}

#[derive(Debug)]
enum Command {
    Reserve(Request),
    Sync(SkuDirective, Vec<TransferMsg>),
}

/// How a take ended, as in the agent's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TakeEnd {
    /// Nothing is free anywhere: what did not fit is sold out.
    Exhausted,
    /// Units may exist elsewhere, or the coordinator could not be asked: pause.
    Unsure,
}

/// The batch being worked on.
#[derive(Debug)]
struct Batch {
    reserves: Vec<Request>,
    plan: ReservePlan,
    take: TakeEnd,
    take_call: Option<u64>,
    take_grant: Option<TransferMsg>,
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
    /// Directives dropped because the owner's queue was full.
    pub directives_dropped: u64,
}

/// One region's agent for the simulated SKU.
#[derive(Debug)]
pub struct Agent {
    /// Region index.
    pub index: usize,
    /// Reservations and counters: the agent's database.
    pub book: Book,
    /// Whether the process runs.
    pub up: bool,
    /// Incarnation, bumped on restart (the fencing epoch).
    pub epoch: u32,
    /// Mode (kept in the database).
    pub mode: Mode,
    /// The coordinator said nothing is free anywhere (memory).
    pub sold_out: bool,
    /// The last call to the coordinator failed (memory; down until the first sync succeeds).
    pub link_down: bool,
    /// Ids of grants credited: a duplicate grant is recognised and ignored.
    pub applied_grants: HashSet<String>,
    /// Grants credited and not yet confirmed by the coordinator.
    pub pending_acks: Vec<String>,
    /// Returns debited and not yet confirmed applied, by id.
    pub returns: BTreeMap<String, u64>,
    /// Work done.
    pub stats: AgentStats,
    cfg: AgentConfig,
    tenant: String,
    sku: String,
    rate: RateMeter,
    queue: VecDeque<Command>,
    overflow: VecDeque<Request>,
    batch: Option<Batch>,
    return_until: Option<u64>,
    /// Since when this region has had free units (as the agent's owner).
    free_since_ms: Option<u64>,
    pending_grants: Vec<TransferMsg>,
    next_sweep_ms: u64,
    call_seq: u64,
    sync_call: Option<(u64, u64)>,
    sync_seq: u64,
    last_rtt_ms: u64,
    return_seq: u64,
    expiries: BinaryHeap<Reverse<u64>>,
    max_per_user: u32,
    hold_ttl: TtlMs,
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
        Self {
            index,
            book: Book::new(
                Sku::parse(sku).expect("the simulated SKU name is valid"),
                settings,
            ),
            up: true,
            epoch: 1,
            mode,
            sold_out: false,
            link_down: true,
            applied_grants: HashSet::new(),
            pending_acks: Vec::new(),
            returns: BTreeMap::new(),
            stats: AgentStats::default(),
            cfg: cfg.clone(),
            tenant: tenant.to_owned(),
            sku: sku.to_owned(),
            rate: RateMeter::new(now_ms(0), RATE_HALF_LIFE_MS),
            queue: VecDeque::new(),
            overflow: VecDeque::new(),
            batch: None,
            return_until: None,
            free_since_ms: None,
            pending_grants: Vec::new(),
            next_sweep_ms: 0,
            call_seq: 0,
            sync_call: None,
            sync_seq: 0,
            last_rtt_ms: 0,
            return_seq: 0,
            expiries: BinaryHeap::new(),
            max_per_user: settings.max_per_user,
            hold_ttl: settings.hold_ttl,
        }
    }

    /// The timers that start the agent's loops.
    pub fn start(&self, sync_at_us: u64, tick_at_us: u64, out: &mut Vec<Effect>) {
        out.push(self.timer(sync_at_us, Timer::SyncTick));
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

    fn answer(out: &mut Vec<Effect>, buyer: u32, at_us: u64, answer: Answer) {
        out.push(Effect::Answer {
            buyer,
            at_us,
            answer,
        });
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
        if self.book.paused || (self.mode == Mode::Central && self.link_down) {
            return Self::answer(out, buyer, gate_us, Answer::Paused);
        }
        if self.book.ledger.available < qty && self.sold_out {
            return Self::answer(out, buyer, gate_us, Answer::SoldOut);
        }
        if self.queue.len() >= self.cfg.max_waiting {
            return Self::answer(out, buyer, gate_us, Answer::QueueFull);
        }
        self.queue.push_back(Command::Reserve(Request {
            buyer,
            qty,
            deadline: Deadline::after(now_ms(now_us), self.cfg.wait_timeout_ms),
        }));
        self.start_batch(now_us, out);
    }

    /// Handles one of the agent's timers.
    pub fn on_timer(&mut self, now_us: u64, timer: Timer, out: &mut Vec<Effect>) {
        match timer {
            Timer::CommitDone => self.commit(now_us, out),
            Timer::OwnerTick => {
                out.push(self.timer(now_us + OWNER_TICK_MS * 1_000, Timer::OwnerTick));
                if self.batch.is_none() {
                    self.start_batch(now_us, out);
                }
            }
            Timer::SyncTick => self.on_sync_tick(now_us, out),
            Timer::SyncTimeout(call) => {
                if self.sync_call.map(|c| c.0) == Some(call) {
                    self.sync_failed(now_us, out);
                }
            }
            Timer::TakeTimeout(call) => self.take_failed(now_us, call, out),
        }
    }

    /// Starts a batch if the owner is idle: drains commands, follows
    /// directives, plans holds, and asks the coordinator for what is missing.
    fn start_batch(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if self.batch.is_some() {
            return;
        }
        let now = now_ms(now_us);
        let mut reserves: Vec<Request> = self.overflow.drain(..).collect();
        let room = self
            .cfg
            .batch_size_max
            .saturating_sub(reserves.len())
            .max(1);
        for _ in 0..room {
            match self.queue.pop_front() {
                Some(Command::Reserve(r)) => reserves.push(r),
                Some(Command::Sync(d, grants)) => self.follow(&d, grants),
                None => break,
            }
        }
        reserves.retain(|r| {
            if r.deadline.passed(now) {
                Self::answer(out, r.buyer, now_us, Answer::WaitTimeout);
                false
            } else {
                true
            }
        });
        if self.book.paused {
            for r in reserves.drain(..) {
                Self::answer(out, r.buyer, now_us, Answer::Paused);
            }
        }
        let quantities: Vec<u64> = reserves.iter().map(|r| r.qty).collect();
        let plan = plan_reserves(self.book.ledger.available, &quantities);
        let mut batch = Batch {
            reserves,
            plan,
            take: TakeEnd::Exhausted,
            take_call: None,
            take_grant: None,
        };
        if !batch.plan.overflow.is_empty() {
            if self.sold_out {
                batch.take = TakeEnd::Exhausted;
            } else {
                let need: u64 = batch.plan.overflow.iter().map(|&i| quantities[i]).sum();
                self.call_seq += 1;
                let call = self.call_seq;
                let req = TakeRequest {
                    id: format!("t-{}-{}-{}", self.index, self.epoch, call),
                    tenant: self.tenant.clone(),
                    sku: self.sku.clone(),
                    units: need,
                };
                self.stats.takes += 1;
                self.send(now_us, call, Payload::Take(req), out);
                out.push(self.timer(now_us + self.client_timeout_us(), Timer::TakeTimeout(call)));
                batch.take_call = Some(call);
                self.batch = Some(batch);
                return;
            }
        }
        self.batch = Some(batch);
        self.begin_commit(now_us, out);
    }

    /// Takes in a directive: pause, mode, how much to give back, sold out
    /// everywhere; grants wait for this batch's commit.
    fn follow(&mut self, d: &SkuDirective, grants: Vec<TransferMsg>) {
        self.book.paused = d.paused;
        self.mode = d.mode;
        self.return_until = Some(d.return_until);
        self.sold_out = d.sold_out;
        for g in grants {
            if !self.pending_grants.iter().any(|p| p.id == g.id) {
                self.pending_grants.push(g);
            }
        }
    }

    /// The coordinator answered a take (a late answer finds no take waiting: dropped).
    pub fn on_take_reply(
        &mut self,
        now_us: u64,
        call: u64,
        resp: &TakeResponse,
        out: &mut Vec<Effect>,
    ) {
        let Some(batch) = self.batch.as_mut() else {
            return;
        };
        if batch.take_call != Some(call) {
            return;
        }
        batch.take_call = None;
        self.link_down = false;
        let granted = resp.grant.as_ref().map_or(0, |g| g.units);
        batch.take_grant = resp.grant.clone();
        if resp.exhausted {
            self.sold_out = true;
            batch.take = TakeEnd::Exhausted;
        } else {
            batch.take = TakeEnd::Unsure;
        }
        if granted > 0 {
            let quantities: Vec<u64> = batch.reserves.iter().map(|r| r.qty).collect();
            batch.plan = plan_reserves(self.book.ledger.available + granted, &quantities);
        }
        self.begin_commit(now_us, out);
    }

    fn take_failed(&mut self, now_us: u64, call: u64, out: &mut Vec<Effect>) {
        let Some(batch) = self.batch.as_mut() else {
            return;
        };
        if batch.take_call != Some(call) {
            return;
        }
        batch.take_call = None;
        batch.take = TakeEnd::Unsure;
        self.link_down = true;
        self.begin_commit(now_us, out);
    }

    /// The coordinator refused a call at once (connection refused).
    pub fn on_refused(&mut self, now_us: u64, call: u64, out: &mut Vec<Effect>) {
        if self.sync_call.map(|c| c.0) == Some(call) {
            self.sync_failed(now_us, out);
        } else {
            self.take_failed(now_us, call, out);
        }
    }

    /// Whether the batch writes anything (an empty batch commits instantly).
    fn batch_writes(&self, batch: &Batch, now: u64) -> bool {
        !batch.plan.try_hold.is_empty()
            || batch.take_grant.is_some()
            || !self.pending_grants.is_empty()
            || (self.book.ledger.held > 0
                && now >= self.next_sweep_ms
                && now_ms_due(&self.expiries, now))
            || self.returns_wanted(self.book.ledger.available, !batch.reserves.is_empty(), now) > 0
    }

    fn begin_commit(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        let now = now_ms(now_us);
        let writes = self
            .batch
            .as_ref()
            .is_some_and(|b| self.batch_writes(b, now));
        if writes {
            out.push(self.timer(now_us + self.cfg.commit_us, Timer::CommitDone));
        } else {
            self.commit(now_us, out);
        }
    }

    /// Units the directive or the mode asks back, given `free` units
    /// (escrow-core's rule, the same the agent applies).
    fn returns_wanted(&self, free: u64, local_demand: bool, now_ms: u64) -> u64 {
        let free_for_ms = self
            .free_since_ms
            .map_or(0, |since| now_ms.saturating_sub(since));
        units_to_return(
            self.mode,
            free,
            self.return_until,
            self.book.ledger.returned,
            local_demand,
            free_for_ms,
        )
    }

    /// The batch is durable: credit grants, hold, return, expire; then answer.
    fn commit(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        let Some(batch) = self.batch.take() else {
            return;
        };
        let now = now_ms(now_us);
        self.stats.commits += 1;
        let grants: Vec<TransferMsg> = std::mem::take(&mut self.pending_grants)
            .into_iter()
            .chain(batch.take_grant.clone())
            .collect();
        for g in &grants {
            if self.applied_grants.insert(g.id.clone()) {
                self.book.ledger.receive(g.units);
                self.pending_acks.push(g.id.clone());
            }
        }
        let mut overflow: Vec<Request> = batch
            .plan
            .overflow
            .iter()
            .map(|&i| batch.reserves[i])
            .collect();
        let mut held_units = 0;
        for &i in &batch.plan.try_hold {
            let r = batch.reserves[i];
            let qty = Qty::parse(r.qty as i64, self.max_per_user)
                .expect("buyers ask for 1..=max_per_user units");
            match self
                .book
                .reserve(request_key(r.buyer), user_id(r.buyer), qty, None, now)
            {
                ReserveOutcome::Held(res) => {
                    held_units += r.qty;
                    self.expiries.push(Reverse(res.expires_at_ms));
                    Self::answer(out, r.buyer, now_us, Answer::Held);
                }
                ReserveOutcome::SoldOut => overflow.push(r),
                ReserveOutcome::Replay(_) => Self::answer(out, r.buyer, now_us, Answer::Replay),
                ReserveOutcome::UserLimit => Self::answer(out, r.buyer, now_us, Answer::UserLimit),
                ReserveOutcome::KeyReused => Self::answer(out, r.buyer, now_us, Answer::KeyReused),
                ReserveOutcome::Paused => Self::answer(out, r.buyer, now_us, Answer::Paused),
            }
        }
        self.rate.record(now, held_units);
        let back = self.returns_wanted(self.book.ledger.available, !batch.reserves.is_empty(), now);
        if back > 0 {
            self.give_back(back);
        }
        if self.book.ledger.held > 0 && now >= self.next_sweep_ms {
            self.next_sweep_ms = now + OWNER_TICK_MS;
            if now_ms_due(&self.expiries, now) {
                while self.expiries.peek().is_some_and(|Reverse(at)| *at <= now) {
                    self.expiries.pop();
                }
                self.stats.expired_units += self.book.expire_due(now);
            }
        }
        if self.book.ledger.held == 0 {
            self.expiries.clear();
        }
        // As the agent: note since when this region has had free units.
        self.free_since_ms = match (self.book.ledger.available, self.free_since_ms) {
            (0, _) => None,
            (_, Some(since)) => Some(since),
            (_, None) => Some(now),
        };

        // Units freed by replays may serve the overflow next batch; otherwise
        // it is sold out only on the coordinator's word.
        overflow.sort_by_key(|r| r.qty);
        for r in overflow {
            if r.qty <= self.book.ledger.available {
                self.overflow.push_back(r);
            } else if batch.take == TakeEnd::Exhausted {
                Self::answer(out, r.buyer, now_us, Answer::SoldOut);
            } else {
                Self::answer(out, r.buyer, now_us, Answer::Paused);
            }
        }
        if !self.queue.is_empty() || !self.overflow.is_empty() {
            self.start_batch(now_us, out);
        }
    }

    fn give_back(&mut self, units: u64) {
        self.book
            .ledger
            .give_back(units)
            .expect("a return never exceeds available");
        self.return_seq += 1;
        let id = format!("r-{}-{}-{}", self.index, self.epoch, self.return_seq);
        self.returns.insert(id, units);
    }

    fn on_sync_tick(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.call_seq += 1;
        self.sync_seq += 1;
        let call = self.call_seq;
        let l = self.book.ledger;
        let req = SyncRequest {
            epoch: i64::from(self.epoch),
            seq: self.sync_seq,
            rtt_ms: self.last_rtt_ms,
            skus: vec![SkuReport {
                tenant: self.tenant.clone(),
                sku: self.sku.clone(),
                available: l.available,
                held: l.held,
                sold: l.sold,
                sale_rate_per_s: self.rate.rate_per_s(now_ms(now_us)),
            }],
            acks: self.pending_acks.clone(),
            returns: self
                .returns
                .iter()
                .map(|(id, units)| TransferMsg {
                    id: id.clone(),
                    tenant: self.tenant.clone(),
                    sku: self.sku.clone(),
                    units: *units,
                })
                .collect(),
        };
        self.stats.syncs += 1;
        self.sync_call = Some((call, now_us));
        self.send(now_us, call, Payload::Sync(req), out);
        out.push(self.timer(now_us + self.client_timeout_us(), Timer::SyncTimeout(call)));
    }

    fn sync_failed(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.sync_call = None;
        self.link_down = true;
        out.push(self.timer(now_us + self.cfg.sync_interval_ms * 1_000, Timer::SyncTick));
    }

    /// The coordinator answered a sync (an answer to another call is dropped).
    pub fn on_sync_reply(
        &mut self,
        now_us: u64,
        call: u64,
        resp: &SyncResponse,
        out: &mut Vec<Effect>,
    ) {
        let Some((current, sent_us)) = self.sync_call else {
            return;
        };
        if current != call {
            return;
        }
        self.sync_call = None;
        self.last_rtt_ms = (now_us - sent_us) / 1_000;
        self.link_down = false;
        if let Some(d) = resp.skus.first() {
            // A full queue drops the directive; the next sync repeats it.
            if self.queue.len() < self.cfg.max_waiting {
                self.queue
                    .push_back(Command::Sync(d.clone(), resp.grants.clone()));
            } else {
                self.stats.directives_dropped += 1;
            }
        }
        self.pending_acks.retain(|id| !resp.confirmed.contains(id));
        for id in &resp.applied_returns {
            self.returns.remove(id);
        }
        out.push(self.timer(now_us + self.cfg.sync_interval_ms * 1_000, Timer::SyncTick));
        self.start_batch(now_us, out);
    }

    /// Confirms buyer `b`'s hold; the owner's next batch commits what follows from it.
    pub fn confirm(
        &mut self,
        now_us: u64,
        b: u32,
        out: &mut Vec<Effect>,
    ) -> Option<(Verdict, Reservation)> {
        let res = self.book.confirm(&request_key(b), now_ms(now_us));
        self.start_batch(now_us, out);
        res
    }

    /// Releases buyer `b`'s hold; in central mode the same batch returns the units.
    pub fn release(
        &mut self,
        now_us: u64,
        b: u32,
        out: &mut Vec<Effect>,
    ) -> Option<(Verdict, Reservation)> {
        let res = self.book.release(&request_key(b), now_ms(now_us));
        self.start_batch(now_us, out);
        res
    }

    /// Extends buyer `b`'s hold by the SKU's hold time.
    pub fn extend(&mut self, now_us: u64, b: u32) -> Option<(Verdict, Reservation)> {
        let res = self
            .book
            .extend(&request_key(b), self.hold_ttl, now_ms(now_us));
        if let Some((v, r)) = &res {
            if v.result.is_ok() {
                self.expiries.push(Reverse(r.expires_at_ms));
            }
        }
        res
    }

    /// The process dies: memory is lost; waiting buyers see a reset connection.
    pub fn crash(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.up = false;
        let mut lost: Vec<u32> = Vec::new();
        for c in self.queue.drain(..) {
            if let Command::Reserve(r) = c {
                lost.push(r.buyer);
            }
        }
        lost.extend(self.overflow.drain(..).map(|r| r.buyer));
        if let Some(b) = self.batch.take() {
            lost.extend(b.reserves.iter().map(|r| r.buyer));
        }
        for buyer in lost {
            Self::answer(out, buyer, now_us, Answer::Unreachable);
        }
        self.pending_grants.clear();
        self.return_until = None;
        self.sync_call = None;
        self.sold_out = false;
        self.link_down = true;
    }

    /// The process starts again from its database, as a new incarnation.
    pub fn restart(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.up = true;
        self.epoch += 1;
        self.sync_seq = 0;
        self.rate = RateMeter::new(now_ms(now_us), RATE_HALF_LIFE_MS);
        self.expiries = self
            .book
            .reservations()
            .filter(|r| r.status == escrow_core::Status::Held)
            .map(|r| Reverse(r.expires_at_ms))
            .collect();
        self.start(
            now_us + self.cfg.sync_interval_ms * 1_000,
            now_us + OWNER_TICK_MS * 1_000,
            out,
        );
    }

    /// Units this agent returned that the coordinator has not applied.
    pub fn returns_in_flight(&self, applied: &HashSet<String>) -> u64 {
        self.returns
            .iter()
            .filter(|(id, _)| !applied.contains(*id))
            .map(|(_, u)| *u)
            .sum()
    }

    /// Whether the agent holds no transfer state: nothing to ack, nothing returned unconfirmed.
    pub fn transfers_settled(&self) -> bool {
        self.pending_acks.is_empty() && self.returns.is_empty() && self.pending_grants.is_empty()
    }
}

/// Whether the earliest known expiry is due at `now`.
fn now_ms_due(expiries: &BinaryHeap<Reverse<u64>>, now: u64) -> bool {
    expiries.peek().is_some_and(|Reverse(at)| *at <= now)
}
