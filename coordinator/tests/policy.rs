//! Per-SKU policy through the admin API: a SKU runs the policy it chose,
//! or the coordinator's default; a bad name or setting is a 400 that
//! changes nothing.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;

coordinator_tests!(
    each_sku_runs_the_policy_it_chose,
    a_bad_policy_is_refused_and_changes_nothing,
);

/// Goal: a SKU that names a policy runs it from its creation (central
/// keeps every unit in the pool), a SKU that names none runs the
/// coordinator's default, settings alone tune the policy a SKU runs, and
/// the SKU view shows each.
async fn each_sku_runs_the_policy_it_chose(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    let regions = json!({"eu": 1, "us": 1});

    let (status, central) = admin
        .put_sku(
            "acme",
            "central",
            json!({"total": 100, "regions": regions, "policy": "central"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{central}");
    assert_eq!(
        (
            &central["policy"],
            &central["policy_is_default"],
            &central["mode"],
            &central["pool"]
        ),
        (
            &json!("central"),
            &json!(false),
            &json!("CENTRAL"),
            &json!(100)
        )
    );

    let (status, plain) = admin
        .put_sku("acme", "plain", json!({"total": 100, "regions": regions}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{plain}");
    assert_eq!(
        (
            &plain["policy"],
            &plain["policy_is_default"],
            &plain["mode"]
        ),
        (&json!("tail-merge"), &json!(true), &json!("ESCROW"))
    );
    assert_eq!(plain["settings"]["merge_round_trips"], 3);
    assert_eq!(plain["settings"]["keep_round_trips"], 1.0);
    assert_eq!(plain["settings"]["refill"]["sync_interval_ms"], SYNC_MS);
    // The default split leaves the rest of the units with the regions.
    assert!(plain["pool"].as_u64().unwrap() < 100);

    let (status, tuned) = admin
        .put_sku(
            "acme",
            "plain",
            json!({"total": 100, "settings": {"merge_horizon_ms": 900, "refill": {"low_water_s": 2.5}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{tuned}");
    assert_eq!(
        (&tuned["policy"], &tuned["policy_is_default"]),
        (&json!("tail-merge"), &json!(false))
    );
    assert_eq!(tuned["settings"]["merge_horizon_ms"], 900);
    assert_eq!(tuned["settings"]["refill"]["low_water_s"], 2.5);
    assert_eq!(tuned["settings"]["merge_units"], 20);

    // A change that names neither keeps the choice.
    let (status, kept) = admin
        .put_sku("acme", "plain", json!({"total": 100, "max_per_user": 3}))
        .await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    assert_eq!(kept["settings"], tuned["settings"]);
    admin.assert_no_drift().await;
    coord.stop().await;
}

/// Goal: an unknown policy, an unknown setting, a setting of another
/// policy and a value out of range are each refused with 400 and the
/// reason, and nothing of the request is applied (not even its other
/// fields); creating a SKU with a bad policy creates nothing.
async fn a_bad_policy_is_refused_and_changes_nothing(db: TestDb) {
    let coord = Coord::start(&db, None).await;
    let admin = Api::new(&coord.url);
    let (status, _) = admin
        .put_sku("acme", "drop", json!({"total": 100, "regions": {"eu": 1}}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let before = admin.admin_sku("acme", "drop").await;

    let refused = [
        (json!({"total": 150, "policy": "fastest"}), "unknown policy"),
        (
            json!({"total": 150, "settings": {"merge_unit": 1}}),
            "no setting \"merge_unit\"",
        ),
        (
            json!({"total": 150, "policy": "refill", "settings": {"merge_units": 1}}),
            "no setting \"merge_units\"",
        ),
        (
            json!({"total": 150, "settings": {"merge_fraction": 2.0}}),
            "merge_fraction",
        ),
        (
            json!({"total": 150, "settings": {"merge_units": "many"}}),
            "tail-merge",
        ),
        (
            json!({"total": 150, "policy": "static", "settings": {"x": 1}}),
            "no setting",
        ),
    ];
    for (body, reason) in refused {
        let (status, answer) = admin.put_sku("acme", "drop", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(reason),
            "{body}: {answer}"
        );
    }
    let after = admin.admin_sku("acme", "drop").await;
    for field in ["total", "pool", "policy", "settings", "policy_is_default"] {
        assert_eq!(after[field], before[field], "{field}");
    }

    let (status, _) = admin
        .put_sku("acme", "new", json!({"total": 10, "policy": "fastest"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = admin.admin_get("/v1/admin/skus/acme/new").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    admin.assert_no_drift().await;
    coord.stop().await;
}
