//! Smoke of `bench tail`: a small sale (3 regions 85/10/5, 60 units, 200
//! buyers) on a real coordinator and three real agents, under `central`
//! and `tail-merge`. Only counts are asserted, never timings: every unit is
//! held exactly once or still free, nothing is oversold, the audit shows
//! no drift, and every buyer got a final answer. It runs on PostgreSQL
//! when `DATABASE_URL` names a server (as `scripts/test` sets it), else on
//! SQLite files in a temporary directory. The benchmark itself is
//! `cargo run --release -p bench -- tail`.

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::path::PathBuf;
use std::time::Duration;

use bench::tail::run_policy;
use harness::cluster::{Backend, ClusterFlags, Logs, Storage};
use harness::outcome::Outcome;
use harness::process::Binaries;
use harness::sale::TailSettings;
use harness::shape::Shape;

const UNITS: u64 = 60;
const BUYERS: u64 = 200;

/// Scratch PostgreSQL databases if a server is named, else SQLite files in
/// a fresh directory for `policy`'s run (returned, to remove after).
fn storage(policy: &str) -> (Storage, Option<PathBuf>) {
    if let Ok(server) = std::env::var("DATABASE_URL") {
        return (Storage::scratch(&server), None);
    }
    let dir = std::env::temp_dir().join(format!("bench-tail-test-{}-{policy}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let storage = Storage {
        coordinator: Backend::Sqlite(dir.clone()),
        agents: Backend::Sqlite(dir.clone()),
        drop_postgres: false,
    };
    (storage, Some(dir))
}

fn settings(binaries: Binaries, storage: Storage) -> TailSettings {
    TailSettings {
        storage,
        logs: Logs::Stderr,
        binaries,
        in_flight: 100,
        cluster: ClusterFlags {
            sync_interval_ms: 200,
            max_in_flight: Some(256),
            max_waiting: Some(4_096),
            wait_timeout_ms: None,
            db_pool_size: Some(4),
        },
        distances: Default::default(),
    }
}

/// Goal: under both policies the buyers' answers, the coordinator's final
/// view and its audit agree: 60 units held once (or still free), no
/// oversell, drift 0, and each of the 200 buyers ended with HELD or
/// SOLD_OUT, none out of patience and none with an unexpected answer;
/// under `central` the coordinator's takes are timed
/// (`coordinator_take_locked_seconds`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_sale_counts_add_up() {
    Binaries::build().await.unwrap();
    let binaries = Binaries::locate(None).unwrap();
    binaries.check_cluster().unwrap();
    let mut shape = Shape::preset("skewed-701").unwrap();
    shape.units = UNITS;
    shape.buyers = BUYERS;
    shape.retrying_max = Duration::from_secs(60);
    let sale = shape.sale().unwrap();

    for policy in ["central", "tail-merge"] {
        let (storage, dir) = storage(policy);
        let settings = settings(binaries.clone(), storage);
        let run = run_policy(&settings, &sale, policy).await.unwrap();
        let s = &run.stats;
        assert!(s.problems().is_empty(), "{policy}: {:?}", s.problems());
        assert_eq!(s.buyers, BUYERS, "{policy}");
        assert_eq!(s.oversold, 0, "{policy}");
        assert_eq!(s.drift_total, 0, "{policy}");
        assert_eq!(
            s.held_units as i64 + s.final_free,
            UNITS as i64,
            "{policy}: every unit held once or still free"
        );
        assert_eq!(s.held_units as i64, s.final_committed, "{policy}");
        let per_region: u64 = s.held_per_region.iter().map(|(_, n)| n).sum();
        assert_eq!(per_region, s.held_units, "{policy}");
        assert_eq!(s.gave_up, 0, "{policy}: {}", s.answers);
        assert_eq!(s.refused, 0, "{policy}: {}", s.answers);
        assert_eq!(
            s.held_units + s.sold_out_buyers,
            BUYERS,
            "{policy}: every buyer got HELD or SOLD_OUT: {}",
            s.answers
        );
        // A browser stops at its first SOLD_OUT.
        assert_eq!(s.answers[Outcome::SoldOut], s.sold_out_buyers, "{policy}");
        assert!(s.requests() >= BUYERS, "{policy}");
        if policy == "central" {
            // Every batch takes, and the coordinator times each take.
            assert!(s.counters.takes > 0.0, "{policy}");
            assert!(s.counters.take_locked_seconds > 0.0, "{policy}");
        }
        if let Some(dir) = dir {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}

/// Goal: at a distance (each agent behind a delay link of 20, 80 and
/// 230 ms round trip) the default policy still sells every unit once:
/// nothing oversold, no drift, no PAUSED, every buyer HELD or SOLD_OUT, and
/// the per-region counts add up to the sale's, each region carrying its
/// round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_at_a_distance_counts_add_up() {
    Binaries::build().await.unwrap();
    let binaries = Binaries::locate(None).unwrap();
    binaries.check_cluster().unwrap();
    let mut shape = Shape::preset("dist-spread").unwrap();
    shape.units = UNITS;
    shape.buyers = BUYERS;
    shape.window = Duration::from_millis(500);
    let sale = shape.sale().unwrap();
    let policy = "tail-merge";
    let (storage, dir) = storage("distance");
    let settings = settings(binaries, storage);
    let run = run_policy(&settings, &sale, policy).await.unwrap();
    let s = &run.stats;
    assert!(s.problems().is_empty(), "{:?}", s.problems());
    assert_eq!(s.oversold, 0);
    assert_eq!(s.drift_total, 0);
    assert_eq!(s.held_units as i64 + s.final_free, UNITS as i64);
    assert_eq!(s.answers[Outcome::Paused], 0, "{}", s.answers);
    assert_eq!(s.held_units + s.sold_out_buyers, BUYERS, "{}", s.answers);
    let rtts: Vec<u64> = s.regions.iter().map(|r| r.rtt_ms).collect();
    assert_eq!(rtts, vec![20, 80, 230]);
    let holds: u64 = s.regions.iter().map(|r| r.holds).sum();
    assert_eq!(holds, s.held_units);
    assert!(s.regions.iter().all(|r| r.holds_under_rtt <= r.holds));
    if let Some(dir) = dir {
        std::fs::remove_dir_all(dir).unwrap();
    }
}
