//! The admin API: create and change SKUs, add stock, pause and resume,
//! inspect one SKU, list SKUs a page at a time, audit, list regions.

use std::collections::HashMap;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use escrow_core::{RegionName, Sku, Tenant, UserLimitScope};
use serde::Deserialize;
use service_kit::sku_admin::{units, AddStockBody, SkuPath};
use utoipa::{IntoParams, ToSchema};

use super::bodies::{OutcomeBody, RegionsBody};
use super::error::ApiError;
use super::failures::{AdminFailures, ChangeFailures};
use crate::policies::PolicyRequest;
use crate::store::admin::{Audit, ViewAt};
use crate::store::{AdminKey, Applied, Listing, SkuPage, SkuSpec, SkuSummary};
use crate::AppState;

/// SKUs in a page of a listing when the request names no `limit`.
pub const PAGE_SKUS_DEFAULT: u32 = 100;

/// Most SKUs in a page of a listing: a page is one query and one answer,
/// both bounded by this.
pub const PAGE_SKUS_MAX: u32 = 1_000;

/// The query of `GET /v1/admin/skus[/{tenant}]`: where the page starts and
/// how many SKUs it has at most.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The page holds the SKUs after this one: `SKU` on
    /// `/v1/admin/skus/{tenant}`, `TENANT/SKU` on `/v1/admin/skus`.
    after: Option<String>,
    /// SKUs in the page, 1..=1000; default 100.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
}

/// The header that makes an admin change apply once, as the document
/// lists it; [`admin_key`] reads it.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// Applies the change once: the same change with the same key answers 200 with `Idempotent-Replayed: true`
    #[param(rename = "Idempotency-Key", min_length = 1, max_length = 128)]
    pub key: Option<String>,
}

/// `PUT /v1/admin/skus/{tenant}/{sku}` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSkuBody {
    /// The SKU's total, 0..=10^12.
    #[schema(minimum = 0, maximum = 1_000_000_000_000_i64)]
    total: i64,
    /// Region name (`[a-z0-9-]{1,32}`, with a `--region-token`) to weight
    /// (0..=1000000); absent keeps the weights.
    regions: Option<HashMap<String, i64>>,
    /// Units per reservation at most, 1..=1000; absent keeps the current value.
    #[schema(minimum = 1, maximum = 1000)]
    max_per_user: Option<i64>,
    /// Default hold duration; absent keeps the current value.
    #[schema(minimum = 1000, maximum = 3_600_000)]
    hold_ttl_ms: Option<i64>,
    /// `region` (the default: the per-user limit counts each region's rows)
    /// or `global` (one limit across all regions); set when the SKU is
    /// created, 409 if changed later.
    #[schema(example = "global")]
    user_limit_scope: Option<String>,
    /// `tail-merge`, `refill`, `proportional`, `static` or `central`; absent
    /// keeps the SKU's choice (a new SKU follows `--policy`).
    policy: Option<String>,
    /// The policy's settings to override, merged key by key into its defaults.
    #[schema(value_type = Option<Object>)]
    settings: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Admin routes answer only the admin token.
pub(super) fn admin_only(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if state.auth().is_admin(headers) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

fn bad(e: impl ToString) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

/// The `Idempotency-Key` of an admin change, with the change it names.
fn admin_key(headers: &HeaderMap, operation: String) -> Result<Option<AdminKey>, ApiError> {
    headers
        .get("idempotency-key")
        .map(|raw| {
            let key = raw.to_str().map_err(|_| {
                ApiError::BadRequest("Idempotency-Key must be visible ASCII".into())
            })?;
            Ok(AdminKey {
                key: key.to_owned(),
                operation,
            })
        })
        .transpose()
}

/// What the admin views are read against now.
fn view_at(state: &AppState) -> ViewAt<'_> {
    ViewAt {
        policies: state.policies(),
        now: chrono::Utc::now(),
        stale_report_ms: state.stale_report_ms(),
    }
}

