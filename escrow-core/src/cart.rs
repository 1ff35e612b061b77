//! A cart: several SKUs of one tenant held together in one region under
//! one request key and one expiry, all or nothing.
//!
//! Each item is decided by its SKU's owner, which sets the units aside in
//! memory ([`crate::owner::Command::SetAside`]) without writing; once every
//! item is set aside, the cart is written in one transaction
//! ([`CartCommit`]): the cart's row and one HELD reservation row per item
//! (keyed [`RequestKey::cart_item`]), with every SKU's counters. If any item
//! cannot be held, nothing is written and the units set aside are let go.
//!
//! A cart has one status for all its items. Its items are never expired,
//! confirmed or released one by one: the cart decides with the rules every
//! hold follows ([`Lifecycle`]) and one commit moves the cart's row and all
//! its items' rows, guarded by the cart row's status and expiry, so a
//! confirm racing the expiry settles every item the same way, once.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::admission::Deadline;
use crate::batch::{Batch, NewHold};
use crate::ids::{Qty, RequestKey, Sku, Tenant, TransferId, TtlMs, UserId};
use crate::owner::ReserveReply;
use crate::reservation::{Lifecycle, Status, Transition, Verdict};

/// Most items one cart holds.
pub const ITEMS_MAX: usize = 20;

/// One line of a cart: a SKU and its units.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct CartItem {
    /// The SKU.
    pub sku: Sku,
    /// Units of it.
    pub qty: Qty,
}

/// Why a cart's items are refused before anything is decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CartError {
    /// No item at all.
    #[error("a cart holds at least one item")]
    Empty,
    /// More than [`ITEMS_MAX`] items.
    #[error("a cart holds at most {ITEMS_MAX} items")]
    TooMany,
    /// The same SKU twice.
    #[error("SKU {0} is in the cart twice")]
    Duplicate(Sku),
}

/// The items of a cart as it is held: checked, and in SKU order (the order
/// its rows are written and shown in, so two carts never lock two SKUs'
/// counter rows in opposite orders).
pub fn checked_items(mut items: Vec<CartItem>) -> Result<Vec<CartItem>, CartError> {
    if items.is_empty() {
        return Err(CartError::Empty);
    }
    if items.len() > ITEMS_MAX {
        return Err(CartError::TooMany);
    }
    items.sort();
    let mut seen = BTreeSet::new();
    for item in &items {
        if !seen.insert(&item.sku) {
            return Err(CartError::Duplicate(item.sku.clone()));
        }
    }
    Ok(items)
}

/// A cart as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cart {
    /// The buyer's key for the whole cart.
    pub request_key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// Where the cart, and so each of its items, stands.
    pub lifecycle: Lifecycle,
    /// Its items, in SKU order ([`checked_items`]).
    pub items: Vec<CartItem>,
    /// The places its items hold on, borrowed from the user's home region
    /// under a global per-user limit, by SKU: the cart's first commit
    /// marks them used. Not stored with the cart.
    pub borrows: BTreeMap<Sku, TransferId>,
}

impl Cart {
    /// A new cart of checked `items`, held until `expires_at_ms`.
    pub fn held(
        request_key: RequestKey,
        user_id: UserId,
        items: Vec<CartItem>,
        expires_at_ms: u64,
    ) -> Self {
        Self {
            request_key,
            user_id,
            lifecycle: Lifecycle {
                status: Status::Held,
                expires_at_ms,
                extended: false,
            },
            items,
            borrows: BTreeMap::new(),
        }
    }

    /// The key `sku`'s item is stored under.
    pub fn item_key(&self, sku: &Sku) -> RequestKey {
        RequestKey::cart_item(&self.request_key, sku)
    }

    /// Whether a request for `user_id` and checked `items` is this cart's
    /// own (a replay) rather than another use of its key.
    pub fn is_same_request(&self, user_id: &UserId, items: &[CartItem]) -> bool {
        self.user_id == *user_id && self.items == items
    }

