//! The driver of carts: a cart's hold, its transitions and its expiry.
//!
//! Every decision about a cart's units is its items' owners': each sets
//! its item's units aside in memory, deciding as for a reservation (the
//! gate, first fit, a wait for units from elsewhere), one item after the
//! other in SKU order. Only once every item
//! is set aside is the cart written, in one transaction of its own
//! ([`crate::cart_committer`], many carts to a transaction); each owner
//! is then told how it ended
//! ([`CartEnd`]), so its memory follows the database. A cart's
//! transitions (confirm, release, extend, and the expiry) are decided by
//! the cart's one lifecycle and written by one transaction guarded by the
//! cart row, then told to the owners the same way.
//!
//! Each of these runs in a task of its own, never in a request's future:
//! a client that goes away leaves no units set aside.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use escrow_core::cart::{
    first_refusal, Cart, CartAction, CartCommit, CartItem, CartWritten, ItemAnswers, NextItem,
};
use escrow_core::owner::{gate, CartEnd};
use escrow_core::{
    Deadline, RequestKey, Sku, SkuSettings, Status, Tenant, TransferId, Transition, TtlMs, UserId,
};
use tokio::sync::{oneshot, Notify};

use crate::borrows::{place, Place};
use crate::committer::answered;
use crate::owner::{Command, PauseReason, ReserveReply, ReserveRequest};
use crate::state::AppState;
use crate::store::StoreError;

/// Longest the expiry sleeps before it looks again.
const EXPIRY_TICK: Duration = Duration::from_millis(250);

/// How the hold of a cart ended.
#[derive(Debug)]
pub enum HoldReply {
    /// A new cart, committed.
    Held(Cart),
    /// The key's existing cart.
    Replay(Cart),
    /// This item cannot be held: none is free anywhere. Nothing held.
    SoldOut(usize),
    /// This item's user already has its one active reservation of the SKU.
    UserLimit(usize),
    /// The key belongs to another cart or a reservation.
    KeyReused,
    /// Refused unserved or paused, as a reservation would be.
    Refused(ReserveReply),
}

/// How a buyer's action on a cart ended.
#[derive(Debug)]
pub enum ActReply {
    /// Done (or already done); the cart now.
    Accepted(Cart),
    /// Not possible in the cart's state; the cart now.
    Refused(Cart),
    /// No such cart.
    NotFound,
    /// It cannot be written now, for the reason given.
    Paused(PauseReason),
}

/// Held carts by expiry, for the task that expires them.
#[derive(Debug, Default)]
pub struct CartExpiry {
    due: Mutex<BTreeSet<(u64, Tenant, RequestKey)>>,
    changed: Notify,
}

impl CartExpiry {
    /// Watches a held cart.
    pub fn watch(&self, tenant: &Tenant, cart: &Cart) {
        if cart.lifecycle.status == Status::Held {
            let entry = (
                cart.lifecycle.expires_at_ms,
                tenant.clone(),
                cart.request_key.clone(),
            );
            self.due
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(entry);
            self.changed.notify_one();
        }
    }

    /// The held carts due at `now_ms`, no longer watched.
    fn take_due(&self, now_ms: u64) -> Vec<(Tenant, RequestKey)> {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        let mut ripe = Vec::new();
        while due.first().is_some_and(|(at, _, _)| *at <= now_ms) {
            if let Some((_, tenant, key)) = due.pop_first() {
                ripe.push((tenant, key));
            }
        }
        ripe
    }

    fn next_ms(&self) -> Option<u64> {
        let due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        due.first().map(|(at, _, _)| *at)
    }
}

