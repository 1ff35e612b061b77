//! The crowd in the world: buyers arrive, reserve, retry, confirm or
//! release, and what their answers count for (served, turned away while
//! units were free, order inversions).

use super::*;
use crate::demand::user_id;

impl World {
    pub(super) fn on_arrival(&mut self, r: usize) {
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

    pub(super) fn choices(&self, b: u32) -> crate::demand::Choices {
        choices(
            self.stream_seed,
            b,
            &self.scenario.buyers,
            self.scenario.sku.max_per_user,
            self.scenario.demand.multi_unit_share,
        )
    }

    pub(super) fn attempt(&mut self, b: u32) {
        let buyer = &mut self.buyers[b as usize];
        buyer.attempts = buyer.attempts.saturating_add(1);
        buyer.started_us = self.now_us;
        let r = buyer.region as usize;
        let qty = u64::from(buyer.qty);
        self.rec.attempt(r);
        if self.agents[r].up {
            let user = user_id(&self.scenario.buyers, b, &self.scenario.regions[r].name);
            self.agents[r].reserve(self.now_us, b, user, qty, &mut self.effects);
            self.apply_effects();
        } else {
            self.on_answer(b, self.now_us, Answer::Unreachable, false);
        }
    }

    /// Buyer `b`'s reserve was answered at `at_us`; `borrowed` says a
    /// HELD is on a place borrowed from the user's home region.
    pub(super) fn on_answer(&mut self, b: u32, at_us: u64, answer: Answer, borrowed: bool) {
        let buyer = self.buyers[b as usize];
        let r = buyer.region as usize;
        self.rec
            .answer(r, answer, at_us.saturating_sub(buyer.started_us));
        match answer {
            Answer::Held => {
                // A buyer sends its first request on arrival (`on_arrival`).
                self.rec
                    .hold_wait(r, at_us.saturating_sub(buyer.arrived_us));
                if borrowed {
                    self.rec.borrowed_hold(r);
                }
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
                let free = self.free_units();
                if free > 0 {
                    self.rec.false_sold_out(r);
                }
                let none_ended = self.released_holds == 0
                    && self.agents.iter().all(|a| a.stats.expired_units == 0);
                if free >= u64::from(buyer.qty) && none_ended {
                    self.unfounded_sold_outs += 1;
                }
                self.retry_or_give_up(b, at_us, true);
            }
            Answer::Paused | Answer::QueueFull | Answer::WaitTimeout | Answer::Unreachable => {
                self.retry_or_give_up(b, at_us, false)
            }
        }
    }

    pub(super) fn retry_or_give_up(&mut self, b: u32, at_us: u64, sold_out: bool) {
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

    pub(super) fn done(&mut self, b: u32, turned_away: bool) {
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

    pub(super) fn after_hold(&mut self, b: u32, at_us: u64) {
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
    pub(super) fn retry_action(&mut self, b: u32, event: Event) {
        let buyer = &mut self.buyers[b as usize];
        buyer.action_tries += 1;
        if buyer.action_tries < ACTION_TRIES_MAX {
            let at = self.now_us + self.scenario.buyers.retry_after_ms.max(1) * 1_000;
            self.queue.push(at, event);
        } else {
            self.done(b, false);
        }
    }

    pub(super) fn on_confirm(&mut self, b: u32) {
        self.request_action(b, BuyerAction::Confirm);
    }

    pub(super) fn on_release(&mut self, b: u32) {
        self.request_action(b, BuyerAction::Release);
    }

    pub(super) fn request_action(&mut self, b: u32, action: BuyerAction) {
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
    pub(super) fn on_acted(&mut self, b: u32, action: BuyerAction, reply: ActReply) {
        let qty = u64::from(self.buyers[b as usize].qty);
        match (action, reply) {
            // An extend only keeps the hold; its answer changes nothing for the buyer.
            (BuyerAction::Extend, _) => {}
            (_, ActReply::Paused(_) | ActReply::WaitTimeout) => {
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
}

/// The event that asks for `action` again.
fn action_event(b: u32, action: BuyerAction) -> Event {
    match action {
        BuyerAction::Confirm => Event::Confirm(b),
        BuyerAction::Release => Event::Release(b),
        BuyerAction::Extend => Event::Extend(b),
    }
}
