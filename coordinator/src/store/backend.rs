//! The coordinator's two databases behind one SQL interface.
//!
//! The store's transactions ([`super::books`], [`super::region`],
//! [`super::admin`]) are written once, in SQL that both backends run as it
//! stands: `$n` parameters (SQLite reads them as numbered parameters),
//! `ON CONFLICT ... DO NOTHING`, and affected-row counts that judge every
//! conditional write. Only what differs between the backends is here:
//!
//! - **PostgreSQL** (`postgres://`): a pool of connections. A changing
//!   transaction locks the rows it reads (`FOR UPDATE`, through
//!   [`Tx::locking`]), so transactions on different SKUs run in parallel;
//!   reads for the admin API run in a `REPEATABLE READ READ ONLY` snapshot;
//!   times are `timestamptz`.
//! - **SQLite** (`sqlite://PATH`): one writer connection, and every
//!   changing transaction starts with `BEGIN IMMEDIATE`, so it holds the
//!   file's write lock before its first read: everything it reads stays as
//!   read until it commits, which is what `FOR UPDATE` gives on
//!   PostgreSQL, and [`Tx::locking`] drops the clause. Reads run on reader
//!   connections, each transaction seeing one committed snapshot of the
//!   WAL; times are INTEGER milliseconds since the epoch.
//!
//! No `sqlx` type crosses this module's interface: a statement is built
//! with [`sql`] and run in a [`Tx`] as a sqlx query would be
//! (`sql(..).bind(..).execute(&mut *tx)`), rows are read with [`Row::try_get`]
//! and [`Row::time`], and errors arrive as [`StoreError::Database`].

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use service_kit::db::{self, Backend};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::sqlite::SqliteRow;
use sqlx::{Database, Decode, Encode, Postgres, Sqlite, Transaction, Type};

use super::{StoreError, POSTGRES_MIGRATOR, SQLITE_MIGRATOR};

/// A driver error as a [`StoreError`]; its type stays in this module.
fn database(error: sqlx::Error) -> StoreError {
    StoreError::Database(error.to_string())
}

/// The coordinator's database connections.
#[derive(Debug, Clone)]
pub(super) enum Db {
    /// A PostgreSQL pool.
    Postgres(PgPool),
    /// A SQLite file's writer connection and its readers.
    Sqlite(db::SqlitePools),
}

impl Db {
    /// Opens the database `url` names and applies its migrations:
    /// `postgres://...` with `pool_size` connections, or `sqlite://PATH`
    /// (created if missing) with `pool_size` readers beside one writer.
    pub async fn open(url: &str, pool_size: u32) -> Result<Self, StoreError> {
        match Backend::of(url).map_err(StoreError::Database)? {
            Backend::Postgres => db::connect_postgres(url, pool_size, &POSTGRES_MIGRATOR)
                .await
                .map(Db::Postgres),
            Backend::Sqlite => db::open_sqlite(url, pool_size, &SQLITE_MIGRATOR)
                .await
                .map(Db::Sqlite),
        }
        .map_err(database)
    }

    /// A transaction that may change the books. On SQLite it holds the
    /// file's write lock from its start (`BEGIN IMMEDIATE`).
    pub async fn write(&self) -> Result<Tx, StoreError> {
        match self {
            Db::Postgres(pool) => pool.begin().await.map(Tx::Postgres),
            Db::Sqlite(pools) => pools
                .writer
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map(Tx::Sqlite),
        }
        .map_err(database)
    }

    /// A read-only transaction that sees one committed state throughout,
    /// so what it reads adds up as it was at one instant.
    pub async fn snapshot(&self) -> Result<Tx, StoreError> {
        match self {
            Db::Postgres(pool) => {
                let mut tx = Tx::Postgres(pool.begin().await.map_err(database)?);
                sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .execute(&mut tx)
                    .await?;
                Ok(tx)
            }
            // In WAL mode a read transaction reads one snapshot from its
            // first read on, and never waits for the writer.
            Db::Sqlite(pools) => pools
                .readers
                .begin()
                .await
                .map(Tx::Sqlite)
                .map_err(database),
        }
    }
}

/// An open transaction on either backend; dropped without
/// [`Tx::commit`], it rolls back.
pub(super) enum Tx {
    /// On PostgreSQL.
    Postgres(Transaction<'static, Postgres>),
    /// On SQLite.
    Sqlite(Transaction<'static, Sqlite>),
}

impl Tx {
    /// `clause` (e.g. `FOR UPDATE`, `FOR UPDATE OF s`) where the backend
    /// locks rows; nothing on SQLite, whose write transactions already hold
    /// the file's write lock ([`Db::write`]).
    pub fn locking(&self, clause: &'static str) -> &'static str {
        match self {
            Tx::Postgres(_) => clause,
            Tx::Sqlite(_) => "",
        }
    }

    /// Commits.
    pub async fn commit(self) -> Result<(), StoreError> {
        match self {
            Tx::Postgres(tx) => tx.commit().await,
            Tx::Sqlite(tx) => tx.commit().await,
        }
        .map_err(database)
    }
}

/// One value bound to a statement's parameter.
#[derive(Debug, Clone)]
pub(super) enum Arg<'a> {
    /// `bigint` / INTEGER.
    Int(i64),
    /// `integer` / INTEGER.
    Int4(i32),
    /// `double precision` / REAL.
    Real(f64),
    /// `boolean` / INTEGER 0 or 1.
    Flag(bool),
    /// `text` / TEXT; `None` is NULL.
    Text(Option<Cow<'a, str>>),
    /// `timestamptz` / INTEGER ms; `None` is NULL.
    Time(Option<DateTime<Utc>>),
}

/// `From` for each value type bound as it is.
macro_rules! arg_from {
    ($($value:ty => $variant:ident),+ $(,)?) => {$(
        impl From<$value> for Arg<'_> {
            fn from(value: $value) -> Self {
                Arg::$variant(value)
            }
        }
    )+};
}

arg_from!(
    i64 => Int,
    i32 => Int4,
    f64 => Real,
    bool => Flag,
    Option<DateTime<Utc>> => Time,
);

impl<'a, T: AsRef<str> + ?Sized> From<&'a T> for Arg<'a> {
    fn from(value: &'a T) -> Self {
        Arg::Text(Some(Cow::Borrowed(value.as_ref())))
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Arg::Text(value.map(Cow::Borrowed))
    }
}

impl From<Option<String>> for Arg<'_> {
    fn from(value: Option<String>) -> Self {
        Arg::Text(value.map(Cow::Owned))
    }
}