/// Expires held carts as they fall due, for as long as the agent runs:
/// the carts stored held at start, then every cart held or extended since.
pub async fn expire_forever(state: AppState) {
    loop {
        match state.store().held_carts().await {
            Ok(held) => {
                for (tenant, key, expires_at_ms) in held {
                    let mut due = state
                        .cart_expiry()
                        .due
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    due.insert((expires_at_ms, tenant, key));
                }
                break;
            }
            Err(error) => {
                tracing::warn!(%error, "reading held carts failed; trying again");
                tokio::time::sleep(EXPIRY_TICK).await;
            }
        }
    }
    loop {
        let now_ms = state.now_ms();
        for (tenant, key) in state.cart_expiry().take_due(now_ms) {
            if let ActReply::Paused(reason) = act(&state, &tenant, &key, None).await {
                tracing::warn!(%tenant, %key, reason = reason.as_str(),
                    "a due cart could not be expired; trying again");
                let again = (state.now_ms() + EXPIRY_TICK.as_millis() as u64, tenant, key);
                state
                    .cart_expiry()
                    .due
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(again);
            }
        }
        let wait = state.cart_expiry().next_ms().map_or(EXPIRY_TICK, |at| {
            Duration::from_millis(at.saturating_sub(state.now_ms())).min(EXPIRY_TICK)
        });
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = state.cart_expiry().changed.notified() => {}
        }
    }
}

/// A cart to hold: checked items ([`escrow_core::cart::checked_items`]),
/// each of a SKU this agent sells.
#[derive(Debug, Clone)]
pub struct HoldRequest {
    /// The cart's key.
    pub key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// The items, in SKU order.
    pub items: Vec<CartItem>,
    /// The hold's duration: the buyer's, else the shortest of its SKUs'.
    pub ttl: TtlMs,
}

/// Holds a cart, all or nothing, in a task of its own.
pub async fn hold(state: AppState, tenant: Tenant, request: HoldRequest) -> HoldReply {
    tokio::spawn(hold_in_task(state, tenant, request))
        .await
        .unwrap_or(HoldReply::Refused(ReserveReply::Paused(
            PauseReason::Halted,
        )))
}

async fn hold_in_task(state: AppState, tenant: Tenant, request: HoldRequest) -> HoldReply {
    if state.keys().may_know(&tenant, &request.key) {
        match existing(&state, &tenant, &request).await {
            Ok(Some(reply)) => return reply,
            Ok(None) => {}
            Err(_) => return HoldReply::Refused(ReserveReply::Paused(PauseReason::Storage)),
        }
    }
    let link_down = state.link().is_some_and(|l| l.is_down());
    // The gate answers from memory: a sold out item costs no write.
    let gates: Vec<Option<ReserveReply>> = request
        .items
        .iter()
        .map(|item| match state.registry().get(&tenant, &item.sku) {
            Some(handle) => gate(&handle.view.gate_view(link_down), item.qty.units()),
            None => Some(ReserveReply::Paused(PauseReason::Halted)),
        })
        .collect();
    if let Some((index, reply)) = first_refusal(&gates) {
        return refusal(index, reply);
    }
    let borrows = match borrow_places(&state, &tenant, &request).await {
        Ok(borrows) => borrows,
        Err(refused) => return refused,
    };
    let reply = hold_items(&state, &tenant, &request, &borrows).await;
    if !matches!(reply, HoldReply::Held(_)) {
        for id in borrows.values() {
            if let Err(error) = state.borrows().give_back(&state, id).await {
                tracing::warn!(%error, "giving back a cart item's borrowed place failed");
            }
        }
    }
    reply
}

/// The places the cart's items hold on that its user must borrow from
/// their home region (items of SKUs with a global per-user limit, bought
/// away from home), by SKU; or the answer to the whole cart when one of
/// them cannot be had (everything borrowed so far is given back).
async fn borrow_places(
    state: &AppState,
    tenant: &Tenant,
    request: &HoldRequest,
) -> Result<BTreeMap<Sku, TransferId>, HoldReply> {
    let mut borrows = BTreeMap::new();
    let mut refused = None;
    for (index, item) in request.items.iter().enumerate() {
        let Some(handle) = state.registry().get(tenant, &item.sku) else {
            refused = Some(HoldReply::Refused(ReserveReply::Paused(
                PauseReason::Halted,
            )));
            break;
        };
        let key = RequestKey::cart_item(&request.key, &item.sku);
        match place(
            state,
            &handle.view,
            tenant,
            &item.sku,
            &request.user_id,
            &key,
        )
        .await
        {
            Ok(Place::Here) => {}
            Ok(Place::Borrowed(id)) => {
                borrows.insert(item.sku.clone(), id);
            }
            Ok(Place::Taken) => {
                refused = Some(match existing(state, tenant, request).await {
                    Ok(Some(reply)) => reply,
                    Ok(None) => HoldReply::UserLimit(index),
                    Err(_) => HoldReply::Refused(ReserveReply::Paused(PauseReason::Storage)),
                });
                break;
            }
            Err(reason) => {
                refused = Some(HoldReply::Refused(ReserveReply::Paused(reason)));
                break;
            }
        }
    }
    match refused {
        None => Ok(borrows),
        Some(reply) => {
            for id in borrows.values() {
                if let Err(error) = state.borrows().give_back(state, id).await {
                    tracing::warn!(%error, "giving back a cart item's borrowed place failed");
                }
            }
            Err(reply)
        }
    }
}

