//! The coordinator's ledger in PostgreSQL.
//!
//! Every operation is one transaction that locks the SKU rows it touches
//! (`FOR UPDATE`, in (tenant, sku) order, so concurrent syncs of different
//! regions never deadlock), checks each transfer's id before crediting it,
//! and leaves `pool + in_transit + leased = total` true at commit. Policy
//! decisions come from escrow-core with the locked rows as input.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use escrow_core::policy::{decide_take, is_exhausted, retired_recalls};
use escrow_core::protocol::{
    SkuDirective, SyncRequest, SyncResponse, TakeRequest, TakeResponse, TransferMsg,
};
use escrow_core::{Mode, Policy, RegionName, RegionState, Sku, SkuSettings, SkuState, Tenant};
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, Row, Transaction};

/// The embedded migrations of the coordinator.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/coordinator");

/// Why a ledger operation was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// No such SKU (or the region has no part in it).
    #[error("unknown sku")]
    UnknownSku,
    /// The change would need units that are leased, held or sold.
    #[error("{0}")]
    Conflict(String),
    /// A request from an agent process older than one already seen.
    #[error("stale agent epoch")]
    StaleEpoch,
    /// A message that cannot be right (e.g. a transfer id reused for another SKU).
    #[error("invalid: {0}")]
    Invalid(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

type Tx<'a> = Transaction<'a, Postgres>;

/// One SKU row.
#[derive(Debug, Clone)]
struct SkuRow {
    tenant: String,
    sku: String,
    total: i64,
    pool: i64,
    mode: Mode,
    paused: bool,
    max_per_user: i32,
    hold_ttl_ms: i64,
}

/// One region's row of one SKU, with its grants in transit.
#[derive(Debug, Clone, Serialize)]
pub struct RegionLine {
    /// The region.
    pub region: String,
    /// Its weight in the split.
    pub weight: i32,
    /// Units delivered minus units returned.
    pub leased: i64,
    /// Units granted and not acknowledged.
    pub in_transit: i64,
    /// Cumulative units it returned.
    pub returned: i64,
    /// Units asked back, not yet returned.
    pub recall_pending: i64,
    /// Last reported available.
    pub available: i64,
    /// Last reported held.
    pub held: i64,
    /// Last reported sold.
    pub sold: i64,
    /// Last reported sale rate.
    pub sale_rate_per_s: f64,
    /// When it last reported.
    pub last_report_at: Option<DateTime<Utc>>,
    /// Its last measured round trip, ms.
    pub rtt_ms: i64,
}

/// A SKU with all its regions, as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SkuView {
    /// Tenant.
    pub tenant: String,
    /// SKU.
    pub sku: String,
    /// Units in all.
    pub total: i64,
    /// Units not leased.
    pub pool: i64,
    /// Units granted and not acknowledged.
    pub in_transit: i64,
    /// ESCROW or CENTRAL.
    pub mode: Mode,
    /// Paused by an admin.
    pub paused: bool,
    /// Units per reservation at most.
    pub max_per_user: i32,
    /// Default hold duration.
    pub hold_ttl_ms: i64,
    /// `pool + in_transit + sum(reported available + held + sold) - total`.
    pub drift: i64,
    /// `pool + in_transit + sum(leased) - total`: the coordinator's own books.
    pub ledger_drift: i64,
    /// Per region.
    pub regions: Vec<RegionLine>,
}

fn sku_row(row: &PgRow) -> Result<SkuRow, LedgerError> {
    let mode: String = row.try_get("mode")?;
    Ok(SkuRow {
        tenant: row.try_get("tenant")?,
        sku: row.try_get("sku")?,
        total: row.try_get("total")?,
        pool: row.try_get("pool")?,
        mode: Mode::parse(&mode)
            .ok_or_else(|| LedgerError::Database(sqlx::Error::Decode("stored mode".into())))?,
        paused: row.try_get("paused")?,
        max_per_user: row.try_get("max_per_user")?,
        hold_ttl_ms: row.try_get("hold_ttl_ms")?,
    })
}

