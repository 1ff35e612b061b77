//! The retention window both services' `POST /v1/admin/prune` take: its
//! body, its bounds and the batch size; what each service deletes is its
//! own.

use serde::Deserialize;
use utoipa::ToSchema;

/// Shortest window a prune accepts, s: every call between agent and
/// coordinator times out within seconds, so nothing pruned can still be
/// delivered, acknowledged or retried.
pub const WINDOW_MIN_S: u64 = 60;

/// Longest window a prune accepts, s (ten years).
pub const WINDOW_MAX_S: u64 = 315_360_000;

/// Rows a prune deletes per transaction.
pub const PRUNE_BATCH: u32 = 1_000;

/// `POST /v1/admin/prune` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PruneBody {
    /// Delete what ended more than this many seconds ago, 60..=315,360,000.
    #[schema(minimum = 60, maximum = 315_360_000)]
    pub older_than_s: u64,
}

impl PruneBody {
    /// The cut, in ms since the epoch, for a prune at `now_ms`: what ended
    /// before it goes. A window out of bounds is refused with the reason.
    pub fn cut_ms(&self, now_ms: u64) -> Result<u64, String> {
        if !(WINDOW_MIN_S..=WINDOW_MAX_S).contains(&self.older_than_s) {
            return Err(format!(
                "older_than_s must be in {WINDOW_MIN_S}..={WINDOW_MAX_S}"
            ));
        }
        Ok(now_ms.saturating_sub(self.older_than_s * 1_000))
    }
}
