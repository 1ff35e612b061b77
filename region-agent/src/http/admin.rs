//! The standalone agent's admin API: create and change SKUs, add stock,
//! pause and resume, inspect, audit. Every counter change goes through the
//! SKU's owner so the counters keep a single writer.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use escrow_core::{SkuSettings, UserLimitScope};
use serde::Deserialize;
use service_kit::sku_admin::{units, AddStockBody, SkuPath};
use tokio::sync::oneshot;
use utoipa::ToSchema;

use super::bodies::{AuditBody, AuditRegion, AuditSku, OutcomeBody, RegionView, SkuViewBody};
use super::error::ApiError;
use super::failures::{AdminChangeFailures, AdminReadFailures, SkuChangeFailures};
use super::json::JsonBody;
use crate::owner::{AdminChange, AdminReply, Command, OwnerHandle, PauseReason};
use crate::state::AppState;

/// `PUT /v1/admin/skus/{tenant}/{sku}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSkuBody {
    /// The SKU's total, 0..=10^12.
    #[schema(minimum = 0, maximum = 1_000_000_000_000_i64)]
    total: i64,
    /// Must be absent or null: a standalone agent sells one region.
    #[schema(value_type = Option<Object>)]
    regions: Option<serde_json::Value>,
    /// Units per reservation at most, 1..=1000; absent keeps the current value (default 1).
    #[schema(minimum = 1, maximum = 1000)]
    max_per_user: Option<i64>,
    /// Default hold duration; absent keeps the current value (default 600000).
    #[schema(minimum = 1000, maximum = 3_600_000)]
    hold_ttl_ms: Option<i64>,
    /// `region` or `global`: the same on a standalone agent, which sells
    /// one region; absent keeps the current value (default `region`).
    #[schema(example = "region")]
    user_limit_scope: Option<String>,
}

fn bad(e: impl ToString) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

