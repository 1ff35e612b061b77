//! The world: agents, coordinator, network and buyers under one simulated clock.
//!
//! A run is a loop over the event queue: pop the earliest event, let the
//! agent, coordinator or buyer it concerns act (through escrow-core), turn
//! what they ask for into new events, then check the invariants. Nothing
//! reads a real clock or an unseeded random number, so a run is a pure
//! function of its scenario, policy and seed.
//!
//! Safety is checked after every event, from ground truth rather than from
//! anyone's report: the agents' books, the coordinator's pool ledger, and
//! the transfers that were debited by their sender but not yet applied by
//! their receiver (the units "in the messages"):
//! `pool + in_transit + sum(available + held + sold) = total`, per region
//! `leased + in_transit = quota + unapplied grants + unapplied returns`, the
//! contract's audit over the coordinator's view is 0, and nothing is held or
//! sold beyond the total.

use escrow_core::owner::{ActReply, SWEEP_INTERVAL_MS};
use escrow_core::{SkuSettings, Status};
use indicatif::ProgressBar;

use crate::agent::{Agent, Answer, BuyerAction, Effect, Timer};
use crate::coordinator::{Coordinator, SkuIdentity};
use crate::demand::{choices, AfterHold, Buyer, Demand, HUMAN};
use crate::metrics::{Metrics, Recorder};
use crate::network::{Envelope, Network, Payload};
use crate::policies;
use crate::queue::EventQueue;
use crate::rng::{streams, Rng};
use crate::scenario::{FaultConfig, FaultKind, Scenario};

/// Times a confirm or release is retried while the agent is down.
const ACTION_TRIES_MAX: u8 = 10;
/// First sample after sale start, ms; later samples are spaced by [`SAMPLE_FACTOR`].
const SAMPLE_FIRST_MS: f64 = 10.0;
/// Ratio between consecutive sample times (log-spaced samples).
const SAMPLE_FACTOR: f64 = 1.04;
/// Events between progress bar updates.
const PROGRESS_EVERY: u64 = 1 << 16;

/// A broken safety property: the run stops and names its seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Seed that reproduces it.
    pub seed: u64,
    /// Simulated time, ms after sale start.
    pub at_ms: i64,
    /// What broke.
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {}: at {} ms: {}", self.seed, self.at_ms, self.what)
    }
}

#[derive(Debug)]
enum Event {
    Arrival(usize),
    Attempt(u32),
    Confirm(u32),
    Release(u32),
    Extend(u32),
    Agent {
        region: usize,
        epoch: u32,
        timer: Timer,
    },
    Deliver(Box<Envelope>),
    Fault {
        index: usize,
        start: bool,
    },
    Sample,
}

#[derive(Debug, Clone)]
struct FaultState {
    cfg: FaultConfig,
    region: Option<usize>,
    active: bool,
    done: bool,
}

/// Ground truth of where the units are, computed after every event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Coordinator pool.
    pub pool: u64,
    /// Debited by the sender, not yet applied by the receiver.
    pub in_transit: u64,
    /// Available in regions.
    pub available: u64,
    /// Held in regions.
    pub held: u64,
    /// Sold in regions.
    pub sold: u64,
}

impl Census {
    /// Units nobody holds or bought: pool, in transit, available.
    pub fn free(&self) -> u64 {
        self.pool + self.in_transit + self.available
    }
}

/// One simulation run in progress.
pub struct World {
    scenario: Scenario,
    seed: u64,
    now_us: u64,
    sale_start_us: u64,
    queue: EventQueue<Event>,
    /// The region agents.
    pub agents: Vec<Agent>,
    /// The coordinator.
    pub coordinator: Coordinator,
    network: Network,
    demand: Demand,
    buyers: Vec<Buyer>,
    rec: Recorder,
    faults: Vec<FaultState>,
    agent_down: Vec<u32>,
    sold_triggers: bool,
    effects: Vec<Effect>,
    arrived: u64,
    pending_buyers: u64,
    sold_to_buyers: u64,
    buyers_served: u64,
    turned_away: (u64, u64),
    turned_away_while_free: u64,
    /// Arrival of the earliest buyer turned away so far, µs.
    first_turned_away_arrival_us: Option<u64>,
    order_inversions: u64,
    released_holds: u64,
    confirms_refused: u64,
    sell_out_us: Option<u64>,
    last_hold_us: Option<u64>,
    oversold: u64,
    census: Census,
    events: u64,
    next_sample_ms: f64,
}

