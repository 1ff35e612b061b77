//! Database URLs for services started by a test on its own database.

use sqlx::PgPool;

/// The server part of `DATABASE_URL`, e.g. `postgres://postgres@127.0.0.1:5432`.
pub fn server_url() -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    base.rsplit_once('/').unwrap().0.to_owned()
}

/// The URL of `pool`'s database (a test's own, under `#[sqlx::test]`), for
/// a child process.
pub fn database_url(pool: &PgPool) -> String {
    format!(
        "{}/{}",
        server_url(),
        pool.connect_options().get_database().unwrap()
    )
}
