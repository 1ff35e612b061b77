//! The JSON bodies the agent answers with, as types: the handlers serialize
//! these, and the OpenAPI document (`http::openapi`) derives its schemas
//! from the same types, so the published schema is what is sent.

use std::collections::BTreeMap;

use escrow_core::owner::PauseReason;
use escrow_core::{Qty, RequestKey, Reservation, Sku, Status, UserId};
use serde::Serialize;
use utoipa::ToSchema;

/// Every `outcome` an answer of the agent can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// A new hold (201).
    Held,
    /// The key exists with the same user, SKU and qty: its current state (200).
    Replay,
    /// Too few units anywhere; nothing written (409).
    SoldOut,
    /// The user already holds or bought this SKU; nothing written (409).
    UserLimit,
    /// The key exists for another user, SKU or qty (422).
    KeyReused,
    /// No such SKU for this tenant (404).
    UnknownSku,
    /// Paused, halted, or the coordinator could not be asked (503).
    Paused,
    /// The owner's queue or the process-wide limit is full; nothing written (503).
    RejectedQueueFull,
    /// Waited too long in the queue; nothing written (503).
    RejectedWaitTimeout,
    /// Malformed input; nothing written (400).
    BadRequest,
    /// Missing or wrong credentials (401).
    Unauthorized,
    /// A change that conflicts with the SKU's state or the agent's mode (409).
    Conflict,
    /// A failure inside the agent, logged only (500).
    Internal,
}

/// An answer naming only an outcome, with what is wrong for `BAD_REQUEST`
/// and `CONFLICT`, and why for `PAUSED`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutcomeBody {
    /// What happened.
    pub outcome: Outcome,
    /// What is wrong (`BAD_REQUEST`, `CONFLICT` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the SKU cannot sell or be written now (`PAUSED` only, always
    /// there): `admin_pause` (paused by an admin), `halted` (the agent
    /// stopped the SKU: drift, fencing, a reload pending), `coordinator_unreachable`
    /// (the coordinator could not be asked) or `storage` (a commit or read
    /// of the database failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<PauseReason>,
}

impl OutcomeBody {
    /// An outcome without detail.
    pub fn of(outcome: Outcome) -> Self {
        Self {
            outcome,
            error: None,
            reason: None,
        }
    }

    /// `PAUSED`, for `reason`.
    pub fn paused(reason: PauseReason) -> Self {
        Self {
            outcome: Outcome::Paused,
            error: None,
            reason: Some(reason),
        }
    }
}

/// The status word of the 404 of a reservation lookup or action.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NotFoundStatus {
    /// No committed reservation has this key for this tenant now.
    NotFound,
}

/// `{"status":"NOT_FOUND"}`: no committed reservation now (never "failed").
#[derive(Debug, Serialize, ToSchema)]
pub struct NotFoundBody {
    /// Always `NOT_FOUND`.
    pub status: NotFoundStatus,
}

/// The contract's reservation body R.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReservationBody {
    /// The idempotency key that created it.
    #[schema(value_type = String)]
    pub request_key: RequestKey,
    /// The buyer.
    #[schema(value_type = String)]
    pub user_id: UserId,
    /// The SKU.
    #[schema(value_type = String)]
    pub sku: Sku,
    /// Units reserved.
    #[schema(value_type = u32, minimum = 1)]
    pub qty: Qty,
    /// `HELD`, `SOLD`, `RELEASED` or `EXPIRED`.
    pub status: Status,
    /// When a HELD reservation stops being confirmable (RFC 3339, UTC, ms).
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// The agent's region.
    pub region: String,
}

impl ReservationBody {
    /// R of `r`, sold in `region`.
    pub fn new(r: &Reservation, region: &str) -> Self {
        // expires_at_ms is a clock reading plus at most an hour: far inside
        // chrono's range, so the fallback is never taken.
        let expires_at = i64::try_from(r.expires_at_ms)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_millis)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        Self {
            request_key: r.request_key.clone(),
            user_id: r.user_id.clone(),
            sku: r.sku.clone(),
            qty: r.qty,
            status: r.status,
            expires_at: expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            region: region.to_owned(),
        }
    }
}

/// The answer to a new reservation: `HELD` (201) or `REPLAY` (200) with R.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReservationOutcome {
    /// `HELD` or `REPLAY`.
    pub outcome: Outcome,
    /// The reservation as committed.
    pub reservation: ReservationBody,
}

/// `GET /v1/skus/{sku}`: this region's units, from memory.
#[derive(Debug, Serialize, ToSchema)]
pub struct SkuStatusBody {
    /// The SKU.
    #[schema(value_type = String)]
    pub sku: Sku,
    /// Units this region may hold now.
    pub available: u64,
    /// No unit is available anywhere (held units may still come back).
    pub sold_out: bool,
}

/// The one region of a standalone agent's SKU view.
#[derive(Debug, Serialize, ToSchema)]
pub struct RegionView {
    /// The region's quota (the SKU's total, standalone).
    pub leased: u64,
    /// Units that may be held now.
    pub available: u64,
    /// Units held.
    pub held: u64,
    /// Units sold.
    pub sold: u64,
    /// The time of the answer.
    #[schema(value_type = String, format = DateTime)]
    pub last_report_at: chrono::DateTime<chrono::Utc>,
    /// Always 0 here.
    pub report_age_ms: u64,
}

