//! One SKU's rows as an escrow-core [`Allocation`], and back.
//!
//! `skus` holds the total, pool, mode, settings and the SKU's own policy
//! choice, if any; `sku_regions` one row
//! per region (lease, cumulative returns, pending recall, last report and
//! the `(epoch, seq)` of the request that brought it);
//! `transfers` the grants still `PENDING` (in transit); `regions` each
//! agent's round trip. [`load`] reads them into an [`Allocation`] with the
//! region names beside it; [`save`] writes what a rules call changed, each
//! statement conditional on the values [`load`] read, so a lost update or a
//! reused transfer id fails the transaction instead of passing unseen.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use escrow_core::allocation::{RegionAllocation, Report};
use escrow_core::protocol::SkuDirective;
use escrow_core::{
    Allocation, Mode, PolicyChoice, RegionName, Sku, SkuSettings, Tenant, UserLimitScope,
};

use super::backend::{self, sql, Row, Tx};
use super::StoreError;

/// One SKU as loaded: its state and, by the same index, its regions' names.
#[derive(Debug, Clone)]
pub(super) struct Loaded {
    /// The SKU's state.
    pub allocation: Allocation,
    /// `names[i]` is the region of `allocation.regions[i]`.
    pub names: Vec<RegionName>,
    /// The policy the SKU chose; `None` runs the coordinator's default.
    pub policy: Option<PolicyChoice>,
}

impl Loaded {
    /// The index of `region` in this SKU, if it takes part.
    pub fn index_of(&self, region: &RegionName) -> Option<usize> {
        self.names.iter().position(|n| n == region)
    }

    /// The directive for the region at `index`, with the SKU's regions
    /// under a global per-user limit.
    pub fn directive(&self, index: usize) -> SkuDirective {
        SkuDirective {
            limit_regions: self.limit_regions(),
            ..self.allocation.directive(index)
        }
    }

    /// The regions a user's home is chosen among under a global per-user
    /// limit, sorted; none under a `region` scope.
    pub fn limit_regions(&self) -> Vec<RegionName> {
        if self.allocation.settings.user_limit_scope == UserLimitScope::Region {
            return Vec::new();
        }
        let mut names = self.names.clone();
        names.sort();
        names
    }
}

/// Whether [`load`] locks the SKU's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    /// `FOR UPDATE` (on SQLite, the write lock the transaction holds):
    /// the caller will change the SKU.
    ForUpdate,
    /// A plain read (in a snapshot, or of a row already locked).
    None,
}

/// A counter stored as `bigint`; the schema's CHECK keeps it >= 0.
pub(super) fn count(raw: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(raw).map_err(|_| StoreError::Corrupt(format!("{what} is negative: {raw}")))
}

/// A count as stored in a `bigint` column.
pub(super) fn stored(units: u64) -> Result<i64, StoreError> {
    i64::try_from(units)
        .map_err(|_| StoreError::Invalid(format!("{units} is more than a count can hold")))
}

fn corrupt<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Corrupt(format!("stored {what}: {e}"))
}

