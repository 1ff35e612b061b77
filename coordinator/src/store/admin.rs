//! The admin API in SQL: create and change SKUs, add stock, pause and
//! resume (each a transaction around `escrow_core::allocation`), and the
//! read-only summaries: one SKU, a page of SKUs, the audit of all, the
//! regions' agents.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use escrow_core::{Allocation, Mode, Moves, PolicyChoice, RegionName, Sku, SkuSettings, Tenant};
use serde::Serialize;

use super::backend::{sql, Tx};
use super::books::{
    count, load, load_to_change, policy_of, save, save_policy, stored, timestamp, Loaded, Lock,
};
use super::{new_grant_id, Store, StoreError};
use crate::policies::{Policies, PolicyRequest};

/// One region's part of a SKU, as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct RegionSummary {
    /// The region.
    pub region: String,
    /// Its weight in the split.
    pub weight: u32,
    /// Units delivered minus units returned.
    pub leased: u64,
    /// Units granted and not acknowledged.
    pub in_transit: u64,
    /// Cumulative units it returned.
    pub returned: u64,
    /// Units asked back, not yet returned.
    pub recall_pending: u64,
    /// Last reported available.
    pub available: u64,
    /// Last reported held.
    pub held: u64,
    /// Last reported sold.
    pub sold: u64,
    /// Last reported sale rate.
    pub sale_rate_per_s: f64,
    /// When it last reported.
    pub last_report_at: Option<DateTime<Utc>>,
    /// Its last measured round trip, ms.
    pub rtt_ms: u64,
    /// `available + held + sold - leased`: how far its last report is from its lease.
    pub drift: i64,
}

/// A SKU with all its regions, as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SkuSummary {
    /// Tenant.
    pub tenant: String,
    /// SKU.
    pub sku: String,
    /// Units in all.
    pub total: u64,
    /// Units not leased.
    pub pool: u64,
    /// Units granted and not acknowledged.
    pub in_transit: u64,
    /// ESCROW or CENTRAL.
    pub mode: Mode,
    /// Paused by an admin.
    pub paused: bool,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold duration.
    pub hold_ttl_ms: u64,
    /// The policy the SKU chose; `None` runs the coordinator's default.
    pub policy: Option<PolicyChoice>,
    /// `pool + in_transit + sum(reported available + held + sold) - total`.
    pub drift: i64,
    /// `pool + in_transit + sum(leased) - total`: the coordinator's own books.
    pub ledger_drift: i64,
    /// Per region.
    pub regions: Vec<RegionSummary>,
}

/// One SKU's line in a listing: its own counters and the sums of its
/// regions' last reports, without the per-region detail of [`SkuSummary`].
#[derive(Debug, Clone, Serialize)]
pub struct SkuLine {
    /// Tenant.
    pub tenant: String,
    /// SKU.
    pub sku: String,
    /// Units in all.
    pub total: u64,
    /// Units not leased.
    pub pool: u64,
    /// Units granted and not acknowledged.
    pub in_transit: u64,
    /// Sum of the regions' last reported available.
    pub available: u64,
    /// Sum of the regions' last reported held.
    pub held: u64,
    /// Sum of the regions' last reported sold.
    pub sold: u64,
    /// ESCROW or CENTRAL.
    pub mode: Mode,
    /// Paused by an admin.
    pub paused: bool,
    /// The policy the SKU chose; `None` runs the coordinator's default.
    pub policy: Option<PolicyChoice>,
}

/// Which SKUs a listing covers, and after which one its page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// One tenant's SKUs by name, those after `after` if given.
    Tenant {
        /// The tenant.
        tenant: Tenant,
        /// The last SKU of the previous page.
        after: Option<Sku>,
    },
    /// Every tenant's SKUs by tenant, then name; those after `after` if given.
    All {
        /// The last tenant and SKU of the previous page.
        after: Option<(Tenant, Sku)>,
    },
}

