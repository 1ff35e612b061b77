//! The per-user limit across regions: the coordinator relays borrowed
//! places between the region where a user buys and the user's home
//! region (docs/protocol.md, "Per-user limit across regions").
//!
//! Each borrow is one row of `borrows`, moved only forward by
//! escrow-core's [`BorrowState`] rules (ASKED -> LENT | REFUSED ->
//! RETURNING -> RETURNED), each move a conditional statement, so a repeated, late or reordered message never lends a place
//! twice or loses one: a return that arrives before its ask records the id
//! RETURNED, and the ask is then never relayed; a loan the home makes after
//! the borrower gave up is asked back. Once committed, what the home and
//! the borrower must hear also rides on their watch answers
//! (`Notices::add_limits`), half a round trip ahead of their syncs.

use escrow_core::protocol::{Borrow, LendAnswer, LimitsDown, LimitsUp};
use escrow_core::user_limit::{home_region, BorrowState};
use escrow_core::{RegionName, UserLimitScope};

use super::backend::{sql, Row, Tx};
use super::books::ident;
use super::{Store, StoreError};

/// A borrow from its row.
fn borrow_of(row: &Row) -> Result<Borrow, StoreError> {
    Ok(Borrow {
        id: ident(row, "id")?,
        tenant: ident(row, "tenant")?,
        sku: ident(row, "sku")?,
        user_id: ident(row, "user_id")?,
        home: ident(row, "home")?,
    })
}

/// Whether `borrow`, asked by `borrower`, names the user's true home: the
/// SKU's scope is global, both regions take part in it, and the home rule
/// picks `home` among its regions.
async fn names_the_home(
    tx: &mut Tx,
    borrower: &RegionName,
    borrow: &Borrow,
) -> Result<bool, StoreError> {
    let scope = sql("SELECT user_limit_scope FROM skus WHERE tenant = $1 AND sku = $2")
        .bind(borrow.tenant.as_str())
        .bind(borrow.sku.as_str())
        .fetch_optional(&mut *tx)
        .await?;
    let global = match scope {
        Some(row) => row.try_get::<String>("user_limit_scope")? == UserLimitScope::Global.as_str(),
        None => false,
    };
    if !global {
        return Ok(false);
    }
    let regions: Vec<RegionName> =
        sql("SELECT region FROM sku_regions WHERE tenant = $1 AND sku = $2")
            .bind(borrow.tenant.as_str())
            .bind(borrow.sku.as_str())
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|row| ident(row, "region"))
            .collect::<Result<_, _>>()?;
    Ok(regions.contains(borrower)
        && home_region(&borrow.user_id, &regions) == Some(&borrow.home)
        && borrow.home != *borrower)
}

/// The state of borrow `id` as its borrower or its home sees it, with the
/// other region.
async fn state_of(
    tx: &mut Tx,
    id: &str,
    side: &str,
    region: &RegionName,
) -> Result<Option<(BorrowState, RegionName)>, StoreError> {
    let other = if side == "borrower" {
        "home"
    } else {
        "borrower"
    };
    let row = sql(format!(
        "SELECT state, {other} AS other FROM borrows WHERE id = $1 AND {side} = $2"
    ))
    .bind(id)
    .bind(region.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    row.map(|row| {
        let state: String = row.try_get("state")?;
        let state = BorrowState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("stored borrow state {state}")))?;
        Ok((state, ident(&row, "other")?))
    })
    .transpose()
}

