//! Concurrency against a real database through real HTTP: the races the
//! design must win, each checked by counts, statuses and the invariant, on
//! PostgreSQL and on SQLite.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use escrow_core::{Qty, RequestKey, Sku, Tenant, Transition};
use region_agent::store::{Batch, Store};
use reqwest::StatusCode;
use serde_json::json;

conformance!(
    two_thousand_buyers_for_one_hundred_units,
    one_key_thirty_two_times_is_one_hold,
    one_user_sixteen_keys_is_one_hold,
    confirm_racing_expiry_resolves_each_hold_once,
    release_twice_and_release_racing_expiry_return_once,
    concurrent_and_killed_sweeps_return_each_unit_once,
);

/// Goal: 2,000 concurrent buyers for 100 units get exactly 100 holds and
/// every other buyer a final SOLD_OUT; counters, rows and audit agree.
async fn two_thousand_buyers_for_one_hundred_units(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    assert_eq!(
        api.put_sku("acme", "drop", json!({"total": 100})).await.0,
        StatusCode::CREATED
    );

    let mut buyers = Vec::new();
    for i in 0..2_000 {
        let api = api.clone();
        buyers.push(tokio::spawn(async move {
            api.reserve_until_final(&format!("key-{i}"), &format!("user-{i}"), "drop")
                .await
        }));
    }
    let mut by_status: HashMap<StatusCode, usize> = HashMap::new();
    let mut held_keys = Vec::new();
    let mut retries = 0;
    for buyer in buyers {
        let Final {
            status,
            body,
            retries: r,
            ..
        } = buyer.await.unwrap();
        retries += r;
        *by_status.entry(status).or_default() += 1;
        match status {
            StatusCode::CREATED => {
                assert_eq!(body["outcome"], "HELD");
                held_keys.push(
                    body["reservation"]["request_key"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                );
            }
            StatusCode::CONFLICT => assert_eq!(body["outcome"], "SOLD_OUT"),
            other => panic!("unexpected final answer {other}: {body}"),
        }
    }
    println!("2000 buyers / 100 units: {by_status:?}, 503 retries: {retries}");
    assert_eq!(by_status[&StatusCode::CREATED], 100);
    assert_eq!(by_status[&StatusCode::CONFLICT], 1_900);

    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.rows_held), (0, 100, 100));
    let rows = reservation_keys(&db).await;
    held_keys.sort();
    assert_eq!(rows, held_keys, "the rows are exactly the 201 answers");
    api.assert_no_drift().await;
    agent.stop().await;
}

/// Goal: one key sent 32 times at once yields one hold and 31 replays of it.
async fn one_key_thirty_two_times_is_one_hold(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 10})).await;
    let answers = futures_join(32, |_| {
        let api = api.clone();
        async move { api.reserve("same-key", "alice", "drop").await }
    })
    .await;
    let held = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    let replay = answers
        .iter()
        .filter(|(s, b)| *s == StatusCode::OK && b["outcome"] == "REPLAY")
        .count();
    println!("32 requests, one key: {held} HELD, {replay} REPLAY");
    assert_eq!((held, replay), (1, 31));
    for (_, body) in &answers {
        assert_eq!(body["reservation"]["request_key"], "same-key");
        assert_eq!(body["reservation"]["status"], "HELD");
    }
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held), (9, 1));
    agent.stop().await;
}

/// Goal: sixteen keys of one user at once yield one hold and fifteen
/// USER_LIMIT; the same key for another user is KEY_REUSED; one unit taken.
async fn one_user_sixteen_keys_is_one_hold(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 100})).await;
    let answers = futures_join(16, |i| {
        let api = api.clone();
        async move { api.reserve(&format!("bob-{i}"), "bob", "drop").await }
    })
    .await;
    let held = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    let limited = answers
        .iter()
        .filter(|(s, b)| *s == StatusCode::CONFLICT && b["outcome"] == "USER_LIMIT")
        .count();
    println!("16 keys, one user: {held} HELD, {limited} USER_LIMIT");
    assert_eq!((held, limited), (1, 15));

    let winner = answers
        .iter()
        .find(|(s, _)| *s == StatusCode::CREATED)
        .unwrap();
    let key = winner.1["reservation"]["request_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = api.reserve(&key, "mallory", "drop").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("KEY_REUSED"))
    );
    // The same key for another SKU or another quantity is reused too.
    api.put_sku("acme", "other", json!({"total": 5, "max_per_user": 2}))
        .await;
    let (status, body) = api.reserve(&key, "bob", "other").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("KEY_REUSED"))
    );
    let r = api
        .client
        .post(format!("{}/v1/reservations", api.url))
        .bearer_auth(ACME_KEY)
        .json(&json!({"request_key": key, "user_id": "bob", "sku": "drop", "qty": 2}))
        .send()
        .await
        .unwrap();
    // max_per_user of "drop" is 1, so qty 2 is bad input before any lookup.
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        api.reserve("q", "quinn", "other").await.0,
        StatusCode::CREATED
    );
    let r = api
        .client
        .post(format!("{}/v1/reservations", api.url))
        .bearer_auth(ACME_KEY)
        .json(&json!({"request_key": "q", "user_id": "quinn", "sku": "other", "qty": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "same key, other quantity"
    );
    let count = db
        .int("SELECT count(*) FROM reservations WHERE sku = 'other'")
        .await;
    assert_eq!(count, 1, "KEY_REUSED wrote nothing");

    // Once bob's hold is released he may reserve again.
    assert_eq!(api.action(&key, "release").await.0, StatusCode::OK);
    assert_eq!(
        api.reserve("bob-again", "bob", "drop").await.0,
        StatusCode::CREATED
    );

    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.rows_released), (99, 1, 1));
    agent.stop().await;
}

