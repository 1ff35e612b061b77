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
//! sold beyond the total. Under a global per-user limit, no user holds or
//! has bought in two regions, nor where their place is lent.
//!
//! - `buyers`: arrivals, attempts, retries, actions and what answers count for.
//! - `faults`: partitions, coordinator outages and agent crashes on a schedule.
//! - `safety`: the census of units and the checks run after every event.
//! - `sampling`: the time series for the reports.

mod buyers;
mod carts;
mod faults;
mod safety;
mod sampling;

use escrow_core::owner::{ActReply, ReserveReply, Ticket, SWEEP_INTERVAL_MS};
use escrow_core::{RegionName, Sku, SkuSettings, Status, Tenant};
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

/// The name of a shop's SKU number `index`: `sku`, `sku1`, `sku2`, ...
pub fn sku_name(index: u32) -> String {
    match index {
        0 => "sku".to_owned(),
        k => format!("sku{k}"),
    }
}

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
    /// The seed of this world's own streams (arrivals, choices, network):
    /// the run's seed, or one drawn from it for each SKU of a shop.
    stream_seed: u64,
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
    /// Messages that reached the coordinator while it was frozen, in the
    /// order they came.
    frozen_inbox: Vec<Envelope>,
    sold_triggers: bool,
    effects: Vec<Effect>,
    /// When the machine's CPU is next free for a commit's rows, µs (used
    /// when the agents share one machine).
    machine_free_at_us: u64,
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
    /// SOLD_OUT answers while the buyer's units were free somewhere and
    /// no hold had ended yet (see [`World::unfounded_sold_outs`]).
    unfounded_sold_outs: u64,
    confirms_refused: u64,
    sell_out_us: Option<u64>,
    last_hold_us: Option<u64>,
    oversold: u64,
    census: Census,
    /// The agents' database writes when users were last checked: who
    /// holds what changes only with a write.
    users_checked_at: u64,
    events: u64,
    next_sample_ms: f64,
    /// Answers to carts' items, for the shop to collect.
    cart_replies: Vec<(Ticket, u64, ReserveReply)>,
}

impl World {
    /// A world ready to run `scenario` under `policy` with `seed`.
    pub fn new(scenario: &Scenario, policy: &str, seed: u64) -> Result<Self, String> {
        Self::for_sku(scenario, policy, seed, 0)
    }

