//! The retention window both services' `POST /v1/admin/prune` take: its
//! body, its bounds, the batch size and the loop that deletes a batch at a
//! time; what each service deletes is its own.

use std::future::Future;

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

/// Runs `batch` until nothing older than the cut is left, and answers how
/// many rows of each of its `KINDS` it deleted in all. A batch deletes at
/// most [`PRUNE_BATCH`] rows of each kind in its own short transaction, so
/// the service goes on meanwhile, and answers how many of each it deleted:
/// a batch short of the limit in every kind was the last.
pub async fn in_batches<const KINDS: usize, E, Batch>(
    mut batch: impl FnMut() -> Batch,
) -> Result<[u64; KINDS], E>
where
    Batch: Future<Output = Result<[u64; KINDS], E>>,
{
    let mut total = [0; KINDS];
    loop {
        let deleted = batch().await?;
        for (sum, rows) in total.iter_mut().zip(deleted) {
            *sum += rows;
        }
        if deleted.iter().all(|rows| *rows < u64::from(PRUNE_BATCH)) {
            return Ok(total);
        }
    }
}