/// A text column holding an identifier, parsed into its type.
pub(super) fn ident<T>(row: &Row, name: &'static str) -> Result<T, StoreError>
where
    T: TryFrom<String>,
    T::Error: std::fmt::Display,
{
    T::try_from(row.try_get::<String>(name)?).map_err(corrupt(name))
}

fn millis(at: DateTime<Utc>) -> Result<u64, StoreError> {
    count(at.timestamp_millis(), "report time")
}

pub(super) fn timestamp(ms: u64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_millis(stored(ms)?)
        .ok_or_else(|| StoreError::Corrupt(format!("report time {ms} ms out of range")))
}

/// Loads one SKU to change it: as [`load`], but a SKU whose stored books
/// do not balance is refused (the rules assert the balance at every move,
/// and a corrupt SKU must stop selling rather than sell on; the audit shows it).
pub(super) async fn load_to_change(
    conn: &mut Tx,
    tenant: &Tenant,
    sku: &Sku,
    lock: Lock,
) -> Result<Option<Loaded>, StoreError> {
    let Some(loaded) = load(conn, tenant, sku, lock).await? else {
        return Ok(None);
    };
    if !loaded.allocation.is_balanced() {
        return Err(StoreError::Corrupt(format!(
            "books of {tenant}/{sku} do not balance: ledger drift {}",
            loaded.allocation.ledger_drift()
        )));
    }
    Ok(Some(loaded))
}

/// The columns of `skus` that [`sku_of`] reads.
const SKU_COLUMNS: &str = "s.tenant, s.sku, s.total, s.pool, s.mode, s.paused, s.max_per_user,
                           s.hold_ttl_ms, s.user_limit_scope, s.policy, s.policy_settings";

/// The columns of `sku_regions` (as `r`, joined with `regions` as `g`)
/// that [`region_of`] reads.
const REGION_COLUMNS: &str = "r.tenant, r.sku, r.region, r.weight, r.leased, r.returned,
                              r.recall_pending, r.reported_available, r.reported_held,
                              r.reported_sold, r.sale_rate_per_s, r.reported_at, r.report_epoch,
                              r.report_seq, r.reported_set_aside, COALESCE(g.rtt_ms, 0) AS rtt_ms";

/// Loads one SKU with its regions and pending grants.
pub(super) async fn load(
    conn: &mut Tx,
    tenant: &Tenant,
    sku: &Sku,
    lock: Lock,
) -> Result<Option<Loaded>, StoreError> {
    let lock = match lock {
        Lock::ForUpdate => conn.locking("FOR UPDATE"),
        Lock::None => "",
    };
    let row = sql(format!(
        "SELECT {SKU_COLUMNS} FROM skus s WHERE s.tenant = $1 AND s.sku = $2 {lock}"
    ))
    .bind(tenant)
    .bind(sku)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut loaded = sku_of(&row)?;
    let rows = sql(format!(
        "SELECT {REGION_COLUMNS}
         FROM sku_regions r LEFT JOIN regions g ON g.region = r.region
         WHERE r.tenant = $1 AND r.sku = $2
         ORDER BY r.region"
    ))
    .bind(tenant)
    .bind(sku)
    .fetch_all(&mut *conn)
    .await?;
    for row in &rows {
        add_region(&mut loaded, row)?;
    }
    let grants = sql("SELECT id, region, units FROM transfers
                      WHERE tenant = $1 AND sku = $2 AND kind = 'GRANT' AND state = 'PENDING'")
    .bind(tenant)
    .bind(sku)
    .fetch_all(&mut *conn)
    .await?;
    for row in &grants {
        add_grant(&mut loaded, row)?;
    }
    Ok(Some(loaded))
}

/// Loads, without locks (read in a snapshot), every SKU `region` takes
/// part in, in (tenant, sku) order: three statements for all of them, so
/// a full sync reads its region's SKUs at once and locks only those it
/// changes.
pub(super) async fn load_region(
    conn: &mut Tx,
    region: &RegionName,
) -> Result<Vec<Loaded>, StoreError> {
    let mine = "SELECT tenant, sku FROM sku_regions WHERE region = $1";
    let rows = sql(format!(
        "SELECT {SKU_COLUMNS} FROM skus s WHERE (s.tenant, s.sku) IN ({mine})
         ORDER BY s.tenant, s.sku"
    ))
    .bind(region.as_str())
    .fetch_all(&mut *conn)
    .await?;
    let mut skus = Vec::with_capacity(rows.len());
    let mut index = BTreeMap::new();
    for row in &rows {
        let loaded = sku_of(row)?;
        index.insert(
            (
                loaded.allocation.tenant.as_str().to_owned(),
                loaded.allocation.sku.as_str().to_owned(),
            ),
            skus.len(),
        );
        skus.push(loaded);
    }
    let find = |row: &Row| -> Result<usize, StoreError> {
        let key: (String, String) = (row.try_get("tenant")?, row.try_get("sku")?);
        index
            .get(&key)
            .copied()
            .ok_or_else(|| StoreError::Corrupt(format!("row of unknown sku {}/{}", key.0, key.1)))
    };
    let rows = sql(format!(
        "SELECT {REGION_COLUMNS}
         FROM sku_regions r LEFT JOIN regions g ON g.region = r.region
         WHERE (r.tenant, r.sku) IN ({mine})
         ORDER BY r.tenant, r.sku, r.region"
    ))
    .bind(region.as_str())
    .fetch_all(&mut *conn)
    .await?;
    for row in &rows {
        add_region(&mut skus[find(row)?], row)?;
    }
    let grants = sql(format!(
        "SELECT tenant, sku, id, region, units FROM transfers
         WHERE kind = 'GRANT' AND state = 'PENDING' AND (tenant, sku) IN ({mine})"
    ))
    .bind(region.as_str())
    .fetch_all(&mut *conn)
    .await?;
    for row in &grants {
        add_grant(&mut skus[find(row)?], row)?;
    }
    Ok(skus)
}

/// A SKU from its `skus` row ([`SKU_COLUMNS`]), without regions yet.
fn sku_of(row: &Row) -> Result<Loaded, StoreError> {
    let mode: String = row.try_get("mode")?;
    let policy = policy_of(row.try_get("policy")?, row.try_get("policy_settings")?)?;
    let max_per_user: i32 = row.try_get("max_per_user")?;
    let allocation = Allocation {
        tenant: ident(row, "tenant")?,
        sku: ident(row, "sku")?,
        total: count(row.try_get("total")?, "total")?,
        pool: count(row.try_get("pool")?, "pool")?,
        mode: Mode::parse(&mode)
            .ok_or_else(|| StoreError::Corrupt(format!("stored mode {mode}")))?,
        paused: row.try_get("paused")?,
        settings: SkuSettings::parse(
            Some(i64::from(max_per_user)),
            Some(row.try_get("hold_ttl_ms")?),
        )
        .map_err(corrupt("settings"))?
        .with_scope(
            UserLimitScope::parse(&row.try_get::<String>("user_limit_scope")?)
                .map_err(corrupt("user_limit_scope"))?,
        ),
        regions: Vec::new(),
    };
    Ok(Loaded {
        allocation,
        names: Vec::new(),
        policy,
    })
}

/// Adds a region from its `sku_regions` row ([`REGION_COLUMNS`]).
fn add_region(loaded: &mut Loaded, row: &Row) -> Result<(), StoreError> {
    loaded
        .names
        .push(RegionName::parse(row.try_get("region")?).map_err(corrupt("region"))?);
    loaded.allocation.regions.push(region_of(row)?);
    Ok(())
}

/// Adds a pending grant from its `transfers` row.
fn add_grant(loaded: &mut Loaded, row: &Row) -> Result<(), StoreError> {
    let region: String = row.try_get("region")?;
    let index = loaded
        .names
        .iter()
        .position(|n| n.as_str() == region)
        .ok_or_else(|| StoreError::Corrupt(format!("grant to unknown region {region}")))?;
    loaded.allocation.regions[index]
        .grants
        .insert(ident(row, "id")?, count(row.try_get("units")?, "grant")?);
    Ok(())
}

/// A stored policy choice: a name and its settings as JSON, both or neither.
pub(super) fn policy_of(
    name: Option<String>,
    settings: Option<String>,
) -> Result<Option<PolicyChoice>, StoreError> {
    match (name, settings) {
        (None, None) => Ok(None),
        (Some(name), Some(settings)) => {
            let settings = serde_json::from_str(&settings).map_err(corrupt("policy settings"))?;
            PolicyChoice::from_parts(&name, settings)
                .map(Some)
                .map_err(corrupt("policy"))
        }
        _ => Err(StoreError::Corrupt(
            "a policy without settings, or settings without a policy".into(),
        )),
    }
}

/// Stores a SKU's policy choice (`None`: the coordinator's default).
pub(super) async fn save_policy(
    conn: &mut Tx,
    tenant: &Tenant,
    sku: &Sku,
    policy: Option<&PolicyChoice>,
) -> Result<(), StoreError> {
    let changed = sql(
        "UPDATE skus SET policy = $3, policy_settings = $4, updated_at = $5
         WHERE tenant = $1 AND sku = $2",
    )
    .bind(tenant.as_str())
    .bind(sku.as_str())
    .bind(policy.map(PolicyChoice::name))
    .bind(policy.map(|p| p.settings().to_string()))
    .bind(Utc::now())
    .execute(&mut *conn)
    .await?;
    one_row(changed, "sku policy")
}

fn region_of(row: &Row) -> Result<RegionAllocation, StoreError> {
    let weight: i32 = row.try_get("weight")?;
    let reported_at: Option<DateTime<Utc>> = row.time("reported_at")?;
    Ok(RegionAllocation {
        weight: u32::try_from(weight)
            .map_err(|_| StoreError::Corrupt(format!("weight is negative: {weight}")))?,
        leased: count(row.try_get("leased")?, "leased")?,
        grants: BTreeMap::new(),
        returned: count(row.try_get("returned")?, "returned")?,
        recall_pending: count(row.try_get("recall_pending")?, "recall_pending")?,
        report: Report {
            available: count(row.try_get("reported_available")?, "reported_available")?,
            held: count(row.try_get("reported_held")?, "reported_held")?,
            sold: count(row.try_get("reported_sold")?, "reported_sold")?,
            sale_rate_per_s: row.try_get("sale_rate_per_s")?,
            set_aside: count(row.try_get("reported_set_aside")?, "reported_set_aside")?,
        },
        reported_at_ms: reported_at.map(millis).transpose()?,
        rtt_ms: count(row.try_get("rtt_ms")?, "rtt_ms")?,
        reported_by: (
            row.try_get("report_epoch")?,
            count(row.try_get("report_seq")?, "report_seq")?,
        ),
    })
}

fn max_per_user(sku: &Allocation) -> Result<i32, StoreError> {
    let max = sku.settings.max_per_user;
    i32::try_from(max).map_err(|_| StoreError::Invalid(format!("max_per_user {max} is too large")))
}

/// Fails unless a statement changed exactly one row.
fn one_row(changed: u64, what: &str) -> Result<(), StoreError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::Corrupt(format!(
            "{what}: {changed} rows changed"
        )))
    }
}