impl World {
    /// A world ready to run `scenario` under `policy` with `seed`.
    pub fn new(scenario: &Scenario, policy: &str, seed: u64) -> Result<Self, String> {
        let s = scenario;
        let policy_box = policies::build(policy, &s.policies, s.agent.sync_interval_ms)
            .ok_or_else(|| {
                format!(
                    "unknown policy {policy:?} (one of {})",
                    policies::POLICY_NAMES.join(", ")
                )
            })?;
        let settings = SkuSettings::parse(
            Some(i64::from(s.sku.max_per_user)),
            Some(s.sku.hold_ttl_ms as i64),
        )
        .map_err(|e| e.to_string())?;
        let coordinator = Coordinator::new(
            s.sku.total,
            s.regions.iter().map(|r| r.weight).collect(),
            policy_box,
            s.coordinator.service_us,
            SkuIdentity {
                tenant: "sim".into(),
                sku: "sku".into(),
                max_per_user: s.sku.max_per_user,
                hold_ttl_ms: s.sku.hold_ttl_ms,
            },
        );
        let agents: Vec<Agent> = (0..s.regions.len())
            .map(|i| Agent::new(i, "sim", "sku", settings, coordinator.mode(), &s.agent))
            .collect();
        let sale_start_us = s.run.warmup_ms * 1_000;
        let faults = s
            .faults
            .iter()
            .map(|f| FaultState {
                cfg: f.clone(),
                region: f.region.as_deref().and_then(|r| s.region_index(r)),
                active: false,
                done: false,
            })
            .collect::<Vec<_>>();
        let mut w = World {
            seed,
            now_us: 0,
            sale_start_us,
            queue: EventQueue::default(),
            agents,
            coordinator,
            network: Network::new(s, Rng::stream(seed, streams::NETWORK, 0)),
            demand: Demand::new(s, seed, sale_start_us),
            buyers: Vec::new(),
            rec: Recorder::new(s.regions.iter().map(|r| r.name.clone()).collect()),
            sold_triggers: faults.iter().any(|f| f.cfg.start_sold.is_some()),
            faults,
            agent_down: vec![0; s.regions.len()],
            effects: Vec::new(),
            arrived: 0,
            pending_buyers: 0,
            sold_to_buyers: 0,
            buyers_served: 0,
            turned_away: (0, 0),
            turned_away_while_free: 0,
            first_turned_away_arrival_us: None,
            order_inversions: 0,
            released_holds: 0,
            confirms_refused: 0,
            sell_out_us: None,
            last_hold_us: None,
            oversold: 0,
            census: Census::default(),
            events: 0,
            next_sample_ms: SAMPLE_FIRST_MS,
            scenario: s.clone(),
        };
        if s.demand.buyers > 0 {
            w.buyers.reserve(w.demand.total as usize);
        }
        let mut phase = Rng::stream(seed, streams::PHASE, 0);
        let sync_us = s.agent.sync_interval_ms * 1_000;
        let tick_us = SWEEP_INTERVAL_MS * 1_000;
        for a in &w.agents {
            a.start(phase.below(sync_us), phase.below(tick_us), &mut w.effects);
        }
        w.apply_effects();
        for r in 0..s.regions.len() {
            if let Some(t) = w.demand.peek(r) {
                w.queue.push(t, Event::Arrival(r));
            }
        }
        for (index, f) in s.faults.iter().enumerate() {
            if let Some(start_s) = f.start_s {
                w.queue.push(
                    sale_start_us + (start_s * 1e6) as u64,
                    Event::Fault { index, start: true },
                );
            }
        }
        w.queue.push(
            sale_start_us + (SAMPLE_FIRST_MS * 1_000.0) as u64,
            Event::Sample,
        );
        w.check().map_err(|v| v.to_string())?;
        Ok(w)
    }