const SKU_COLUMNS: &str = "tenant, sku, total, pool, mode, paused, max_per_user, hold_ttl_ms";

async fn lock_sku(tx: &mut Tx<'_>, tenant: &str, sku: &str) -> Result<Option<SkuRow>, LedgerError> {
    let row = sqlx::query(&format!(
        "SELECT {SKU_COLUMNS} FROM skus WHERE tenant = $1 AND sku = $2 FOR UPDATE"
    ))
    .bind(tenant)
    .bind(sku)
    .fetch_optional(&mut **tx)
    .await?;
    row.as_ref().map(sku_row).transpose()
}

async fn region_lines<'e, E>(
    executor: E,
    tenant: &str,
    sku: &str,
) -> Result<Vec<RegionLine>, LedgerError>
where
    E: sqlx::PgExecutor<'e>,
{
    let rows = sqlx::query(
        "SELECT r.region, r.weight, r.leased, r.returned, r.recall_pending,
                r.reported_available, r.reported_held, r.reported_sold, r.sale_rate_per_s, r.reported_at,
                COALESCE(g.rtt_ms, 0) AS rtt_ms,
                COALESCE((SELECT sum(units) FROM transfers t
                          WHERE t.tenant = r.tenant AND t.sku = r.sku AND t.region = r.region
                            AND t.state = 'PENDING'), 0)::bigint AS in_transit
         FROM sku_regions r LEFT JOIN regions g ON g.region = r.region
         WHERE r.tenant = $1 AND r.sku = $2
         ORDER BY r.region",
    )
    .bind(tenant)
    .bind(sku)
    .fetch_all(executor)
    .await?;
    rows.iter()
        .map(|row| {
            Ok(RegionLine {
                region: row.try_get("region")?,
                weight: row.try_get("weight")?,
                leased: row.try_get("leased")?,
                in_transit: row.try_get("in_transit")?,
                returned: row.try_get("returned")?,
                recall_pending: row.try_get("recall_pending")?,
                available: row.try_get("reported_available")?,
                held: row.try_get("reported_held")?,
                sold: row.try_get("reported_sold")?,
                sale_rate_per_s: row.try_get("sale_rate_per_s")?,
                last_report_at: row.try_get("reported_at")?,
                rtt_ms: row.try_get("rtt_ms")?,
            })
        })
        .collect()
}

fn u(v: i64) -> u64 {
    // Every counter has a CHECK (>= 0) in the schema.
    u64::try_from(v).unwrap_or(0)
}

fn state_of(sku: &SkuRow, regions: &[RegionLine]) -> SkuState {
    SkuState {
        total: u(sku.total),
        pool: u(sku.pool),
        mode: sku.mode,
        regions: regions
            .iter()
            .map(|r| RegionState {
                weight: u32::try_from(r.weight).unwrap_or(0),
                leased: u(r.leased),
                in_transit: u(r.in_transit),
                available: u(r.available),
                sale_rate_per_s: r.sale_rate_per_s,
                rtt_ms: u(r.rtt_ms),
                recall_pending: u(r.recall_pending),
            })
            .collect(),
    }
}

fn view_of(sku: &SkuRow, regions: Vec<RegionLine>) -> SkuView {
    let in_transit: i64 = regions.iter().map(|r| r.in_transit).sum();
    let reported: i64 = regions.iter().map(|r| r.available + r.held + r.sold).sum();
    let leased: i64 = regions.iter().map(|r| r.leased).sum();
    SkuView {
        tenant: sku.tenant.clone(),
        sku: sku.sku.clone(),
        total: sku.total,
        pool: sku.pool,
        in_transit,
        mode: sku.mode,
        paused: sku.paused,
        max_per_user: sku.max_per_user,
        hold_ttl_ms: sku.hold_ttl_ms,
        drift: sku.pool + in_transit + reported - sku.total,
        ledger_drift: sku.pool + in_transit + leased - sku.total,
        regions,
    }
}

