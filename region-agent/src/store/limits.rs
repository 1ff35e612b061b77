//! The per-user limit across regions in SQL: a borrowing region's outbox
//! (`borrows`) and a home region's loans (reservation rows with status
//! `LENT`, judged by the same one-active-per-user index as holds).
//! docs/protocol.md, "Per-user limit across regions", gives the exchange.

use escrow_core::protocol::{Borrow, LendAnswer};
use escrow_core::{RegionName, RequestKey, TransferId, UserId};
use service_kit::sql::{sql, Row, Tx};

use super::rows::{at, ident, text};
use super::StoreError;

/// A borrow from a row of `borrows`.
fn borrow_from(row: &Row) -> Result<Borrow, StoreError> {
    Ok(Borrow {
        id: ident(row, "id")?,
        tenant: ident(row, "tenant")?,
        sku: ident(row, "sku")?,
        user_id: UserId::parse(&text(row, "user_id")?)
            .map_err(|_| super::rows::bad_row("user_id"))?,
        home: RegionName::parse(&text(row, "home")?).map_err(|_| super::rows::bad_row("home"))?,
    })
}

/// Records `borrow`, for the hold of `key`, as asked: before the ask
/// leaves, so a restart can give back whatever it may have been lent.
pub(super) async fn ask(tx: &mut Tx, borrow: &Borrow, key: &RequestKey) -> Result<(), StoreError> {
    sql(
        "INSERT INTO borrows (id, tenant, sku, user_id, request_key, home, state)
         VALUES ($1, $2, $3, $4, $5, $6, 'ASKED')",
    )
    .bind(borrow.id.as_str())
    .bind(borrow.tenant.as_str())
    .bind(borrow.sku.as_str())
    .bind(borrow.user_id.as_str())
    .bind(key.as_str())
    .bind(borrow.home.as_str())
    .execute(tx)
    .await?;
    Ok(())
}

/// Gives back a borrow no hold used; one a hold used is left alone.
pub(super) async fn give_back(tx: &mut Tx, id: &TransferId) -> Result<(), StoreError> {
    sql("UPDATE borrows SET state = 'RETURN' WHERE id = $1 AND state = 'ASKED'")
        .bind(id.as_str())
        .execute(tx)
        .await?;
    Ok(())
}

/// Gives back every borrow still asked: at start, when no request of an
/// earlier process waits for one any more, and none can use it (the
/// lease fences that process's commits).
pub(super) async fn give_back_unused(tx: &mut Tx) -> Result<(), StoreError> {
    sql("UPDATE borrows SET state = 'RETURN' WHERE state = 'ASKED'")
        .execute(tx)
        .await?;
    Ok(())
}

/// Marks the borrows of inserted holds used, in the holds' transaction;
/// each must still be asked.
pub(super) async fn mark_used(tx: &mut Tx, ids: &[&str]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let text = format!(
        "UPDATE borrows SET state = 'USED' WHERE state = 'ASKED' AND id {}",
        tx.backend().in_list("$1")
    );
    let changed = sql(text).bind(ids.to_vec()).execute(tx).await?;
    if changed == ids.len() as u64 {
        Ok(())
    } else {
        Err(StoreError::Conflict(format!(
            "{} of {} borrows were no longer asked",
            ids.len() as u64 - changed,
            ids.len()
        )))
    }
}

