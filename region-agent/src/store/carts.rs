//! Carts as stored: the cart's row, and its items as reservation rows keyed
//! `{cart key}/{sku}` ([`RequestKey::cart_item`]), the same SQL on both
//! backends.
//!
//! A group of carts commits in one write transaction: the lease, each
//! cart row's step (an INSERT that finds the key free in both carts and
//! reservations, or a conditional UPDATE guarded by its status and expiry
//! as a reservation's transition is), then the items' batches by the path
//! every owner batch takes ([`commit::apply_group`]): holds inserted with
//! their conflicts judged by the primary key and the one-active-per-user
//! index, transitions checked to change exactly their rows, counters moved
//! by the ledger's rules. A step that finds its row otherwise writes
//! nothing for that cart; a hold the database refuses rolls the group back
//! and names its cart.

use escrow_core::cart::{Cart, CartCommit, CartItem, CartStep, CartWritten};
use escrow_core::{Lifecycle, RequestKey, Status, Tenant, Transition, UserId};
use service_kit::sql::{sql, Conn, Row, Tx};

use super::commit;
use super::rows::{at, bad_row, ident, millis, request_key};
use super::{Batch, BatchError, Epoch, StoreError};

/// Writes `carts` in `tx`, a write transaction, and commits them, or
/// nothing: each cart's step, then every item of the carts whose step
/// found their row as it needs. A cart whose item the database refused,
/// or whose item's own write failed, is named in the error (the first
/// with [`StoreError::CartItemRefused`]): the caller commits the others
/// again without it.
pub(super) async fn write(
    mut tx: Tx,
    epoch: Epoch,
    carts: &[&CartCommit],
) -> Result<Vec<CartWritten>, BatchError> {
    commit::check_lease(&mut tx, epoch)
        .await
        .map_err(BatchError::whole)?;
    let mut written = Vec::with_capacity(carts.len());
    for cart in carts {
        let moved = step(&mut tx, cart).await.map_err(BatchError::whole)?;
        written.push(if moved {
            CartWritten::Written
        } else {
            CartWritten::Refused
        });
    }
    let stepped: Vec<usize> = (0..carts.len())
        .filter(|&c| written[c] == CartWritten::Written)
        .collect();
    // Each item keeps its own batch (its own time decides its transition's
    // condition); the counters of a SKU move once, by the sum of its
    // items' moves ([`commit::apply_group`]).
    let batches: Vec<&Batch> = stepped.iter().flat_map(|&c| &carts[c].items).collect();
    let outcomes = commit::apply_group(&mut tx, &batches).await.map_err(|e| {
        let cart = e.batch.map(|b| cart_of(carts, &stepped, b));
        BatchError {
            batch: cart,
            error: e.error,
        }
    })?;
    let mut next = 0;
    for &c in &stepped {
        let items = &outcomes[next..next + carts[c].items.len()];
        next += carts[c].items.len();
        let refused = items
            .iter()
            .position(|outcome| outcome.inserted.iter().any(|inserted| !inserted));
        if let Some(item) = refused {
            return Err(BatchError {
                batch: Some(c),
                error: StoreError::CartItemRefused { item },
            });
        }
    }
    commit::commit(tx).await.map_err(BatchError::whole)?;
    Ok(written)
}

/// The cart (its place in `carts`) whose items include batch `b` of the
/// items of `carts[stepped]`, in order.
fn cart_of(carts: &[&CartCommit], stepped: &[usize], b: usize) -> usize {
    let mut first = 0;
    for &c in stepped {
        first += carts[c].items.len();
        if b < first {
            return c;
        }
    }
    unreachable!("batch {b} is an item of a stepped cart")
}

