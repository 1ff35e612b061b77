//! Statements: their text, the values bound to their `$n` parameters, and
//! running them on either backend.
//!
//! Scalars bind alike on both. A [`List`] binds as an array on PostgreSQL
//! and as a JSON array on SQLite, which has no arrays; a [`Table`] binds as
//! one array per column on PostgreSQL and as one JSON array of its rows on
//! SQLite. Either way a statement runs once, whatever its lists hold.

use std::borrow::Cow;
use std::io::Write as _;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::sqlite::SqliteArguments;
use sqlx::{Database, Encode, Postgres, Sqlite, Type};

use super::sealed::Link;
use super::{driver, Error, Row, RowOf, Session};
use crate::db::Backend;

/// One value bound to a statement's parameter.
#[derive(Debug, Clone)]
pub enum Arg<'a> {
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
    /// A list: an array on PostgreSQL, a JSON array on SQLite.
    List(List<'a>),
    /// The columns of a [`Table`], bound to as many parameters: an array
    /// each on PostgreSQL; on SQLite the rows as one JSON array in the
    /// first of them (the others bound NULL, and named by no statement).
    Columns(Vec<List<'a>>),
}

/// The values of a list parameter, all of one type.
#[derive(Debug, Clone)]
pub enum List<'a> {
    /// `text[]` / TEXT.
    Text(Vec<&'a str>),
    /// `bigint[]` / INTEGER.
    Int(Vec<i64>),
    /// `integer[]` / INTEGER.
    Int4(Vec<i32>),
    /// `timestamptz[]` / INTEGER ms.
    Time(Vec<DateTime<Utc>>),
}

impl List<'_> {
    /// How many elements it has.
    fn len(&self) -> usize {
        match self {
            List::Text(values) => values.len(),
            List::Int(values) => values.len(),
            List::Int4(values) => values.len(),
            List::Time(values) => values.len(),
        }
    }

    /// Element `i` as JSON, appended to `out`: strings quoted, numbers and
    /// times (ms since the epoch) as numbers; nothing allocated.
    fn push_json(&self, i: usize, out: &mut Vec<u8>) {
        let written = match self {
            List::Text(values) => serde_json::to_writer(&mut *out, values[i]).map_err(Into::into),
            List::Int(values) => write!(out, "{}", values[i]),
            List::Int4(values) => write!(out, "{}", values[i]),
            List::Time(values) => write!(out, "{}", values[i].timestamp_millis()),
        };
        written.expect("writing to memory does not fail");
    }

    /// The list as a JSON array: what SQLite binds it as.
    fn json(&self) -> String {
        let mut out = vec![b'['];
        for i in 0..self.len() {
            if i > 0 {
                out.push(b',');
            }
            self.push_json(i, &mut out);
        }
        out.push(b']');
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// Its PostgreSQL array type.
    fn array_type(&self) -> &'static str {
        match self {
            List::Text(_) => "text[]",
            List::Int(_) => "bigint[]",
            List::Int4(_) => "int[]",
            List::Time(_) => "timestamptz[]",
        }
    }
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

/// `From` for each element type a list holds, as a [`List`] and as an
/// [`Arg`].
macro_rules! list_from {
    ($($element:ty => $variant:ident),+ $(,)?) => {$(
        impl<'a> From<Vec<$element>> for List<'a> {
            fn from(values: Vec<$element>) -> Self {
                List::$variant(values)
            }
        }

        impl<'a> From<Vec<$element>> for Arg<'a> {
            fn from(values: Vec<$element>) -> Self {
                Arg::List(List::$variant(values))
            }
        }
    )+};
}

list_from!(
    &'a str => Text,
    i64 => Int,
    i32 => Int4,
    DateTime<Utc> => Time,
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

/// Lists of equal length read as the rows of a table: `unnest` of arrays
/// on PostgreSQL, on SQLite `json_each` of one JSON array of the rows.
///
/// The table has a column per list, named as given, and `n`, the row's
/// place from 1, to keep the lists' order where it matters (`ORDER BY n`).
#[derive(Debug, Clone)]
pub struct Table<'a> {
    alias: &'static str,
    columns: Vec<(&'static str, List<'a>)>,
}

impl<'a> Table<'a> {
    /// A table with no columns yet, named `alias` in the statement.
    pub fn new(alias: &'static str) -> Self {
        Self {
            alias,
            columns: Vec::new(),
        }
    }

    /// Adds the column `name` holding `values`, as many as every other
    /// column's (a table of columns of different lengths is a bug).
    pub fn column(mut self, name: &'static str, values: impl Into<List<'a>>) -> Self {
        let values = values.into();
        if let Some((_, first)) = self.columns.first() {
            assert_eq!(first.len(), values.len(), "column {name} of {}", self.alias);
        }
        self.columns.push((name, values));
        self
    }

    /// The table as a FROM item, its columns bound from parameter `first`
    /// on, in order ([`Statement::bind_table`]).
    pub fn sql(&self, backend: Backend, first: usize) -> String {
        let params = (first..).map(|n| format!("${n}"));
        let names: Vec<&str> = self.columns.iter().map(|(name, _)| *name).collect();
        match backend {
            Backend::Postgres => {
                let arrays: Vec<String> = params
                    .zip(&self.columns)
                    .map(|(param, (_, values))| format!("{param}::{}", values.array_type()))
                    .collect();
                format!(
                    "unnest({}) WITH ORDINALITY AS {}({}, n)",
                    arrays.join(", "),
                    self.alias,
                    names.join(", ")
                )
            }
            Backend::Sqlite => {
                let values: Vec<String> = names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| format!("j.value ->> {i} AS {name}"))
                    .collect();
                format!(
                    "(SELECT {}, j.key + 1 AS n FROM json_each(${first}) AS j) AS {}",
                    values.join(", "),
                    self.alias
                )
            }
        }
    }
}

