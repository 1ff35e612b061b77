//! The coordinator's OpenAPI 3.1 document, generated from the handlers'
//! annotations and the body types, served at `GET /openapi.json`: the
//! published interface cannot drift from the code, and a fuzzer
//! (`scripts/api-fuzz`) checks the running coordinator against it.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::IntoResponse;
use utoipa::{Modify, OpenApi};

use super::{admin, region, retention};

/// The document's description of both credentials as one bearer scheme.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        service_kit::openapi::add_bearer(
            openapi,
            "The admin token (`--admin-token`) on the admin API, the region's token (`--region-token REGION=TOKEN`) on the region API",
        );
    }
}

/// The coordinator's API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "coordinator",
        description = "Owns each SKU's total and the pool not leased to regions. The contract is ../shared/CONTRACT.md; the details are docs/api.md."
    ),
    paths(
        admin::list_skus,
        admin::list_tenant_skus,
        admin::put_sku,
        admin::get_sku,
        admin::add_stock,
        admin::pause,
        admin::resume,
        admin::audit,
        retention::prune,
        admin::regions,
        region::sync,
        region::take,
        region::watch,
        super::healthz,
        super::readyz,
        super::metrics,
        document,
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "admin", description = "SKUs, audit and regions, with the admin token"),
        (name = "region", description = "The agents' protocol, each with its region's token"),
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
    responses((status = 200, description = "The OpenAPI 3.1 document of this coordinator", content_type = "application/json"))
)]
pub async fn document() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        DOCUMENT.as_str(),
    )
}
