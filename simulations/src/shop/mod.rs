//! A shop: several SKUs on sale at once, and buyers checking out carts of
//! them, each cart held all or nothing.
//!
//! Each SKU is a [`World`] of its own (its coordinator, its agents, its
//! single-SKU buyers), as each SKU of the real system has its own owner
//! in each agent and its own quota at the coordinator. The shop runs
//! their events and its own in one time order, and plays what
//! `region-agent/src/carts.rs` does for a cart, with escrow-core's
//! decisions: each item asked of the gate ([`first_refusal`](escrow_core::cart::first_refusal) of their
//! answers), then set aside by its SKU's owner in the buyer's region, one
//! item at a time in SKU order (waiting for units from elsewhere as a
//! reservation would); once every item is set aside, the cart and its items' rows are written in one
//! commit ([`CartCommit`], many carts to a commit, one commit in flight
//! per region); each owner is then told how it ended ([`CartEnd`]). A
//! cart's confirm, release, extend and expiry are its lifecycle's
//! ([`Cart::decide`]), written by one commit guarded by the cart's row.
//!
//! The cart rows are the regions' databases': they survive a crash. A
//! crash while a cart's commit is in flight loses the commit (nothing of
//! the cart is written), as the real agent's process takes its
//! transaction with it. After every cart commit the shop checks that each
//! cart's items are all there with the cart's status and expiry, and that
//! no item row is there without its cart: no half cart, ever.
//!
//! What is not modelled: the agents of one region are one process per
//! SKU here (a fault hits each SKU's agent when its own world says so,
//! which is at the same moment for faults on a schedule), and a cart's
//! items under a global per-user limit (their borrows).

mod buyers;

use std::collections::BTreeMap;

use escrow_core::cart::{Cart, CartCommit, CartStep, NextItem};
use escrow_core::owner::CartEnd;
use escrow_core::reservation::Lifecycle;
use escrow_core::{RequestKey, Tenant, Transition, TtlMs};
use indicatif::ProgressBar;

use crate::agent::EPOCH_MS;
use crate::demand::Demand;
use crate::metrics::{CartMetrics, Metrics, Recorder};
use crate::queue::EventQueue;
use crate::rng::{streams, Rng};
use crate::scenario::{CartConfig, Scenario};
use crate::world::{Violation, World};
use buyers::{Attempt, CartBuyer};

/// How often a cart that could not be expired is tried again, µs (the
/// agent's expiry tick).
const EXPIRY_RETRY_US: u64 = 250_000;

#[derive(Debug)]
enum Event {
    /// A cart buyer arrives in this region.
    Arrival(usize),
    /// Cart buyer `b` sends its hold.
    Attempt(u32),
    /// Ask this attempt's item of this index.
    Ask(u64, usize),
    /// An item of this attempt was refused, or its last set aside: decide.
    Decide(u64),
    /// Cart buyer `b` acts on its cart.
    Act(u32, buyers::Action),
    /// A held cart of this region may be due to expire.
    Due(usize, RequestKey),
    /// This region's cart commit is durable.
    CommitDone(usize),
}

/// What a cart commit is for.
#[derive(Debug, Clone)]
enum Purpose {
    /// A buyer's new cart: attempt number.
    Hold(u64),
    /// A buyer's action (`Some(buyer)`) or the expiry (`None`), decided
    /// on the cart as it was (`before`).
    Move {
        buyer: Option<(u32, buyers::Action)>,
        before: Lifecycle,
    },
}

#[derive(Debug, Clone)]
struct Pending {
    commit: CartCommit,
    purpose: Purpose,
}

/// One region's cart committer: carts wait while a commit is in flight,
/// then go together in the next.
#[derive(Debug, Default)]
struct Committer {
    waiting: Vec<Pending>,
    /// The commit in flight, and each SKU's agent incarnation when it
    /// started (a crash of one loses it).
    in_flight: Option<(Vec<Pending>, Vec<Option<u32>>)>,
}

