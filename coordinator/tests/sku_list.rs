//! Listing SKUs through the admin API, `GET /v1/admin/skus/{tenant}` and
//! `GET /v1/admin/skus`: pages in name order that together hold every SKU
//! once, lines that agree with each SKU's own view, and the same 401 and
//! 400 answers as the other admin endpoints.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

coordinator_tests!(
    a_tenants_skus_come_in_pages_by_name,
    every_tenants_skus_come_in_pages,
    a_line_sums_the_regions_reports,
    a_tenant_without_skus_lists_nothing,
    listing_needs_the_admin_token,
    bad_paging_is_refused,
);

/// Creates each `tenant/sku` with `total` units, all in the pool.
async fn create(admin: &Api, ids: &[&str], total: u64) {
    for id in ids {
        let (tenant, sku) = id.split_once('/').unwrap();
        let (status, body) = admin.put_sku(tenant, sku, json!({"total": total})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
}

/// Follows `path`'s pages of `limit` SKUs to the end: every page's
/// `tenant/sku`s and its `next`.
async fn pages(admin: &Api, path: &str, limit: u32) -> Vec<(Vec<String>, Value)> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = match &after {
            Some(after) => format!("{path}?limit={limit}&after={after}"),
            None => format!("{path}?limit={limit}"),
        };
        let (status, page) = admin.admin_get(&query).await;
        assert_eq!(status, StatusCode::OK, "{query}: {page}");
        let next = page["next"].clone();
        out.push((test_support::api::page_ids(&page), next.clone()));
        match next {
            Value::Null => return out,
            Value::String(next) => after = Some(next),
            other => panic!("next is neither a string nor null: {other}"),
        }
        assert!(out.len() <= 10, "more pages than SKUs: {out:?}");
    }
}