impl Listing {
    /// The condition that keeps the listing's SKUs from the page's start
    /// on, and the values of its parameters `$1`, `$2`, ... in order. Both
    /// follow the primary key (tenant, sku), whose order the page has.
    fn filter(&self) -> (&'static str, Vec<&str>) {
        match self {
            Listing::Tenant {
                tenant,
                after: None,
            } => ("WHERE s.tenant = $1", vec![tenant.as_str()]),
            Listing::Tenant {
                tenant,
                after: Some(sku),
            } => (
                "WHERE s.tenant = $1 AND s.sku > $2",
                vec![tenant.as_str(), sku.as_str()],
            ),
            Listing::All { after: None } => ("", Vec::new()),
            Listing::All {
                after: Some((tenant, sku)),
            } => (
                "WHERE (s.tenant, s.sku) > ($1, $2)",
                vec![tenant.as_str(), sku.as_str()],
            ),
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone)]
pub struct SkuPage {
    /// At most the page's limit of SKUs, in (tenant, sku) order.
    pub skus: Vec<SkuLine>,
    /// Whether more SKUs follow the last one.
    pub more: bool,
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

fn signed(units: i128, what: &str) -> Result<i64, StoreError> {
    i64::try_from(units).map_err(|_| StoreError::Corrupt(format!("{what} {units} out of range")))
}

fn summary_of(loaded: &Loaded) -> Result<SkuSummary, StoreError> {
    let a = &loaded.allocation;
    let mut regions = Vec::with_capacity(a.regions.len());
    for (name, r) in loaded.names.iter().zip(&a.regions) {
        regions.push(RegionSummary {
            region: name.as_str().to_owned(),
            weight: r.weight,
            leased: r.leased,
            in_transit: r.in_transit(),
            returned: r.returned,
            recall_pending: r.recall_pending,
            available: r.report.available,
            held: r.report.held,
            sold: r.report.sold,
            sale_rate_per_s: r.report.sale_rate_per_s,
            last_report_at: r.reported_at_ms.map(timestamp).transpose()?,
            rtt_ms: r.rtt_ms,
            drift: signed(
                i128::from(r.report.on_hand()) - i128::from(r.leased),
                "region drift",
            )?,
        });
    }
    Ok(SkuSummary {
        tenant: a.tenant.as_str().to_owned(),
        sku: a.sku.as_str().to_owned(),
        total: a.total,
        pool: a.pool,
        in_transit: a.in_transit(),
        mode: a.mode,
        paused: a.paused,
        max_per_user: a.settings.max_per_user,
        hold_ttl_ms: a.settings.hold_ttl.get(),
        policy: loaded.policy.clone(),
        drift: signed(a.drift(), "drift")?,
        ledger_drift: signed(a.ledger_drift(), "ledger drift")?,
        regions,
    })
}

/// Weights for `loaded`'s regions from an admin's `weights`: a region left
/// out gets 0 (retired), a region not yet in the SKU joins at the end.
fn reweigh(loaded: &mut Loaded, weights: &[(RegionName, u32)]) -> Vec<u32> {
    let mut out: Vec<u32> = loaded
        .names
        .iter()
        .map(|n| weights.iter().find(|(r, _)| r == n).map_or(0, |(_, w)| *w))
        .collect();
    for (region, weight) in weights {
        if !loaded.names.contains(region) {
            loaded.names.push(region.clone());
            out.push(*weight);
        }
    }
    out
}

/// An admin change's idempotency key and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminKey {
    /// The client's `Idempotency-Key`.
    pub key: String,
    /// The change it names, in a canonical text: the same request gives
    /// the same text.
    pub operation: String,
}

/// What an admin change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A new SKU.
    Created,
    /// An existing SKU changed.
    Changed,
    /// The same change with the same key was applied before; nothing now.
    Replayed,
}

