//! The region API: agents sync, take, watch and relay borrowed places
//! here, each with its own token.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use escrow_core::protocol::{
    LimitsDown, LimitsUp, SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchRequest,
    WatchResponse,
};
use escrow_core::RegionName;

use super::bodies::OutcomeBody;
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
#[utoipa::path(
    post,
    path = "/v1/regions/{region}/sync",
    tag = "region",
    params(("region" = String, Path, description = "The region", example = json!("eu"), pattern = "^[a-z0-9-]{1,32}$", min_length = 1, max_length = 32)),
    request_body = SyncRequest,
    responses(
        (status = 200, description = "Applied SKU by SKU, each in its own transaction: acks, returns, each report newer than the SKU's stored one, a rebalance", body = SyncResponse),
        (status = 400, description = "`BAD_REQUEST`: bad region name or body", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: no token, or a token nobody has", body = OutcomeBody),
        (status = 403, description = "`FORBIDDEN`: another region's token", body = OutcomeBody),
        (status = 409, description = "`FENCED`: an older agent process; nothing applied", body = OutcomeBody),
        (status = 500, description = "`INTERNAL`: a row that cannot be right; details logged only", body = OutcomeBody),
        (status = 503, description = "`OVERLOADED`: too many requests in flight, or the request ran too long; nothing committed but the SKUs it finished, each whole; `UNAVAILABLE`: the database cannot be reached (no primary, failing over), nothing known committed beyond what the request's ids make safe to retry", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
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
#[utoipa::path(
    post,
    path = "/v1/regions/{region}/take",
    tag = "region",
    params(("region" = String, Path, description = "The region", example = json!("eu"), pattern = "^[a-z0-9-]{1,32}$", min_length = 1, max_length = 32)),
    request_body = TakeRequest,
    responses(
        (status = 200, description = "A grant of up to `units` from the pool, or none", body = TakeResponse),
        (status = 400, description = "`BAD_REQUEST`: bad region name or body", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: no token, or a token nobody has", body = OutcomeBody),
        (status = 403, description = "`FORBIDDEN`: another region's token", body = OutcomeBody),
        (status = 404, description = "`UNKNOWN_SKU`: no such SKU, or the region has no part in it", body = OutcomeBody),
        (status = 500, description = "`INTERNAL`: a row that cannot be right; details logged only", body = OutcomeBody),
        (status = 503, description = "`OVERLOADED`: too many requests in flight, or the request ran too long; nothing committed; `UNAVAILABLE`: the database cannot be reached (no primary, failing over), nothing known committed beyond what the request's ids make safe to retry", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
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

/// `POST /v1/regions/{region}/limits`: a region's borrows and loans of the
/// per-user limit across regions, relayed at once rather than with its
/// next sync (which carries them again).
#[utoipa::path(
    post,
    path = "/v1/regions/{region}/limits",
    tag = "region",
    params(("region" = String, Path, description = "The region", example = json!("eu"), pattern = "^[a-z0-9-]{1,32}$", min_length = 1, max_length = 32)),
    request_body = LimitsUp,
    responses(
        (status = 200, description = "Applied in one transaction: the home's answers to the asks that have one, the returns that are complete, and the loans asked of or asked back from this region as a home", body = LimitsDown),
        (status = 400, description = "`BAD_REQUEST`: bad region name or body", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: no token, or a token nobody has", body = OutcomeBody),
        (status = 403, description = "`FORBIDDEN`: another region's token", body = OutcomeBody),
        (status = 500, description = "`INTERNAL`: a row that cannot be right; details logged only", body = OutcomeBody),
        (status = 503, description = "`OVERLOADED`: too many requests in flight; `UNAVAILABLE`: the database cannot be reached (no primary, failing over); every id is safe to send again", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
pub async fn limits(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(region): Path<String>,
    body: Result<Json<LimitsUp>, JsonRejection>,
) -> Result<Json<LimitsDown>, ApiError> {
    let region = authorise(&state, &headers, &region)?;
    let Json(up) = body?;
    Ok(Json(state.store().relay_limits(&region, &up).await?))
}

/// `POST /v1/regions/{region}/watch`: held open until the coordinator has
/// news for the region or the bounded wait passes, answered with the
/// news's directives and pending grants; the agent then syncs.
#[utoipa::path(
    post,
    path = "/v1/regions/{region}/watch",
    tag = "region",
    params(("region" = String, Path, description = "The region", example = json!("eu"), pattern = "^[a-z0-9-]{1,32}$", min_length = 1, max_length = 32)),
    request_body = WatchRequest,
    responses(
        (status = 200, description = "The region's notice number, once it differs from `seen` or the wait passed; with news, the directives of the SKUs concerned and their grants pending to the region", body = WatchResponse),
        (status = 500, description = "`INTERNAL`: a row that cannot be right; details logged only", body = OutcomeBody),
        (status = 400, description = "`BAD_REQUEST`: bad region name or body", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: no token, or a token nobody has", body = OutcomeBody),
        (status = 403, description = "`FORBIDDEN`: another region's token", body = OutcomeBody),
        (status = 503, description = "`OVERLOADED`: too many requests in flight; `UNAVAILABLE`: the database cannot be reached (no primary, failing over)", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
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
    let (grants, skus) = if notice == req.seen {
        (Vec::new(), Vec::new())
    } else {
        state.store().watch_news(&region, req.epoch).await?
    };
    let limits = state.store().notices().take_limits(&region);
    Ok(Json(WatchResponse {
        notice,
        grants,
        skus,
        limits,
    }))
}
