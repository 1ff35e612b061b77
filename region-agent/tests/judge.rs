//! The database as the judge: a batch that memory got wrong is refused
//! whole by the SQL's own conditions, and units freed by refused holds in a
//! batch still serve the requests that did not fit.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use escrow_core::{Qty, RequestKey, Sku, Tenant, Transition, UserId};
use region_agent::store::{Batch, NewHold, StoreError};
use reqwest::StatusCode;
use serde_json::json;

conformance!(
    a_wrong_batch_is_refused_whole,
    units_freed_in_a_batch_serve_its_overflow
);

fn hold(key: &str, user: &str) -> NewHold {
    NewHold {
        request_key: RequestKey::parse(key).unwrap(),
        user_id: UserId::parse(user).unwrap(),
        qty: Qty::ONE,
        expires_at_ms: 4_000_000_000_000,
    }
}

/// Goal: holds for more units than are available, or a transition whose
/// precondition no longer holds, make the whole batch fail with nothing
/// written, whatever the caller believed.
async fn a_wrong_batch_is_refused_whole(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    agent
        .api()
        .put_sku("acme", "drop", json!({"total": 2}))
        .await;
    let epoch = agent.state.fence().epoch();
    agent.stop().await;
    let (store, _) = open_store(&db).await;
    let batch = |now| {
        Batch::new(
            Tenant::parse("acme").unwrap(),
            Sku::parse("drop").unwrap(),
            now,
        )
    };

    let mut oversell = batch(1);
    oversell.holds = vec![hold("a", "ua"), hold("b", "ub"), hold("c", "uc")];
    assert!(matches!(
        store.commit(epoch, &oversell).await,
        Err(StoreError::Conflict(_))
    ));
    let s = stored(&db, "drop").await;
    assert_eq!(
        (s.available, s.held, s.rows_held),
        (2, 0, 0),
        "nothing of the refused batch stayed"
    );

    let mut ok = batch(1);
    ok.holds = vec![hold("a", "ua")];
    store.commit(epoch, &ok).await.unwrap();
    let mut twice = batch(2);
    twice.transitions = vec![(
        RequestKey::parse("a").unwrap(),
        Qty::ONE,
        Transition::Confirm,
    )];
    store.commit(epoch, &twice).await.unwrap();
    // Confirming again (memory thinks it is still HELD) changes no row: refused.
    assert!(matches!(
        store.commit(epoch, &twice).await,
        Err(StoreError::Conflict(_))
    ));
    let mut release_sold = batch(3);
    release_sold.transitions = vec![(
        RequestKey::parse("a").unwrap(),
        Qty::ONE,
        Transition::Release,
    )];
    assert!(matches!(
        store.commit(epoch, &release_sold).await,
        Err(StoreError::Conflict(_))
    ));
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.sold), (1, 0, 1));

    // An old epoch writes nothing at all.
    let mut stale = batch(4);
    stale.holds = vec![hold("z", "uz")];
    let old = region_agent::store::Epoch(epoch.0 - 1);
    assert!(matches!(
        store.commit(old, &stale).await,
        Err(StoreError::Fenced)
    ));
    assert_eq!(stored(&db, "drop").await.available, 1);
}

/// Goal: when a hold planned in a batch turns out to be a per-user-limit
/// hit, its unit still serves a request of the same batch that did not
/// fit, instead of that buyer hearing SOLD_OUT while a unit is free.
async fn units_freed_in_a_batch_serve_its_overflow(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let api = agent.api();
    api.put_sku("acme", "drop", json!({"total": 3})).await;
    assert_eq!(api.reserve("k0", "u0", "drop").await.0, StatusCode::CREATED);

    // Hold the owner on a commit so the next two requests share a batch.
    let locker = db.lock_writes().await;
    let blocker = tokio::spawn({
        let api = api.clone();
        async move { api.reserve("k9", "u9", "drop").await }
    });
    agent.wait_for_blocked_commit(&db).await;
    let repeat_user = tokio::spawn({
        let api = api.clone();
        async move { api.reserve("k1", "u0", "drop").await }
    });
    let handle = agent
        .state
        .registry()
        .get(
            &Tenant::parse("acme").unwrap(),
            &Sku::parse("drop").unwrap(),
        )
        .unwrap();
    let capacity = handle.queue.capacity();
    eventually(
        "the first request is queued",
        Duration::from_secs(10),
        async || handle.queue.capacity() < capacity,
    )
    .await;
    let newcomer = tokio::spawn({
        let api = api.clone();
        async move { api.reserve("k2", "u2", "drop").await }
    });
    eventually("both are queued", Duration::from_secs(10), async || {
        handle.queue.capacity() < capacity - 1
    })
    .await;
    drop(handle);
    locker.release().await;

    assert_eq!(blocker.await.unwrap().0, StatusCode::CREATED);
    let (status, body) = repeat_user.await.unwrap();
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::CONFLICT, Some("USER_LIMIT"))
    );
    let (status, body) = newcomer.await.unwrap();
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::CREATED, Some("HELD")),
        "{body}"
    );
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held), (0, 3));
    agent.stop().await;
}