/// A shop's run in progress.
pub struct Shop {
    scenario: Scenario,
    cfg: CartConfig,
    seed: u64,
    now_us: u64,
    tenant: Tenant,
    /// The SKUs' worlds.
    worlds: Vec<World>,
    queue: EventQueue<Event>,
    demand: Demand,
    buyers: Vec<CartBuyer>,
    attempts: BTreeMap<u64, Attempt>,
    next_attempt: u64,
    committers: Vec<Committer>,
    /// The carts each region's database holds, by key.
    carts: Vec<BTreeMap<RequestKey, Cart>>,
    rec: Recorder,
    stats: CartStats,
    arrived: u64,
    pending_buyers: u64,
    last_hold_us: Option<u64>,
}

/// Counters of carts.
#[derive(Debug, Clone, Copy, Default)]
struct CartStats {
    held: u64,
    items_held: u64,
    sold: u64,
    released: u64,
    expired: u64,
    turned_away: u64,
    commits: u64,
}

impl Shop {
    /// A shop ready to run `scenario` (which has `[carts]`) under `policy`
    /// with `seed`.
    pub fn new(scenario: &Scenario, policy: &str, seed: u64) -> Result<Self, String> {
        let cfg = scenario
            .carts
            .clone()
            .ok_or_else(|| format!("scenario {} has no [carts]", scenario.name))?;
        let carts = (scenario.demand.buyers as f64 * cfg.share).round() as u64;
        let singles = scenario.demand.buyers - carts;
        let mut worlds = Vec::new();
        for k in 0..cfg.skus {
            let mut s = scenario.clone();
            s.carts = None;
            let k64 = u64::from(k);
            let skus = u64::from(cfg.skus);
            s.demand.buyers = singles / skus + u64::from(k64 < singles % skus);
            if k > 0 {
                // Bots rush the first SKU only: the hot one.
                s.demand.bots.clear();
            }
            worlds.push(World::for_sku(&s, policy, seed, k)?);
        }
        let mut cart_scenario = scenario.clone();
        cart_scenario.demand.buyers = carts;
        cart_scenario.demand.bots.clear();
        let sale_start_us = worlds[0].sale_start_us();
        let cart_seed = Rng::stream(seed, streams::CARTS, 0).next_u64();
        let regions = scenario.regions.len();
        let mut shop = Shop {
            cfg,
            seed,
            now_us: 0,
            tenant: Tenant::parse("sim").expect("a fixed valid name"),
            worlds,
            queue: EventQueue::default(),
            demand: Demand::new(&cart_scenario, cart_seed, sale_start_us),
            buyers: Vec::new(),
            attempts: BTreeMap::new(),
            next_attempt: 0,
            committers: (0..regions).map(|_| Committer::default()).collect(),
            carts: vec![BTreeMap::new(); regions],
            rec: Recorder::new(
                scenario
                    .regions
                    .iter()
                    .map(|r| (r.name.clone(), r.rtt_ms))
                    .collect(),
            ),
            stats: CartStats::default(),
            arrived: 0,
            pending_buyers: 0,
            last_hold_us: None,
            scenario: cart_scenario,
        };
        for r in 0..regions {
            if let Some(t) = shop.demand.peek(r) {
                shop.queue.push(t, Event::Arrival(r));
            }
        }
        Ok(shop)
    }

    /// When the sale starts, µs.
    pub fn sale_start_us(&self) -> u64 {
        self.worlds[0].sale_start_us()
    }

    /// Simulated time, µs.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Whether the sale is over: every SKU's world quiet, every cart
    /// buyer arrived and done, no cart held or being written.
    pub fn quiet(&self) -> bool {
        self.arrived == self.demand.total
            && self.pending_buyers == 0
            && self.worlds.iter().all(World::quiet)
            && self.committers.iter().all(|c| c.in_flight.is_none())
    }

    /// Whether everything converged: quiet, no cart being decided, and
    /// every SKU's world converged ([`World::converged`]).
    pub fn converged(&self) -> bool {
        self.quiet() && self.attempts.is_empty() && self.worlds.iter().all(World::converged)
    }

    /// Ends every fault in every SKU's world now.
    pub fn heal(&mut self) {
        let now = self.now_us;
        for w in &mut self.worlds {
            w.heal_at(now);
        }
    }

    /// Units of every SKU held or sold, summed.
    pub fn units_taken(&self) -> u64 {
        self.worlds
            .iter()
            .map(|w| w.census().held + w.census().sold)
            .sum()
    }

