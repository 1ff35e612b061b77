//! The admin API's read model: one SKU with its regions, a page of SKUs,
//! the audit of all, the regions' agents. Each is read in one snapshot
//! and is the very value the admin API answers with: the handlers
//! serialize these types as they are, and the OpenAPI document takes its
//! schemas from them (under the names clients know, `SkuViewBody` and so
//! on). What a view decides beyond the stored rows (the policy a SKU runs
//! without a choice of its own, whether a region's report is stale) is
//! decided here, from what it is read against ([`ViewAt`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use escrow_core::allocation::RegionAllocation;
use escrow_core::{Mode, Sku, Tenant, UserLimitScope};
use serde::Serialize;
use utoipa::ToSchema;

use crate::policies::Policies;
use crate::store::backend::sql;
use crate::store::books::{count, ident, load, policy_of, timestamp, Loaded, Lock};
use crate::store::{Store, StoreError};

/// What a view of a SKU is read against: the policies (a SKU without a
/// choice of its own runs the default), the instant the view is of, and
/// the age past which a region's report is stale.
#[derive(Debug, Clone, Copy)]
pub struct ViewAt<'a> {
    /// The coordinator's default policy and what each SKU's choice is.
    pub policies: &'a Policies,
    /// The instant the view is of: report ages are counted to it.
    pub now: DateTime<Utc>,
    /// A report older than this, ms, is stale (`--stale-report-ms`).
    pub stale_report_ms: u64,
}

/// The stale-report rule: a region's report is stale when it is older
/// than `stale_report_ms`, or there is none, while the region has units
/// (leased, in transit, or on hand by its report). A region with no units
/// has nothing to report, so its silence is not news.
pub fn report_is_stale(
    report_age_ms: Option<i64>,
    stale_report_ms: u64,
    region: &RegionAllocation,
) -> bool {
    let stale_ms = i64::try_from(stale_report_ms).unwrap_or(i64::MAX);
    let has_units = region.leased > 0 || region.in_transit() > 0 || region.report.on_hand() > 0;
    report_age_ms.is_none_or(|age| age > stale_ms) && has_units
}

/// One region of a SKU, in the SKU view.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = RegionView)]
pub struct RegionSummary {
    /// The region's weight (0: removed, its free units are recalled).
    pub weight: u32,
    /// Units delivered to the region minus units it returned.
    pub leased: u64,
    /// This region's share of `in_transit`.
    pub in_transit: u64,
    /// From the region's last report (0 before the first).
    pub available: u64,
    /// From the region's last report.
    pub held: u64,
    /// From the region's last report.
    pub sold: u64,
    /// From the region's last report.
    pub sale_rate_per_s: f64,
    /// Units asked back and not yet returned.
    pub recall_pending: u64,
    /// When the last report was stored; null if none.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub last_report_at: Option<DateTime<Utc>>,
    /// The last report's age; null if none.
    pub report_age_ms: Option<i64>,
    /// The report is too old (or missing) while the region has units.
    pub stale: bool,
    /// `available + held + sold - leased`; 0 once the current report is in.
    pub region_drift: i64,
}

/// The coordinator's view of one SKU.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = SkuViewBody)]
pub struct SkuSummary {
    /// The SKU's tenant.
    pub tenant: String,
    /// The SKU.
    pub sku: String,
    /// Units in all.
    pub total: u64,
    /// Units not leased to any region.
    pub pool: u64,
    /// Units of grants not yet acknowledged, over all regions.
    pub in_transit: u64,
    /// `ESCROW` or `CENTRAL`.
    pub mode: Mode,
    /// Paused by an admin.
    pub paused: bool,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold duration.
    pub hold_ttl_ms: u64,
    /// `region`: the per-user limit counts each region's rows; `global`:
    /// all regions' together.
    #[schema(value_type = String, example = "region")]
    pub user_limit_scope: UserLimitScope,
    /// The policy the SKU runs.
    pub policy: String,
    /// All of the policy's settings; null for `static` and `central`.
    #[schema(value_type = Option<Object>)]
    pub settings: serde_json::Value,
    /// The SKU follows the coordinator's `--policy`.
    pub policy_is_default: bool,
    /// `pool + in_transit + sum(regions' available + held + sold) - total`; must be 0.
    pub drift: i64,
    /// `pool + in_transit + sum(leased) - total`; must be 0.
    pub ledger_drift: i64,
    /// Some region's report is stale.
    pub stale: bool,
    /// Per region, by name.
    pub regions: BTreeMap<String, RegionSummary>,
}