/// Debits the pool and records a PENDING grant, in the caller's transaction.
async fn grant(
    tx: &mut Tx<'_>,
    sku: &SkuRow,
    region: &str,
    id: &str,
    units: u64,
) -> Result<(), LedgerError> {
    let changed = sqlx::query("UPDATE skus SET pool = pool - $3, updated_at = now() WHERE tenant = $1 AND sku = $2 AND pool >= $3")
        .bind(&sku.tenant)
        .bind(&sku.sku)
        .bind(units as i64)
        .execute(&mut **tx)
        .await?
        .rows_affected();
    if changed != 1 {
        return Err(LedgerError::Conflict("pool too small for the grant".into()));
    }
    sqlx::query(
        "INSERT INTO transfers (id, tenant, sku, region, kind, units, state) VALUES ($1, $2, $3, $4, 'GRANT', $5, 'PENDING')",
    )
    .bind(id)
    .bind(&sku.tenant)
    .bind(&sku.sku)
    .bind(region)
    .bind(units as i64)
    .execute(&mut **tx)
    .await?;
    metrics::counter!("coordinator_granted_units_total").increment(units);
    Ok(())
}

fn new_grant_id() -> String {
    format!("g-{}", uuid::Uuid::new_v4())
}

/// Runs the policy for one locked SKU and carries out its plan.
async fn rebalance(
    tx: &mut Tx<'_>,
    policy: &dyn Policy,
    sku: &mut SkuRow,
) -> Result<SkuState, LedgerError> {
    let regions = region_lines(&mut **tx, &sku.tenant, &sku.sku).await?;
    let state = state_of(sku, &regions);
    let mut plan = if sku.paused {
        Default::default()
    } else {
        policy.plan(&state)
    };
    plan.recalls.extend(retired_recalls(&state));
    for (index, units) in plan.grants {
        grant(tx, sku, &regions[index].region, &new_grant_id(), units).await?;
        sku.pool -= units as i64;
    }
    for (index, units) in plan.recalls {
        sqlx::query(
            "UPDATE sku_regions SET recall_pending = recall_pending + $4 WHERE tenant = $1 AND sku = $2 AND region = $3",
        )
        .bind(&sku.tenant)
        .bind(&sku.sku)
        .bind(&regions[index].region)
        .bind(units as i64)
        .execute(&mut **tx)
        .await?;
    }
    if plan.central && sku.mode != Mode::Central {
        sqlx::query(
            "UPDATE skus SET mode = 'CENTRAL', updated_at = now() WHERE tenant = $1 AND sku = $2",
        )
        .bind(&sku.tenant)
        .bind(&sku.sku)
        .execute(&mut **tx)
        .await?;
        sku.mode = Mode::Central;
        tracing::info!(tenant = %sku.tenant, sku = %sku.sku, "tail merge: SKU switched to central mode");
        metrics::counter!("coordinator_tail_merges_total").increment(1);
    }
    let regions = region_lines(&mut **tx, &sku.tenant, &sku.sku).await?;
    Ok(state_of(sku, &regions))
}

/// Requested settings of a SKU.
#[derive(Debug, Clone)]
pub struct SkuSpec {
    /// Units in all.
    pub total: u64,
    /// Region weights; `None` keeps the current ones.
    pub regions: Option<Vec<(RegionName, u32)>>,
    /// Per-user limit and hold duration; `None` keeps the current ones (or defaults).
    pub max_per_user: Option<i64>,
    /// Default hold duration in ms.
    pub hold_ttl_ms: Option<i64>,
}

/// The coordinator's persistence.
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: PgPool,
}

