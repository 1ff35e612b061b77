//! The per-user limit across regions: the coordinator relays borrowed
//! places between the region where a user buys and the user's home
//! region (docs/protocol.md, "Per-user limit across regions").
//!
//! Each borrow is one row of `borrows`, moved only forward
//! (ASKED -> LENT | REFUSED -> RETURNING -> RETURNED) by conditional
//! statements, so a repeated, late or reordered message never lends a place
//! twice or loses one: a return that arrives before its ask records the id
//! RETURNED, and the ask is then never relayed; a loan the home makes after
//! the borrower gave up is asked back. Once committed, what the home and
//! the borrower must hear also rides on their watch answers
//! (`Notices::add_limits`), half a round trip ahead of their syncs.

use escrow_core::protocol::{Borrow, LendAnswer, LimitsDown, LimitsUp};
use escrow_core::user_limit::home_region;
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

/// The state of borrow `id` as its borrower or its home sees it.
async fn state_of(
    tx: &mut Tx,
    id: &str,
    side: &str,
    region: &RegionName,
) -> Result<Option<(String, RegionName)>, StoreError> {
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
    row.map(|row| Ok((row.try_get("state")?, ident(&row, "other")?)))
        .transpose()
}

/// Moves borrow `id` from `from` to `to`.
async fn advance(tx: &mut Tx, id: &str, from: &str, to: &str) -> Result<(), StoreError> {
    sql("UPDATE borrows SET state = $3 WHERE id = $1 AND state = $2")
        .bind(id)
        .bind(from)
        .bind(to)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Records a borrow in `state`, unless its id is known.
async fn insert(
    tx: &mut Tx,
    borrower: &RegionName,
    borrow: &Borrow,
    state: &str,
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
    .bind(state)
    .execute(&mut *tx)
    .await?;
    Ok(inserted == 1)
}

/// The borrows for `home` in `state`.
async fn for_home(tx: &mut Tx, home: &RegionName, state: &str) -> Result<Vec<Borrow>, StoreError> {
    sql("SELECT id, tenant, sku, user_id, home FROM borrows
         WHERE home = $1 AND state = $2 ORDER BY id")
    .bind(home.as_str())
    .bind(state)
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
                lend_asks: for_home(&mut tx, region, "ASKED").await?,
                lend_returns: for_home(&mut tx, region, "RETURNING").await?,
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
            let state = if valid { "ASKED" } else { "REFUSED" };
            if insert(&mut tx, region, ask, state).await? && valid {
                let carry = LimitsDown {
                    lend_asks: vec![ask.clone()],
                    ..LimitsDown::default()
                };
                wake.push((ask.home.clone(), carry));
            }
        }
        for ret in up.returns.iter().filter(|r| r.home != *region) {
            insert(&mut tx, region, ret, "RETURNED").await?;
            match state_of(&mut tx, ret.id.as_str(), "borrower", region).await? {
                Some((state, home)) if state == "ASKED" || state == "LENT" => {
                    advance(&mut tx, ret.id.as_str(), &state, "RETURNING").await?;
                    let carry = LimitsDown {
                        lend_returns: vec![ret.clone()],
                        ..LimitsDown::default()
                    };
                    wake.push((home, carry));
                }
                Some((state, _)) if state == "REFUSED" => {
                    advance(&mut tx, ret.id.as_str(), &state, "RETURNED").await?;
                }
                _ => {}
            }
        }
        for answer in &up.answers {
            let id = answer.id.as_str();
            match state_of(&mut tx, id, "home", region).await? {
                Some((state, borrower)) if state == "ASKED" => {
                    let to = if answer.lent { "LENT" } else { "REFUSED" };
                    advance(&mut tx, id, "ASKED", to).await?;
                    let carry = LimitsDown {
                        answers: vec![answer.clone()],
                        ..LimitsDown::default()
                    };
                    wake.push((borrower, carry));
                }
                Some((state, borrower)) if state == "RETURNING" && !answer.lent => {
                    advance(&mut tx, id, "RETURNING", "RETURNED").await?;
                    wake.push((borrower, LimitsDown::default()));
                }
                _ => {}
            }
        }
        for id in &up.returned {
            if let Some((state, borrower)) = state_of(&mut tx, id.as_str(), "home", region).await? {
                if state == "RETURNING" {
                    advance(&mut tx, id.as_str(), "RETURNING", "RETURNED").await?;
                    wake.push((borrower, LimitsDown::default()));
                }
            }
        }
        let mut down = LimitsDown::default();
        for ask in &up.asks {
            if let Some((state, _)) = state_of(&mut tx, ask.id.as_str(), "borrower", region).await?
            {
                if state == "LENT" || state == "REFUSED" {
                    down.answers.push(LendAnswer {
                        id: ask.id.clone(),
                        lent: state == "LENT",
                    });
                }
            }
        }
        for ret in &up.returns {
            if let Some((state, _)) = state_of(&mut tx, ret.id.as_str(), "borrower", region).await?
            {
                if state == "RETURNED" {
                    down.returned.push(ret.id.clone());
                }
            }
        }
        down.lend_asks = for_home(&mut tx, region, "ASKED").await?;
        down.lend_returns = for_home(&mut tx, region, "RETURNING").await?;
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
