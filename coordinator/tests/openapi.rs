//! The coordinator's OpenAPI document: served at `/openapi.json` without
//! credentials, OpenAPI 3.1, and listing every route of the router.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;
use test_support::openapi::{
    assert_api_takes_bearer, assert_document_lists, OPERATIONS_ROUTES, SKU_ADMIN_ROUTES,
};

coordinator_tests!(the_document_lists_every_route);

/// The routes of `coordinator::http::router` beside the SKU admin and
/// operations routes both services serve, except the admin console's
/// (`/console` and its assets): they serve a page, not the API, and the
/// page calls the admin API listed here.
const COORDINATOR_ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/admin/skus"),
    ("get", "/v1/admin/skus/{tenant}"),
    ("get", "/v1/admin/regions"),
    ("post", "/v1/regions/{region}/sync"),
    ("post", "/v1/regions/{region}/take"),
    ("post", "/v1/regions/{region}/watch"),
    ("post", "/v1/regions/{region}/limits"),
];

/// Goal: a client (or a fuzzer) reading `/openapi.json` sees an OpenAPI
/// 3.1 document with exactly the coordinator's routes, every one routed,
/// and the admin and region API marked as needing the bearer credential;
/// the console is served and left out on purpose.
async fn the_document_lists_every_route(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let routes = [COORDINATOR_ROUTES, SKU_ADMIN_ROUTES, OPERATIONS_ROUTES].concat();
    let doc = assert_document_lists(&coord.url, &routes).await;
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
    assert_api_takes_bearer(&doc, &routes);
    coord.stop().await;
}