impl Ledger {
    /// Wraps a pool whose database has the coordinator's migrations applied.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Whether the database answers and the schema is in place.
    pub async fn ready(&self) -> Result<(), LedgerError> {
        sqlx::query("SELECT 1 FROM regions LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(())
    }

    /// Creates a SKU (true) or changes it (false).
    pub async fn put_sku(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        spec: &SkuSpec,
        policy: &dyn Policy,
    ) -> Result<bool, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let existing = lock_sku(&mut tx, tenant.as_str(), sku.as_str()).await?;
        let created = existing.is_none();
        let mut row = match existing {
            None => {
                let settings = SkuSettings::parse(spec.max_per_user, spec.hold_ttl_ms)
                    .map_err(|e| LedgerError::Invalid(e.to_string()))?;
                let mode = if policy.starts_central() {
                    Mode::Central
                } else {
                    Mode::Escrow
                };
                sqlx::query(
                    "INSERT INTO skus (tenant, sku, total, pool, mode, max_per_user, hold_ttl_ms)
                     VALUES ($1, $2, $3, $3, $4, $5, $6)",
                )
                .bind(tenant.as_str())
                .bind(sku.as_str())
                .bind(spec.total as i64)
                .bind(mode.as_str())
                .bind(settings.max_per_user as i32)
                .bind(settings.hold_ttl.get() as i64)
                .execute(&mut *tx)
                .await?;
                let weights = spec.regions.clone().unwrap_or_default();
                for (region, weight) in &weights {
                    sqlx::query("INSERT INTO sku_regions (tenant, sku, region, weight) VALUES ($1, $2, $3, $4)")
                        .bind(tenant.as_str())
                        .bind(sku.as_str())
                        .bind(region.as_str())
                        .bind(*weight as i32)
                        .execute(&mut *tx)
                        .await?;
                }
                let row = lock_sku(&mut tx, tenant.as_str(), sku.as_str())
                    .await?
                    .ok_or(LedgerError::UnknownSku)?;
                let ws: Vec<u32> = weights.iter().map(|(_, w)| *w).collect();
                let split = policy.initial_split(spec.total, &ws);
                for ((region, _), units) in weights.iter().zip(split) {
                    if units > 0 {
                        grant(&mut tx, &row, region.as_str(), &new_grant_id(), units).await?;
                    }
                }
                lock_sku(&mut tx, tenant.as_str(), sku.as_str())
                    .await?
                    .ok_or(LedgerError::UnknownSku)?
            }
            Some(row) => {
                let current =
                    SkuSettings::parse(Some(row.max_per_user.into()), Some(row.hold_ttl_ms))
                        .map_err(|e| LedgerError::Invalid(e.to_string()))?;
                let settings = SkuSettings::parse(
                    Some(spec.max_per_user.unwrap_or(i64::from(current.max_per_user))),
                    Some(spec.hold_ttl_ms.unwrap_or(current.hold_ttl.get() as i64)),
                )
                .map_err(|e| LedgerError::Invalid(e.to_string()))?;
                let delta = spec.total as i64 - row.total;
                if delta < 0 && -delta > row.pool {
                    return Err(LedgerError::Conflict(format!(
                        "total may only be lowered by what is in the pool ({} units); the rest is leased, held or sold",
                        row.pool
                    )));
                }
                sqlx::query(
                    "UPDATE skus SET total = total + $3, pool = pool + $3, max_per_user = $4, hold_ttl_ms = $5,
                            updated_at = now()
                     WHERE tenant = $1 AND sku = $2",
                )
                .bind(tenant.as_str())
                .bind(sku.as_str())
                .bind(delta)
                .bind(settings.max_per_user as i32)
                .bind(settings.hold_ttl.get() as i64)
                .execute(&mut *tx)
                .await?;
                if let Some(weights) = &spec.regions {
                    sqlx::query("UPDATE sku_regions SET weight = 0 WHERE tenant = $1 AND sku = $2")
                        .bind(tenant.as_str())
                        .bind(sku.as_str())
                        .execute(&mut *tx)
                        .await?;
                    for (region, weight) in weights {
                        sqlx::query(
                            "INSERT INTO sku_regions (tenant, sku, region, weight) VALUES ($1, $2, $3, $4)
                             ON CONFLICT (tenant, sku, region) DO UPDATE SET weight = EXCLUDED.weight",
                        )
                        .bind(tenant.as_str())
                        .bind(sku.as_str())
                        .bind(region.as_str())
                        .bind(*weight as i32)
                        .execute(&mut *tx)
                        .await?;
                    }
                }
                lock_sku(&mut tx, tenant.as_str(), sku.as_str())
                    .await?
                    .ok_or(LedgerError::UnknownSku)?
            }
        };
        rebalance(&mut tx, policy, &mut row).await?;
        tx.commit().await?;
        Ok(created)
    }

