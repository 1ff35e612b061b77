//! The agent's database machine dies during a sale: the agent was given
//! libpq's multi-host URL (primary, then its synchronous standby), the
//! primary's postmaster is killed with -9, the standby is promoted, and the
//! agent follows it by itself. Every acknowledged hold is on the new
//! primary, the counters agree with the rows, and selling resumes. Runs
//! the real `region-agent` binary on two PostgreSQL servers of the test's
//! own (PostgreSQL only). A commit that waits for its synchronous standby
//! is never cut short by the connection's statement timeout. And the
//! negative control: with asynchronous replication, acknowledged holds are
//! lost on the same failover.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::time::Duration;

use reqwest::StatusCode;
use service_kit::sql::{sql, Db};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use test_support::history::History;
use test_support::pg_server::PgServer;
use test_support::{eventually, selling_agent, Api, Proc};

/// A primary with a streaming standby (synchronous or not) and an agent
/// given both hosts, selling SKU `drop` of 100,000 units.
struct Replicated {
    primary: PgServer,
    standby: PgServer,
    _agent: Proc,
    api: Api,
}

impl Replicated {
    async fn start(synchronous: bool) -> Option<Self> {
        let primary = PgServer::start_or_skip("the test")?;
        let mut admin = PgConnection::connect(&format!("{}/postgres", primary.url()))
            .await
            .unwrap();
        sqlx::query("CREATE DATABASE agent")
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();
        let standby = PgServer::start_standby_of(&primary);
        if synchronous {
            primary.require_synchronous_standby();
        }
        let url = format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/agent?target_session_attrs=read-write",
            primary.port(),
            standby.port()
        );
        let (agent, api) = selling_agent(env!("CARGO_BIN_EXE_region-agent"), &url).await;
        Some(Self {
            primary,
            standby,
            _agent: agent,
            api,
        })
    }

    /// How many of `keys` have a reservation row on the standby (which
    /// may be the promoted primary by then).
    async fn rows_on_standby(&self, keys: &[String]) -> i64 {
        let url = format!("{}/agent", self.standby.url());
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::query_scalar("SELECT count(*) FROM reservations WHERE request_key = ANY($1)")
            .bind(keys)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }
}

/// Goal: a region survives losing its database's primary. 100 holds, the
/// primary killed, 100 buyers reserving while no primary exists and while
/// the standby is promoted, then every refused key retried and 100 more:
/// every 201 is readable from the new primary, the counters equal the
/// rows, and the agent sells again within 15 s of the promotion without a
/// restart.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_follows_a_promoted_standby_and_loses_no_hold() {
    let Some(Replicated {
        primary,
        standby,
        _agent,
        api,
    }) = Replicated::start(true).await
    else {
        return;
    };

    let history = History::new();
    history
        .reserve_many(&api, "eu", "before", 100, "drop")
        .await;
    primary.kill_postmaster();
    // With no primary, a read of the books is a pause to retry, not a fault.
    eventually(
        "the audit answers 503 PAUSED storage",
        Duration::from_secs(20),
        async || {
            let (status, body) = api.admin_get("/v1/admin/audit").await;
            assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
            status == StatusCode::SERVICE_UNAVAILABLE && body["reason"] == "storage"
        },
    )
    .await;
    history
        .reserve_many(&api, "eu", "no-primary", 50, "drop")
        .await;
    standby.promote();
    history
        .reserve_many(&api, "eu", "promoted", 50, "drop")
        .await;
    history.recover(&api, "drop", Duration::from_secs(15)).await;
    history.reserve_many(&api, "eu", "after", 100, "drop").await;

    // Held: 100 before, the probe, the 100 during the failover (each
    // retried until held) and the 100 after. Answers are bounded at 31 s:
    // settling stops at the buyers' deadlines, but while no primary exists
    // a commit and the reload after it each wait for a connection up to
    // the pool's acquire timeout (5 s) first.
    history
        .check_one_region(
            &api,
            100 + 1 + 100 + 100,
            Duration::from_secs(31),
            Vec::new(),
            "the primary killed after 100 holds, the standby promoted 50 requests later",
        )
        .await;
}

