//! The agent's part in the per-user limit across regions
//! ([`escrow_core::user_limit`]): borrowing a user's place from their home
//! region for a hold here, and lending places of this region's own users
//! to the regions where they buy.
//!
//! Both travel in the sync ([`escrow_core::protocol::LimitsUp`] and
//! [`escrow_core::protocol::LimitsDown`]). A borrow is written to the
//! database as asked before the sync carries it, so a restart gives back
//! whatever it may have been lent; the request that asked waits here for
//! the answer. A loan is written before its answer is sent; the answers and
//! returned loans wait here for the next sync, which is asked for at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use escrow_core::owner::PauseReason;
use escrow_core::protocol::{Borrow, LendAnswer, LimitsDown, LimitsUp};
use escrow_core::user_limit::{judge, Judge};
use escrow_core::{RegionName, RequestKey, Sku, Tenant, TransferId, UserId, UserLimitScope};
use tokio::sync::oneshot;

use crate::owner::SkuView;
use crate::state::AppState;
use crate::store::{StoreError, SyncSnapshot};

/// How a borrow ended for the request that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Borrowed {
    /// The home lent the place: hold with this borrow.
    Lent(TransferId),
    /// The home refused: the user holds (or has lent) the place already.
    Refused,
    /// No answer in time (the coordinator or the home is out of reach):
    /// the place is given back, the request is PAUSED.
    Unanswered,
}

/// Where a hold is judged under its SKU's per-user limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Here, from this region's rows.
    Here,
    /// On a place borrowed from the user's home region.
    Borrowed(TransferId),
    /// The home refused: the user holds, has bought or has lent the place
    /// already (or this very key holds it here: the caller looks).
    Taken,
}

/// Where `user`'s hold of `sku` under `key` (the row's key) is judged. A
/// user at home elsewhere under a global limit borrows their place from
/// the home first: the request waits for the answer. PAUSED when nobody
/// can judge: the coordinator is out of reach or has not yet named the
/// SKU's regions, or the home did not answer in time.
pub async fn place(
    state: &AppState,
    view: &SkuView,
    tenant: &Tenant,
    sku: &Sku,
    user: &UserId,
    key: &RequestKey,
) -> Result<Place, PauseReason> {
    let Some(link) = state.link() else {
        return Ok(Place::Here);
    };
    let scope = view.settings().user_limit_scope;
    if scope == UserLimitScope::Region {
        // The hot path: no regions to read.
        return Ok(Place::Here);
    }
    let home = match judge(scope, user, state.region(), &view.limit_regions()) {
        Judge::Here => return Ok(Place::Here),
        Judge::Unknown => return Err(PauseReason::CoordinatorUnreachable),
        Judge::Home(home) => home,
    };
    if link.is_down() {
        return Err(PauseReason::CoordinatorUnreachable);
    }
    let what = BorrowFor {
        tenant,
        sku,
        user_id: user,
        key,
        home,
    };
    let wait = Duration::from_millis(state.wait_timeout_ms());
    match state.borrows().borrow(state, what, wait).await {
        Ok(Borrowed::Lent(id)) => Ok(Place::Borrowed(id)),
        Ok(Borrowed::Refused) => Ok(Place::Taken),
        Ok(Borrowed::Unanswered) => Err(PauseReason::CoordinatorUnreachable),
        Err(error) => {
            tracing::warn!(%error, "recording a borrow failed");
            Err(PauseReason::Storage)
        }
    }
}

/// Relays what [`Borrows::send_now`] gathered, one limits call at a time:
/// everything gathered while a call is out goes in the next, so a burst
/// of borrows costs the coordinator a transaction per round trip, not one
/// per buyer. A call that fails costs time, never a place: the next sync
/// carries the same again. Runs until `stop` turns true.
pub async fn relay(state: AppState, mut stop: tokio::sync::watch::Receiver<bool>) {
    let Some(link) = state.link().cloned() else {
        return;
    };
    let borrows = state.borrows();
    loop {
        tokio::select! {
            () = borrows.gathered.notified() => {}
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
        let up = std::mem::take(&mut *borrows.lock(&borrows.outgoing));
        if up.is_empty() {
            continue;
        }
        match link.client.limits(&up).await {
            Ok(down) => borrows.apply_answer(&state, down).await,
            Err(error) => tracing::debug!(%error, "relaying borrows and loans failed"),
        }
    }
}

/// Borrows waiting for their answer and loans waiting to be reported.
#[derive(Debug, Default)]
pub struct Borrows {
    next: AtomicU64,
    waiting: Mutex<HashMap<TransferId, oneshot::Sender<bool>>>,
    answers: Mutex<Vec<LendAnswer>>,
    returned: Mutex<Vec<TransferId>>,
    /// Held while loans are written: a sync's answer and a watch's may
    /// carry the same asks, and two transactions inserting the same rows
    /// in different orders would deadlock.
    lending: tokio::sync::Mutex<()>,
    /// What the next limits call carries ([`relay`]).
    outgoing: Mutex<LimitsUp>,
    /// Something was gathered for [`relay`].
    gathered: tokio::sync::Notify,
}

/// What one borrow is for.
#[derive(Debug, Clone)]
pub struct BorrowFor<'a> {
    /// The SKU's tenant.
    pub tenant: &'a Tenant,
    /// The SKU.
    pub sku: &'a Sku,
    /// The buyer.
    pub user_id: &'a UserId,
    /// The key the hold's row will have.
    pub key: &'a RequestKey,
    /// The buyer's home region.
    pub home: RegionName,
}

