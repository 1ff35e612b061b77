//! Bad input and credentials: every malformed request is a 400 naming the
//! problem with nothing written; a missing or wrong key is 401; a tenant
//! never sees another tenant's SKUs or reservations.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

conformance!(
    malformed_requests_are_refused_without_writing,
    credentials_and_tenant_isolation,
    extend_once_and_missing_keys,
    a_null_extend_body_is_no_body,
);

async fn rows(db: &TestDb) -> i64 {
    db.int("SELECT count(*) FROM reservations").await
}

/// An agent selling `drop` (10 units, holds of 60 s) with one hold, `k`,
/// and the hold's answer.
async fn agent_with_a_hold(db: &TestDb) -> (TestAgent, Api, Value) {
    let agent = TestAgent::start(db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 10, "hold_ttl_ms": 60000}))
        .await;
    let (status, held) = api.reserve("k", "u", "drop").await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    (agent, api, held)
}

/// Goal: each malformed reservation request gets 400 BAD_REQUEST with an
/// error message, and none of them writes a row or takes a unit.
async fn malformed_requests_are_refused_without_writing(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 10, "max_per_user": 2}))
        .await;
    let long = "x".repeat(129);
    let ok = || json!({"request_key": "k", "user_id": "u", "sku": "drop"});
    let with = |field: &str, value: Value| {
        let mut body = ok();
        body[field] = value;
        body.to_string()
    };
    let without = |field: &str| {
        let mut body = ok();
        body.as_object_mut().unwrap().remove(field);
        body.to_string()
    };
    let json_ct = "application/json";
    let cases: Vec<(&str, String, &str)> = vec![
        ("missing request_key", without("request_key"), json_ct),
        ("missing user_id", without("user_id"), json_ct),
        ("missing sku", without("sku"), json_ct),
        ("empty request_key", with("request_key", json!("")), json_ct),
        (
            "long request_key",
            with("request_key", json!(long)),
            json_ct,
        ),
        (
            "bad chars in request_key",
            with("request_key", json!("a b")),
            json_ct,
        ),
        ("slash in user_id", with("user_id", json!("a/b")), json_ct),
        ("long user_id", with("user_id", json!(long)), json_ct),
        ("unicode sku", with("sku", json!("skö")), json_ct),
        ("long sku", with("sku", json!(long)), json_ct),
        (
            "numeric request_key",
            with("request_key", json!(5)),
            json_ct,
        ),
        ("qty 0", with("qty", json!(0)), json_ct),
        ("qty negative", with("qty", json!(-1)), json_ct),
        ("qty above max_per_user", with("qty", json!(3)), json_ct),
        ("qty fractional", with("qty", json!(1.5)), json_ct),
        ("qty string", with("qty", json!("1")), json_ct),
        ("qty huge", with("qty", json!(1u64 << 63)), json_ct),
        ("ttl too short", with("ttl_ms", json!(999)), json_ct),
        ("ttl too long", with("ttl_ms", json!(3_600_001)), json_ct),
        ("ttl not a number", with("ttl_ms", json!("soon")), json_ct),
        ("unknown field", with("price", json!(1)), json_ct),
        ("not JSON", "{not json".to_owned(), json_ct),
        ("JSON array", "[]".to_owned(), json_ct),
        ("empty body", String::new(), json_ct),
        ("wrong content type", ok().to_string(), "text/plain"),
        (
            "oversize body",
            with("pad", json!("p".repeat(20_000))),
            json_ct,
        ),
    ];
    for (name, body, content_type) in &cases {
        let r = api
            .buyer_request(Method::POST, "/v1/reservations")
            .header("content-type", *content_type)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = r.status();
        let answer: Value = r.json().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {answer}");
        assert_eq!(answer["outcome"], "BAD_REQUEST", "{name}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(!error.is_empty(), "{name}: error says what is wrong");
        assert!(
            !error.to_lowercase().contains("sql"),
            "{name}: no internals"
        );
    }
    // Missing Content-Type entirely.
    let r = api
        .buyer_request(Method::POST, "/v1/reservations")
        .body(ok().to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Bad key in the path and a bad extend body.
    assert_eq!(api.get("a%20b").await.0, StatusCode::BAD_REQUEST);
    let extend = api
        .buyer_post("/v1/reservations/k/extend", json!({"ttl_ms": 10}))
        .await;
    assert_eq!(extend.0, StatusCode::BAD_REQUEST);
    // Admin input.
    for (tenant, body) in [
        ("acme", json!({"total": -1})),
        ("acme", json!({"total": 1, "max_per_user": 0})),
        ("acme", json!({"total": 1, "hold_ttl_ms": 5})),
        ("acme", json!({"total": 1, "regions": {"eu": 1}})),
        ("acme", json!({"total": 1, "bogus": 1})),
        ("ac me", json!({"total": 1})),
    ] {
        let (status, answer) = api.put_sku(tenant, "new", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{tenant} {body}: {answer}");
    }

    assert_eq!(rows(&db).await, 0, "nothing written");
    let s = stored(&db, "drop").await;
    assert_eq!(s.available, 10);
    let count = db.int("SELECT count(*) FROM sku_stock").await;
    assert_eq!(count, 1, "no SKU created by bad admin input");
    // And a well-formed request still works.
    assert_eq!(api.reserve("k", "u", "drop").await.0, StatusCode::CREATED);
    assert_balanced(&stored(&db, "drop").await);
    agent.stop().await;
}

/// Goal: no key or a wrong key is 401 on every buyer endpoint, the admin
/// API refuses tenant keys, and a tenant's key never reaches another
/// tenant's SKU or reservation (404 as if absent).
async fn credentials_and_tenant_isolation(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 10})).await;
    assert_eq!(api.reserve("k", "u", "drop").await.0, StatusCode::CREATED);
    let body = json!({"request_key": "k2", "user_id": "u2", "sku": "drop"});
    let url = |p: &str| format!("{}{p}", api.url);

    for token in [None, Some("wrong"), Some("acme-ke"), Some(ADMIN)] {
        let mut req = api.client.post(url("/v1/reservations")).json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "token {token:?}");
        let r = api
            .client
            .get(url("/v1/reservations/k"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    for path in ["/v1/admin/audit", "/v1/admin/skus/acme/drop"] {
        let r = api.buyer_request(Method::GET, path).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
    }

    // The other tenant sees nothing of acme's.
    let other = |req: reqwest::RequestBuilder| req.bearer_auth(OTHER_KEY).send();
    let r = other(api.client.post(url("/v1/reservations")).json(&body))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.json::<Value>().await.unwrap()["outcome"], "UNKNOWN_SKU");
    for path in [
        "/v1/reservations/k/confirm",
        "/v1/reservations/k/release",
        "/v1/reservations/k/extend",
    ] {
        let r = other(api.client.post(url(path))).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let r = other(api.client.get(url("/v1/reservations/k")))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"status": "NOT_FOUND"})
    );
    let r = other(api.client.get(url("/v1/skus/drop"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    let (_, row) = api.get("k").await;
    assert_eq!(row["status"], "HELD", "acme's hold untouched");
    assert_eq!(rows(&db).await, 1);
    assert_balanced(&stored(&db, "drop").await);
    agent.stop().await;
}

/// Goal: extend works once while HELD, moving expires_at; a second extend,
/// and confirm or release of missing keys, answer as the contract says.
async fn extend_once_and_missing_keys(db: TestDb) {
    let (agent, api, held) = agent_with_a_hold(&db).await;
    let (status, extended) = api
        .buyer_post("/v1/reservations/k/extend", json!({"ttl_ms": 600000}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(extended["expires_at"].as_str() > held["reservation"]["expires_at"].as_str());
    let (status, again) = api.action("k", "extend").await;
    assert_eq!(
        (status, again["status"].as_str()),
        (StatusCode::CONFLICT, Some("HELD"))
    );
    assert_eq!(api.action("k", "confirm").await.0, StatusCode::OK);
    assert_eq!(
        api.action("k", "confirm").await.0,
        StatusCode::OK,
        "confirm is idempotent"
    );
    let (status, sold) = api.action("k", "release").await;
    assert_eq!(
        (status, sold["status"].as_str()),
        (StatusCode::CONFLICT, Some("SOLD"))
    );
    for action in ["confirm", "release", "extend"] {
        let (status, body) = api.action("nope", action).await;
        assert_eq!(
            (status, body),
            (StatusCode::NOT_FOUND, json!({"status": "NOT_FOUND"}))
        );
    }
    assert_eq!(api.get("nope").await.0, StatusCode::NOT_FOUND);
    assert_balanced(&stored(&db, "drop").await);
    agent.stop().await;
}

/// Goal: an extend whose JSON body is `null` is an extend without a body
/// (the SKU's hold TTL), as the OpenAPI document says (the body is
/// optional and nullable) and as a null optional field counts as absent;
/// it used to be a 400.
async fn a_null_extend_body_is_no_body(db: TestDb) {
    let (agent, api, held) = agent_with_a_hold(&db).await;
    let r = api
        .buyer_request(Method::POST, "/v1/reservations/k/extend")
        .header("Content-Type", "application/json")
        .body("null")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let extended: Value = r.json().await.unwrap();
    assert_eq!(extended["status"], "HELD");
    assert!(extended["expires_at"].as_str() >= held["reservation"]["expires_at"].as_str());
    assert_balanced(&stored(&db, "drop").await);
    agent.stop().await;
}
