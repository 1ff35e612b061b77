//! The standalone agent's admin API: create and change SKUs, add stock,
//! pause and resume, inspect, audit. Every counter change goes through the
//! SKU's owner so the counters keep a single writer.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use escrow_core::{Sku, SkuSettings, Tenant};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::oneshot;

use super::error::ApiError;
use super::json::JsonBody;
use crate::owner::{AdminChange, AdminReply, Command, OwnerHandle};
use crate::state::AppState;

/// Largest total or stock addition accepted: far above any real sale,
/// far below counter overflow.
pub const UNITS_MAX: u64 = 1_000_000_000_000;

/// `PUT /v1/admin/skus/{tenant}/{sku}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutSkuBody {
    total: i64,
    regions: Option<serde_json::Value>,
    max_per_user: Option<i64>,
    hold_ttl_ms: Option<i64>,
}

/// `POST .../add-stock` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddStockBody {
    qty: i64,
}

fn bad(e: impl ToString) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

fn admin_only(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
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

fn ids(tenant: &str, sku: &str) -> Result<(Tenant, Sku), ApiError> {
    Ok((
        Tenant::parse(tenant).map_err(bad)?,
        Sku::parse(sku).map_err(bad)?,
    ))
}

fn units(raw: i64, field: &str) -> Result<u64, ApiError> {
    u64::try_from(raw)
        .ok()
        .filter(|u| *u <= UNITS_MAX)
        .ok_or_else(|| bad(format!("{field} must be an integer in 0..={UNITS_MAX}")))
}

fn sku_json(state: &AppState, handle: &OwnerHandle) -> serde_json::Value {
    let s = handle.view.snapshot();
    json!({
        "tenant": handle.view.tenant,
        "sku": handle.view.sku,
        "region": state.region(),
        "total": s.quota,
        "pool": 0,
        "in_transit": 0,
        "available": s.available,
        "held": s.held,
        "sold": s.sold,
        "paused": s.paused,
        "halted": s.halted,
        "max_per_user": s.max_per_user,
                "hold_ttl_ms": s.hold_ttl_ms,
        "regions": {
            state.region().as_str(): {
                "leased": s.quota, "available": s.available, "held": s.held, "sold": s.sold,
                "last_report_at": chrono::Utc::now(), "report_age_ms": 0,
            }
        },
    })
}

async fn change(handle: &OwnerHandle, change: AdminChange) -> Result<(), ApiError> {
    let (tx, rx) = oneshot::channel();
    // Admin changes wait for queue space rather than being shed.
    handle
        .queue
        .send(Command::Admin(change, tx))
        .await
        .map_err(|_| ApiError::Paused)?;
    match rx.await.map_err(|_| ApiError::Paused)? {
        AdminReply::Done => Ok(()),
        AdminReply::Paused => Err(ApiError::Paused),
        AdminReply::BelowCommitted { committed } => Err(ApiError::Conflict(format!(
            "total may not go below the {committed} units held or sold"
        ))),
    }
}

/// `PUT /v1/admin/skus/{tenant}/{sku}`: create, or change total and settings.
pub async fn put_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((tenant, sku)): Path<(String, String)>,
    JsonBody(body): JsonBody<PutSkuBody>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    standalone_only(&state)?;
    let (tenant, sku) = ids(&tenant, &sku)?;
    if body.regions.is_some() {
        return Err(bad(
            "regions need a coordinator; a standalone agent sells one region",
        ));
    }
    let total = units(body.total, "total")?;
    let existing = state.registry().get(&tenant, &sku);
    let handle = match existing {
        None => {
            let settings = SkuSettings::parse(body.max_per_user, body.hold_ttl_ms).map_err(bad)?;
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
                return Ok((StatusCode::CREATED, Json(sku_json(&state, &handle))).into_response());
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
    .map_err(bad)?;
    change(&handle, AdminChange::Configure { total, settings }).await?;
    Ok(Json(sku_json(&state, &handle)).into_response())
}

fn find(state: &AppState, tenant: &str, sku: &str) -> Result<OwnerHandle, ApiError> {
    let (tenant, sku) = ids(tenant, sku)?;
    state
        .registry()
        .get(&tenant, &sku)
        .ok_or(ApiError::UnknownSku)
}

/// `GET /v1/admin/skus/{tenant}/{sku}`.
pub async fn get_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((tenant, sku)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let handle = find(&state, &tenant, &sku)?;
    Ok(Json(sku_json(&state, &handle)).into_response())
}

/// `POST /v1/admin/skus/{tenant}/{sku}/add-stock`.
pub async fn add_stock(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((tenant, sku)): Path<(String, String)>,
    JsonBody(body): JsonBody<AddStockBody>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    standalone_only(&state)?;
    let handle = find(&state, &tenant, &sku)?;
    let qty = units(body.qty, "qty")?;
    if qty == 0 {
        return Err(bad("qty must be at least 1"));
    }
    change(&handle, AdminChange::AddStock(qty)).await?;
    Ok(Json(sku_json(&state, &handle)).into_response())
}

async fn set_paused(
    state: AppState,
    headers: HeaderMap,
    tenant: String,
    sku: String,
    paused: bool,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    standalone_only(&state)?;
    let handle = find(&state, &tenant, &sku)?;
    change(&handle, AdminChange::Pause(paused)).await?;
    Ok(Json(sku_json(&state, &handle)).into_response())
}

/// `POST /v1/admin/skus/{tenant}/{sku}/pause`.
pub async fn pause(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((tenant, sku)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    set_paused(state, headers, tenant, sku, true).await
}

/// `POST /v1/admin/skus/{tenant}/{sku}/resume`.
pub async fn resume(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((tenant, sku)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    set_paused(state, headers, tenant, sku, false).await
}

/// `GET /v1/admin/audit`: the invariant per SKU, from committed rows.
pub async fn audit(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let rows = state.store().audit().await?;
    let drift_total: i64 = rows.iter().map(|r| r.drift.abs() + r.rows_drift).sum();
    let skus: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            json!({
                "tenant": r.tenant, "sku": r.sku, "total": r.quota, "pool": 0, "in_transit": 0,
                "available": r.available, "held": r.held, "sold": r.sold,
                "drift": r.drift, "rows_drift": r.rows_drift,
                "regions": {state.region().as_str(): {"available": r.available, "held": r.held, "sold": r.sold, "report_age_ms": 0}},
            })
        })
        .collect();
    Ok(Json(json!({"skus": skus, "drift_total": drift_total})).into_response())
}
