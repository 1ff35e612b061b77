//! The agent's OpenAPI document: served at `/openapi.json` without
//! credentials, OpenAPI 3.1, and listing every route of the router.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;
use test_support::openapi::{
    assert_api_takes_bearer, assert_document_lists, OPERATIONS_ROUTES, SKU_ADMIN_ROUTES,
};

conformance!(the_document_lists_every_route);

/// The routes of `region_agent::http::router` beside the SKU admin and
/// operations routes both services serve.
const BUYER_ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/reservations"),
    ("get", "/v1/reservations/{request_key}"),
    ("post", "/v1/reservations/{request_key}/confirm"),
    ("post", "/v1/reservations/{request_key}/release"),
    ("post", "/v1/reservations/{request_key}/extend"),
    ("get", "/v1/skus/{sku}"),
    ("post", "/v1/carts"),
    ("get", "/v1/carts/{request_key}"),
    ("post", "/v1/carts/{request_key}/confirm"),
    ("post", "/v1/carts/{request_key}/release"),
    ("post", "/v1/carts/{request_key}/extend"),
    ("get", "/v1/admin/carts/{tenant}/{request_key}"),
];

/// Goal: a client (or a fuzzer) reading `/openapi.json` sees an OpenAPI
/// 3.1 document with exactly the agent's routes, every one routed, and
/// the buyer and admin API marked as needing the bearer credential, and a
/// new hold and a new cart linked to their actions.
async fn the_document_lists_every_route(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let routes = [BUYER_ROUTES, SKU_ADMIN_ROUTES, OPERATIONS_ROUTES].concat();
    let doc = assert_document_lists(&agent.url, &routes).await;
    assert_api_takes_bearer(&doc, &routes);
    // The links a stateful fuzzer follows from a new hold to its actions.
    let links = &doc["paths"]["/v1/reservations"]["post"]["responses"]["201"]["links"];
    assert_eq!(links["Confirm"]["operationId"], "confirm");
    let links = &doc["paths"]["/v1/carts"]["post"]["responses"]["201"]["links"];
    assert_eq!(links["ConfirmCart"]["operationId"], "confirm_cart");
    agent.stop().await;
}