/// A statement and the values of its `$n` parameters, in order.
#[derive(Debug, Clone)]
pub struct Statement<'a> {
    text: Cow<'a, str>,
    args: Vec<Arg<'a>>,
}

/// A statement of `text`, to [`Statement::bind`] its parameters to.
pub fn sql<'a>(text: impl Into<Cow<'a, str>>) -> Statement<'a> {
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

    /// Binds the columns of `table` as the next parameters, in order.
    pub fn bind_table(mut self, table: Table<'a>) -> Self {
        let columns = table.columns.into_iter().map(|(_, values)| values);
        self.args.push(Arg::Columns(columns.collect()));
        self
    }

    /// Runs the statement on `on`; the number of rows it changed.
    pub async fn execute(self, on: &mut impl Session) -> Result<u64, Error> {
        match on.link() {
            Link::Postgres(conn) => postgres_query(&self)
                .execute(conn)
                .await
                .map(|done| done.rows_affected())
                .map_err(driver),
            Link::Sqlite(conn) => sqlite_query(&self)
                .execute(conn)
                .await
                .map(|done| done.rows_affected())
                .map_err(driver),
        }
    }

    /// Every row the query returns on `on`.
    pub async fn fetch_all(self, on: &mut impl Session) -> Result<Vec<Row>, Error> {
        let mut rows = Vec::new();
        self.for_each(on, |row| {
            rows.push(row);
            Ok::<_, Error>(())
        })
        .await?;
        Ok(rows)
    }

    /// The first row the query returns on `on`, if any (each query run so
    /// reads at most one row: by its key, or with `LIMIT 1`).
    pub async fn fetch_optional(self, on: &mut impl Session) -> Result<Option<Row>, Error> {
        Ok(self.fetch_all(on).await?.into_iter().next())
    }

    /// Calls `each` with every row the query returns on `on`, as they
    /// stream in, so that no more than one is in memory at a time.
    pub async fn for_each<E: From<Error>>(
        self,
        on: &mut impl Session,
        mut each: impl FnMut(Row) -> Result<(), E> + Send,
    ) -> Result<(), E> {
        match on.link() {
            Link::Postgres(conn) => {
                let mut rows = postgres_query(&self).fetch(conn);
                while let Some(row) = rows.try_next().await.map_err(driver)? {
                    each(Row(RowOf::Postgres(row)))?;
                }
            }
            Link::Sqlite(conn) => {
                let mut rows = sqlite_query(&self).fetch(conn);
                while let Some(row) = rows.try_next().await.map_err(driver)? {
                    each(Row(RowOf::Sqlite(row)))?;
                }
            }
        }
        Ok(())
    }
}

/// `statement` as a PostgreSQL query: times as `timestamptz`, lists and
/// each column of a table as arrays.
fn postgres_query<'q>(statement: &'q Statement<'q>) -> Query<'q, Postgres, PgArguments> {
    let array = |query: Query<'q, Postgres, PgArguments>, values: &'q List<'q>| match values {
        List::Text(values) => query.bind(values),
        List::Int(values) => query.bind(values),
        List::Int4(values) => query.bind(values),
        List::Time(values) => query.bind(values),
    };
    bound(
        statement,
        |at| at,
        array,
        |query, columns| columns.iter().fold(query, array),
    )
}

/// `statement` as a SQLite query: times as ms since the epoch, lists as
/// JSON arrays, a table as the JSON array of its rows ([`Arg::Columns`]).
fn sqlite_query<'q>(statement: &'q Statement<'q>) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    bound(
        statement,
        |at| at.timestamp_millis(),
        |query, values| query.bind(values.json()),
        |query, columns| {
            let query = query.bind(rows_json(columns));
            (1..columns.len()).fold(query, |query, _| query.bind(None::<i64>))
        },
    )
}