    /// One batch per item (in item order) inserting the item's hold, as
    /// the cart's first commit writes them.
    pub fn holds(&self, tenant: &Tenant, now_ms: u64) -> Vec<Batch> {
        self.items
            .iter()
            .map(|item| {
                let mut batch = Batch::new(tenant.clone(), item.sku.clone(), now_ms);
                batch.holds.push(NewHold {
                    request_key: self.item_key(&item.sku),
                    user_id: self.user_id.clone(),
                    qty: item.qty,
                    expires_at_ms: self.lifecycle.expires_at_ms,
                    borrow: self.borrows.get(&item.sku).cloned(),
                });
                batch
            })
            .collect()
    }

    /// One batch per item (in item order) making `change` on the item's
    /// row, as a committed transition of the cart moves them all.
    pub fn moves(&self, tenant: &Tenant, now_ms: u64, change: Transition) -> Vec<Batch> {
        self.items
            .iter()
            .map(|item| {
                let mut batch = Batch::new(tenant.clone(), item.sku.clone(), now_ms);
                batch
                    .transitions
                    .push((self.item_key(&item.sku), item.qty, change));
                batch
            })
            .collect()
    }

    /// What a buyer's action (or the expiry, with `None`) does to the cart
    /// at `now_ms`: the same rules as for one reservation.
    pub fn decide(&self, action: Option<CartAction>, now_ms: u64, default_ttl: TtlMs) -> Verdict {
        match action {
            None => self.lifecycle.expire(now_ms),
            Some(CartAction::Confirm) => self.lifecycle.confirm(now_ms),
            Some(CartAction::Release) => self.lifecycle.release(now_ms),
            Some(CartAction::Extend(ttl)) => {
                self.lifecycle.extend(now_ms, ttl.unwrap_or(default_ttl))
            }
        }
    }
}

/// A buyer's action on a whole cart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CartAction {
    /// HELD -> SOLD, every item.
    Confirm,
    /// HELD -> RELEASED, every item.
    Release,
    /// A later expiry for every item, once.
    Extend(Option<TtlMs>),
}

/// What a cart commit does to the cart's own row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CartStep {
    /// Insert it, HELD, unless its key is taken.
    Create,
    /// Make this transition, if the row is still HELD and (un)expired as
    /// the transition requires.
    Move(Transition),
}

/// Everything one cart commit writes, in one transaction: the cart's row
/// and its items' batches.
#[derive(Debug, Clone, PartialEq)]
pub struct CartCommit {
    /// The cart's tenant.
    pub tenant: Tenant,
    /// The cart as it is after the commit.
    pub cart: Cart,
    /// What happens to its row.
    pub step: CartStep,
    /// The items' rows and counters, one batch per item in item order.
    pub items: Vec<Batch>,
    /// The decision's time, ms since the epoch.
    pub now_ms: u64,
}

impl CartCommit {
    /// The first commit of a new cart.
    pub fn create(tenant: &Tenant, cart: Cart, now_ms: u64) -> Self {
        Self {
            tenant: tenant.clone(),
            items: cart.holds(tenant, now_ms),
            cart,
            step: CartStep::Create,
            now_ms,
        }
    }

    /// A transition of a held cart; `cart` is as it was before it.
    pub fn transition(tenant: &Tenant, mut cart: Cart, change: Transition, now_ms: u64) -> Self {
        let items = cart.moves(tenant, now_ms, change);
        cart.lifecycle.apply(change);
        Self {
            tenant: tenant.clone(),
            cart,
            step: CartStep::Move(change),
            items,
            now_ms,
        }
    }
}

/// How a cart commit ended, when the database answered and wrote what it
/// was asked to, or nothing of this cart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CartWritten {
    /// Everything was written.
    Written,
    /// Nothing of this cart was written: its row was not as the step needs
    /// it (its key taken, or the cart moved meanwhile).
    Refused,
}

/// The cart's answer from its items' answers (in item order, `None` for
/// an item that could be held): `None` when every item could, else the
/// first item that could not and what it was told. A pause or a full
/// queue outranks a sold out item: the buyer retries, and sold out is only
/// said when it is true of the cart whatever the pause hides.
pub fn first_refusal(replies: &[Option<ReserveReply>]) -> Option<(usize, ReserveReply)> {
    let transient = |reply: &Option<ReserveReply>| {
        matches!(
            reply,
            Some(ReserveReply::Paused(_) | ReserveReply::QueueFull | ReserveReply::WaitTimeout)
        )
    };
    let index = replies
        .iter()
        .position(transient)
        .or_else(|| replies.iter().position(Option::is_some))?;
    replies[index].clone().map(|reply| (index, reply))
}