/// Sets the cart's items aside with their owners, one at a time in SKU
/// order (the next once the one before is set aside), and writes the
/// cart, its items holding on `borrows` where they borrowed. In order,
/// a cart waits for an item only while it holds items of lower SKUs, so
/// two carts never wait for each other's units, and while it holds any
/// it waits briefly (`ItemAnswers::deadline`); a refused item ends the
/// attempt at once.
async fn hold_items(
    state: &AppState,
    tenant: &Tenant,
    request: &HoldRequest,
    borrows: &BTreeMap<Sku, TransferId>,
) -> HoldReply {
    let (state, tenant) = (state.clone(), tenant.clone());
    let now_ms = state.now_ms();
    let deadline = Deadline::after(now_ms, state.wait_timeout_ms());
    let mut answers = ItemAnswers::new(request.items.len());
    let refused = loop {
        let index = match answers.next() {
            NextItem::Ask(index) => index,
            NextItem::Refused(index, reply) => break Some((index, reply)),
            NextItem::AllSetAside => break None,
        };
        let item = &request.items[index];
        let (tx, rx) = oneshot::channel();
        let set_aside = ReserveRequest {
            borrow: None,
            request_key: RequestKey::cart_item(&request.key, &item.sku),
            user_id: request.user_id.clone(),
            qty: item.qty,
            ttl: Some(request.ttl),
        };
        let item_deadline = answers.deadline(deadline, state.now_ms());
        let queued = state.registry().get(&tenant, &item.sku).map(|handle| {
            handle
                .queue
                .try_send(Command::SetAside(set_aside, item_deadline, tx))
                .is_ok()
        });
        answers.answer(match queued {
            Some(true) => rx
                .await
                .unwrap_or(ReserveReply::Paused(PauseReason::Halted)),
            _ => ReserveReply::QueueFull,
        });
    };
    let set_aside = answers.set_aside();
    if let Some((index, reply)) = refused {
        end_items(&state, &tenant, request, &set_aside, CartEnd::Dropped).await;
        return refusal(index, reply);
    }

    let now_ms = state.now_ms();
    let mut cart = Cart::held(
        request.key.clone(),
        request.user_id.clone(),
        request.items.clone(),
        now_ms + request.ttl.get(),
    );
    cart.borrows = borrows.clone();
    let commit = CartCommit::create(&tenant, cart, now_ms);
    let written = state.cart_committer().commit(commit.clone()).await;
    match written {
        Ok(CartWritten::Written) => {
            end_items(&state, &tenant, request, &set_aside, CartEnd::Held).await;
            held(&state, &tenant, &commit.cart);
            HoldReply::Held(commit.cart)
        }
        Ok(CartWritten::Refused) | Err(StoreError::CartItemRefused { .. }) => {
            let item = match written {
                Err(StoreError::CartItemRefused { item }) => Some(item),
                _ => None,
            };
            end_items(&state, &tenant, request, &set_aside, CartEnd::Dropped).await;
            match existing(&state, &tenant, request).await {
                Ok(Some(reply)) => reply,
                Ok(None) => match item {
                    Some(index) => HoldReply::UserLimit(index),
                    None => HoldReply::Refused(ReserveReply::Paused(PauseReason::Storage)),
                },
                Err(_) => HoldReply::Refused(ReserveReply::Paused(PauseReason::Storage)),
            }
        }
        Err(StoreError::Fenced) => {
            state.fence().set_fenced();
            end_items(&state, &tenant, request, &set_aside, CartEnd::Dropped).await;
            HoldReply::Refused(ReserveReply::Paused(PauseReason::Halted))
        }
        Err(error) => {
            tracing::error!(%tenant, key = %request.key, %error,
                "a cart's commit failed or its outcome is unknown; settling it from the database");
            settle(&state, &tenant, request, &set_aside).await
        }
    }
}

