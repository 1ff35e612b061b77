//! The shop's cart buyers: their carts, their holds (the gate, the items
//! set aside, the decision) and their actions, and what the answers count
//! for. A cart buyer behaves as a single-SKU human buyer does (the same
//! retries, the same choices after HELD), on the whole cart.

use escrow_core::cart::{
    checked_items, first_refusal, Cart, CartAction, CartCommit, CartItem, ItemAnswers, NextItem,
};
use escrow_core::owner::{CartEnd, PauseReason, ReserveReply, ReserveRequest};
use escrow_core::{Deadline, Qty, RequestKey, Status, Transition, UserId};

use super::{Event, Pending, Purpose, Shop};
use crate::agent::{cart_ticket, now_ms, Answer};
use crate::demand::{choices, AfterHold};
use crate::rng::{streams, Rng};
use crate::world::Violation;

/// Times a confirm or release is tried while an agent is down.
const ACTION_TRIES_MAX: u8 = 10;

/// A buyer's action on its cart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Confirm,
    Release,
    Extend,
}

impl Action {
    fn of_cart(self) -> CartAction {
        match self {
            Action::Confirm => CartAction::Confirm,
            Action::Release => CartAction::Release,
            Action::Extend => CartAction::Extend(None),
        }
    }
}

/// One cart buyer.
#[derive(Debug, Clone)]
pub(super) struct CartBuyer {
    arrived_us: u64,
    started_us: u64,
    region: usize,
    key: RequestKey,
    user: UserId,
    items: Vec<CartItem>,
    attempts: u32,
    action_tries: u8,
}

/// One hold of a cart in progress: its items asked one at a time, in
/// SKU order, as `region-agent/src/carts.rs` asks them (escrow-core's
/// [`ItemAnswers`]).
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    buyer: u32,
    /// The world of each item, in item order.
    skus: Vec<usize>,
    answers: ItemAnswers,
    /// When the whole cart must be answered (its first send plus the
    /// queue wait), as the agent's `hold_items` counts it.
    deadline: Deadline,
    /// Each SKU's agent incarnation in the buyer's region when the items
    /// were asked: the units set aside are that incarnation's memory.
    pub(super) epochs: Vec<Option<u32>>,
}

impl Attempt {
    /// World `k`'s item, the one asked last, was answered `reply`.
    pub(super) fn answer(&mut self, k: usize, reply: ReserveReply) -> NextItem {
        debug_assert_eq!(
            self.answers.next(),
            NextItem::Ask(self.skus.iter().position(|s| *s == k).unwrap_or(usize::MAX)),
            "an answer comes for the item asked"
        );
        self.answers.answer(reply)
    }
}

impl Shop {
    pub(super) fn on_arrival(&mut self, r: usize) -> Result<(), Violation> {
        let Some(arrival) = self.demand.next(r) else {
            return Ok(());
        };
        debug_assert_eq!(arrival.at_us, self.now_us);
        let b = u32::try_from(self.buyers.len()).expect("validated: buyers fit in u32");
        let items = self.draw_items(b);
        self.buyers.push(CartBuyer {
            arrived_us: self.now_us,
            started_us: self.now_us,
            region: r,
            key: RequestKey::parse(&format!("c{b}")).expect("c<digits> is a valid key"),
            user: UserId::parse(&format!("cart{b}")).expect("cart<digits> is a valid user id"),
            items,
            attempts: 0,
            action_tries: 0,
        });
        self.arrived += 1;
        self.pending_buyers += 1;
        self.rec.arrival(r);
        if let Some(t) = self.demand.peek(r) {
            self.queue.push(t, Event::Arrival(r));
        }
        self.attempt(b)
    }

    /// Cart buyer `b`'s items: `items[0]..=items[1]` distinct SKUs, one
    /// unit each, drawn from the buyer's own stream.
    fn draw_items(&self, b: u32) -> Vec<CartItem> {
        let mut rng = Rng::stream(self.seed, streams::CART, u64::from(b));
        let [least, most] = self.cfg.items;
        let n = rng.range(u64::from(least), u64::from(most)) as usize;
        let mut skus: Vec<usize> = (0..self.worlds.len()).collect();
        for i in 0..n {
            let j = i + rng.below((skus.len() - i) as u64) as usize;
            skus.swap(i, j);
        }
        let items = skus[..n]
            .iter()
            .map(|k| CartItem {
                sku: self.worlds[*k].sku().clone(),
                qty: Qty::from_stored(1),
            })
            .collect();
        checked_items(items).expect("distinct SKUs, 1..=skus of them")
    }