/// Goal: 200 confirms racing the clock passing their expiry each end SOLD
/// or EXPIRED exactly once, the answer matches the row, and only expired
/// units came back.
async fn confirm_racing_expiry_resolves_each_hold_once(db: TestDb) {
    let agent = TestAgent::start_manual(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 200, "hold_ttl_ms": 1000}))
        .await;
    for i in 0..200 {
        assert_eq!(
            api.reserve(&format!("k{i}"), &format!("u{i}"), "drop")
                .await
                .0,
            StatusCode::CREATED
        );
    }
    let clock = agent.clock.clone().unwrap();
    let confirms = tokio::spawn({
        let api = api.clone();
        async move {
            futures_join(200, |i| {
                let api = api.clone();
                async move { (i, api.action(&format!("k{i}"), "confirm").await) }
            })
            .await
        }
    });
    // As soon as the first confirm has committed, move time past every
    // expiry while the rest are still arriving.
    eventually(
        "a first confirm commits",
        std::time::Duration::from_secs(10),
        async || stored(&db, "drop").await.rows_sold > 0,
    )
    .await;
    clock.advance(1_000);
    let answers = confirms.await.unwrap();

    let mut sold = 0;
    let mut expired = 0;
    for (i, (status, body)) in &answers {
        let (_, row) = api.get(&format!("k{i}")).await;
        assert_eq!(
            body["status"], row["status"],
            "answer matches the committed row"
        );
        match (*status, body["status"].as_str()) {
            (StatusCode::OK, Some("SOLD")) => sold += 1,
            (StatusCode::CONFLICT, Some("EXPIRED")) => expired += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    println!("200 confirms racing expiry: {sold} SOLD, {expired} EXPIRED");
    assert_eq!(sold + expired, 200);
    assert!(sold > 0);
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.sold, s.available, s.held), (sold, expired, 0));
    assert_eq!(s.rows_expired, expired);
    agent.stop().await;
}

/// Goal: release twice, and release racing expiry, return the unit once.
async fn release_twice_and_release_racing_expiry_return_once(db: TestDb) {
    let agent = TestAgent::start_manual(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 100, "hold_ttl_ms": 1000}))
        .await;
    for i in 0..100 {
        api.reserve(&format!("k{i}"), &format!("u{i}"), "drop")
            .await;
    }
    // Two concurrent releases of each of the first 50.
    let answers = futures_join(100, |i| {
        let api = api.clone();
        async move { api.action(&format!("k{}", i % 50), "release").await }
    })
    .await;
    assert!(answers
        .iter()
        .all(|(s, b)| *s == StatusCode::OK && b["status"] == "RELEASED"));
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held), (50, 50));

    // Releases of the other 50 racing the clock passing their expiry.
    let clock = agent.clock.clone().unwrap();
    let releases = tokio::spawn({
        let api = api.clone();
        async move {
            futures_join(50, |i| {
                let api = api.clone();
                async move { api.action(&format!("k{}", 50 + i), "release").await }
            })
            .await
        }
    });
    // As soon as the first of them has committed, move time past every
    // expiry while the rest are still arriving.
    eventually(
        "a first release commits",
        std::time::Duration::from_secs(10),
        async || stored(&db, "drop").await.rows_released > 50,
    )
    .await;
    clock.advance(1_000);
    let answers = releases.await.unwrap();
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::OK);
        assert!(
            body["status"] == "RELEASED" || body["status"] == "EXPIRED",
            "{body}"
        );
    }
    // And the owner's expiry afterwards finds nothing left to return.
    eventually(
        "sweep settles",
        std::time::Duration::from_secs(5),
        async || stored(&db, "drop").await.held == 0,
    )
    .await;
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!(
        (s.available, s.held, s.rows_released + s.rows_expired),
        (100, 0, 100)
    );
    agent.stop().await;
}

/// Goal: two expiries of the same holds committing concurrently, and an
/// expiry killed mid-transaction then re-run, return each unit exactly
/// once: the first to commit expires every hold, the other changes no row
/// and is refused whole, as is a re-run.
async fn concurrent_and_killed_sweeps_return_each_unit_once(db: TestDb) {
    let agent = TestAgent::start_manual(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 300, "hold_ttl_ms": 1000}))
        .await;
    for i in 0..300 {
        api.reserve(&format!("k{i}"), &format!("u{i}"), "drop")
            .await;
    }
    let epoch = agent.state.fence().epoch();
    let now = agent.state.now_ms();
    agent.stop().await;

    // An expiry killed halfway: its connection dies before COMMIT.
    db.uncommitted(
        "UPDATE reservations SET status = 'EXPIRED' WHERE status = 'HELD' AND request_key < 'k2'",
    )
    .await;
    let s = stored(&db, "drop").await;
    assert_eq!(
        (s.held, s.rows_expired),
        (300, 0),
        "nothing of the killed expiry is visible"
    );

    // Two expiries of every hold at once, each in its own transaction.
    let (store, _) = open_store(&db).await;
    let expire = |store: Arc<dyn Store>| async move {
        let mut batch = Batch::new(
            Tenant::parse("acme").unwrap(),
            Sku::parse("drop").unwrap(),
            now + 5_000,
        );
        batch.transitions = (0..300)
            .map(|i| {
                let key = RequestKey::parse(&format!("k{i}")).unwrap();
                (key, Qty::ONE, Transition::Expire)
            })
            .collect();
        store.commit(epoch, &batch).await.is_ok()
    };
    let (a, b) = tokio::join!(expire(store.clone()), expire(store.clone()));
    let again = expire(store).await;
    assert!(a != b, "exactly one of the concurrent expiries commits");
    assert!(!again, "a re-run changes no row and is refused");
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.rows_expired), (300, 0, 300));
}
