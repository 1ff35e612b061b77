//! The agent's OpenAPI 3.1 document, generated from the handlers'
//! annotations and the body types, served at `GET /openapi.json`: the
//! published interface cannot drift from the code, and a fuzzer
//! (`scripts/api-fuzz`) checks the running agent against it.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::{Modify, OpenApi};

use super::{admin, buyer, ops, retention};

/// The document's description of both credentials as one bearer scheme.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        service_kit::openapi::add_bearer(
            openapi,
            "A tenant key (`--tenant-key`) on the buyer API, the admin token (`--admin-token`) on the admin API",
        );
    }
}

/// The region agent's API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "region-agent",
        description = "Sells one region's quota to buyers. The contract is ../shared/CONTRACT.md; the details are docs/api.md."
    ),
    paths(
        buyer::reserve,
        buyer::get,
        buyer::confirm,
        buyer::release,
        buyer::extend,
        buyer::sku_status,
        admin::put_sku,
        admin::get_sku,
        admin::add_stock,
        admin::pause,
        admin::resume,
        admin::audit,
        retention::prune,
        ops::healthz,
        ops::readyz,
        ops::metrics,
        document,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "buyer", description = "Reservations, with a tenant key"),
        (name = "admin", description = "SKUs of a standalone agent, with the admin token"),
        (name = "operations", description = "Health, readiness, metrics and this document; no credentials"),
    )
)]
pub struct ApiDoc;

/// The document as served, rendered once.
static DOCUMENT: LazyLock<String> =
    LazyLock::new(|| service_kit::openapi::render(&ApiDoc::openapi()));

/// `GET /openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document of this agent", content_type = "application/json"))
)]
pub async fn document() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
}