/// Region weights from `PutSkuBody::regions` (`{"eu": 2, ...}`), each
/// region name parsed and each weight in 0..=1000000, in name order.
pub fn parse_weights(raw: &HashMap<String, i64>) -> Result<Vec<(RegionName, u32)>, String> {
    let mut out = Vec::with_capacity(raw.len());
    for (name, weight) in raw {
        let region = RegionName::parse(name).map_err(|e| e.to_string())?;
        let weight = u32::try_from(*weight)
            .ok()
            .filter(|w| *w <= 1_000_000)
            .ok_or_else(|| format!("weight of {name} must be an integer in 0..=1000000"))?;
        out.push((region, weight));
    }
    out.sort();
    Ok(out)
}

/// The answer to an admin change: the SKU view, 201 for a new SKU, and
/// `Idempotent-Replayed: true` when the key's change was applied before.
async fn changed(
    state: &AppState,
    tenant: &Tenant,
    sku: &Sku,
    applied: Applied,
) -> Result<Response, ApiError> {
    let view = state.store().sku(tenant, sku, &view_at(state)).await?;
    let status = match applied {
        Applied::Created => StatusCode::CREATED,
        Applied::Changed | Applied::Replayed => StatusCode::OK,
    };
    let mut response = (status, Json(view)).into_response();
    if applied == Applied::Replayed {
        response.headers_mut().insert(
            "idempotent-replayed",
            axum::http::HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}

/// `PUT /v1/admin/skus/{tenant}/{sku}`.
#[utoipa::path(
    put,
    path = "/v1/admin/skus/{tenant}/{sku}",
    tag = "admin",
    params(SkuPath, IdempotencyKey),
    request_body = PutSkuBody,
    responses(
        (status = 201, description = "Created: the SKU view", body = SkuSummary, links(("GetSku" = (operation_id = "get_sku", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))), ("AddStock" = (operation_id = "add_stock", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))), ("Pause" = (operation_id = "pause", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))), ("Resume" = (operation_id = "resume", parameters(("tenant" = "$response.body#/tenant"), ("sku" = "$response.body#/sku")))))),
        (status = 200, description = "Changed (or replayed): the SKU view", body = SkuSummary, headers(("Idempotent-Replayed" = String, description = "`true` when the key's change was applied before"))),
        (status = 400, description = "`BAD_REQUEST`: bad identifier, body, total, region, weight, policy or setting", body = OutcomeBody),
        (status = 409, description = "`CONFLICT`: the total would drop by more than the pool holds, the user limit's scope would change, a global-scope SKU would gain a region, or the Idempotency-Key was used for another change; nothing changes", body = OutcomeBody),
        AdminFailures,
    ),
    security(("bearer" = []))
)]
pub async fn put_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
    body: Result<Json<PutSkuBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let (tenant, sku) = path.parse().map_err(bad)?;
    let Json(body) = body?;
    if let Some(unknown) = body
        .regions
        .iter()
        .flat_map(|r| r.keys())
        .find(|name| RegionName::parse(name).is_ok_and(|r| !state.auth().knows_region(&r)))
    {
        // Units granted to a region no agent can sync for would stay in transit forever.
        return Err(ApiError::BadRequest(format!(
            "region {unknown} has no --region-token here"
        )));
    }
    let spec = SkuSpec {
        total: units(body.total, "total").map_err(bad)?,
        regions: body
            .regions
            .as_ref()
            .map(parse_weights)
            .transpose()
            .map_err(ApiError::BadRequest)?,
        max_per_user: body.max_per_user,
        hold_ttl_ms: body.hold_ttl_ms,
        user_limit_scope: body
            .user_limit_scope
            .as_deref()
            .map(UserLimitScope::parse)
            .transpose()
            .map_err(bad)?,
        policy: PolicyRequest {
            name: body.policy,
            settings: body.settings,
        },
    };
    let key = admin_key(&headers, format!("PUT {tenant}/{sku} {spec:?}"))?;
    let applied = state
        .store()
        .put_sku(&tenant, &sku, &spec, state.policies(), key.as_ref())
        .await?;
    changed(&state, &tenant, &sku, applied).await
}

