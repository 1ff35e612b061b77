//! The agent's part in the per-user limit across regions, played as
//! `region-agent/src/borrows.rs` plays it: borrowing a user's place from
//! their home region before the owner decides their hold here, and lending
//! the places of this region's own users to the regions where they buy
//! (docs/protocol.md, "Per-user limit across regions").
//!
//! Who needs a borrow is escrow-core's [`judge`], with the regions the last
//! directive named. A borrow is written as asked (one commit), then sent at
//! once in a limits call of its own (one call out at a time; what gathers
//! meanwhile goes in the next) and with every sync until it is answered; the
//! buyer waits for the answer up to the queue wait. Lent, the request goes
//! to the owner with the borrow on its hold, and the place goes home unless
//! the hold is made; refused, the buyer hears USER_LIMIT. As a home, the
//! loans asked of this region are written one commit at a time (the
//! database's index decides them), and their answers are sent at once and
//! with every sync until one is answered.

use std::collections::{BTreeMap, HashMap};

use escrow_core::owner::Ticket;
use escrow_core::protocol::{Borrow, LendAnswer, LimitsDown, LimitsUp};
use escrow_core::user_limit::{judge, Judge};
use escrow_core::{RegionName, TransferId, UserId};

use super::{request_key, Agent, Answer, Effect, Timer};
use crate::network::Payload;

/// What the agent keeps in memory of borrows and loans: lost in a crash
/// (the database keeps the rest).
#[derive(Debug, Default)]
pub(super) struct Borrowing {
    /// The SKU's regions under a global limit, from the last directive:
    /// empty until one came, and nobody can judge meanwhile.
    pub(super) regions: Vec<RegionName>,
    /// The next borrow's number in this incarnation.
    next: u64,
    /// Buyers waiting for their borrow's answer, by borrow id.
    waiting: BTreeMap<TransferId, Waiting>,
    /// The borrow each reserve in the owner's hands holds on, by ticket.
    holding_on: HashMap<Ticket, TransferId>,
    /// What the next limits call carries.
    outgoing: LimitsUp,
    /// The limits call out, if any.
    call: Option<u64>,
    /// As a home: loans asked, and loans asked back, for the next write.
    to_lend: BTreeMap<TransferId, Borrow>,
    to_take_back: BTreeMap<TransferId, Borrow>,
    /// As a home: the loans being written (asked, asked back).
    writing: Option<(Vec<Borrow>, Vec<Borrow>)>,
    /// As a home: loans decided and loans back, until a sync that carried
    /// them is answered.
    answers: Vec<LendAnswer>,
    returned: Vec<TransferId>,
}

/// A buyer waiting for the answer to their borrow.
#[derive(Debug)]
struct Waiting {
    buyer: u32,
    user: UserId,
    qty: u64,
    borrow: Borrow,
}

impl Agent {
    /// Who judges `user`'s hold here: escrow-core's [`judge`] with the
    /// SKU's scope and the regions the last directive named.
    pub(super) fn judge(&self, user: &UserId) -> Judge {
        let scope = self.owner.settings().user_limit_scope;
        judge(scope, user, &self.region, &self.borrowing.regions)
    }

    fn borrow_id(&self, n: u64) -> TransferId {
        TransferId::parse(&format!("b-{}-{}-{n}", self.region, self.epoch))
            .expect("b-, a region name and two numbers make a valid id")
    }

    /// Buyer `buyer` (user `user`, `qty` units) is at home in `home`: their
    /// place is borrowed from there first, the ask written before it
    /// leaves. A region whose link is down answers PAUSED at once.
    pub(super) fn borrow(
        &mut self,
        now_us: u64,
        buyer: u32,
        user: UserId,
        qty: u64,
        home: RegionName,
        out: &mut Vec<Effect>,
    ) {
        if self.link_down {
            return out.push(Effect::Answer {
                buyer,
                at_us: now_us + self.cfg.gate_us,
                answer: Answer::Paused,
                borrowed: false,
            });
        }
        let n = self.borrowing.next;
        self.borrowing.next += 1;
        let borrow = Borrow {
            id: self.borrow_id(n),
            tenant: self.tenant.clone(),
            sku: self.db.book.sku.clone(),
            user_id: user.clone(),
            home,
        };
        let waiting = Waiting {
            buyer,
            user,
            qty,
            borrow,
        };
        self.borrowing
            .waiting
            .insert(waiting.borrow.id.clone(), waiting);
        out.push(Effect::Commit {
            region: self.index,
            epoch: self.epoch,
            from_us: now_us,
            cpu_us: self.cfg.commit_row_us,
            wait_us: self.cfg.commit_us,
            done: Timer::BorrowWritten(n),
        });
    }