/// The agent's admin view of one SKU, read from memory.
#[derive(Debug, Serialize, ToSchema)]
pub struct SkuViewBody {
    /// The SKU's tenant.
    pub tenant: String,
    /// The SKU.
    pub sku: String,
    /// The agent's region.
    pub region: String,
    /// `received - returned`: this region's quota.
    pub total: u64,
    /// Always 0 on an agent.
    pub pool: u64,
    /// Always 0 on an agent.
    pub in_transit: u64,
    /// Units that may be held now.
    pub available: u64,
    /// Units held.
    pub held: u64,
    /// Units sold.
    pub sold: u64,
    /// Paused by an admin (or the coordinator's directive).
    pub paused: bool,
    /// Stopped by the agent itself (fenced, drift, a failed commit).
    pub halted: bool,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold duration.
    pub hold_ttl_ms: u64,
    /// The per-user limit's scope, `region` or `global` (one region here:
    /// the same).
    #[schema(value_type = String, example = "region")]
    pub user_limit_scope: escrow_core::UserLimitScope,
    /// The one region, by name.
    pub regions: BTreeMap<String, RegionView>,
}

/// The one region of a SKU in the agent's audit.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditRegion {
    /// Stored counter.
    pub available: i64,
    /// Stored counter.
    pub held: i64,
    /// Stored counter.
    pub sold: i64,
    /// Always 0 here.
    pub report_age_ms: u64,
}

/// One SKU in the agent's audit.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditSku {
    /// The SKU's tenant.
    pub tenant: String,
    /// The SKU.
    pub sku: String,
    /// `received - returned`.
    pub total: i64,
    /// Always 0 on an agent.
    pub pool: i64,
    /// Always 0 on an agent.
    pub in_transit: i64,
    /// Stored counter.
    pub available: i64,
    /// Stored counter.
    pub held: i64,
    /// Stored counter.
    pub sold: i64,
    /// `available + held + sold - total`; 0 unless something is broken.
    pub drift: i64,
    /// `|rows held - held| + |rows sold - sold|`.
    pub rows_drift: i64,
    /// The one region, by name.
    pub regions: BTreeMap<String, AuditRegion>,
}

/// `GET /v1/admin/audit` of the agent.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditBody {
    /// Every SKU.
    pub skus: Vec<AuditSku>,
    /// Sum over SKUs of `|drift| + rows_drift`; 0 when healthy.
    pub drift_total: i64,
}

/// One item of the contract's cart body C.
#[derive(Debug, Serialize, ToSchema)]
pub struct CartItemBody {
    /// The SKU.
    #[schema(value_type = String)]
    pub sku: Sku,
    /// Its units.
    #[schema(value_type = u32, minimum = 1)]
    pub qty: Qty,
}

/// The contract's cart body C: one status and expiry for every item.
#[derive(Debug, Serialize, ToSchema)]
pub struct CartBody {
    /// The idempotency key that created it.
    #[schema(value_type = String)]
    pub request_key: RequestKey,
    /// The buyer.
    #[schema(value_type = String)]
    pub user_id: UserId,
    /// `HELD`, `SOLD`, `RELEASED` or `EXPIRED`, the same for every item.
    pub status: Status,
    /// When a HELD cart stops being confirmable (RFC 3339, UTC, ms).
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// The agent's region.
    pub region: String,
    /// Its items, in SKU order.
    pub items: Vec<CartItemBody>,
}

impl CartBody {
    /// C of `cart`, held in `region`.
    pub fn new(cart: &escrow_core::cart::Cart, region: &str) -> Self {
        // As for a reservation: a clock reading plus at most an hour.
        let expires_at = i64::try_from(cart.lifecycle.expires_at_ms)
            .ok()
            .and_then(chrono::DateTime::from_timestamp_millis)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        Self {
            request_key: cart.request_key.clone(),
            user_id: cart.user_id.clone(),
            status: cart.lifecycle.status,
            expires_at: expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            region: region.to_owned(),
            items: cart
                .items
                .iter()
                .map(|item| CartItemBody {
                    sku: item.sku.clone(),
                    qty: item.qty,
                })
                .collect(),
        }
    }
}

/// The answer to a new cart: `HELD` (201) or `REPLAY` (200) with C.
#[derive(Debug, Serialize, ToSchema)]
pub struct CartOutcome {
    /// `HELD` or `REPLAY`.
    pub outcome: Outcome,
    /// The cart as committed.
    pub cart: CartBody,
}

/// A cart refused because of one item: `SOLD_OUT` or `USER_LIMIT` (409),
/// `UNKNOWN_SKU` (404), naming the item's SKU; nothing held.
#[derive(Debug, Serialize, ToSchema)]
pub struct CartRefusal {
    /// What happened.
    pub outcome: Outcome,
    /// The item that could not be held.
    #[schema(value_type = String)]
    pub sku: Sku,
}
