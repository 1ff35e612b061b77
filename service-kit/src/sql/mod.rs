//! One SQL interface over both databases a service may open.
//!
//! A service writes its transactions once, in SQL that PostgreSQL and
//! SQLite both run as it stands: `$n` parameters (SQLite reads them as
//! numbered parameters), `ON CONFLICT ... DO NOTHING`, `RETURNING`, and
//! affected-row counts that judge every conditional write. Only what differs
//! between the backends is here:
//!
//! - **Connections** ([`crate::db`]). PostgreSQL: a pool. SQLite: one writer
//!   connection, through which every changing transaction goes, and readers.
//! - **Locking.** On PostgreSQL a changing transaction locks the rows it
//!   reads (`FOR UPDATE`, `FOR SHARE`: [`Tx::locking`]), so transactions on
//!   different rows run in parallel. On SQLite every changing transaction
//!   starts with `BEGIN IMMEDIATE` ([`Db::write`]), so it holds the file's
//!   write lock before its first read: everything it reads stays as read
//!   until it commits, which is what the clause gives on PostgreSQL, and
//!   [`Tx::locking`] drops it.
//! - **Snapshots** ([`Db::snapshot`]). `REPEATABLE READ READ ONLY` on
//!   PostgreSQL; on SQLite a read transaction on a reader connection, which
//!   in WAL mode sees one committed state from its first read and never
//!   waits for the writer.
//! - **Times.** `timestamptz` on PostgreSQL, INTEGER milliseconds since the
//!   epoch on SQLite: bound as [`Arg::Time`], read with [`Row::time`], the
//!   database's own clock written as [`Backend::now`].
//! - **Lists.** PostgreSQL binds a list as an array (`= ANY($n)`,
//!   `unnest`); SQLite has no arrays and binds it as a JSON array text,
//!   read with `json_each`. [`Backend::in_list`] and [`Table`] write the
//!   two forms. On both a statement runs once for all of a list's
//!   elements.
//!
//! No sqlx type crosses this interface but the pools and migrations a
//! service hands in: a statement is built with [`sql`] and run in a [`Tx`]
//! or on a [`Conn`] as a sqlx query would be
//! (`sql(..).bind(..).execute(&mut tx)`), rows are read with
//! [`Row::try_get`] and [`Row::time`], and errors arrive as [`Error`].

mod statement;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgRow};
use sqlx::sqlite::SqliteRow;
use sqlx::{Decode, Postgres, Sqlite, Transaction, Type};

use crate::db::{self, Backend, SqlitePools};
use crate::primary::LastMove;

pub use statement::{sql, Arg, List, Statement, Table};

/// Why a statement failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A CHECK constraint refused a write; the driver's message.
    #[error("{0}")]
    CheckViolation(String),
    /// A stored value its type cannot hold (a time out of range).
    #[error("{0}")]
    Corrupt(String),
    /// The database could not be reached or failed; the driver's message.
    #[error("{0}")]
    Database(String),
    /// The connection failed while a statement waited for its answer (an
    /// I/O or protocol error, not the server's refusal): a write it
    /// carried, a commit above all, may have happened or not.
    #[error("{0}")]
    Unanswered(String),
}

/// A driver error as an [`Error`]; its type stays in this module.
fn driver(error: sqlx::Error) -> Error {
    match &error {
        sqlx::Error::Database(db) if db.is_check_violation() => {
            Error::CheckViolation(error.to_string())
        }
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => {
            Error::Unanswered(error.to_string())
        }
        _ => Error::Database(error.to_string()),
    }
}

/// A service's database connections.
#[derive(Debug, Clone)]
pub struct Db(Pools);

#[derive(Debug, Clone)]
enum Pools {
    Postgres(PgPool, Arc<LastMove>),
    Sqlite(SqlitePools),
}

