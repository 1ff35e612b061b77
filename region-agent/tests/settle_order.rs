//! A batch commits in the order its owner decided it.
//!
//! The owner decides every request of a batch in memory, one after the
//! other, so one key can change twice in one batch: a buyer who sends
//! `extend` and `confirm` for the same hold at the same moment gets the
//! extension and then the sale. The store must commit those transitions in
//! that order; committing them grouped by kind made the extend find a SOLD
//! row, failed the whole batch, answered every request in it 503 PAUSED
//! and made the SKU reload.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::Arc;

use common::*;
use escrow_core::{Qty, RequestKey, Transition, UserId};
use region_agent::store::{Epoch, NewHold, Store, StoreError};
use reqwest::StatusCode;
use serde_json::json;
use test_support::log::Captured;
use tokio::sync::Barrier;

conformance!(
    extend_and_confirm_at_once_never_fail_the_batch,
    one_batch_applies_each_keys_transitions_in_order,
    an_impossible_order_commits_nothing,
);

/// Goal: 300 buyers each sending `extend` and `confirm` for their hold at
/// the same moment, while 600 new buyers reserve, all get a definite
/// answer: no 503, no failed commit, no reload; counters equal rows.
async fn extend_and_confirm_at_once_never_fail_the_batch(db: TestDb) {
    // Warnings, errors, and the owner's "reloaded after a failed commit".
    let (log, _log_guard) = Captured::on_this_thread(&["reload"]);
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    assert_eq!(
        api.put_sku("acme", "drop", json!({"total": 600})).await.0,
        StatusCode::CREATED
    );
    for i in 0..300 {
        let (status, body) = api
            .reserve(&format!("h{i}"), &format!("holder-{i}"), "drop")
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    let start = Arc::new(Barrier::new(300 + 600));
    let pairs: Vec<_> = (0..300)
        .map(|i| {
            let (api, start) = (api.clone(), start.clone());
            tokio::spawn(async move {
                let key = format!("h{i}");
                start.wait().await;
                tokio::join!(api.action(&key, "extend"), api.action(&key, "confirm"))
            })
        })
        .collect();
    let buyers: Vec<_> = (0..600)
        .map(|i| {
            let (api, start) = (api.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                api.reserve(&format!("b{i}"), &format!("buyer-{i}"), "drop")
                    .await
            })
        })
        .collect();

    // Tally everything before asserting, so a failure shows how many
    // answers were wrong and what the agent logged.
    let mut wrong = Vec::new();
    let (mut extended, mut extend_refused) = (0, 0);
    for pair in pairs {
        let ((extend_status, extend), (confirm_status, confirm)) = pair.await.unwrap();
        if (confirm_status, confirm["status"].as_str()) != (StatusCode::OK, Some("SOLD")) {
            wrong.push(format!("confirm {confirm_status} {confirm}"));
        }
        // Decided before the confirm, the extend succeeds; after it, the
        // hold is SOLD and the extend is refused with the row as it is.
        match (extend_status, extend["status"].as_str()) {
            (StatusCode::OK, Some("HELD")) => extended += 1,
            (StatusCode::CONFLICT, Some("SOLD")) => extend_refused += 1,
            _ => wrong.push(format!("extend {extend_status} {extend}")),
        }
    }
    let (mut held, mut sold_out) = (0, 0);
    for buyer in buyers {
        let (status, body) = buyer.await.unwrap();
        match (status, body["outcome"].as_str()) {
            (StatusCode::CREATED, Some("HELD")) => held += 1,
            (StatusCode::CONFLICT, Some("SOLD_OUT")) => sold_out += 1,
            _ => wrong.push(format!("reserve {status} {body}")),
        }
    }
    let logged = log.lines();
    println!(
        "extend+confirm x300: {extended} extended then sold, {extend_refused} sold first; \
         600 buyers: {held} HELD, {sold_out} SOLD_OUT; {} wrong answers, {} log lines",
        wrong.len(),
        logged.len()
    );
    assert!(
        wrong.is_empty(),
        "{} wrong answers: {wrong:#?}",
        wrong.len()
    );
    assert!(
        logged.is_empty(),
        "a commit failed or a SKU reloaded: {logged:#?}"
    );
    assert_eq!((held, sold_out), (300, 300));
    let (_, view) = api.admin_get("/v1/admin/skus/acme/drop").await;
    assert_eq!(
        (&view["halted"], &view["paused"]),
        (&json!(false), &json!(false)),
        "{view}"
    );

    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.sold), (0, 300, 300));
    assert_eq!((s.rows_held, s.rows_sold, s.rows_released), (300, 300, 0));
    let extended_rows = db
        .int("SELECT count(*) FROM reservations WHERE extended")
        .await;
    assert_eq!(extended_rows, extended, "every 200 extend is in its row");
    api.assert_no_drift().await;
    agent.stop().await;
}

