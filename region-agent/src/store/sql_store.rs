//! [`Store`] on PostgreSQL or SQLite, its SQL written once for both.
//!
//! Every statement here runs as it stands on either backend
//! (`service_kit::sql` holds what differs: locking, snapshots, times,
//! lists). Reads run on a connection of their own, outside any
//! transaction, or in a snapshot where what they read must add up; every
//! write runs in a write transaction, which on SQLite holds the file's
//! write lock from its start. Committing a group of batches is
//! [`super::commit`]'s, but for PostgreSQL's one-statement commit of a
//! group of holds ([`super::postgres`]).

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use escrow_core::cart::{Cart, CartCommit, CartWritten};
use escrow_core::protocol::{Borrow, LendAnswer};
use escrow_core::{RegionName, RequestKey, Reservation, Sku, SkuSettings, Tenant, TransferId};
use service_kit::db::Backend;
use service_kit::sql::{sql, Db, Tx};
use sqlx::postgres::PgPool;

use super::rows::{
    at, audit_row_from, hold_from, ident, millis, pruned_key, request_key, reservation_from,
    sku_record_from, transfer_from, with_holds, RESERVATION_COLUMNS,
};
use super::{
    carts, commit, limits, postgres, sqlite, AuditRow, Batch, BatchError, BatchOutcome, Epoch,
    Provenance, Pruned, SkuRecord, Store, StoreError, SyncSnapshot,
};

/// Counters and row sums per SKU. SQLite uses a partial index only when the
/// query repeats the index's condition, so the SOLD sum names the
/// one-active-per-user index's `status IN ('HELD', 'SOLD')`: without it,
/// each SKU's sum scans every reservation (seconds at start on a big file).
const SKU_SELECT: &str = "
    SELECT s.tenant, s.sku, s.available, s.held, s.sold, s.received, s.returned,
           s.max_per_user, s.hold_ttl_ms, s.user_limit_scope, s.paused, s.mode,
           COALESCE((SELECT sum(qty) FROM reservations r
                     WHERE r.tenant = s.tenant AND r.sku = s.sku AND r.status = 'HELD'), 0) AS rows_held,
           COALESCE((SELECT sum(qty) FROM reservations r
                     WHERE r.tenant = s.tenant AND r.sku = s.sku
                       AND r.status IN ('HELD', 'SOLD') AND r.status = 'SOLD'), 0) AS rows_sold
    FROM sku_stock s";

/// Every HELD reservation with its tenant: what the owners settle and
/// expire from memory.
const HELD_SELECT: &str = "
    SELECT tenant, request_key, user_id, sku, qty, status, expires_at, extended
    FROM reservations WHERE status = 'HELD'";

/// Records that the coordinator has the acknowledgements of grants `{ids}`.
const CONFIRM_GRANTS: &str =
    "UPDATE applied_grants SET confirmed = TRUE WHERE id {ids} AND NOT confirmed";

/// Forgets returns `{ids}`, which the coordinator has applied.
const FORGET_RETURNS: &str = "DELETE FROM outbox_returns WHERE id {ids}";

/// The agent's store on either backend.
#[derive(Debug)]
pub struct SqlStore {
    db: Db,
    writes_waiting: AtomicUsize,
}

impl SqlStore {
    /// Opens the database `url` names (`postgres://...` or
    /// `sqlite://PATH`, the file created if missing) and applies the
    /// agent's migrations, with `pool_size` connections, on SQLite readers
    /// beside the one writer. PostgreSQL's statements time out after
    /// [`service_kit::db::STATEMENT_TIMEOUT`] and SQLite's writes wait at
    /// most [`service_kit::db::SQLITE_BUSY_TIMEOUT`], so a hung one fails
    /// rather than holding an owner (and shutdown) forever.
    pub async fn open(url: &str, pool_size: u32) -> Result<Self, StoreError> {
        let db = Db::open(url, pool_size, &postgres::MIGRATOR, &sqlite::MIGRATOR).await?;
        Ok(Self::on(db))
    }

    /// A store on the PostgreSQL `pool`, whose database has the agent's
    /// migrations applied.
    pub fn new(pool: PgPool) -> Self {
        Self::on(Db::postgres(pool))
    }

    fn on(db: Db) -> Self {
        Self {
            db,
            writes_waiting: AtomicUsize::new(0),
        }
    }

