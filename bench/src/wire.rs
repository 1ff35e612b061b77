//! The buyer API's JSON as the baseline servers speak it.
//!
//! The naive server and the HTTP ceiling take the same request body as the
//! agent (unknown fields refused, identifiers validated with escrow-core)
//! and answer a new hold with the same shape of body, so the comparison is
//! of storage strategies, not of payload sizes.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use escrow_core::{Qty, RequestKey, Sku, TtlMs, UserId};
use serde::{Deserialize, Serialize};

/// `POST /v1/reservations` body, as the agent reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    /// The buyer's idempotency key.
    pub request_key: String,
    /// The buyer.
    pub user_id: String,
    /// The SKU asked for.
    pub sku: String,
    /// Units, default 1.
    pub qty: Option<i64>,
    /// Hold duration asked for.
    pub ttl_ms: Option<i64>,
}

/// `PUT /v1/admin/skus/{tenant}/{sku}` body (only the total matters here).
#[derive(Debug, Deserialize)]
pub struct PutSkuBody {
    /// Units on sale.
    pub total: i64,
}

/// A validated reserve request.
#[derive(Debug)]
pub struct Reserve {
    /// The buyer's idempotency key.
    pub request_key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// The SKU asked for.
    pub sku: Sku,
    /// Units asked for.
    pub qty: Qty,
    /// Hold duration.
    pub ttl_ms: u64,
}

/// Hold duration when the request names none (the contract's default).
pub const HOLD_TTL_MS_DEFAULT: u64 = 600_000;
/// Units one buyer may take at once in the baselines (the contract's default).
pub const MAX_PER_USER: u32 = 1;

impl ReserveBody {
    /// Validates the body as the agent does; the error names the bad field.
    pub fn validate(self) -> Result<Reserve, String> {
        let request_key = RequestKey::parse(&self.request_key).map_err(|e| e.to_string())?;
        let user_id = UserId::parse(&self.user_id).map_err(|e| e.to_string())?;
        let sku = Sku::parse(&self.sku).map_err(|e| e.to_string())?;
        let qty = Qty::parse(self.qty.unwrap_or(1), MAX_PER_USER).map_err(|e| e.to_string())?;
        let ttl_ms = match self.ttl_ms {
            Some(raw) => TtlMs::parse(raw).map_err(|e| e.to_string())?.get(),
            None => HOLD_TTL_MS_DEFAULT,
        };
        Ok(Reserve {
            request_key,
            user_id,
            sku,
            qty,
            ttl_ms,
        })
    }
}

/// The contract's reservation body R.
#[derive(Debug, Serialize)]
pub struct ReservationOut<'a> {
    /// The buyer's key.
    pub request_key: &'a str,
    /// The buyer.
    pub user_id: &'a str,
    /// The SKU.
    pub sku: &'a str,
    /// Units held.
    pub qty: u32,
    /// Always `HELD` here.
    pub status: &'static str,
    /// RFC 3339.
    pub expires_at: String,
    /// The region answering.
    pub region: &'static str,
}

#[derive(Debug, Serialize)]
struct HeldOut<'a> {
    outcome: &'static str,
    reservation: ReservationOut<'a>,
}

/// The region the baselines claim to be, so bodies match the agent's.
pub const REGION: &str = "eu";

/// 201 `{"outcome":"HELD","reservation":R}` for a new hold.
pub fn held(reserve: &Reserve, now_ms: u64) -> Response {
    let expires_at = chrono::DateTime::from_timestamp_millis((now_ms + reserve.ttl_ms) as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    let body = HeldOut {
        outcome: "HELD",
        reservation: ReservationOut {
            request_key: reserve.request_key.as_str(),
            user_id: reserve.user_id.as_str(),
            sku: reserve.sku.as_str(),
            qty: reserve.qty.get(),
            status: "HELD",
            expires_at,
            region: REGION,
        },
    };
    (StatusCode::CREATED, Json(body)).into_response()
}

/// `{"outcome": outcome}` with `status`.
pub fn outcome(status: StatusCode, outcome: &'static str) -> Response {
    #[derive(Serialize)]
    struct Out {
        outcome: &'static str,
    }
    (status, Json(Out { outcome })).into_response()
}

/// 400 naming what is wrong.
pub fn bad_request(error: String) -> Response {
    #[derive(Serialize)]
    struct Out {
        outcome: &'static str,
        error: String,
    }
    (
        StatusCode::BAD_REQUEST,
        Json(Out {
            outcome: "BAD_REQUEST",
            error,
        }),
    )
        .into_response()
}

/// Whether the request carries `Authorization: Bearer <token>`.
pub fn has_bearer(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|t| t == token.as_bytes())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
