//! One test source, two database backends.
//!
//! A conformance test is an `async fn(TestDb)`; [`on_both_backends!`]
//! instantiates it twice, as `NAME::postgres` (a fresh PostgreSQL database
//! from `#[sqlx::test]`'s machinery, migrated) and `NAME::sqlite` (a fresh
//! SQLite file in its own temporary directory, migrated). [`TestDb`] is
//! what the test sees of its database: the URL to give a service, and
//! portable SQL for what the test reads, writes behind the service's back,
//! or locks. A test that runs several services (a coordinator and its
//! region agents) gives each its own database on the same backend with
//! [`TestDb::sibling`].
//!
//! The PostgreSQL half is skipped, loudly, when no PostgreSQL is reachable
//! and `ESCROW_REQUIRE_POSTGRES` is unset; with it set, an unreachable
//! PostgreSQL fails every PostgreSQL test.
//!
//! [`on_both_backends!`]: crate::on_both_backends

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgPool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Connection, PgConnection, Row, SqliteConnection};

use crate::db::{database_url, server_of};
use crate::poll::eventually;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A PostgreSQL server's fresh database.
    Postgres,
    /// A fresh SQLite file.
    Sqlite,
}

#[derive(Debug, Clone)]
enum Pool {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// `$body` with `$name` bound to what the `Postgres` or `Sqlite` variant
/// of `$value` (an `$enum`) holds: sqlx code that reads the same on both
/// backends, written once and compiled for each backend's type.
macro_rules! on_either {
    ($enum:ident, $value:expr, $name:ident => $body:expr) => {
        match $value {
            $enum::Postgres($name) => $body,
            $enum::Sqlite($name) => $body,
        }
    };
}

/// A test's own database, on either backend.
#[derive(Debug)]
pub struct TestDb {
    url: String,
    pool: Pool,
    /// The SQLite file's directory, removed when the test passes.
    dir: Option<PathBuf>,
}

impl TestDb {
    /// The database `#[sqlx::test]`'s machinery made for this test.
    pub fn postgres(pool: PgPool) -> Self {
        Self {
            url: database_url(&pool),
            pool: Pool::Postgres(pool),
            dir: None,
        }
    }

    /// A fresh database `name` on the PostgreSQL server at `server` (e.g. a
    /// [`PgServer`](crate::pg_server::PgServer) of the test's own), with
    /// `migrator`'s schema; one of that name left by an earlier run is
    /// dropped first.
    pub async fn postgres_on(server: &str, name: &str, migrator: &Migrator) -> Self {
        let mut admin = PgConnection::connect(&format!("{server}/postgres"))
            .await
            .unwrap();
        for statement in [
            format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
            format!("CREATE DATABASE \"{name}\""),
        ] {
            sqlx::query(&statement).execute(&mut admin).await.unwrap();
        }
        let pool = PgPool::connect(&format!("{server}/{name}")).await.unwrap();
        migrator.run(&pool).await.unwrap();
        Self::postgres(pool)
    }

    /// A fresh SQLite file in a new temporary directory, with `migrator`'s
    /// schema.
    pub async fn sqlite(migrator: &'static Migrator) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "escrow-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut db = Self::sqlite_file(&dir, "test", migrator).await;
        db.dir = Some(dir);
        db
    }

    /// The SQLite file `NAME.db` in `dir`, created and migrated; the
    /// directory is left to whoever made it.
    async fn sqlite_file(dir: &Path, name: &str, migrator: &Migrator) -> Self {
        let url = format!("sqlite://{}", dir.join(format!("{name}.db")).display());
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(sqlite_options(&url))
            .await
            .unwrap();
        migrator.run(&pool).await.unwrap();
        Self {
            url,
            pool: Pool::Sqlite(pool),
            dir: None,
        }
    }