    /// How many write transactions are waiting to begin right now: on
    /// SQLite for the write connection or the file's write lock (contention
    /// on the single writer), on PostgreSQL for a pooled connection.
    pub fn writes_waiting(&self) -> usize {
        self.writes_waiting.load(Ordering::SeqCst)
    }

    /// A write transaction; on SQLite it holds the file's write lock.
    async fn begin_write(&self) -> Result<Tx, StoreError> {
        let _waiting = Waiting::new(&self.writes_waiting);
        Ok(self.db.write().await?)
    }

    /// Runs `template` with `{ids}` standing for any of `ids` (bound as
    /// `$1`), in a write transaction; nothing if there are no `ids`.
    async fn write_for_ids(&self, template: &str, ids: &[TransferId]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let text = template.replace("{ids}", &self.db.backend().in_list("$1"));
        let statement = sql(text).bind(ids.iter().map(TransferId::as_str).collect::<Vec<_>>());
        let mut tx = self.begin_write().await?;
        statement.execute(&mut tx).await?;
        Ok(tx.commit().await?)
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

#[async_trait]
impl Store for SqlStore {
    async fn take_lease(&self, region: &RegionName) -> Result<Epoch, StoreError> {
        // The write waits for every write transaction holding the lease row
        // (FOR SHARE on PostgreSQL, the write lock on SQLite), so when it
        // commits no older epoch's write is in flight.
        let mut tx = self.begin_write().await?;
        let other = sql("SELECT region FROM region_lease WHERE region <> $1 LIMIT 1")
            .bind(region.as_str())
            .fetch_optional(&mut tx)
            .await?;
        if let Some(other) = other {
            return Err(StoreError::WrongRegion(other.try_get("region")?));
        }
        let text = format!(
            "INSERT INTO region_lease (region, epoch) VALUES ($1, 1)
             ON CONFLICT (region) DO UPDATE SET epoch = region_lease.epoch + 1, taken_at = {}
             RETURNING epoch",
            tx.backend().now()
        );
        let row = sql(text)
            .bind(region.as_str())
            .fetch_optional(&mut tx)
            .await?
            .ok_or_else(|| StoreError::Conflict("the lease upsert returned no row".into()))?;
        let epoch = row.try_get("epoch")?;
        limits::give_back_unused(&mut tx).await?;
        tx.commit().await?;
        Ok(Epoch(epoch))
    }

    async fn ready(&self) -> Result<(), StoreError> {
        let mut conn = self.db.connection().await?;
        sql("SELECT 1 FROM region_lease LIMIT 1")
            .fetch_optional(&mut conn)
            .await?;
        Ok(())
    }

    async fn load_skus(&self) -> Result<Vec<SkuRecord>, StoreError> {
        let mut conn = self.db.connection().await?;
        let rows = sql(format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&mut conn)
            .await?;
        let records = rows.iter().map(sku_record_from).collect::<Result<_, _>>()?;
        let holds = sql(HELD_SELECT).fetch_all(&mut conn).await?;
        let holds = holds.iter().map(hold_from).collect::<Result<_, _>>()?;
        Ok(with_holds(records, holds))
    }

    async fn load_sku(&self, tenant: &Tenant, sku: &Sku) -> Result<Option<SkuRecord>, StoreError> {
        let mut conn = self.db.connection().await?;
        let row = sql(format!("{SKU_SELECT} WHERE s.tenant = $1 AND s.sku = $2"))
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .fetch_optional(&mut conn)
            .await?;
        let Some(record) = row.as_ref().map(sku_record_from).transpose()? else {
            return Ok(None);
        };
        let holds = sql(format!("{HELD_SELECT} AND tenant = $1 AND sku = $2"))
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .fetch_all(&mut conn)
            .await?;
        let holds = holds.iter().map(hold_from).collect::<Result<_, _>>()?;
        Ok(with_holds(vec![record], holds).pop())
    }

    async fn for_each_key(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        each: &mut (dyn FnMut(RequestKey, u64) + Send),
    ) -> Result<(), StoreError> {
        let mut conn = self.db.connection().await?;
        sql("SELECT request_key, created_at FROM reservations WHERE tenant = $1 AND sku = $2")
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .for_each(&mut conn, |row| {
                let key = request_key(&row.try_get::<String>("request_key")?)?;
                each(key, u64::try_from(millis(&row, "created_at")?).unwrap_or(0));
                Ok::<_, StoreError>(())
            })
            .await
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
        commit::check_lease(&mut tx, epoch).await?;
        let created = sql(
            "INSERT INTO sku_stock (tenant, sku, available, held, sold, received, returned, max_per_user, hold_ttl_ms,
                                    user_limit_scope)
             VALUES ($1, $2, $3, 0, 0, $3, 0, $4, $5, $6)
             ON CONFLICT DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(sku.as_str())
        .bind(total as i64)
        .bind(settings.max_per_user as i32)
        .bind(settings.hold_ttl.get() as i64)
        .bind(settings.user_limit_scope.as_str())
        .execute(&mut tx)
        .await?
            == 1;
        tx.commit().await?;
        Ok(created)
    }

    async fn primary_moved(&self) {
        self.db.primary_moved().await;
    }

    async fn commit_all(
        &self,
        epoch: Epoch,
        batches: &[&Batch],
    ) -> Result<Vec<BatchOutcome>, BatchError> {
        if self.db.backend() == Backend::Postgres
            && batches.iter().all(|batch| postgres::only_holds(batch))
        {
            if let Some(outcomes) = postgres::commit_holds(&self.db, epoch, batches).await? {
                return Ok(outcomes);
            }
        }
        let tx = self.begin_write().await.map_err(BatchError::whole)?;
        commit::in_transaction(tx, epoch, batches).await
    }

    async fn reservation(
        &self,
        tenant: &Tenant,
        key: &RequestKey,
    ) -> Result<Option<Reservation>, StoreError> {
        let mut conn = self.db.connection().await?;
        let row = sql(format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE tenant = $1 AND request_key = $2"
        ))
        .bind(tenant.as_str())
        .bind(key.as_str())
        .fetch_optional(&mut conn)
        .await?;
        row.as_ref().map(reservation_from).transpose()
    }

    async fn reservations(
        &self,
        tenant: &Tenant,
        keys: &[RequestKey],
    ) -> Result<Vec<Reservation>, StoreError> {
        let mut conn = self.db.connection().await?;
        let rows = sql(format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE tenant = $1 AND request_key {}",
            conn.backend().in_list("$2")
        ))
        .bind(tenant.as_str())
        .bind(keys.iter().map(RequestKey::as_str).collect::<Vec<_>>())
        .fetch_all(&mut conn)
        .await?;
        rows.iter().map(reservation_from).collect()
    }

