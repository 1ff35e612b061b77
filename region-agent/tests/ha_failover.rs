//! A region's database under a real HA manager: `scripts/ha-region` starts
//! a pg_auto_failover monitor and three nodes (a primary, two standbys,
//! every commit confirmed by one of them); the agent is given the three
//! hosts. Under a sale the primary's machine dies (its keeper and
//! PostgreSQL killed with -9); the monitor promotes a standby by itself and
//! the agent follows. The same when the primary's machine freezes (its
//! processes stopped, its connections open and silent). Every acknowledged
//! hold is on the new primary, the counters agree with the rows, and
//! selling resumes. PostgreSQL and pg_auto_failover only.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::time::{Duration, Instant};

use test_support::ha_region::HaRegion;
use test_support::history::History;
use test_support::{eventually, selling_agent};

/// Goal: the HA manager, not a person, fails the region's database over.
/// 100 holds; the primary's machine dies; 100 buyers reserve while the
/// monitor notices and promotes a standby; every refused key is retried
/// and 100 more come: every 201 is readable afterwards, the counters
/// equal the rows, and a standby other than the dead node is the primary.
/// The dead machine, started again, rejoins as a standby and takes none of
/// the agent's writes.
#[tokio::test(flavor = "multi_thread")]
async fn the_ha_manager_fails_over_and_no_acknowledged_hold_is_lost() {
    let Some(region) = HaRegion::start_or_skip("the test") else {
        return;
    };
    let (_agent, api) = selling_agent(env!("CARGO_BIN_EXE_region-agent"), region.url()).await;

    let history = History::new();
    history
        .reserve_many(&api, "eu", "before", 100, "drop")
        .await;
    let dead = region.primary().await.expect("the formation has a primary");
    let died = Instant::now();
    region.kill_node(dead);
    history
        .reserve_many(&api, "eu", "failing-over", 100, "drop")
        .await;
    eventually(
        "a standby is promoted",
        Duration::from_secs(60),
        async || region.primary().await.is_some_and(|p| p != dead),
    )
    .await;
    let promoted = died.elapsed();
    history.recover(&api, "drop", Duration::from_secs(30)).await;
    eprintln!(
        "node{dead} died; a standby was primary {promoted:.1?} later; the agent sold again {:.1?} after the death",
        died.elapsed()
    );
    // The dead machine comes back: it rejoins as a standby, never as a
    // second primary taking the agent's writes.
    region.restart_node(dead);
    eventually(
        "the old primary rejoins as a standby",
        Duration::from_secs(60),
        async || region.in_recovery(dead).await == Some(true),
    )
    .await;
    history.reserve_many(&api, "eu", "after", 100, "drop").await;
    assert_eq!(
        region.in_recovery(dead).await,
        Some(true),
        "node{dead} stays a standby"
    );
    assert_ne!(region.primary().await, Some(dead));

    // Held: 100 before, the probe, the 100 during the failover (each
    // retried until held) and the 100 after.
    history
        .check_one_region(
            &api,
            100 + 1 + 100 + 100,
            Duration::from_secs(30),
            "the primary's machine killed after 100 holds; pg_auto_failover promotes a standby",
        )
        .await;
}

/// Goal: a primary whose machine freezes (SIGSTOP: connections stay open,
/// nothing answers, no error ever comes) does not stall the agent. 100
/// holds; the primary freezes; 100 buyers reserve: a commit in flight gets
/// no answer, its outcome is settled on the standby the monitor promotes
/// (HELD if its row is there), and the agent sells on the new primary. The
/// frozen machine then runs again and rejoins as a standby, taking none
/// of the agent's writes. Every 201 is readable afterwards and the
/// counters equal the rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_primary_does_not_stall_the_agent() {
    let Some(region) = HaRegion::start_or_skip("the test") else {
        return;
    };
    let (_agent, api) = selling_agent(env!("CARGO_BIN_EXE_region-agent"), region.url()).await;

    let history = History::new();
    history
        .reserve_many(&api, "eu", "before", 100, "drop")
        .await;
    let frozen = region.primary().await.expect("the formation has a primary");
    let froze = Instant::now();
    region.freeze_node(frozen);
    history
        .reserve_many(&api, "eu", "frozen", 100, "drop")
        .await;
    eventually(
        "a standby is promoted",
        Duration::from_secs(60),
        async || region.primary().await.is_some_and(|p| p != frozen),
    )
    .await;
    let promoted = froze.elapsed();
    history.recover(&api, "drop", Duration::from_secs(30)).await;
    eprintln!(
        "node{frozen} froze; a standby was primary {promoted:.1?} later; the agent sold again {:.1?} after the freeze",
        froze.elapsed()
    );
    region.thaw_node(frozen);
    eventually(
        "the thawed primary rejoins as a standby",
        Duration::from_secs(90),
        async || region.in_recovery(frozen).await == Some(true),
    )
    .await;
    history.reserve_many(&api, "eu", "after", 100, "drop").await;
    assert_ne!(region.primary().await, Some(frozen));

    history
        .check_one_region(
            &api,
            100 + 1 + 100 + 100,
            Duration::from_secs(31),
            "the primary's machine frozen after 100 holds; pg_auto_failover promotes a standby",
        )
        .await;
}