/// A commit whose outcome is unknown (or that failed), settled from the
/// database: the cart is held if its row is there, else nothing was; if
/// it cannot be read, the owners read their SKUs again.
async fn settle(
    state: &AppState,
    tenant: &Tenant,
    request: &HoldRequest,
    set_aside: &[bool],
) -> HoldReply {
    let store = state.store();
    let found = answered(store.as_ref(), store.cart(tenant, &request.key)).await;
    match found {
        Some(Ok(Some(cart))) if cart.is_same_request(&request.user_id, &request.items) => {
            end_items(state, tenant, request, set_aside, CartEnd::Held).await;
            held(state, tenant, &cart);
            HoldReply::Held(cart)
        }
        _ => {
            end_items(state, tenant, request, set_aside, CartEnd::Unknown).await;
            HoldReply::Refused(ReserveReply::Paused(PauseReason::Storage))
        }
    }
}

/// Remembers a cart just held: its key, and its expiry.
fn held(state: &AppState, tenant: &Tenant, cart: &Cart) {
    let first = &cart.items[0].sku;
    state.keys().insert(tenant, first, cart.request_key.clone());
    state.cart_expiry().watch(tenant, cart);
    metrics::counter!("escrow_carts_total", "outcome" => "HELD").increment(1);
    let items = cart.items.len() as u64;
    metrics::counter!("escrow_cart_items_total").increment(items);
}

/// The answer for a key already used: the cart it made (REPLAY if it is
/// this request's, else KEY_REUSED), KEY_REUSED if a reservation has it,
/// `None` if it is free.
async fn existing(
    state: &AppState,
    tenant: &Tenant,
    request: &HoldRequest,
) -> Result<Option<HoldReply>, StoreError> {
    if let Some(cart) = state.store().cart(tenant, &request.key).await? {
        return Ok(Some(
            if cart.is_same_request(&request.user_id, &request.items) {
                HoldReply::Replay(cart)
            } else {
                HoldReply::KeyReused
            },
        ));
    }
    let reservation = state.store().reservation(tenant, &request.key).await?;
    Ok(reservation.map(|_| HoldReply::KeyReused))
}

/// Tells each owner that set its item aside how the cart ended, and waits
/// until each has taken it in: an answer sent after this finds every
/// owner's memory, and the gate in front of it, as the database is.
async fn end_items(
    state: &AppState,
    tenant: &Tenant,
    request: &HoldRequest,
    set_aside: &[bool],
    end: CartEnd,
) {
    let items = request
        .items
        .iter()
        .zip(set_aside)
        .filter(|(_, aside)| **aside);
    let told: Vec<_> = items
        .map(|(item, _)| {
            let key = RequestKey::cart_item(&request.key, &item.sku);
            tell(state, tenant, key, &item.sku, end)
        })
        .collect();
    taken_in(told).await;
}

/// Tells `sku`'s owner how a cart ended for its item `key`; the receiver
/// hears once the owner has taken it in.
fn tell(
    state: &AppState,
    tenant: &Tenant,
    key: RequestKey,
    sku: &Sku,
    end: CartEnd,
) -> Option<oneshot::Receiver<()>> {
    let handle = state.registry().get(tenant, sku)?;
    let (taken, heard) = oneshot::channel();
    // An owner that stopped has nothing to follow: it reloads at start.
    handle.cart_ends.send((key, end, taken)).ok()?;
    Some(heard)
}