    /// Borrow `n` is written as asked: it leaves now, and its buyer waits
    /// for the answer up to the queue wait.
    pub(super) fn borrow_written(&mut self, now_us: u64, n: u64, out: &mut Vec<Effect>) {
        let id = self.borrow_id(n);
        let Some(w) = self.borrowing.waiting.get(&id) else {
            return;
        };
        let borrow = w.borrow.clone();
        self.db.ask_borrow(borrow.clone(), request_key(w.buyer));
        let wait_us = self.cfg.wait_timeout_ms * 1_000;
        out.push(self.timer(now_us + wait_us, Timer::BorrowTimeout(n)));
        let up = LimitsUp {
            asks: vec![borrow],
            ..LimitsUp::default()
        };
        self.send_limits(now_us, up, out);
    }

    /// Borrow `n` got no answer within the queue wait: its place goes
    /// home, its buyer is told PAUSED.
    pub(super) fn borrow_timed_out(&mut self, now_us: u64, n: u64, out: &mut Vec<Effect>) {
        let id = self.borrow_id(n);
        let Some(w) = self.borrowing.waiting.remove(&id) else {
            return;
        };
        self.stats.borrows_unanswered += 1;
        self.db.give_back(&id);
        self.request_sync(now_us, out);
        out.push(Effect::Answer {
            buyer: w.buyer,
            at_us: now_us,
            answer: Answer::Paused,
            borrowed: false,
        });
    }

    /// The home answered borrow `id`: lent, its request goes to the owner
    /// on the borrowed place; refused, the user holds (or has lent) their
    /// place already. An answer nobody waits for is an old one.
    fn borrow_answered(&mut self, now_us: u64, id: &TransferId, lent: bool, out: &mut Vec<Effect>) {
        let Some(w) = self.borrowing.waiting.remove(id) else {
            return;
        };
        if lent {
            self.stats.borrows_lent += 1;
            return self.enqueue(now_us, w.buyer, w.user, w.qty, Some(id.clone()), out);
        }
        self.stats.borrows_refused += 1;
        self.db.give_back(id);
        // The key's own hold may be what holds the place.
        let answer = if self.db.book.get(&request_key(w.buyer)).is_some() {
            Answer::Replay
        } else {
            Answer::UserLimit
        };
        out.push(Effect::Answer {
            buyer: w.buyer,
            at_us: now_us,
            answer,
            borrowed: false,
        });
    }

    /// The reserve of `ticket` holds on borrow `id` while the owner decides it.
    pub(super) fn hold_on(&mut self, ticket: Ticket, id: TransferId) {
        self.borrowing.holding_on.insert(ticket, id);
    }

    /// The owner answered the reserve of `ticket`: a place it borrowed
    /// goes home unless the hold was made. Whether the hold is on a
    /// borrowed place.
    pub(super) fn settle_borrow(
        &mut self,
        now_us: u64,
        ticket: Ticket,
        held: bool,
        out: &mut Vec<Effect>,
    ) -> bool {
        let Some(id) = self.borrowing.holding_on.remove(&ticket) else {
            return false;
        };
        if !held {
            self.give_back(now_us, &id, out);
        }
        held
    }

    /// Gives back borrow `id`, which no hold uses; a sync carries it home.
    pub(super) fn give_back(&mut self, now_us: u64, id: &TransferId, out: &mut Vec<Effect>) {
        self.db.give_back(id);
        self.request_sync(now_us, out);
    }

    /// Has `up` sent at once in a limits call, ahead of the sync (which is
    /// asked for too, and carries everything again).
    fn send_limits(&mut self, now_us: u64, up: LimitsUp, out: &mut Vec<Effect>) {
        self.request_sync(now_us, out);
        self.borrowing.outgoing.gather(up);
        self.limits_call(now_us, out);
    }

    /// Sends what was gathered, unless a limits call is out.
    fn limits_call(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if self.borrowing.call.is_some() || self.borrowing.outgoing.is_empty() {
            return;
        }
        let up = std::mem::take(&mut self.borrowing.outgoing);
        self.call_seq += 1;
        let call = self.call_seq;
        self.borrowing.call = Some(call);
        self.send(now_us, call, Payload::Limits(up), out);
        out.push(self.timer(
            now_us + self.client_timeout_us(),
            Timer::LimitsTimeout(call),
        ));
    }

