//! The coordinator's OpenAPI document: served at `/openapi.json` without
//! credentials, OpenAPI 3.1, and listing every route of the router.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;

coordinator_tests!(the_document_lists_every_route);

/// Every route of `coordinator::http::router`, as the document must list it,
/// except the admin console's (`/console` and its assets): they serve a
/// page, not the API, and the page calls the admin API listed here.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/admin/skus"),
    ("get", "/v1/admin/skus/{tenant}"),
    ("put", "/v1/admin/skus/{tenant}/{sku}"),
    ("get", "/v1/admin/skus/{tenant}/{sku}"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/add-stock"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/pause"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/resume"),
    ("get", "/v1/admin/audit"),
    ("post", "/v1/admin/prune"),
    ("get", "/v1/admin/regions"),
    ("post", "/v1/regions/{region}/sync"),
    ("post", "/v1/regions/{region}/take"),
    ("post", "/v1/regions/{region}/watch"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

/// Goal: a client (or a fuzzer) reading `/openapi.json` sees an OpenAPI
/// 3.1 document with exactly the coordinator's routes, every one routed,
/// and the admin and region API marked as needing the bearer credential;
/// the console is served and left out on purpose.
async fn the_document_lists_every_route(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let doc = test_support::openapi::assert_document_lists(&coord.url, ROUTES).await;
    let console = client()
        .get(format!("{}/console", coord.url))
        .send()
        .await
        .unwrap();
    assert_eq!(console.status(), 200);
    assert!(doc["paths"]
        .as_object()
        .unwrap()
        .keys()
        .all(|path| !path.starts_with("/console")));
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
    coord.stop().await;
}