/// Longest a cart holding units aside waits for its next item, ms: while
/// it waits, buyers of the SKUs it holds units of may be waiting for those
/// units (they are neither free nor gone). About a move from the farthest
/// region: an item that takes longer is not coming soon, and the cart lets
/// its units go and is refused (`REJECTED_WAIT_TIMEOUT`, retried like any other).
/// With the whole queue wait instead (2 s), single buyers of a SKU whose
/// last units were set aside for carts waiting on another, short SKU waited
/// out their own queue wait and were refused (docs/simulations.md, "Carts").
pub const ASIDE_WAIT_MS: u64 = 500;

/// A cart's items asked of their owners one at a time, in item (SKU)
/// order, the next once the one before is set aside: a cart waits for an
/// item only while it holds items of lower SKUs, so no two carts wait for
/// each other's units, and a refused item ends the attempt without asking
/// the rest. What the agent and the simulator ask next, and until when
/// ([`ItemAnswers::deadline`]), is this.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemAnswers {
    items: usize,
    replies: Vec<ReserveReply>,
}

/// What a cart's attempt does next ([`ItemAnswers::next`]).
#[derive(Debug, Clone, PartialEq)]
pub enum NextItem {
    /// Ask the owner of the item of this index.
    Ask(usize),
    /// The item of this index was refused with this answer: the cart is.
    Refused(usize, ReserveReply),
    /// Every item is set aside: write the cart.
    AllSetAside,
}

impl ItemAnswers {
    /// An attempt at a cart of `items` items, none asked yet.
    pub fn new(items: usize) -> Self {
        Self {
            items,
            replies: Vec::with_capacity(items),
        }
    }

    /// The answer of the item asked last; then what to do next.
    pub fn answer(&mut self, reply: ReserveReply) -> NextItem {
        assert!(
            self.replies.len() < self.items,
            "an answer to an item asked"
        );
        self.replies.push(reply);
        self.next()
    }

    /// What to do next, from the answers so far.
    pub fn next(&self) -> NextItem {
        match self.replies.last() {
            Some(ReserveReply::Held(_)) | None if self.replies.len() < self.items => {
                NextItem::Ask(self.replies.len())
            }
            Some(ReserveReply::Held(_)) | None => NextItem::AllSetAside,
            Some(refusal) => NextItem::Refused(self.replies.len() - 1, refusal.clone()),
        }
    }

    /// How long the item asked next may wait in its owner's queue, asked
    /// at `now_ms` in a cart that must be answered by `cart`: the first
    /// item until then, each later one (its cart holding units aside) at
    /// most [`ASIDE_WAIT_MS`] more.
    pub fn deadline(&self, cart: Deadline, now_ms: u64) -> Deadline {
        if self.replies.is_empty() {
            return cart;
        }
        Deadline {
            at_ms: cart.at_ms.min(now_ms.saturating_add(ASIDE_WAIT_MS)),
        }
    }