/// The borrows to ask about and to give back, in one snapshot: asked ones,
/// and those marked for return or used by a hold that ended unsold (or
/// was pruned after it ended).
pub(super) async fn outbox(tx: &mut Tx) -> Result<(Vec<Borrow>, Vec<Borrow>), StoreError> {
    let asks = sql("SELECT id, tenant, sku, user_id, home FROM borrows
                    WHERE state = 'ASKED' ORDER BY id")
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(borrow_from)
    .collect::<Result<_, _>>()?;
    let returns = sql(
        "SELECT b.id, b.tenant, b.sku, b.user_id, b.home FROM borrows b
                       WHERE b.state = 'RETURN'
                          OR (b.state = 'USED' AND NOT EXISTS (
                                SELECT 1 FROM reservations r
                                WHERE r.tenant = b.tenant AND r.request_key = b.request_key
                                  AND r.status IN ('HELD', 'SOLD')))
                       ORDER BY b.id",
    )
    .fetch_all(&mut *tx)
    .await?
    .iter()
    .map(borrow_from)
    .collect::<Result<_, _>>()?;
    Ok((asks, returns))
}

/// Forgets borrows that are settled: refused, or home again.
pub(super) async fn forget(tx: &mut Tx, ids: &[TransferId]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let text = format!(
        "DELETE FROM borrows WHERE id {}",
        tx.backend().in_list("$1")
    );
    sql(text)
        .bind(ids.iter().map(TransferId::as_str).collect::<Vec<_>>())
        .execute(tx)
        .await?;
    Ok(())
}

/// As the home region: lends each place asked for where its user holds,
/// has sold or has lent nothing of the SKU here (the one-active-per-user
/// index decides), and answers each. Asked again, a loan is answered as
/// it stands: lent while its row is LENT, refused once it is back. An ask
/// for a SKU this region does not have yet (its first directive is on its
/// way) is left unanswered: the coordinator asks again.
pub(super) async fn lend(
    tx: &mut Tx,
    asks: &[Borrow],
    now_ms: u64,
) -> Result<Vec<LendAnswer>, StoreError> {
    let mut answers = Vec::with_capacity(asks.len());
    for ask in in_id_order(asks) {
        let known = sql("SELECT 1 FROM sku_stock WHERE tenant = $1 AND sku = $2")
            .bind(ask.tenant.as_str())
            .bind(ask.sku.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
        if !known {
            continue;
        }
        insert_loan_row(tx, ask, "LENT", now_ms).await?;
        let key = RequestKey::lend(&ask.id);
        let lent = sql("SELECT 1 FROM reservations
                        WHERE tenant = $1 AND request_key = $2 AND status = 'LENT'")
        .bind(ask.tenant.as_str())
        .bind(key.as_str())
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
        answers.push(LendAnswer {
            id: ask.id.clone(),
            lent,
        });
    }
    Ok(answers)
}

/// As the home region: takes places back. A loan never made is recorded
/// as back, so an ask that arrives after its return is refused.
pub(super) async fn take_back(
    tx: &mut Tx,
    loans: &[Borrow],
    now_ms: u64,
) -> Result<(), StoreError> {
    for loan in in_id_order(loans) {
        let key = RequestKey::lend(&loan.id);
        sql("UPDATE reservations SET status = 'RETURNED'
             WHERE tenant = $1 AND request_key = $2 AND status = 'LENT'")
        .bind(loan.tenant.as_str())
        .bind(key.as_str())
        .execute(&mut *tx)
        .await?;
        insert_loan_row(tx, loan, "RETURNED", now_ms).await?;
    }
    Ok(())
}

/// Inserts `loan`'s reservation row (key `/lend/{id}`, one unit, no
/// counter behind it) with `status`, unless its key, or for LENT its
/// user's one active place, is taken.
async fn insert_loan_row(
    tx: &mut Tx,
    loan: &Borrow,
    status: &str,
    now_ms: u64,
) -> Result<(), StoreError> {
    sql("INSERT INTO reservations (tenant, request_key, sku, user_id, qty, status, expires_at, created_at)
         VALUES ($1, $2, $3, $4, 1, $5, $6, $6)
         ON CONFLICT DO NOTHING")
    .bind(loan.tenant.as_str())
    .bind(RequestKey::lend(&loan.id).as_str())
    .bind(loan.sku.as_str())
    .bind(loan.user_id.as_str())
    .bind(status)
    .bind(at(now_ms))
    .execute(tx)
    .await?;
    Ok(())
}

/// `loans` in id order: every writer of loan rows takes them so, and two
/// transactions never wait for each other's rows in opposite orders.
fn in_id_order(loans: &[Borrow]) -> Vec<&Borrow> {
    let mut loans: Vec<&Borrow> = loans.iter().collect();
    loans.sort_by(|a, b| a.id.cmp(&b.id));
    loans
}