/// The rows of a table's `columns` as one JSON array of arrays.
fn rows_json(columns: &[List<'_>]) -> String {
    let rows = columns.first().map_or(0, List::len);
    let mut out = vec![b'['];
    for row in 0..rows {
        out.extend_from_slice(if row == 0 { b"[" } else { b",[" });
        for (i, column) in columns.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            column.push_json(row, &mut out);
        }
        out.push(b']');
    }
    out.push(b']');
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// `statement` as a driver's query for backend `DB`, with times stored as
/// `time` makes them, lists bound by `list` and a table's columns by
/// `columns`.
fn bound<'q, DB, T>(
    statement: &'q Statement<'q>,
    time: fn(DateTime<Utc>) -> T,
    list: impl Fn(
        Query<'q, DB, <DB as Database>::Arguments<'q>>,
        &'q List<'q>,
    ) -> Query<'q, DB, <DB as Database>::Arguments<'q>>,
    columns: impl Fn(
        Query<'q, DB, <DB as Database>::Arguments<'q>>,
        &'q [List<'q>],
    ) -> Query<'q, DB, <DB as Database>::Arguments<'q>>,
) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
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
            Arg::List(values) => list(query, values),
            Arg::Columns(values) => columns(query, values),
        };
    }
    query
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a table reads its lists as `unnest` on PostgreSQL and as
    /// `json_each` of one parameter on SQLite, numbered from `first` on.
    #[test]
    fn a_table_is_unnest_or_json_rows() {
        let table = Table::new("u")
            .column("key", vec!["a", "b"])
            .column("units", vec![1_i64, 2]);
        assert_eq!(
            table.sql(Backend::Postgres, 3),
            "unnest($3::text[], $4::bigint[]) WITH ORDINALITY AS u(key, units, n)"
        );
        assert_eq!(
            table.sql(Backend::Sqlite, 3),
            "(SELECT j.value ->> 0 AS key, j.value ->> 1 AS units, j.key + 1 AS n \
             FROM json_each($3) AS j) AS u"
        );
    }

    /// Goal: on SQLite one statement reads a whole table and a whole list,
    /// in order, with every value as bound (quotes and non-ASCII text,
    /// numbers, times as ms), and the parameters after a table keep their
    /// numbers.
    #[tokio::test]
    async fn sqlite_reads_a_table_and_a_list_in_one_statement() {
        let dir = std::env::temp_dir().join(format!("sql-json-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("t.db").display());
        let migrator = sqlx::migrate::Migrator::DEFAULT;
        let db = crate::sql::Db::open(&url, 1, &migrator, &migrator)
            .await
            .unwrap();
        let mut conn = db.connection().await.unwrap();
        let at = DateTime::from_timestamp_millis(1_700_000_000_123).unwrap();
        let table = Table::new("u")
            .column("key", vec!["a\"'b", "ü\\n", "c"])
            .column("units", vec![1_i64, -2, 3])
            .column("at", vec![at, at, at]);
        let text = format!(
            "SELECT u.key AS key, u.units + $1 AS units, u.at AS at, u.n AS n FROM {} WHERE u.key <> $5 ORDER BY u.n DESC",
            table.sql(Backend::Sqlite, 2)
        );
        let rows = sql(text)
            .bind(10_i64)
            .bind_table(table)
            .bind("c")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        let read: Vec<(String, i64, i64, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.try_get::<String>("key").unwrap(),
                    r.try_get::<i64>("units").unwrap(),
                    r.try_get::<i64>("at").unwrap(),
                    r.try_get::<i64>("n").unwrap(),
                )
            })
            .collect();
        let ms = at.timestamp_millis();
        assert_eq!(
            read,
            vec![("ü\\n".into(), 8, ms, 2), ("a\"'b".into(), 11, ms, 1)]
        );
        let text = format!(
            "SELECT value FROM json_each('[\"x\",\"y\",\"z\"]') WHERE value {} ORDER BY value",
            Backend::Sqlite.in_list("$1")
        );
        let rows = sql(text)
            .bind(vec!["z", "x", "w"])
            .fetch_all(&mut conn)
            .await
            .unwrap();
        let read: Vec<String> = rows.iter().map(|r| r.try_get("value").unwrap()).collect();
        assert_eq!(read, ["x", "z"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Goal: lists of different lengths in one table are refused loudly.
    #[test]
    #[should_panic(expected = "column units of u")]
    fn a_table_of_uneven_columns_is_a_bug() {
        let _ = Table::new("u")
            .column("key", vec!["a", "b"])
            .column("units", vec![1_i64]);
    }
}
