//! The per-user limit across regions (`"user_limit_scope": "global"`)
//! against a real coordinator and three real agents, each on its own
//! database: one user racing every region never holds more than one
//! reservation, a release in one region frees the place in another, a
//! region cut off mid-race never lets anyone over the limit, and the
//! scope is chosen when a SKU is created. Each test ends with the books
//! balanced.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

coordinator_tests!(
    one_user_racing_every_region_holds_one,
    a_release_frees_the_place_in_another_region,
    a_black_holed_region_lets_nobody_over_the_limit,
    a_faulty_wire_lets_nobody_over_the_limit,
    a_cart_away_from_home_borrows_its_items_places,
    the_scope_is_chosen_when_a_sku_is_created,
);

/// Keys each user sends to each region at once.
const KEYS_PER_REGION: usize = 4;

/// A global SKU with plenty of units in every region, its grants arrived.
async fn global_sku(c: &Cluster, sku: &str) {
    let (status, body) = c
        .put_sku(
            sku,
            json!({"total": 600, "regions": {"eu": 1, "us": 1, "ap": 1},
                   "user_limit_scope": "global"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["user_limit_scope"], "global", "{body}");
    c.grants_delivered(sku).await;
}

/// Every user of `users` sends [`KEYS_PER_REGION`] keys to every region at
/// once, each retried on 503 until it is answered otherwise (at most
/// `patience`); the final answers, by (region, key).
async fn race(
    c: &Cluster,
    sku: &str,
    users: &[String],
    patience: Duration,
) -> BTreeMap<(usize, String), (StatusCode, Value)> {
    let mut tasks = Vec::new();
    for user in users {
        for (region, name) in REGIONS.iter().enumerate() {
            for k in 0..KEYS_PER_REGION {
                let buyer = c.agents[region].buyer();
                let (user, sku) = (user.clone(), sku.to_owned());
                let key = format!("{user}-{name}-{k}");
                tasks.push(tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    loop {
                        let (status, body) = buyer.reserve(&key, &user, &sku).await;
                        if status != StatusCode::SERVICE_UNAVAILABLE || started.elapsed() > patience
                        {
                            return ((region, key), (status, body));
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }));
            }
        }
    }
    let mut answers = BTreeMap::new();
    for task in tasks {
        let (at, answer) = task.await.unwrap();
        answers.insert(at, answer);
    }
    answers
}

/// The keys among `answers` whose reservation is HELD now, read back from
/// the region that answered, by user.
async fn held_now(
    c: &Cluster,
    answers: &BTreeMap<(usize, String), (StatusCode, Value)>,
) -> BTreeMap<String, Vec<String>> {
    let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (region, key) in answers.keys() {
        let (status, body) = c.agents[*region].buyer().get(key).await;
        if status == StatusCode::OK && body["status"] == "HELD" {
            let user = body["user_id"].as_str().unwrap().to_owned();
            held.entry(user)
                .or_default()
                .push(format!("{}:{key}", REGIONS[*region]));
        }
    }
    held
}

/// Goal: a user racing all three regions with twelve keys at once for a
/// `global` SKU with `max_per_user` 1 is answered 201 exactly once;
/// every other key hears USER_LIMIT, nothing is held twice, and the books
/// balance. Users are spread over the three home regions by their ids.
async fn one_user_racing_every_region_holds_one(db: TestDb) {
    let c = cluster(&db, None).await;
    global_sku(&c, "limited").await;
    let users: Vec<String> = (0..9).map(|n| format!("u{n}")).collect();
    let answers = race(&c, "limited", &users, Duration::from_secs(30)).await;
    for user in &users {
        let mine: Vec<_> = answers
            .iter()
            .filter(|((_, key), _)| key.starts_with(&format!("{user}-")))
            .collect();
        let held = mine
            .iter()
            .filter(|(_, (status, _))| *status == StatusCode::CREATED)
            .count();
        assert_eq!(held, 1, "{user} holds exactly one: {mine:?}");
        for (at, (status, body)) in &mine {
            assert!(
                *status == StatusCode::CREATED
                    || (*status == StatusCode::CONFLICT && body["outcome"] == "USER_LIMIT"),
                "{at:?}: {status} {body}"
            );
        }
    }
    let held = held_now(&c, &answers).await;
    assert_eq!(held.len(), users.len(), "{held:?}");
    assert!(held.values().all(|keys| keys.len() == 1), "{held:?}");
    c.admin.assert_no_drift().await;
    c.stop().await;
}

/// Goal: a user holding the SKU in one region is refused in another until
/// the hold is released; after the release the place comes home and the
/// user holds in the other region (within seconds), still one in all.
async fn a_release_frees_the_place_in_another_region(db: TestDb) {
    let c = cluster(&db, None).await;
    global_sku(&c, "limited").await;
    for user in ["eu:buyer", "us:buyer", "ap:buyer", "anyone"] {
        let first = c.agents[0].buyer();
        let other = c.agents[2].buyer();
        let key = format!("{user}-first").replace(':', ".");
        let (status, body) = first.reserve(&key, user, "limited").await;
        assert_eq!(status, StatusCode::CREATED, "{user}: {body}");
        let second = format!("{user}-second").replace(':', ".");
        let (status, body) = other.reserve(&second, user, "limited").await;
        assert_eq!(status, StatusCode::CONFLICT, "{user}: {body}");
        assert_eq!(body["outcome"], "USER_LIMIT", "{user}: {body}");
        let (status, body) = first.action(&key, "release").await;
        assert_eq!(status, StatusCode::OK, "{user}: {body}");
        let mut outcome = Value::Null;
        eventually(
            &format!("{user}'s released place is taken in another region"),
            Duration::from_secs(20),
            async || {
                let (status, body) = other.reserve(&second, user, "limited").await;
                outcome = body;
                status == StatusCode::CREATED || status == StatusCode::OK
            },
        )
        .await;
        assert_eq!(
            outcome["reservation"]["status"], "HELD",
            "{user}: {outcome}"
        );
        let (status, body) = first
            .reserve(&format!("{key}-again"), user, "limited")
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{user}: {body}");
    }
    c.admin.assert_no_drift().await;
    c.stop().await;
}

/// Goal: with ap's link to the coordinator black-holed in the middle of a
/// race, no user holds more than one reservation anywhere: a request that
/// needs the cut-off region waits or is answered 503 PAUSED, never held
/// over the limit. Once the link is back, places borrowed for requests
/// that gave up go home: every user comes to hold exactly one, and the
/// books balance.
async fn a_black_holed_region_lets_nobody_over_the_limit(db: TestDb) {
    let c = cluster(&db, None).await;
    global_sku(&c, "limited").await;
    let users: Vec<String> = (0..12).map(|n| format!("w{n}")).collect();
    let ap = c.agents[2].wire.clone();
    let cut = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        ap.black_hole.store(true, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(3)).await;
        ap.black_hole.store(false, Ordering::Relaxed);
    });
    let answers = race(&c, "limited", &users, Duration::from_secs(2)).await;
    cut.await.unwrap();
    for ((region, key), (status, body)) in &answers {
        assert!(
            *status == StatusCode::CREATED
                || *status == StatusCode::SERVICE_UNAVAILABLE
                || (*status == StatusCode::CONFLICT && body["outcome"] == "USER_LIMIT"),
            "{}:{key}: {status} {body}",
            REGIONS[*region]
        );
    }
    assert_at_most_one_each(&users, &answers);
    every_user_comes_to_hold_one(&c, &users, answers).await;
    c.admin.assert_no_drift().await;
    c.stop().await;
}