/// `GET /v1/admin/skus/{tenant}/{sku}`.
#[utoipa::path(
    get,
    path = "/v1/admin/skus/{tenant}/{sku}",
    tag = "admin",
    params(SkuPath),
    responses(
        (status = 200, description = "The SKU view, from one snapshot", body = SkuSummary),
        (status = 400, description = "`BAD_REQUEST`: bad identifier", body = OutcomeBody),
        (status = 404, description = "`UNKNOWN_SKU`", body = OutcomeBody),
        AdminFailures,
    ),
    security(("bearer" = []))
)]
pub async fn get_sku(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let (tenant, sku) = path.parse().map_err(bad)?;
    let view = state.store().sku(&tenant, &sku, &view_at(&state)).await?;
    Ok(Json(view).into_response())
}

/// A page's size from the query's `limit`.
fn page_limit(raw: Option<&str>) -> Result<u32, ApiError> {
    let Some(raw) = raw else {
        return Ok(PAGE_SKUS_DEFAULT);
    };
    raw.parse::<u32>()
        .ok()
        .filter(|limit| (1..=PAGE_SKUS_MAX).contains(limit))
        .ok_or_else(|| {
            ApiError::BadRequest(format!("limit must be an integer in 1..={PAGE_SKUS_MAX}"))
        })
}

/// A page of `listing` as the answer `{"skus", "next"}`.
async fn page(state: &AppState, listing: &Listing, limit: u32) -> Result<Response, ApiError> {
    let page = state
        .store()
        .list_skus(listing, limit, state.policies())
        .await?;
    Ok(Json(page).into_response())
}

/// `GET /v1/admin/skus/{tenant}?after=SKU&limit=N`: one tenant's SKUs by name.
#[utoipa::path(
    get,
    path = "/v1/admin/skus/{tenant}",
    tag = "admin",
    params(("tenant" = String, Path, description = "The tenant", example = json!("acme"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128), ListQuery),
    responses(
        (status = 200, description = "One page of the tenant's SKUs", body = SkuPage),
        (status = 400, description = "`BAD_REQUEST`: bad tenant, `limit`, `after` or another parameter", body = OutcomeBody),
        AdminFailures,
    ),
    security(("bearer" = []))
)]
pub async fn list_tenant_skus(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let tenant = Tenant::parse(&tenant).map_err(bad)?;
    let Query(query) = query?;
    let limit = page_limit(query.limit.as_deref())?;
    let after = query
        .after
        .as_deref()
        .map(Sku::parse)
        .transpose()
        .map_err(|e| ApiError::BadRequest(format!("after: {e}")))?;
    let listing = Listing::Tenant { tenant, after };
    page(&state, &listing, limit).await
}

/// `GET /v1/admin/skus?after=TENANT/SKU&limit=N`: every tenant's SKUs by
/// tenant, then name.
#[utoipa::path(
    get,
    path = "/v1/admin/skus",
    tag = "admin",
    params(ListQuery),
    responses(
        (status = 200, description = "One page of every tenant's SKUs", body = SkuPage),
        (status = 400, description = "`BAD_REQUEST`: bad `limit`, `after` or another parameter", body = OutcomeBody),
        AdminFailures,
    ),
    security(("bearer" = []))
)]
pub async fn list_skus(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let Query(query) = query?;
    let limit = page_limit(query.limit.as_deref())?;
    let bad_after = |e: escrow_core::IdError| bad(format!("after: {e}"));
    let after = query
        .after
        .as_deref()
        .map(|after| {
            let (tenant, sku) = after
                .split_once('/')
                .ok_or_else(|| ApiError::BadRequest("after must be TENANT/SKU".into()))?;
            Ok::<_, ApiError>((
                Tenant::parse(tenant).map_err(bad_after)?,
                Sku::parse(sku).map_err(bad_after)?,
            ))
        })
        .transpose()?;
    let listing = Listing::All { after };
    page(&state, &listing, limit).await
}