    /// Runs events, the shop's and its worlds' in one time order, until
    /// `stop` holds or the next is past `deadline_us`; returns whether
    /// `stop` held. Safety is checked after every event.
    pub fn run_until(
        &mut self,
        mut stop: impl FnMut(&Shop) -> bool,
        deadline_us: u64,
        progress: Option<&ProgressBar>,
    ) -> Result<bool, Violation> {
        loop {
            if stop(self) {
                return Ok(true);
            }
            let world = self
                .worlds
                .iter()
                .enumerate()
                .filter_map(|(k, w)| w.next_time().map(|t| (t, k)))
                .min();
            let own = self.queue.peek_time();
            match (own, world) {
                (Some(t), w) if t <= deadline_us && w.is_none_or(|(wt, _)| t <= wt) => {
                    let (t, event) = self.queue.pop().expect("peeked");
                    self.now_us = t;
                    self.on_event(event)?;
                }
                (_, Some((t, k))) if t <= deadline_us => {
                    self.now_us = t;
                    self.worlds[k].step_checked()?;
                    self.collect(k)?;
                }
                _ => return Ok(false),
            }
            if let Some(p) = progress {
                p.set_position(self.arrived);
            }
        }
    }

    fn on_event(&mut self, event: Event) -> Result<(), Violation> {
        match event {
            Event::Arrival(r) => self.on_arrival(r),
            Event::Attempt(b) => self.attempt(b),
            Event::Ask(a, i) => self.ask(a, i),
            Event::Decide(a) => self.decide(a),
            Event::Act(b, action) => self.act(b, action),
            Event::Due(r, key) => self.due(r, &key),
            Event::CommitDone(r) => self.commit_done(r),
        }
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            seed: self.seed,
            at_ms: (self.now_us as i64 - self.sale_start_us() as i64) / 1_000,
            what,
        }
    }

    /// The incarnation of each SKU's agent in region `r` (`None`: down).
    fn epochs(&self, r: usize) -> Vec<Option<u32>> {
        self.worlds.iter().map(|w| w.agent_epoch(r)).collect()
    }

    /// The shortest hold of the SKUs: a cart's hold, and its extension.
    fn ttl(&self) -> TtlMs {
        TtlMs::parse(self.scenario.sku.hold_ttl_ms as i64).expect("validated hold_ttl_ms")
    }

    /// Queues a cart commit in region `r`, starting it if none is in flight.
    fn commit(&mut self, r: usize, pending: Pending) {
        self.committers[r].waiting.push(pending);
        self.start_commit(r);
    }

    fn start_commit(&mut self, r: usize) {
        let epochs = self.epochs(r);
        let c = &mut self.committers[r];
        if c.in_flight.is_some() || c.waiting.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut c.waiting);
        let rows: u64 = batch.iter().map(|p| 1 + p.commit.items.len() as u64).sum();
        let a = &self.scenario.agent;
        let at = self.now_us + rows * a.commit_row_us + a.commit_us;
        c.in_flight = Some((batch, epochs));
        self.queue.push(at, Event::CommitDone(r));
    }

    /// Region `r`'s commit is durable (or lost with a crashed agent):
    /// write each cart whose row is as its step needs, tell the owners,
    /// answer.
    fn commit_done(&mut self, r: usize) -> Result<(), Violation> {
        let (batch, epochs) = self.committers[r]
            .in_flight
            .take()
            .expect("a commit's end belongs to a commit in flight");
        let now_epochs = self.epochs(r);
        let lost = epochs != now_epochs;
        if !lost {
            self.stats.commits += 1;
        }
        for pending in batch {
            // A cart whose items were set aside by an incarnation that
            // died since is the dead process's: it never commits.
            let set_aside_by_dead = match pending.purpose {
                Purpose::Hold(a) => self.attempts[&a].epochs != now_epochs,
                Purpose::Move { .. } => false,
            };
            if lost || set_aside_by_dead {
                self.lost(r, pending)?;
            } else {
                self.write(r, pending)?;
            }
        }
        self.check_carts(r)?;
        self.start_commit(r);
        Ok(())
    }

    /// Writes one cart of a durable commit, if its row allows it.
    fn write(&mut self, r: usize, pending: Pending) -> Result<(), Violation> {
        let Pending { commit, purpose } = pending;
        let key = commit.cart.request_key.clone();
        let stored = self.carts[r].get(&key).map(|c| c.lifecycle);
        let allowed = match (&commit.step, &purpose) {
            (CartStep::Create, _) => stored.is_none(),
            (CartStep::Move(_), Purpose::Move { before, .. }) => stored == Some(*before),
            (CartStep::Move(_), Purpose::Hold(_)) => false,
        };
        if !allowed {
            return match purpose {
                Purpose::Hold(a) => Err(self.violation(format!(
                    "cart {key} (attempt {a}) found its key taken: a buyer never resends a key in flight"
                ))),
                // Moved meanwhile by another action or the expiry: decide again.
                Purpose::Move { buyer, .. } => {
                    match buyer {
                        Some((b, action)) => self.queue.push(self.now_us, Event::Act(b, action)),
                        None => self.queue.push(self.now_us, Event::Due(r, key)),
                    }
                    Ok(())
                }
            };
        }
        for (item, batch) in commit.cart.items.iter().zip(&commit.items) {
            let k = self.sku_index(&item.sku);
            self.worlds[k].write_cart_item(self.now_us, r, batch)?;
        }
        let end = match commit.step {
            CartStep::Create => CartEnd::Held,
            CartStep::Move(change) => CartEnd::Moved(change),
        };
        self.carts[r].insert(key.clone(), commit.cart.clone());
        self.tell_owners(r, &commit.cart, end)?;
        let expires_us = (commit.cart.lifecycle.expires_at_ms - EPOCH_MS) * 1_000;
        match purpose {
            Purpose::Hold(a) => {
                self.queue.push(expires_us, Event::Due(r, key));
                self.held(a, &commit.cart);
            }
            Purpose::Move { buyer, .. } => {
                let CartStep::Move(change) = commit.step else {
                    unreachable!("a move's commit moves")
                };
                if matches!(change, Transition::Extend { .. }) {
                    self.queue.push(expires_us, Event::Due(r, key));
                }
                self.moved(&commit.cart, change, buyer);
            }
        }
        Ok(())
    }

    /// One cart of a commit lost with a crashed agent: nothing of it was
    /// written. The owners still up let its units go; its buyer retries.
    fn lost(&mut self, r: usize, pending: Pending) -> Result<(), Violation> {
        match pending.purpose {
            Purpose::Hold(a) => {
                self.tell_owners(r, &pending.commit.cart, CartEnd::Dropped)?;
                self.unreachable(a);
            }
            Purpose::Move { buyer, .. } => {
                let key = pending.commit.cart.request_key.clone();
                match buyer {
                    Some((b, action)) => self.retry_action(b, action),
                    None => self
                        .queue
                        .push(self.now_us + EXPIRY_RETRY_US, Event::Due(r, key)),
                }
            }
        }
        Ok(())
    }

    /// Tells the owner of each of `cart`'s items in region `r` (those up)
    /// how the cart ended for it.
    fn tell_owners(&mut self, r: usize, cart: &Cart, end: CartEnd) -> Result<(), Violation> {
        for item in &cart.items {
            let k = self.sku_index(&item.sku);
            if self.worlds[k].agent_epoch(r).is_some() {
                let key = cart.item_key(&item.sku);
                self.worlds[k].cart_end(self.now_us, r, &key, end)?;
            }
        }
        Ok(())
    }

    fn sku_index(&self, sku: &escrow_core::Sku) -> usize {
        self.worlds
            .iter()
            .position(|w| w.sku() == sku)
            .expect("a cart's SKUs are the shop's")
    }

    /// No half cart in region `r`: every cart's items are stored with its
    /// status and expiry, and every stored item belongs to a cart.
    fn check_carts(&self, r: usize) -> Result<(), Violation> {
        let mut items_per_sku = vec![0usize; self.worlds.len()];
        for cart in self.carts[r].values() {
            for item in &cart.items {
                let k = self.sku_index(&item.sku);
                items_per_sku[k] += 1;
                let row = self.worlds[k].agents[r]
                    .db
                    .book
                    .get(&cart.item_key(&item.sku));
                let whole = row.is_some_and(|row| {
                    row.status == cart.lifecycle.status
                        && row.expires_at_ms == cart.lifecycle.expires_at_ms
                        && row.qty == item.qty
                });
                if !whole {
                    return Err(self.violation(format!(
                        "region {r}: cart {} is {:?} but its item {} is {row:?}",
                        cart.request_key, cart.lifecycle.status, item.sku
                    )));
                }
            }
        }
        for (k, w) in self.worlds.iter().enumerate() {
            let stored = w.agents[r]
                .db
                .book
                .reservations()
                .filter(|res| res.request_key.cart().is_some())
                .count();
            if stored != items_per_sku[k] {
                return Err(self.violation(format!(
                    "region {r}: {stored} cart items of {} stored, {} in carts",
                    w.sku(),
                    items_per_sku[k]
                )));
            }
        }
        Ok(())
    }

    /// Collects the answers world `k` gave to carts' items.
    fn collect(&mut self, k: usize) -> Result<(), Violation> {
        for (ticket, at_us, reply) in self.worlds[k].take_cart_replies() {
            let a = crate::agent::cart_attempt(ticket).expect("a cart item's ticket");
            let Some(attempt) = self.attempts.get_mut(&a) else {
                continue;
            };
            let at = at_us.max(self.now_us);
            match attempt.answer(k, reply) {
                NextItem::Ask(i) => self.queue.push(at, Event::Ask(a, i)),
                NextItem::Refused(..) | NextItem::AllSetAside => {
                    self.queue.push(at, Event::Decide(a))
                }
            }
        }
        Ok(())
    }

    /// Checks every SKU's books and every region's carts at the end.
    pub fn check_books(&self) -> Result<(), Violation> {
        for w in &self.worlds {
            w.check_books()?;
        }
        (0..self.carts.len()).try_for_each(|r| self.check_carts(r))
    }

    /// The run's results: the SKUs' figures summed, and the carts'.
    pub fn finish(mut self, end_us: u64) -> Metrics {
        let sale_start_us = self.sale_start_us();
        let mut worlds = std::mem::take(&mut self.worlds).into_iter();
        let mut first = worlds.next().expect("a shop has a SKU");
        let rest: Vec<World> = worlds.collect();
        for w in &rest {
            first.absorb_recorder(w);
        }
        let mut m = first.finish(end_us);
        for w in rest {
            m.add_sku(&w.finish(end_us));
        }
        let (hold_wait, holds_under_rtt) = self.rec.overall_hold_wait();
        let (_, _, sold_out_answers, _, _) = self.rec.totals();
        m.carts = Some(CartMetrics {
            buyers: self.arrived,
            held: self.stats.held,
            items_held: self.stats.items_held,
            sold: self.stats.sold,
            released: self.stats.released,
            expired: self.stats.expired,
            turned_away: self.stats.turned_away,
            sold_out_answers,
            commits: self.stats.commits,
            last_hold_ms: self
                .last_hold_us
                .map(|t| (t as f64 - sale_start_us as f64) / 1_000.0),
            hold_wait,
            holds_under_rtt,
            regions: self.rec.regions(),
        });
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use escrow_core::Status;

    /// Goal: the shop's check sees a half cart: a cart whose status its
    /// items do not share, and an item stored without its cart.
    #[test]
    fn a_half_cart_is_a_violation() {
        let s = Scenario::load("dist-carts").expect("built in");
        let mut shop = Shop::new(&s, "tail-merge", 1).expect("valid");
        let end = shop.sale_start_us() + 60_000_000;
        let held = shop
            .run_until(|shop| shop.stats.held > 0, end, None)
            .expect("safe");
        assert!(held);
        let r = (0..s.regions.len())
            .find(|r| !shop.carts[*r].is_empty())
            .expect("a region holds the cart");
        shop.check_carts(r).expect("whole");
        let key = shop.carts[r].keys().next().cloned().expect("a cart");
        let cart = shop.carts[r].get_mut(&key).expect("the cart");
        cart.lifecycle.status = Status::Sold;
        assert!(shop.check_carts(r).is_err());
        shop.carts[r].remove(&key);
        let what = shop
            .check_carts(r)
            .expect_err("items without their cart")
            .what;
        assert!(what.contains("cart items"), "{what}");
    }
}
