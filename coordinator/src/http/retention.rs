//! `POST /v1/admin/prune`: the coordinator's retention, a batch at a time
//! (each its own short transaction, so syncs and takes go on meanwhile).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::admin::admin_only;
use super::bodies::OutcomeBody;
use super::error::ApiError;
use crate::AppState;

/// Shortest window a prune accepts, s: every call between agent and
/// coordinator times out within seconds, so no take is retried and no
/// grant delivered this long after.
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
    /// Grants delivered before the window.
    pub grants: u64,
    /// Admin idempotency keys recorded before the window.
    pub admin_keys: u64,
}

/// Prunes delivered grants and admin idempotency keys older than
/// `older_than_s`; answers how many.
#[utoipa::path(
    post,
    path = "/v1/admin/prune",
    tag = "admin",
    request_body = PruneBody,
    responses(
        (status = 200, description = "What was deleted: grants delivered and admin idempotency keys recorded before the window; applied returns stay", body = PrunedBody),
        (status = 400, description = "`BAD_REQUEST`: bad body, or a window out of range", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: missing or wrong admin token", body = OutcomeBody),
        (status = 500, description = "`INTERNAL`: database failure; details logged only", body = OutcomeBody),
        (status = 503, description = "`OVERLOADED`: too many requests in flight, or the request ran too long; what was deleted stays deleted", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
pub async fn prune(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<PruneBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let Json(body) = body?;
    if !(WINDOW_MIN_S..=WINDOW_MAX_S).contains(&body.older_than_s) {
        return Err(ApiError::BadRequest(format!(
            "older_than_s must be in {WINDOW_MIN_S}..={WINDOW_MAX_S}"
        )));
    }
    // In range, so the cast and the subtraction cannot fail.
    let before = chrono::Utc::now() - chrono::Duration::seconds(body.older_than_s as i64);
    let (mut grants, mut admin_keys) = (0u64, 0u64);
    loop {
        let pruned = state.store().prune(before, PRUNE_BATCH).await?;
        grants += pruned.grants;
        admin_keys += pruned.admin_keys;
        if pruned.grants < u64::from(PRUNE_BATCH) && pruned.admin_keys < u64::from(PRUNE_BATCH) {
            break;
        }
    }
    Ok(Json(PrunedBody { grants, admin_keys }).into_response())
}