/// One SKU's line in a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = SkuLineBody)]
pub struct SkuLine {
    /// The SKU's tenant.
    pub tenant: String,
    /// The SKU.
    pub sku: String,
    /// Units in all.
    pub total: u64,
    /// Units not leased to any region.
    pub pool: u64,
    /// Units of grants not yet acknowledged.
    pub in_transit: u64,
    /// Sum of the regions' last reported available.
    pub available: u64,
    /// Sum of the regions' last reported held.
    pub held: u64,
    /// Sum of the regions' last reported sold.
    pub sold: u64,
    /// `ESCROW` or `CENTRAL`.
    pub mode: Mode,
    /// Paused by an admin.
    pub paused: bool,
    /// The policy the SKU runs.
    pub policy: String,
}

/// A page of a listing of SKUs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SkuPage {
    /// The page's SKUs, in order.
    pub skus: Vec<SkuLine>,
    /// The `after` of the next page; null on the last page.
    pub next: Option<String>,
}

/// `GET /v1/admin/audit`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AuditBody)]
pub struct Audit {
    /// Every SKU's view, in `(tenant, sku)` order.
    pub skus: Vec<SkuSummary>,
    /// Sum over SKUs of `|drift| + |ledger_drift|`; 0 when healthy.
    pub drift_total: i64,
    /// SKUs with `stale: true`.
    pub stale_skus: usize,
}

/// A region that synced, in `GET /v1/admin/regions`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = RegionSyncBody)]
pub struct RegionSync {
    /// The region.
    pub region: String,
    /// Its agent's fencing epoch.
    pub epoch: i64,
    /// Its last stored report's sequence number.
    pub seq: i64,
    /// Its last measured round trip, ms.
    pub rtt_ms: i64,
    /// When it last synced.
    #[schema(value_type = String, format = DateTime)]
    pub last_sync_at: DateTime<Utc>,
    /// Age of the last sync, ms.
    pub sync_age_ms: i64,
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

    /// Where the page after `line` starts, as the admin API's `after`
    /// names it: the SKU within one tenant, `TENANT/SKU` across tenants.
    fn cursor(&self, line: &SkuLine) -> String {
        match self {
            Listing::Tenant { .. } => line.sku.clone(),
            Listing::All { .. } => format!("{}/{}", line.tenant, line.sku),
        }
    }
}

fn signed(units: i128, what: &str) -> Result<i64, StoreError> {
    i64::try_from(units).map_err(|_| StoreError::Corrupt(format!("{what} {units} out of range")))
}

fn summary_of(loaded: &Loaded, at: &ViewAt) -> Result<SkuSummary, StoreError> {
    let a = &loaded.allocation;
    let mut regions = BTreeMap::new();
    for (name, r) in loaded.names.iter().zip(&a.regions) {
        let last_report_at = r.reported_at_ms.map(timestamp).transpose()?;
        let report_age_ms = last_report_at.map(|t| (at.now - t).num_milliseconds().max(0));
        let region = RegionSummary {
            weight: r.weight,
            leased: r.leased,
            in_transit: r.in_transit(),
            available: r.report.available,
            held: r.report.held,
            sold: r.report.sold,
            sale_rate_per_s: r.report.sale_rate_per_s,
            recall_pending: r.recall_pending,
            last_report_at,
            report_age_ms,
            stale: report_is_stale(report_age_ms, at.stale_report_ms, r),
            region_drift: signed(
                i128::from(r.report.on_hand()) - i128::from(r.leased),
                "region drift",
            )?,
        };
        regions.insert(name.as_str().to_owned(), region);
    }
    let policy = at.policies.of(loaded.policy.as_ref());
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
        user_limit_scope: a.settings.user_limit_scope,
        policy: policy.name().to_owned(),
        settings: policy.settings(),
        policy_is_default: loaded.policy.is_none(),
        drift: signed(a.drift(), "drift")?,
        ledger_drift: signed(a.ledger_drift(), "ledger drift")?,
        stale: regions.values().any(|r| r.stale),
        regions,
    })
}