    /// The coordinator answered a limits call (an answer to another call is dropped).
    pub fn on_limits_reply(
        &mut self,
        now_us: u64,
        call: u64,
        down: &LimitsDown,
        out: &mut Vec<Effect>,
    ) {
        if self.borrowing.call != Some(call) {
            return;
        }
        self.borrowing.call = None;
        self.apply_limits(now_us, down, out);
        self.limits_call(now_us, out);
        self.pump(now_us, out);
    }

    /// A limits call got no answer: it cost time, never a place (the
    /// next sync carries the same again).
    pub(super) fn limits_failed(&mut self, now_us: u64, call: u64, out: &mut Vec<Effect>) {
        if self.borrowing.call != Some(call) {
            return;
        }
        self.borrowing.call = None;
        self.limits_call(now_us, out);
    }

    /// Whether `call` is the limits call out.
    pub(super) fn is_limits_call(&self, call: u64) -> bool {
        self.borrowing.call == Some(call)
    }

    /// Applies the coordinator's side of borrows and loans (a sync's
    /// answer, a watch's or a limits call's): wakes borrowers with their
    /// answers, forgets borrows that are home, and has the loans asked of
    /// this region as a home, or asked back, written.
    pub(super) fn apply_limits(&mut self, now_us: u64, down: &LimitsDown, out: &mut Vec<Effect>) {
        for answer in &down.answers {
            self.borrow_answered(now_us, &answer.id, answer.lent, out);
        }
        self.db.forget_borrows(&down.returned);
        for ask in &down.lend_asks {
            self.borrowing.to_lend.insert(ask.id.clone(), ask.clone());
        }
        for loan in &down.lend_returns {
            self.borrowing
                .to_take_back
                .insert(loan.id.clone(), loan.clone());
        }
        self.write_loans(now_us, out);
    }

    /// Starts writing the loans waiting, one write at a time: two writes
    /// of the same loans in different orders would deadlock in the real
    /// database.
    fn write_loans(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        let b = &mut self.borrowing;
        if b.writing.is_some() || (b.to_lend.is_empty() && b.to_take_back.is_empty()) {
            return;
        }
        let asks: Vec<Borrow> = std::mem::take(&mut b.to_lend).into_values().collect();
        let backs: Vec<Borrow> = std::mem::take(&mut b.to_take_back).into_values().collect();
        let rows = (asks.len() + backs.len()) as u64;
        b.writing = Some((asks, backs));
        out.push(Effect::Commit {
            region: self.index,
            epoch: self.epoch,
            from_us: now_us,
            cpu_us: rows * self.cfg.commit_row_us,
            wait_us: self.cfg.commit_us,
            done: Timer::LoansWritten,
        });
    }

    /// The loans are written (the database decided each): their answers
    /// leave at once, and wait for the next sync too.
    pub(super) fn loans_written(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        let Some((asks, backs)) = self.borrowing.writing.take() else {
            return;
        };
        let mut decided = LimitsUp::default();
        for ask in &asks {
            let answer = LendAnswer {
                id: ask.id.clone(),
                lent: self.db.lend(ask),
            };
            // The newest answer of an id is the database's.
            let kept = &mut self.borrowing.answers;
            kept.retain(|a| a.id != answer.id);
            kept.push(answer.clone());
            decided.answers.push(answer);
        }
        for loan in &backs {
            self.db.take_back(loan);
            if !self.borrowing.returned.contains(&loan.id) {
                self.borrowing.returned.push(loan.id.clone());
            }
            decided.returned.push(loan.id.clone());
        }
        self.send_limits(now_us, decided, out);
        self.write_loans(now_us, out);
    }

    /// What the next sync says of borrows and loans: the database's asks
    /// and returns, and the loans decided or back since the last sync
    /// answered.
    pub(super) fn limits_to_send(&self) -> LimitsUp {
        LimitsUp {
            asks: self.db.borrow_asks(),
            returns: self.db.borrow_returns(),
            answers: self.borrowing.answers.clone(),
            returned: self.borrowing.returned.clone(),
        }
    }

    /// A sync carrying `sent` was answered: its loan answers and loans
    /// back are with the coordinator.
    pub(super) fn limits_sent(&mut self, sent: &LimitsUp) {
        self.borrowing
            .answers
            .retain(|a| !sent.answers.iter().any(|s| s.id == a.id));
        self.borrowing
            .returned
            .retain(|id| !sent.returned.contains(id));
    }

    /// The buyers waiting for a borrow's answer (a crash answers them).
    pub(super) fn buyers_borrowing(&self) -> impl Iterator<Item = u32> + '_ {
        self.borrowing.waiting.values().map(|w| w.buyer)
    }
}