    /// Per item asked, in order, whether its units are set aside.
    pub fn set_aside(&self) -> Vec<bool> {
        self.replies
            .iter()
            .map(|reply| matches!(reply, ReserveReply::Held(_)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::PauseReason;

    fn item(sku: &str, qty: u32) -> CartItem {
        CartItem {
            sku: Sku::parse(sku).unwrap(),
            qty: Qty::from_stored(qty),
        }
    }

    /// Goal: a cart holds 1 to 20 distinct SKUs, kept in SKU order.
    #[test]
    fn items_are_checked_and_sorted() {
        assert_eq!(checked_items(vec![]), Err(CartError::Empty));
        let many: Vec<CartItem> = (0..=ITEMS_MAX).map(|i| item(&format!("s{i}"), 1)).collect();
        assert_eq!(checked_items(many), Err(CartError::TooMany));
        assert_eq!(
            checked_items(vec![item("b", 1), item("a", 2), item("b", 3)]),
            Err(CartError::Duplicate(Sku::parse("b").unwrap()))
        );
        assert_eq!(
            checked_items(vec![item("b", 1), item("a", 2)]).unwrap(),
            vec![item("a", 2), item("b", 1)]
        );
    }

    /// Goal: a cart's items are stored under keys no buyer can send, and
    /// one commit moves every item the same way.
    #[test]
    fn a_transition_moves_every_item() {
        let key = RequestKey::parse("c-1").unwrap();
        let items = checked_items(vec![item("b", 1), item("a", 2)]).unwrap();
        let cart = Cart::held(key, UserId::parse("u").unwrap(), items, 1_000);
        assert_eq!(cart.item_key(&Sku::parse("a").unwrap()).as_str(), "c-1/a");
        assert!(RequestKey::parse("c-1/a").is_err());
        let tenant = Tenant::parse("t").unwrap();
        assert_eq!(
            cart.decide(Some(CartAction::Confirm), 999, TtlMs::parse(5_000).unwrap())
                .change,
            Some(Transition::Confirm)
        );
        let commit = CartCommit::transition(&tenant, cart, Transition::Confirm, 999);
        assert_eq!(commit.cart.lifecycle.status, Status::Sold);
        assert_eq!(commit.items.len(), 2);
        assert!(commit
            .items
            .iter()
            .all(|b| b.transitions.len() == 1 && b.transitions[0].2 == Transition::Confirm));
    }

    /// An item's units set aside.
    fn held() -> ReserveReply {
        ReserveReply::Held(crate::reservation::Reservation {
            request_key: RequestKey::parse("k").unwrap(),
            user_id: UserId::parse("u").unwrap(),
            sku: Sku::parse("a").unwrap(),
            qty: Qty::from_stored(1),
            status: Status::Held,
            expires_at_ms: 1,
            extended: false,
        })
    }

    /// Goal: items are asked one after the other; the first refusal ends
    /// the attempt, naming its item; every item set aside ends it too.
    #[test]
    fn items_are_asked_in_turn_until_one_is_refused() {
        let mut answers = ItemAnswers::new(3);
        assert_eq!(answers.next(), NextItem::Ask(0));
        assert_eq!(answers.answer(held()), NextItem::Ask(1));
        assert_eq!(
            answers.answer(ReserveReply::SoldOut),
            NextItem::Refused(1, ReserveReply::SoldOut)
        );
        assert_eq!(answers.set_aside(), vec![true, false]);
        let mut answers = ItemAnswers::new(2);
        answers.answer(held());
        assert_eq!(answers.answer(held()), NextItem::AllSetAside);
        assert_eq!(answers.set_aside(), vec![true, true]);
    }

    /// Goal: the first item may wait as long as the cart; a later one, its
    /// cart holding units aside, at most ASIDE_WAIT_MS, and never past the
    /// cart's deadline.
    #[test]
    fn a_cart_holding_units_aside_waits_briefly_for_the_next() {
        let cart = Deadline::after(1_000, 2_000);
        let mut answers = ItemAnswers::new(3);
        assert_eq!(answers.deadline(cart, 1_000), cart);
        answers.answer(held());
        assert_eq!(answers.deadline(cart, 1_200).at_ms, 1_200 + ASIDE_WAIT_MS);
        assert_eq!(answers.deadline(cart, 2_900), cart);
    }

    /// Goal: a transient refusal of any item is what the cart is told,
    /// before a sold out item (which may sell again once the pause ends).
    #[test]
    fn a_pause_outranks_sold_out() {
        let replies = [
            None,
            Some(ReserveReply::SoldOut),
            Some(ReserveReply::Paused(PauseReason::Storage)),
        ];
        assert_eq!(
            first_refusal(&replies),
            Some((2, ReserveReply::Paused(PauseReason::Storage)))
        );
        assert_eq!(
            first_refusal(&[None, Some(ReserveReply::SoldOut)]),
            Some((1, ReserveReply::SoldOut))
        );
        assert_eq!(first_refusal(&[None, None]), None);
    }
}
