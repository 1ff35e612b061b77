//! Waiting for a condition: poll it with a deadline, never sleep a guess.

use std::time::{Duration, Instant};

/// How long [`eventually`] waits between two checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Polls `check` until it returns true, or panics naming `what` once
/// `deadline` has passed.
pub async fn eventually(what: &str, deadline: Duration, check: impl AsyncFnMut() -> bool) {
    if !within(deadline, check).await {
        panic!("timed out after {deadline:?} waiting for: {what}");
    }
}

/// Polls `check` until it returns true (then true) or `deadline` has
/// passed (then false), for a caller that explains a timeout itself.
pub async fn within(deadline: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    false
}
