//! What buyers ask an agent and what they are answered: the [`Answer`]s
//! and [`BuyerAction`]s, the owner's tickets that name them, the HTTP
//! handler's gate and queue in front of the owner, and the owner's replies
//! handed back.

use escrow_core::owner::{
    gate, ActReply, Action, Command, Reply, ReserveReply, ReserveRequest, Ticket,
};
use escrow_core::user_limit::Judge;
use escrow_core::{Deadline, Qty, TransferId, UserId};

use super::{now_ms, request_key, Agent, Effect};

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
    /// The answer a buyer hears for the owner's `reply`.
    pub fn of(reply: &ReserveReply) -> Self {
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

/// Tickets name the buyer and what they asked: two low bits for the kind.
fn ticket(buyer: u32, kind: u64) -> Ticket {
    (u64::from(buyer) << 2) | kind
}

const KIND_RESERVE: u64 = 0;

/// The ticket of buyer `buyer`'s reserve request.
pub(super) fn reserve_ticket(buyer: u32) -> Ticket {
    ticket(buyer, KIND_RESERVE)
}

fn action_kind(action: BuyerAction) -> u64 {
    match action {
        BuyerAction::Confirm => 1,
        BuyerAction::Release => 2,
        BuyerAction::Extend => 3,
    }
}

pub(super) fn decode(t: Ticket) -> (u32, Option<BuyerAction>) {
    let buyer = u32::try_from(t >> 2).expect("tickets are made from u32 buyers");
    let action = match t & 3 {
        1 => Some(BuyerAction::Confirm),
        2 => Some(BuyerAction::Release),
        3 => Some(BuyerAction::Extend),
        _ => None,
    };
    (buyer, action)
}

pub(super) fn command_ticket(c: &Command) -> Ticket {
    match c {
        Command::Reserve { ticket, .. }
        | Command::Act { ticket, .. }
        | Command::Admin { ticket, .. }
        | Command::SetAside { ticket, .. } => *ticket,
    }
}

impl Agent {
    /// Buyer `buyer`, user `user`, asks for `qty` units: the HTTP
    /// handler's gate, then the owner's queue; a user at home elsewhere
    /// under a global per-user limit borrows their place first.
    pub fn reserve(
        &mut self,
        now_us: u64,
        buyer: u32,
        user: UserId,
        qty: u64,
        out: &mut Vec<Effect>,
    ) {
        assert!(self.up, "a down agent takes no requests");
        let gate_us = now_us + self.cfg.gate_us;
        if let Some(reply) = gate(&self.owner.gate_view(self.link_down), qty) {
            return out.push(Effect::Answer {
                buyer,
                at_us: gate_us,
                answer: Answer::of(&reply),
                borrowed: false,
            });
        }
        match self.judge(&user) {
            Judge::Here => self.enqueue(now_us, buyer, user, qty, None, out),
            Judge::Home(home) => self.borrow(now_us, buyer, user, qty, home, out),
            // The regions are not known yet: nobody can judge.
            Judge::Unknown => out.push(Effect::Answer {
                buyer,
                at_us: gate_us,
                answer: Answer::Paused,
                borrowed: false,
            }),
        }
    }

    /// Queues buyer `buyer`'s request for the owner, on the place
    /// `borrow` if it borrowed one; a full queue refuses it (and the
    /// place goes home).
    pub(super) fn enqueue(
        &mut self,
        now_us: u64,
        buyer: u32,
        user: UserId,
        qty: u64,
        borrow: Option<TransferId>,
        out: &mut Vec<Effect>,
    ) {
        if self.queue.len() >= self.cfg.max_waiting {
            if let Some(id) = &borrow {
                self.give_back(now_us, id, out);
            }
            return out.push(Effect::Answer {
                buyer,
                at_us: now_us + self.cfg.gate_us,
                answer: Answer::QueueFull,
                borrowed: false,
            });
        }
        let ticket = reserve_ticket(buyer);
        if let Some(id) = &borrow {
            self.hold_on(ticket, id.clone());
        }
        let max_per_user = self.owner.settings().max_per_user;
        let request = ReserveRequest {
            borrow,
            request_key: request_key(buyer),
            user_id: user,
            qty: Qty::parse(qty as i64, max_per_user).expect("buyers ask for 1..=max_per_user"),
            ttl: None,
        };
        self.queue.push_back(Command::Reserve {
            ticket,
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

    /// Hands the owner's answers to the world.
    pub(super) fn deliver(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        while let Some((t, reply)) = self.owner.poll_reply() {
            self.waiting.remove(&t);
            if super::carts::cart_attempt(t).is_some() {
                let Reply::Reserve(reply) = reply else {
                    unreachable!("a cart item is answered as a reserve: {reply:?}")
                };
                out.push(Effect::CartItem {
                    ticket: t,
                    at_us: now_us,
                    reply,
                });
                continue;
            }
            let (buyer, action) = decode(t);
            match (reply, action) {
                (Reply::Reserve(reply), None) => {
                    let answer = Answer::of(&reply);
                    let borrowed = self.settle_borrow(now_us, t, answer == Answer::Held, out);
                    out.push(Effect::Answer {
                        buyer,
                        at_us: now_us,
                        answer,
                        borrowed,
                    });
                }
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
}
