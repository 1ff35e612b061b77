//! The agent's database machine dies during a sale: the agent was given
//! libpq's multi-host URL (primary, then its synchronous standby), the
//! primary's postmaster is killed with -9, the standby is promoted, and the
//! agent follows it by itself. Every acknowledged hold is on the new
//! primary, the counters agree with the rows, and selling resumes. Runs
//! the real `region-agent` binary on two PostgreSQL servers of the test's
//! own (PostgreSQL only).

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use sqlx::{Connection, PgConnection};
use test_support::history::{Expect, History};
use test_support::pg_server::PgServer;
use test_support::{free_port, service, wait_ready, Api, Proc, ACME_KEY};

/// Goal: a region survives losing its database's primary. 100 holds, the
/// primary killed, 100 buyers reserving while no primary exists and while
/// the standby is promoted, then every refused key retried and 100 more:
/// every 201 is readable from the new primary, the counters equal the
/// rows, and the agent sells again within 15 s of the promotion without a
/// restart.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_follows_a_promoted_standby_and_loses_no_hold() {
    let Some(primary) = PgServer::start_or_skip("the test") else {
        return;
    };
    let mut admin = PgConnection::connect(&format!("{}/postgres", primary.url()))
        .await
        .unwrap();
    sqlx::query("CREATE DATABASE agent")
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    let standby = PgServer::start_standby_of(&primary);
    primary.require_synchronous_standby();
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/agent?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let port = free_port();
    let _agent = Proc::spawn(
        service(env!("CARGO_BIN_EXE_region-agent"), port, &url).args([
            "--region",
            "eu",
            "--tenant-key",
            &format!("acme={ACME_KEY}"),
        ]),
    );
    let api = Api::new(&format!("http://127.0.0.1:{port}"));
    wait_ready(&api.url).await;
    let (status, body) = api.put_sku("acme", "drop", json!({"total": 100_000})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let history = Arc::new(History::new());
    let reserve_all = |prefix: &'static str, n: usize| {
        let (api, history) = (api.clone(), history.clone());
        async move {
            for i in 0..n {
                let key = format!("{prefix}-{i}");
                history.reserve(&api, "eu", &key, &key, "drop").await;
            }
        }
    };
    reserve_all("before", 100).await;
    primary.kill_postmaster();
    reserve_all("no-primary", 50).await;
    standby.promote();
    reserve_all("promoted", 50).await;
    history.recover(&api, "drop", Duration::from_secs(15)).await;
    reserve_all("after", 100).await;

    let stored = history.read_back(&api).await;
    let audit = api.assert_no_drift().await;
    let held = audit["skus"][0]["held"].as_u64().unwrap();
    // 100 before, the probe, the 100 during the failover (each retried
    // until held) and the 100 after.
    assert_eq!(held, 100 + 1 + 100 + 100);
    history.check(
        &Expect {
            total: 100_000,
            held_or_sold: history.held_keys().len() as u64,
            // A request whose commit was in flight when the primary died
            // has waited 10-15 s for its 503 (no primary existed then):
            // bounding that wait is issue 21's open work, so this test
            // checks what was acknowledged, not how fast the refusal came.
            answer_within: Duration::from_secs(30),
            staleness: Duration::from_secs(1),
            schedule: "the primary killed after 100 holds, the standby promoted 50 requests later"
                .into(),
            down: Vec::new(),
        },
        &stored,
    );
}