/// Goal: with every sync duplicated, delayed, reordered or its answer
/// lost at random (the fault wire of `multi_region.rs`), a race of every
/// user over every region still ends with exactly one hold per user, and
/// the books balance.
async fn a_faulty_wire_lets_nobody_over_the_limit(db: TestDb) {
    let c = cluster(&db, Some(0x5eed)).await;
    global_sku(&c, "limited").await;
    let users: Vec<String> = (0..9).map(|n| format!("f{n}")).collect();
    let answers = race(&c, "limited", &users, Duration::from_secs(30)).await;
    assert_at_most_one_each(&users, &answers);
    every_user_comes_to_hold_one(&c, &users, answers).await;
    c.admin.assert_no_drift().await;
    c.stop().await;
}

/// Asserts no user of `users` was answered 201 twice in `answers`.
fn assert_at_most_one_each(
    users: &[String],
    answers: &BTreeMap<(usize, String), (StatusCode, Value)>,
) {
    for user in users {
        let created = answers
            .iter()
            .filter(|((_, key), (status, _))| {
                key.starts_with(&format!("{user}-")) && *status == StatusCode::CREATED
            })
            .count();
        assert!(created <= 1, "{user} was answered HELD {created} times");
    }
}

/// After a race whose `answers` may have left users with nothing (their
/// place borrowed for a request that gave up, on its way home): every user
/// comes to hold exactly one reservation within seconds, so no place is
/// stranded; then the books settle.
async fn every_user_comes_to_hold_one(
    c: &Cluster,
    users: &[String],
    mut answers: BTreeMap<(usize, String), (StatusCode, Value)>,
) {
    let held = held_now(c, &answers).await;
    assert!(held.values().all(|keys| keys.len() == 1), "{held:?}");
    let eu = c.agents[0].buyer();
    for user in users.iter().filter(|u| !held.contains_key(*u)) {
        let key = format!("{user}-after");
        let mut last = (StatusCode::OK, Value::Null);
        eventually(
            &format!("{user}'s place is free again"),
            Duration::from_secs(20),
            async || {
                last = eu.reserve(&key, user, "limited").await;
                last.0 == StatusCode::CREATED
            },
        )
        .await;
        answers.insert((0, key), last);
    }
    let held = held_now(c, &answers).await;
    assert_eq!(held.len(), users.len(), "{held:?}");
    assert!(held.values().all(|keys| keys.len() == 1), "{held:?}");
    settled_audit(&c.admin, Duration::from_secs(30)).await;
}