    /// Cart buyer `b` sends its hold: the gate answers from memory, else
    /// every item is asked of its owner.
    pub(super) fn attempt(&mut self, b: u32) -> Result<(), Violation> {
        let buyer = &mut self.buyers[b as usize];
        buyer.attempts += 1;
        buyer.started_us = self.now_us;
        let r = buyer.region;
        let buyer = buyer.clone();
        self.rec.attempt(r);
        if self.epochs(r).iter().any(Option::is_none) {
            self.answer(b, self.now_us, Answer::Unreachable);
            return Ok(());
        }
        let skus: Vec<usize> = buyer.items.iter().map(|i| self.sku_index(&i.sku)).collect();
        let gates: Vec<Option<ReserveReply>> = skus
            .iter()
            .zip(&buyer.items)
            .map(|(k, item)| self.worlds[*k].agents[r].gate_item(item.qty.units()))
            .collect();
        if let Some((_, reply)) = first_refusal(&gates) {
            let at = self.now_us + self.scenario.agent.gate_us;
            self.answer(b, at, Answer::of(&reply));
            return Ok(());
        }
        let a = self.next_attempt;
        self.next_attempt += 1;
        self.attempts.insert(
            a,
            Attempt {
                epochs: self.epochs(r),
                buyer: b,
                answers: ItemAnswers::new(skus.len()),
                deadline: Deadline::after(now_ms(self.now_us), self.scenario.agent.wait_timeout_ms),
                skus: skus.clone(),
            },
        );
        self.ask(a, 0)
    }

    /// Asks attempt `a`'s item `i` of its owner.
    pub(super) fn ask(&mut self, a: u64, i: usize) -> Result<(), Violation> {
        let attempt = &self.attempts[&a];
        let k = attempt.skus[i];
        let buyer = &self.buyers[attempt.buyer as usize];
        let (r, item) = (buyer.region, &buyer.items[i]);
        let request = ReserveRequest {
            borrow: None,
            request_key: RequestKey::cart_item(&buyer.key, &item.sku),
            user_id: buyer.user.clone(),
            qty: item.qty,
            ttl: Some(self.ttl()),
        };
        if self.worlds[k].agent_epoch(r) != attempt.epochs[k] {
            // The agent died since the attempt began: the request finds
            // no process, and the cart lets go of what it set aside.
            let halted = ReserveReply::Paused(PauseReason::Halted);
            let attempt = self.attempts.get_mut(&a).expect("asked while deciding");
            attempt.answer(k, halted);
            self.queue.push(self.now_us, Event::Decide(a));
            return Ok(());
        }
        let deadline = attempt
            .answers
            .deadline(attempt.deadline, now_ms(self.now_us));
        self.worlds[k].set_aside(self.now_us, r, cart_ticket(a), request, deadline)?;
        self.collect(k)
    }

    /// Attempt `a` is done asking: an item was refused (let the units set
    /// aside go and answer the refusal), or every item is set aside (write
    /// the cart).
    pub(super) fn decide(&mut self, a: u64) -> Result<(), Violation> {
        let attempt = self.attempts[&a].clone();
        let buyer = self.buyers[attempt.buyer as usize].clone();
        let r = buyer.region;
        if let NextItem::Refused(_, reply) = attempt.answers.next() {
            self.attempts.remove(&a);
            let set_aside = attempt.answers.set_aside();
            for ((k, item), aside) in attempt.skus.iter().zip(&buyer.items).zip(set_aside) {
                if aside && self.worlds[*k].agent_epoch(r).is_some() {
                    let key = RequestKey::cart_item(&buyer.key, &item.sku);
                    self.worlds[*k].cart_end(self.now_us, r, &key, CartEnd::Dropped)?;
                }
            }
            self.answer(attempt.buyer, self.now_us, Answer::of(&reply));
            return Ok(());
        }
        debug_assert_eq!(attempt.answers.next(), NextItem::AllSetAside);
        let now_ms = now_ms(self.now_us);
        let cart = Cart::held(
            buyer.key.clone(),
            buyer.user.clone(),
            buyer.items.clone(),
            now_ms + self.ttl().get(),
        );
        let commit = CartCommit::create(&self.tenant, cart, now_ms);
        self.commit(
            r,
            Pending {
                commit,
                purpose: Purpose::Hold(a),
            },
        );
        Ok(())
    }

    /// Attempt `a`'s cart is written: the buyer holds it.
    pub(super) fn held(&mut self, a: u64, cart: &Cart) {
        let b = self
            .attempts
            .remove(&a)
            .expect("a held cart's attempt")
            .buyer;
        let buyer = &self.buyers[b as usize];
        let r = buyer.region;
        self.rec
            .answer(r, Answer::Held, self.now_us - buyer.started_us);
        self.rec.hold_wait(r, self.now_us - buyer.arrived_us);
        self.stats.held += 1;
        self.stats.items_held += cart.items.len() as u64;
        self.last_hold_us = Some(self.now_us);
        let seed = Rng::stream(self.seed, streams::CART, u64::MAX).next_u64();
        match choices(seed, b, &self.scenario.buyers, 1, 0.0).after_hold {
            AfterHold::Abandon => self.done(false),
            AfterHold::Release { after_us } => self
                .queue
                .push(self.now_us + after_us, Event::Act(b, Action::Release)),
            AfterHold::Confirm {
                after_us,
                extend_after_us,
            } => {
                self.queue
                    .push(self.now_us + after_us, Event::Act(b, Action::Confirm));
                if let Some(e) = extend_after_us {
                    self.queue
                        .push(self.now_us + e, Event::Act(b, Action::Extend));
                }
            }
        }
    }

