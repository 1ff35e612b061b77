//! [`Store`] on an embedded SQLite file.
//!
//! The same guarantees as [`super::postgres`], enforced the same way: the
//! schema (`migrations/region-agent-sqlite/`) has the same CHECK
//! constraints and unique indexes; every write is conditional and its
//! affected-row count is checked; a batch is one transaction, all of it or
//! none; a 201 is sent only after its transaction is on disk (WAL with
//! `synchronous=FULL` syncs the log at every commit).
//!
//! SQLite has one writer per file. Writes go through a pool of one
//! connection and start with `BEGIN IMMEDIATE`, which takes the write lock
//! first, so commits of this process queue for the connection and a second
//! process (an agent taking over the region) waits for the lock for up to
//! [`BUSY_TIMEOUT`] instead of failing with `SQLITE_BUSY`. Readers have
//! their own pool; in WAL mode they read a committed snapshot without
//! waiting for the writer. The file is opened as every service opens one
//! (`service_kit::db::open_sqlite`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use escrow_core::{RegionName, RequestKey, Reservation, Sku, SkuSettings, Tenant, Transition};
use futures_util::TryStreamExt;
use service_kit::db;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::{Row, Sqlite, Transaction};

use super::rows::{
    audit_row_from, hold_from, pruned_key, request_key, reservation_from, sku_record_from,
    transfer_from, with_holds, Columns,
};
use super::{
    database, one_sku_row, AuditRow, Batch, BatchError, BatchOutcome, Epoch, Provenance, Pruned,
    SkuRecord, StockChange, Store, StoreError, SyncSnapshot,
};

/// The embedded migrations of the region agent on SQLite.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/region-agent-sqlite");

/// Longest a write waits for the file's write lock (held by another
/// process) or for this process's write connection, as PostgreSQL's
/// statement timeout bounds a stuck statement: a commit that cannot start
/// fails and its owner reloads, rather than holding the owner forever.
pub const BUSY_TIMEOUT: Duration = db::SQLITE_BUSY_TIMEOUT;

/// The database's clock in ms, for bookkeeping columns only (`updated_at`,
/// `taken_at`); every decision compares with the batch's `now_ms`, so a
/// column a decision reads (`applied_at`, which prune compares with its
/// cut) is written from it.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// A SQLite-backed store: one write connection, a pool of readers.
#[derive(Debug)]
pub struct SqliteStore {
    writer: SqlitePool,
    readers: SqlitePool,
    writes_waiting: AtomicUsize,
}

impl SqliteStore {
    /// Opens the database at `url` (`sqlite://PATH`), creating the file if
    /// missing, and applies the agent's migrations; `readers` connections
    /// serve reads beside the one writer.
    pub async fn open(url: &str, readers: u32) -> Result<Self, StoreError> {
        let pools = db::open_sqlite(url, readers, &MIGRATOR)
            .await
            .map_err(database)?;
        Ok(Self {
            writer: pools.writer,
            readers: pools.readers,
            writes_waiting: AtomicUsize::new(0),
        })
    }

    /// How many write transactions are waiting for the write connection or
    /// the file's write lock right now: contention on the single writer.
    pub fn writes_waiting(&self) -> usize {
        self.writes_waiting.load(Ordering::SeqCst)
    }

    /// A write transaction holding the file's write lock.
    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let _waiting = Waiting::new(&self.writes_waiting);
        self.writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(database)
    }
}

/// Counts one waiting write for as long as it lives, even if the wait is
/// cancelled.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Columns for SqliteRow {
    fn int(&self, name: &str) -> Result<i64, StoreError> {
        self.try_get(name).map_err(database)
    }
    fn text(&self, name: &str) -> Result<String, StoreError> {
        self.try_get(name).map_err(database)
    }
    fn flag(&self, name: &str) -> Result<bool, StoreError> {
        self.try_get(name).map_err(database)
    }
    fn millis(&self, name: &str) -> Result<i64, StoreError> {
        self.try_get(name).map_err(database)
    }
}