/// Goal: a write's COMMIT through the services' SQL layer that waits for
/// the synchronous standby outlives the connection's `statement_timeout`
/// (0.5 s here) and succeeds once the standby confirms, with the row on
/// the standby. A cancelled wait would be answered as committed on the
/// primary alone, to be lost on a failover (Patroni #1412); PostgreSQL
/// stops a statement's timer before its transaction commits, and nothing
/// in the services may cancel the wait either.
#[tokio::test(flavor = "multi_thread")]
async fn a_commit_waiting_for_the_standby_outlives_the_statement_timeout() {
    let Some(primary) = PgServer::start_or_skip("the test") else {
        return;
    };
    let standby = PgServer::start_standby_of(&primary);
    primary.require_synchronous_standby();
    let options: PgConnectOptions = format!("{}/postgres", primary.url()).parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options.options([("statement_timeout", "500ms")]))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE holds (k text PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let db = Db::postgres(pool);

    standby.stop_immediate();
    let write = tokio::spawn(async move {
        let mut tx = db.write().await?;
        sql("INSERT INTO holds VALUES ('k-1')")
            .execute(&mut tx)
            .await?;
        tx.commit().await
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !write.is_finished(),
        "the commit stopped waiting for the standby: {:?}",
        write.await
    );
    standby.start_again();
    let committed = tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .expect("the commit ends once the standby is back")
        .unwrap();
    assert!(committed.is_ok(), "{committed:?}");
    // The standby confirmed the WAL as flushed; it replays it a moment later.
    let standby_url = format!("{}/postgres", standby.url());
    eventually(
        "the row is on the standby",
        Duration::from_secs(10),
        async || {
            let mut on_standby = PgConnection::connect(&standby_url).await.unwrap();
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM holds")
                .fetch_one(&mut on_standby)
                .await
                .unwrap();
            rows == 1
        },
    )
    .await;
}

/// Goal (the negative control, why the synchronous standby matters): with
/// asynchronous replication, holds the primary acknowledged while its
/// standby was behind are lost when the standby is promoted. 100 holds
/// reach the standby; the standby stops; 100 more are acknowledged by the
/// primary alone; the primary dies and the standby is promoted: none of
/// those 100 is on it, so their units would be sold again. With the
/// synchronous standby of the tests above, a stopped standby stalls the
/// commits instead: nothing is acknowledged that it lacks.
#[tokio::test(flavor = "multi_thread")]
async fn asynchronous_replication_loses_acknowledged_holds() {
    let Some(region) = Replicated::start(false).await else {
        return;
    };
    let history = History::new();
    let api = &region.api;
    history
        .reserve_many(api, "eu", "replicated", 100, "drop")
        .await;
    let replicated: Vec<String> = history.held_keys().into_keys().collect();
    assert_eq!(replicated.len(), 100);
    eventually(
        "the standby has the first 100",
        Duration::from_secs(20),
        async || region.rows_on_standby(&replicated).await == 100,
    )
    .await;
    region.standby.stop_immediate();
    history
        .reserve_many(api, "eu", "primary-only", 100, "drop")
        .await;
    let acknowledged: Vec<String> = history
        .held_keys()
        .into_keys()
        .filter(|k| k.starts_with("primary-only"))
        .collect();
    region.primary.kill_postmaster();
    region.standby.start_again();
    region.standby.promote();
    let kept = region.rows_on_standby(&acknowledged).await;
    eprintln!(
        "asynchronous replication: {} holds acknowledged while the standby was behind, {} lost on failover",
        acknowledged.len(),
        acknowledged.len() as i64 - kept
    );
    assert_eq!(
        acknowledged.len(),
        100,
        "the primary alone acknowledged every hold"
    );
    assert_eq!(kept, 0, "every hold the standby lacked is lost");
    assert_eq!(region.rows_on_standby(&replicated).await, 100);
}
