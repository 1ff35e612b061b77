//! Opening a service's database, the same way for the coordinator and the
//! region agent: the backend named by the URL's scheme, connected with the
//! bounds and durability both services rely on, and migrated before use.
//!
//! - PostgreSQL (`postgres://` or `postgresql://`): a pool whose statements
//!   time out after [`STATEMENT_TIMEOUT`], so a hung statement fails rather
//!   than holding row locks (and a drain) forever; with several hosts, on
//!   the primary among them ([`crate::primary`]).
//! - SQLite (`sqlite://PATH`, the file created if missing): WAL with
//!   `synchronous=FULL` (the log is synced at every commit, so an answer
//!   sent after a commit survives a power cut), foreign keys on, and two
//!   pools: one writer connection, so a process's write transactions queue
//!   for it rather than fail with `SQLITE_BUSY`, and readers beside it,
//!   which read a committed snapshot without waiting for the writer. A write
//!   waits at most [`SQLITE_BUSY_TIMEOUT`] for the file's write lock (held by
//!   another process) or for the writer connection.
//!
//! What each service does with the connections (its SQL, its transactions)
//! is its own; [`crate::sql`] runs that SQL on either backend.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, TransactionManager};

use crate::primary::{self, Hosts, LastMove};

/// Longest a PostgreSQL statement may run.
pub const STATEMENT_TIMEOUT: &str = "10s";

/// Longest a PostgreSQL connection is waited for.
pub const POSTGRES_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest a SQLite write waits for the file's write lock or the writer
/// connection, as [`STATEMENT_TIMEOUT`] bounds a PostgreSQL statement.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://...` or `postgresql://...`.
    Postgres,
    /// `sqlite://PATH`.
    Sqlite,
}

impl Backend {
    /// The backend of `url`, by its scheme; otherwise what is expected.
    pub fn of(url: &str) -> Result<Self, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else {
            Err("unsupported database URL: expected postgres://... or sqlite://PATH".into())
        }
    }
}

/// Connects to the PostgreSQL database at `url` with `pool_size`
/// connections and applies `migrator`. A URL naming several hosts
/// (`postgres://u@h1,h2/db?target_session_attrs=read-write`) gets a pool on
/// the host that is the primary now, which refuses connections to a standby
/// and follows the primary when it moves ([`crate::primary`]); the
/// [`LastMove`] answered records those moves (a single host never moves).
pub async fn connect_postgres(
    url: &str,
    pool_size: u32,
    migrator: &Migrator,
) -> Result<(PgPool, Arc<LastMove>), sqlx::Error> {
    let hosts = Hosts::parse(url)
        .map_err(|e| sqlx::Error::Configuration(format!("database URL: {e}").into()))?
        .map_options(|o| o.options([("statement_timeout", STATEMENT_TIMEOUT)]));
    let pool_options = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(POSTGRES_ACQUIRE_TIMEOUT);
    if hosts.len() == 1 {
        let pool = pool_options.connect_with(hosts.options(0).clone()).await?;
        migrator.run(&pool).await?;
        return Ok((pool, Arc::default()));
    }
    let first = hosts.find_primary().await.ok_or_else(|| {
        let names: Vec<&str> = (0..hosts.len()).map(|i| hosts.name(i)).collect();
        sqlx::Error::Configuration(
            format!("none of the database hosts {names:?} is a primary that answers").into(),
        )
    })?;
    let last_move = Arc::new(LastMove::default());
    let moved = last_move.clone();
    let pool = pool_options
        .acquire_timeout(primary::ACQUIRE_TIMEOUT)
        // A primary whose machine froze keeps its connections open and
        // never answers: a connection made before the pool last moved to
        // another host is dropped when taken, and one that does not answer
        // a ping within PROBE_TIMEOUT when taken or given back is dropped,
        // so the pool's connections move to the promoted standby instead
        // of hanging on the frozen host.
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let moved = moved.clone();
            Box::pin(async move {
                if moved.predates(meta.age) {
                    return Ok(false);
                }
                answers_in_time(conn).await
            })
        })
        .after_release(|conn, _| Box::pin(answers_in_time(conn)))
        .after_connect(|conn, _| {
            Box::pin(async move {
                if primary::refuses_writes(conn).await? {
                    return Err(sqlx::Error::Configuration(
                        "connected to a standby: writes go to the primary only".into(),
                    ));
                }
                Ok(())
            })
        })
        .connect_with(hosts.options(first).clone())
        .await?;
    migrator.run(&pool).await?;
    tracing::info!(primary = hosts.name(first), "database primary found");
    tokio::spawn(primary::follow(
        pool.clone(),
        hosts,
        first,
        last_move.clone(),
    ));
    Ok((pool, last_move))
}

