//! A real coordinator and three real agents, each on its own database,
//! over HTTP on loopback: the sale, tail merge, faults on the wire, the
//! coordinator going away, admin operations reaching the agents, and a
//! database keeping its mode. The invariant is asserted after every test.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

coordinator_tests!(
    skewed_sale_sells_every_unit_exactly_once,
    expired_central_holds_sell_again_elsewhere,
    faulty_wire_never_creates_or_destroys_a_unit,
    coordinator_outage_pauses_only_central_skus,
    admin_operations_reach_the_agents,
    a_database_keeps_its_mode,
    forty_carts_in_two_regions_race_for_one_unit,
);

/// The sum of `field` over the regions of an audit's SKU line.
fn regions_sum(sku: &Value, field: &str) -> i64 {
    let regions = sku["regions"].as_object().unwrap();
    regions.values().map(|r| r[field].as_i64().unwrap()).sum()
}

/// Whether `agent` sells `sku` in central mode.
fn sells_central(agent: &Agent, sku: &str) -> bool {
    let owners = agent.state.registry().all();
    owners
        .iter()
        .any(|h| h.view.sku.as_str() == sku && h.view.is_central())
}

/// One buyer's final answer with when it was sent and answered.
struct Answer {
    region: usize,
    key: String,
    status: StatusCode,
    sent: Instant,
    answered: Instant,
}

/// Runs `buyers` concurrent buyers, assigned to regions by `share` (percent),
/// each retrying 503s with its key until a final answer.
async fn sale(
    c: &Cluster,
    sku: &str,
    round: &str,
    buyers: usize,
    share: [usize; 3],
) -> Vec<Answer> {
    let mut tasks = Vec::with_capacity(buyers);
    for i in 0..buyers {
        let slot = i % 100;
        let region = if slot < share[0] {
            0
        } else if slot < share[0] + share[1] {
            1
        } else {
            2
        };
        let buyer = c.agents[region].buyer();
        let sku = sku.to_owned();
        let round = round.to_owned();
        tasks.push(tokio::spawn(async move {
            let key = format!("{sku}-{round}-k{i}");
            let user = format!("{round}-u{i}");
            let Final {
                status,
                sent,
                answered,
                ..
            } = buyer.reserve_until_final(&key, &user, &sku).await;
            Answer {
                region,
                key,
                status,
                sent,
                answered,
            }
        }));
    }
    let mut answers = Vec::with_capacity(buyers);
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// Goal: 3,000 buyers for 1,000 units with demand skewed 80/15/5 over three
/// regions of equal weight get exactly 1,000 holds, all confirmed; audit
/// drift is 0; and no SOLD_OUT came back before a request that was later
/// held had even been sent (a sold-out answer while a unit was still free).
async fn skewed_sale_sells_every_unit_exactly_once(db: TestDb) {
    let c = cluster(&db, None).await;
    let spec = json!({"total": 1000, "regions": {"eu": 1, "us": 1, "ap": 1}});
    let (status, body) = c.put_sku("drop", spec).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    c.grants_delivered("drop").await;
    let before = c.messages();
    let answers = sale(&c, "drop", "a", 3_000, [80, 15, 5]).await;
    let during = c.messages() - before;

    let held: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    let sold_out: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT)
        .collect();
    let mut per_region = [0usize; 3];
    for a in &held {
        per_region[a.region] += 1;
    }
    println!(
        "skewed sale: {} HELD (eu {}, us {}, ap {}), {} SOLD_OUT, {} coordinator messages during the sale ({:.3} per sale)",
        held.len(),
        per_region[0],
        per_region[1],
        per_region[2],
        sold_out.len(),
        during,
        during as f64 / held.len() as f64
    );
    assert_eq!(held.len(), 1_000);
    assert_eq!(sold_out.len(), 2_000);
    let last_held_sent = held.iter().map(|a| a.sent).max().unwrap();
    let first_sold_out = sold_out.iter().map(|a| a.answered).min().unwrap();
    assert!(
        first_sold_out >= last_held_sent,
        "a buyer heard SOLD_OUT before another buyer's later-held request was even sent"
    );
    c.admin.assert_no_drift().await;

    let mut confirmed = 0;
    for a in &held {
        let (status, body) = c.agents[a.region].buyer().action(&a.key, "confirm").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        confirmed += 1;
    }
    assert_eq!(confirmed, 1_000);
    eventually(
        "every region reports its sales",
        Duration::from_secs(20),
        async || {
            let audit = settled_audit(&c.admin, Duration::from_secs(20)).await;
            let sku = &audit["skus"][0];
            regions_sum(sku, "sold") == 1_000 && sku["pool"] == 0
        },
    )
    .await;
    c.stop().await;
}