/// Goal: within one batch, each key's transitions commit in decision order
/// (extend then confirm, extend then release, an expiry decided by an
/// action) beside the owner's expiry of another due hold at the same
/// instant; a hold not yet due is left alone.
async fn one_batch_applies_each_keys_transitions_in_order(db: TestDb) {
    let (store, epoch) = store_with_sku(&db, 10).await;
    let now = 1_000_000;
    // `due` and `swept` expire at `now`; the others later.
    let holds = [
        ("sold", now + 5_000),
        ("released", now + 5_000),
        ("due", now),
        ("swept", now),
        ("kept", now + 5_000),
    ];
    commit_holds(&*store, epoch, now - 1_000, &holds).await;

    let mut batch = batch_at(now);
    let extend = Transition::Extend {
        expires_at_ms: now + 60_000,
    };
    batch.transitions = vec![
        (key("sold"), Qty::ONE, extend),
        (key("released"), Qty::ONE, extend),
        (key("due"), Qty::ONE, Transition::Expire),
        (key("sold"), Qty::ONE, Transition::Confirm),
        (key("released"), Qty::ONE, Transition::Release),
        (key("swept"), Qty::ONE, Transition::Expire),
    ];
    store.commit(epoch, &batch).await.unwrap();

    let rows = db
        .text_rows(
            "SELECT request_key, status, CASE WHEN extended THEN 'extended' ELSE '-' END \
             FROM reservations ORDER BY request_key",
        )
        .await;
    let rows: Vec<(&str, &str, bool)> = rows
        .iter()
        .map(|row| (row[0].as_str(), row[1].as_str(), row[2] == "extended"))
        .collect();
    assert_eq!(
        rows,
        [
            ("due", "EXPIRED", false),
            ("kept", "HELD", false),
            ("released", "RELEASED", true),
            ("sold", "SOLD", true),
            ("swept", "EXPIRED", false),
        ]
    );
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.sold), (8, 1, 1));
}

/// Goal: a batch whose decisions are impossible in order (confirm then
/// release, release twice) is refused whole: nothing of it is written.
async fn an_impossible_order_commits_nothing(db: TestDb) {
    let (store, epoch) = store_with_sku(&db, 10).await;
    let now = 1_000_000;
    commit_holds(
        &*store,
        epoch,
        now,
        &[("a", now + 5_000), ("b", now + 5_000)],
    )
    .await;
    let before = stored(&db, "drop").await;

    let sequences = [
        [
            (key("a"), Qty::ONE, Transition::Release),
            (key("b"), Qty::ONE, Transition::Confirm),
            (key("b"), Qty::ONE, Transition::Release),
        ],
        [
            (key("b"), Qty::ONE, Transition::Confirm),
            (key("a"), Qty::ONE, Transition::Release),
            (key("a"), Qty::ONE, Transition::Release),
        ],
    ];
    for transitions in sequences {
        let mut batch = batch_at(now + 1);
        batch.transitions = transitions.to_vec();
        let refused = store.commit(epoch, &batch).await;
        assert!(
            matches!(refused, Err(StoreError::Conflict(_))),
            "{transitions:?}: {refused:?}"
        );
        assert_eq!(stored(&db, "drop").await, before, "nothing written");
    }
    assert_balanced(&before);
    assert_eq!((before.available, before.held, before.rows_held), (8, 2, 2));
}

fn key(raw: &str) -> RequestKey {
    RequestKey::parse(raw).unwrap()
}

/// Commits one-unit holds, one user per key, each until its given expiry.
async fn commit_holds(store: &dyn Store, epoch: Epoch, now_ms: u64, holds: &[(&str, u64)]) {
    let mut batch = batch_at(now_ms);
    batch.holds = holds
        .iter()
        .map(|(k, expires_at_ms)| NewHold {
            borrow: None,
            request_key: key(k),
            user_id: UserId::parse(&format!("user-{k}")).unwrap(),
            qty: Qty::ONE,
            expires_at_ms: *expires_at_ms,
        })
        .collect();
    let outcome = store.commit(epoch, &batch).await.unwrap();
    assert!(outcome.inserted.iter().all(|i| *i));
}
