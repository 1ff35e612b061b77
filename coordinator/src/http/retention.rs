//! `POST /v1/admin/prune`: the coordinator's retention, a batch at a time
//! (each its own short transaction, so syncs and takes go on meanwhile).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use service_kit::retention::{in_batches, PruneBody, PRUNE_BATCH};
use utoipa::ToSchema;

use super::admin::admin_only;
use super::bodies::OutcomeBody;
use super::error::ApiError;
use super::failures::AdminFailures;
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
        AdminFailures,
        // After AdminFailures, so that this 503 replaces its: a prune cut
        // short keeps the batches it committed.
        (status = 503, description = "`OVERLOADED`: too many requests in flight, or the request ran too long; what was deleted stays deleted; `UNAVAILABLE`: the database cannot be reached (no primary, failing over)", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
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
    let store = state.store();
    let [grants, admin_keys] = in_batches(|| async {
        let pruned = store.prune(before, PRUNE_BATCH).await?;
        Ok::<_, ApiError>([pruned.grants, pruned.admin_keys])
    })
    .await?;
    Ok(Json(PrunedBody { grants, admin_keys }).into_response())
}