    /// Adds units to a SKU's pool (and total).
    pub async fn add_stock(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        units: u64,
        policy: &dyn Policy,
    ) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin().await?;
        let mut row = lock_sku(&mut tx, tenant.as_str(), sku.as_str())
            .await?
            .ok_or(LedgerError::UnknownSku)?;
        sqlx::query("UPDATE skus SET total = total + $3, pool = pool + $3, updated_at = now() WHERE tenant = $1 AND sku = $2")
            .bind(tenant.as_str())
            .bind(sku.as_str())
            .bind(units as i64)
            .execute(&mut *tx)
            .await?;
        row.total += units as i64;
        row.pool += units as i64;
        rebalance(&mut tx, policy, &mut row).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Pauses or resumes a SKU everywhere (agents learn it at their next sync).
    pub async fn set_paused(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        paused: bool,
    ) -> Result<(), LedgerError> {
        let changed = sqlx::query(
            "UPDATE skus SET paused = $3, updated_at = now() WHERE tenant = $1 AND sku = $2",
        )
        .bind(tenant.as_str())
        .bind(sku.as_str())
        .bind(paused)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if changed == 1 {
            Ok(())
        } else {
            Err(LedgerError::UnknownSku)
        }
    }

    /// One SKU with its regions.
    pub async fn sku(&self, tenant: &Tenant, sku: &Sku) -> Result<SkuView, LedgerError> {
        self.views(Some((tenant, sku)))
            .await?
            .pop()
            .ok_or(LedgerError::UnknownSku)
    }

    /// Every SKU with its regions, from one consistent snapshot.
    pub async fn audit(&self) -> Result<Vec<SkuView>, LedgerError> {
        self.views(None).await
    }

