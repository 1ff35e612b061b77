//! Retention in SQL: what the books no longer need after a window.
//!
//! Delivered grants and old admin idempotency keys go. Applied returns
//! stay: an agent resends a return until it hears it was applied, and only
//! the `transfers` row makes a late resend apply once, so without proof
//! that the agent forgot it a return row is kept (they are few: one per
//! recall).

use chrono::{DateTime, Utc};

use super::backend::sql;
use super::{Store, StoreError};

/// What one call of [`Store::prune`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Grants delivered before the cut.
    pub grants: u64,
    /// Admin idempotency keys recorded before the cut.
    pub admin_keys: u64,
}

impl Store {
    /// Deletes at most `limit` grants delivered before `before` and at most
    /// `limit` admin idempotency keys recorded before it, in one short
    /// transaction. Call again until fewer than `limit` of each go.
    pub async fn prune(&self, before: DateTime<Utc>, limit: u32) -> Result<Pruned, StoreError> {
        let mut tx = self.db.write().await?;
        let grants = sql("DELETE FROM transfers WHERE id IN (
                              SELECT id FROM transfers
                              WHERE kind = 'GRANT' AND state = 'DELIVERED' AND delivered_at < $1
                              LIMIT $2)")
        .bind(before)
        .bind(i64::from(limit))
        .execute(&mut tx)
        .await?;
        let admin_keys = sql("DELETE FROM admin_requests WHERE key IN (
                                  SELECT key FROM admin_requests WHERE created_at < $1 LIMIT $2)")
        .bind(before)
        .bind(i64::from(limit))
        .execute(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(Pruned { grants, admin_keys })
    }
}