    /// Another fresh database on the same backend, for another service of
    /// the same test (a region agent beside the coordinator), migrated by
    /// `postgres` or `sqlite`. On PostgreSQL a database named after this
    /// one and `name` (left after the test for inspection, dropped when the
    /// test runs again); on SQLite the file `NAME.db` beside this one's.
    pub async fn sibling(&self, name: &str, postgres: &Migrator, sqlite: &Migrator) -> Self {
        match &self.pool {
            Pool::Postgres(pool) => {
                let base = pool.connect_options().get_database().unwrap().to_owned();
                // PostgreSQL truncates names at 63 bytes: keep a short, unique suffix of this database's.
                let sibling = format!(
                    "{}_{}",
                    &base[base.len().saturating_sub(24)..],
                    name.replace('-', "_")
                );
                Self::postgres_on(&server_of(pool), &sibling, postgres).await
            }
            Pool::Sqlite(_) => {
                let path = self.url.trim_start_matches("sqlite://");
                let dir = Path::new(path).parent().unwrap();
                Self::sqlite_file(dir, name, sqlite).await
            }
        }
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Postgres(_) => Backend::Postgres,
            Pool::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The URL a service is given (`--database-url`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PostgreSQL pool, for a store built on the test's own pool.
    pub fn postgres_pool(&self) -> Option<&PgPool> {
        match &self.pool {
            Pool::Postgres(pool) => Some(pool),
            Pool::Sqlite(_) => None,
        }
    }

    /// Every column of the one row `sql` returns, each an integer.
    pub async fn ints(&self, sql: &str) -> Vec<i64> {
        on_either!(Pool, &self.pool, pool => {
            let row = sqlx::query(sql).fetch_one(pool).await.unwrap();
            (0..row.len()).map(|i| row.get::<i64, _>(i)).collect()
        })
    }

    /// The one integer `sql` returns.
    pub async fn int(&self, sql: &str) -> i64 {
        self.ints(sql).await[0]
    }

    /// Every row `sql` returns, each column as text (write the SQL so
    /// that every column is text on both backends).
    pub async fn text_rows(&self, sql: &str) -> Vec<Vec<String>> {
        on_either!(Pool, &self.pool, pool => {
            let rows = sqlx::query(sql).fetch_all(pool).await.unwrap();
            rows.iter()
                .map(|row| (0..row.len()).map(|i| row.get::<String, _>(i)).collect())
                .collect()
        })
    }

    /// The first column of every row `sql` returns, as text.
    pub async fn texts(&self, sql: &str) -> Vec<String> {
        self.text_rows(sql)
            .await
            .into_iter()
            .map(|mut row| row.swap_remove(0))
            .collect()
    }

    /// Runs `sql` (a write behind the service's back); the rows it changed.
    pub async fn execute(&self, sql: &str) -> u64 {
        on_either!(Pool, &self.pool, pool => {
            sqlx::query(sql).execute(pool).await.unwrap().rows_affected()
        })
    }

    /// Runs `sql` in a transaction whose connection then closes without
    /// COMMIT, as a process that dies mid-transaction leaves it.
    pub async fn uncommitted(&self, sql: &str) {
        let mut tx = self.begin("BEGIN IMMEDIATE").await;
        tx.execute(sql).await;
        drop(tx);
    }

    /// A connection holding the write lock on every SKU's counters (the
    /// agent's `sku_stock`), so a service's next commit waits until
    /// [`Locked::release`]; see [`Self::lock_rows_of`].
    pub async fn lock_writes(&self) -> Locked {
        self.lock_rows_of("sku_stock").await
    }

    /// A connection holding the write lock on every row of `table`, so a
    /// service's next write there waits until [`Locked::release`]. On
    /// PostgreSQL the rows are locked `FOR UPDATE`; on SQLite the file's
    /// one write lock is taken (`BEGIN IMMEDIATE`).
    pub async fn lock_rows_of(&self, table: &str) -> Locked {
        let mut locked = self.begin("BEGIN IMMEDIATE").await;
        if self.backend() == Backend::Postgres {
            locked
                .execute(&format!("SELECT 1 FROM {table} FOR UPDATE"))
                .await;
        }
        locked
    }

    /// A connection holding the strongest lock the backend has on the
    /// agent's tables. On PostgreSQL no statement on them, read or write,
    /// proceeds until [`Locked::release`]; on SQLite no write does (in WAL
    /// mode a reader never waits for a writer, whatever its lock).
    pub async fn lock_all(&self) -> Locked {
        let mut locked = self.begin("BEGIN EXCLUSIVE").await;
        if self.backend() == Backend::Postgres {
            let tables = "reservations, sku_stock, region_lease";
            locked
                .execute(&format!("LOCK TABLE {tables} IN ACCESS EXCLUSIVE MODE"))
                .await;
        }
        locked
    }

    /// A connection of its own, in a transaction: on PostgreSQL a plain
    /// `BEGIN`, on SQLite `sqlite_begin` (`BEGIN IMMEDIATE` takes the file's
    /// write lock at once, `BEGIN EXCLUSIVE` keeps other writers out too).
    async fn begin(&self, sqlite_begin: &str) -> Locked {
        let (mut locked, begin) = match &self.pool {
            Pool::Postgres(pool) => {
                let conn = PgConnection::connect_with(&pool.connect_options()).await;
                (Locked::Postgres(conn.unwrap()), "BEGIN")
            }
            Pool::Sqlite(_) => {
                let conn = SqliteConnection::connect_with(&sqlite_options(&self.url)).await;
                (Locked::Sqlite(conn.unwrap()), sqlite_begin)
            }
        };
        locked.execute(begin).await;
        locked
    }

    /// On PostgreSQL, waits until some statement waits on a lock (a
    /// service's commit on [`TestDb::lock_writes`]). SQLite shows no
    /// waiter to another connection: the caller asks the store itself.
    pub async fn wait_for_lock_waiter(&self) {
        let Pool::Postgres(pool) = &self.pool else {
            panic!("SQLite shows no lock waiters; ask the store (SqliteStore::writes_waiting)");
        };
        eventually(
            "a commit waits on the lock",
            Duration::from_secs(10),
            async || {
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                n > 0
            },
        )
        .await;
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(dir) = &self.dir else { return };
        if std::thread::panicking() {
            eprintln!("kept the failed test's SQLite file in {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// How the tests open a SQLite file: as the services do (WAL, synced
/// commits, foreign keys) and waiting for the write lock rather than failing.
fn sqlite_options(url: &str) -> SqliteConnectOptions {
    service_kit::db::sqlite_options(url).unwrap()
}

/// A connection holding a lock until released.
pub enum Locked {
    /// A PostgreSQL connection in a transaction.
    Postgres(PgConnection),
    /// A SQLite connection in a transaction.
    Sqlite(SqliteConnection),
}

impl Locked {
    /// Commits, releasing the lock.
    pub async fn release(mut self) {
        self.execute("COMMIT").await;
    }

    async fn execute(&mut self, sql: &str) {
        on_either!(Locked, self, conn => {
            sqlx::query(sql).execute(&mut *conn).await.unwrap();
        })
    }
}

/// Whether the PostgreSQL half runs: true if `DATABASE_URL` names a
/// reachable server. If not, it panics when `ESCROW_REQUIRE_POSTGRES` is
/// set, and otherwise says once, on the real stderr (past the test
/// harness's capture), that the PostgreSQL tests are skipped.
pub fn postgres_available() -> bool {
    static REACHABLE: OnceLock<Result<(), String>> = OnceLock::new();
    let reachable = REACHABLE.get_or_init(|| {
        let url = std::env::var("DATABASE_URL").unwrap_or_default();
        if url.is_empty() {
            return Err("DATABASE_URL is not set".into());
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            match tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&url)).await {
                Ok(Ok(conn)) => {
                    let _ = conn.close().await;
                    Ok(())
                }
                Ok(Err(e)) => Err(format!("cannot connect: {e}")),
                Err(_) => Err("connecting timed out after 5 s".into()),
            }
        })
    });
    let Err(reason) = reachable else {
        return true;
    };
    if crate::tools::required(crate::tools::REQUIRE_POSTGRES) {
        panic!("ESCROW_REQUIRE_POSTGRES is set and PostgreSQL is unreachable: {reason}");
    }
    static WARNED: OnceLock<()> = OnceLock::new();
    WARNED.get_or_init(|| {
        let _ = writeln!(
            std::io::stderr().lock(),
            "\n*** SKIPPING the PostgreSQL half of {}: {reason}. \
             Only SQLite is tested. Set ESCROW_REQUIRE_POSTGRES=1 to fail instead. ***\n",
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default()
        );
    });
    false
}

/// Runs `test` on a fresh SQLite file made with `migrator`, on a
/// current-thread runtime as `#[sqlx::test]` runs the PostgreSQL half.
pub fn run_sqlite<F, Fut>(migrator: &'static Migrator, test: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move { test(TestDb::sqlite(migrator).await).await });
}

/// Instantiates each `async fn NAME(db: TestDb)` named twice:
/// `NAME::postgres` on a fresh database of `DATABASE_URL`'s server
/// migrated by `postgres:`, and `NAME::sqlite` on a fresh file migrated by
/// `sqlite:`. Filter with `cargo test sqlite` or `cargo test postgres`. A
/// test fn left out of the list is dead code, which the lints refuse.
#[macro_export]
macro_rules! on_both_backends {
    (postgres: $pg:path, sqlite: $lite:path; $($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn postgres() {
                    if !$crate::backend::postgres_available() {
                        return;
                    }
                    async fn run(pool: $crate::sqlx::PgPool) {
                        super::$name($crate::TestDb::postgres(pool)).await
                    }
                    let mut args =
                        $crate::sqlx::testing::TestArgs::new(concat!(module_path!(), "::postgres"));
                    args.migrator(&$pg);
                    $crate::sqlx::testing::TestFn::run_test(
                        run as fn($crate::sqlx::PgPool) -> _,
                        args,
                    )
                }

                #[test]
                fn sqlite() {
                    $crate::backend::run_sqlite(&$lite, super::$name)
                }
            }
        )+
    };
}

/// Instantiates each `async fn NAME(pool: PgPool)` named as
/// `NAME::postgres` alone, for what exists only on PostgreSQL, on a fresh
/// database (migrated by `migrator:` if given), skipped like the
/// PostgreSQL half of [`on_both_backends!`] when no server is reachable.
#[macro_export]
macro_rules! postgres_only {
    (@test $name:ident, $setup:expr) => {
        mod $name {
            #[test]
            fn postgres() {
                if !$crate::backend::postgres_available() {
                    return;
                }
                let mut args =
                    $crate::sqlx::testing::TestArgs::new(concat!(module_path!(), "::postgres"));
                ($setup)(&mut args);
                $crate::sqlx::testing::TestFn::run_test(
                    super::$name as fn($crate::sqlx::PgPool) -> _,
                    args,
                )
            }
        }
    };
    (migrator: $pg:path; $($name:ident),+ $(,)?) => {
        $(
            $crate::postgres_only!(
                @test $name,
                |args: &mut $crate::sqlx::testing::TestArgs| args.migrator(&$pg)
            );
        )+
    };
    ($($name:ident),+ $(,)?) => {
        $(
            $crate::postgres_only!(@test $name, |_: &mut $crate::sqlx::testing::TestArgs| ());
        )+
    };
}
