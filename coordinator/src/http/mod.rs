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

use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{BoxError, Router};
use service_kit::intake::{bounded, Intake};
use service_kit::ops::Operated;
use utoipa::OpenApi;

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

/// Largest request body accepted (sync requests of agents with many SKUs included).
pub const BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

async fn overloaded(error: BoxError) -> Response {
    let reason = if error.is::<tower::timeout::error::Elapsed>() {
        "timeout"
    } else {
        "overload"
    };
    metrics::counter!("coordinator_requests_shed_total", "reason" => reason).increment(1);
    ApiError::Overloaded.into_response()
}

impl Operated for AppState {
    async fn unready(&self) -> Option<&'static str> {
        service_kit::ops::database_unready(self.store().ready().await)
    }

    fn scrape(&self) -> String {
        self.metrics().render()
    }
}

/// The coordinator's router.
pub fn router(state: AppState) -> Router {
    let routes = Router::new()
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
        .route("/v1/regions/{region}/limits", post(region::limits))
        .merge(service_kit::ops::routes(&openapi::ApiDoc::openapi()))
        .merge(console::routes());
    let intake = Intake {
        body_bytes_max: BODY_BYTES_MAX,
        requests_in_flight_max: REQUESTS_IN_FLIGHT_MAX,
        request_timeout: Some(REQUEST_TIMEOUT),
    };
    bounded(routes, intake, overloaded).with_state(state)
}