/// Goal: a tenant's SKUs come by name in pages of `limit`, `next` naming
/// the page's last SKU while more follow and null on the last page (also
/// when it is full), without another tenant's SKUs; a line carries the
/// SKU's counters and settings as its own view shows them.
async fn a_tenants_skus_come_in_pages_by_name(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    create(
        &admin,
        &["acme/d", "acme/b", "beta/a", "acme/a", "acme/c"],
        10,
    )
    .await;
    let (status, _) = admin
        .put_sku(
            "acme",
            "e",
            json!({"total": 40, "regions": {"eu": 1}, "policy": "static"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    admin.admin_post("/v1/admin/skus/acme/c/pause", None).await;

    let got = pages(&admin, "/v1/admin/skus/acme", 2).await;
    let want = vec![
        (vec!["acme/a".to_owned(), "acme/b".to_owned()], json!("b")),
        (vec!["acme/c".to_owned(), "acme/d".to_owned()], json!("d")),
        (vec!["acme/e".to_owned()], Value::Null),
    ];
    assert_eq!(got, want);
    let got = pages(&admin, "/v1/admin/skus/acme", 5).await;
    assert_eq!(got.len(), 1, "five SKUs fill one page of five: {got:?}");
    assert_eq!((got[0].0.len(), &got[0].1), (5, &Value::Null));

    let (status, page) = admin.admin_get("/v1/admin/skus/acme").await;
    assert_eq!(status, StatusCode::OK);
    let lines = page["skus"].as_array().unwrap();
    assert_eq!(lines.len(), 5, "the default page holds them all");
    for line in lines {
        let view = admin.admin_sku("acme", line["sku"].as_str().unwrap()).await;
        for field in [
            "tenant",
            "sku",
            "total",
            "pool",
            "in_transit",
            "mode",
            "paused",
            "policy",
        ] {
            assert_eq!(line[field], view[field], "{field}: {line} vs {view}");
        }
        assert_eq!(
            (&line["available"], &line["held"], &line["sold"]),
            (&json!(0), &json!(0), &json!(0)),
            "no region reported yet: {line}"
        );
    }
    let e = &lines[4];
    assert_eq!(
        (&e["policy"], &e["pool"], &e["in_transit"]),
        (&json!("static"), &json!(0), &json!(40)),
        "the static split grants all to eu, where no agent took it yet: {e}"
    );
    assert_eq!(lines[2]["paused"], true);
    coord.stop().await;
}

/// Goal: without a tenant, every SKU comes in (tenant, sku) order across
/// tenants, `next` as `tenant/sku`, each SKU exactly once.
async fn every_tenants_skus_come_in_pages(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    create(
        &admin,
        &["beta/a", "acme/b", "acme/a", "beta/c", "gamma/a"],
        10,
    )
    .await;

    let got = pages(&admin, "/v1/admin/skus", 2).await;
    let want = vec![
        (
            vec!["acme/a".to_owned(), "acme/b".to_owned()],
            json!("acme/b"),
        ),
        (
            vec!["beta/a".to_owned(), "beta/c".to_owned()],
            json!("beta/c"),
        ),
        (vec!["gamma/a".to_owned()], Value::Null),
    ];
    assert_eq!(got, want);

    // A cursor need not name an existing SKU: the page starts after it.
    let (status, page) = admin.admin_get("/v1/admin/skus?after=acme/zz").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["skus"].as_array().unwrap().len(), 3);
    assert_eq!(page["skus"][0]["tenant"], "beta");
    coord.stop().await;
}

/// Goal: a line's available, held and sold are the sums of its regions'
/// last reports, as the SKU's view shows them per region.
async fn a_line_sums_the_regions_reports(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let eu_db = agent_db(&db, "eu").await;
    let us_db = agent_db(&db, "us").await;
    let eu = Agent::start(&eu_db, "eu", &coord.url, None).await;
    let us = Agent::start(&us_db, "us", &coord.url, None).await;
    settled_audit(&admin, Duration::from_secs(20)).await;

    let buyer = eu.buyer();
    assert_eq!(
        buyer.reserve("k1", "alice", "drop").await.0,
        StatusCode::CREATED
    );
    assert_eq!(buyer.action("k1", "confirm").await.0, StatusCode::OK);
    let buyer = us.buyer();
    assert_eq!(
        buyer.reserve("k2", "bob", "drop").await.0,
        StatusCode::CREATED
    );

    // Reports arrive with the agents' syncs; the line and the view are
    // two reads, so compare them once both show the sale.
    let mut last = (Value::Null, Value::Null);
    let agreed = test_support::poll::within(Duration::from_secs(20), async || {
        let view = admin.admin_sku("acme", "drop").await;
        let (status, page) = admin.admin_get("/v1/admin/skus/acme").await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let line = page["skus"][0].clone();
        let sum = |field: &str| {
            view["regions"]
                .as_object()
                .unwrap()
                .values()
                .map(|r| r[field].as_u64().unwrap())
                .sum::<u64>()
        };
        let agree = ["available", "held", "sold"]
            .iter()
            .all(|f| line[*f] == sum(f))
            && ["total", "pool", "in_transit"]
                .iter()
                .all(|f| line[*f] == view[*f]);
        let done = agree && line["sold"] == 1 && line["held"] == 1;
        last = (line, view);
        done
    })
    .await;
    assert!(agreed, "line and view never agreed on the sale: {last:#?}");
    let line = &last.0;
    let units = ["pool", "in_transit", "available", "held", "sold"]
        .iter()
        .map(|f| line[*f].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(units, 100, "the invariant holds on the line: {line}");
    admin.assert_no_drift().await;
    eu.stop().await;
    us.stop().await;
    coord.stop().await;
}

/// Goal: a tenant with no SKU, and an empty coordinator, answer 200 with
/// an empty page and no next, not 404.
async fn a_tenant_without_skus_lists_nothing(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    for path in ["/v1/admin/skus/acme", "/v1/admin/skus"] {
        let (status, page) = admin.admin_get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(page, json!({"skus": [], "next": null}), "{path}");
    }
    create(&admin, &["beta/a"], 1).await;
    let (status, page) = admin.admin_get("/v1/admin/skus/acme").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page, json!({"skus": [], "next": null}));
    coord.stop().await;
}

/// Goal: both listings answer 401 without the admin token or with another
/// token, before looking at the query.
async fn listing_needs_the_admin_token(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    create(&admin, &["acme/a"], 1).await;
    for path in [
        "/v1/admin/skus/acme",
        "/v1/admin/skus",
        "/v1/admin/skus/acme?limit=0",
    ] {
        let url = format!("{}{path}", coord.url);
        let anonymous = admin.client.get(&url).send().await.unwrap();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED, "{path}");
        let body: Value = anonymous.json().await.unwrap();
        assert_eq!(body, json!({"outcome": "UNAUTHORIZED"}));
        let tenant = admin
            .client
            .get(&url)
            .bearer_auth(ACME_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(tenant.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    coord.stop().await;
}

/// Goal: a limit outside 1..=1000 or not a number, a malformed `after`
/// or tenant, and an unknown parameter are 400 BAD_REQUEST with a reason.
async fn bad_paging_is_refused(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    create(&admin, &["acme/a"], 1).await;
    for path in [
        "/v1/admin/skus/acme?limit=0",
        "/v1/admin/skus/acme?limit=1001",
        "/v1/admin/skus/acme?limit=-1",
        "/v1/admin/skus/acme?limit=ten",
        "/v1/admin/skus/acme?limit=",
        "/v1/admin/skus?limit=0",
        "/v1/admin/skus/acme?after=",
        "/v1/admin/skus/acme?after=a%2Fb",
        "/v1/admin/skus?after=acme",
        "/v1/admin/skus?after=acme/",
        "/v1/admin/skus?after=ac%24me/a",
        "/v1/admin/skus/ac%24me",
        "/v1/admin/skus/acme?limt=5",
    ] {
        let (status, body) = admin.admin_get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["outcome"], "BAD_REQUEST", "{path}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{path}: {body}"
        );
    }
    let (_, body) = admin.admin_get("/v1/admin/skus/acme?limit=1001").await;
    assert_eq!(body["error"], "limit must be an integer in 1..=1000");
    for limit in [1, 1000] {
        let (status, page) = admin
            .admin_get(&format!("/v1/admin/skus/acme?limit={limit}"))
            .await;
        assert_eq!(status, StatusCode::OK, "limit {limit}: {page}");
        assert_eq!(page["skus"].as_array().unwrap().len(), 1);
    }
    coord.stop().await;
}
