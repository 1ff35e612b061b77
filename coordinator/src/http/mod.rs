//! HTTP: admin API, region API, operations endpoints.

pub mod admin;
pub mod error;
pub mod region;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;

use crate::AppState;

/// Largest request body accepted (sync requests of agents with many SKUs included).
pub const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.store().ready().await {
        Ok(()) => "ready".into_response(),
        Err(error) => {
            tracing::warn!(%error, "not ready");
            (StatusCode::SERVICE_UNAVAILABLE, "database unavailable").into_response()
        }
    }
}

async fn metrics(State(state): State<AppState>) -> String {
    state.metrics().render()
}

/// The coordinator's router.
pub fn router(state: AppState) -> Router {
    Router::new()
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
        .route("/v1/admin/regions", get(admin::regions))
        .route("/v1/regions/{region}/sync", post(region::sync))
        .route("/v1/regions/{region}/take", post(region::take))
        .route("/v1/regions/{region}/watch", post(region::watch))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(state)
}
