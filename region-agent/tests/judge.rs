//! The database as the judge: a batch that memory got wrong is refused
//! whole by the SQL's own conditions, and units freed by refused holds in a
//! batch still serve the requests that did not fit.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::time::Duration;

use common::*;
use escrow_core::{Qty, RequestKey, Sku, Tenant, Transition, UserId};
use region_agent::store::{Batch, NewHold, StockChange, StoreError};
use reqwest::StatusCode;
use serde_json::json;

conformance!(
    a_wrong_batch_is_refused_whole,
    batches_of_many_skus_share_a_commit_and_fail_alone,
    the_committer_answers_a_failed_batch_alone,
    a_change_to_a_sku_the_database_lacks_is_refused,
    units_freed_in_a_batch_serve_its_overflow
);

fn hold(key: &str, user: &str) -> NewHold {
    NewHold {
        borrow: None,
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

/// Goal: batches of several SKUs commit in one transaction all or
/// nothing, and a failure names the batch whose own writes failed (an
/// oversold batch, a stale transition), so the committer can answer it
/// alone and commit the rest; an old epoch commits none and names none.
async fn batches_of_many_skus_share_a_commit_and_fail_alone(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    for sku in ["a", "b", "c", "d"] {
        agent.api().put_sku("acme", sku, json!({"total": 2})).await;
    }
    let epoch = agent.state.fence().epoch();
    agent.stop().await;
    let (store, _) = open_store(&db).await;
    let batch = |sku: &str, keys: &[&str]| {
        let mut b = Batch::new(Tenant::parse("acme").unwrap(), Sku::parse(sku).unwrap(), 1);
        b.holds = keys
            .iter()
            .map(|k| hold(&format!("{sku}-{k}"), k))
            .collect();
        b
    };
    let a = batch("a", &["u1"]);
    let oversold = batch("b", &["u1", "u2", "u3"]);
    let c = batch("c", &["u1", "u2"]);
    let mut stale = batch("d", &["u1"]);
    stale.transitions = vec![(
        RequestKey::parse("d-never-held").unwrap(),
        Qty::ONE,
        Transition::Confirm,
    )];
    let held = async |db: &TestDb| {
        let mut out = Vec::new();
        for sku in ["a", "b", "c", "d"] {
            let s = stored(db, sku).await;
            assert_balanced(&s);
            assert_eq!(s.held, s.rows_held);
            out.push(s.held);
        }
        out
    };

    let old = region_agent::store::Epoch(epoch.0 - 1);
    let fenced = store.commit_all(old, &[&a, &c]).await.unwrap_err();
    assert!(matches!(
        (fenced.batch, fenced.error),
        (None, StoreError::Fenced)
    ));

    let failed = store
        .commit_all(epoch, &[&a, &oversold, &c])
        .await
        .unwrap_err();
    assert_eq!(failed.batch, Some(1));
    assert!(matches!(failed.error, StoreError::Conflict(_)));
    let failed = store
        .commit_all(epoch, &[&a, &c, &stale])
        .await
        .unwrap_err();
    assert_eq!(failed.batch, Some(2));
    assert_eq!(
        held(&db).await,
        [0, 0, 0, 0],
        "a failed transaction wrote nothing"
    );

    let outcomes = store.commit_all(epoch, &[&a, &c]).await.unwrap();
    assert_eq!(outcomes[0].inserted, [true]);
    assert_eq!(outcomes[1].inserted, [true, true]);
    assert_eq!(held(&db).await, [1, 0, 2, 0]);
    // Holds only: PostgreSQL wrote them without a transaction around.
    assert_one_statement(&db, "a", &["a-u1"]).await;
    assert_one_statement(&db, "c", &["c-u1", "c-u2"]).await;

    // Every batch's transitions of a kind are one statement for the group:
    // a stale one still names its own batch, not the first, and the rest
    // then commit, each batch's counters moving by its own rows.
    let settle = |sku: &str, key: &str, change: Transition| {
        let mut b = Batch::new(Tenant::parse("acme").unwrap(), Sku::parse(sku).unwrap(), 2);
        b.transitions = vec![(RequestKey::parse(key).unwrap(), Qty::ONE, change)];
        b
    };
    let confirm_a = settle("a", "a-u1", Transition::Confirm);
    let confirm_c = settle("c", "c-u1", Transition::Confirm);
    let release_c = settle("c", "c-u2", Transition::Release);
    let stale_c = settle("c", "c-never-held", Transition::Release);
    let failed = store
        .commit_all(epoch, &[&confirm_a, &stale_c, &confirm_c])
        .await
        .unwrap_err();
    assert_eq!(failed.batch, Some(1));
    assert_eq!(held(&db).await, [1, 0, 2, 0], "nothing of the group");
    store
        .commit_all(epoch, &[&confirm_a, &confirm_c, &release_c])
        .await
        .unwrap();
    assert_eq!(held(&db).await, [0, 0, 0, 0]);
    let (a, c) = (stored(&db, "a").await, stored(&db, "c").await);
    assert_eq!((a.sold, a.rows_sold, a.available), (1, 1, 1));
    assert_eq!(
        (c.sold, c.rows_sold, c.rows_released, c.available),
        (1, 1, 1, 1)
    );
}

/// Goal: through the committer, batches of many SKUs sent at once are
/// each answered for themselves however they were grouped: the oversold
/// and the stale batches fail with a conflict and write nothing, every
/// other batch commits, and each owner gets its own batch back.
async fn the_committer_answers_a_failed_batch_alone(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    let skus: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    for sku in &skus {
        agent.api().put_sku("acme", sku, json!({"total": 2})).await;
    }
    let fence = std::sync::Arc::new(region_agent::fence::Fence::new(agent.state.fence().epoch()));
    agent.stop().await;
    let (store, _) = open_store(&db).await;
    let committer = region_agent::committer::Committer::spawn(store, fence);
    let batches = skus.iter().enumerate().map(|(i, sku)| {
        let mut b = Batch::new(Tenant::parse("acme").unwrap(), Sku::parse(sku).unwrap(), 1);
        let holds = if i % 4 == 1 { 3 } else { 1 };
        b.holds = (0..holds)
            .map(|h| hold(&format!("{sku}-{h}"), &format!("u{h}")))
            .collect();
        if i % 4 == 2 {
            b.transitions = vec![(
                RequestKey::parse(&format!("{sku}-never-held")).unwrap(),
                Qty::ONE,
                Transition::Confirm,
            )];
        }
        b
    });
    let sent: Vec<_> = batches
        .map(|b| {
            let committer = committer.clone();
            tokio::spawn(async move { committer.commit(b).await })
        })
        .collect();
    for (i, answer) in sent.into_iter().enumerate() {
        let (batch, outcome) = answer.await.unwrap();
        let sku = &skus[i];
        assert_eq!(
            batch.sku.as_str(),
            sku,
            "each owner gets its own batch back"
        );
        let s = stored(&db, sku).await;
        assert_balanced(&s);
        if i % 4 == 1 || i % 4 == 2 {
            assert!(
                matches!(outcome, Err(StoreError::Conflict(_))),
                "{sku}: {outcome:?}"
            );
            assert_eq!((s.held, s.rows_held), (0, 0), "{sku}");
        } else {
            assert!(outcome.is_ok(), "{sku}: {outcome:?}");
            assert_eq!((s.held, s.rows_held), (1, 1), "{sku}");
        }
    }
}

/// Goal: a settings, mode or pause change is judged by its row count like
/// every other write: for a SKU the database does not hold (memory and
/// database disagree) the batch fails instead of committing nothing.
async fn a_change_to_a_sku_the_database_lacks_is_refused(db: TestDb) {
    let agent = TestAgent::start(&db).await;
    agent
        .api()
        .put_sku("acme", "real", json!({"total": 1}))
        .await;
    let epoch = agent.state.fence().epoch();
    agent.stop().await;
    let (store, _) = open_store(&db).await;
    let changes = [
        StockChange::Pause(true),
        StockChange::Mode(escrow_core::Mode::Central),
        StockChange::Settings(escrow_core::SkuSettings::default()),
    ];
    for change in changes {
        let mut ghost = Batch::new(
            Tenant::parse("acme").unwrap(),
            Sku::parse("ghost").unwrap(),
            1,
        );
        ghost.changes = vec![change];
        assert!(
            matches!(
                store.commit(epoch, &ghost).await,
                Err(StoreError::Conflict(_))
            ),
            "{change:?}"
        );
        let mut real = Batch::new(
            Tenant::parse("acme").unwrap(),
            Sku::parse("real").unwrap(),
            1,
        );
        real.changes = vec![change];
        store.commit(epoch, &real).await.unwrap();
    }
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
    let (locker, blocker) = agent.reserve_held_at_commit(&db, "k9", "u9", "drop").await;
    let repeat_user = api.spawn_reserve("k1", "u0", "drop");
    let handle = agent.owner("acme", "drop");
    let capacity = handle.queue.capacity();
    eventually(
        "the first request is queued",
        Duration::from_secs(10),
        async || handle.queue.capacity() < capacity,
    )
    .await;
    let newcomer = api.spawn_reserve("k2", "u2", "drop");
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