    /// SKU views (all, or one) read in one `REPEATABLE READ` snapshot, so
    /// pool, transfers and reports add up as they were at one instant.
    async fn views(&self, only: Option<(&Tenant, &Sku)>) -> Result<Vec<SkuView>, LedgerError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await?;
        let rows = sqlx::query(&format!(
            "SELECT {SKU_COLUMNS} FROM skus
             WHERE $1::text IS NULL OR (tenant = $1 AND sku = $2)
             ORDER BY tenant, sku"
        ))
        .bind(only.map(|(t, _)| t.as_str()))
        .bind(only.map(|(_, s)| s.as_str()))
        .fetch_all(&mut *tx)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let row = sku_row(row)?;
            let regions = region_lines(&mut *tx, &row.tenant, &row.sku).await?;
            out.push(view_of(&row, regions));
        }
        tx.commit().await?;
        Ok(out)
    }

    /// Every region that ever synced.
    pub async fn regions(&self) -> Result<Vec<RegionSync>, LedgerError> {
        let rows = sqlx::query(
            "SELECT region, epoch, seq, rtt_ms, last_sync_at FROM regions ORDER BY region",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(RegionSync {
                    region: r.try_get("region")?,
                    epoch: r.try_get("epoch")?,
                    seq: r.try_get("seq")?,
                    rtt_ms: r.try_get("rtt_ms")?,
                    last_sync_at: r.try_get("last_sync_at")?,
                })
            })
            .collect()
    }

    /// Applies one agent's sync: acks, returns and report in one
    /// transaction, then rebalances its SKUs and answers with its grants and
    /// directives.
    pub async fn sync(
        &self,
        region: &RegionName,
        req: &SyncRequest,
        policy: &dyn Policy,
    ) -> Result<SyncResponse, LedgerError> {
        let r = region.as_str();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO regions (region, epoch, seq) VALUES ($1, $2, 0) ON CONFLICT DO NOTHING",
        )
        .bind(r)
        .bind(req.epoch)
        .execute(&mut *tx)
        .await?;
        let (epoch, seq): (i64, i64) =
            sqlx::query_as("SELECT epoch, seq FROM regions WHERE region = $1 FOR UPDATE")
                .bind(r)
                .fetch_one(&mut *tx)
                .await?;
        if req.epoch < epoch {
            return Err(LedgerError::StaleEpoch);
        }
        let fresh = (req.epoch, req.seq as i64) > (epoch, seq);

        // Lock this region's SKUs in a fixed order before touching them.
        let rows = sqlx::query(&format!(
            "SELECT {} FROM skus s JOIN sku_regions r USING (tenant, sku)
             WHERE r.region = $1 ORDER BY s.tenant, s.sku FOR UPDATE OF s",
            SKU_COLUMNS
                .split(", ")
                .map(|c| format!("s.{c}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .bind(r)
        .fetch_all(&mut *tx)
        .await?;
        let mut skus: Vec<SkuRow> = rows.iter().map(sku_row).collect::<Result<_, _>>()?;

        let acked = sqlx::query(
            "UPDATE transfers SET state = 'DELIVERED', delivered_at = now()
             WHERE id = ANY($1) AND region = $2 AND kind = 'GRANT' AND state = 'PENDING'
             RETURNING tenant, sku, units",
        )
        .bind(&req.acks)
        .bind(r)
        .fetch_all(&mut *tx)
        .await?;
        for row in &acked {
            let (tenant, sku, units): (String, String, i64) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            sqlx::query("UPDATE sku_regions SET leased = leased + $4 WHERE tenant = $1 AND sku = $2 AND region = $3")
                .bind(&tenant)
                .bind(&sku)
                .bind(r)
                .bind(units)
                .execute(&mut *tx)
                .await?;
        }

        for ret in &req.returns {
            if ret.units == 0 || ret.id.is_empty() || ret.id.len() > 128 {
                return Err(LedgerError::Invalid(
                    "return with no units or a bad id".into(),
                ));
            }
            if !skus
                .iter()
                .any(|s| s.tenant == ret.tenant && s.sku == ret.sku)
            {
                return Err(LedgerError::Invalid(format!(
                    "return for a SKU this region has no part in: {}",
                    ret.id
                )));
            }
            let inserted = sqlx::query(
                "INSERT INTO transfers (id, tenant, sku, region, kind, units, state, delivered_at)
                 VALUES ($1, $2, $3, $4, 'RETURN', $5, 'DELIVERED', now())
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&ret.id)
            .bind(&ret.tenant)
            .bind(&ret.sku)
            .bind(r)
            .bind(ret.units as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 0 {
                continue;
            }
            let changed = sqlx::query(
                "UPDATE sku_regions SET leased = leased - $4, returned = returned + $4,
                        recall_pending = greatest(recall_pending - $4, 0)
                 WHERE tenant = $1 AND sku = $2 AND region = $3 AND leased >= $4",
            )
            .bind(&ret.tenant)
            .bind(&ret.sku)
            .bind(r)
            .bind(ret.units as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if changed != 1 {
                return Err(LedgerError::Invalid(format!(
                    "return {} exceeds the region's lease",
                    ret.id
                )));
            }
            sqlx::query("UPDATE skus SET pool = pool + $3, updated_at = now() WHERE tenant = $1 AND sku = $2")
                .bind(&ret.tenant)
                .bind(&ret.sku)
                .bind(ret.units as i64)
                .execute(&mut *tx)
                .await?;
            metrics::counter!("coordinator_returned_units_total").increment(ret.units);
        }

        if fresh {
            for report in &req.skus {
                sqlx::query(
                                        "UPDATE sku_regions SET reported_available = $4, reported_held = $5, reported_sold = $6,
                            sale_rate_per_s = $7, reported_at = now(),
                            recall_pending = least(recall_pending, $4)
                     WHERE tenant = $1 AND sku = $2 AND region = $3",
                )
                .bind(&report.tenant)
                .bind(&report.sku)
                .bind(r)
                .bind(report.available as i64)
                .bind(report.held as i64)
                .bind(report.sold as i64)
                .bind(if report.sale_rate_per_s.is_finite() { report.sale_rate_per_s.max(0.0) } else { 0.0 })
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query("UPDATE regions SET epoch = $2, seq = $3, rtt_ms = $4, last_sync_at = now() WHERE region = $1")
                .bind(r)
                .bind(req.epoch)
                .bind(req.seq as i64)
                .bind(req.rtt_ms.min(60_000) as i64)
                .execute(&mut *tx)
                .await?;
        }

        let mut directives = Vec::with_capacity(skus.len());
        for sku in &mut skus {
            // Re-read: acks and returns above changed the pool.
            let fresh_sku = lock_sku(&mut tx, &sku.tenant, &sku.sku)
                .await?
                .ok_or(LedgerError::UnknownSku)?;
            *sku = fresh_sku;
            let state = rebalance(&mut tx, policy, sku).await?;
            let (returned, pending): (i64, i64) = sqlx::query_as(
                "SELECT returned, recall_pending FROM sku_regions WHERE tenant = $1 AND sku = $2 AND region = $3",
            )
            .bind(&sku.tenant)
            .bind(&sku.sku)
            .bind(r)
            .fetch_one(&mut *tx)
            .await?;
            directives.push(SkuDirective {
                tenant: sku.tenant.clone(),
                sku: sku.sku.clone(),
                mode: sku.mode,
                paused: sku.paused,
                max_per_user: u32::try_from(sku.max_per_user).unwrap_or(1),
                hold_ttl_ms: u(sku.hold_ttl_ms),
                return_until: u(returned + pending),
                sold_out: is_exhausted(&state),
            });
        }

        let grants = sqlx::query(
            "SELECT id, tenant, sku, units FROM transfers
             WHERE region = $1 AND kind = 'GRANT' AND state = 'PENDING' ORDER BY created_at, id",
        )
        .bind(r)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| {
            Ok(TransferMsg {
                id: row.try_get("id")?,
                tenant: row.try_get("tenant")?,
                sku: row.try_get("sku")?,
                units: u(row.try_get("units")?),
            })
        })
        .collect::<Result<Vec<_>, LedgerError>>()?;
        let confirmed: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM transfers WHERE id = ANY($1) AND region = $2 AND state = 'DELIVERED'",
        )
        .bind(&req.acks)
        .bind(r)
        .fetch_all(&mut *tx)
        .await?;
        let return_ids: Vec<&str> = req.returns.iter().map(|t| t.id.as_str()).collect();
        let applied_returns: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM transfers WHERE id = ANY($1) AND region = $2 AND kind = 'RETURN'",
        )
        .bind(&return_ids)
        .bind(r)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        metrics::counter!("coordinator_syncs_total", "region" => r.to_owned()).increment(1);
        Ok(SyncResponse {
            grants,
            confirmed,
            applied_returns,
            skus: directives,
        })
    }

    /// A synchronous take: grant up to `units` from the pool now, and say
    /// whether anything is left anywhere.
    pub async fn take(
        &self,
        region: &RegionName,
        req: &TakeRequest,
        policy: &dyn Policy,
    ) -> Result<TakeResponse, LedgerError> {
        if req.units == 0 || req.id.is_empty() || req.id.len() > 128 {
            return Err(LedgerError::Invalid(
                "take needs units >= 1 and an id of 1..=128 characters".into(),
            ));
        }
        let mut tx = self.pool.begin().await?;
        let mut sku = lock_sku(&mut tx, &req.tenant, &req.sku)
            .await?
            .ok_or(LedgerError::UnknownSku)?;
        let regions = region_lines(&mut *tx, &sku.tenant, &sku.sku).await?;
        let index = regions
            .iter()
            .position(|l| l.region == region.as_str())
            .ok_or(LedgerError::UnknownSku)?;
        let existing: Option<(String, String, String, String, i64)> =
            sqlx::query_as("SELECT region, kind, tenant, sku, units FROM transfers WHERE id = $1")
                .bind(&req.id)
                .fetch_optional(&mut *tx)
                .await?;
        let state = state_of(&sku, &regions);
        if let Some((owner, kind, tenant, sku_name, units)) = existing {
            if owner != region.as_str()
                || kind != "GRANT"
                || tenant != req.tenant
                || sku_name != req.sku
            {
                return Err(LedgerError::Invalid(
                    "transfer id already used for something else".into(),
                ));
            }
            tx.commit().await?;
            return Ok(TakeResponse {
                grant: Some(TransferMsg {
                    id: req.id.clone(),
                    tenant,
                    sku: sku_name,
                    units: u(units),
                }),
                exhausted: false,
                paused: sku.paused,
            });
        }
        if sku.paused {
            return Ok(TakeResponse {
                grant: None,
                exhausted: false,
                paused: true,
            });
        }
        let decision = decide_take(&state, index, req.units);
        let grant_msg = if decision.granted > 0 {
            grant(&mut tx, &sku, region.as_str(), &req.id, decision.granted).await?;
            sku.pool -= decision.granted as i64;
            Some(TransferMsg {
                id: req.id.clone(),
                tenant: req.tenant.clone(),
                sku: req.sku.clone(),
                units: decision.granted,
            })
        } else {
            None
        };
        if !decision.exhausted && decision.granted < req.units {
            // Units are free elsewhere: make the policy ask for them back.
            rebalance(&mut tx, policy, &mut sku).await?;
        }
        tx.commit().await?;
        metrics::counter!("coordinator_takes_total", "exhausted" => decision.exhausted.to_string())
            .increment(1);
        metrics::counter!("coordinator_take_granted_units_total").increment(decision.granted);
        Ok(TakeResponse {
            grant: grant_msg,
            exhausted: decision.exhausted,
            paused: false,
        })
    }
}

/// A region agent's last sync.
#[derive(Debug, Clone, Serialize)]
pub struct RegionSync {
    /// The region.
    pub region: String,
    /// Its agent's epoch.
    pub epoch: i64,
    /// Its last report's sequence number.
    pub seq: i64,
    /// Its last measured round trip, ms.
    pub rtt_ms: i64,
    /// When it last synced.
    pub last_sync_at: DateTime<Utc>,
}

/// Region weights parsed from the admin API's `{"eu": 2, ...}`.
pub fn parse_weights(raw: &HashMap<String, i64>) -> Result<Vec<(RegionName, u32)>, String> {
    let mut out = Vec::with_capacity(raw.len());
    for (name, weight) in raw {
        let region = RegionName::parse(name).map_err(|e| e.to_string())?;
        let weight = u32::try_from(*weight)
            .ok()
            .filter(|w| *w <= 1_000_000)
            .ok_or_else(|| format!("weight of {name} must be an integer in 0..=1000000"))?;
        out.push((region, weight));
    }
    out.sort();
    Ok(out)
}