impl Store {
    /// One SKU with its regions.
    pub async fn sku(
        &self,
        tenant: &Tenant,
        sku: &Sku,
        at: &ViewAt<'_>,
    ) -> Result<SkuSummary, StoreError> {
        self.summaries(Some((tenant, sku)), at)
            .await?
            .pop()
            .ok_or(StoreError::UnknownSku)
    }

    /// Every SKU with its regions, from one consistent snapshot, and the
    /// sums that say whether all is well.
    pub async fn audit(&self, at: &ViewAt<'_>) -> Result<Audit, StoreError> {
        let skus = self.summaries(None, at).await?;
        let drift_total = skus
            .iter()
            .map(|s| s.drift.abs() + s.ledger_drift.abs())
            .sum();
        let stale_skus = skus.iter().filter(|s| s.stale).count();
        Ok(Audit {
            skus,
            drift_total,
            stale_skus,
        })
    }

    /// SKU summaries (all, or one) read in one snapshot, so pool,
    /// transfers and reports add up as they were at one instant.
    async fn summaries(
        &self,
        only: Option<(&Tenant, &Sku)>,
        at: &ViewAt<'_>,
    ) -> Result<Vec<SkuSummary>, StoreError> {
        let mut tx = self.db.snapshot().await?;
        let keys: Vec<(Tenant, Sku)> = match only {
            Some((tenant, sku)) => vec![(tenant.clone(), sku.clone())],
            None => sql("SELECT tenant, sku FROM skus ORDER BY tenant, sku")
                .fetch_all(&mut tx)
                .await?
                .iter()
                .map(|row| Ok((ident(row, "tenant")?, ident(row, "sku")?)))
                .collect::<Result<_, StoreError>>()?,
        };
        let mut out = Vec::with_capacity(keys.len());
        for (tenant, sku) in &keys {
            let loaded = load(&mut tx, tenant, sku, Lock::None)
                .await?
                .ok_or(StoreError::UnknownSku)?;
            out.push(summary_of(&loaded, at)?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// A page of at most `limit` SKUs of `listing`, in one query: the
    /// regions' reports and the grants in transit are summed per SKU by the
    /// database, so a page costs the same whatever its SKUs' regions.
    pub async fn list_skus(
        &self,
        listing: &Listing,
        limit: u32,
        policies: &Policies,
    ) -> Result<SkuPage, StoreError> {
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
        let skus: Vec<SkuLine> = rows
            .iter()
            .take(limit as usize)
            .map(|row| {
                let mode: String = row.try_get("mode")?;
                let choice = policy_of(row.try_get("policy")?, row.try_get("policy_settings")?)?;
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
                    policy: policies.of(choice.as_ref()).name().to_owned(),
                })
            })
            .collect::<Result<_, StoreError>>()?;
        let next = skus
            .last()
            .filter(|_| more)
            .map(|line| listing.cursor(line));
        Ok(SkuPage { skus, next })
    }

    /// Every region that ever synced, with its sync's age at `now`.
    pub async fn regions(&self, now: DateTime<Utc>) -> Result<Vec<RegionSync>, StoreError> {
        let mut tx = self.db.snapshot().await?;
        let rows =
            sql("SELECT region, epoch, seq, rtt_ms, last_sync_at FROM regions ORDER BY region")
                .fetch_all(&mut tx)
                .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| {
                let last_sync_at = r
                    .time("last_sync_at")?
                    .ok_or_else(|| StoreError::Corrupt("a region without last_sync_at".into()))?;
                Ok(RegionSync {
                    region: r.try_get("region")?,
                    epoch: r.try_get("epoch")?,
                    seq: r.try_get("seq")?,
                    rtt_ms: r.try_get("rtt_ms")?,
                    last_sync_at,
                    sync_age_ms: (now - last_sync_at).num_milliseconds().max(0),
                })
            })
            .collect()
    }
}
