//! The coordinator's OpenAPI 3.1 document, generated from the handlers'
//! annotations and the body types, served at `GET /openapi.json`: the
//! published interface cannot drift from the code, and a fuzzer
//! (`scripts/api-fuzz`) checks the running coordinator against it.

use service_kit::openapi::Completion;
use service_kit::ops::OperationsDoc;
use utoipa::OpenApi;

use super::{admin, region, retention};

/// What the document says beside the routes' annotations: which token goes
/// where, and the operations endpoints.
const COMPLETION: Completion = Completion {
    bearer: "The admin token (`--admin-token`) on the admin API, the region's token (`--region-token REGION=TOKEN`) on the region API",
    operations: OperationsDoc {
        service: "coordinator",
        ready_when: "the database answers and migrations are applied.",
        unready: "`database unavailable`",
    },
};

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
        region::limits,
    ),
    modifiers(&COMPLETION),
    tags(
        (name = "admin", description = "SKUs, audit and regions, with the admin token"),
        (name = "region", description = "The agents' protocol, each with its region's token"),
    )
)]
pub struct ApiDoc;
