//! Carts through real HTTP against a real database, on PostgreSQL and on
//! SQLite: all or nothing under races, one status for every item, every
//! item's units moved once.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use sqlx::PgPool;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

conformance!(
    forty_carts_race_for_the_last_unit,
    a_cart_with_a_sold_out_item_holds_nothing,
    cart_keys_replay_and_bad_carts_write_nothing,
    cart_actions_racing_expiry_settle_each_cart_once,
);
test_support::postgres_only!(
    migrator: region_agent::store::postgres::MIGRATOR;
    carts_survive_their_database_connections_cut,
);

/// A cart of `skus` (one unit each) for `user` under `key`.
fn cart(key: &str, user: &str, skus: &[&str]) -> Value {
    let items: Vec<Value> = skus.iter().map(|sku| json!({ "sku": sku })).collect();
    json!({ "request_key": key, "user_id": user, "items": items })
}

/// Carts and reservations rows in the database.
async fn rows(db: &TestDb) -> (i64, i64) {
    let carts = db.int("SELECT count(*) FROM carts").await;
    let reservations = db.int("SELECT count(*) FROM reservations").await;
    (carts, reservations)
}

/// Goal: 40 carts racing for [a SKU with stock, a SKU with one unit] get
/// exactly one HELD; the others are told SOLD_OUT naming the scarce item,
/// and the SKU with stock moves by exactly one unit.
async fn forty_carts_race_for_the_last_unit(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "stock", json!({"total": 100})).await;
    api.put_sku("acme", "last", json!({"total": 1})).await;
    let answers = futures_join(40, |i| {
        let api = api.clone();
        async move {
            loop {
                let body = cart(&format!("c{i}"), &format!("u{i}"), &["stock", "last"]);
                let (status, body) = api.buyer_post("/v1/carts", body).await;
                if status != StatusCode::SERVICE_UNAVAILABLE {
                    return (status, body);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })
    .await;
    let held: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .map(|(_, b)| b)
        .collect();
    for (status, body) in &answers {
        if *status != StatusCode::CREATED {
            assert_eq!(*status, StatusCode::CONFLICT, "{body}");
            assert_eq!(body, &json!({"outcome": "SOLD_OUT", "sku": "last"}));
        }
    }
    assert_eq!(held.len(), 1, "exactly one cart holds the last unit");
    assert_eq!(held[0]["cart"]["status"], "HELD");
    let (stock, last) = (stored(&db, "stock").await, stored(&db, "last").await);
    assert_balanced(&stock);
    assert_balanced(&last);
    assert_eq!((stock.held, stock.available), (1, 99));
    assert_eq!((last.held, last.available), (1, 0));
    assert_eq!(rows(&db).await, (1, 2), "one cart, its two items");
    api.assert_no_drift().await;
    agent.stop().await;
}

/// Goal: a cart with a sold-out item is 409 naming it, holds nothing, and
/// has no cart to look up; the same key again gets the same answer and
/// writes nothing.
async fn a_cart_with_a_sold_out_item_holds_nothing(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "stock", json!({"total": 10})).await;
    api.put_sku("acme", "last", json!({"total": 1})).await;
    assert_eq!(
        api.reserve("r1", "someone", "last").await.0,
        StatusCode::CREATED
    );
    for _ in 0..2 {
        let (status, body) = api
            .buyer_post("/v1/carts", cart("c1", "u1", &["stock", "last"]))
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body, json!({"outcome": "SOLD_OUT", "sku": "last"}));
        let (status, _) = api.buyer_get("/v1/carts/c1").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(rows(&db).await, (0, 1), "only the reservation r1");
        let stock = stored(&db, "stock").await;
        assert_eq!((stock.available, stock.held), (10, 0));
    }
    // The units set aside for the refused cart are free again at once.
    let (status, body) = api
        .buyer_post("/v1/carts", cart("c2", "u2", &["stock"]))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    api.assert_no_drift().await;
    agent.stop().await;
}