/// `POST /v1/admin/skus/{tenant}/{sku}/add-stock`.
#[utoipa::path(
    post,
    path = "/v1/admin/skus/{tenant}/{sku}/add-stock",
    tag = "admin",
    params(SkuPath, IdempotencyKey),
    request_body = AddStockBody,
    responses(
        (status = 200, description = "The SKU view with the stock added to total and pool", body = SkuSummary, headers(("Idempotent-Replayed" = String, description = "`true` when the key's change was applied before"))),
        (status = 400, description = "`BAD_REQUEST`: bad identifier, body or qty", body = OutcomeBody),
        ChangeFailures,
        AdminFailures,
    ),
    security(("bearer" = []))
)]
pub async fn add_stock(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<SkuPath>,
    body: Result<Json<AddStockBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let (tenant, sku) = path.parse().map_err(bad)?;
    let Json(body) = body?;
    let qty = body.qty().map_err(bad)?;
    let key = admin_key(&headers, format!("add-stock {tenant}/{sku} {qty}"))?;
    let applied = state
        .store()
        .add_stock(&tenant, &sku, qty, state.policies(), key.as_ref())
        .await?;
    changed(&state, &tenant, &sku, applied).await
}

async fn set_paused(
    state: AppState,
    headers: HeaderMap,
    path: SkuPath,
    paused: bool,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let (tenant, sku) = path.parse().map_err(bad)?;
    let verb = if paused { "pause" } else { "resume" };
    let key = admin_key(&headers, format!("{verb} {tenant}/{sku}"))?;
    let applied = state
        .store()
        .set_paused(&tenant, &sku, paused, key.as_ref())
        .await?;
    changed(&state, &tenant, &sku, applied).await
}

/// `POST /v1/admin/skus/{tenant}/{sku}/pause`.
#[utoipa::path(
    post,
    path = "/v1/admin/skus/{tenant}/{sku}/pause",
    tag = "admin",
    params(SkuPath, IdempotencyKey),
    responses(
        (status = 200, description = "The SKU view, paused", body = SkuSummary, headers(("Idempotent-Replayed" = String, description = "`true` when the key's change was applied before"))),
        (status = 400, description = "`BAD_REQUEST`: bad identifier", body = OutcomeBody),
        ChangeFailures,
        AdminFailures,
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
    params(SkuPath, IdempotencyKey),
    responses(
        (status = 200, description = "The SKU view, selling again", body = SkuSummary, headers(("Idempotent-Replayed" = String, description = "`true` when the key's change was applied before"))),
        (status = 400, description = "`BAD_REQUEST`: bad identifier", body = OutcomeBody),
        ChangeFailures,
        AdminFailures,
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

/// `GET /v1/admin/audit`: the invariant for every SKU, from one snapshot.
#[utoipa::path(
    get,
    path = "/v1/admin/audit",
    tag = "admin",
    responses(
        (status = 200, description = "Every SKU's view; `drift_total` and `stale_skus` are 0 when healthy", body = Audit),
        AdminFailures,
    ),
    security(("bearer" = []))
)]
pub async fn audit(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let audit = state.store().audit(&view_at(&state)).await?;
    metrics::gauge!("coordinator_drift_units").set(audit.drift_total as f64);
    Ok(Json(audit).into_response())
}

/// `GET /v1/admin/regions`.
#[utoipa::path(
    get,
    path = "/v1/admin/regions",
    tag = "admin",
    responses(
        (status = 200, description = "Every region that ever synced", body = RegionsBody),
        AdminFailures,
    ),
    security(("bearer" = []))
)]
pub async fn regions(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let regions = state.store().regions(chrono::Utc::now()).await?;
    Ok(Json(RegionsBody { regions }).into_response())
}