/// Goal: in central mode, holds that expire go back to the pool and are
/// sold again in another region; nothing is sold twice.
async fn expired_central_holds_sell_again_elsewhere(db: TestDb) {
    let c = cluster(&db, None).await;
    // 10 units are below the tail-merge threshold: central mode from the first plan.
    let spec = json!({"total": 10, "regions": {"eu": 1, "us": 1}, "hold_ttl_ms": 1000});
    c.put_sku("tail", spec).await;
    eventually(
        "central mode reaches the agents",
        Duration::from_secs(20),
        async || {
            c.admin.admin_sku("acme", "tail").await["mode"] == "CENTRAL"
                && c.agents[..2].iter().all(|a| sells_central(a, "tail"))
        },
    )
    .await;
    // Central mode: the regions give their free quota back to the pool
    // at their first batch without buyers of their own.
    eventually(
        "all free units are in the pool",
        Duration::from_secs(20),
        async || c.admin.admin_sku("acme", "tail").await["pool"] == 10,
    )
    .await;
    let eu = c.agents[0].buyer();
    let us = c.agents[1].buyer();
    for i in 0..10 {
        let Final { status, body, .. } = eu
            .reserve_until_final(&format!("eu-{i}"), &format!("e{i}"), "tail")
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let Final { status, body, .. } = us.reserve_until_final("us-early", "x", "tail").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::CONFLICT, Some("SOLD_OUT"))
    );

    // The eu holds expire; their units must reach the pool and then us.
    let mut sold_in_us = 0;
    eventually(
        "expired units reach us",
        Duration::from_secs(30),
        async || {
            let (key, user) = (format!("us-{sold_in_us}"), format!("s{sold_in_us}"));
            if us.reserve(&key, &user, "tail").await.0 == StatusCode::CREATED {
                sold_in_us += 1;
            }
            sold_in_us == 10
        },
    )
    .await;
    for i in 0..10 {
        let (status, body) = eu.action(&format!("eu-{i}"), "confirm").await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::CONFLICT, Some("EXPIRED"))
        );
    }
    // Reports are eventually consistent: wait until both regions' reports
    // show the holds where they are.
    eventually(
        "us reports the 10 holds, eu none",
        Duration::from_secs(20),
        async || {
            let audit = settled_audit(&c.admin, Duration::from_secs(20)).await;
            let regions = &audit["skus"][0]["regions"];
            regions["us"]["held"] == 10 && regions["eu"]["held"] == 0
        },
    )
    .await;
    c.stop().await;
}

/// Goal: with every protocol message duplicated, delayed, reordered and
/// some responses lost after the coordinator committed, a sale still sells
/// exactly the total, and the books settle with drift 0.
async fn faulty_wire_never_creates_or_destroys_a_unit(db: TestDb) {
    let c = cluster(&db, Some(7)).await;
    let spec = json!({"total": 500, "regions": {"eu": 2, "us": 1, "ap": 1}});
    c.put_sku("drop", spec).await;
    c.grants_delivered("drop").await;
    let answers = sale(&c, "drop", "a", 1_200, [60, 30, 10]).await;
    let held = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();
    let sold_out = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT)
        .count();
    println!(
        "faulty wire: {held} HELD, {sold_out} SOLD_OUT, {} messages",
        c.messages()
    );
    assert_eq!(held, 500);
    assert_eq!(sold_out, 700);
    c.admin.assert_no_drift().await;
    // Add stock mid-flight and let it spread through the faulty wire.
    c.admin
        .admin_post(
            "/v1/admin/skus/acme/drop/add-stock",
            Some(json!({"qty": 50})),
        )
        .await;
    eventually(
        "agents learn of the new stock",
        Duration::from_secs(20),
        async || {
            c.agents.iter().all(|a| {
                a.state
                    .registry()
                    .all()
                    .iter()
                    .all(|h| !h.view.is_sold_out_everywhere())
            })
        },
    )
    .await;
    let more = sale(&c, "drop", "b", 60, [34, 33, 33]).await;
    let held_more = more
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .count();

    assert_eq!(held_more, 50);
    // Reports are eventually consistent: a settled audit may still carry a
    // report from before a region's last holds (its units then show as
    // available, and the region still agrees with its lease), so wait for
    // every hold to be reported.
    let mut held_total = 0;
    eventually(
        "every hold is in the regions' reports",
        Duration::from_secs(30),
        async || {
            let audit = settled_audit(&c.admin, Duration::from_secs(30)).await;
            let sku = &audit["skus"][0];
            assert_eq!(sku["total"].as_i64(), Some(550));
            held_total = regions_sum(sku, "held");
            held_total == 550
        },
    )
    .await;
    assert_eq!(held_total, 550);
    c.stop().await;
}