/// Goal: a cart held away from its user's home borrows the place of its
/// global item (the user's home then refuses them that SKU), keeps it
/// while held, and gives it back when released; its other item, of a
/// `region` SKU, never asks anyone.
async fn a_cart_away_from_home_borrows_its_items_places(db: TestDb) {
    let c = cluster(&db, None).await;
    global_sku(&c, "limited").await;
    let (status, body) = c
        .put_sku(
            "plain",
            json!({"total": 30, "regions": {"eu": 1, "us": 1, "ap": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    c.grants_delivered("plain").await;
    let (eu, us) = (c.agents[0].buyer(), c.agents[1].buyer());
    let cart = json!({"request_key": "cart-1", "user_id": "us:7",
                      "items": [{"sku": "limited"}, {"sku": "plain"}]});
    let (status, body) = eu.buyer_post("/v1/carts", cart.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = eu.buyer_post("/v1/carts", cart).await;
    assert_eq!(status, StatusCode::OK, "a replay: {body}");
    let (status, body) = us.reserve("home-1", "us:7", "limited").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["outcome"], "USER_LIMIT");
    let (status, body) = us.reserve("home-plain", "us:7", "plain").await;
    assert_eq!(status, StatusCode::CREATED, "a region SKU: {body}");
    let (status, body) = eu.buyer_post("/v1/carts/cart-1/release", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    eventually(
        "the cart's borrowed place is home again",
        Duration::from_secs(20),
        async || us.reserve("home-1", "us:7", "limited").await.0 == StatusCode::CREATED,
    )
    .await;
    c.admin.assert_no_drift().await;
    c.stop().await;
}

/// Goal: a SKU's scope is chosen when it is created: another value later
/// is 409 and changes nothing, a value other than `region` or `global` is
/// 400, the default is `region`, and a global SKU cannot gain a region.
async fn the_scope_is_chosen_when_a_sku_is_created(db: TestDb) {
    let c = cluster(&db, None).await;
    let (status, body) = c
        .put_sku("plain", json!({"total": 10, "regions": {"eu": 1, "us": 1}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["user_limit_scope"], "region");
    let (status, body) = c
        .put_sku("plain", json!({"total": 10, "user_limit_scope": "global"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = c
        .put_sku("odd", json!({"total": 10, "user_limit_scope": "GLOBAL"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = c
        .put_sku(
            "limited",
            json!({"total": 10, "regions": {"eu": 1, "us": 1}, "user_limit_scope": "global"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = c
        .put_sku("limited", json!({"total": 10, "regions": {"ap": 1}}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = c
        .put_sku(
            "limited",
            json!({"total": 12, "regions": {"eu": 2, "us": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        c.admin.admin_sku("acme", "limited").await["user_limit_scope"],
        "global"
    );
    c.admin.assert_no_drift().await;
    c.stop().await;
}
