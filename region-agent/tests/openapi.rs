//! The agent's OpenAPI document: served at `/openapi.json` without
//! credentials, OpenAPI 3.1, and listing every route of the router.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;

conformance!(the_document_lists_every_route);

/// Every route of `region_agent::http::router`, as the document must list it.
const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/reservations"),
    ("get", "/v1/reservations/{request_key}"),
    ("post", "/v1/reservations/{request_key}/confirm"),
    ("post", "/v1/reservations/{request_key}/release"),
    ("post", "/v1/reservations/{request_key}/extend"),
    ("get", "/v1/skus/{sku}"),
    ("put", "/v1/admin/skus/{tenant}/{sku}"),
    ("get", "/v1/admin/skus/{tenant}/{sku}"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/add-stock"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/pause"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/resume"),
    ("get", "/v1/admin/audit"),
    ("post", "/v1/admin/prune"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

/// Goal: a client (or a fuzzer) reading `/openapi.json` sees an OpenAPI
/// 3.1 document with exactly the agent's routes, every one routed, and
/// the buyer and admin API marked as needing the bearer credential, and a
/// new hold linked to its actions.
async fn the_document_lists_every_route(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let doc = test_support::openapi::assert_document_lists(&agent.url, ROUTES).await;
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for (method, path) in ROUTES.iter().filter(|(_, p)| p.starts_with("/v1/")) {
        assert_eq!(
            doc["paths"][path][method]["security"][0]["bearer"],
            serde_json::json!([]),
            "{method} {path}"
        );
    }
    // The links a stateful fuzzer follows from a new hold to its actions.
    let links = &doc["paths"]["/v1/reservations"]["post"]["responses"]["201"]["links"];
    assert_eq!(links["Confirm"]["operationId"], "confirm");
    agent.stop().await;
}