    /// Simulated time, µs since the world began (the sale starts after the warm-up).
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// When the sale starts, µs.
    pub fn sale_start_us(&self) -> u64 {
        self.sale_start_us
    }

    /// Where the units are, as of the last event.
    pub fn census(&self) -> Census {
        self.census
    }

    fn ms_after_start(&self, t_us: u64) -> f64 {
        (t_us as f64 - self.sale_start_us as f64) / 1_000.0
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            seed: self.seed,
            at_ms: self.ms_after_start(self.now_us) as i64,
            what,
        }
    }

    /// Whether the sale is over: every buyer arrived and is done, and no unit is held.
    pub fn quiet(&self) -> bool {
        self.arrived == self.demand.total && self.pending_buyers == 0 && self.census.held == 0
    }

    /// Whether everything converged: quiet, every agent up, no transfer
    /// unacknowledged or unconfirmed, every latest report equal to its
    /// agent's counters, leases equal to quotas, and the audit at 0.
    pub fn converged(&self) -> bool {
        self.quiet()
            && self.census.in_transit == 0
            && self.coordinator.drift() == 0
            && self.agents.iter().enumerate().all(|(r, a)| {
                let l = a.db.book.ledger;
                let q = &self.coordinator.allocation().regions[r];
                let v = q.report;
                a.up && a.transfers_settled()
                    && q.grants.is_empty()
                    && q.leased == l.quota()
                    && (v.available, v.held, v.sold) == (l.available, l.held, l.sold)
            })
    }

    /// Runs events until `stop` holds or the next event is past `deadline_us`.
    /// Returns whether `stop` held. Safety is checked after every event.
    pub fn run_until(
        &mut self,
        mut stop: impl FnMut(&World) -> bool,
        deadline_us: u64,
        progress: Option<&ProgressBar>,
    ) -> Result<bool, Violation> {
        loop {
            if stop(self) {
                return Ok(true);
            }
            match self.queue.peek_time() {
                Some(t) if t <= deadline_us => {}
                _ => return Ok(false),
            }
            self.step();
            self.check()?;
            self.after_event();
            if let Some(p) = progress {
                if self.events % PROGRESS_EVERY == 0 {
                    p.set_position(self.arrived);
                }
            }
        }
    }

    fn step(&mut self) {
        let Some((t, event)) = self.queue.pop() else {
            return;
        };
        assert!(t >= self.now_us, "time never runs backwards");
        self.now_us = t;
        self.events += 1;
        match event {
            Event::Arrival(r) => self.on_arrival(r),
            Event::Attempt(b) => self.attempt(b),
            Event::Confirm(b) => self.on_confirm(b),
            Event::Release(b) => self.on_release(b),
            Event::Extend(b) => {
                let r = self.buyers[b as usize].region as usize;
                if self.agents[r].up {
                    self.agents[r].act(t, b, BuyerAction::Extend, &mut self.effects);
                    self.apply_effects();
                }
            }
            Event::Agent {
                region,
                epoch,
                timer,
            } => {
                let a = &mut self.agents[region];
                if a.up && a.epoch == epoch {
                    a.on_timer(t, timer, &mut self.effects);
                    self.apply_effects();
                }
            }
            Event::Deliver(env) => self.deliver(*env),
            Event::Fault { index, start } => self.fault(index, start),
            Event::Sample => self.sample(),
        }
    }

    fn apply_effects(&mut self) {
        let mut effects = std::mem::take(&mut self.effects);
        for e in effects.drain(..) {
            match e {
                Effect::Answer {
                    buyer,
                    at_us,
                    answer,
                } => self.on_answer(buyer, at_us, answer),
                // Answers reach buyers when given: the world's time is theirs.
                Effect::Acted {
                    buyer,
                    action,
                    reply,
                    ..
                } => self.on_acted(buyer, action, reply),
                Effect::Send { at_us, envelope } => self.send(at_us, envelope),
                Effect::Timer {
                    region,
                    epoch,
                    at_us,
                    timer,
                } => self.queue.push(
                    at_us,
                    Event::Agent {
                        region,
                        epoch,
                        timer,
                    },
                ),
            }
        }
        debug_assert!(
            self.effects.is_empty(),
            "answers never act on agents at once"
        );
        self.effects = effects;
    }

    fn send(&mut self, at_us: u64, env: Envelope) {
        let deliveries = self.network.deliveries(env.region);
        match deliveries {
            [Some(a), Some(b)] => {
                self.queue
                    .push(at_us + a, Event::Deliver(Box::new(env.clone())));
                self.queue.push(at_us + b, Event::Deliver(Box::new(env)));
            }
            [Some(a), None] | [None, Some(a)] => {
                self.queue.push(at_us + a, Event::Deliver(Box::new(env)));
            }
            [None, None] => {}
        }
    }

    fn deliver(&mut self, env: Envelope) {
        let r = env.region;
        if !self.network.link_up(r) {
            self.network.drop_on_arrival();
            return;
        }
        let now = self.now_us;
        if env.payload.to_coordinator() {
            let reply = if self.network.coordinator_down > 0 {
                Some(Payload::Refused)
            } else {
                match &env.payload {
                    // A fenced (older-epoch) request gets an error only the dead incarnation would read.
                    Payload::Sync(req) => self
                        .coordinator
                        .on_sync(now, r, req)
                        .map(Payload::SyncReply),
                    Payload::Take(req) => {
                        Some(Payload::TakeReply(self.coordinator.on_take(now, r, req)))
                    }
                    _ => None,
                }
            };
            // Regions with news get their held-open watch call answered.
            for region in self.coordinator.take_notices() {
                let at = self.coordinator.reply_at(now);
                let epoch = self.agents[region].epoch;
                self.send(
                    at,
                    Envelope {
                        region,
                        call: 0,
                        epoch,
                        payload: Payload::Notice,
                    },
                );
            }
            if let Some(payload) = reply {
                let at = if matches!(payload, Payload::Refused) {
                    now
                } else {
                    self.coordinator.reply_at(now)
                };
                self.send(
                    at,
                    Envelope {
                        region: r,
                        call: env.call,
                        epoch: env.epoch,
                        payload,
                    },
                );
            }
            return;
        }
        let a = &mut self.agents[r];
        if !a.up || a.epoch != env.epoch {
            return;
        }
        match &env.payload {
            Payload::SyncReply(resp) => a.on_sync_reply(now, env.call, resp, &mut self.effects),
            Payload::TakeReply(resp) => a.on_take_reply(now, env.call, resp, &mut self.effects),
            Payload::Refused => a.on_refused(now, env.call, &mut self.effects),
            Payload::Notice => a.request_sync(now, &mut self.effects),
            Payload::Sync(_) | Payload::Take(_) => {}
        }
        self.apply_effects();
    }

    fn on_arrival(&mut self, r: usize) {
        let Some(a) = self.demand.next(r) else {
            return;
        };
        debug_assert_eq!(a.at_us, self.now_us);
        let index = u32::try_from(self.buyers.len()).expect("validated: buyers fit in u32");
        let qty = if self.scenario.sku.max_per_user > 1 {
            self.choices(index).qty
        } else {
            1
        };
        self.buyers.push(Buyer {
            arrived_us: self.now_us,
            started_us: self.now_us,
            region: u8::try_from(r).expect("validated: at most 32 regions"),
            burst: a.burst,
            qty,
            attempts: 0,
            action_tries: 0,
        });
        self.arrived += 1;
        self.pending_buyers += 1;
        self.rec.arrival(r);
        self.attempt(index);
        if let Some(t) = self.demand.peek(r) {
            self.queue.push(t, Event::Arrival(r));
        }
    }

    fn choices(&self, b: u32) -> crate::demand::Choices {
        choices(
            self.seed,
            b,
            &self.scenario.buyers,
            self.scenario.sku.max_per_user,
            self.scenario.demand.multi_unit_share,
        )
    }

    fn attempt(&mut self, b: u32) {
        let buyer = &mut self.buyers[b as usize];
        buyer.attempts = buyer.attempts.saturating_add(1);
        buyer.started_us = self.now_us;
        let r = buyer.region as usize;
        let qty = u64::from(buyer.qty);
        self.rec.attempt(r);
        if self.agents[r].up {
            self.agents[r].reserve(self.now_us, b, qty, &mut self.effects);
            self.apply_effects();
        } else {
            self.on_answer(b, self.now_us, Answer::Unreachable);
        }
    }

    /// Ground truth: units free anywhere right now.
    fn free_units(&self) -> u64 {
        let mut free = self.coordinator.allocation().pool;
        for (r, a) in self.agents.iter().enumerate() {
            free += a.db.book.ledger.available
                + self.grants_in_flight(r)
                + a.returns_in_flight(&self.coordinator.applied_returns[r]);
        }
        free
    }

    fn grants_in_flight(&self, r: usize) -> u64 {
        let applied = &self.agents[r].db.applied_grants;
        self.coordinator.allocation().regions[r]
            .grants
            .iter()
            .filter(|(id, _)| !applied.contains(*id))
            .map(|(_, u)| *u)
            .sum()
    }

    fn on_answer(&mut self, b: u32, at_us: u64, answer: Answer) {
        let buyer = self.buyers[b as usize];
        let r = buyer.region as usize;
        self.rec
            .answer(r, answer, at_us.saturating_sub(buyer.started_us));
        match answer {
            Answer::Held => {
                self.buyers_served += 1;
                if self
                    .first_turned_away_arrival_us
                    .is_some_and(|first| buyer.arrived_us > first)
                {
                    self.order_inversions += 1;
                }
                self.last_hold_us = Some(self.last_hold_us.unwrap_or(0).max(at_us));
                self.after_hold(b, at_us);
            }
            // A buyer never resends a key while a request is in flight, so a
            // replay means the book lost track of a request: count the buyer done.
            Answer::Replay | Answer::UserLimit | Answer::KeyReused => self.done(b, false),
            Answer::SoldOut => {
                if self.free_units() > 0 {
                    self.rec.false_sold_out(r);
                }
                self.retry_or_give_up(b, at_us, true);
            }
            Answer::Paused | Answer::QueueFull | Answer::WaitTimeout | Answer::Unreachable => {
                self.retry_or_give_up(b, at_us, false)
            }
        }
    }

    fn retry_or_give_up(&mut self, b: u32, at_us: u64, sold_out: bool) {
        let buyer = self.buyers[b as usize];
        let (retries, delay_ms) = if buyer.burst != HUMAN {
            let burst = &self.scenario.demand.bots[buyer.burst as usize];
            (burst.retries, burst.retry_ms)
        } else if sold_out {
            (0, 0)
        } else {
            (
                self.scenario.buyers.retries,
                self.scenario.buyers.retry_after_ms,
            )
        };
        if u32::from(buyer.attempts) <= retries {
            self.queue
                .push(at_us + delay_ms.max(1) * 1_000, Event::Attempt(b));
        } else {
            self.done(b, true);
        }
    }

    fn done(&mut self, b: u32, turned_away: bool) {
        self.pending_buyers -= 1;
        if turned_away {
            if self.free_units() > 0 {
                self.turned_away_while_free += 1;
            }
            let arrived = self.buyers[b as usize].arrived_us;
            self.first_turned_away_arrival_us = Some(
                self.first_turned_away_arrival_us
                    .map_or(arrived, |first| first.min(arrived)),
            );
            self.turned_away.0 += 1;
            self.turned_away.1 += u64::from(self.buyers[b as usize].qty);
        }
    }

    fn after_hold(&mut self, b: u32, at_us: u64) {
        match self.choices(b).after_hold {
            AfterHold::Abandon => self.done(b, false),
            AfterHold::Release { after_us } => self.queue.push(at_us + after_us, Event::Release(b)),
            AfterHold::Confirm {
                after_us,
                extend_after_us,
            } => {
                self.queue.push(at_us + after_us, Event::Confirm(b));
                if let Some(e) = extend_after_us {
                    self.queue.push(at_us + e, Event::Extend(b));
                }
            }
        }
    }

    /// The agent is down: try the action again later, a bounded number of times.
    fn retry_action(&mut self, b: u32, event: Event) {
        let buyer = &mut self.buyers[b as usize];
        buyer.action_tries += 1;
        if buyer.action_tries < ACTION_TRIES_MAX {
            let at = self.now_us + self.scenario.buyers.retry_after_ms.max(1) * 1_000;
            self.queue.push(at, event);
        } else {
            self.done(b, false);
        }
    }

    fn on_confirm(&mut self, b: u32) {
        self.request_action(b, BuyerAction::Confirm);
    }

    fn on_release(&mut self, b: u32) {
        self.request_action(b, BuyerAction::Release);
    }

    fn request_action(&mut self, b: u32, action: BuyerAction) {
        let r = self.buyers[b as usize].region as usize;
        if !self.agents[r].up {
            // A missed extend only shortens the hold; a buyer tries it once.
            if action != BuyerAction::Extend {
                self.retry_action(b, action_event(b, action));
            }
            return;
        }
        self.agents[r].act(self.now_us, b, action, &mut self.effects);
        self.apply_effects();
    }

    /// An action's answer: count what it did; retry what was refused unserved.
    fn on_acted(&mut self, b: u32, action: BuyerAction, reply: ActReply) {
        let qty = u64::from(self.buyers[b as usize].qty);
        match (action, reply) {
            // An extend only keeps the hold; its answer changes nothing for the buyer.
            (BuyerAction::Extend, _) => {}
            (_, ActReply::Paused | ActReply::WaitTimeout) => {
                self.retry_action(b, action_event(b, action));
            }
            (BuyerAction::Confirm, ActReply::Accepted(r)) => {
                debug_assert_eq!(r.status, Status::Sold);
                self.sold_to_buyers += qty;
                self.done(b, false);
            }
            (BuyerAction::Release, ActReply::Accepted(r)) => {
                if r.status == Status::Released {
                    self.released_holds += 1;
                }
                self.done(b, false);
            }
            (BuyerAction::Confirm, ActReply::Refused(_)) => {
                self.confirms_refused += 1;
                self.done(b, false);
            }
            (_, ActReply::Refused(_) | ActReply::NotFound) => self.done(b, false),
        }
    }

    fn fault(&mut self, index: usize, start: bool) {
        let f = &mut self.faults[index];
        if start {
            if f.active || f.done {
                return;
            }
            f.active = true;
            let end = self.now_us + (f.cfg.duration_s * 1e6) as u64;
            let (kind, region) = (f.cfg.kind, f.region);
            self.queue.push(
                end,
                Event::Fault {
                    index,
                    start: false,
                },
            );
            match (kind, region) {
                (FaultKind::Partition, Some(r)) => self.network.partitions[r] += 1,
                (FaultKind::CoordinatorDown, _) => self.network.coordinator_down += 1,
                (FaultKind::AgentCrash, Some(r)) => {
                    self.agent_down[r] += 1;
                    if self.agent_down[r] == 1 {
                        self.agents[r].crash(self.now_us, &mut self.effects);
                        self.apply_effects();
                    }
                }
                _ => {}
            }
        } else {
            if !f.active {
                return;
            }
            f.active = false;
            f.done = true;
            let (kind, region) = (f.cfg.kind, f.region);
            match (kind, region) {
                (FaultKind::Partition, Some(r)) => {
                    self.network.partitions[r] = self.network.partitions[r].saturating_sub(1)
                }
                (FaultKind::CoordinatorDown, _) => {
                    self.network.coordinator_down = self.network.coordinator_down.saturating_sub(1)
                }
                (FaultKind::AgentCrash, Some(r)) => {
                    self.agent_down[r] -= 1;
                    if self.agent_down[r] == 0 {
                        self.agents[r].restart(self.now_us, &mut self.effects);
                        self.apply_effects();
                    }
                }
                _ => {}
            }
        }
    }

    /// Ends every fault and switches message faults off: the liveness phase.
    pub fn heal(&mut self) {
        for i in 0..self.faults.len() {
            if self.faults[i].active {
                self.fault(i, false);
            }
            self.faults[i].done = true;
        }
        self.sold_triggers = false;
        self.network.heal();
        self.census = self.compute_census();
    }

    fn after_event(&mut self) {
        if self.sold_triggers && self.scenario.sku.total > 0 {
            let taken =
                (self.census.held + self.census.sold) as f64 / self.scenario.sku.total as f64;
            for i in 0..self.faults.len() {
                let f = &self.faults[i];
                if !f.active && !f.done && f.cfg.start_sold.is_some_and(|s| taken >= s) {
                    self.fault(i, true);
                } else if f.active && f.cfg.end_sold.is_some_and(|s| taken >= s) {
                    self.fault(i, false);
                }
            }
            self.sold_triggers = self.faults.iter().any(|f| !f.done);
        }
        if self.sell_out_us.is_none()
            && self.now_us >= self.sale_start_us
            && self.census.free() == 0
        {
            self.sell_out_us = Some(self.now_us);
        }
    }

    fn sample(&mut self) {
        let c = self.census;
        let t_ms = self.ms_after_start(self.now_us);
        let s = &mut self.rec.series;
        s.t_ms.push(t_ms);
        for (r, a) in self.agents.iter().enumerate() {
            s.available[r].push(a.db.book.ledger.available);
        }
        s.pool.push(c.pool);
        s.in_transit.push(c.in_transit);
        s.taken.push(c.held + c.sold);
        s.false_sold_outs.push(self.rec.false_sold_outs);
        self.next_sample_ms *= SAMPLE_FACTOR;
        let at = self.sale_start_us + (self.next_sample_ms * 1_000.0) as u64;
        self.queue.push(at.max(self.now_us + 1), Event::Sample);
    }

    fn compute_census(&self) -> Census {
        let mut c = Census {
            pool: self.coordinator.allocation().pool,
            ..Census::default()
        };
        for (r, a) in self.agents.iter().enumerate() {
            let l = a.db.book.ledger;
            c.in_transit += self.grants_in_flight(r)
                + a.returns_in_flight(&self.coordinator.applied_returns[r]);
            c.available += l.available;
            c.held += l.held;
            c.sold += l.sold;
        }
        c
    }

    /// Checks every safety property; on failure names the seed.
    fn check(&mut self) -> Result<(), Violation> {
        let total = self.coordinator.allocation().total;
        if !self.coordinator.allocation().is_balanced() {
            return Err(self.violation(format!(
                "pool ledger unbalanced: {:?}",
                self.coordinator.allocation()
            )));
        }
        for (r, a) in self.agents.iter().enumerate() {
            let l = a.db.book.ledger;
            if !l.is_balanced() {
                return Err(self.violation(format!("region {r} ledger unbalanced: {l:?}")));
            }
            let grants = self.grants_in_flight(r);
            let returns = a.returns_in_flight(&self.coordinator.applied_returns[r]);
            let q = &self.coordinator.allocation().regions[r];
            if q.leased + q.in_transit() != l.quota() + grants + returns {
                return Err(self.violation(format!(
                    "region {r}: coordinator has leased {} + in transit {}, agent has quota {} \
                     + grants in flight {grants} + returns in flight {returns}",
                    q.leased,
                    q.in_transit(),
                    l.quota()
                )));
            }
        }
        let c = self.compute_census();
        if c.pool + c.in_transit + c.available + c.held + c.sold != total {
            return Err(self.violation(format!(
                "units created or destroyed: pool {} + in transit {} + available {} + held {} + sold {} != total {total}",
                c.pool, c.in_transit, c.available, c.held, c.sold
            )));
        }
        let drift = self.coordinator.drift();
        if drift != 0 {
            return Err(self.violation(format!(
                "audit over the coordinator's view drifts by {drift}"
            )));
        }
        let over = (c.held + c.sold)
            .saturating_sub(total)
            .max(self.sold_to_buyers.saturating_sub(total));
        if over > 0 {
            self.oversold = self.oversold.max(over);
            return Err(self.violation(format!("oversold by {over} units")));
        }
        if self.sold_to_buyers > c.sold {
            return Err(self.violation(format!(
                "buyers confirmed {} units but books record {} sold",
                self.sold_to_buyers, c.sold
            )));
        }
        self.census = c;
        Ok(())
    }

    /// Checks, at the end, that every book's counters match its reservations.
    pub fn check_books(&self) -> Result<(), Violation> {
        use escrow_core::Status;
        for (r, a) in self.agents.iter().enumerate() {
            let (mut held, mut sold) = (0, 0);
            for res in a.db.book.reservations() {
                match res.status {
                    Status::Held => held += res.qty.units(),
                    Status::Sold => sold += res.qty.units(),
                    Status::Released | Status::Expired => {}
                }
            }
            let l = a.db.book.ledger;
            if (held, sold) != (l.held, l.sold) {
                return Err(self.violation(format!(
                    "region {r}: reservations hold {held} and sold {sold}, ledger says {} and {}",
                    l.held, l.sold
                )));
            }
        }
        Ok(())
    }

    /// The run's results.
    pub fn finish(mut self, end_us: u64) -> Metrics {
        self.now_us = self.now_us.max(end_us);
        self.census = self.compute_census();
        self.sample();
        let c = self.census;
        let (attempts, _holds, sold_outs, paused, rejected) = self.rec.totals();
        let (held_latency, answer_latency) = self.rec.overall_latency();
        let stats = self.agents.iter().fold((0, 0, 0), |t, a| {
            (
                t.0 + a.stats.syncs,
                t.1 + a.stats.takes,
                t.2 + a.stats.expired_units,
            )
        });
        let sold = c.sold;
        let per_sale = |n: u64| {
            if sold == 0 {
                0.0
            } else {
                n as f64 / sold as f64
            }
        };
        let to_ms = |t: Option<u64>| t.map(|t| self.ms_after_start(t));
        Metrics {
            scenario: self.scenario.name.clone(),
            policy: self.coordinator.policy_name().to_owned(),
            seed: self.seed,
            total_units: self.coordinator.allocation().total,
            buyers: self.arrived,
            attempts,
            sold_units: sold,
            held_units_at_end: c.held,
            oversold_units: self.oversold,
            false_sold_outs: self.rec.false_sold_outs,
            sold_out_answers: sold_outs,
            paused_answers: paused,
            rejected_answers: rejected,
            buyers_served: self.buyers_served,
            buyers_turned_away: self.turned_away.0,
            turned_away_while_free: self.turned_away_while_free,
            order_inversions: self.order_inversions,
            units_turned_away: self.turned_away.1,
            stranded_units: (self.coordinator.allocation().total - sold).min(self.turned_away.1),
            sell_out_ms: to_ms(self.sell_out_us),
            last_hold_ms: to_ms(self.last_hold_us),
            central_at_ms: to_ms(self.coordinator.central_since_us),
            expired_units: stats.2,
            released_holds: self.released_holds,
            confirms_refused: self.confirms_refused,
            sync_requests: stats.0,
            take_requests: stats.1,
            coordinator_messages: self.network.stats.sent,
            messages_lost: self.network.stats.lost,
            messages_duplicated: self.network.stats.duplicated,
            messages_per_sale: per_sale(self.network.stats.sent),
            takes_per_sale: per_sale(stats.1),
            held_latency,
            answer_latency,
            held_latency_curve: self.rec.held_curve(),
            regions: self.rec.regions(),
            series: std::mem::take(&mut self.rec.series),
            end_ms: self.ms_after_start(self.now_us),
            events: self.events,
        }
    }
}

/// The event that asks for `action` again.
fn action_event(b: u32, action: BuyerAction) -> Event {
    match action {
        BuyerAction::Confirm => Event::Confirm(b),
        BuyerAction::Release => Event::Release(b),
        BuyerAction::Extend => Event::Extend(b),
    }
}
