//! The region API driven by hand, without an agent, on both backends: an
//! older agent process is fenced, an older report never overwrites a newer
//! one, a take applies once however often it is sent, and a SKU's part of
//! a sync applies whole or not at all. These are the conditional writes
//! each backend must judge the same way. A request stuck behind a lock is
//! answered 503 OVERLOADED (the coordinator's request timeout is shorter
//! than the agents' client timeout) and commits nothing. A region's token
//! acts for its own region only. Units a region reports set aside for
//! carts are stored and keep the SKU from being called sold out.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

coordinator_tests!(
    older_processes_are_fenced_and_older_reports_ignored,
    a_take_applies_once,
    a_take_stuck_on_a_lock_is_answered_and_applies_once_later,
    a_report_of_more_units_than_can_exist_is_refused,
    a_take_with_counters_at_their_limit_is_answered,
    a_watch_answer_carries_the_news,
    a_region_token_cannot_move_another_regions_quota,
    a_sync_applies_whole_or_not_at_all,
    units_set_aside_for_carts_keep_a_sku_from_selling_out,
);

/// A sync from eu at (`epoch`, `seq`) reporting `available` units of `drop`.
fn sync_body(epoch: i64, seq: u64, available: u64) -> Value {
    json!({"epoch": epoch, "seq": seq, "rtt_ms": 0, "acks": [], "returns": [], "skus": [
        {"tenant": "acme", "sku": "drop", "available": available, "held": 0, "sold": 0,
         "sale_rate_per_s": 0.0}]})
}

