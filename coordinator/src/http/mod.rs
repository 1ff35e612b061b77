//! HTTP: admin API, region API, operations endpoints, and the admin
//! console that drives the admin API from a browser.

pub mod admin;
pub mod bodies;
pub mod console;
pub mod error;
pub mod failures;
pub mod openapi;
pub mod region;
pub mod retention;

use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{BoxError, Router};
use tower::ServiceBuilder;

use crate::AppState;
use error::ApiError;

/// Most requests the coordinator handles at once; beyond this a request is
/// answered 503 OVERLOADED at once, before any work, so a storm of syncs
/// and takes cannot queue without bound in front of the database pool.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 512;

/// Longest a request may run before it is abandoned (its transaction rolls
/// back) and answered 503 OVERLOADED: shorter than the agents' 2 s client
/// timeout, so an agent hears an answer rather than giving up on a request
/// that may still commit, and longer than the longest held-open watch.
pub const REQUEST_TIMEOUT: Duration = Duration::from_millis(1_800);

async fn overloaded(error: BoxError) -> Response {
    let reason = if error.is::<tower::timeout::error::Elapsed>() {
        "timeout"
    } else {
        "overload"
    };
    metrics::counter!("coordinator_requests_shed_total", "reason" => reason).increment(1);
    ApiError::Overloaded.into_response()
}

/// Largest request body accepted (sync requests of agents with many SKUs included).
pub const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

/// `GET /healthz`: the process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    responses((status = 200, description = "`ok`", body = String, content_type = "text/plain"))
)]
pub async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: the database answers and migrations are applied.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "`ready`", body = String, content_type = "text/plain"),
        (status = 503, description = "`database unavailable`", body = String, content_type = "text/plain"),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Response {
    match state.store().ready().await {
        Ok(()) => "ready".into_response(),
        Err(error) => {
            tracing::warn!(%error, "not ready");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable").into_response()
        }
    }
}

/// `GET /metrics`: Prometheus text.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"))
)]
pub async fn metrics(State(state): State<AppState>) -> String {
    state.metrics().render()
}

/// The coordinator's router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/admin/skus", get(admin::list_skus))
        .route("/v1/admin/skus/{tenant}", get(admin::list_tenant_skus))
        .route(
            "/v1/admin/skus/{tenant}/{sku}",
            put(admin::put_sku).get(admin::get_sku),
        )
        .route(
            "/v1/admin/skus/{tenant}/{sku}/add-stock",
            post(admin::add_stock),
        )
        .route("/v1/admin/skus/{tenant}/{sku}/pause", post(admin::pause))
        .route("/v1/admin/skus/{tenant}/{sku}/resume", post(admin::resume))
        .route("/v1/admin/audit", get(admin::audit))
        .route("/v1/admin/prune", post(retention::prune))
        .route("/v1/admin/regions", get(admin::regions))
        .route("/v1/regions/{region}/sync", post(region::sync))
        .route("/v1/regions/{region}/take", post(region::take))
        .route("/v1/regions/{region}/watch", post(region::watch))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi::document))
        .merge(console::routes())
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(overloaded))
                .load_shed()
                .concurrency_limit(REQUESTS_IN_FLIGHT_MAX)
                .timeout(REQUEST_TIMEOUT),
        )
        .with_state(state)
}