/// Admin routes answer only the admin token.
pub(super) fn admin_only(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if state.auth().is_admin(headers) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

/// Changes to stock and settings belong to the coordinator when there is
/// one: units created here would exist nowhere in its ledger.
fn standalone_only(state: &AppState) -> Result<(), ApiError> {
    match state.link() {
        None => Ok(()),
        Some(_) => Err(ApiError::Conflict(
            "this agent is managed by a coordinator; change the SKU there".into(),
        )),
    }
}

fn sku_json(state: &AppState, handle: &OwnerHandle) -> Json<SkuViewBody> {
    let s = handle.view.snapshot();
    let region = RegionView {
        leased: s.quota,
        available: s.available,
        held: s.held,
        sold: s.sold,
        last_report_at: chrono::Utc::now(),
        report_age_ms: 0,
    };
    Json(SkuViewBody {
        tenant: handle.view.tenant.to_string(),
        sku: handle.view.sku.to_string(),
        region: state.region().to_string(),
        total: s.quota,
        pool: 0,
        in_transit: 0,
        available: s.available,
        held: s.held,
        sold: s.sold,
        paused: s.paused,
        halted: s.halted,
        max_per_user: s.max_per_user,
        hold_ttl_ms: s.hold_ttl_ms,
        user_limit_scope: handle.view.settings().user_limit_scope,
        regions: BTreeMap::from([(state.region().to_string(), region)]),
    })
}

async fn change(handle: &OwnerHandle, change: AdminChange) -> Result<(), ApiError> {
    let (tx, rx) = oneshot::channel();
    // Admin changes wait for queue space rather than being shed.
    handle
        .queue
        .send(Command::Admin(change, tx))
        .await
        .map_err(|_| ApiError::Paused(PauseReason::Halted))?;
    match rx
        .await
        .map_err(|_| ApiError::Paused(PauseReason::Halted))?
    {
        AdminReply::Done => Ok(()),
        AdminReply::Paused(reason) => Err(ApiError::Paused(reason)),
        AdminReply::BelowCommitted { committed } => Err(ApiError::Conflict(format!(
            "total may not go below the {committed} units held or sold"
        ))),
    }
}

/// `PUT /v1/admin/skus/{tenant}/{sku}`: create, or change total and settings.
#[utoipa::path(
    put,
    path = "/v1/admin/skus/{tenant}/{sku}",
    tag = "admin",
    params(SkuPath),
    request_body = PutSkuBody,
    responses(
        (status = 201, description = "Created: the SKU view", body = SkuViewBody, links(("GetSku" = (operation_id = "get_sku", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))), ("AddStock" = (operation_id = "add_stock", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))), ("Pause" = (operation_id = "pause", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))), ("Resume" = (operation_id = "resume", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))))),
        (status = 200, description = "Changed: the SKU view", body = SkuViewBody),
        (status = 400, description = "`BAD_REQUEST`: bad identifier, body, total or setting; `regions` given", body = OutcomeBody),
        (status = 409, description = "`CONFLICT`: the total would go below the units held or sold, or the agent is managed by a coordinator; nothing changes", body = OutcomeBody),
        (status = 500, description = "`INTERNAL`: creating the SKU failed; details logged only", body = OutcomeBody),
        AdminChangeFailures,
    ),
    security(("bearer" = []))
)]
pub async fn put_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
    JsonBody(body): JsonBody<PutSkuBody>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    standalone_only(&state)?;
    let (tenant, sku) = path.parse().map_err(bad)?;
    if body.regions.is_some() {
        return Err(bad(
            "regions need a coordinator; a standalone agent sells one region",
        ));
    }
    let total = units(body.total, "total").map_err(bad)?;
    let scope = body
        .user_limit_scope
        .as_deref()
        .map(UserLimitScope::parse)
        .transpose()
        .map_err(bad)?;
    let existing = state.registry().get(&tenant, &sku);
    let handle = match existing {
        None => {
            let settings = SkuSettings::parse(body.max_per_user, body.hold_ttl_ms)
                .map_err(bad)?
                .with_scope(scope.unwrap_or_default());
            // In its own task: a client that goes away must not cancel the creation half-way.
            let creating = {
                let (state, tenant, sku) = (state.clone(), tenant.clone(), sku.clone());
                tokio::spawn(async move {
                    state
                        .registry()
                        .create(&tenant, &sku, settings, total)
                        .await
                })
            };
            let created = creating
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))?;
            if let Some(handle) = created? {
                return Ok((StatusCode::CREATED, sku_json(&state, &handle)).into_response());
            }
            state
                .registry()
                .get(&tenant, &sku)
                .ok_or(ApiError::UnknownSku)?
        }
        Some(handle) => handle,
    };
    let current = handle.view.settings();
    let settings = SkuSettings::parse(
        Some(body.max_per_user.unwrap_or(i64::from(current.max_per_user))),
        Some(body.hold_ttl_ms.unwrap_or(current.hold_ttl.get() as i64)),
    )
    .map_err(bad)?
    .with_scope(scope.unwrap_or(current.user_limit_scope));
    change(&handle, AdminChange::Configure { total, settings }).await?;
    Ok(sku_json(&state, &handle).into_response())
}

fn find(state: &AppState, path: &SkuPath) -> Result<OwnerHandle, ApiError> {
    let (tenant, sku) = path.parse().map_err(bad)?;
    state
        .registry()
        .get(&tenant, &sku)
        .ok_or(ApiError::UnknownSku)
}

/// `GET /v1/admin/skus/{tenant}/{sku}`.
#[utoipa::path(
    get,
    path = "/v1/admin/skus/{tenant}/{sku}",
    tag = "admin",
    params(SkuPath),
    responses(
        (status = 200, description = "The SKU view, from memory", body = SkuViewBody),
        (status = 400, description = "`BAD_REQUEST`: bad identifier", body = OutcomeBody),
        (status = 404, description = "`UNKNOWN_SKU`", body = OutcomeBody),
        AdminReadFailures,
    ),
    security(("bearer" = []))
)]
pub async fn get_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let handle = find(&state, &path)?;
    Ok(sku_json(&state, &handle).into_response())
}