/// The cart row's step; false if the row is not as the step needs it.
async fn step(tx: &mut Tx, commit: &CartCommit) -> Result<bool, StoreError> {
    let cart = &commit.cart;
    let changed = match commit.step {
        CartStep::Create => {
            // A key is one space for carts and reservations.
            sql("INSERT INTO carts (tenant, request_key, user_id, items, status, expires_at, extended, created_at)
                 SELECT $1, $2, $3, $4, 'HELD', $5, FALSE, $6
                 WHERE NOT EXISTS (SELECT 1 FROM reservations WHERE tenant = $1 AND request_key = $2)
                 ON CONFLICT DO NOTHING")
            .bind(commit.tenant.as_str())
            .bind(cart.request_key.as_str())
            .bind(cart.user_id.as_str())
            .bind(cart.items.len() as i32)
            .bind(at(cart.lifecycle.expires_at_ms))
            .bind(at(commit.now_ms))
            .execute(tx)
            .await?
        }
        CartStep::Move(change) => {
            // An expiry finds the cart due, any other change finds it not yet due.
            let due = if change == Transition::Expire {
                "<="
            } else {
                ">"
            };
            sql(format!(
                "UPDATE carts SET status = $3, expires_at = $4, extended = $5
                 WHERE tenant = $1 AND request_key = $2 AND status = 'HELD' AND expires_at {due} $6"
            ))
            .bind(commit.tenant.as_str())
            .bind(cart.request_key.as_str())
            .bind(cart.lifecycle.status.as_str())
            .bind(at(cart.lifecycle.expires_at_ms))
            .bind(cart.lifecycle.extended)
            .bind(at(commit.now_ms))
            .execute(tx)
            .await?
        }
    };
    Ok(changed == 1)
}

/// The cart `key` of `tenant`, with the items its rows still hold (a
/// released or expired cart's items may have been pruned before it).
pub(super) async fn read(
    conn: &mut Conn,
    tenant: &Tenant,
    key: &RequestKey,
) -> Result<Option<Cart>, StoreError> {
    let row = sql(
        "SELECT request_key, user_id, status, expires_at, extended FROM carts
                   WHERE tenant = $1 AND request_key = $2",
    )
    .bind(tenant.as_str())
    .bind(key.as_str())
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let lifecycle = lifecycle_from(&row)?;
    // Items sort between '{key}/' and '{key}0' ('0' follows '/'), in byte
    // order on both backends: the primary key's range.
    let (from, until) = (format!("{key}/"), format!("{key}0"));
    let items = sql("SELECT sku, qty, status FROM reservations
                     WHERE tenant = $1 AND request_key >= $2 AND request_key < $3
                     ORDER BY sku")
    .bind(tenant.as_str())
    .bind(from.as_str())
    .bind(until.as_str())
    .fetch_all(conn)
    .await?;
    let mut cart_items = Vec::with_capacity(items.len());
    for item in &items {
        if status_from(item)? != lifecycle.status {
            return Err(StoreError::Conflict(format!(
                "cart {key}: an item's status is not the cart's"
            )));
        }
        let qty: i32 = item.try_get("qty")?;
        cart_items.push(CartItem {
            sku: ident(item, "sku")?,
            qty: escrow_core::Qty::from_stored(u32::try_from(qty).map_err(|_| bad_row("qty"))?),
        });
    }
    Ok(Some(Cart {
        request_key: request_key(&row.try_get::<String>("request_key")?)?,
        user_id: UserId::parse(&row.try_get::<String>("user_id")?)
            .map_err(|_| bad_row("user_id"))?,
        lifecycle,
        items: cart_items,
        borrows: Default::default(),
    }))
}

/// Every held cart's tenant, key and expiry: what the cart expiry watches.
pub(super) async fn held(conn: &mut Conn) -> Result<Vec<(Tenant, RequestKey, u64)>, StoreError> {
    let rows = sql("SELECT tenant, request_key, expires_at FROM carts WHERE status = 'HELD'")
        .fetch_all(conn)
        .await?;
    rows.iter()
        .map(|row| {
            let expires_at =
                u64::try_from(millis(row, "expires_at")?).map_err(|_| bad_row("expires_at"))?;
            Ok((
                ident(row, "tenant")?,
                request_key(&row.try_get::<String>("request_key")?)?,
                expires_at,
            ))
        })
        .collect()
}

fn status_from(row: &Row) -> Result<Status, StoreError> {
    Status::parse(&row.try_get::<String>("status")?).ok_or_else(|| bad_row("status"))
}

fn lifecycle_from(row: &Row) -> Result<Lifecycle, StoreError> {
    Ok(Lifecycle {
        status: status_from(row)?,
        expires_at_ms: u64::try_from(millis(row, "expires_at")?)
            .map_err(|_| bad_row("expires_at"))?,
        extended: row.try_get("extended")?,
    })
}
