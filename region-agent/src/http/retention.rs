//! `POST /v1/admin/prune`: the agent's retention. Released and expired
//! reservations and carts, and confirmed grants older than a window leave the
//! database, a batch at a time (each its own short transaction, so selling
//! goes on meanwhile), and the pruned keys leave memory.

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
use super::failures::AdminReadFailures;
use super::json::JsonBody;
use crate::state::AppState;

/// What a prune deleted.
#[derive(Debug, Serialize, ToSchema)]
pub struct PrunedBody {
    /// Released and expired reservations whose hold ended before the window.
    pub reservations: u64,
    /// Confirmed grants credited before the window.
    pub grants: u64,
    /// Released and expired carts whose hold ended before the window
    /// (their items are among `reservations`).
    pub carts: u64,
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
        (status = 500, description = "`INTERNAL`: database failure; details logged only", body = OutcomeBody),
        AdminReadFailures,
    ),
    security(("bearer" = []))
)]
pub async fn prune(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<PruneBody>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let before_ms = body.cut_ms(state.now_ms()).map_err(ApiError::BadRequest)?;
    let state = &state;
    let [reservations, grants, carts] = in_batches(|| async move {
        let pruned = state.store().prune(before_ms, PRUNE_BATCH).await?;
        for (tenant, key) in &pruned.reservations {
            state.keys().remove(tenant, key);
        }
        Ok::<_, ApiError>([
            pruned.reservations.len() as u64,
            pruned.grants,
            pruned.carts,
        ])
    })
    .await?;
    if reservations > 0 {
        state.keys().shrink();
    }
    metrics::counter!("escrow_pruned_total", "what" => "reservations").increment(reservations);
    metrics::counter!("escrow_pruned_total", "what" => "grants").increment(grants);
    metrics::counter!("escrow_pruned_total", "what" => "carts").increment(carts);
    Ok(Json(PrunedBody {
        reservations,
        grants,
        carts,
    })
    .into_response())
}
