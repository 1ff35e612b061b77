//! [`Store`] on PostgreSQL.
//!
//! Every write is conditional and its affected-row count is checked: the
//! lease row locked FOR SHARE with this process's epoch, holds inserted with
//! `ON CONFLICT DO NOTHING` (the primary key judges idempotency, the partial
//! unique index the per-user limit), transitions applied in the order the
//! owner decided them and guarded by `status = 'HELD'` and the expiry, and
//! the counter update checked by the table's CHECK constraints. A batch is
//! one transaction: all of it or none. A group of batches that only insert
//! holds, the hot case, is committed as one statement instead, its own
//! transaction in one round trip ([`one_statement`]), judged by the same
//! INSERT ([`holds`]) and the same constraints.

mod holds;
mod one_statement;

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use escrow_core::{Qty, RegionName, RequestKey, Reservation, Sku, SkuSettings, Tenant, Transition};
use futures_util::TryStreamExt;
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{Postgres, Row, Transaction};

use holds::HoldColumns;

use super::rows::{
    audit_row_from, hold_from, pruned_key, request_key, reservation_from, sku_record_from,
    transfer_from, with_holds, Columns,
};
use super::{
    database, one_sku_row, AuditRow, Batch, BatchError, BatchOutcome, Epoch, Provenance, Pruned,
    SkuRecord, StockChange, Store, StoreError, SyncSnapshot,
};

/// The embedded migrations of the region agent.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/region-agent");

/// A PostgreSQL-backed store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// Wraps a pool whose database has the agent's migrations applied.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Connects to `url` with `pool_size` connections and applies the
    /// agent's migrations; statements time out after
    /// [`service_kit::db::STATEMENT_TIMEOUT`], so a hung one fails rather
    /// than holding an owner (and shutdown) forever.
    pub async fn connect(url: &str, pool_size: u32) -> Result<Self, StoreError> {
        service_kit::db::connect_postgres(url, pool_size, &MIGRATOR)
            .await
            .map(Self::new)
            .map_err(database)
    }
}

