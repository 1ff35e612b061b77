//! The new holds of a group of batches as the columns of one table,
//! written by one INSERT.
//!
//! Both ways of committing a group insert its holds with the same statement
//! ([`insert_sql`]) over the same table ([`HoldColumns::table`]), and read
//! what it returned the same way ([`HoldColumns::inserted`]): inside the
//! transaction ([`super::commit`]) and, on PostgreSQL, as a step of the
//! one-statement commit ([`super::postgres`]). So a hold is judged, and its
//! outcome mapped back to its batch, identically on either path.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use escrow_core::Qty;
use service_kit::db::Backend;
use service_kit::sql::Table;

use super::rows::at;
use super::{Batch, StoreError};

/// The INSERT of the holds of `table` ([`HoldColumns::table`], bound from
/// `$1` on), in the order given, with `guard` (a WHERE clause, or nothing)
/// deciding whether any row is inserted at all. A conflict on the key (a
/// replay) or on the one-active-per-user index skips the row; RETURNING
/// names the rows inserted.
pub(super) fn insert_sql(table: &Table<'_>, backend: Backend, guard: &str) -> String {
    format!(
        "INSERT INTO reservations (tenant, request_key, sku, user_id, qty, status, expires_at, created_at)
         SELECT u.tenant, u.request_key, u.sku, u.user_id, u.qty, 'HELD', u.expires_at, u.created_at
         FROM {}
         {guard}
         ORDER BY u.n
         ON CONFLICT DO NOTHING
         RETURNING tenant, sku, request_key, qty",
        table.sql(backend, 1)
    )
}

/// A row the INSERT returned: tenant, SKU and request key.
pub(super) type Returned = (String, String, String);

/// Every hold of a group, one column per field, and the batch and hold
/// each row came from.
pub(super) struct HoldColumns<'a> {
    /// Holds per batch, in batch order.
    holds_per_batch: Vec<usize>,
    /// For each row, its batch and its index among that batch's holds.
    origin: Vec<(usize, usize)>,
    tenants: Vec<&'a str>,
    skus: Vec<&'a str>,
    keys: Vec<&'a str>,
    users: Vec<&'a str>,
    qtys: Vec<Qty>,
    expiries: Vec<DateTime<Utc>>,
    created: Vec<DateTime<Utc>>,
}

impl<'a> HoldColumns<'a> {
    /// The holds of `batches`, batch by batch, each batch's in its order.
    pub(super) fn new(batches: &[&'a Batch]) -> Self {
        let count: usize = batches.iter().map(|b| b.holds.len()).sum();
        let mut columns = Self {
            holds_per_batch: batches.iter().map(|b| b.holds.len()).collect(),
            origin: Vec::with_capacity(count),
            tenants: Vec::with_capacity(count),
            skus: Vec::with_capacity(count),
            keys: Vec::with_capacity(count),
            users: Vec::with_capacity(count),
            qtys: Vec::with_capacity(count),
            expiries: Vec::with_capacity(count),
            created: Vec::with_capacity(count),
        };
        for (b, batch) in batches.iter().enumerate() {
            for (h, hold) in batch.holds.iter().enumerate() {
                columns.origin.push((b, h));
                columns.tenants.push(batch.tenant.as_str());
                columns.skus.push(batch.sku.as_str());
                columns.keys.push(hold.request_key.as_str());
                columns.users.push(hold.user_id.as_str());
                columns.qtys.push(hold.qty);
                columns.expiries.push(at(hold.expires_at_ms));
                columns.created.push(at(batch.now_ms));
            }
        }
        columns
    }

    /// Whether the group carries no hold at all.
    pub(super) fn is_empty(&self) -> bool {
        self.origin.is_empty()
    }

    /// The holds as the table `u` of [`insert_sql`]: tenant, SKU, request
    /// key, user, quantity, expiry and creation, in that order.
    pub(super) fn table(&self) -> Table<'a> {
        // A quantity is at most its SKU's max_per_user, itself at most 1000.
        let qtys: Vec<i32> = self.qtys.iter().map(|qty| qty.get() as i32).collect();
        Table::new("u")
            .column("tenant", self.tenants.clone())
            .column("sku", self.skus.clone())
            .column("request_key", self.keys.clone())
            .column("user_id", self.users.clone())
            .column("qty", qtys)
            .column("expires_at", self.expiries.clone())
            .column("created_at", self.created.clone())
    }

    /// For each batch, whether each of its holds was inserted, from the
    /// rows the INSERT returned; `moved(batch, qty)` is called once per
    /// inserted row with the units its batch's counters move by.
    pub(super) fn inserted(
        &self,
        returned: impl IntoIterator<Item = Returned>,
        mut moved: impl FnMut(usize, Qty) -> Result<(), StoreError>,
    ) -> Result<Vec<Vec<bool>>, StoreError> {
        let mut inserted: Vec<Vec<bool>> = self
            .holds_per_batch
            .iter()
            .map(|&holds| vec![false; holds])
            .collect();
        let index_of: HashMap<(&str, &str, &str), usize> = (0..self.origin.len())
            .map(|i| ((self.tenants[i], self.skus[i], self.keys[i]), i))
            .collect();
        for (tenant, sku, key) in returned {
            let i = *index_of
                .get(&(tenant.as_str(), sku.as_str(), key.as_str()))
                .ok_or_else(|| StoreError::Conflict("inserted a key not in the batch".into()))?;
            let (b, h) = self.origin[i];
            inserted[b][h] = true;
            moved(b, self.qtys[i])?;
        }
        Ok(inserted)
    }
}