    /// Attempt `a`'s commit was lost with a crashed agent.
    pub(super) fn unreachable(&mut self, a: u64) {
        let b = self
            .attempts
            .remove(&a)
            .expect("a lost cart's attempt")
            .buyer;
        self.answer(b, self.now_us, Answer::Unreachable);
    }

    /// Buyer `b` was refused its cart at `at_us`: it retries or leaves.
    fn answer(&mut self, b: u32, at_us: u64, answer: Answer) {
        let buyer = &self.buyers[b as usize];
        let r = buyer.region;
        self.rec
            .answer(r, answer, at_us.saturating_sub(buyer.started_us));
        let (retries, delay_ms) = match answer {
            Answer::Held => unreachable!("a held cart is answered by `held`"),
            Answer::Replay | Answer::UserLimit | Answer::KeyReused => return self.done(false),
            Answer::SoldOut => (0, 0),
            Answer::Paused | Answer::QueueFull | Answer::WaitTimeout | Answer::Unreachable => (
                self.scenario.buyers.retries,
                self.scenario.buyers.retry_after_ms,
            ),
        };
        if buyer.attempts <= retries {
            self.queue
                .push(at_us + delay_ms.max(1) * 1_000, Event::Attempt(b));
        } else {
            self.done(true);
        }
    }

    fn done(&mut self, turned_away: bool) {
        self.pending_buyers -= 1;
        if turned_away {
            self.stats.turned_away += 1;
        }
    }

    /// Buyer `b` acts on its cart: decided by the cart's lifecycle and,
    /// when something changes, written by a commit guarded by its row.
    pub(super) fn act(&mut self, b: u32, action: Action) -> Result<(), Violation> {
        let buyer = &self.buyers[b as usize];
        let r = buyer.region;
        if self.epochs(r).iter().any(Option::is_none) {
            // A missed extend only shortens the hold; a buyer tries it once.
            if action != Action::Extend {
                self.retry_action(b, action);
            }
            return Ok(());
        }
        let Some(cart) = self.carts[r].get(&buyer.key).cloned() else {
            unreachable!("a buyer acts on the cart it holds");
        };
        let now_ms = now_ms(self.now_us);
        let verdict = cart.decide(Some(action.of_cart()), now_ms, self.ttl());
        match verdict.change {
            None => self.acted(action),
            Some(change) => {
                let before = cart.lifecycle;
                let commit = CartCommit::transition(&self.tenant, cart, change, now_ms);
                let purpose = Purpose::Move {
                    buyer: Some((b, action)),
                    before,
                };
                self.commit(r, Pending { commit, purpose });
            }
        }
        Ok(())
    }

    /// The held cart `key` of region `r` may be due: the expiry decides.
    pub(super) fn due(&mut self, r: usize, key: &RequestKey) -> Result<(), Violation> {
        if self.epochs(r).iter().any(Option::is_none) {
            self.queue.push(
                self.now_us + super::EXPIRY_RETRY_US,
                Event::Due(r, key.clone()),
            );
            return Ok(());
        }
        let Some(cart) = self.carts[r].get(key).cloned() else {
            return Ok(());
        };
        let now_ms = now_ms(self.now_us);
        if let Some(change) = cart.decide(None, now_ms, self.ttl()).change {
            let before = cart.lifecycle;
            let commit = CartCommit::transition(&self.tenant, cart, change, now_ms);
            let purpose = Purpose::Move {
                buyer: None,
                before,
            };
            self.commit(r, Pending { commit, purpose });
        }
        Ok(())
    }

    /// A cart's committed transition, counted; its buyer answered.
    pub(super) fn moved(&mut self, cart: &Cart, change: Transition, buyer: Option<(u32, Action)>) {
        match (change, cart.lifecycle.status) {
            (Transition::Expire, _) => self.stats.expired += 1,
            (Transition::Confirm, Status::Sold) => self.stats.sold += 1,
            (Transition::Release, Status::Released) => self.stats.released += 1,
            _ => {}
        }
        if let Some((_, action)) = buyer {
            self.acted(action);
        }
    }

    /// A buyer's action is answered: a confirm or release ends its visit.
    fn acted(&mut self, action: Action) {
        if action != Action::Extend {
            self.done(false);
        }
    }

    /// An agent is down: try the action again later, a bounded number of times.
    pub(super) fn retry_action(&mut self, b: u32, action: Action) {
        let buyer = &mut self.buyers[b as usize];
        buyer.action_tries += 1;
        if buyer.action_tries < ACTION_TRIES_MAX {
            let at = self.now_us + self.scenario.buyers.retry_after_ms.max(1) * 1_000;
            self.queue.push(at, Event::Act(b, action));
        } else {
            self.done(false);
        }
    }
}