/// Writes what changed from `before` (`None`: a new SKU) to `after`;
/// `names` names `after`'s regions by index.
pub(super) async fn save(
    conn: &mut Tx,
    before: Option<&Allocation>,
    after: &Allocation,
    names: &[RegionName],
) -> Result<(), StoreError> {
    assert_eq!(names.len(), after.regions.len(), "one name per region");
    assert!(after.is_balanced(), "the rules keep the books balanced");
    save_sku(conn, before, after).await?;
    let none = RegionAllocation::default();
    for (i, (name, region)) in names.iter().zip(&after.regions).enumerate() {
        let old = before.and_then(|b| b.regions.get(i));
        save_region(conn, after, name, old, region).await?;
        let old_grants = &old.unwrap_or(&none).grants;
        for id in old_grants
            .keys()
            .filter(|id| !region.grants.contains_key(*id))
        {
            let changed = sql("UPDATE transfers SET state = 'DELIVERED', delivered_at = $3
                               WHERE id = $1 AND region = $2 AND kind = 'GRANT' AND state = 'PENDING'")
            .bind(id)
            .bind(name.as_str())
            .bind(Utc::now())
            .execute(&mut *conn)
            .await?;
            one_row(changed, "grant delivery")?;
        }
        for (id, units) in region
            .grants
            .iter()
            .filter(|(id, _)| !old_grants.contains_key(*id))
        {
            let changed = sql(
                "INSERT INTO transfers (id, tenant, sku, region, kind, units, state)
                 VALUES ($1, $2, $3, $4, 'GRANT', $5, 'PENDING') ON CONFLICT (id) DO NOTHING",
            )
            .bind(id)
            .bind(after.tenant.as_str())
            .bind(after.sku.as_str())
            .bind(name.as_str())
            .bind(stored(*units)?)
            .execute(&mut *conn)
            .await?;
            if changed != 1 {
                return Err(StoreError::Invalid(
                    "transfer id already used for something else".into(),
                ));
            }
        }
    }
    Ok(())
}

async fn save_sku(
    conn: &mut Tx,
    before: Option<&Allocation>,
    after: &Allocation,
) -> Result<(), StoreError> {
    let sql = match before {
        None => {
            "INSERT INTO skus (tenant, sku, total, pool, mode, paused, max_per_user, hold_ttl_ms,
                               user_limit_scope)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING"
        }
        Some(before)
            if (
                before.total,
                before.pool,
                before.mode,
                before.paused,
                before.settings,
            ) == (
                after.total,
                after.pool,
                after.mode,
                after.paused,
                after.settings,
            ) =>
        {
            return Ok(());
        }
        Some(_) => {
            "UPDATE skus SET total = $3, pool = $4, mode = $5, paused = $6, max_per_user = $7,
                    hold_ttl_ms = $8, updated_at = $13, user_limit_scope = $14
             WHERE tenant = $1 AND sku = $2
               AND total = $9 AND pool = $10 AND mode = $11 AND paused = $12"
        }
    };
    let mut query = backend::sql(sql)
        .bind(after.tenant.as_str())
        .bind(after.sku.as_str())
        .bind(stored(after.total)?)
        .bind(stored(after.pool)?)
        .bind(after.mode.as_str())
        .bind(after.paused)
        .bind(max_per_user(after)?)
        .bind(stored(after.settings.hold_ttl.get())?);
    if let Some(before) = before {
        query = query
            .bind(stored(before.total)?)
            .bind(stored(before.pool)?)
            .bind(before.mode.as_str())
            .bind(before.paused)
            .bind(Utc::now());
    }
    let query = query.bind(after.settings.user_limit_scope.as_str());
    let changed = query.execute(&mut *conn).await?;
    if before.is_none() && changed != 1 {
        return Err(StoreError::Conflict(
            "the SKU was created by a concurrent request".into(),
        ));
    }
    one_row(changed, "sku row")
}

