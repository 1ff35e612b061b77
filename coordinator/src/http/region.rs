//! The region API: agents sync and take here, each with its own token.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use escrow_core::protocol::{SyncRequest, SyncResponse, TakeRequest, TakeResponse};
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
        state.store().sync(&region, &req, state.policy()).await?,
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
        state.store().take(&region, &req, state.policy()).await?,
    ))
}
