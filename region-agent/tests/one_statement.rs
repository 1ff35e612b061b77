//! Groups of batches that only insert holds: PostgreSQL commits them as one
//! statement without BEGIN/COMMIT, and they must be judged exactly as the
//! transaction judges them. A batch short of units, or naming a SKU the
//! database lacks, is refused alone and the rest commit; a fenced process
//! writes nothing; a taken key or user is reported per hold and moves no
//! units. SQLite commits the same groups in a transaction and must give
//! the same answers.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::sync::Arc;

use common::*;
use escrow_core::{Qty, RequestKey, Sku, Tenant, UserId};
use region_agent::committer::Committer;
use region_agent::fence::Fence;
use region_agent::store::{Batch, Epoch, NewHold, Store, StoreError};
use serde_json::json;

conformance!(
    a_short_batch_is_refused_alone_and_the_rest_commit,
    holds_for_a_sku_the_database_lacks_are_refused_alone,
    a_fenced_group_writes_nothing,
    a_taken_key_or_user_is_reported_and_moves_no_units,
);

/// A batch of `sku` holding one unit for each `(key, user)`.
fn holds(sku: &str, holds: &[(&str, &str)]) -> Batch {
    let mut batch = Batch::new(Tenant::parse("acme").unwrap(), Sku::parse(sku).unwrap(), 1);
    batch.holds = holds
        .iter()
        .map(|(key, user)| NewHold {
            borrow: None,
            request_key: RequestKey::parse(key).unwrap(),
            user_id: UserId::parse(user).unwrap(),
            qty: Qty::ONE,
            expires_at_ms: 4_000_000_000_000,
        })
        .collect();
    batch
}

/// A store over SKUs of two units each, and the epoch it writes under.
async fn two_units_each(db: &TestDb, skus: &[&str]) -> (Arc<dyn Store>, Epoch) {
    let agent = TestAgent::start(db).await;
    for sku in skus {
        agent.api().put_sku("acme", sku, json!({"total": 2})).await;
    }
    let epoch = agent.state.fence().epoch();
    agent.stop().await;
    (open_store(db).await.0, epoch)
}

/// Every SKU's `(available, held)`, each checked balanced and equal to its rows.
async fn counters(db: &TestDb, skus: &[&str]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for sku in skus {
        let s = stored(db, sku).await;
        assert_balanced(&s);
        out.push((s.available, s.held));
    }
    out
}

/// Goal: through the committer, the holds-only batch whose SKU has too
/// few units is refused alone and the others commit, each in one
/// statement, with counters equal to rows. (That the store names the short
/// batch and writes nothing, `judge.rs` shows on the same kind of group.)
async fn a_short_batch_is_refused_alone_and_the_rest_commit(db: TestDb) {
    let skus = ["a", "b", "c"];
    let (store, epoch) = two_units_each(&db, &skus).await;
    let a = holds("a", &[("a-1", "u1")]);
    let short = holds("b", &[("b-1", "u1"), ("b-2", "u2"), ("b-3", "u3")]);
    let c = holds("c", &[("c-1", "u1"), ("c-2", "u2")]);

    let committer = Committer::spawn(store, Arc::new(Fence::new(epoch)));
    let sent: Vec<_> = [a, short, c]
        .into_iter()
        .map(|batch| {
            let committer = committer.clone();
            tokio::spawn(async move { committer.commit(batch).await })
        })
        .collect();
    let mut answers = Vec::new();
    for answer in sent {
        answers.push(answer.await.unwrap().1);
    }
    assert_eq!(answers[0].as_ref().unwrap().inserted, [true]);
    assert!(
        matches!(answers[1], Err(StoreError::Conflict(_))),
        "{answers:?}"
    );
    assert_eq!(answers[2].as_ref().unwrap().inserted, [true, true]);
    assert_eq!(counters(&db, &skus).await, [(1, 1), (2, 0), (0, 2)]);
    assert_eq!(reservation_keys(&db).await, ["a-1", "c-1", "c-2"]);
    assert_one_statement(&db, "a", &["a-1"]).await;
    assert_one_statement(&db, "c", &["c-1", "c-2"]).await;
}

/// Goal: holds for a SKU with no counter row (memory believes in a SKU
/// the database does not hold) are refused by name, not inserted without
/// counters; the group writes nothing, and without that batch it commits.
async fn holds_for_a_sku_the_database_lacks_are_refused_alone(db: TestDb) {
    let (store, epoch) = two_units_each(&db, &["a"]).await;
    let a = holds("a", &[("a-1", "u1")]);
    let ghost = holds("ghost", &[("ghost-1", "u1")]);

    let failed = store.commit_all(epoch, &[&a, &ghost]).await.unwrap_err();
    assert_eq!(failed.batch, Some(1));
    assert!(matches!(failed.error, StoreError::Conflict(_)));
    assert!(reservation_keys(&db).await.is_empty());
    assert_eq!(counters(&db, &["a"]).await, [(2, 0)]);

    let outcomes = store.commit_all(epoch, &[&a]).await.unwrap();
    assert_eq!(outcomes[0].inserted, [true]);
    assert_eq!(reservation_keys(&db).await, ["a-1"]);
    assert_eq!(counters(&db, &["a"]).await, [(1, 1)]);
    assert_one_statement(&db, "a", &["a-1"]).await;
}

/// Goal: under an epoch a takeover has replaced, a group of holds is
/// refused as fenced, naming no batch, and writes nothing, even when one
/// of its batches is also short of units.
async fn a_fenced_group_writes_nothing(db: TestDb) {
    let skus = ["a", "b"];
    let (store, epoch) = two_units_each(&db, &skus).await;
    let a = holds("a", &[("a-1", "u1")]);
    let short = holds("b", &[("b-1", "u1"), ("b-2", "u2"), ("b-3", "u3")]);
    let old = Epoch(epoch.0 - 1);

    for group in [vec![&a], vec![&a, &short]] {
        let fenced = store.commit_all(old, &group).await.unwrap_err();
        assert!(
            matches!((fenced.batch, &fenced.error), (None, StoreError::Fenced)),
            "{fenced:?}"
        );
        assert!(reservation_keys(&db).await.is_empty());
        assert_eq!(counters(&db, &skus).await, [(2, 0), (2, 0)]);
    }
}

/// Goal: a hold whose key is already stored (a replay), or whose user
/// already holds the SKU, is reported not inserted at its own place in its
/// own batch, and counters move by the inserted units only.
async fn a_taken_key_or_user_is_reported_and_moves_no_units(db: TestDb) {
    let skus = ["a", "c"];
    let (store, epoch) = two_units_each(&db, &skus).await;
    store
        .commit_all(epoch, &[&holds("a", &[("a-1", "u1")])])
        .await
        .unwrap();

    let a = holds("a", &[("a-1", "u1"), ("a-2", "u2"), ("a-3", "u1")]);
    let c = holds("c", &[("c-1", "u1")]);
    let outcomes = store.commit_all(epoch, &[&a, &c]).await.unwrap();
    assert_eq!(outcomes[0].inserted, [false, true, false]);
    assert_eq!(outcomes[1].inserted, [true]);
    assert_eq!(counters(&db, &skus).await, [(0, 2), (1, 1)]);
    assert_eq!(reservation_keys(&db).await, ["a-1", "a-2", "c-1"]);
    assert_one_statement(&db, "a", &["a-2"]).await;
    assert_one_statement(&db, "c", &["c-1"]).await;
}