    async fn provenance(&self) -> Result<Provenance, StoreError> {
        let mut conn = self.db.connection().await?;
        let not_granted = sql("SELECT s.tenant || '/' || s.sku AS name FROM sku_stock s
             WHERE s.received <> COALESCE((SELECT sum(units) FROM applied_grants g
                                           WHERE g.tenant = s.tenant AND g.sku = s.sku), 0)
             ORDER BY 1")
        .fetch_all(&mut conn)
        .await?
        .iter()
        .map(|row| row.try_get("name"))
        .collect::<Result<_, _>>()?;
        let has_grants = sql("SELECT EXISTS (SELECT 1 FROM applied_grants) AS has_grants")
            .fetch_optional(&mut conn)
            .await?
            .map(|row| row.try_get("has_grants"))
            .transpose()?
            .unwrap_or(false);
        Ok(Provenance {
            not_granted,
            has_grants,
        })
    }

    async fn sync_snapshot(&self) -> Result<SyncSnapshot, StoreError> {
        let mut tx = self.db.snapshot().await?;
        let rows = sql(format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&mut tx)
            .await?;
        let skus = rows
            .iter()
            .map(|row| sku_record_from(row).map(|r| (r.tenant, r.sku, r.ledger)))
            .collect::<Result<_, _>>()?;
        let unconfirmed_grants =
            sql("SELECT id FROM applied_grants WHERE NOT confirmed ORDER BY id")
                .fetch_all(&mut tx)
                .await?
                .iter()
                .map(|row| ident(row, "id"))
                .collect::<Result<_, _>>()?;
        let pending_returns =
            sql("SELECT id, tenant, sku, units FROM outbox_returns ORDER BY created_at, id")
                .fetch_all(&mut tx)
                .await?
                .iter()
                .map(transfer_from)
                .collect::<Result<_, _>>()?;
        let (borrow_asks, borrow_returns) = limits::outbox(&mut tx).await?;
        tx.commit().await?;
        Ok(SyncSnapshot {
            skus,
            unconfirmed_grants,
            pending_returns,
            borrow_asks,
            borrow_returns,
        })
    }

    async fn ask_borrow(
        &self,
        epoch: Epoch,
        borrow: &Borrow,
        key: &RequestKey,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        commit::check_lease(&mut tx, epoch).await?;
        limits::ask(&mut tx, borrow, key).await?;
        commit::commit(tx).await
    }

    async fn give_back_borrow(&self, epoch: Epoch, id: &TransferId) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        commit::check_lease(&mut tx, epoch).await?;
        limits::give_back(&mut tx, id).await?;
        commit::commit(tx).await
    }

