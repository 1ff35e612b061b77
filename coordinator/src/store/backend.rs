//! The coordinator's two databases behind one SQL interface.
//!
//! The store's transactions ([`super::books`], [`super::region`],
//! [`super::admin`]) are written once, in SQL that both backends run as it
//! stands; [`service_kit::sql`], shared with the region agent, holds the
//! only differences between PostgreSQL and SQLite (locking, snapshots,
//! times). Here its errors become [`StoreError`]s, so `?` carries them.

pub(super) use service_kit::sql::{sql, Db, Row, Tx};

use super::StoreError;

impl From<service_kit::sql::Error> for StoreError {
    fn from(error: service_kit::sql::Error) -> Self {
        use service_kit::sql::Error;
        match error {
            Error::Corrupt(why) => StoreError::Corrupt(why),
            Error::CheckViolation(message)
            | Error::Database(message)
            | Error::Unanswered(message) => StoreError::Database(message),
        }
    }
}
