//! Stored rows into domain types, and domain times into stored ones.
//!
//! Both backends return the same columns ([`service_kit::sql::Row`] reads
//! either); what the columns mean, and the checks that a stored value fits
//! its domain type, are written here once.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use escrow_core::protocol::TransferMsg;
use escrow_core::{
    Ledger, Mode, Qty, RequestKey, Reservation, Sku, SkuSettings, Status, Tenant, TtlMs, UserId,
    UserLimitScope,
};
use service_kit::sql::Row;

use super::{AuditRow, SkuRecord, StoreError};

/// The columns `reservation_from` reads.
pub(crate) const RESERVATION_COLUMNS: &str =
    "request_key, user_id, sku, qty, status, expires_at, extended";

/// A time the agent's clock gave, in ms since the epoch, as bound to a
/// statement.
pub(crate) fn at(ms: u64) -> DateTime<Utc> {
    // ms values come from the agent's clock plus a bounded TTL, far inside chrono's range.
    i64::try_from(ms)
        .ok()
        .and_then(DateTime::from_timestamp_millis)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// A stored value that its domain type refuses: the database holds
/// something the agent never writes.
pub(crate) fn bad_row(what: &str) -> StoreError {
    StoreError::Conflict(format!("stored row violates its type: {what}"))
}

/// A text column.
pub(crate) fn text(row: &Row, name: &str) -> Result<String, StoreError> {
    Ok(row.try_get(name)?)
}

/// A text column holding an identifier, parsed into its type.
pub(crate) fn ident<T: TryFrom<String>>(row: &Row, name: &str) -> Result<T, StoreError> {
    T::try_from(text(row, name)?).map_err(|_| bad_row(name))
}

/// A `bigint` column.
fn int(row: &Row, name: &str) -> Result<i64, StoreError> {
    Ok(row.try_get(name)?)
}

/// A counter column, which the schema keeps non-negative.
fn counter(row: &Row, name: &str) -> Result<u64, StoreError> {
    u64::try_from(int(row, name)?).map_err(|_| bad_row(name))
}

/// A NOT NULL time column, as ms since the epoch.
pub(crate) fn millis(row: &Row, name: &str) -> Result<i64, StoreError> {
    let at = row.time(name)?.ok_or_else(|| bad_row(name))?;
    Ok(at.timestamp_millis())
}

/// A request key as stored.
pub(crate) fn request_key(raw: &str) -> Result<RequestKey, StoreError> {
    RequestKey::parse_stored(raw).map_err(|_| bad_row("request_key"))
}

/// A quantity as stored.
fn qty(raw: i32) -> Result<Qty, StoreError> {
    Ok(Qty::from_stored(
        u32::try_from(raw).map_err(|_| bad_row("qty"))?,
    ))
}

/// A reservation from [`RESERVATION_COLUMNS`].
pub(crate) fn reservation_from(row: &Row) -> Result<Reservation, StoreError> {
    Ok(Reservation {
        request_key: request_key(&text(row, "request_key")?)?,
        user_id: UserId::parse(&text(row, "user_id")?).map_err(|_| bad_row("user_id"))?,
        sku: ident(row, "sku")?,
        qty: qty(row.try_get("qty")?)?,
        status: Status::parse(&text(row, "status")?).ok_or_else(|| bad_row("status"))?,
        expires_at_ms: u64::try_from(millis(row, "expires_at")?)
            .map_err(|_| bad_row("expires_at"))?,
        extended: row.try_get("extended")?,
    })
}

/// A SKU from `SKU_SELECT`: counters, settings and row sums.
pub(crate) fn sku_record_from(row: &Row) -> Result<SkuRecord, StoreError> {
    let max_per_user: i32 = row.try_get("max_per_user")?;
    Ok(SkuRecord {
        tenant: ident(row, "tenant")?,
        sku: ident(row, "sku")?,
        ledger: Ledger {
            available: counter(row, "available")?,
            held: counter(row, "held")?,
            sold: counter(row, "sold")?,
            received: counter(row, "received")?,
            returned: counter(row, "returned")?,
        },
        settings: SkuSettings {
            max_per_user: u32::try_from(max_per_user).map_err(|_| bad_row("max_per_user"))?,
            hold_ttl: TtlMs::parse(int(row, "hold_ttl_ms")?).map_err(|_| bad_row("hold_ttl_ms"))?,
            user_limit_scope: UserLimitScope::parse(&text(row, "user_limit_scope")?)
                .map_err(|_| bad_row("user_limit_scope"))?,
        },
        paused: row.try_get("paused")?,
        mode: Mode::parse(&text(row, "mode")?).ok_or_else(|| bad_row("mode"))?,
        rows_held: counter(row, "rows_held")?,
        rows_sold: counter(row, "rows_sold")?,
        holds: Vec::new(),
    })
}

/// Gives each record the HELD reservations of its SKU, read from
/// `HELD_SELECT` as `(tenant, reservation)`.
pub(crate) fn with_holds(
    mut records: Vec<SkuRecord>,
    holds: Vec<(Tenant, Reservation)>,
) -> Vec<SkuRecord> {
    let index: HashMap<(Tenant, Sku), usize> = records
        .iter()
        .enumerate()
        .map(|(i, r)| ((r.tenant.clone(), r.sku.clone()), i))
        .collect();
    for (tenant, r) in holds {
        if let Some(&i) = index.get(&(tenant, r.sku.clone())) {
            records[i].holds.push(r);
        }
    }
    records
}

/// A HELD reservation with its tenant, from `HELD_SELECT`.
pub(crate) fn hold_from(row: &Row) -> Result<(Tenant, Reservation), StoreError> {
    Ok((ident(row, "tenant")?, reservation_from(row)?))
}

/// A SKU's audit line from `SKU_SELECT`.
pub(crate) fn audit_row_from(row: &Row) -> Result<AuditRow, StoreError> {
    let (available, held, sold) = (int(row, "available")?, int(row, "held")?, int(row, "sold")?);
    let quota = int(row, "received")? - int(row, "returned")?;
    Ok(AuditRow {
        tenant: text(row, "tenant")?,
        sku: text(row, "sku")?,
        quota,
        available,
        held,
        sold,
        drift: available + held + sold - quota,
        rows_drift: (int(row, "rows_held")? - held).abs() + (int(row, "rows_sold")? - sold).abs(),
    })
}

/// A pending return from the outbox.
pub(crate) fn transfer_from(row: &Row) -> Result<TransferMsg, StoreError> {
    Ok(TransferMsg {
        id: ident(row, "id")?,
        tenant: ident(row, "tenant")?,
        sku: ident(row, "sku")?,
        units: counter(row, "units")?,
    })
}

/// A deleted reservation's tenant and key, as `RETURNING tenant,
/// request_key` gives them.
pub(crate) fn pruned_key(row: &Row) -> Result<(Tenant, RequestKey), StoreError> {
    Ok((
        ident(row, "tenant")?,
        request_key(&text(row, "request_key")?)?,
    ))
}
