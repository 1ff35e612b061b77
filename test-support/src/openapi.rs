//! Checks a service's OpenAPI document against its router: the document
//! parses as OpenAPI 3.1, lists exactly the operations the test names,
//! every listed operation is routed (a route the router lacks would
//! answer axum's empty 404 or a 405), and the API (`/v1/...`) asks for the
//! bearer credential.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::api::client;

/// The routes of the SKU admin API, which both services serve.
pub const SKU_ADMIN_ROUTES: &[(&str, &str)] = &[
    ("put", "/v1/admin/skus/{tenant}/{sku}"),
    ("get", "/v1/admin/skus/{tenant}/{sku}"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/add-stock"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/pause"),
    ("post", "/v1/admin/skus/{tenant}/{sku}/resume"),
    ("get", "/v1/admin/audit"),
    ("post", "/v1/admin/prune"),
];

/// The operations routes, which both services serve without credentials.
pub const OPERATIONS_ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

/// HTTP methods an OpenAPI path item can hold.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Fetches `{url}/openapi.json` (without credentials) and asserts it is an
/// OpenAPI 3.1 document whose operations are exactly `expected`
/// (`(method, path)`, method in lower case, path templated as in the
/// router), each with a response, each routed by the service.
pub async fn assert_document_lists(url: &str, expected: &[(&str, &str)]) -> Value {
    let answer = client()
        .get(format!("{url}/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let doc: Value = answer.json().await.unwrap();
    let version = doc["openapi"].as_str().unwrap();
    assert!(version.starts_with("3.1."), "OpenAPI version {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let mut listed = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS {
            if let Some(operation) = item.get(method) {
                let responses = operation["responses"].as_object().unwrap();
                assert!(!responses.is_empty(), "{method} {path} lists no response");
                listed.insert((method.to_owned(), path.clone()));
            }
        }
    }
    let expected: BTreeSet<(String, String)> = expected
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(listed, expected, "the document's operations");
    for (method, path) in &expected {
        let concrete = path.replace(['{', '}'], "");
        let request = client().request(
            method.to_uppercase().parse().unwrap(),
            format!("{url}{concrete}"),
        );
        let answer = request.send().await.unwrap();
        let status = answer.status();
        let body = answer.bytes().await.unwrap();
        assert_ne!(status, 405, "{method} {path} is not routed");
        assert!(
            !(status == 404 && body.is_empty()),
            "{method} {path} is not routed"
        );
    }
    doc
}

/// Asserts that `doc` declares the bearer security scheme and that each of
/// `routes` under `/v1/` (the API; the operations endpoints take no
/// credential) asks for it.
pub fn assert_api_takes_bearer(doc: &Value, routes: &[(&str, &str)]) {
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for (method, path) in routes.iter().filter(|(_, p)| p.starts_with("/v1/")) {
        assert_eq!(
            doc["paths"][path][method]["security"][0]["bearer"],
            serde_json::json!([]),
            "{method} {path}"
        );
    }
}
