//! Transfers with the coordinator at the store: a grant is credited once
//! however often it is delivered, a return is debited together with its
//! outbox row, and both stay visible to the sync until confirmed. The
//! multi-region tests in `coordinator/tests/` show the same through real
//! processes on PostgreSQL; these pin the store's part on both backends.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;
use escrow_core::protocol::TransferMsg;
use escrow_core::{Sku, Tenant, TransferId};
use region_agent::store::StoreError;

conformance!(
    a_grant_is_credited_once_and_a_return_debited_with_its_outbox_row,
    a_return_beyond_available_commits_nothing,
);

fn transfer(id: &str, units: u64) -> TransferMsg {
    TransferMsg {
        id: TransferId::parse(id).unwrap(),
        tenant: Tenant::parse("acme").unwrap(),
        sku: Sku::parse("drop").unwrap(),
        units,
    }
}

/// Goal: the same grant delivered in three batches (twice in one) adds its
/// units once; a return leaves available and enters the outbox in the same
/// commit; the snapshot shows both until the coordinator confirms them,
/// and counters equal rows throughout.
async fn a_grant_is_credited_once_and_a_return_debited_with_its_outbox_row(db: TestDb) {
    let (store, epoch) = store_with_sku(&db, 0).await;

    let mut first = batch_at(1_000);
    first.grants = vec![transfer("g1", 30), transfer("g1", 30)];
    let outcome = store.commit(epoch, &first).await.unwrap();
    assert_eq!(outcome.applied_grants, ["g1"]);
    let mut again = batch_at(2_000);
    again.grants = vec![transfer("g1", 30), transfer("g2", 5)];
    let outcome = store.commit(epoch, &again).await.unwrap();
    assert_eq!(outcome.applied_grants, ["g2"], "g1 was credited already");
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.total), (35, 35));

    let mut return_units = batch_at(3_000);
    return_units.returns = vec![transfer("r1", 10)];
    store.commit(epoch, &return_units).await.unwrap();
    let snapshot = store.sync_snapshot().await.unwrap();
    assert_eq!(snapshot.unconfirmed_grants, ["g1", "g2"]);
    assert_eq!(snapshot.pending_returns, [transfer("r1", 10)]);
    let (_, _, ledger) = &snapshot.skus[0];
    assert_eq!(
        (ledger.available, ledger.received, ledger.returned),
        (25, 35, 10),
        "the snapshot's counters already count the debited return"
    );
    // The same return id again is a second return, which the outbox refuses.
    assert!(store.commit(epoch, &return_units).await.is_err());

    store
        .confirm_grants(&[TransferId::parse("g1").unwrap()])
        .await
        .unwrap();
    store
        .forget_returns(&[TransferId::parse("r1").unwrap()])
        .await
        .unwrap();
    let snapshot = store.sync_snapshot().await.unwrap();
    assert_eq!(snapshot.unconfirmed_grants, ["g2"]);
    assert!(snapshot.pending_returns.is_empty());
    let provenance = store.provenance().await.unwrap();
    assert!(provenance.has_grants);
    assert!(provenance.not_granted.is_empty(), "{provenance:?}");

    assert_eq!(
        db.int("SELECT count(*) FROM applied_grants").await,
        2,
        "one row per grant id"
    );
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.held, s.sold, s.total), (25, 0, 0, 25));
}

/// Goal: a return of more units than are available is refused whole by the
/// counters' CHECK constraints: no outbox row, no counter moved.
async fn a_return_beyond_available_commits_nothing(db: TestDb) {
    let (store, epoch) = store_with_sku(&db, 0).await;
    let mut grant = batch_at(1_000);
    grant.grants = vec![transfer("g1", 3)];
    store.commit(epoch, &grant).await.unwrap();

    let mut too_much = batch_at(2_000);
    too_much.returns = vec![transfer("r1", 4)];
    assert!(matches!(
        store.commit(epoch, &too_much).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(db.int("SELECT count(*) FROM outbox_returns").await, 0);
    let s = stored(&db, "drop").await;
    assert_balanced(&s);
    assert_eq!((s.available, s.total), (3, 3));
}
