//! Process-level failures: kill -9 under load, SIGTERM drain, a client
//! that disconnects, a second agent taking the region, and drift found at
//! start. The first two run the real `region-agent` binary.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use test_support::process::{all_read, server_closed};
use test_support::raw;

conformance!(
    kill_nine_under_load_loses_nothing,
    kill_nine_with_carts_in_flight_leaves_no_half_cart,
    sigterm_drains_in_flight_requests,
    disconnected_client_keeps_its_reservation,
    a_second_agent_fences_the_first,
    drift_found_at_start_stops_only_that_sku,
);

/// A `region-agent` child process.
struct AgentProcess {
    proc: Proc,
    api: Api,
}

impl AgentProcess {
    async fn spawn(db: &TestDb, port: u16) -> Self {
        let proc = Proc::spawn(
            service(env!("CARGO_BIN_EXE_region-agent"), port, db.url())
                .args([
                    "--region",
                    "eu",
                    "--tenant-key",
                    &format!("acme={ACME_KEY}"),
                ])
                .args(["--db-pool-size", "4"]),
        );
        let api = Api::new(&format!("http://127.0.0.1:{port}"));
        wait_ready(&api.url).await;
        Self { proc, api }
    }
}

/// Goal: kill -9 of the agent under load loses no acknowledged hold and
/// takes no unit that was not asked for: after a restart every 201 is
/// there, every unanswered key resolves by retry, and the rows are exactly
/// those answers, with no drift.
async fn kill_nine_under_load_loses_nothing(db: TestDb) {
    let port = free_port();
    let agent = AgentProcess::spawn(&db, port).await;
    let api = agent.api.clone();
    api.put_sku("acme", "drop", json!({"total": 400})).await;

    let acknowledged = Arc::new(AtomicUsize::new(0));
    let mut buyers = Vec::new();
    for i in 0..600 {
        let api = api.clone();
        let acknowledged = acknowledged.clone();
        buyers.push(tokio::spawn(async move {
            let key = format!("key-{i}");
            // Buyers arrive over time so the kill lands mid-stream.
            tokio::time::sleep(Duration::from_micros(500 * i)).await;
            let answer = api.try_reserve(&key, &format!("user-{i}"), "drop").await;
            if matches!(answer, Ok((StatusCode::CREATED, _))) {
                acknowledged.fetch_add(1, Ordering::SeqCst);
            }
            (key, format!("user-{i}"), answer.ok().map(|(s, _)| s))
        }));
    }
    eventually(
        "some holds acknowledged",
        Duration::from_secs(30),
        async || acknowledged.load(Ordering::SeqCst) >= 50,
    )
    .await;
    agent.proc.signal("-KILL");
    let mut answers = Vec::new();
    for b in buyers {
        answers.push(b.await.unwrap());
    }
    drop(agent);

    let restarted = AgentProcess::spawn(&db, port).await;
    let api = restarted.api.clone();
    let mut held = Vec::new();
    let mut unanswered = 0;
    for (key, user, status) in &answers {
        match status {
            Some(StatusCode::CREATED) => {
                let (s, row) = api.get(key).await;
                assert_eq!(
                    (s, row["status"].as_str()),
                    (StatusCode::OK, Some("HELD")),
                    "{key} survived"
                );
                held.push(key.clone());
            }
            Some(StatusCode::CONFLICT) => {}
            _ => {
                unanswered += 1;
                let answer = api.reserve_until_final(key, user, "drop").await;
                match (answer.status, answer.body["outcome"].as_str()) {
                    (StatusCode::CREATED, Some("HELD")) | (StatusCode::OK, Some("REPLAY")) => {
                        held.push(key.clone())
                    }
                    (StatusCode::CONFLICT, Some("SOLD_OUT")) => {}
                    other => panic!("unexpected retry answer {other:?}"),
                }
            }
        }
    }
    println!(
        "kill -9: {} acknowledged before the kill, {unanswered} unanswered then retried, {} holds in all",
        acknowledged.load(Ordering::SeqCst),
        held.len()
    );
    assert!(unanswered > 0, "the kill landed mid-load");
    let rows = reservation_keys(&db).await;
    held.sort();
    assert_eq!(
        rows, held,
        "rows are exactly the acknowledged and replayed holds"
    );
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!(s.held as usize, held.len());

    // The restarted agent routes settlements of keys it loaded at start.
    for key in &held {
        let (status, body) = api.action(key, "confirm").await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::OK, Some("SOLD")),
            "{key}"
        );
    }
    assert_eq!(stored(&db, "drop").await.sold as usize, held.len());
    api.assert_no_drift().await;
}

/// One cart attempt of `key` for `user` (items a, b and c); `None` if
/// the agent could not be reached or did not answer.
async fn try_cart(api: &Api, key: &str, user: &str) -> Option<(StatusCode, serde_json::Value)> {
    let body = json!({"request_key": key, "user_id": user,
                      "items": [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]});
    let answer = client()
        .post(format!("{}/v1/carts", api.url))
        .bearer_auth(ACME_KEY)
        .json(&body)
        .send()
        .await
        .ok()?;
    let status = answer.status();
    Some((status, answer.json().await.unwrap_or_default()))
}