/// Moves borrow `id` from `from` to `to`, if it is still at `from`.
async fn advance(
    tx: &mut Tx,
    id: &str,
    from: BorrowState,
    to: BorrowState,
) -> Result<(), StoreError> {
    sql("UPDATE borrows SET state = $3 WHERE id = $1 AND state = $2")
        .bind(id)
        .bind(from.as_str())
        .bind(to.as_str())
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Records a borrow in `state`, unless its id is known.
async fn insert(
    tx: &mut Tx,
    borrower: &RegionName,
    borrow: &Borrow,
    state: BorrowState,
) -> Result<bool, StoreError> {
    let inserted = sql(
        "INSERT INTO borrows (id, tenant, sku, user_id, borrower, home, state)
                        VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
    )
    .bind(borrow.id.as_str())
    .bind(borrow.tenant.as_str())
    .bind(borrow.sku.as_str())
    .bind(borrow.user_id.as_str())
    .bind(borrower.as_str())
    .bind(borrow.home.as_str())
    .bind(state.as_str())
    .execute(&mut *tx)
    .await?;
    Ok(inserted == 1)
}

/// The borrows for `home` in `state`.
async fn for_home(
    tx: &mut Tx,
    home: &RegionName,
    state: BorrowState,
) -> Result<Vec<Borrow>, StoreError> {
    sql("SELECT id, tenant, sku, user_id, home FROM borrows
         WHERE home = $1 AND state = $2 ORDER BY id")
    .bind(home.as_str())
    .bind(state.as_str())
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(borrow_of)
    .collect()
}

impl Store {
    /// Applies what `region` says of its borrows and loans, in one
    /// transaction, and answers: the home's answers to its asks, its
    /// returns that are complete, and the loans asked of it as a home.
    /// The regions whose next sync has something new are woken.
    pub async fn relay_limits(
        &self,
        region: &RegionName,
        up: &LimitsUp,
    ) -> Result<LimitsDown, StoreError> {
        if up.is_empty() {
            let mut tx = self.db.snapshot().await?;
            let down = LimitsDown {
                lend_asks: for_home(&mut tx, region, BorrowState::Asked).await?,
                lend_returns: for_home(&mut tx, region, BorrowState::Returning).await?,
                ..LimitsDown::default()
            };
            tx.commit().await?;
            return Ok(down);
        }
        let mut tx = self.db.write().await?;
        // Who to wake, with what their watch answer may carry.
        let mut wake: Vec<(RegionName, LimitsDown)> = Vec::new();
        // A region never borrows from itself: such an ask (or return) is
        // no borrow at all, and is answered nothing.
        for ask in up.asks.iter().filter(|a| a.home != *region) {
            let valid = names_the_home(&mut tx, region, ask).await?;
            if insert(&mut tx, region, ask, BorrowState::asked(valid)).await? && valid {
                let carry = LimitsDown {
                    lend_asks: vec![ask.clone()],
                    ..LimitsDown::default()
                };
                wake.push((ask.home.clone(), carry));
            }
        }
        for ret in up.returns.iter().filter(|r| r.home != *region) {
            insert(&mut tx, region, ret, BorrowState::Returned).await?;
            let Some((state, home)) =
                state_of(&mut tx, ret.id.as_str(), "borrower", region).await?
            else {
                continue;
            };
            if let Some(next) = state.on_return() {
                advance(&mut tx, ret.id.as_str(), state, next).await?;
                if next == BorrowState::Returning {
                    let carry = LimitsDown {
                        lend_returns: vec![ret.clone()],
                        ..LimitsDown::default()
                    };
                    wake.push((home, carry));
                }
            }
        }
        for answer in &up.answers {
            let id = answer.id.as_str();
            let Some((state, borrower)) = state_of(&mut tx, id, "home", region).await? else {
                continue;
            };
            if let Some(next) = state.on_answer(answer.lent) {
                advance(&mut tx, id, state, next).await?;
                wake.push((borrower, next.borrower_news(&answer.id)));
            }
        }
        for id in &up.returned {
            let Some((state, borrower)) = state_of(&mut tx, id.as_str(), "home", region).await?
            else {
                continue;
            };
            if let Some(next) = state.on_taken_back() {
                advance(&mut tx, id.as_str(), state, next).await?;
                wake.push((borrower, LimitsDown::default()));
            }
        }
        let mut down = LimitsDown::default();
        for ask in &up.asks {
            let state = state_of(&mut tx, ask.id.as_str(), "borrower", region).await?;
            if let Some(lent) = state.and_then(|(state, _)| state.answer()) {
                down.answers.push(LendAnswer {
                    id: ask.id.clone(),
                    lent,
                });
            }
        }
        for ret in &up.returns {
            let state = state_of(&mut tx, ret.id.as_str(), "borrower", region).await?;
            if state.is_some_and(|(state, _)| state == BorrowState::Returned) {
                down.returned.push(ret.id.clone());
            }
        }
        down.lend_asks = for_home(&mut tx, region, BorrowState::Asked).await?;
        down.lend_returns = for_home(&mut tx, region, BorrowState::Returning).await?;
        tx.commit().await?;
        for (other, carry) in wake.into_iter().filter(|(r, _)| r != region) {
            self.notices.add_limits(&other, |kept| {
                kept.answers.extend(carry.answers);
                kept.lend_asks.extend(carry.lend_asks);
                kept.lend_returns.extend(carry.lend_returns);
            });
            self.notices.notify(&other);
        }
        Ok(down)
    }
}