/// Goal: while the coordinator is down, escrow-mode SKUs keep selling local
/// quota and central-mode SKUs answer PAUSED; when it is back, everything
/// converges with drift 0.
async fn coordinator_outage_pauses_only_central_skus(db: TestDb) {
    let c = cluster(&db, None).await;
    let big = json!({"total": 3000, "regions": {"eu": 1, "us": 1, "ap": 1}});
    c.put_sku("big", big).await;
    c.put_sku("tiny", json!({"total": 5, "regions": {"eu": 1, "us": 1}}))
        .await;
    eventually(
        "quota delivered and tail merged",
        Duration::from_secs(20),
        async || {
            let big = c.admin.admin_sku("acme", "big").await;
            let tiny = c.admin.admin_sku("acme", "tiny").await;
            big["in_transit"] == 0
                && big["regions"]["eu"]["available"].as_i64().unwrap_or(0) > 10
                && tiny["mode"] == "CENTRAL"
                && sells_central(&c.agents[0], "tiny")
        },
    )
    .await;
    let addr = c.coord.addr;
    let Cluster {
        coord,
        admin,
        agents,
        dbs: _dbs,
    } = c;
    coord.stop().await;
    let eu = agents[0].buyer();
    eventually(
        "the agent notices the outage",
        Duration::from_secs(10),
        async || agents[0].state.link().unwrap().is_down(),
    )
    .await;
    for i in 0..5 {
        let (status, body) = eu
            .reserve(&format!("big-{i}"), &format!("b{i}"), "big")
            .await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "escrow SKU sells local quota: {body}"
        );
    }
    let (status, body) = eu.reserve("tiny-1", "t1", "tiny").await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("PAUSED"))
    );

    let coord = Coord::start(&db, Some(addr)).await;
    let Final { status, body, .. } = eu.reserve_until_final("tiny-1", "t1", "tiny").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    eventually(
        "eu reports both SKUs' holds",
        Duration::from_secs(20),
        async || {
            let audit = settled_audit(&admin, Duration::from_secs(20)).await;
            let held: HashMap<String, i64> = audit["skus"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    (
                        s["sku"].as_str().unwrap().to_owned(),
                        s["regions"]["eu"]["held"].as_i64().unwrap(),
                    )
                })
                .collect();
            (held["big"], held["tiny"]) == (5, 1)
        },
    )
    .await;
    for agent in agents {
        agent.stop().await;
    }
    coord.stop().await;
}