/// Goal: kill -9 of the agent while carts are being held leaves no half
/// cart anywhere: after a restart every acknowledged cart is HELD with all
/// its items, every unanswered key resolves by retry, every item row
/// belongs to a cart that has all of its items, and the counters agree.
async fn kill_nine_with_carts_in_flight_leaves_no_half_cart(db: TestDb) {
    let port = free_port();
    let agent = AgentProcess::spawn(&db, port).await;
    let api = agent.api.clone();
    for (sku, total) in [("a", 400), ("b", 400), ("c", 150)] {
        api.put_sku("acme", sku, json!({ "total": total })).await;
    }
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let mut buyers = Vec::new();
    for i in 0..300 {
        let api = api.clone();
        let acknowledged = acknowledged.clone();
        buyers.push(tokio::spawn(async move {
            let key = format!("cart-{i}");
            tokio::time::sleep(Duration::from_micros(1_000 * i)).await;
            let answer = try_cart(&api, &key, &format!("user-{i}")).await;
            if matches!(answer, Some((StatusCode::CREATED, _))) {
                acknowledged.fetch_add(1, Ordering::SeqCst);
            }
            (key, format!("user-{i}"), answer.map(|(s, _)| s))
        }));
    }
    eventually(
        "some carts acknowledged",
        Duration::from_secs(30),
        async || acknowledged.load(Ordering::SeqCst) >= 30,
    )
    .await;
    agent.proc.signal("-KILL");
    let mut answers = Vec::new();
    for b in buyers {
        answers.push(b.await.unwrap());
    }
    drop(agent);

    let restarted = AgentProcess::spawn(&db, port).await;
    let api = restarted.api.clone();
    let mut held = 0;
    let mut unanswered = 0;
    for (key, user, status) in &answers {
        if *status == Some(StatusCode::CREATED) {
            let (s, cart) = api.buyer_get(&format!("/v1/carts/{key}")).await;
            assert_eq!(
                (s, cart["status"].as_str()),
                (StatusCode::OK, Some("HELD")),
                "{key}"
            );
            assert_eq!(cart["items"].as_array().unwrap().len(), 3, "{key} is whole");
            held += 1;
            continue;
        }
        if *status == Some(StatusCode::CONFLICT) {
            continue;
        }
        unanswered += 1;
        let answer = loop {
            match try_cart(&api, key, user).await {
                Some((StatusCode::SERVICE_UNAVAILABLE, _)) | None => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Some(answer) => break answer,
            }
        };
        match (answer.0, answer.1["outcome"].as_str()) {
            (StatusCode::CREATED, Some("HELD")) | (StatusCode::OK, Some("REPLAY")) => held += 1,
            (StatusCode::CONFLICT, Some("SOLD_OUT")) => {}
            other => panic!("{key}: unexpected retry answer {other:?}"),
        }
    }
    println!(
        "kill -9 with carts: {} acknowledged before the kill, {unanswered} unanswered then retried, {held} carts in all",
        acknowledged.load(Ordering::SeqCst)
    );
    assert!(unanswered > 0, "the kill landed mid-load");
    assert_carts_whole(&db).await;
    assert_eq!(db.int("SELECT count(*) FROM carts").await, held);
    for sku in ["a", "b", "c"] {
        let s = stored(&db, sku).await;
        assert_balanced(&s);
        assert_eq!(s.held, held, "{sku}");
    }
    api.assert_no_drift().await;
}

/// Goal: SIGTERM while requests wait on a commit drains them: each gets
/// its 201, the process then exits 0, and every hold is in the database.
async fn sigterm_drains_in_flight_requests(db: TestDb) {
    let port = free_port();
    let mut agent = AgentProcess::spawn(&db, port).await;
    let api = agent.api.clone();
    api.put_sku("acme", "drop", json!({"total": 100})).await;

    let locker = db.lock_writes().await;
    // Written by hand, so the test knows when each request's bytes are sent.
    let addr = format!("127.0.0.1:{port}");
    let mut buyers = Vec::new();
    for i in 0..20 {
        let request = raw::reserve(&format!("k{i}"), &format!("u{i}"), "drop");
        buyers.push(raw::send(&addr, &request).await);
    }
    // PostgreSQL shows the blocked commit. SQLite shows another process's
    // busy wait to nobody; there the lock alone keeps every batch from
    // committing until it is released.
    if db.backend() == Backend::Postgres {
        db.wait_for_lock_waiter().await;
    }
    // The first batch now waits on the lock. A request whose bytes are
    // still unread when SIGTERM arrives was never in flight and its
    // connection may be closed: signal once the agent has read them all.
    let clients: Vec<u16> = buyers
        .iter()
        .map(|s| s.local_addr().unwrap().port())
        .collect();
    eventually(
        "the agent read every request",
        Duration::from_secs(10),
        async || all_read(port, &clients),
    )
    .await;
    agent.proc.signal("-TERM");
    eventually(
        "the agent stops accepting connections",
        Duration::from_secs(10),
        async || tokio::net::TcpStream::connect(&addr).await.is_err(),
    )
    .await;
    assert!(agent.proc.exited().is_none(), "still draining");
    locker.release().await;

    let mut created = 0;
    for buyer in buyers {
        match raw::status(buyer).await {
            Some(StatusCode::CREATED) => created += 1,
            other => assert_eq!(
                other,
                Some(StatusCode::SERVICE_UNAVAILABLE),
                "only a refusal before writing"
            ),
        }
    }
    let mut exit = None;
    eventually("the agent exits", Duration::from_secs(10), async || {
        exit = agent.proc.exited();
        exit.is_some()
    })
    .await;
    assert!(exit.unwrap().success());
    let rows = db.int("SELECT count(*) FROM reservations").await;
    println!("SIGTERM drain: {created} holds answered 201, {rows} rows");
    assert_eq!(rows, created);
    assert!(created > 0);
    assert_balanced(&stored(&db, "drop").await);
}

