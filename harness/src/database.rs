//! Scratch PostgreSQL databases: each server under test gets a fresh one
//! on the server the whole run shares, dropped afterwards (or kept, when
//! the caller wants to look at it).
//!
//! A fresh database per server keeps runs independent (no rows or request
//! keys left over from the last run for an agent to load at start) and
//! lets several servers write to one PostgreSQL without seeing each
//! other's tables.

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// `url` with its database name replaced by `database`.
fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
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
