//! The agent's store on an embedded SQLite file: the default when no URL
//! is given.
//!
//! [`super::SqlStore`] runs here as everywhere, with the same guarantees,
//! enforced the same way: the schema (`migrations/region-agent-sqlite/`)
//! has the same CHECK constraints and unique indexes (STRICT tables, times
//! as INTEGER milliseconds, booleans as 0/1); every write is conditional
//! and its affected-row count is checked; a group of batches is one
//! transaction, all of it or none; a 201 is sent only after its
//! transaction is on disk (WAL with `synchronous=FULL` syncs the log at
//! every commit). What SQLite does its own way:
//!
//! - **One writer.** Writes go through a pool of one connection and start
//!   with `BEGIN IMMEDIATE`, which takes the write lock first, so commits of
//!   this process queue for the connection and a second process (an agent
//!   taking over the region) waits for the lock for up to
//!   [`service_kit::db::SQLITE_BUSY_TIMEOUT`] instead of failing with
//!   `SQLITE_BUSY` ([`super::SqlStore::writes_waiting`] counts the
//!   waiting). Owners of different SKUs commit one after the other.
//! - **Fencing.** There is no `FOR SHARE`: the lease is checked inside the
//!   write transaction, and taking the lease is itself a write, so a
//!   takeover waits for the old process's write in flight and every later
//!   write of the old process finds no row with its epoch.
//! - **Lists.** A list or a table is bound as one JSON array text and read
//!   with `json_each`: one statement for a batch's holds, as the arrays
//!   of PostgreSQL make it there.
//! - **Readers** have their own pool; in WAL mode they read a committed
//!   snapshot without waiting for the writer.
//!
//! The file is opened as every service opens one
//! (`service_kit::db::open_sqlite`).

/// The embedded migrations of the region agent on SQLite.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/region-agent-sqlite");

/// The agent's store, opened on a SQLite file ([`super::SqlStore::open`]
/// with a `sqlite://PATH` URL).
pub type SqliteStore = super::SqlStore;
