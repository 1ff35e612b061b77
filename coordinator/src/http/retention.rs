//! `POST /v1/admin/prune`: the coordinator's retention, a batch at a time
//! (each its own short transaction, so syncs and takes go on meanwhile).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use service_kit::retention::{PruneBody, PRUNE_BATCH};
use utoipa::ToSchema;

use super::admin::admin_only;
use super::bodies::OutcomeBody;
use super::error::ApiError;
use crate::AppState;

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
    let now_ms = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
    let cut_ms = body.cut_ms(now_ms).map_err(ApiError::BadRequest)?;
    let before = chrono::DateTime::from_timestamp_millis(i64::try_from(cut_ms).unwrap_or(0))
        .unwrap_or_default();
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
