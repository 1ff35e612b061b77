//! Scratch databases: each server under test gets a fresh one, dropped
//! afterwards, on the one PostgreSQL the whole run shares, or a fresh
//! SQLite file in a directory of its own, removed afterwards.
//!
//! A fresh database per server keeps runs independent (no rows or request
//! keys left over from the last run for the agent to load at start) and
//! lets the agent and the naive baseline write to the same server without
//! seeing each other's tables.

use std::path::PathBuf;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let options: PgConnectOptions = url.parse().context("parsing the database URL")?;
    Ok(options.database(database).to_url_lossy().to_string())
}

/// A database that exists for one server's run.
#[derive(Debug)]
pub struct ScratchDb {
    /// Its name.
    pub name: String,
    /// A URL that connects to it.
    pub url: String,
    admin: PgPool,
}

impl ScratchDb {
    /// Creates (or recreates) database `name` on the server `admin_url`
    /// points at; `admin_url` must be a superuser's or a database owner's.
    pub async fn create(admin_url: &str, name: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            name.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "scratch database names are [a-z0-9_]"
        );
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(admin_url)
            .await
            .with_context(|| format!("connecting to {admin_url}"))?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&admin)
            .await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .with_context(|| format!("creating database {name}"))?;
        Ok(Self {
            name: name.to_owned(),
            url: with_database(admin_url, name)?,
            admin,
        })
    }

    /// Leaves the database in place and closes the connection that made it.
    pub async fn keep(self) {
        self.admin.close().await;
    }

    /// Drops the database, closing any connection still open to it.
    pub async fn drop(self) -> anyhow::Result<()> {
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ))
        .execute(&self.admin)
        .await
        .with_context(|| format!("dropping database {}", self.name))?;
        self.admin.close().await;
        Ok(())
    }
}

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
