//! `POST /v1/admin/prune`: the agent's retention. Released and expired
//! reservations and confirmed grants older than a window leave the
//! database, a batch at a time (each its own short transaction, so selling
//! goes on meanwhile), and the pruned keys leave memory.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::bodies::OutcomeBody;
use super::error::ApiError;
use super::json::JsonBody;
use crate::state::AppState;

/// Shortest window a prune accepts, s: no message between agent and
/// coordinator lives this long (every call times out within seconds), so
/// nothing pruned can still be delivered or retried.
pub const WINDOW_MIN_S: u64 = 60;

/// Longest window a prune accepts, s (ten years).
pub const WINDOW_MAX_S: u64 = 315_360_000;

/// Rows a prune deletes per transaction.
pub const PRUNE_BATCH: u32 = 1_000;

/// `POST /v1/admin/prune` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneBody {
    /// Delete what ended more than this many seconds ago, 60..=315,360,000.
    #[schema(minimum = 60, maximum = 315_360_000)]
    older_than_s: u64,
}

/// What a prune deleted.
#[derive(Debug, Serialize, ToSchema)]
pub struct PrunedBody {
    /// Released and expired reservations whose hold ended before the window.
    pub reservations: u64,
    /// Confirmed grants credited before the window.
    pub grants: u64,
}

/// Prunes what ended more than `older_than_s` ago; answers how much.
#[utoipa::path(
    post,
    path = "/v1/admin/prune",
    tag = "admin",
    request_body = PruneBody,
    responses(
        (status = 200, description = "What was deleted: released and expired reservations whose hold ended before the window (their keys are unknown afterwards) and confirmed grants credited before it; SOLD and HELD reservations stay", body = PrunedBody),
        (status = 400, description = "`BAD_REQUEST`: bad body, or a window out of range", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: missing or wrong admin token", body = OutcomeBody),
        (status = 500, description = "`INTERNAL`: database failure; details logged only", body = OutcomeBody),
        (status = 503, description = "`REJECTED_QUEUE_FULL`: the process-wide limit of requests in flight is reached", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
pub async fn prune(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<PruneBody>,
) -> Result<Response, ApiError> {
    if !state.auth().is_admin(&headers) {
        return Err(ApiError::Unauthorized);
    }
    if !(WINDOW_MIN_S..=WINDOW_MAX_S).contains(&body.older_than_s) {
        return Err(ApiError::BadRequest(format!(
            "older_than_s must be in {WINDOW_MIN_S}..={WINDOW_MAX_S}"
        )));
    }
    let before_ms = state.now_ms().saturating_sub(body.older_than_s * 1_000);
    let (mut reservations, mut grants) = (0u64, 0u64);
    loop {
        let pruned = state.store().prune(before_ms, PRUNE_BATCH).await?;
        let deleted = pruned.reservations.len() as u64;
        for (tenant, key) in &pruned.reservations {
            state.keys().remove(tenant, key);
        }
        reservations += deleted;
        grants += pruned.grants;
        if deleted < u64::from(PRUNE_BATCH) && pruned.grants < u64::from(PRUNE_BATCH) {
            break;
        }
    }
    if reservations > 0 {
        state.keys().shrink();
    }
    metrics::counter!("escrow_pruned_total", "what" => "reservations").increment(reservations);
    metrics::counter!("escrow_pruned_total", "what" => "grants").increment(grants);
    Ok(Json(PrunedBody {
        reservations,
        grants,
    })
    .into_response())
}
