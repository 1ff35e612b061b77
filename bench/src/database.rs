//! The benchmark's own scratch files and what it reports of its database:
//! a fresh SQLite file per agent in a directory of its own, removed
//! afterwards (scratch PostgreSQL databases are the harness's
//! [`harness::database::ScratchDb`]), and the PostgreSQL server's version
//! and durability settings.

use std::path::PathBuf;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;

/// A SQLite file that exists for one agent's run, in a directory of its
/// own (the file, its WAL and its shared-memory index go together).
#[derive(Debug)]
pub struct ScratchFile {
    /// `sqlite://` and the file's path.
    pub url: String,
    dir: PathBuf,
}

impl ScratchFile {
    /// Makes an empty directory `name` in the temporary directory; the
    /// agent creates the file `agent.db` in it.
    pub fn create(name: &str) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing an old {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            url: format!("sqlite://{}", dir.join("agent.db").display()),
            dir,
        })
    }

    /// Removes the directory and the files in it.
    pub fn remove(self) -> anyhow::Result<()> {
        std::fs::remove_dir_all(&self.dir)
            .with_context(|| format!("removing {}", self.dir.display()))
    }
}

/// What the benchmark reports about the PostgreSQL it ran on.
#[derive(Debug, Clone)]
pub struct ServerFacts {
    /// `SELECT version()`, shortened to "PostgreSQL 15.x".
    pub version: String,
    /// `SHOW synchronous_commit`.
    pub synchronous_commit: String,
    /// `SHOW fsync`.
    pub fsync: String,
}

impl ServerFacts {
    /// Whether an acknowledged commit has reached the disk (the durable setting).
    pub fn is_durable(&self) -> bool {
        self.synchronous_commit != "off" && self.fsync == "on"
    }
}

/// Reads version and durability settings.
pub async fn server_facts(admin_url: &str) -> anyhow::Result<ServerFacts> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(admin_url)
        .await
        .with_context(|| format!("connecting to {admin_url}"))?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await?;
    let synchronous_commit: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await?;
    let fsync: String = sqlx::query_scalar("SHOW fsync").fetch_one(&pool).await?;
    pool.close().await;
    let version = version
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    Ok(ServerFacts {
        version: format!("PostgreSQL {version}"),
        synchronous_commit,
        fsync,
    })
}