impl Borrows {
    /// Borrows the place `what` names from its home and waits for the
    /// answer, at most `wait`. An unanswered borrow is marked for return
    /// before this returns.
    pub async fn borrow(
        &self,
        state: &AppState,
        what: BorrowFor<'_>,
        wait: Duration,
    ) -> Result<Borrowed, StoreError> {
        let Some(link) = state.link() else {
            return Ok(Borrowed::Unanswered);
        };
        let epoch = state.fence().epoch();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = TransferId::parse(&format!("b-{}-{}-{n}", state.region(), epoch.0))
            .map_err(|e| StoreError::Conflict(e.to_string()))?;
        let borrow = Borrow {
            id: id.clone(),
            tenant: what.tenant.clone(),
            sku: what.sku.clone(),
            user_id: what.user_id.clone(),
            home: what.home,
        };
        let (tx, rx) = oneshot::channel();
        self.lock_waiting().insert(id.clone(), tx);
        if let Err(error) = state.store().ask_borrow(epoch, &borrow, what.key).await {
            self.lock_waiting().remove(&id);
            return Err(error);
        }
        self.send_now(
            state,
            LimitsUp {
                asks: vec![borrow],
                ..LimitsUp::default()
            },
        );
        let asked = std::time::Instant::now();
        let answer = tokio::time::timeout(wait, rx).await;
        self.lock_waiting().remove(&id);
        let outcome = match answer {
            Ok(Ok(true)) => "lent",
            Ok(Ok(false)) => "refused",
            Ok(Err(_)) | Err(_) => "unanswered",
        };
        metrics::counter!("escrow_borrows_total", "outcome" => outcome).increment(1);
        metrics::histogram!("escrow_borrow_seconds").record(asked.elapsed().as_secs_f64());
        match answer {
            Ok(Ok(true)) => Ok(Borrowed::Lent(id)),
            Ok(Ok(false)) => {
                state.store().give_back_borrow(epoch, &id).await?;
                Ok(Borrowed::Refused)
            }
            Ok(Err(_)) | Err(_) => {
                state.store().give_back_borrow(epoch, &id).await?;
                link.request_sync();
                Ok(Borrowed::Unanswered)
            }
        }
    }

    /// Gives back a borrow whose hold was not made; a sync carries it home.
    pub async fn give_back(&self, state: &AppState, id: &TransferId) -> Result<(), StoreError> {
        state
            .store()
            .give_back_borrow(state.fence().epoch(), id)
            .await?;
        if let Some(link) = state.link() {
            link.request_sync();
        }
        Ok(())
    }

    /// What the next sync says about borrows and loans: the snapshot's
    /// outbox, and the loans decided or taken back since the last sync.
    pub fn to_send(&self, snapshot: &SyncSnapshot) -> LimitsUp {
        LimitsUp {
            asks: snapshot.borrow_asks.clone(),
            returns: snapshot.borrow_returns.clone(),
            answers: self.lock(&self.answers).clone(),
            returned: self.lock(&self.returned).clone(),
        }
    }

    /// A sync carrying `sent` was answered: its loan answers and returned
    /// loans are with the coordinator.
    pub fn sent(&self, sent: &LimitsUp) {
        self.lock(&self.answers)
            .retain(|a| !sent.answers.iter().any(|s| s.id == a.id));
        self.lock(&self.returned)
            .retain(|id| !sent.returned.contains(id));
    }

    /// Applies the coordinator's side of a sync's answer: wakes borrowers
    /// with their answers, forgets borrows that are home, and lends or
    /// takes back the places asked of this region as a home, durably,
    /// before their answers wait for the next sync.
    pub async fn apply(&self, state: &AppState, down: LimitsDown) -> Result<(), StoreError> {
        {
            let mut waiting = self.lock_waiting();
            for answer in &down.answers {
                if let Some(tx) = waiting.remove(&answer.id) {
                    let _ = tx.send(answer.lent);
                }
            }
        }
        state.store().forget_borrows(&down.returned).await?;
        let epoch = state.fence().epoch();
        let mut decided = LimitsUp::default();
        let _one_at_a_time = self.lending.lock().await;
        if !down.lend_asks.is_empty() {
            let answers = state
                .store()
                .lend(epoch, &down.lend_asks, state.now_ms())
                .await?;
            // The newest answer of an id is the database's: a place
            // refused while its user held it may be lent when asked again.
            let mut kept = self.lock(&self.answers);
            kept.retain(|a| !answers.iter().any(|b| b.id == a.id));
            kept.extend(answers.iter().cloned());
            decided.answers = answers;
        }
        if !down.lend_returns.is_empty() {
            state
                .store()
                .take_back(epoch, &down.lend_returns, state.now_ms())
                .await?;
            let mut kept = self.lock(&self.returned);
            for loan in &down.lend_returns {
                if !kept.contains(&loan.id) {
                    kept.push(loan.id.clone());
                }
                decided.returned.push(loan.id.clone());
            }
        }
        if !decided.is_empty() {
            self.send_now(state, decided);
        }
        Ok(())
    }

    /// Has `up` sent at once by [`relay`], ahead of the next sync (which
    /// is asked for too, and carries everything again).
    fn send_now(&self, state: &AppState, up: LimitsUp) {
        let Some(link) = state.link() else {
            return;
        };
        link.request_sync();
        self.lock(&self.outgoing).gather(up);
        self.gathered.notify_one();
    }

    /// Applies a limits answer from outside the sync loop.
    async fn apply_answer(&self, state: &AppState, down: LimitsDown) {
        if let Err(error) = self.apply(state, down).await {
            tracing::warn!(%error, "applying borrows and loans failed");
        }
    }

    fn lock_waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<TransferId, oneshot::Sender<bool>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock<'a, T>(&self, m: &'a Mutex<T>) -> std::sync::MutexGuard<'a, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
}
