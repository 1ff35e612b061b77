//! The disk under a SQLite agent fills up during a sale, then space comes
//! back: commits fail while it is full (the SKU pauses, buyers hear 503 and
//! retry), no acknowledged hold is lost, and selling resumes by itself.
//! Runs the real `region-agent` binary on a SQLite file in a tmpfs of 32 MiB
//! the test mounts, and on PostgreSQL with the agent's database in a
//! tablespace on such a tmpfs (a server of the test's own); root only
//! (otherwise it says so and skips, or fails under `ESCROW_REQUIRE_TOOLS=1`).

#![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use sqlx::{Connection, PgConnection};
use test_support::history::History;
use test_support::pg_server::PgServer;
use test_support::tools::skip_without;
use test_support::{free_port, service, wait_ready, Api, Proc, ACME_KEY};

/// A tmpfs mounted for the test, unmounted on drop.
struct TinyDisk(PathBuf);

impl TinyDisk {
    /// What mounting one needs: what a test names when it skips without it.
    const TOOL: &'static str = "root, to mount a tmpfs";

    /// A tmpfs of `size` on a directory of its own: the tests of this file
    /// run at once, in one process, and must not share a disk.
    fn mount(size: &str) -> Option<Self> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("escrow-full-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .is_ok_and(|o| o.status.success());
        mounted.then(|| Self(dir))
    }

    /// Writes a file until the disk is full.
    fn fill(&self) -> PathBuf {
        let filler = self.0.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", &format!("of={}", filler.display()), "bs=4k"])
            .output();
        filler
    }
}

impl Drop for TinyDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spawn(database_url: &str, port: u16) -> Proc {
    Proc::spawn(
        service(env!("CARGO_BIN_EXE_region-agent"), port, database_url).args([
            "--region",
            "eu",
            "--tenant-key",
            &format!("acme={ACME_KEY}"),
        ]),
    )
}

/// Goal: 300 buyers reserve while the agent's disk is full, and 300 more
/// after space is freed. While full, no hold is acknowledged that is not
/// stored (every 201 is there afterwards) and buyers hear 503; once freed,
/// the agent sells again without a restart, every buyer ends HELD, and the
/// counters agree with the rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_pauses_selling_and_loses_no_hold() {
    let Some(disk) = TinyDisk::mount("32M") else {
        skip_without(TinyDisk::TOOL, "the test");
        return;
    };
    let url = format!("sqlite://{}", disk.0.join("agent.db").display());
    let port = free_port();
    let _agent = spawn(&url, port);
    let refused = sell_through_a_full_disk(&disk, port).await;
    assert!(refused > 0, "a full disk refuses commits");
}

/// Goal: as [`a_full_disk_pauses_selling_and_loses_no_hold`], on
/// PostgreSQL: the agent's database lives in a tablespace on the tmpfs
/// (its write-ahead log stays on the server's own disk, so the server
/// stays up). A commit that needs a new page fails ("could not extend
/// file"), rolls back and pauses the SKU until it is reloaded; the rows
/// fit in pages already there still commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_tablespace_pauses_selling_and_loses_no_hold() {
    let Some(disk) = TinyDisk::mount("32M") else {
        skip_without(TinyDisk::TOOL, "the test");
        return;
    };
    let Some(server) = PgServer::start_or_skip("the test") else {
        return;
    };
    let location = disk.0.join("tablespace");
    std::fs::create_dir(&location).unwrap();
    let owner = Command::new("chown")
        .args(["postgres:postgres", &location.display().to_string()])
        .status()
        .unwrap();
    assert!(owner.success(), "chown of the tablespace failed");
    let mut admin = PgConnection::connect(&format!("{}/postgres", server.url()))
        .await
        .unwrap();
    for statement in [
        format!("CREATE TABLESPACE tiny LOCATION '{}'", location.display()),
        "CREATE DATABASE agent TABLESPACE tiny".to_owned(),
    ] {
        sqlx::query(&statement).execute(&mut admin).await.unwrap();
    }
    let port = free_port();
    let _agent = spawn(&format!("{}/agent", server.url()), port);
    let refused = sell_through_a_full_disk(&disk, port).await;
    assert!(refused > 0, "a full tablespace refuses commits");
}

/// Sells 50 units, fills `disk`, has 300 buyers reserve, frees the disk,
/// retries every refused key and has 300 more buyers reserve, checking
/// the history (every acknowledged hold stored, every answer in time) and
/// that the counters equal the rows; answers how many requests were
/// refused (503) while the disk was full.
async fn sell_through_a_full_disk(disk: &TinyDisk, port: u16) -> usize {
    let api = Api::new(&format!("http://127.0.0.1:{port}"));
    wait_ready(&api.url).await;
    let (status, body) = api.put_sku("acme", "drop", json!({"total": 100_000})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for i in 0..50 {
        let key = format!("before-{i}");
        assert_eq!(api.reserve(&key, &key, "drop").await.0, StatusCode::CREATED);
    }

    let filler = disk.fill();
    let history = History::new();
    history.reserve_many(&api, "eu", "full", 300, "drop").await;
    let refused = history
        .ops()
        .iter()
        .filter(|op| op.status == Some(StatusCode::SERVICE_UNAVAILABLE))
        .count();
    eprintln!(
        "disk full: {}",
        history.summary(Duration::ZERO..Duration::MAX)
    );

    std::fs::remove_file(&filler).unwrap();
    // Buyers retry their refused keys (a 503 is always safe to retry), and new ones come.
    history.recover(&api, "drop", Duration::from_secs(20)).await;
    history.reserve_many(&api, "eu", "after", 300, "drop").await;

    // Held: 50 before, the probe, every retried key and the 300 after.
    history
        .check_one_region(
            &api,
            50 + 1 + 300 + 300,
            Duration::from_secs(3),
            Vec::new(),
            "the disk full from the 51st hold, freed after 300 more requests",
        )
        .await;
    refused
}