/// eu's agent row at the coordinator: (epoch, seq).
async fn eu_session(admin: &Api) -> (i64, i64) {
    let (status, body) = admin.admin_get("/v1/admin/regions").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let eu = body["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["region"] == "eu")
        .unwrap()
        .clone();
    (eu["epoch"].as_i64().unwrap(), eu["seq"].as_i64().unwrap())
}

/// Goal: agent processes are ordered by epoch and reports by seq. A sync
/// from an older epoch is 409 FENCED and changes nothing; an older seq of
/// the current epoch is answered but its report is not stored; a newer
/// epoch takes over the region. The books stay balanced throughout.
async fn older_processes_are_fenced_and_older_reports_ignored(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let (status, body) = region_call(&coord, "eu", "sync", sync_body(2, 5, 0)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(eu_session(&admin).await, (2, 5));
    let reported = admin.admin_sku("acme", "drop").await["regions"]["eu"]["last_report_at"].clone();
    assert!(reported.is_string(), "the first report is stored");

    let (status, body) = region_call(&coord, "eu", "sync", sync_body(1, 9, 7)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );
    assert_eq!(
        eu_session(&admin).await,
        (2, 5),
        "an older epoch moves nothing"
    );

    let (status, body) = region_call(&coord, "eu", "sync", sync_body(2, 4, 7)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let eu = admin.admin_sku("acme", "drop").await["regions"]["eu"].clone();
    assert_eq!(
        (&eu["available"], &eu["last_report_at"]),
        (&json!(0), &reported),
        "an older report is not stored"
    );
    assert_eq!(eu_session(&admin).await, (2, 5));

    let (status, body) = region_call(&coord, "eu", "sync", sync_body(3, 1, 0)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        eu_session(&admin).await,
        (3, 1),
        "a newer process takes over"
    );
    let (status, body) = region_call(&coord, "eu", "sync", sync_body(2, 6, 0)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED")),
        "the process it replaced is fenced"
    );
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a take is applied once per id: sent again, it answers the same
/// grant and debits the pool no further; the same id from another region
/// is refused (400) with nothing moved; the books stay balanced.
async fn a_take_applies_once(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let pool = admin.admin_sku("acme", "drop").await["pool"]
        .as_u64()
        .unwrap();
    assert!(pool >= 5, "the initial split leaves units in the pool");
    let take = json!({"id": "t-1", "tenant": "acme", "sku": "drop", "units": 5});

    let (status, first) = region_call(&coord, "eu", "take", take.clone()).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(
        first["grant"],
        json!({"id": "t-1", "tenant": "acme", "sku": "drop", "units": 5})
    );
    let after = admin.admin_sku("acme", "drop").await;
    assert!(
        after["regions"]["eu"]["in_transit"].as_u64().unwrap() >= 5,
        "{after}"
    );

    let (status, again) = region_call(&coord, "eu", "take", take.clone()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["grant"], first["grant"], "the same grant again");
    let (status, body) = region_call(&coord, "us", "take", take).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let now = admin.admin_sku("acme", "drop").await;
    assert_eq!(
        (&now["pool"], &now["in_transit"]),
        (&after["pool"], &after["in_transit"]),
        "a repeated take debits nothing"
    );
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a take that cannot get its SKU's lock is abandoned at the
/// coordinator's request timeout and answered 503 OVERLOADED with
/// Retry-After, not left to the agent's client timeout; nothing of it
/// committed; sent again once the lock is gone, it grants once.
async fn a_take_stuck_on_a_lock_is_answered_and_applies_once_later(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let before = admin.admin_sku("acme", "drop").await;
    let take = json!({"id": "t-stuck", "tenant": "acme", "sku": "drop", "units": 3});

    let lock = db.lock_rows_of("skus").await;
    let response = client()
        .post(format!("{}/v1/regions/eu/take", coord.url))
        .bearer_auth(region_token("eu"))
        .json(&take)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let retry_after = response.headers().get("retry-after").cloned();
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        (status, &body["outcome"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("OVERLOADED"))
    );
    assert_eq!(retry_after.unwrap(), "1");
    lock.release().await;

    let now = admin.admin_sku("acme", "drop").await;
    assert_eq!(
        (&now["pool"], &now["in_transit"]),
        (&before["pool"], &before["in_transit"])
    );
    for _ in 0..2 {
        let (status, body) = region_call(&coord, "eu", "take", take.clone()).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["grant"]["units"], 3);
    }
    let after = admin.admin_sku("acme", "drop").await;
    assert_eq!(
        after["pool"].as_u64().unwrap(),
        before["pool"].as_u64().unwrap() - 3,
        "granted once"
    );
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a sync reporting more units than any region can hold (up to
/// u64::MAX, which made the policy's sums overflow and the handler panic,
/// an empty reply: found by fuzzing the region API) is 400 and changes
/// nothing; the coordinator goes on answering and the books stay balanced.
async fn a_report_of_more_units_than_can_exist_is_refused(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    for available in [u64::MAX, 1_000_000_000_000_001] {
        let (status, body) = region_call(&coord, "eu", "sync", sync_body(1, 1, available)).await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (StatusCode::BAD_REQUEST, Some("BAD_REQUEST")),
            "{body}"
        );
    }
    let mut huge = sync_body(1, 1, 0);
    huge["skus"][0]["held"] = json!(u64::MAX);
    huge["skus"][0]["sold"] = json!(1);
    let (status, body) = region_call(&coord, "eu", "sync", huge).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let view = admin.admin_sku("acme", "drop").await;
    assert!(view["regions"]["eu"]["last_report_at"].is_null(), "{view}");
    let (status, body) = region_call(&coord, "eu", "sync", sync_body(1, 1, 0)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a take whose counters are at u64::MAX (a returned count far
/// beyond anything the region was granted made the coordinator's sum of
/// units elsewhere overflow: a panic in the handler, an empty reply) is
/// answered, grants at most the pool, and leaves the books balanced.
async fn a_take_with_counters_at_their_limit_is_answered(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let take = json!({"id": "t-max", "tenant": "acme", "sku": "drop", "units": u64::MAX,
                      "prefetch": u64::MAX, "received": u64::MAX, "returned": u64::MAX});
    let (status, body) = region_call(&coord, "eu", "take", take).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["grant"]["units"].as_u64().unwrap() <= 100, "{body}");
    assert_eq!(
        body["sold_out_everywhere"], false,
        "units elsewhere are not nothing"
    );
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a watch answer with a new notice carries the region's news: the
/// directive of each SKU concerned and its grants pending to the region,
/// as the next sync would answer them; an agent process whose epoch is
/// not the region's current one is told the number only; nothing is
/// written, and the books stay balanced.
async fn a_watch_answer_carries_the_news(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    let empty = json!({"epoch": 1, "seq": 1, "rtt_ms": 0, "acks": [], "returns": [], "skus": []});
    let (status, body) = region_call(&coord, "eu", "sync", empty).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let watch = |epoch: i64, seen: u64| json!({"epoch": epoch, "seen": seen, "wait_ms": 1000});
    let (status, first) = region_call(&coord, "eu", "watch", watch(1, 0)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let seen = first["notice"].as_u64().unwrap();

    let (status, body) = admin
        .put_sku(
            "acme",
            "drop",
            json!({"total": 100, "regions": {"eu": 1, "us": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, news) = region_call(&coord, "eu", "watch", watch(1, seen)).await;
    assert_eq!(status, StatusCode::OK, "{news}");
    assert_ne!(
        news["notice"].as_u64().unwrap(),
        seen,
        "the creation is news"
    );
    let grants = news["grants"].as_array().unwrap();
    assert_eq!(grants.len(), 1, "{news}");
    assert_eq!(grants[0]["units"], 50, "eu's half of the total, pending");
    assert_eq!(grants[0]["sku"], "drop");
    let skus = news["skus"].as_array().unwrap();
    assert_eq!(skus.len(), 1, "{news}");
    assert_eq!(
        (&skus[0]["sku"], &skus[0]["mode"], &skus[0]["return_until"]),
        (&json!("drop"), &json!("ESCROW"), &json!(0))
    );

    let (status, fenced) = region_call(&coord, "eu", "watch", watch(2, seen)).await;
    assert_eq!(status, StatusCode::OK, "{fenced}");
    assert_eq!(
        (
            fenced["grants"].as_array().unwrap().len(),
            fenced["skus"].as_array().unwrap().len()
        ),
        (0, 0),
        "another process of eu is handed nothing"
    );
    let view = admin.admin_sku("acme", "drop").await;
    assert_eq!(
        view["regions"]["eu"]["in_transit"], 50,
        "the watch wrote nothing"
    );
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a region's token cannot act for another region (403) and an
/// unknown token is 401; nothing moves.
async fn a_region_token_cannot_move_another_regions_quota(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let before = admin.admin_sku("acme", "drop").await;
    let take = json!({"id": "t-evil", "tenant": "acme", "sku": "drop", "units": 5});
    let sync = json!({"epoch": 1, "seq": 1, "rtt_ms": 0, "skus": [], "acks": [], "returns": [
        {"id": "r-evil", "tenant": "acme", "sku": "drop", "units": 5}]});
    let c = client();
    for (path, body) in [("take", &take), ("sync", &sync)] {
        let r = c
            .post(format!("{}/v1/regions/us/{path}", coord.url))
            .bearer_auth(region_token("eu"))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        let r = c
            .post(format!("{}/v1/regions/us/{path}", coord.url))
            .bearer_auth("nobody")
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let r = c
        .get(format!("{}/v1/admin/audit", coord.url))
        .bearer_auth(region_token("eu"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let after = admin.admin_sku("acme", "drop").await;
    assert_eq!(before, after, "nothing moved");
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: a SKU's part of a sync is applied whole or not at all: returns
/// beyond the lease, or under an id another transfer holds, are refused
/// (400) with nothing of the SKU moved; a good one moves its units once,
/// and its replay moves nothing.
async fn a_sync_applies_whole_or_not_at_all(db: TestDb) {
    let (coord, admin) = Coord::with_drop(&db).await;
    let c = client();
    let sync = async |seq: u64, acks: Value, returns: Value| {
        let body = json!({"epoch": 1, "seq": seq, "rtt_ms": 0, "skus": [], "acks": acks, "returns": returns});
        let r = c
            .post(format!("{}/v1/regions/eu/sync", coord.url))
            .bearer_auth(region_token("eu"))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    };
    let ret = |id: &Value, units: u64| json!([{"id": id, "tenant": "acme", "sku": "drop", "units": units}]);

    let (status, first) = sync(1, json!([]), json!([])).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let grant = &first["grants"][0];
    let units = grant["units"].as_u64().unwrap();
    let acks = json!([grant["id"]]);
    let before = admin.admin_sku("acme", "drop").await;
    let (status, body) = sync(2, acks.clone(), ret(&json!("r-1"), units + 1)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = sync(3, acks.clone(), ret(&grant["id"], 1)).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a return may not reuse a grant's id: {body}"
    );
    assert_eq!(
        admin.admin_sku("acme", "drop").await,
        before,
        "nothing moved"
    );

    let (status, applied) = sync(4, acks.clone(), ret(&json!("r-1"), 2)).await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    assert_eq!(applied["confirmed"], acks);
    assert_eq!(applied["applied_returns"], json!(["r-1"]));
    let after = admin.admin_sku("acme", "drop").await;
    assert_eq!(after["regions"]["eu"]["leased"], units - 2);
    assert_eq!(after["ledger_drift"], 0);
    let (status, again) = sync(4, acks, ret(&json!("r-1"), 2)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["applied_returns"], json!(["r-1"]));
    assert_eq!(
        admin.admin_sku("acme", "drop").await,
        after,
        "a replayed sync moves nothing"
    );
    coord.stop().await;
}

/// A sync of `drop` from `region` at (1, `seq`) acknowledging `acks`,
/// every unit it has held, `set_aside` of them for carts.
fn all_held(seq: u64, acks: &[Value], held: u64, set_aside: u64) -> Value {
    json!({"epoch": 1, "seq": seq, "rtt_ms": 0, "acks": acks, "returns": [], "skus": [
        {"tenant": "acme", "sku": "drop", "available": 0, "held": held, "sold": 0,
         "sale_rate_per_s": 0.0, "set_aside": set_aside}]})
}

/// Goal: with nothing free anywhere, a SKU is sold out everywhere only
/// once no region has units set aside for a cart (a cart that cannot be
/// held lets them go): the set-aside count is stored with the report and
/// read back by the next region's sync and take; the books stay balanced.
async fn units_set_aside_for_carts_keep_a_sku_from_selling_out(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    let (status, body) = admin
        .put_sku(
            "acme",
            "drop",
            json!({"total": 100, "regions": {"eu": 1, "us": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut grants = Vec::new();
    for region in ["eu", "us"] {
        let (status, body) = region_call(&coord, region, "sync", all_held(1, &[], 0, 0)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let ids: Vec<Value> = body["grants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["id"].clone())
            .collect();
        assert_eq!(ids.len(), 1, "{body}");
        grants.push(ids);
    }
    let (status, body) = region_call(&coord, "eu", "sync", all_held(2, &grants[0], 50, 3)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = region_call(&coord, "us", "sync", all_held(2, &grants[1], 50, 0)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["skus"][0]["sold_out_everywhere"], false, "{body}");
    let take = json!({"id": "t-us", "tenant": "acme", "sku": "drop", "units": 1,
                      "received": 50, "returned": 0});
    let (status, body) = region_call(&coord, "us", "take", take.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["grant"], &body["sold_out_everywhere"]),
        (&Value::Null, &json!(false)),
        "units set aside are not free, nor gone: {body}"
    );

    let (status, body) = region_call(&coord, "eu", "sync", all_held(3, &[], 50, 0)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["skus"][0]["sold_out_everywhere"], true, "{body}");
    let take = json!({"id": "t-us-2", "tenant": "acme", "sku": "drop", "units": 1,
                      "received": 50, "returned": 0});
    let (status, body) = region_call(&coord, "us", "take", take).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["sold_out_everywhere"], true, "{body}");
    admin.assert_no_drift().await;
    coord.stop().await;
}