/// `ms` as stored: INTEGER milliseconds since the epoch.
fn ms(value: u64) -> i64 {
    // ms values come from the agent's clock plus a bounded TTL, far below i64::MAX.
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A JSON array of strings, bound as one parameter and read with
/// `json_each`, as PostgreSQL binds a `text[]`.
fn json_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    serde_json::Value::from(items.into_iter().collect::<Vec<_>>()).to_string()
}

/// Counters and row sums per SKU. SQLite uses a partial index only when the
/// query repeats the index's condition, so the SOLD sum names the
/// one-active-per-user index's `status IN ('HELD', 'SOLD')`: without it,
/// each SKU's sum scans every reservation (seconds at start on a big file).
const SKU_SELECT: &str = "
    SELECT s.tenant, s.sku, s.available, s.held, s.sold, s.received, s.returned,
           s.max_per_user, s.hold_ttl_ms, s.paused, s.mode,
           COALESCE((SELECT sum(qty) FROM reservations r
                     WHERE r.tenant = s.tenant AND r.sku = s.sku AND r.status = 'HELD'), 0) AS rows_held,
           COALESCE((SELECT sum(qty) FROM reservations r
                     WHERE r.tenant = s.tenant AND r.sku = s.sku
                       AND r.status IN ('HELD', 'SOLD') AND r.status = 'SOLD'), 0) AS rows_sold
    FROM sku_stock s";

const RESERVATION_COLUMNS: &str = "request_key, user_id, sku, qty, status, expires_at, extended";

/// Every HELD reservation with its tenant: what the owners settle and
/// expire from memory.
const HELD_SELECT: &str = "
    SELECT tenant, request_key, user_id, sku, qty, status, expires_at, extended
    FROM reservations WHERE status = 'HELD'";

/// Applies one batch inside `tx`: transitions (expiries among them),
/// changes, grants, holds, returns, then the counters once.
async fn apply_batch(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &Batch,
) -> Result<BatchOutcome, StoreError> {
    let mut deltas = Deltas::default();
    // The order of PgStore::commit, for the same reasons: transitions
    // first, holds after them, counters once at the end.
    apply_transitions(tx, batch, &mut deltas).await?;
    apply_changes(tx, batch, &mut deltas).await?;
    let applied_grants = apply_grants(tx, batch, &mut deltas).await?;
    let inserted = insert_holds(tx, batch, &mut deltas).await?;
    debit_returns(tx, batch, &mut deltas).await?;
    if !deltas.is_zero() {
        // The CHECK constraints refuse any move that would go negative
        // or unbalance the ledger.
        let changed = sqlx::query(&format!(
            "UPDATE sku_stock
             SET available = available + ?3, held = held + ?4, sold = sold + ?5,
                 received = received + ?6, returned = returned + ?7, updated_at = {NOW_MS}
             WHERE tenant = ?1 AND sku = ?2 AND available + ?3 >= 0"
        ))
        .bind(batch.tenant.as_str())
        .bind(batch.sku.as_str())
        .bind(deltas.available)
        .bind(deltas.held)
        .bind(deltas.sold)
        .bind(deltas.received)
        .bind(deltas.returned)
        .execute(&mut **tx)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(db) if db.is_check_violation() => {
                StoreError::Conflict("counter update refused by a CHECK constraint".into())
            }
            other => database(other),
        })?
        .rows_affected();
        if changed != 1 {
            return Err(StoreError::Conflict("not enough units available".into()));
        }
    }
    Ok(BatchOutcome {
        inserted,
        applied_grants,
    })
}

/// Checks that the lease row still carries our epoch. The transaction holds
/// the write lock (`BEGIN IMMEDIATE`), so a takeover, itself a write, waits
/// for this transaction, and a transaction after a takeover finds no row.
async fn check_lease(tx: &mut Transaction<'_, Sqlite>, epoch: Epoch) -> Result<(), StoreError> {
    let row = sqlx::query("SELECT 1 FROM region_lease WHERE epoch = ?1")
        .bind(epoch.0)
        .fetch_optional(&mut **tx)
        .await
        .map_err(database)?;
    row.map(|_| ()).ok_or(StoreError::Fenced)
}

/// Counter moves of one batch, applied in one conditional UPDATE.
#[derive(Debug, Default)]
struct Deltas {
    available: i64,
    held: i64,
    sold: i64,
    received: i64,
    returned: i64,
}