impl Db {
    /// Opens the database `url` names and applies its migrations:
    /// `postgres://...` with `pool_size` connections and `postgres`, or
    /// `sqlite://PATH` (created if missing) with `pool_size` readers beside
    /// one writer and `sqlite`.
    pub async fn open(
        url: &str,
        pool_size: u32,
        postgres: &Migrator,
        sqlite: &Migrator,
    ) -> Result<Self, Error> {
        match Backend::of(url).map_err(Error::Database)? {
            Backend::Postgres => db::connect_postgres(url, pool_size, postgres)
                .await
                .map(|(pool, moves)| Pools::Postgres(pool, moves)),
            Backend::Sqlite => db::open_sqlite(url, pool_size, sqlite)
                .await
                .map(Pools::Sqlite),
        }
        .map(Db)
        .map_err(driver)
    }

    /// The connections of `pool`, whose database has the service's
    /// migrations applied already.
    pub fn postgres(pool: PgPool) -> Self {
        Db(Pools::Postgres(pool, Arc::default()))
    }

    /// Waits until the database's primary moves to another host (never,
    /// for a single host or SQLite): a call in flight on the old one will
    /// not be answered there.
    pub async fn primary_moved(&self) {
        match &self.0 {
            Pools::Postgres(_, moves) => moves.next_move().await,
            Pools::Sqlite(_) => std::future::pending().await,
        }
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        match self.0 {
            Pools::Postgres(..) => Backend::Postgres,
            Pools::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// A transaction that may change rows. On SQLite it holds the file's
    /// write lock from its start (`BEGIN IMMEDIATE`).
    pub async fn write(&self) -> Result<Tx, Error> {
        match &self.0 {
            Pools::Postgres(pool, _) => pool.begin().await.map(TxOn::Postgres),
            Pools::Sqlite(pools) => pools
                .writer
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map(TxOn::Sqlite),
        }
        .map(Tx)
        .map_err(driver)
    }

    /// A read-only transaction that sees one committed state throughout,
    /// so what it reads adds up as it was at one instant.
    pub async fn snapshot(&self) -> Result<Tx, Error> {
        match &self.0 {
            Pools::Postgres(pool, _) => {
                let mut tx = Tx(TxOn::Postgres(pool.begin().await.map_err(driver)?));
                sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .execute(&mut tx)
                    .await?;
                Ok(tx)
            }
            // In WAL mode a read transaction reads one snapshot from its
            // first read on, and never waits for the writer.
            Pools::Sqlite(pools) => pools
                .readers
                .begin()
                .await
                .map(|tx| Tx(TxOn::Sqlite(tx)))
                .map_err(driver),
        }
    }

    /// A connection outside any transaction, where each statement commits
    /// on its own: one of the pool's on PostgreSQL, a reader on SQLite, so
    /// there it serves reads only (writes go through [`Db::write`]).
    pub async fn connection(&self) -> Result<Conn, Error> {
        match &self.0 {
            Pools::Postgres(pool, _) => pool.acquire().await.map(ConnOn::Postgres),
            Pools::Sqlite(pools) => pools.readers.acquire().await.map(ConnOn::Sqlite),
        }
        .map(Conn)
        .map_err(driver)
    }
}

/// An open transaction on either backend; dropped without [`Tx::commit`],
/// it rolls back.
pub struct Tx(TxOn);

enum TxOn {
    Postgres(Transaction<'static, Postgres>),
    Sqlite(Transaction<'static, Sqlite>),
}

impl Tx {
    /// Which database this transaction is on.
    pub fn backend(&self) -> Backend {
        match self.0 {
            TxOn::Postgres(_) => Backend::Postgres,
            TxOn::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// `clause` (e.g. `FOR UPDATE`, `FOR SHARE`) where the backend locks
    /// rows; nothing on SQLite, whose write transactions already hold the
    /// file's write lock ([`Db::write`]).
    pub fn locking(&self, clause: &'static str) -> &'static str {
        match self.backend() {
            Backend::Postgres => clause,
            Backend::Sqlite => "",
        }
    }

    /// Commits.
    pub async fn commit(self) -> Result<(), Error> {
        match self.0 {
            TxOn::Postgres(tx) => tx.commit().await,
            TxOn::Sqlite(tx) => tx.commit().await,
        }
        .map_err(driver)
    }
}

/// A pooled connection outside any transaction ([`Db::connection`]).
pub struct Conn(ConnOn);

enum ConnOn {
    Postgres(PoolConnection<Postgres>),
    Sqlite(PoolConnection<Sqlite>),
}

impl Conn {
    /// Which database this connection is to.
    pub fn backend(&self) -> Backend {
        match self.0 {
            ConnOn::Postgres(_) => Backend::Postgres,
            ConnOn::Sqlite(_) => Backend::Sqlite,
        }
    }
}

/// Where a statement runs: a [`Tx`] or a [`Conn`].
pub trait Session: sealed::Linked + Send {}

impl Session for Tx {}

impl Session for Conn {}

/// The connection under a [`Session`], which only this module reaches.
mod sealed {
    use sqlx::{PgConnection, SqliteConnection};

    /// A session's connection, on one backend or the other.
    pub enum Link<'c> {
        /// To PostgreSQL.
        Postgres(&'c mut PgConnection),
        /// To SQLite.
        Sqlite(&'c mut SqliteConnection),
    }

    /// What has a connection to run statements on.
    pub trait Linked {
        /// The connection.
        fn link(&mut self) -> Link<'_>;
    }

    impl Linked for super::Tx {
        fn link(&mut self) -> Link<'_> {
            match &mut self.0 {
                super::TxOn::Postgres(tx) => Link::Postgres(tx),
                super::TxOn::Sqlite(tx) => Link::Sqlite(tx),
            }
        }
    }

    impl Linked for super::Conn {
        fn link(&mut self) -> Link<'_> {
            match &mut self.0 {
                super::ConnOn::Postgres(conn) => Link::Postgres(conn),
                super::ConnOn::Sqlite(conn) => Link::Sqlite(conn),
            }
        }
    }
}

/// The SQL that differs between the backends, to write into a statement.
impl Backend {
    /// The database's clock as its time columns hold it. For bookkeeping
    /// columns only: whatever a decision compares with is bound from the
    /// service's own clock, which the database's may not agree with.
    pub fn now(self) -> &'static str {
        match self {
            Backend::Postgres => "now()",
            Backend::Sqlite => "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        }
    }

    /// The test that a value is one of the list parameter `param`'s (`$n`,
    /// bound as a [`List`]): `column {in_list}` holds for any of its
    /// elements, as `= ANY($n)` of the array on PostgreSQL and as `IN` the
    /// JSON array's `json_each` on SQLite.
    pub fn in_list(self, param: &str) -> String {
        match self {
            Backend::Postgres => format!("= ANY({param})"),
            Backend::Sqlite => format!("IN (SELECT value FROM json_each({param}))"),
        }
    }
}

/// A row a query returned.
pub struct Row(RowOf);

enum RowOf {
    Postgres(PgRow),
    Sqlite(SqliteRow),
}

impl Row {
    /// The value of `column`, as a type both backends decode (`i64` for a
    /// `bigint`, `i32` for an `integer`, `bool`, `f64`, `&str`, `String`,
    /// and `Option` of any of them where the column may be NULL).
    pub fn try_get<'r, T>(&'r self, column: &str) -> Result<T, Error>
    where
        T: Decode<'r, Postgres> + Type<Postgres> + Decode<'r, Sqlite> + Type<Sqlite>,
    {
        use sqlx::Row as _;
        match &self.0 {
            RowOf::Postgres(row) => row.try_get(column),
            RowOf::Sqlite(row) => row.try_get(column),
        }
        .map_err(driver)
    }

    /// The time in `column`, NULL as `None`.
    pub fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, Error> {
        use sqlx::Row as _;
        match &self.0 {
            RowOf::Postgres(row) => row.try_get(column).map_err(driver),
            RowOf::Sqlite(row) => {
                let ms: Option<i64> = row.try_get(column).map_err(driver)?;
                ms.map(|ms| {
                    DateTime::from_timestamp_millis(ms).ok_or_else(|| {
                        Error::Corrupt(format!("stored {column} {ms} ms out of range"))
                    })
                })
                .transpose()
            }
        }
    }
}