/// Whether `conn` answers a ping within [`primary::PROBE_TIMEOUT`]; an
/// error (the pool then drops the connection) if it does not.
async fn answers_in_time(conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
    use sqlx::Connection;
    match tokio::time::timeout(primary::PROBE_TIMEOUT, conn.ping()).await {
        Ok(pinged) => pinged.map(|()| true),
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer to a ping in {:?}", primary::PROBE_TIMEOUT),
        ))),
    }
}

/// How every connection to a SQLite file is opened: created if missing,
/// WAL, synced commits, foreign keys on, waiting for the write lock.
pub fn sqlite_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: the WAL is synced at every commit, so an acknowledged
        // write survives a power cut; NORMAL would only survive a crash.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .foreign_keys(true))
}

/// A SQLite file's connections: one writer, and readers beside it.
#[derive(Debug, Clone)]
pub struct SqlitePools {
    /// The one connection every write transaction goes through.
    pub writer: SqlitePool,
    /// Connections for reads, each seeing a committed snapshot.
    pub readers: SqlitePool,
}

/// Opens the SQLite file at `url` (`sqlite://PATH`), creating it if
/// missing, applies `migrator` through the writer, and opens `readers`
/// reader connections (at least one).
pub async fn open_sqlite(
    url: &str,
    readers: u32,
    migrator: &Migrator,
) -> Result<SqlitePools, sqlx::Error> {
    let options = sqlite_options(url)?;
    let writer = sqlite_pool(1).connect_with(options.clone()).await?;
    migrator.run(&writer).await?;
    let readers = sqlite_pool(readers.max(1)).connect_with(options).await?;
    Ok(SqlitePools { writer, readers })
}

/// A pool of `size` SQLite connections, each left outside any transaction
/// when it goes back to the pool.
///
/// sqlx begins a transaction with a custom statement (`BEGIN IMMEDIATE`)
/// in two steps; a request cancelled between them (timed out, its client
/// gone) hands the connection back inside a transaction that nothing will
/// end, and every later `BEGIN` on it fails ("non-zero transaction depth"):
/// the one writer connection would refuse every write from then on. So a
/// connection released inside a transaction is rolled back (a no-op if
/// the dropped transaction's own rollback got there first), and one that
/// cannot be is closed and replaced.
fn sqlite_pool(size: u32) -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .max_connections(size)
        .acquire_timeout(SQLITE_BUSY_TIMEOUT)
        .after_release(|conn, _| {
            Box::pin(async move {
                if !sqlx::Connection::is_in_transaction(conn) {
                    return Ok(true);
                }
                let rolled_back =
                    <Sqlite as sqlx::Database>::TransactionManager::rollback(conn).await;
                tracing::info!(
                    ok = rolled_back.is_ok(),
                    "ended a transaction left open on release"
                );
                Ok(rolled_back.is_ok())
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the scheme alone picks the backend, and anything else is refused.
    #[test]
    fn the_scheme_picks_the_backend() {
        assert_eq!(Backend::of("postgres://h/db"), Ok(Backend::Postgres));
        assert_eq!(Backend::of("postgresql://h/db"), Ok(Backend::Postgres));
        assert_eq!(Backend::of("sqlite://./x.db"), Ok(Backend::Sqlite));
        assert!(Backend::of("mysql://h/db").is_err());
        assert!(Backend::of("").is_err());
    }
}
