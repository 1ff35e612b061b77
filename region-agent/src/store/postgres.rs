//! The agent's store on PostgreSQL: the production choice, a server.
//!
//! [`super::SqlStore`] runs here as everywhere, with what PostgreSQL does
//! its own way: a pool of connections, so owners of different SKUs commit
//! in parallel; the lease row locked FOR SHARE by every write transaction,
//! so a takeover's UPDATE waits for every write of an older epoch in
//! flight; a list bound as one array, so a statement over a group's rows is
//! one round trip; sync snapshots in `REPEATABLE READ READ ONLY`.
//!
//! And one statement of its own, the hot commit: a group of batches that
//! only insert holds is sent as one statement outside any BEGIN/COMMIT
//! ([`commit_holds`]), its own transaction, which costs one round trip
//! instead of five (BEGIN, lease, INSERT, UPDATE, COMMIT). Its CTEs take
//! the transaction's steps in one snapshot:
//!
//! - `lease` locks the lease row FOR SHARE with our epoch, as
//!   `check_lease` does, so a takeover waits for this statement.
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

use service_kit::db::Backend;
use service_kit::sql::{self, sql, Db, Row};

use super::holds::{insert_sql, HoldColumns, Returned};
use super::{Batch, BatchError, BatchOutcome, Epoch, StoreError};

/// The embedded migrations of the region agent.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/region-agent");

/// The agent's store, opened on PostgreSQL ([`super::SqlStore::new`],
/// or [`super::SqlStore::open`] with a `postgres://` URL).
pub type PgStore = super::SqlStore;

/// Whether `batch` writes nothing but new holds, none on a borrowed
/// place: all [`commit_holds`] does.
pub(super) fn only_holds(batch: &Batch) -> bool {
    batch.holds.iter().all(|hold| hold.borrow.is_none())
        && batch.transitions.is_empty()
        && batch.changes.is_empty()
        && batch.grants.is_empty()
        && batch.returns.is_empty()
}

/// The one statement: the holds' table as `$1` to `$7`
/// ([`HoldColumns::table`]), the epoch as `$8`. Its rows: one per inserted
/// hold, or a single one with no hold if none was inserted, each with
/// what `ready` found and how many counter rows `moved` moved.
///
/// `ins` returns the reservations' byte-order ("C") text; `moved` compares
/// it in the default collation, that of the counters' primary key, or the
/// planner cannot use the key and scans every counter row.
fn commit_sql(insert: &str) -> String {
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
             {insert}
         ),
         moved AS (
             UPDATE sku_stock s
             SET available = s.available - i.units, held = s.held + i.units, updated_at = now()
             FROM (SELECT tenant, sku, sum(qty) AS units FROM ins GROUP BY tenant, sku) AS i
             WHERE s.tenant = i.tenant COLLATE \"default\" AND s.sku = i.sku COLLATE \"default\"
             RETURNING 1
         )
         SELECT r.leased, r.stocked, (SELECT count(*) FROM moved) AS skus_moved,
                i.tenant, i.sku, i.request_key
         FROM ready AS r LEFT JOIN ins AS i ON TRUE"
    )
}

/// Commits `batches`, each of which carries [`only_holds`], in one
/// statement. `Ok(None)`: nothing was written, because a batch fell short
/// of units or names a SKU the database lacks; commit the group in a
/// transaction, which names that batch.
pub(super) async fn commit_holds(
    db: &Db,
    epoch: Epoch,
    batches: &[&Batch],
) -> Result<Option<Vec<BatchOutcome>>, BatchError> {
    let columns = HoldColumns::new(batches);
    let table = columns.table();
    let text = commit_sql(&insert_sql(
        &table,
        Backend::Postgres,
        "WHERE (SELECT leased AND stocked FROM ready)",
    ));
    let mut conn = db
        .connection()
        .await
        .map_err(|e| BatchError::whole(e.into()))?;
    let rows = match sql(text)
        .bind_table(table)
        .bind(epoch.0)
        .fetch_all(&mut conn)
        .await
    {
        Ok(rows) => rows,
        Err(sql::Error::CheckViolation(_)) => return Ok(None),
        Err(e) => return Err(BatchError::whole(e.into())),
    };
    let answer = Answer::read(&rows).map_err(BatchError::whole)?;
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
        .inserted(answer.returned, |_, _| Ok(()))
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

/// What the statement's rows say.
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
    /// The answer in the statement's rows, of which there is at least one
    /// (`ready`'s, LEFT JOINed with whatever was inserted).
    fn read(rows: &[Row]) -> Result<Self, StoreError> {
        let first = rows.first().ok_or_else(|| {
            StoreError::Conflict("the one-statement commit returned no row".into())
        })?;
        let mut returned = Vec::with_capacity(rows.len());
        for row in rows {
            let tenant: Option<String> = row.try_get("tenant")?;
            if let Some(tenant) = tenant {
                returned.push((tenant, row.try_get("sku")?, row.try_get("request_key")?));
            }
        }
        Ok(Self {
            leased: first.try_get("leased")?,
            stocked: first.try_get("stocked")?,
            skus_moved: first.try_get("skus_moved")?,
            returned,
        })
    }
}