/// Goal: a cart's key replays its cart (200 REPLAY), and is KEY_REUSED for
/// other items, another user, or a reservation; a reservation cannot take
/// a cart's key. Bad carts are 4xx and write nothing.
async fn cart_keys_replay_and_bad_carts_write_nothing(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "a", json!({"total": 10, "max_per_user": 2}))
        .await;
    api.put_sku("acme", "b", json!({"total": 10})).await;
    let bad: Vec<(Value, StatusCode)> = vec![
        (cart("x", "u", &[]), StatusCode::BAD_REQUEST),
        (cart("x", "u", &["a", "a"]), StatusCode::BAD_REQUEST),
        (
            cart("x", "u", &(0..21).map(|_| "a").collect::<Vec<_>>()),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"request_key": "x", "user_id": "u", "items": [{"sku": "a", "qty": 0}]}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"request_key": "x", "user_id": "u", "items": [{"sku": "a", "qty": 3}]}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"request_key": "x", "user_id": "u", "items": [{"sku": "a"}], "coupon": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"request_key": "x", "user_id": "u", "items": [{"sku": "a", "colour": "red"}]}),
            StatusCode::BAD_REQUEST,
        ),
        (cart("x/y", "u", &["a"]), StatusCode::BAD_REQUEST),
        (cart("x", "u", &["a", "elsewhere"]), StatusCode::NOT_FOUND),
    ];
    for (body, expected) in bad {
        let (status, answer) = api.buyer_post("/v1/carts", body.clone()).await;
        assert_eq!(status, expected, "{body} -> {answer}");
    }
    // Another tenant's SKU is unknown to this tenant.
    let other = client()
        .post(format!("{}/v1/carts", agent.url))
        .bearer_auth(OTHER_KEY)
        .json(&cart("x", "u", &["a"]))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
    assert_eq!(rows(&db).await, (0, 0), "nothing written");

    let body = json!({"request_key": "c1", "user_id": "u1",
                      "items": [{"sku": "b"}, {"sku": "a", "qty": 2}]});
    let (status, held) = api.buyer_post("/v1/carts", body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    assert_eq!(
        held["cart"]["items"],
        json!([{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}])
    );
    let (status, replay) = api.buyer_post("/v1/carts", body).await;
    assert_eq!(
        (status, &replay["outcome"]),
        (StatusCode::OK, &json!("REPLAY"))
    );
    assert_eq!(replay["cart"], held["cart"]);
    for reused in [cart("c1", "u1", &["a"]), cart("c1", "u2", &["a", "b"])] {
        let (status, body) = api.buyer_post("/v1/carts", reused).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    assert_eq!(
        api.reserve("c1", "u1", "a").await.0,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a reservation cannot take a cart's key"
    );
    assert_eq!(api.reserve("r1", "u9", "a").await.0, StatusCode::CREATED);
    let (status, _) = api.buyer_post("/v1/carts", cart("r1", "u9", &["b"])).await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a cart cannot take a reservation's key"
    );
    // The user of an item's SKU already holding it: USER_LIMIT naming it.
    let (status, body) = api
        .buyer_post("/v1/carts", cart("c2", "u9", &["b", "a"]))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body, json!({"outcome": "USER_LIMIT", "sku": "a"}));
    assert_eq!(rows(&db).await, (1, 3), "the cart c1's two items and r1");
    let (a, b) = (stored(&db, "a").await, stored(&db, "b").await);
    assert_eq!((a.held, b.held), (3, 1));
    api.assert_no_drift().await;
    agent.stop().await;
}