/// Records `key` in `tx`, the change's own transaction: `true` if the
/// change is new, `false` if this very change was recorded before (then
/// nothing is to be applied); a key recorded for another change is refused.
async fn claim(tx: &mut Tx, key: Option<&AdminKey>) -> Result<bool, StoreError> {
    let Some(key) = key else {
        return Ok(true);
    };
    if key.key.is_empty() || key.key.len() > 128 {
        return Err(StoreError::Invalid(
            "Idempotency-Key must be 1 to 128 characters".into(),
        ));
    }
    let inserted = sql("INSERT INTO admin_requests (key, operation, created_at)
                        VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
    .bind(key.key.as_str())
    .bind(key.operation.as_str())
    .bind(Utc::now())
    .execute(tx)
    .await?;
    if inserted == 1 {
        return Ok(true);
    }
    let row = sql("SELECT operation FROM admin_requests WHERE key = $1")
        .bind(key.key.as_str())
        .fetch_optional(tx)
        .await?
        .ok_or_else(|| StoreError::Corrupt("admin request key vanished under lock".into()))?;
    let operation: String = row.try_get("operation")?;
    if operation == key.operation {
        Ok(false)
    } else {
        Err(StoreError::Conflict(format!(
            "Idempotency-Key {} was used for another change: {operation}",
            key.key
        )))
    }
}

impl Store {
    /// Creates a SKU or changes it, then rebalances it under the policy it
    /// runs after the change; with a `key` seen before for the same
    /// change, does nothing.
    pub async fn put_sku(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        spec: &SkuSpec,
        policies: &Policies,
        key: Option<&AdminKey>,
    ) -> Result<Applied, StoreError> {
        let invalid = |e: escrow_core::IdError| StoreError::Invalid(e.to_string());
        let mut tx = self.db.write().await?;
        if !claim(&mut tx, key).await? {
            return Ok(Applied::Replayed);
        }
        let existing =
            load_to_change(&mut tx, tenant.as_str(), sku.as_str(), Lock::ForUpdate).await?;
        let created = existing.is_none();
        let stored_policy = existing.as_ref().and_then(|l| l.policy.as_ref());
        let chosen = policies
            .choose(stored_policy, &spec.policy)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let policy_changed = chosen.as_ref() != stored_policy;
        let policy = policies.of(chosen.as_ref()).build();
        let policy = policy.as_ref();
        let (before, mut loaded, split) = match existing {
            None => {
                let settings =
                    SkuSettings::parse(spec.max_per_user, spec.hold_ttl_ms).map_err(invalid)?;
                let regions = spec.regions.clone().unwrap_or_default();
                let weights: Vec<u32> = regions.iter().map(|(_, w)| *w).collect();
                let (allocation, split) = Allocation::create(
                    tenant.clone(),
                    sku.clone(),
                    spec.total,
                    settings,
                    &weights,
                    policy,
                    &mut new_grant_id,
                );
                let names = regions.into_iter().map(|(r, _)| r).collect();
                let loaded = Loaded {
                    allocation,
                    names,
                    policy: None,
                };
                (None, loaded, split)
            }
            Some(mut loaded) => {
                let before = loaded.allocation.clone();
                let current = before.settings;
                loaded.allocation.settings = SkuSettings::parse(
                    Some(spec.max_per_user.unwrap_or(i64::from(current.max_per_user))),
                    Some(spec.hold_ttl_ms.unwrap_or(stored(current.hold_ttl.get())?)),
                )
                .map_err(invalid)?;
                loaded.allocation.set_total(spec.total)?;
                if let Some(weights) = &spec.regions {
                    let weights = reweigh(&mut loaded, weights);
                    loaded.allocation.set_weights(&weights);
                }
                (Some(before), loaded, Default::default())
            }
        };
        let moves = loaded.allocation.rebalance(policy, &mut new_grant_id);
        save(&mut tx, before.as_ref(), &loaded.allocation, &loaded.names).await?;
        if policy_changed {
            save_policy(&mut tx, tenant, sku, chosen.as_ref()).await?;
        }
        tx.commit().await?;
        self.observe(
            before.as_ref(),
            &loaded.allocation,
            &loaded.names,
            &split,
            None,
        );
        self.observe(
            before.as_ref(),
            &loaded.allocation,
            &loaded.names,
            &moves,
            None,
        );
        Ok(if created {
            Applied::Created
        } else {
            Applied::Changed
        })
    }

    /// Adds units to a SKU's pool (and total), then rebalances it.
    pub async fn add_stock(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        units: u64,
        policies: &Policies,
        key: Option<&AdminKey>,
    ) -> Result<Applied, StoreError> {
        self.change(tenant, sku, key, |loaded| {
            let policy = policies.of(loaded.policy.as_ref()).build();
            loaded.allocation.add_stock(units);
            loaded
                .allocation
                .rebalance(policy.as_ref(), &mut new_grant_id)
        })
        .await
    }

    /// Pauses or resumes a SKU everywhere (agents learn it at their next
    /// sync, as news).
    pub async fn set_paused(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        paused: bool,
        key: Option<&AdminKey>,
    ) -> Result<Applied, StoreError> {
        self.change(tenant, sku, key, |loaded| {
            loaded.allocation.paused = paused;
            Moves::default()
        })
        .await
    }

    /// Locks and loads a SKU, applies `change` to it and writes the result,
    /// in one transaction (none if `key` shows it was applied before).
    async fn change(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        key: Option<&AdminKey>,
        change: impl FnOnce(&mut Loaded) -> Moves,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.db.write().await?;
        if !claim(&mut tx, key).await? {
            return Ok(Applied::Replayed);
        }
        let mut loaded = load_to_change(&mut tx, tenant.as_str(), sku.as_str(), Lock::ForUpdate)
            .await?
            .ok_or(StoreError::UnknownSku)?;
        let before = loaded.allocation.clone();
        let moves = change(&mut loaded);
        save(&mut tx, Some(&before), &loaded.allocation, &loaded.names).await?;
        tx.commit().await?;
        self.observe(
            Some(&before),
            &loaded.allocation,
            &loaded.names,
            &moves,
            None,
        );
        Ok(Applied::Changed)
    }

    /// One SKU with its regions.
    pub async fn sku(&self, tenant: &Tenant, sku: &Sku) -> Result<SkuSummary, StoreError> {
        self.summaries(Some((tenant, sku)))
            .await?
            .pop()
            .ok_or(StoreError::UnknownSku)
    }

    /// Every SKU with its regions, from one consistent snapshot.
    pub async fn audit(&self) -> Result<Vec<SkuSummary>, StoreError> {
        self.summaries(None).await
    }

    /// SKU summaries (all, or one) read in one snapshot, so pool,
    /// transfers and reports add up as they were at one instant.
    async fn summaries(
        &self,
        only: Option<(&Tenant, &Sku)>,
    ) -> Result<Vec<SkuSummary>, StoreError> {
        let mut tx = self.db.snapshot().await?;
        let keys: Vec<(String, String)> = match only {
            Some((tenant, sku)) => vec![(tenant.as_str().to_owned(), sku.as_str().to_owned())],
            None => sql("SELECT tenant, sku FROM skus ORDER BY tenant, sku")
                .fetch_all(&mut tx)
                .await?
                .iter()
                .map(|row| Ok((row.try_get("tenant")?, row.try_get("sku")?)))
                .collect::<Result<_, StoreError>>()?,
        };
        let mut out = Vec::with_capacity(keys.len());
        for (tenant, sku) in &keys {
            let loaded = load(&mut tx, tenant, sku, Lock::None)
                .await?
                .ok_or(StoreError::UnknownSku)?;
            out.push(summary_of(&loaded)?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// A page of at most `limit` SKUs of `listing`, in one query: the
    /// regions' reports and the grants in transit are summed per SKU by the
    /// database, so a page costs the same whatever its SKUs' regions.
    pub async fn list_skus(&self, listing: &Listing, limit: u32) -> Result<SkuPage, StoreError> {
        let (filter, params) = listing.filter();
        // One row beyond the page tells whether another page follows.
        let mut statement = sql(format!(
            "SELECT s.tenant, s.sku, s.total, s.pool, s.mode, s.paused, s.policy, s.policy_settings,
                    (SELECT CAST(COALESCE(SUM(r.reported_available), 0) AS BIGINT)
                     FROM sku_regions r WHERE r.tenant = s.tenant AND r.sku = s.sku) AS available,
                    (SELECT CAST(COALESCE(SUM(r.reported_held), 0) AS BIGINT)
                     FROM sku_regions r WHERE r.tenant = s.tenant AND r.sku = s.sku) AS held,
                    (SELECT CAST(COALESCE(SUM(r.reported_sold), 0) AS BIGINT)
                     FROM sku_regions r WHERE r.tenant = s.tenant AND r.sku = s.sku) AS sold,
                    (SELECT CAST(COALESCE(SUM(t.units), 0) AS BIGINT)
                     FROM transfers t
                     WHERE t.tenant = s.tenant AND t.sku = s.sku
                       AND t.kind = 'GRANT' AND t.state = 'PENDING') AS in_transit
             FROM skus s {filter}
             ORDER BY s.tenant, s.sku
             LIMIT ${}",
            params.len() + 1
        ));
        for param in params {
            statement = statement.bind(param);
        }
        let mut tx = self.db.snapshot().await?;
        let rows = statement
            .bind(i64::from(limit) + 1)
            .fetch_all(&mut tx)
            .await?;
        tx.commit().await?;
        let more = rows.len() > limit as usize;
        let skus = rows
            .iter()
            .take(limit as usize)
            .map(|row| {
                let mode: String = row.try_get("mode")?;
                Ok(SkuLine {
                    tenant: row.try_get("tenant")?,
                    sku: row.try_get("sku")?,
                    total: count(row.try_get("total")?, "total")?,
                    pool: count(row.try_get("pool")?, "pool")?,
                    in_transit: count(row.try_get("in_transit")?, "in_transit")?,
                    available: count(row.try_get("available")?, "available")?,
                    held: count(row.try_get("held")?, "held")?,
                    sold: count(row.try_get("sold")?, "sold")?,
                    mode: Mode::parse(&mode)
                        .ok_or_else(|| StoreError::Corrupt(format!("stored mode {mode}")))?,
                    paused: row.try_get("paused")?,
                    policy: policy_of(row.try_get("policy")?, row.try_get("policy_settings")?)?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(SkuPage { skus, more })
    }

    /// Every region that ever synced.
    pub async fn regions(&self) -> Result<Vec<RegionSync>, StoreError> {
        let mut tx = self.db.snapshot().await?;
        let rows =
            sql("SELECT region, epoch, seq, rtt_ms, last_sync_at FROM regions ORDER BY region")
                .fetch_all(&mut tx)
                .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                Ok(RegionSync {
                    region: r.try_get("region")?,
                    epoch: r.try_get("epoch")?,
                    seq: r.try_get("seq")?,
                    rtt_ms: r.try_get("rtt_ms")?,
                    last_sync_at: r.time("last_sync_at")?.ok_or_else(|| {
                        StoreError::Corrupt("a region without last_sync_at".into())
                    })?,
                })
            })
            .collect()
    }
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
    /// The SKU's policy; an empty request keeps the current one.
    pub policy: PolicyRequest,
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
