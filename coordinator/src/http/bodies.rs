//! The JSON bodies the coordinator answers with, as types: the handlers
//! serialize these, and the OpenAPI document (`http::openapi`) derives its
//! schemas from the same types, so the published schema is what is sent.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use escrow_core::Mode;
use serde::Serialize;
use utoipa::ToSchema;

/// Every `outcome` an error answer of the coordinator can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// Malformed input; nothing written (400).
    BadRequest,
    /// Missing or unknown credentials (401).
    Unauthorized,
    /// Another region's token (403).
    Forbidden,
    /// No such SKU, or the region has no part in it (404).
    UnknownSku,
    /// The change conflicts with units leased, held or sold, or an
    /// idempotency key was used for another change (409).
    Conflict,
    /// An older agent process of a region that has a newer one (409).
    Fenced,
    /// Too many requests in flight, or one ran too long; nothing committed (503).
    Overloaded,
    /// A failure inside the coordinator, logged only (500).
    Internal,
}

/// An error answer, with what is wrong for `BAD_REQUEST` and `CONFLICT`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutcomeBody {
    /// What happened.
    pub outcome: Outcome,
    /// What is wrong (`BAD_REQUEST`, `CONFLICT` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One region of a SKU, in the SKU view.
#[derive(Debug, Serialize, ToSchema)]
pub struct RegionView {
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
#[derive(Debug, Serialize, ToSchema)]
pub struct SkuViewBody {
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
    pub regions: BTreeMap<String, RegionView>,
}

/// One SKU's line in a listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct SkuLineBody {
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
#[derive(Debug, Serialize, ToSchema)]
pub struct SkuPage {
    /// The page's SKUs, in order.
    pub skus: Vec<SkuLineBody>,
    /// The `after` of the next page; null on the last page.
    pub next: Option<String>,
}

/// `GET /v1/admin/audit`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditBody {
    /// Every SKU's view, in `(tenant, sku)` order.
    pub skus: Vec<SkuViewBody>,
    /// Sum over SKUs of `|drift| + |ledger_drift|`; 0 when healthy.
    pub drift_total: i64,
    /// SKUs with `stale: true`.
    pub stale_skus: usize,
}

/// A region that synced, in `GET /v1/admin/regions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RegionSyncBody {
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

/// `GET /v1/admin/regions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RegionsBody {
    /// Every region that ever synced.
    pub regions: Vec<RegionSyncBody>,
}
