//! Stored rows into domain types, once for both backends.
//!
//! PostgreSQL and SQLite return the same columns with different types
//! (`timestamptz` against INTEGER milliseconds, `integer` against INTEGER,
//! `boolean` against 0/1). Each backend says how to read one column
//! ([`Columns`]); what the columns mean, and the checks that a stored
//! value fits its domain type, are written here once.

use std::collections::HashMap;

use escrow_core::protocol::TransferMsg;
use escrow_core::{
    Ledger, Mode, Qty, RequestKey, Reservation, Sku, SkuSettings, Status, Tenant, TtlMs, UserId,
};

use super::{AuditRow, SkuRecord, StoreError};

/// Reading one named column of a backend's row.
pub(crate) trait Columns {
    /// An integer column of any width.
    fn int(&self, name: &str) -> Result<i64, StoreError>;
    /// A text column.
    fn text(&self, name: &str) -> Result<String, StoreError>;
    /// A boolean column.
    fn flag(&self, name: &str) -> Result<bool, StoreError>;
    /// A point in time, as ms since the epoch.
    fn millis(&self, name: &str) -> Result<i64, StoreError>;
}

/// A stored value that its domain type refuses: the database holds
/// something the agent never writes.
pub(crate) fn bad_row(what: &str) -> StoreError {
    StoreError::Conflict(format!("stored row violates its type: {what}"))
}

/// A counter column, which the schema keeps non-negative.
pub(crate) fn counter(row: &impl Columns, name: &str) -> Result<u64, StoreError> {
    u64::try_from(row.int(name)?).map_err(|_| bad_row(name))
}

/// A request key as stored.
pub(crate) fn request_key(raw: &str) -> Result<RequestKey, StoreError> {
    RequestKey::parse(raw).map_err(|_| bad_row("request_key"))
}

/// A quantity as stored.
pub(crate) fn qty(raw: i64) -> Result<Qty, StoreError> {
    Ok(Qty::from_stored(
        u32::try_from(raw).map_err(|_| bad_row("qty"))?,
    ))
}

/// A reservation from `RESERVATION_COLUMNS`.
pub(crate) fn reservation_from(row: &impl Columns) -> Result<Reservation, StoreError> {
    let status = row.text("status")?;
    Ok(Reservation {
        request_key: request_key(&row.text("request_key")?)?,
        user_id: UserId::parse(&row.text("user_id")?).map_err(|_| bad_row("user_id"))?,
        sku: Sku::parse(&row.text("sku")?).map_err(|_| bad_row("sku"))?,
        qty: qty(row.int("qty")?)?,
        status: Status::parse(&status).ok_or_else(|| bad_row("status"))?,
        expires_at_ms: u64::try_from(row.millis("expires_at")?)
            .map_err(|_| bad_row("expires_at"))?,
        extended: row.flag("extended")?,
    })
}

/// A SKU from `SKU_SELECT`: counters, settings and row sums.
pub(crate) fn sku_record_from(row: &impl Columns) -> Result<SkuRecord, StoreError> {
    let max_per_user = row.int("max_per_user")?;
    Ok(SkuRecord {
        tenant: Tenant::parse(&row.text("tenant")?).map_err(|_| bad_row("tenant"))?,
        sku: Sku::parse(&row.text("sku")?).map_err(|_| bad_row("sku"))?,
        ledger: Ledger {
            available: counter(row, "available")?,
            held: counter(row, "held")?,
            sold: counter(row, "sold")?,
            received: counter(row, "received")?,
            returned: counter(row, "returned")?,
        },
        settings: SkuSettings {
            max_per_user: u32::try_from(max_per_user).map_err(|_| bad_row("max_per_user"))?,
            hold_ttl: TtlMs::parse(row.int("hold_ttl_ms")?).map_err(|_| bad_row("hold_ttl_ms"))?,
        },
        paused: row.flag("paused")?,
        mode: Mode::parse(&row.text("mode")?).ok_or_else(|| bad_row("mode"))?,
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
pub(crate) fn hold_from(row: &impl Columns) -> Result<(Tenant, Reservation), StoreError> {
    let tenant = Tenant::parse(&row.text("tenant")?).map_err(|_| bad_row("tenant"))?;
    Ok((tenant, reservation_from(row)?))
}

/// A SKU's audit line from `SKU_SELECT`.
pub(crate) fn audit_row_from(row: &impl Columns) -> Result<AuditRow, StoreError> {
    let (available, held, sold) = (row.int("available")?, row.int("held")?, row.int("sold")?);
    let quota = row.int("received")? - row.int("returned")?;
    Ok(AuditRow {
        tenant: row.text("tenant")?,
        sku: row.text("sku")?,
        quota,
        available,
        held,
        sold,
        drift: available + held + sold - quota,
        rows_drift: (row.int("rows_held")? - held).abs() + (row.int("rows_sold")? - sold).abs(),
    })
}

/// A pending return from the outbox.
pub(crate) fn transfer_from(row: &impl Columns) -> Result<TransferMsg, StoreError> {
    Ok(TransferMsg {
        id: row.text("id")?,
        tenant: row.text("tenant")?,
        sku: row.text("sku")?,
        units: counter(row, "units")?,
    })
}

/// A deleted reservation's tenant and key, as `RETURNING tenant,
/// request_key` gives them.
pub(crate) fn pruned_key(row: &impl Columns) -> Result<(Tenant, RequestKey), StoreError> {
    let tenant = Tenant::parse(&row.text("tenant")?).map_err(|_| bad_row("tenant"))?;
    Ok((tenant, request_key(&row.text("request_key")?)?))
}
