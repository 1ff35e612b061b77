//! Health, readiness and metrics endpoints for operators and orchestrators.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::clock::SystemClock;
use crate::state::AppState;

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

/// `GET /readyz`: the database answers, migrations are applied, and this
/// process still holds its region.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "`ready`", body = String, content_type = "text/plain"),
        (status = 503, description = "`database unavailable`, or `fenced` once another agent took the region", body = String, content_type = "text/plain"),
    )
)]
pub async fn readyz(State(state): State<AppState>) -> Response {
    if state.fence().is_fenced() {
        return (StatusCode::SERVICE_UNAVAILABLE, "fenced").into_response();
    }
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
    // Read when scraped: the gauge is as fresh as the scrape.
    metrics::gauge!("escrow_clock_step_ms").set(SystemClock.step_ms() as f64);
    state.metrics().render()
}