async fn save_region(
    conn: &mut Tx,
    sku: &Allocation,
    name: &RegionName,
    before: Option<&RegionAllocation>,
    after: &RegionAllocation,
) -> Result<(), StoreError> {
    let sql = match before {
        None => {
            "INSERT INTO sku_regions (tenant, sku, region, weight, leased, returned, recall_pending,
                    reported_available, reported_held, reported_sold, sale_rate_per_s, reported_at,
                    report_epoch, report_seq, reported_set_aside)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
             ON CONFLICT DO NOTHING"
        }
        Some(before) if unchanged(before, after) => return Ok(()),
        Some(_) => {
            "UPDATE sku_regions SET weight = $4, leased = $5, returned = $6, recall_pending = $7,
                    reported_available = $8, reported_held = $9, reported_sold = $10,
                    sale_rate_per_s = $11, reported_at = $12, report_epoch = $13, report_seq = $14,
                    reported_set_aside = $15
             WHERE tenant = $1 AND sku = $2 AND region = $3
               AND leased = $16 AND returned = $17 AND recall_pending = $18
               AND report_epoch = $19 AND report_seq = $20"
        }
    };
    let weight = i32::try_from(after.weight)
        .map_err(|_| StoreError::Invalid(format!("weight {} is too large", after.weight)))?;
    let mut query = backend::sql(sql)
        .bind(sku.tenant.as_str())
        .bind(sku.sku.as_str())
        .bind(name.as_str())
        .bind(weight)
        .bind(stored(after.leased)?)
        .bind(stored(after.returned)?)
        .bind(stored(after.recall_pending)?)
        .bind(stored(after.report.available)?)
        .bind(stored(after.report.held)?)
        .bind(stored(after.report.sold)?)
        .bind(after.report.sale_rate_per_s)
        .bind(after.reported_at_ms.map(timestamp).transpose()?)
        .bind(after.reported_by.0)
        .bind(stored(after.reported_by.1)?)
        .bind(stored(after.report.set_aside)?);
    if let Some(before) = before {
        query = query
            .bind(stored(before.leased)?)
            .bind(stored(before.returned)?)
            .bind(stored(before.recall_pending)?)
            .bind(before.reported_by.0)
            .bind(stored(before.reported_by.1)?);
    }
    let changed = query.execute(&mut *conn).await?;
    one_row(changed, "region row")
}

/// Whether a region's row needs no write (grants live in `transfers`, the
/// round trip in `regions`).
fn unchanged(before: &RegionAllocation, after: &RegionAllocation) -> bool {
    (
        before.weight,
        before.leased,
        before.returned,
        before.recall_pending,
        before.report,
        before.reported_at_ms,
        before.reported_by,
    ) == (
        after.weight,
        after.leased,
        after.returned,
        after.recall_pending,
        after.report,
        after.reported_at_ms,
        after.reported_by,
    )
}
