//! The region API: agents sync and take here, each with its own token.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use escrow_core::protocol::{
    SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchRequest, WatchResponse,
};
use escrow_core::RegionName;

use super::error::ApiError;
use crate::auth::RegionAccess;
use crate::AppState;

fn authorise(state: &AppState, headers: &HeaderMap, region: &str) -> Result<RegionName, ApiError> {
    let region = RegionName::parse(region).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    match state.auth().region(headers, &region) {
        RegionAccess::Granted => Ok(region),
        RegionAccess::Forbidden => Err(ApiError::Forbidden),
        RegionAccess::Unauthenticated => Err(ApiError::Unauthorized),
    }
}

/// `POST /v1/regions/{region}/sync`.
pub async fn sync(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(region): Path<String>,
    body: Result<Json<SyncRequest>, JsonRejection>,
) -> Result<Json<SyncResponse>, ApiError> {
    let region = authorise(&state, &headers, &region)?;
    let Json(req) = body?;
    Ok(Json(
        state.store().sync(&region, &req, state.policies()).await?,
    ))
}

/// `POST /v1/regions/{region}/take`.
pub async fn take(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(region): Path<String>,
    body: Result<Json<TakeRequest>, JsonRejection>,
) -> Result<Json<TakeResponse>, ApiError> {
    let region = authorise(&state, &headers, &region)?;
    let Json(req) = body?;
    Ok(Json(
        state.store().take(&region, &req, state.policies()).await?,
    ))
}

/// `POST /v1/regions/{region}/watch`: held open until the coordinator has
/// news for the region or the bounded wait passes; the agent then syncs.
pub async fn watch(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(region): Path<String>,
    body: Result<Json<WatchRequest>, JsonRejection>,
) -> Result<Json<WatchResponse>, ApiError> {
    let region = authorise(&state, &headers, &region)?;
    let Json(req) = body?;
    let notice = state
        .store()
        .notices()
        .wait(&region, req.seen, req.wait_ms)
        .await;
    Ok(Json(WatchResponse { notice }))
}
