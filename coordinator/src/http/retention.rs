//! `POST /v1/admin/prune`: the coordinator's retention, a batch at a time
//! (each its own short transaction, so syncs and takes go on meanwhile).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::admin::admin_only;
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneBody {
    /// Delete what ended more than this many seconds ago.
    older_than_s: u64,
}

/// Prunes delivered grants and admin idempotency keys older than
/// `older_than_s`; answers how many.
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
    Ok(Json(json!({"grants": grants, "admin_keys": admin_keys})).into_response())
}