/// `POST /v1/admin/skus/{tenant}/{sku}/add-stock`.
#[utoipa::path(
    post,
    path = "/v1/admin/skus/{tenant}/{sku}/add-stock",
    tag = "admin",
    params(SkuPath),
    request_body = AddStockBody,
    responses(
        (status = 200, description = "The SKU view with the stock added", body = SkuViewBody),
        (status = 400, description = "`BAD_REQUEST`: bad identifier, body or qty", body = OutcomeBody),
        SkuChangeFailures,
        AdminChangeFailures,
    ),
    security(("bearer" = []))
)]
pub async fn add_stock(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
    JsonBody(body): JsonBody<AddStockBody>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    standalone_only(&state)?;
    let handle = find(&state, &path)?;
    let qty = body.qty().map_err(bad)?;
    change(&handle, AdminChange::AddStock(qty)).await?;
    Ok(sku_json(&state, &handle).into_response())
}

async fn set_paused(
    state: AppState,
    headers: HeaderMap,
    path: SkuPath,
    paused: bool,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    standalone_only(&state)?;
    let handle = find(&state, &path)?;
    change(&handle, AdminChange::Pause(paused)).await?;
    Ok(sku_json(&state, &handle).into_response())
}

/// `POST /v1/admin/skus/{tenant}/{sku}/pause`.
#[utoipa::path(
    post,
    path = "/v1/admin/skus/{tenant}/{sku}/pause",
    tag = "admin",
    params(SkuPath),
    responses(
        (status = 200, description = "The SKU view, paused: new holds are answered 503 `PAUSED`", body = SkuViewBody),
        (status = 400, description = "`BAD_REQUEST`: bad identifier", body = OutcomeBody),
        SkuChangeFailures,
        AdminChangeFailures,
    ),
    security(("bearer" = []))
)]
pub async fn pause(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
) -> Result<Response, ApiError> {
    set_paused(state, headers, path, true).await
}

/// `POST /v1/admin/skus/{tenant}/{sku}/resume`.
#[utoipa::path(
    post,
    path = "/v1/admin/skus/{tenant}/{sku}/resume",
    tag = "admin",
    params(SkuPath),
    responses(
        (status = 200, description = "The SKU view, selling again", body = SkuViewBody),
        (status = 400, description = "`BAD_REQUEST`: bad identifier", body = OutcomeBody),
        SkuChangeFailures,
        AdminChangeFailures,
    ),
    security(("bearer" = []))
)]
pub async fn resume(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
) -> Result<Response, ApiError> {
    set_paused(state, headers, path, false).await
}

/// `GET /v1/admin/audit`: the invariant per SKU, from committed rows.
#[utoipa::path(
    get,
    path = "/v1/admin/audit",
    tag = "admin",
    responses(
        (status = 200, description = "Every SKU with its drift; `drift_total` is 0 when healthy", body = AuditBody),
        (status = 500, description = "`INTERNAL`: the read failed; details logged only", body = OutcomeBody),
        AdminReadFailures,
    ),
    security(("bearer" = []))
)]
pub async fn audit(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let rows = state.store().audit().await?;
    let drift_total: i64 = rows.iter().map(|r| r.drift.abs() + r.rows_drift).sum();
    let skus = rows
        .iter()
        .map(|r| AuditSku {
            tenant: r.tenant.clone(),
            sku: r.sku.clone(),
            total: r.quota,
            pool: 0,
            in_transit: 0,
            available: r.available,
            held: r.held,
            sold: r.sold,
            drift: r.drift,
            rows_drift: r.rows_drift,
            regions: BTreeMap::from([(
                state.region().to_string(),
                AuditRegion {
                    available: r.available,
                    held: r.held,
                    sold: r.sold,
                    report_age_ms: 0,
                },
            )]),
        })
        .collect();
    Ok(Json(AuditBody { skus, drift_total }).into_response())
}