impl Deltas {
    fn is_zero(&self) -> bool {
        self.available == 0
            && self.held == 0
            && self.sold == 0
            && self.received == 0
            && self.returned == 0
    }
}

/// Applies the batch's transitions one statement per transition, in the
/// order the owner decided them, each required to change its one row.
///
/// PostgreSQL groups them into rounds (a key's `n`-th transition in round
/// `n`) to run set-based statements; a statement here costs no round trip,
/// so decision order itself is used. Both commit each key's transitions in
/// decision order, and transitions of different keys touch different rows,
/// so the outcome is the same.
async fn apply_transitions(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<(), StoreError> {
    let now = ms(batch.now_ms);
    for (key, qty, transition) in &batch.transitions {
        let units = i64::from(qty.get());
        let (sql, until) = match transition {
            Transition::Confirm => (
                "UPDATE reservations SET status = 'SOLD'
                 WHERE tenant = ?1 AND sku = ?2 AND request_key = ?3 AND status = 'HELD' AND expires_at > ?4",
                None,
            ),
            Transition::Release => (
                "UPDATE reservations SET status = 'RELEASED'
                 WHERE tenant = ?1 AND sku = ?2 AND request_key = ?3 AND status = 'HELD' AND expires_at > ?4",
                None,
            ),
            Transition::Expire => (
                "UPDATE reservations SET status = 'EXPIRED'
                 WHERE tenant = ?1 AND sku = ?2 AND request_key = ?3 AND status = 'HELD' AND expires_at <= ?4",
                None,
            ),
            Transition::Extend { expires_at_ms } => (
                "UPDATE reservations SET expires_at = ?5, extended = 1
                 WHERE tenant = ?1 AND sku = ?2 AND request_key = ?3
                   AND status = 'HELD' AND NOT extended AND expires_at > ?4",
                Some(ms(*expires_at_ms)),
            ),
        };
        let mut query = sqlx::query(sql)
            .bind(batch.tenant.as_str())
            .bind(batch.sku.as_str())
            .bind(key.as_str())
            .bind(now);
        if let Some(until) = until {
            query = query.bind(until);
        }
        let changed = query
            .execute(&mut **tx)
            .await
            .map_err(database)?
            .rows_affected();
        if changed != 1 {
            return Err(StoreError::Conflict(format!(
                "transition {transition:?} of {key} changed {changed} rows"
            )));
        }
        match transition {
            Transition::Confirm => {
                deltas.held -= units;
                deltas.sold += units;
            }
            Transition::Release | Transition::Expire => {
                deltas.held -= units;
                deltas.available += units;
            }
            Transition::Extend { .. } => {}
        }
    }
    Ok(())
}

/// Inserts the holds in batch order; a conflict on the key (a replay) or on
/// the one-active-per-user index skips the row, and the affected-row count
/// tells which rows are new.
async fn insert_holds(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<Vec<bool>, StoreError> {
    let mut inserted = Vec::with_capacity(batch.holds.len());
    for hold in &batch.holds {
        let new = sqlx::query(
            "INSERT INTO reservations (tenant, request_key, sku, user_id, qty, status, expires_at, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'HELD', ?6, ?7)
             ON CONFLICT DO NOTHING",
        )
        .bind(batch.tenant.as_str())
        .bind(hold.request_key.as_str())
        .bind(batch.sku.as_str())
        .bind(hold.user_id.as_str())
        .bind(i64::from(hold.qty.get()))
        .bind(ms(hold.expires_at_ms))
        .bind(ms(batch.now_ms))
        .execute(&mut **tx)
        .await
        .map_err(database)?
        .rows_affected()
            == 1;
        if new {
            deltas.available -= i64::from(hold.qty.get());
            deltas.held += i64::from(hold.qty.get());
        }
        inserted.push(new);
    }
    Ok(inserted)
}

async fn apply_changes(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<(), StoreError> {
    for change in &batch.changes {
        let set = match *change {
            StockChange::Receive(units) => {
                deltas.received += units as i64;
                deltas.available += units as i64;
                continue;
            }
            StockChange::Return(units) => {
                deltas.returned += units as i64;
                deltas.available -= units as i64;
                continue;
            }
            StockChange::Settings(_) => "max_per_user = ?3, hold_ttl_ms = ?4",
            StockChange::Mode(_) => "mode = ?3",
            StockChange::Pause(_) => "paused = ?3",
        };
        let sql = format!(
            "UPDATE sku_stock SET {set}, updated_at = {NOW_MS} WHERE tenant = ?1 AND sku = ?2"
        );
        let query = sqlx::query(&sql)
            .bind(batch.tenant.as_str())
            .bind(batch.sku.as_str());
        let query = match *change {
            StockChange::Settings(settings) => query
                .bind(i64::from(settings.max_per_user))
                .bind(settings.hold_ttl.get() as i64),
            StockChange::Mode(mode) => query.bind(mode.as_str()),
            StockChange::Pause(paused) => query.bind(paused),
            StockChange::Receive(_) | StockChange::Return(_) => query,
        };
        let changed = query
            .execute(&mut **tx)
            .await
            .map_err(database)?
            .rows_affected();
        one_sku_row(changed)?;
    }
    Ok(())
}

/// Credits grants not seen before; the primary key of `applied_grants`
/// makes a duplicate delivery a no-op.
async fn apply_grants(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<Vec<String>, StoreError> {
    let mut applied = Vec::new();
    for grant in &batch.grants {
        let new = sqlx::query(
            "INSERT INTO applied_grants (id, tenant, sku, units, applied_at)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(&grant.id)
        .bind(batch.tenant.as_str())
        .bind(batch.sku.as_str())
        .bind(grant.units as i64)
        // The agent's clock, as prune's cut: the database's may differ.
        .bind(ms(batch.now_ms))
        .execute(&mut **tx)
        .await
        .map_err(database)?
        .rows_affected()
            == 1;
        if new {
            deltas.received += grant.units as i64;
            deltas.available += grant.units as i64;
            applied.push(grant.id.clone());
        }
    }
    Ok(applied)
}

/// Debits returns and records them in the outbox, in the same transaction.
async fn debit_returns(
    tx: &mut Transaction<'_, Sqlite>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<(), StoreError> {
    for ret in &batch.returns {
        sqlx::query("INSERT INTO outbox_returns (id, tenant, sku, units) VALUES (?1, ?2, ?3, ?4)")
            .bind(&ret.id)
            .bind(batch.tenant.as_str())
            .bind(batch.sku.as_str())
            .bind(ret.units as i64)
            .execute(&mut **tx)
            .await
            .map_err(database)?;
        deltas.returned += ret.units as i64;
        deltas.available -= ret.units as i64;
    }
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn take_lease(&self, region: &RegionName) -> Result<Epoch, StoreError> {
        // The write lock waits for every write transaction of an earlier
        // process, so when this commits no older epoch's write is in flight.
        let mut tx = self.begin_write().await?;
        let other: Option<String> =
            sqlx::query_scalar("SELECT region FROM region_lease WHERE region <> ?1 LIMIT 1")
                .bind(region.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(database)?;
        if let Some(other) = other {
            return Err(StoreError::WrongRegion(other));
        }
        let epoch: i64 = sqlx::query_scalar(&format!(
            "INSERT INTO region_lease (region, epoch) VALUES (?1, 1)
             ON CONFLICT (region) DO UPDATE SET epoch = region_lease.epoch + 1, taken_at = {NOW_MS}
             RETURNING epoch"
        ))
        .bind(region.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(database)?;
        tx.commit().await.map_err(database)?;
        Ok(Epoch(epoch))
    }

    async fn ready(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1 FROM region_lease LIMIT 1")
            .fetch_optional(&self.readers)
            .await
            .map_err(database)?;
        Ok(())
    }

    async fn load_skus(&self) -> Result<Vec<SkuRecord>, StoreError> {
        let rows = sqlx::query(&format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&self.readers)
            .await
            .map_err(database)?;
        let records = rows.iter().map(sku_record_from).collect::<Result<_, _>>()?;
        let holds = sqlx::query(HELD_SELECT)
            .fetch_all(&self.readers)
            .await
            .map_err(database)?;
        let holds = holds.iter().map(hold_from).collect::<Result<_, _>>()?;
        Ok(with_holds(records, holds))
    }

    async fn load_sku(&self, tenant: &Tenant, sku: &Sku) -> Result<Option<SkuRecord>, StoreError> {
        let row = sqlx::query(&format!("{SKU_SELECT} WHERE s.tenant = ?1 AND s.sku = ?2"))
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .fetch_optional(&self.readers)
            .await
            .map_err(database)?;
        let Some(record) = row.as_ref().map(sku_record_from).transpose()? else {
            return Ok(None);
        };
        let holds = sqlx::query(&format!("{HELD_SELECT} AND tenant = ?1 AND sku = ?2"))
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .fetch_all(&self.readers)
            .await
            .map_err(database)?;
        let holds = holds.iter().map(hold_from).collect::<Result<_, _>>()?;
        Ok(with_holds(vec![record], holds).pop())
    }

    async fn for_each_key(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        each: &mut (dyn FnMut(RequestKey, u64) + Send),
    ) -> Result<(), StoreError> {
        let mut rows = sqlx::query_as::<_, (String, i64)>(
            "SELECT request_key, created_at FROM reservations WHERE tenant = ?1 AND sku = ?2",
        )
        .bind(tenant.as_str())
        .bind(sku.as_str())
        .fetch(&self.readers);
        while let Some((key, created)) = rows.try_next().await.map_err(database)? {
            each(request_key(&key)?, u64::try_from(created).unwrap_or(0));
        }
        Ok(())
    }

    async fn create_sku(
        &self,
        epoch: Epoch,
        tenant: &Tenant,
        sku: &Sku,
        settings: SkuSettings,
        total: u64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        check_lease(&mut tx, epoch).await?;
        let created = sqlx::query(
            "INSERT INTO sku_stock (tenant, sku, available, held, sold, received, returned, max_per_user, hold_ttl_ms)
             VALUES (?1, ?2, ?3, 0, 0, ?3, 0, ?4, ?5)
             ON CONFLICT DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(sku.as_str())
        .bind(total as i64)
        .bind(i64::from(settings.max_per_user))
        .bind(settings.hold_ttl.get() as i64)
        .execute(&mut *tx)
        .await
        .map_err(database)?
        .rows_affected()
            == 1;
        tx.commit().await.map_err(database)?;
        Ok(created)
    }

    async fn commit_all(
        &self,
        epoch: Epoch,
        batches: &[&Batch],
    ) -> Result<Vec<BatchOutcome>, BatchError> {
        let mut tx = self.begin_write().await.map_err(BatchError::whole)?;
        check_lease(&mut tx, epoch)
            .await
            .map_err(BatchError::whole)?;
        let mut outcomes = Vec::with_capacity(batches.len());
        for (index, batch) in batches.iter().enumerate() {
            let outcome = apply_batch(&mut tx, batch)
                .await
                .map_err(|error| BatchError {
                    batch: Some(index),
                    error,
                })?;
            outcomes.push(outcome);
        }
        tx.commit()
            .await
            .map_err(|e| BatchError::whole(database(e)))?;
        Ok(outcomes)
    }

    async fn reservation(
        &self,
        tenant: &Tenant,
        key: &RequestKey,
    ) -> Result<Option<Reservation>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE tenant = ?1 AND request_key = ?2"
        ))
        .bind(tenant.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.readers)
        .await
        .map_err(database)?;
        row.as_ref().map(reservation_from).transpose()
    }

    async fn reservations(
        &self,
        tenant: &Tenant,
        keys: &[RequestKey],
    ) -> Result<Vec<Reservation>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations
             WHERE tenant = ?1 AND request_key IN (SELECT value FROM json_each(?2))"
        ))
        .bind(tenant.as_str())
        .bind(json_list(keys.iter().map(RequestKey::as_str)))
        .fetch_all(&self.readers)
        .await
        .map_err(database)?;
        rows.iter().map(reservation_from).collect()
    }

    async fn provenance(&self) -> Result<Provenance, StoreError> {
        let not_granted: Vec<String> = sqlx::query_scalar(
            "SELECT s.tenant || '/' || s.sku FROM sku_stock s
             WHERE s.received <> COALESCE((SELECT sum(units) FROM applied_grants g
                                           WHERE g.tenant = s.tenant AND g.sku = s.sku), 0)
             ORDER BY 1",
        )
        .fetch_all(&self.readers)
        .await
        .map_err(database)?;
        let has_grants: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM applied_grants)")
            .fetch_one(&self.readers)
            .await
            .map_err(database)?;
        Ok(Provenance {
            not_granted,
            has_grants,
        })
    }

    async fn sync_snapshot(&self) -> Result<SyncSnapshot, StoreError> {
        // A read transaction sees one snapshot of the WAL from its first read.
        let mut tx = self.readers.begin().await.map_err(database)?;
        let rows = sqlx::query(&format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&mut *tx)
            .await
            .map_err(database)?;
        let skus = rows
            .iter()
            .map(|row| sku_record_from(row).map(|r| (r.tenant, r.sku, r.ledger)))
            .collect::<Result<_, _>>()?;
        let unconfirmed_grants =
            sqlx::query_scalar("SELECT id FROM applied_grants WHERE NOT confirmed ORDER BY id")
                .fetch_all(&mut *tx)
                .await
                .map_err(database)?;
        let pending_returns = sqlx::query(
            "SELECT id, tenant, sku, units FROM outbox_returns ORDER BY created_at, id",
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(database)?
        .iter()
        .map(transfer_from)
        .collect::<Result<_, _>>()?;
        tx.commit().await.map_err(database)?;
        Ok(SyncSnapshot {
            skus,
            unconfirmed_grants,
            pending_returns,
        })
    }

    async fn confirm_grants(&self, ids: &[String]) -> Result<(), StoreError> {
        if !ids.is_empty() {
            let mut tx = self.begin_write().await?;
            sqlx::query(
                "UPDATE applied_grants SET confirmed = 1
                 WHERE id IN (SELECT value FROM json_each(?1)) AND NOT confirmed",
            )
            .bind(json_list(ids.iter().map(String::as_str)))
            .execute(&mut *tx)
            .await
            .map_err(database)?;
            tx.commit().await.map_err(database)?;
        }
        Ok(())
    }

    async fn forget_returns(&self, ids: &[String]) -> Result<(), StoreError> {
        if !ids.is_empty() {
            let mut tx = self.begin_write().await?;
            sqlx::query("DELETE FROM outbox_returns WHERE id IN (SELECT value FROM json_each(?1))")
                .bind(json_list(ids.iter().map(String::as_str)))
                .execute(&mut *tx)
                .await
                .map_err(database)?;
            tx.commit().await.map_err(database)?;
        }
        Ok(())
    }

    async fn prune(&self, before_ms: u64, limit: u32) -> Result<Pruned, StoreError> {
        let before = ms(before_ms);
        let mut tx = self.begin_write().await?;
        let rows = sqlx::query(
            "DELETE FROM reservations WHERE rowid IN (
                 SELECT rowid FROM reservations
                 WHERE status IN ('RELEASED', 'EXPIRED') AND expires_at < ?1 LIMIT ?2)
             RETURNING tenant, request_key",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(database)?;
        let grants = sqlx::query(
            "DELETE FROM applied_grants WHERE rowid IN (
                 SELECT rowid FROM applied_grants WHERE confirmed AND applied_at < ?1 LIMIT ?2)",
        )
        .bind(before)
        .bind(i64::from(limit))
        .execute(&mut *tx)
        .await
        .map_err(database)?
        .rows_affected();
        tx.commit().await.map_err(database)?;
        Ok(Pruned {
            reservations: rows.iter().map(pruned_key).collect::<Result<_, _>>()?,
            grants,
        })
    }

    async fn audit(&self) -> Result<Vec<AuditRow>, StoreError> {
        let rows = sqlx::query(&format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&self.readers)
            .await
            .map_err(database)?;
        rows.iter().map(audit_row_from).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the JSON list bound for `json_each` carries every key verbatim.
    #[test]
    fn json_list_keeps_every_item() {
        let list = json_list(["a", "b:c", "d.e"]);
        assert_eq!(list, r#"["a","b:c","d.e"]"#);
        assert_eq!(json_list([]), "[]");
    }
}