/// Goal: admin operations at the coordinator reach the agents: pause stops
/// selling within a few sync intervals and resume restarts it; the total
/// is lowered only from the pool (else 409); a region joining gets quota
/// from the pool and sells it.
async fn admin_operations_reach_the_agents(db: TestDb) {
    let c = cluster(&db, None).await;
    c.put_sku("drop", json!({"total": 100, "regions": {"eu": 1, "us": 1}}))
        .await;
    c.grants_delivered("drop").await;
    let eu = c.agents[0].buyer();
    assert_eq!(eu.reserve("k1", "u1", "drop").await.0, StatusCode::CREATED);

    c.admin
        .admin_post("/v1/admin/skus/acme/drop/pause", None)
        .await;
    let mut attempt = 0;
    eventually("eu stops selling", Duration::from_secs(10), async || {
        attempt += 1;
        let key = format!("probe-{attempt}");
        eu.reserve(&key, &key, "drop").await.1["outcome"] == "PAUSED"
    })
    .await;
    // Paused, the policy moves nothing: once the last moves have landed,
    // the pool stays what the admin reads.
    eventually("no unit on its way", Duration::from_secs(10), async || {
        let view = c.admin.admin_sku("acme", "drop").await;
        view["in_transit"] == 0
            && view["regions"]
                .as_object()
                .unwrap()
                .values()
                .all(|r| r["recall_pending"] == 0)
    })
    .await;
    let pool_units = c.admin.admin_sku("acme", "drop").await["pool"]
        .as_i64()
        .unwrap();
    let (status, body) = c
        .put_sku("drop", json!({"total": 100 - pool_units - 1}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = c
        .put_sku("drop", json!({"total": 100 - pool_units / 2}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    c.admin
        .admin_post("/v1/admin/skus/acme/drop/resume", None)
        .await;
    eventually("eu sells again", Duration::from_secs(10), async || {
        eu.reserve("k2", "u2", "drop").await.0 == StatusCode::CREATED
    })
    .await;

    let everywhere = json!({"total": 100 - pool_units / 2, "regions": {"eu": 1, "us": 1, "ap": 1}});
    c.put_sku("drop", everywhere).await;
    let ap = c.agents[2].buyer();
    eventually(
        "ap gets quota and sells",
        Duration::from_secs(20),
        async || ap.reserve("k3", "u3", "drop").await.0 == StatusCode::CREATED,
    )
    .await;
    settled_audit(&c.admin, Duration::from_secs(20)).await;
    c.stop().await;
}

/// Goal: a database is standalone or coordinator-managed for life: an agent
/// refuses to start standalone on a database holding grants, and under a
/// coordinator on one holding standalone stock, so no unit exists in one
/// ledger and not the other.
async fn a_database_keeps_its_mode(db: TestDb) {
    use std::sync::Arc;

    use region_agent::clock::SystemClock;
    use region_agent::coordinator_client::{CoordinatorLink, HttpCoordinator};
    use region_agent::store;

    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    admin
        .put_sku("acme", "drop", json!({"total": 10, "regions": {"eu": 1}}))
        .await;
    let eu_db = agent_db(&db, "eu").await;
    let eu = Agent::start(&eu_db, "eu", &coord.url, None).await;
    eventually(
        "eu credits its grant",
        Duration::from_secs(20),
        async || eu_db.int("SELECT count(*) FROM applied_grants").await > 0,
    )
    .await;
    eu.stop().await;

    let settings = |region: &str, coordinator| region_agent::AgentSettings {
        region: escrow_core::RegionName::parse(region).unwrap(),
        auth: region_agent::auth::Auth::new(Vec::new(), None),
        limits: region_agent::owner::Limits {
            max_in_flight: 16,
            max_waiting: 16,
            wait_timeout_ms: 1_000,
        },
        coordinator,
        keys: region_agent::KeyMemory::default(),
    };
    let standalone = region_agent::start(
        store::open(eu_db.url(), 4).await.unwrap(),
        Arc::new(SystemClock),
        settings("eu", None),
    )
    .await;
    assert!(
        standalone.is_err(),
        "standalone on a database holding grants"
    );

    let us_db = agent_db(&db, "us").await;
    us_db
        .execute(
            "INSERT INTO sku_stock (tenant, sku, available, held, sold, received, returned, max_per_user, hold_ttl_ms)
             VALUES ('acme', 'own', 5, 0, 0, 5, 0, 1, 600000)",
        )
        .await;
    let http = HttpCoordinator::new(
        &coord.url,
        escrow_core::RegionName::parse("us").unwrap(),
        region_token("us"),
        Duration::from_secs(2),
    )
    .unwrap();
    let link = Arc::new(CoordinatorLink::new(Arc::new(http), SYNC_MS));
    let managed = region_agent::start(
        store::open(us_db.url(), 4).await.unwrap(),
        Arc::new(SystemClock),
        settings("us", Some(link)),
    )
    .await;
    assert!(
        managed.is_err(),
        "coordinator-managed on a database holding standalone stock"
    );
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: 40 carts in two regions race for [a SKU with stock, a SKU of one
/// unit that is not in their region when the race starts]: the carts wait
/// for the unit to move as a reservation does, exactly one cart is held
/// whole, the others hear SOLD_OUT naming the scarce SKU, the SKU with
/// stock moves by exactly one unit, and the books balance.
async fn forty_carts_in_two_regions_race_for_one_unit(db: TestDb) {
    let c = cluster(&db, None).await;
    c.put_sku(
        "stock",
        json!({"total": 300, "regions": {"eu": 1, "us": 1}}),
    )
    .await;
    c.put_sku("last", json!({"total": 1, "regions": {"eu": 1, "us": 1}}))
        .await;
    c.grants_delivered("stock").await;
    c.grants_delivered("last").await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let buyer = c.agents[i % 2].buyer();
        tasks.push(tokio::spawn(async move {
            let body = json!({"request_key": format!("c{i}"), "user_id": format!("u{i}"),
                              "items": [{"sku": "stock"}, {"sku": "last"}]});
            loop {
                let (status, body) = buyer.buyer_post("/v1/carts", body.clone()).await;
                if status != StatusCode::SERVICE_UNAVAILABLE {
                    return (i % 2, status, body);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let mut held = Vec::new();
    for task in tasks {
        let (region, status, body) = task.await.unwrap();
        match status {
            StatusCode::CREATED => held.push((region, body)),
            StatusCode::CONFLICT => {
                assert_eq!(body, json!({"outcome": "SOLD_OUT", "sku": "last"}));
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(
        held.len(),
        1,
        "exactly one cart holds the last unit: {held:?}"
    );
    let (region, body) = &held[0];
    assert_eq!(body["cart"]["items"].as_array().unwrap().len(), 2);
    let agent = &c.agents[*region];
    let stock = agent.buyer().admin_sku("acme", "stock").await;
    assert_eq!(stock["held"], 1, "{stock}");
    eventually("the books settle", Duration::from_secs(20), async || {
        let audit = settled_audit(&c.admin, Duration::from_secs(20)).await;
        let skus = audit["skus"].as_array().unwrap().clone();
        skus.iter().all(|sku| regions_sum(sku, "held") == 1)
    })
    .await;
    c.admin.assert_no_drift().await;
    c.stop().await;
}