/// Goal: confirms, releases and extensions of carts racing their own
/// expiry settle each cart once, every item the same way: a confirm
/// answered 200 sold every item, a 409 found every item expired, an
/// extended cart expired whole later, and each unit came back to
/// available at most once.
async fn cart_actions_racing_expiry_settle_each_cart_once(db: TestDb) {
    const CARTS: usize = 60;
    let agent = TestAgent::start_manual(&db).await;
    let api = agent.api();
    for sku in ["a", "b", "c"] {
        api.put_sku("acme", sku, json!({"total": CARTS, "hold_ttl_ms": 1000}))
            .await;
    }
    for i in 0..CARTS {
        let (status, body) = api
            .buyer_post(
                "/v1/carts",
                cart(&format!("c{i}"), &format!("u{i}"), &["a", "b", "c"]),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let clock = agent.clock.clone().unwrap();
    let acts = tokio::spawn({
        let api = api.clone();
        async move {
            futures_join(CARTS, |i| {
                let api = api.clone();
                let action = ["confirm", "release", "extend"][i % 3];
                async move {
                    let path = format!("/v1/carts/c{i}/{action}");
                    (i, action, api.buyer_post(&path, json!({})).await)
                }
            })
            .await
        }
    });
    // Once the first action has committed, time passes every expiry while
    // the rest are still arriving, and the expiry sweeps them too.
    eventually("a first cart moves", Duration::from_secs(10), async || {
        db.int("SELECT count(*) FROM carts WHERE status <> 'HELD'")
            .await
            > 0
    })
    .await;
    clock.advance(1_000);
    let answers = acts.await.unwrap();
    // Extended carts expire later: past every extended expiry too.
    clock.advance(1_000);
    eventually(
        "the expiry settles every cart",
        Duration::from_secs(10),
        async || {
            db.int("SELECT count(*) FROM carts WHERE status = 'HELD'")
                .await
                == 0
        },
    )
    .await;

    let mut sold = 0;
    for (i, action, (status, body)) in &answers {
        let (_, now) = api.buyer_get(&format!("/v1/carts/c{i}")).await;
        if body["status"] != "HELD" {
            assert_eq!(
                body["status"], now["status"],
                "c{i} {action}: the answer ({status} {body}) is what was committed"
            );
        }
        let items = db
            .texts(&format!(
                "SELECT status FROM reservations WHERE request_key LIKE 'c{i}/%' ORDER BY sku"
            ))
            .await;
        assert_eq!(items.len(), 3);
        assert!(
            items.iter().all(|s| *s == now["status"]),
            "c{i}: {items:?} vs {now}"
        );
        match (*action, *status, body["status"].as_str()) {
            ("confirm", StatusCode::OK, Some("SOLD")) => sold += 1,
            ("confirm" | "extend", StatusCode::CONFLICT, Some("EXPIRED"))
            | ("release", StatusCode::OK, Some("RELEASED" | "EXPIRED")) => {}
            // Extended, then expired by the agent once its new time was up.
            ("extend", StatusCode::OK, Some("HELD")) => assert_eq!(now["status"], "EXPIRED"),
            other => panic!("c{i}: unexpected {other:?}"),
        }
    }
    println!("{CARTS} carts' confirms, releases and extensions racing expiry: {sold} sold");
    for sku in ["a", "b", "c"] {
        let s = stored(&db, sku).await;
        assert_balanced(&s);
        assert_eq!((s.sold, s.held), (sold, 0), "{sku}");
        assert_eq!(
            s.available,
            CARTS as i64 - sold,
            "{sku}: every other unit back once"
        );
    }
    api.assert_no_drift().await;
    agent.stop().await;
}

/// Goal: the agent's database connections are terminated every 25 ms
/// for a second while carts are being held (`pg_terminate_backend`, as a failover or an
/// operator would): commits in flight fail or end unknown, and are
/// settled from the database. Every cart answered HELD is held whole
/// afterwards, every buyer gets a final answer by retrying its key, no
/// item is left without its cart, and the counters agree with the rows.
async fn carts_survive_their_database_connections_cut(pool: PgPool) {
    let db = TestDb::postgres(pool);
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    for (sku, total) in [("a", 1_000), ("b", 1_000), ("c", 400)] {
        api.put_sku("acme", sku, json!({ "total": total })).await;
    }
    let name = db
        .url()
        .rsplit('/')
        .next()
        .and_then(|tail| tail.split('?').next())
        .unwrap()
        .to_owned();
    let buyers = tokio::spawn({
        let api = api.clone();
        async move {
            futures_join(800, |i| {
                let api = api.clone();
                async move {
                    tokio::time::sleep(Duration::from_micros(1_500 * i as u64)).await;
                    let body = cart(&format!("c{i}"), &format!("u{i}"), &["a", "b", "c"]);
                    let mut paused = 0;
                    loop {
                        let (status, answer) = api.buyer_post("/v1/carts", body.clone()).await;
                        if status != StatusCode::SERVICE_UNAVAILABLE {
                            return (i, status, answer, paused);
                        }
                        paused += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
            .await
        }
    });
    // Every 25 ms for the first second, while the carts arrive: some cuts
    // land on commits in flight.
    let mut cut = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        cut += db
            .execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            ))
            .await;
    }
    let answers = buyers.await.unwrap();
    let mut held = 0;
    let mut paused = 0;
    for (i, status, answer, retries) in &answers {
        paused += retries;
        match (*status, answer["outcome"].as_str()) {
            (StatusCode::CREATED, Some("HELD")) | (StatusCode::OK, Some("REPLAY")) => {
                let (_, now) = api.buyer_get(&format!("/v1/carts/c{i}")).await;
                assert_eq!(now["status"], "HELD", "c{i}");
                assert_eq!(now["items"].as_array().unwrap().len(), 3, "c{i} is whole");
                held += 1;
            }
            (StatusCode::CONFLICT, Some("SOLD_OUT")) => {}
            other => panic!("c{i}: unexpected {other:?}: {answer}"),
        }
    }
    println!(
        "connections cut every 25 ms for 1 s under 800 carts ({cut} in all): {held} held, {paused} answers 503 retried"
    );
    assert_carts_whole(&db).await;
    assert_eq!(db.int("SELECT count(*) FROM carts").await, held);
    for sku in ["a", "b", "c"] {
        let s = stored(&db, sku).await;
        assert_balanced(&s);
        assert_eq!(s.held, held, "{sku}");
    }
    api.assert_no_drift().await;
    agent.stop().await;
}
