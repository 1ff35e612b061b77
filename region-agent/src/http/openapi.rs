//! The agent's OpenAPI 3.1 document, generated from the handlers'
//! annotations and the body types, served at `GET /openapi.json`: the
//! published interface cannot drift from the code, and a fuzzer
//! (`scripts/api-fuzz`) checks the running agent against it.

use service_kit::openapi::Completion;
use service_kit::ops::OperationsDoc;
use utoipa::OpenApi;

use super::{admin, buyer, carts, retention};

/// What the document says beside the routes' annotations: which token goes
/// where, and the operations endpoints.
const COMPLETION: Completion = Completion {
    bearer: "A tenant key (`--tenant-key`) on the buyer API, the admin token (`--admin-token`) on the admin API",
    operations: OperationsDoc {
        service: "agent",
        ready_when: "the database answers, migrations are applied, and this\nprocess still holds its region.",
        unready: "`database unavailable`, or `fenced` once another agent took the region",
    },
};

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
        carts::hold,
        carts::get,
        carts::confirm,
        carts::release,
        carts::extend,
        admin::put_sku,
        admin::get_sku,
        admin::add_stock,
        admin::pause,
        admin::resume,
        admin::audit,
        carts::admin_get,
        retention::prune,
    ),
    modifiers(&COMPLETION),
    tags(
        (name = "buyer", description = "Reservations and carts, with a tenant key"),
        (name = "admin", description = "SKUs of a standalone agent, and any agent's carts, with the admin token"),
    )
)]
pub struct ApiDoc;