fn ts(ms: u64) -> DateTime<Utc> {
    // ms values come from the agent's clock plus a bounded TTL, far inside chrono's range.
    DateTime::from_timestamp_millis(ms as i64).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl Columns for PgRow {
    fn int(&self, name: &str) -> Result<i64, StoreError> {
        // Counters are bigint, settings and quantities integer.
        match self.try_get::<i64, _>(name) {
            Ok(value) => Ok(value),
            Err(_) => self
                .try_get::<i32, _>(name)
                .map(i64::from)
                .map_err(database),
        }
    }
    fn text(&self, name: &str) -> Result<String, StoreError> {
        self.try_get(name).map_err(database)
    }
    fn flag(&self, name: &str) -> Result<bool, StoreError> {
        self.try_get(name).map_err(database)
    }
    fn millis(&self, name: &str) -> Result<i64, StoreError> {
        let at: DateTime<Utc> = self.try_get(name).map_err(database)?;
        Ok(at.timestamp_millis())
    }
}

const SKU_SELECT: &str = "
    SELECT s.tenant, s.sku, s.available, s.held, s.sold, s.received, s.returned,
           s.max_per_user, s.hold_ttl_ms, s.paused, s.mode,
           COALESCE((SELECT sum(qty) FROM reservations r
                     WHERE r.tenant = s.tenant AND r.sku = s.sku AND r.status = 'HELD'), 0)::bigint AS rows_held,
           COALESCE((SELECT sum(qty) FROM reservations r
                     WHERE r.tenant = s.tenant AND r.sku = s.sku AND r.status = 'SOLD'), 0)::bigint AS rows_sold
    FROM sku_stock s";

const RESERVATION_COLUMNS: &str = "request_key, user_id, sku, qty, status, expires_at, extended";

/// Every HELD reservation with its tenant: what the owners settle and
/// expire from memory.
const HELD_SELECT: &str = "
    SELECT tenant, request_key, user_id, sku, qty, status, expires_at, extended
    FROM reservations WHERE status = 'HELD'";

/// What one batch wrote before the shared statements: its counter moves
/// so far and the grants the database credited.
#[derive(Debug, Default)]
struct Applied {
    deltas: Deltas,
    applied_grants: Vec<String>,
}

/// Applies what one batch writes besides its holds and counters, inside
/// `tx`: transitions (expiries among them), changes, grants and returns.
///
/// Holds come after all of these ([`insert_holds`]): no transition names a
/// key inserted in the same batch, and a release frees its user for a new
/// hold. Counters move once, at the end ([`move_counters`]), so no step
/// sees another's partial sums.
async fn apply_batch(
    tx: &mut Transaction<'_, Postgres>,
    batch: &Batch,
) -> Result<Applied, StoreError> {
    let mut deltas = Deltas::default();
    apply_transitions(tx, batch, &mut deltas).await?;
    apply_changes(tx, batch, &mut deltas).await?;
    let applied_grants = apply_grants(tx, batch, &mut deltas).await?;
    debit_returns(tx, batch, &mut deltas).await?;
    Ok(Applied {
        deltas,
        applied_grants,
    })
}

/// Locks the lease row with our epoch so a takeover waits for this
/// transaction, and a transaction after a takeover finds no row.
async fn check_lease(tx: &mut Transaction<'_, Postgres>, epoch: Epoch) -> Result<(), StoreError> {
    let row = sqlx::query("SELECT 1 FROM region_lease WHERE epoch = $1 FOR SHARE")
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

/// One decided transition of a batch: the key, its units, the change.
type Decided = (RequestKey, Qty, Transition);

/// Applies the batch's transitions so that each key's transitions commit in
/// the order the owner decided them: an extend then a confirm of one hold
/// must extend the HELD row and then sell it, not find it SOLD already.
///
/// Round `n` holds every key's `n`-th transition, in decision order. Keys
/// within a round are distinct, so its statements touch disjoint rows and
/// may run set-based, one per kind, each checked to change exactly its
/// rows; rounds run one after the other. A batch that changes each key once
/// (nearly all of them) is one round of at most four statements.
async fn apply_transitions(
    tx: &mut Transaction<'_, Postgres>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<(), StoreError> {
    for round in rounds(&batch.transitions) {
        apply_round(tx, batch, &round, deltas).await?;
    }
    Ok(())
}

/// Splits transitions into rounds: a key's `n`-th transition goes to round `n`.
fn rounds(transitions: &[Decided]) -> Vec<Vec<&Decided>> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(transitions.len());
    let mut rounds: Vec<Vec<&Decided>> = Vec::new();
    for decided in transitions {
        let n = seen.entry(decided.0.as_str()).or_insert(0);
        // A key's earlier transitions filled rounds 0..n, so round n exists or is next.
        if *n == rounds.len() {
            rounds.push(Vec::new());
        }
        rounds[*n].push(decided);
        *n += 1;
    }
    rounds
}

/// Applies transitions of distinct keys, one conditional statement per kind.
async fn apply_round(
    tx: &mut Transaction<'_, Postgres>,
    batch: &Batch,
    round: &[&Decided],
    deltas: &mut Deltas,
) -> Result<(), StoreError> {
    let now = ts(batch.now_ms);
    let mut by_kind: [(Vec<&str>, i64); 3] = Default::default();
    let mut extend_keys = Vec::new();
    let mut extend_until = Vec::new();
    for (key, qty, transition) in round {
        let units = i64::from(qty.get());
        let slot = match transition {
            Transition::Confirm => 0,
            Transition::Release => 1,
            Transition::Expire => 2,
            Transition::Extend { expires_at_ms } => {
                extend_keys.push(key.as_str());
                extend_until.push(ts(*expires_at_ms));
                continue;
            }
        };
        by_kind[slot].0.push(key.as_str());
        by_kind[slot].1 += units;
    }
    let statements = [
        "UPDATE reservations SET status = 'SOLD'
         WHERE tenant = $1 AND sku = $2 AND request_key = ANY($3) AND status = 'HELD' AND expires_at > $4",
        "UPDATE reservations SET status = 'RELEASED'
         WHERE tenant = $1 AND sku = $2 AND request_key = ANY($3) AND status = 'HELD' AND expires_at > $4",
        "UPDATE reservations SET status = 'EXPIRED'
         WHERE tenant = $1 AND sku = $2 AND request_key = ANY($3) AND status = 'HELD' AND expires_at <= $4",
    ];
    for (slot, sql) in statements.iter().enumerate() {
        let (keys, units) = &by_kind[slot];
        if keys.is_empty() {
            continue;
        }
        let changed = sqlx::query(sql)
            .bind(batch.tenant.as_str())
            .bind(batch.sku.as_str())
            .bind(keys)
            .bind(now)
            .execute(&mut **tx)
            .await
            .map_err(database)?
            .rows_affected();
        if changed != keys.len() as u64 {
            return Err(StoreError::Conflict(format!(
                "transition changed {changed} of {} rows",
                keys.len()
            )));
        }
        match slot {
            0 => {
                deltas.held -= units;
                deltas.sold += units;
            }
            _ => {
                deltas.held -= units;
                deltas.available += units;
            }
        }
    }
    if !extend_keys.is_empty() {
        let changed = sqlx::query(
            "UPDATE reservations r SET expires_at = u.until, extended = true
             FROM unnest($3::text[], $4::timestamptz[]) AS u(request_key, until)
             WHERE r.tenant = $1 AND r.sku = $2 AND r.request_key = u.request_key
               AND r.status = 'HELD' AND NOT r.extended AND r.expires_at > $5",
        )
        .bind(batch.tenant.as_str())
        .bind(batch.sku.as_str())
        .bind(&extend_keys)
        .bind(&extend_until)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(database)?
        .rows_affected();
        if changed != extend_keys.len() as u64 {
            return Err(StoreError::Conflict(format!(
                "extend changed {changed} of {} rows",
                extend_keys.len()
            )));
        }
    }
    Ok(())
}

/// Inserts the holds of every batch in one statement ([`holds`]); the
/// units of the rows it inserted move each batch's counters.
async fn insert_holds(
    tx: &mut Transaction<'_, Postgres>,
    batches: &[&Batch],
    applied: &mut [Applied],
) -> Result<Vec<Vec<bool>>, StoreError> {
    static INSERT_SQL: LazyLock<String> = LazyLock::new(|| holds::insert_sql(""));
    let columns = HoldColumns::new(batches);
    if columns.is_empty() {
        return columns.inserted([], |_, _| ());
    }
    let rows = columns
        .bind(sqlx::query(&INSERT_SQL))
        .fetch_all(&mut **tx)
        .await
        .map_err(database)?;
    let returned = rows
        .iter()
        .map(|row| {
            Ok((
                row.try_get("tenant").map_err(database)?,
                row.try_get("sku").map_err(database)?,
                row.try_get("request_key").map_err(database)?,
            ))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    columns.inserted(returned, |b, units| {
        applied[b].deltas.available -= units;
        applied[b].deltas.held += units;
    })
}

/// Moves the counters of every batch that changed any in one conditional
/// statement. The hot rows are touched last; the WHERE clause refuses a
/// move that would take `available` below zero, and the CHECK constraints
/// any that would unbalance a ledger. A batch whose row did not move is
/// named in the error, so the committer can answer it alone.
async fn move_counters(
    tx: &mut Transaction<'_, Postgres>,
    batches: &[&Batch],
    applied: &[Applied],
) -> Result<(), BatchError> {
    let moving: Vec<usize> = (0..batches.len())
        .filter(|&b| !applied[b].deltas.is_zero())
        .collect();
    if moving.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&Deltas) -> i64| -> Vec<i64> {
        moving.iter().map(|&b| f(&applied[b].deltas)).collect()
    };
    let tenants: Vec<&str> = moving.iter().map(|&b| batches[b].tenant.as_str()).collect();
    let skus: Vec<&str> = moving.iter().map(|&b| batches[b].sku.as_str()).collect();
    let rows = sqlx::query(
        "UPDATE sku_stock s
         SET available = s.available + d.available, held = s.held + d.held,
             sold = s.sold + d.sold, received = s.received + d.received,
             returned = s.returned + d.returned, updated_at = now()
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[],
                     $6::bigint[], $7::bigint[])
              AS d(tenant, sku, available, held, sold, received, returned)
         WHERE s.tenant = d.tenant AND s.sku = d.sku AND s.available + d.available >= 0
         RETURNING s.tenant, s.sku",
    )
    .bind(&tenants)
    .bind(&skus)
    .bind(column(|d| d.available))
    .bind(column(|d| d.held))
    .bind(column(|d| d.sold))
    .bind(column(|d| d.received))
    .bind(column(|d| d.returned))
    .fetch_all(&mut **tx)
    .await
    .map_err(|e| {
        BatchError::whole(match e {
            sqlx::Error::Database(db) if db.is_check_violation() => {
                StoreError::Conflict("counter update refused by a CHECK constraint".into())
            }
            other => database(other),
        })
    })?;
    let mut moved = HashSet::with_capacity(rows.len());
    for row in &rows {
        let tenant: String = row
            .try_get("tenant")
            .map_err(|e| BatchError::whole(database(e)))?;
        let sku: String = row
            .try_get("sku")
            .map_err(|e| BatchError::whole(database(e)))?;
        moved.insert((tenant, sku));
    }
    match (0..moving.len())
        .position(|i| !moved.contains(&(tenants[i].to_owned(), skus[i].to_owned())))
    {
        None => Ok(()),
        Some(i) => Err(BatchError {
            batch: Some(moving[i]),
            error: StoreError::Conflict("not enough units available".into()),
        }),
    }
}

async fn apply_changes(
    tx: &mut Transaction<'_, Postgres>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<(), StoreError> {
    for change in &batch.changes {
        match *change {
            StockChange::Receive(units) => {
                deltas.received += units as i64;
                deltas.available += units as i64;
            }
            StockChange::Return(units) => {
                deltas.returned += units as i64;
                deltas.available -= units as i64;
            }
            StockChange::Settings(_) | StockChange::Mode(_) | StockChange::Pause(_) => {
                let set = match *change {
                    StockChange::Settings(_) => "max_per_user = $3, hold_ttl_ms = $4",
                    StockChange::Mode(_) => "mode = $3",
                    _ => "paused = $3",
                };
                let sql = format!(
                    "UPDATE sku_stock SET {set}, updated_at = now() WHERE tenant = $1 AND sku = $2"
                );
                let query = sqlx::query(&sql)
                    .bind(batch.tenant.as_str())
                    .bind(batch.sku.as_str());
                let query = match *change {
                    StockChange::Settings(settings) => query
                        .bind(settings.max_per_user as i32)
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
        }
    }
    Ok(())
}

/// Credits grants not seen before; the primary key of `applied_grants`
/// makes a duplicate delivery a no-op.
async fn apply_grants(
    tx: &mut Transaction<'_, Postgres>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<Vec<String>, StoreError> {
    if batch.grants.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = batch.grants.iter().map(|g| g.id.as_str()).collect();
    let units: Vec<i64> = batch.grants.iter().map(|g| g.units as i64).collect();
    let rows = sqlx::query(
        "INSERT INTO applied_grants (id, tenant, sku, units, applied_at)
         SELECT u.id, $1, $2, u.units, $5 FROM unnest($3::text[], $4::bigint[]) AS u(id, units)
         ON CONFLICT (id) DO NOTHING
         RETURNING id, units",
    )
    .bind(batch.tenant.as_str())
    .bind(batch.sku.as_str())
    .bind(&ids)
    .bind(&units)
    // The agent's clock, as prune's cut: the server's may differ.
    .bind(ts(batch.now_ms))
    .fetch_all(&mut **tx)
    .await
    .map_err(database)?;
    let mut applied = Vec::with_capacity(rows.len());
    for row in &rows {
        let units: i64 = row.try_get("units").map_err(database)?;
        deltas.received += units;
        deltas.available += units;
        applied.push(row.try_get("id").map_err(database)?);
    }
    Ok(applied)
}

/// Debits returns and records them in the outbox, in the same transaction.
async fn debit_returns(
    tx: &mut Transaction<'_, Postgres>,
    batch: &Batch,
    deltas: &mut Deltas,
) -> Result<(), StoreError> {
    for ret in &batch.returns {
        sqlx::query("INSERT INTO outbox_returns (id, tenant, sku, units) VALUES ($1, $2, $3, $4)")
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

/// Commits `batches` in one transaction of several statements: the lease,
/// each batch's own writes ([`apply_batch`]), every batch's holds
/// ([`insert_holds`]), every batch's counters ([`move_counters`]). Any
/// group can take this path; a batch whose own writes fail is named.
async fn commit_in_transaction(
    pool: &PgPool,
    epoch: Epoch,
    batches: &[&Batch],
) -> Result<Vec<BatchOutcome>, BatchError> {
    let mut tx = pool
        .begin()
        .await
        .map_err(database)
        .map_err(BatchError::whole)?;
    check_lease(&mut tx, epoch)
        .await
        .map_err(BatchError::whole)?;
    let mut applied = Vec::with_capacity(batches.len());
    for (index, batch) in batches.iter().enumerate() {
        applied.push(
            apply_batch(&mut tx, batch)
                .await
                .map_err(|error| BatchError {
                    batch: Some(index),
                    error,
                })?,
        );
    }
    let inserted = insert_holds(&mut tx, batches, &mut applied)
        .await
        .map_err(BatchError::whole)?;
    move_counters(&mut tx, batches, &applied).await?;
    let outcomes = applied
        .into_iter()
        .zip(inserted)
        .map(|(applied, inserted)| BatchOutcome {
            inserted,
            applied_grants: applied.applied_grants,
        })
        .collect();
    tx.commit()
        .await
        .map_err(|e| BatchError::whole(database(e)))?;
    Ok(outcomes)
}

#[async_trait]
impl Store for PgStore {
    async fn take_lease(&self, region: &RegionName) -> Result<Epoch, StoreError> {
        let mut tx = self.pool.begin().await.map_err(database)?;
        let other: Option<String> =
            sqlx::query_scalar("SELECT region FROM region_lease WHERE region <> $1 LIMIT 1")
                .bind(region.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(database)?;
        if let Some(other) = other {
            return Err(StoreError::WrongRegion(other));
        }
        // The UPDATE waits for every write transaction holding the row FOR
        // SHARE, so when it commits no older epoch's write is in flight.
        let epoch: i64 = sqlx::query_scalar(
            "INSERT INTO region_lease (region, epoch) VALUES ($1, 1)
             ON CONFLICT (region) DO UPDATE SET epoch = region_lease.epoch + 1, taken_at = now()
             RETURNING epoch",
        )
        .bind(region.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(database)?;
        tx.commit().await.map_err(database)?;
        Ok(Epoch(epoch))
    }

    async fn ready(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1 FROM region_lease LIMIT 1")
            .fetch_optional(&self.pool)
            .await
            .map_err(database)?;
        Ok(())
    }

    async fn load_skus(&self) -> Result<Vec<SkuRecord>, StoreError> {
        let rows = sqlx::query(&format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&self.pool)
            .await
            .map_err(database)?;
        let records = rows.iter().map(sku_record_from).collect::<Result<_, _>>()?;
        let holds = sqlx::query(HELD_SELECT)
            .fetch_all(&self.pool)
            .await
            .map_err(database)?;
        let holds = holds.iter().map(hold_from).collect::<Result<_, _>>()?;
        Ok(with_holds(records, holds))
    }

    async fn load_sku(&self, tenant: &Tenant, sku: &Sku) -> Result<Option<SkuRecord>, StoreError> {
        let row = sqlx::query(&format!("{SKU_SELECT} WHERE s.tenant = $1 AND s.sku = $2"))
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(database)?;
        let Some(record) = row.as_ref().map(sku_record_from).transpose()? else {
            return Ok(None);
        };
        let holds = sqlx::query(&format!("{HELD_SELECT} AND tenant = $1 AND sku = $2"))
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .fetch_all(&self.pool)
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
            "SELECT request_key, (extract(epoch FROM created_at) * 1000)::bigint FROM reservations WHERE tenant = $1 AND sku = $2",
        )
        .bind(tenant.as_str())
        .bind(sku.as_str())
        .fetch(&self.pool);
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
        let mut tx = self.pool.begin().await.map_err(database)?;
        check_lease(&mut tx, epoch).await?;
        let created = sqlx::query(
            "INSERT INTO sku_stock (tenant, sku, available, held, sold, received, returned, max_per_user, hold_ttl_ms)
             VALUES ($1, $2, $3, 0, 0, $3, 0, $4, $5)
             ON CONFLICT DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(sku.as_str())
        .bind(total as i64)
        .bind(settings.max_per_user as i32)
        .bind(settings.hold_ttl.get() as i64)
        .execute(&mut *tx)
        .await.map_err(database)?
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
        if batches.iter().all(|batch| one_statement::only_holds(batch)) {
            if let Some(outcomes) = one_statement::commit(&self.pool, epoch, batches).await? {
                return Ok(outcomes);
            }
        }
        commit_in_transaction(&self.pool, epoch, batches).await
    }

    async fn reservation(
        &self,
        tenant: &Tenant,
        key: &RequestKey,
    ) -> Result<Option<Reservation>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE tenant = $1 AND request_key = $2"
        ))
        .bind(tenant.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(database)?;
        row.as_ref().map(reservation_from).transpose()
    }

    async fn reservations(
        &self,
        tenant: &Tenant,
        keys: &[RequestKey],
    ) -> Result<Vec<Reservation>, StoreError> {
        let keys: Vec<&str> = keys.iter().map(RequestKey::as_str).collect();
        let rows = sqlx::query(&format!(
            "SELECT {RESERVATION_COLUMNS} FROM reservations WHERE tenant = $1 AND request_key = ANY($2)"
        ))
        .bind(tenant.as_str())
        .bind(&keys)
        .fetch_all(&self.pool)
        .await.map_err(database)?;
        rows.iter().map(reservation_from).collect()
    }

    async fn provenance(&self) -> Result<Provenance, StoreError> {
        let not_granted: Vec<String> = sqlx::query_scalar(
            "SELECT s.tenant || '/' || s.sku FROM sku_stock s
             WHERE s.received <> COALESCE((SELECT sum(units) FROM applied_grants g
                                           WHERE g.tenant = s.tenant AND g.sku = s.sku), 0)
             ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(database)?;
        let has_grants: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM applied_grants)")
            .fetch_one(&self.pool)
            .await
            .map_err(database)?;
        Ok(Provenance {
            not_granted,
            has_grants,
        })
    }

    async fn sync_snapshot(&self) -> Result<SyncSnapshot, StoreError> {
        let mut tx = self.pool.begin().await.map_err(database)?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(database)?;
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
            sqlx::query(
                "UPDATE applied_grants SET confirmed = true WHERE id = ANY($1) AND NOT confirmed",
            )
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(database)?;
        }
        Ok(())
    }

    async fn forget_returns(&self, ids: &[String]) -> Result<(), StoreError> {
        if !ids.is_empty() {
            sqlx::query("DELETE FROM outbox_returns WHERE id = ANY($1)")
                .bind(ids)
                .execute(&self.pool)
                .await
                .map_err(database)?;
        }
        Ok(())
    }

    async fn prune(&self, before_ms: u64, limit: u32) -> Result<Pruned, StoreError> {
        let before = ts(before_ms);
        let rows = sqlx::query(
            "DELETE FROM reservations WHERE (tenant, request_key) IN (
                 SELECT tenant, request_key FROM reservations
                 WHERE status IN ('RELEASED', 'EXPIRED') AND expires_at < $1 LIMIT $2)
             RETURNING tenant, request_key",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(database)?;
        let grants = sqlx::query(
            "DELETE FROM applied_grants WHERE id IN (
                 SELECT id FROM applied_grants WHERE confirmed AND applied_at < $1 LIMIT $2)",
        )
        .bind(before)
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await
        .map_err(database)?
        .rows_affected();
        Ok(Pruned {
            reservations: rows.iter().map(pruned_key).collect::<Result<_, _>>()?,
            grants,
        })
    }

    async fn audit(&self) -> Result<Vec<AuditRow>, StoreError> {
        let rows = sqlx::query(&format!("{SKU_SELECT} ORDER BY s.tenant, s.sku"))
            .fetch_all(&self.pool)
            .await
            .map_err(database)?;
        rows.iter().map(audit_row_from).collect()
    }
}