async fn taken_in(told: Vec<Option<oneshot::Receiver<()>>>) {
    for heard in told.into_iter().flatten() {
        // A closed channel is an owner that stopped: nothing to wait for.
        let _ = heard.await;
    }
}

fn refusal(index: usize, reply: ReserveReply) -> HoldReply {
    match reply {
        ReserveReply::SoldOut => HoldReply::SoldOut(index),
        ReserveReply::UserLimit => HoldReply::UserLimit(index),
        other => HoldReply::Refused(other),
    }
}

/// Acts on the cart `key` of `tenant`: a buyer's action, or the expiry
/// (`None`). The cart is read, decided by its lifecycle and, if anything
/// changes, written with all its items in one commit guarded by the cart
/// row; a cart moved meanwhile by another action is read and decided
/// again.
pub async fn act(
    state: &AppState,
    tenant: &Tenant,
    key: &RequestKey,
    action: Option<CartAction>,
) -> ActReply {
    let task = tokio::spawn(act_in_task(
        state.clone(),
        tenant.clone(),
        key.clone(),
        action,
    ));
    task.await.unwrap_or(ActReply::Paused(PauseReason::Halted))
}

async fn act_in_task(
    state: AppState,
    tenant: Tenant,
    key: RequestKey,
    action: Option<CartAction>,
) -> ActReply {
    let store = state.store().clone();
    loop {
        let cart = match answered(store.as_ref(), store.cart(&tenant, &key)).await {
            Some(Ok(Some(cart))) => cart,
            Some(Ok(None)) => return ActReply::NotFound,
            _ => return ActReply::Paused(PauseReason::Storage),
        };
        let now_ms = state.now_ms();
        let verdict = cart.decide(action, now_ms, default_ttl(&state, &tenant, &cart));
        let Some(change) = verdict.change else {
            return match verdict.result {
                Ok(()) => ActReply::Accepted(cart),
                Err(_) => ActReply::Refused(cart),
            };
        };
        let commit = CartCommit::transition(&tenant, cart, change, now_ms);
        let written = state.cart_committer().commit(commit.clone()).await;
        match written {
            Ok(CartWritten::Written) => {
                moved(&state, &tenant, &commit.cart, CartEnd::Moved(change)).await;
                if let Transition::Extend { .. } = change {
                    state.cart_expiry().watch(&tenant, &commit.cart);
                }
                let outcome = commit.cart.lifecycle.status.as_str();
                metrics::counter!("escrow_carts_total", "outcome" => outcome).increment(1);
                return match verdict.result {
                    Ok(()) => ActReply::Accepted(commit.cart),
                    Err(_) => ActReply::Refused(commit.cart),
                };
            }
            // Another action or the expiry moved it first: decide again.
            Ok(CartWritten::Refused) | Err(StoreError::CartItemRefused { .. }) => continue,
            Err(StoreError::Fenced) => {
                state.fence().set_fenced();
                return ActReply::Paused(PauseReason::Halted);
            }
            Err(error) => {
                tracing::error!(%tenant, %key, %error,
                    "a cart's transition failed or its outcome is unknown; its SKUs reload");
                moved(&state, &tenant, &commit.cart, CartEnd::Unknown).await;
                return ActReply::Paused(PauseReason::Storage);
            }
        }
    }
}

/// Tells every item's owner of a committed transition of `cart`, and
/// waits until each has taken it in.
async fn moved(state: &AppState, tenant: &Tenant, cart: &Cart, end: CartEnd) {
    let told: Vec<_> = cart
        .items
        .iter()
        .map(|item| tell(state, tenant, cart.item_key(&item.sku), &item.sku, end))
        .collect();
    taken_in(told).await;
}

/// An extension's duration when the buyer names none: the shortest hold
/// of the cart's SKUs.
pub fn default_ttl(state: &AppState, tenant: &Tenant, cart: &Cart) -> TtlMs {
    cart.items
        .iter()
        .filter_map(|item| state.registry().get(tenant, &item.sku))
        .map(|handle| handle.view.settings().hold_ttl)
        .min()
        .unwrap_or(SkuSettings::default().hold_ttl)
}
