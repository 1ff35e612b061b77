//! HTTP: routes, body limits and the global bound on requests in flight.

pub mod admin;
pub mod bodies;
pub mod buyer;
pub mod carts;
pub mod error;
pub mod failures;
pub mod json;
pub mod openapi;
pub mod ops;
pub mod retention;

use axum::response::IntoResponse;
use axum::routing::{get, post, put};
use axum::{BoxError, Router};
use service_kit::intake::{bounded, Intake};
use utoipa::OpenApi;

use crate::state::AppState;
use error::ApiError;

/// Most requests the whole agent handles at once; beyond this new requests
/// are shed with 503 REJECTED_QUEUE_FULL before any work, so nothing in
/// front of the owners queues without bound.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 16_384;

async fn shed(_: BoxError) -> axum::response::Response {
    metrics::counter!("escrow_requests_shed_total").increment(1);
    ApiError::QueueFull.into_response()
}

/// The agent's router.
pub fn router(state: AppState) -> Router {
    // Exported at 0 before the first shed: `increase()` over a counter
    // that appears already at 1 sees no increase, and the alert stays quiet.
    metrics::counter!("escrow_requests_shed_total").increment(0);
    let routes = Router::new()
        .route("/v1/reservations", post(buyer::reserve))
        .route("/v1/reservations/{request_key}", get(buyer::get))
        .route(
            "/v1/reservations/{request_key}/confirm",
            post(buyer::confirm),
        )
        .route(
            "/v1/reservations/{request_key}/release",
            post(buyer::release),
        )
        .route("/v1/reservations/{request_key}/extend", post(buyer::extend))
        .route("/v1/skus/{sku}", get(buyer::sku_status))
        .route("/v1/carts", post(carts::hold))
        .route("/v1/carts/{request_key}", get(carts::get))
        .route("/v1/carts/{request_key}/confirm", post(carts::confirm))
        .route("/v1/carts/{request_key}/release", post(carts::release))
        .route("/v1/carts/{request_key}/extend", post(carts::extend))
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
        .route(
            "/v1/admin/carts/{tenant}/{request_key}",
            get(carts::admin_get),
        )
        .route("/v1/admin/prune", post(retention::prune))
        .merge(service_kit::ops::routes(&openapi::ApiDoc::openapi()));
    let intake = Intake {
        body_bytes_max: json::BODY_BYTES_MAX,
        requests_in_flight_max: REQUESTS_IN_FLIGHT_MAX,
        request_timeout: None,
    };
    bounded(routes, intake, shed).with_state(state)
}