    /// The world of a shop's SKU number `index` (0 is [`World::new`]'s):
    /// its own name, arrivals, buyers' choices and network streams.
    pub fn for_sku(
        scenario: &Scenario,
        policy: &str,
        seed: u64,
        index: u32,
    ) -> Result<Self, String> {
        let s = scenario;
        let stream_seed = match index {
            0 => seed,
            k => Rng::stream(seed, streams::SKU, u64::from(k)).next_u64(),
        };
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
        .map_err(|e| e.to_string())?
        .with_scope(s.sku.user_limit_scope);
        let tenant = Tenant::parse("sim").expect("a fixed valid name");
        let sku = Sku::parse(&sku_name(index)).expect("sku and digits make a valid name");
        let names = s
            .regions
            .iter()
            .map(|r| RegionName::parse(&r.name).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let coordinator = Coordinator::new(
            s.sku.total,
            s.regions.iter().map(|r| r.weight).collect(),
            policy_box,
            s.coordinator.service_us,
            SkuIdentity {
                tenant: tenant.clone(),
                sku: sku.clone(),
                max_per_user: s.sku.max_per_user,
                hold_ttl_ms: s.sku.hold_ttl_ms,
                user_limit_scope: s.sku.user_limit_scope,
                regions: names.clone(),
            },
        );
        let agents: Vec<Agent> = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                Agent::new(
                    i,
                    name,
                    &tenant,
                    &sku,
                    settings,
                    coordinator.mode(),
                    &s.agent,
                )
            })
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
            stream_seed,
            now_us: 0,
            sale_start_us,
            queue: EventQueue::default(),
            agents,
            coordinator,
            network: Network::new(s, Rng::stream(stream_seed, streams::NETWORK, 0)),
            demand: Demand::new(s, stream_seed, sale_start_us),
            buyers: Vec::new(),
            rec: Recorder::new(
                s.regions
                    .iter()
                    .map(|r| (r.name.clone(), r.rtt_ms))
                    .collect(),
            ),
            sold_triggers: faults.iter().any(|f| f.cfg.start_sold.is_some()),
            faults,
            agent_down: vec![0; s.regions.len()],
            frozen_inbox: Vec::new(),
            effects: Vec::new(),
            machine_free_at_us: 0,
            arrived: 0,
            pending_buyers: 0,
            sold_to_buyers: 0,
            buyers_served: 0,
            turned_away: (0, 0),
            turned_away_while_free: 0,
            first_turned_away_arrival_us: None,
            order_inversions: 0,
            released_holds: 0,
            unfounded_sold_outs: 0,
            confirms_refused: 0,
            sell_out_us: None,
            last_hold_us: None,
            oversold: 0,
            census: Census::default(),
            users_checked_at: 0,
            events: 0,
            next_sample_ms: SAMPLE_FIRST_MS,
            cart_replies: Vec::new(),
            scenario: s.clone(),
        };
        if s.demand.buyers > 0 {
            w.buyers.reserve(w.demand.total as usize);
        }
        let mut phase = Rng::stream(stream_seed, streams::PHASE, 0);
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

    /// SOLD_OUT answers given while at least the buyer's quantity was free
    /// somewhere (a region, the pool or in transit) before any hold was
    /// released or expired. Once units come back, a region's cached
    /// sold-out lasts until the coordinator's next word reaches it, by
    /// design; before that, nothing may be called sold out that is not.
    pub fn unfounded_sold_outs(&self) -> u64 {
        self.unfounded_sold_outs
    }

    /// Whether the sale is over: every buyer arrived and is done, and no unit is held.
    pub fn quiet(&self) -> bool {
        self.arrived == self.demand.total && self.pending_buyers == 0 && self.census.held == 0
    }

    /// Whether everything converged: quiet, every agent up, no transfer
    /// unacknowledged or unconfirmed, no borrowed place asked or on its way
    /// home, every latest report equal to its agent's counters, leases
    /// equal to quotas, and the audit at 0.
    pub fn converged(&self) -> bool {
        self.quiet()
            && self.census.in_transit == 0
            && self.coordinator.drift() == 0
            && self.coordinator.borrows_unsettled() == 0
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
                    borrowed,
                } => self.on_answer(buyer, at_us, answer, borrowed),
                // Answers reach buyers when given: the world's time is theirs.
                Effect::Acted {
                    buyer,
                    action,
                    reply,
                    ..
                } => self.on_acted(buyer, action, reply),
                Effect::CartItem {
                    ticket,
                    at_us,
                    reply,
                } => self.cart_replies.push((ticket, at_us, reply)),
                Effect::Send { at_us, envelope } => self.send(at_us, envelope),
                Effect::Commit {
                    region,
                    epoch,
                    from_us,
                    cpu_us,
                    wait_us,
                    done,
                } => {
                    let mut start_us = from_us;
                    if self.scenario.agent.one_machine {
                        start_us = start_us.max(self.machine_free_at_us);
                        self.machine_free_at_us = start_us + cpu_us;
                    }
                    self.queue.push(
                        start_us + cpu_us + wait_us,
                        Event::Agent {
                            region,
                            epoch,
                            timer: done,
                        },
                    );
                }
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
        if env.payload.to_coordinator() && self.network.coordinator_frozen > 0 {
            self.frozen_inbox.push(env);
            return;
        }
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
                    Payload::Limits(up) => {
                        Some(Payload::LimitsReply(self.coordinator.relay_limits(r, up)))
                    }
                    _ => None,
                }
            };
            // Regions with news get their held-open watch call answered.
            for region in self.coordinator.take_notices() {
                let at = self.coordinator.reply_at(now);
                let epoch = self.agents[region].epoch;
                let news = self.coordinator.watch_news(region, epoch);
                self.send(
                    at,
                    Envelope {
                        region,
                        call: 0,
                        epoch,
                        payload: Payload::Notice(news),
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
            Payload::Notice(news) => a.on_notice(now, news, &mut self.effects),
            Payload::LimitsReply(down) => a.on_limits_reply(now, env.call, down, &mut self.effects),
            Payload::Sync(_) | Payload::Take(_) | Payload::Limits(_) => {}
        }
        self.apply_effects();
    }

    /// The run's results.
    pub fn finish(mut self, end_us: u64) -> Metrics {
        self.now_us = self.now_us.max(end_us);
        self.census = self.compute_census();
        self.sample();
        let c = self.census;
        let (attempts, _holds, sold_outs, paused, rejected) = self.rec.totals();
        let (held_latency, answer_latency) = self.rec.overall_latency();
        let (hold_wait, holds_under_rtt) = self.rec.overall_hold_wait();
        let stats = self.agents.iter().fold((0, 0, 0), |t, a| {
            (
                t.0 + a.stats.syncs,
                t.1 + a.stats.takes,
                t.2 + a.stats.expired_units,
            )
        });
        let borrows = self.agents.iter().fold((0, 0, 0), |t, a| {
            (
                t.0 + a.stats.borrows_lent,
                t.1 + a.stats.borrows_refused,
                t.2 + a.stats.borrows_unanswered,
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
            user_limit_scope: self.scenario.sku.user_limit_scope,
            borrowed_holds: self.rec.borrowed_holds(),
            borrows_lent: borrows.0,
            borrows_refused: borrows.1,
            borrows_unanswered: borrows.2,
            borrows_unsettled: self.coordinator.borrows_unsettled() as u64,
            held_latency,
            hold_wait,
            holds_under_rtt,
            answer_latency,
            held_latency_curve: self.rec.held_curve(),
            regions: self.rec.regions(),
            series: std::mem::take(&mut self.rec.series),
            end_ms: self.ms_after_start(self.now_us),
            events: self.events,
            skus: 1,
            carts: None,
        }
    }
}