    async fn forget_borrows(&self, ids: &[TransferId]) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        limits::forget(&mut tx, ids).await?;
        commit::commit(tx).await
    }

    async fn lend(
        &self,
        epoch: Epoch,
        asks: &[Borrow],
        now_ms: u64,
    ) -> Result<Vec<LendAnswer>, StoreError> {
        let mut tx = self.begin_write().await?;
        commit::check_lease(&mut tx, epoch).await?;
        let answers = limits::lend(&mut tx, asks, now_ms).await?;
        commit::commit(tx).await?;
        Ok(answers)
    }

    async fn take_back(
        &self,
        epoch: Epoch,
        loans: &[Borrow],
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        commit::check_lease(&mut tx, epoch).await?;
        limits::take_back(&mut tx, loans, now_ms).await?;
        commit::commit(tx).await
    }

    async fn confirm_grants(&self, ids: &[TransferId]) -> Result<(), StoreError> {
        self.write_for_ids(CONFIRM_GRANTS, ids).await
    }

    async fn forget_returns(&self, ids: &[TransferId]) -> Result<(), StoreError> {
        self.write_for_ids(FORGET_RETURNS, ids).await
    }

    async fn prune(&self, before_ms: u64, limit: u32) -> Result<Pruned, StoreError> {
        let mut tx = self.begin_write().await?;
        let rows = sql("DELETE FROM reservations WHERE (tenant, request_key) IN (
                 SELECT tenant, request_key FROM reservations
                 WHERE status IN ('RELEASED', 'EXPIRED', 'RETURNED') AND expires_at < $1 LIMIT $2)
             RETURNING tenant, request_key")
        .bind(at(before_ms))
        .bind(i64::from(limit))
        .fetch_all(&mut tx)
        .await?;
        let grants = sql("DELETE FROM applied_grants WHERE id IN (
                 SELECT id FROM applied_grants WHERE confirmed AND applied_at < $1 LIMIT $2)")
        .bind(at(before_ms))
        .bind(i64::from(limit))
        .execute(&mut tx)
        .await?;
        let carts = sql("DELETE FROM carts WHERE (tenant, request_key) IN (
                 SELECT tenant, request_key FROM carts
                 WHERE status IN ('RELEASED', 'EXPIRED') AND expires_at < $1 LIMIT $2)")
        .bind(at(before_ms))
        .bind(i64::from(limit))
        .execute(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(Pruned {
            reservations: rows.iter().map(pruned_key).collect::<Result<_, _>>()?,
            grants,
            carts,
        })
    }

    async fn commit_carts(
        &self,
        epoch: Epoch,
        carts: &[&CartCommit],
    ) -> Result<Vec<CartWritten>, BatchError> {
        let tx = self.begin_write().await.map_err(BatchError::whole)?;
        carts::write(tx, epoch, carts).await
    }

    async fn cart(&self, tenant: &Tenant, key: &RequestKey) -> Result<Option<Cart>, StoreError> {
        let mut conn = self.db.connection().await?;
        carts::read(&mut conn, tenant, key).await
    }

    async fn held_carts(&self) -> Result<Vec<(Tenant, RequestKey, u64)>, StoreError> {
        let mut conn = self.db.connection().await?;
        carts::held(&mut conn).await
    }

    async fn audit(&self) -> Result<Vec<AuditRow>, StoreError> {
        let mut conn = self.db.connection().await?;
        let rows = sql(format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&mut conn)
            .await?;
        rows.iter().map(audit_row_from).collect()
    }
}
