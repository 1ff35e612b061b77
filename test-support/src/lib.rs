//! What the integration tests of the coordinator and the region agent share.
//!
//! Both test trees drive real services over loopback HTTP against a real
//! database; the helpers that do not depend on either service live here
//! once: the API client ([`api`]), one test source run on PostgreSQL and
//! on SQLite ([`backend`]), waiting on a condition with a deadline
//! ([`poll`]), a service served in the test's process ([`serve`]), child
//! processes and their sockets ([`process`]), a coordinator and its agents
//! as processes, started by the `harness` crate with the tests'
//! credentials ([`cluster`]), requests written by hand ([`raw`]), database
//! URLs ([`db`]), capturing what a service logs ([`log`]), a service's
//! OpenAPI document against its routes ([`openapi`]), numbers drawn from a
//! seed ([`draw`]), and the fault harness (besides the harness's links,
//! which break a connection on command): a process's wall clock stepped
//! on command ([`faketime`]), a PostgreSQL server of the test's own
//! ([`pg_server`]), a history of buyers' requests with its checks
//! ([`history`]); and the one rule for a test whose outside tool is
//! missing: skip loudly, or fail under `ESCROW_REQUIRE_TOOLS=1`
//! ([`tools`]). What only one service's tests need stays in that
//! service's `tests/common`.

#![allow(clippy::unwrap_used)] // Test helpers: an unexpected error fails the test loudly.

pub mod api;
pub mod backend;
pub mod cluster;
pub mod db;
pub mod draw;
pub mod faketime;
pub mod ha_region;
pub mod history;
pub mod log;
pub mod openapi;
pub mod pg_server;
pub mod poll;
pub mod process;
pub mod raw;
pub mod serve;
pub mod tools;

pub use api::{client, Api, Final, ACME_KEY, ADMIN, OTHER_KEY};
pub use backend::{Backend, Locked, TestDb};
pub use db::{database_url, server_of, server_url};
pub use poll::eventually;
pub use process::{binary, free_port, selling_agent, service, wait_ready, Proc};
pub use serve::Served;
/// The driver the backend macro's expansion names, so a test crate need
/// not depend on sqlx itself.
pub use sqlx;