/// Goal: a client that sends its request and disconnects before the
/// commit still gets its reservation; it is found by key and a retry is REPLAY.
async fn disconnected_client_keeps_its_reservation(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 5})).await;

    let locker = db.lock_writes().await;

    let addr = api.url.trim_start_matches("http://").to_owned();
    let socket = raw::send(&addr, &raw::reserve("gone", "u", "drop")).await;
    agent.wait_for_blocked_commit(&db).await;
    let client_port = socket.local_addr().unwrap().port();
    drop(socket);
    // The server notices the hang-up and drops the request's future while
    // its batch still waits on the lock.
    let server_port = agent.url.rsplit(':').next().unwrap().parse().unwrap();
    eventually(
        "the agent closes the hung-up connection",
        Duration::from_secs(10),
        async || server_closed(server_port, client_port),
    )
    .await;
    locker.release().await;

    eventually(
        "the reservation is committed",
        Duration::from_secs(10),
        async || api.get("gone").await.0 == StatusCode::OK,
    )
    .await;
    let (_, row) = api.get("gone").await;
    assert_eq!(row["status"], "HELD");
    let (status, body) = api.reserve("gone", "u", "drop").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::OK, Some("REPLAY"))
    );
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!(s.held, 1);
    agent.stop().await;
}

/// Goal: a second agent on the same database and region fences the first:
/// the first can no longer commit anything (503 PAUSED, not ready), the
/// second sells on from the committed state, and nothing is double-spent.
async fn a_second_agent_fences_the_first(db: TestDb) {
    let first = TestAgent::start(&db).await;
    let a = first.api();
    a.put_sku("acme", "drop", json!({"total": 2})).await;
    assert_eq!(a.reserve("k1", "u1", "drop").await.0, StatusCode::CREATED);

    let second = TestAgent::start(&db).await;
    let b = second.api();
    let (status, body) = a.reserve("k2", "u2", "drop").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("PAUSED"))
    );
    assert_eq!(
        a.action("k1", "confirm").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (status, _) = a.put_sku("acme", "drop", json!({"total": 50})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let r = a
        .client
        .get(format!("{}/readyz", a.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);

    assert_eq!(b.reserve("k3", "u3", "drop").await.0, StatusCode::CREATED);
    assert_eq!(b.reserve("k4", "u4", "drop").await.1["outcome"], "SOLD_OUT");
    assert_eq!(b.action("k1", "confirm").await.0, StatusCode::OK);
    let rows = reservation_keys(&db).await;
    assert_eq!(rows, vec!["k1", "k3"]);
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.total, s.sold, s.held, s.available), (2, 1, 1, 0));
    first.stop().await;
    second.stop().await;
}

/// Goal: at start, a SKU whose counters disagree with its rows is stopped
/// (503 PAUSED) and shows in the audit, while other SKUs sell normally.
async fn drift_found_at_start_stops_only_that_sku(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 10})).await;
    api.put_sku("acme", "calm", json!({"total": 10})).await;
    api.reserve("k1", "u1", "drop").await;
    agent.stop().await;
    // Balanced counters that no longer match the rows.
    db.execute(
        "UPDATE sku_stock SET held = held - 1, available = available + 1 WHERE sku = 'drop'",
    )
    .await;

    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    let (status, body) = api.reserve("k2", "u2", "drop").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("PAUSED"))
    );
    assert_eq!(api.reserve("k3", "u3", "calm").await.0, StatusCode::CREATED);
    let (_, audit) = api.admin_get("/v1/admin/audit").await;
    let drop_line = audit["skus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["sku"] == "drop")
        .unwrap();
    assert_eq!(drop_line["rows_drift"], 1);
    assert_eq!(audit["drift_total"], 1);
    let (_, sku) = api.admin_get("/v1/admin/skus/acme/drop").await;
    assert_eq!(sku["halted"], true);
    let rows = db
        .int("SELECT count(*) FROM reservations WHERE sku = 'drop'")
        .await;
    assert_eq!(rows, 1, "nothing sold on the drifted SKU");
    // The SKU that did not drift still balances.
    assert_balanced(&stored(&db, "calm").await);
    agent.stop().await;
}
