//! A group of batches that only insert holds, committed as one statement.
//!
//! Buyers' new holds are the hot commit. Sent as one statement outside any
//! BEGIN/COMMIT, the group is its own transaction and costs one round trip
//! instead of five (BEGIN, lease, INSERT, UPDATE, COMMIT). Its CTEs take
//! the transaction's steps in one snapshot:
//!
//! - `lease` locks the lease row FOR SHARE with our epoch, as `check_lease`
//!   does, so a takeover waits for this statement.
//! - `stock` locks the counter row of every SKU the holds name, so none can
//!   vanish before `moved`; `ready` says whether the lease and every such
//!   row were found. Unless both were, `ins` inserts nothing, `moved` then
//!   moves nothing, and the statement writes nothing.
//! - `ins` is the transaction's INSERT ([`super::holds`]) under that guard.
//! - `moved` moves each SKU's counters by the units of its inserted rows,
//!   with no condition: a shortfall breaks `sku_stock_available_check`,
//!   and the statement fails whole, writing nothing.
//!
//! A statement cannot say which batch fell short or names a SKU the
//! database lacks; the transaction (`move_counters`) can, so for those two
//! the group goes there, and the committer leaves the named batch out.

use std::collections::HashSet;
use std::sync::LazyLock;

use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;

use super::holds::{insert_sql, HoldColumns, Returned};
use super::{database, Batch, BatchError, BatchOutcome, Epoch, StoreError};

/// The one statement: the holds' columns as `$1` to `$7` (see
/// [`HoldColumns::bind`]), the epoch as `$8`.
///
/// `ins` returns the reservations' byte-order ("C") text; `moved` compares
/// it in the default collation, that of the counters' primary key, or the
/// planner cannot use the key and scans every counter row.
static COMMIT_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH lease AS (
             SELECT 1 FROM region_lease WHERE epoch = $8 FOR SHARE
         ),
         stock AS (
             SELECT 1 FROM sku_stock
             WHERE (tenant, sku) IN (SELECT * FROM unnest($1::text[], $2::text[]))
             FOR NO KEY UPDATE
         ),
         ready AS (
             SELECT EXISTS (SELECT 1 FROM lease) AS leased,
                    (SELECT count(*) FROM stock)
                        = (SELECT count(*) FROM (SELECT DISTINCT * FROM unnest($1::text[], $2::text[])) AS g)
                        AS stocked
         ),
         ins AS (
             {}
         ),
         moved AS (
             UPDATE sku_stock s
             SET available = s.available - i.units, held = s.held + i.units, updated_at = now()
             FROM (SELECT tenant, sku, sum(qty) AS units FROM ins GROUP BY tenant, sku) AS i
             WHERE s.tenant = i.tenant COLLATE \"default\" AND s.sku = i.sku COLLATE \"default\"
             RETURNING 1
         )
         SELECT (SELECT leased FROM ready) AS leased, (SELECT stocked FROM ready) AS stocked,
                (SELECT count(*) FROM moved) AS skus_moved,
                array_agg(tenant) AS tenants, array_agg(sku) AS skus, array_agg(request_key) AS keys
         FROM ins",
        insert_sql("WHERE (SELECT leased AND stocked FROM ready)")
    )
});

/// Whether `batch` writes nothing but new holds, all the one statement does.
pub(super) fn only_holds(batch: &Batch) -> bool {
    batch.transitions.is_empty()
        && batch.changes.is_empty()
        && batch.grants.is_empty()
        && batch.returns.is_empty()
}

/// Commits `batches`, each of which carries [`only_holds`], in one
/// statement. `Ok(None)`: nothing was written, because a batch fell short
/// of units or names a SKU the database lacks; commit the group in a
/// transaction, which names that batch.
pub(super) async fn commit(
    pool: &PgPool,
    epoch: Epoch,
    batches: &[&Batch],
) -> Result<Option<Vec<BatchOutcome>>, BatchError> {
    let columns = HoldColumns::new(batches);
    let row = match columns
        .bind(sqlx::query(&COMMIT_SQL))
        .bind(epoch.0)
        .fetch_one(pool)
        .await
    {
        Ok(row) => row,
        Err(sqlx::Error::Database(db)) if db.is_check_violation() => return Ok(None),
        Err(e) => return Err(BatchError::whole(database(e))),
    };
    let answer = Answer::read(&row).map_err(BatchError::whole)?;
    if !answer.leased {
        return Err(BatchError::whole(StoreError::Fenced));
    }
    if !answer.stocked {
        return Ok(None);
    }
    let skus_with_holds: HashSet<(&str, &str)> = answer
        .returned
        .iter()
        .map(|(tenant, sku, _)| (tenant.as_str(), sku.as_str()))
        .collect();
    // Every SKU of an inserted row had its counter row locked by `stock`, so
    // `moved` found it. The statement has committed, so a mismatch would be
    // drift already stored: every batch fails, its owner reloads, and the
    // reload's rows-against-counters check stops the SKU.
    if answer.skus_moved != skus_with_holds.len() as i64 {
        return Err(BatchError::whole(StoreError::Conflict(format!(
            "one-statement commit moved {} counter rows for {} SKUs with new holds",
            answer.skus_moved,
            skus_with_holds.len()
        ))));
    }
    let inserted = columns
        .inserted(answer.returned, |_, _| ())
        .map_err(BatchError::whole)?;
    Ok(Some(
        inserted
            .into_iter()
            .map(|inserted| BatchOutcome {
                inserted,
                applied_grants: Vec::new(),
            })
            .collect(),
    ))
}

/// What the statement's one row says.
struct Answer {
    /// The lease row with our epoch was found (and locked).
    leased: bool,
    /// Every SKU the holds name has its counter row.
    stocked: bool,
    /// Counter rows the statement moved.
    skus_moved: i64,
    /// The rows inserted.
    returned: Vec<Returned>,
}

impl Answer {
    /// The answer in the statement's only row.
    fn read(row: &PgRow) -> Result<Self, StoreError> {
        // array_agg over no inserted row is NULL.
        let column = |name: &str| -> Result<Vec<String>, StoreError> {
            let values: Option<Vec<String>> = row.try_get(name).map_err(database)?;
            Ok(values.unwrap_or_default())
        };
        let (tenants, skus, keys) = (column("tenants")?, column("skus")?, column("keys")?);
        Ok(Self {
            leased: row.try_get("leased").map_err(database)?,
            stocked: row.try_get("stocked").map_err(database)?,
            skus_moved: row.try_get("skus_moved").map_err(database)?,
            returned: tenants
                .into_iter()
                .zip(skus)
                .zip(keys)
                .map(|((tenant, sku), key)| (tenant, sku, key))
                .collect(),
        })
    }
}