impl From<DateTime<Utc>> for Arg<'_> {
    fn from(at: DateTime<Utc>) -> Self {
        Arg::Time(Some(at))
    }
}

/// A statement and the values of its `$n` parameters, in order.
#[derive(Debug, Clone)]
pub(super) struct Statement<'a> {
    text: Cow<'a, str>,
    args: Vec<Arg<'a>>,
}

/// A statement of `text`, to [`Statement::bind`] its parameters to.
pub(super) fn sql<'a>(text: impl Into<Cow<'a, str>>) -> Statement<'a> {
    Statement {
        text: text.into(),
        args: Vec::new(),
    }
}

impl<'a> Statement<'a> {
    /// Binds the next parameter.
    pub fn bind(mut self, value: impl Into<Arg<'a>>) -> Self {
        self.args.push(value.into());
        self
    }

    /// Runs the statement in `tx`; the number of rows it changed.
    pub async fn execute(self, tx: &mut Tx) -> Result<u64, StoreError> {
        match tx {
            Tx::Postgres(tx) => bound(&self, postgres_time)
                .execute(&mut **tx)
                .await
                .map(|done| done.rows_affected()),
            Tx::Sqlite(tx) => bound(&self, sqlite_time)
                .execute(&mut **tx)
                .await
                .map(|done| done.rows_affected()),
        }
        .map_err(database)
    }

    /// Every row the query returns in `tx`.
    pub async fn fetch_all(self, tx: &mut Tx) -> Result<Vec<Row>, StoreError> {
        match tx {
            Tx::Postgres(tx) => bound(&self, postgres_time)
                .fetch_all(&mut **tx)
                .await
                .map(|rows| rows.into_iter().map(Row::Postgres).collect()),
            Tx::Sqlite(tx) => bound(&self, sqlite_time)
                .fetch_all(&mut **tx)
                .await
                .map(|rows| rows.into_iter().map(Row::Sqlite).collect()),
        }
        .map_err(database)
    }

    /// The first row the query returns in `tx`, if any (each query run so
    /// reads at most one row: by its key, or with `LIMIT 1`).
    pub async fn fetch_optional(self, tx: &mut Tx) -> Result<Option<Row>, StoreError> {
        Ok(self.fetch_all(tx).await?.into_iter().next())
    }
}

/// A time as PostgreSQL stores it.
fn postgres_time(at: DateTime<Utc>) -> DateTime<Utc> {
    at
}

/// A time as the SQLite schema stores it: ms since the epoch.
fn sqlite_time(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

/// `statement` as a driver's query for backend `DB`, with times stored as
/// `time` makes them.
fn bound<'q, DB, T>(
    statement: &'q Statement<'q>,
    time: fn(DateTime<Utc>) -> T,
) -> sqlx::query::Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    Option<T>: Encode<'q, DB> + Type<DB> + 'q,
    i64: Encode<'q, DB> + Type<DB>,
    i32: Encode<'q, DB> + Type<DB>,
    f64: Encode<'q, DB> + Type<DB>,
    bool: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
{
    let mut query = sqlx::query(&statement.text);
    for arg in &statement.args {
        query = match arg {
            Arg::Int(value) => query.bind(*value),
            Arg::Int4(value) => query.bind(*value),
            Arg::Real(value) => query.bind(*value),
            Arg::Flag(value) => query.bind(*value),
            Arg::Text(value) => query.bind(value.as_deref()),
            Arg::Time(at) => query.bind(at.map(time)),
        };
    }
    query
}

/// A row a query returned.
pub(super) enum Row {
    /// From PostgreSQL.
    Postgres(PgRow),
    /// From SQLite.
    Sqlite(SqliteRow),
}

impl Row {
    /// The value of `column`, as a type both backends decode (`i64` for a
    /// `bigint`, `i32` for an `integer`, `bool`, `f64`, `&str`, `String`).
    pub fn try_get<'r, T>(&'r self, column: &str) -> Result<T, StoreError>
    where
        T: Decode<'r, Postgres> + Type<Postgres> + Decode<'r, Sqlite> + Type<Sqlite>,
    {
        use sqlx::Row as _;
        match self {
            Row::Postgres(row) => row.try_get(column),
            Row::Sqlite(row) => row.try_get(column),
        }
        .map_err(database)
    }

    /// The time in `column`, NULL as `None`.
    pub fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        use sqlx::Row as _;
        match self {
            Row::Postgres(row) => row.try_get(column).map_err(database),
            Row::Sqlite(row) => {
                let ms: Option<i64> = row.try_get(column).map_err(database)?;
                ms.map(|ms| {
                    DateTime::from_timestamp_millis(ms).ok_or_else(|| {
                        StoreError::Corrupt(format!("stored {column} {ms} ms out of range"))
                    })
                })
                .transpose()
            }
        }
    }
}
