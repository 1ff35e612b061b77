//! Database URLs for services started by a test on its own database.

use sqlx::PgPool;

/// The server part of `DATABASE_URL`, e.g. `postgres://postgres@127.0.0.1:5432`.
pub fn server_url() -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    base.rsplit_once('/').unwrap().0.to_owned()
}

/// The server `pool` connects to: `DATABASE_URL`'s when it is that one
/// (its credentials included), else user, host and port of the pool.
pub fn server_of(pool: &PgPool) -> String {
    let options = pool.connect_options();
    let own = format!(
        "postgres://{}@{}:{}",
        options.get_username(),
        options.get_host(),
        options.get_port()
    );
    match std::env::var("DATABASE_URL") {
        Ok(env) if env.contains(&format!("{}:{}", options.get_host(), options.get_port())) => {
            server_url()
        }
        _ => own,
    }
}

/// The URL of `pool`'s database (a test's own, under `#[sqlx::test]`), for
/// a child process.
pub fn database_url(pool: &PgPool) -> String {
    format!(
        "{}/{}",
        server_of(pool),
        pool.connect_options().get_database().unwrap()
    )
}
