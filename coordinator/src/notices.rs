//! News for regions, delivered by held-open watch calls.
//!
//! Each region has a notice number. When a sync, a take or an admin change
//! gives a region something to do (a recall, a grant, a mode change), its
//! number moves on and any watch call it holds open is answered at once;
//! the agent then syncs without waiting for its interval. So a recall made
//! for a starving region reaches the others in one network hop. The numbers
//! live in memory: after a restart they start from a new base, so an agent
//! sees a different number and syncs once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use escrow_core::RegionName;
use tokio::sync::watch;

/// Longest a watch call is held open, whatever the agent asks; shorter
/// than an agent's client timeout.
pub const WATCH_WAIT_MS_MAX: u64 = 1_500;

/// Every region's notice number.
#[derive(Debug)]
pub struct Notices {
    base: u64,
    by_region: Mutex<HashMap<RegionName, watch::Sender<u64>>>,
}

impl Notices {
    /// Notice numbers starting from `base` (e.g. the start time, so a
    /// restarted coordinator never repeats an old number).
    pub fn new(base: u64) -> Self {
        Self {
            base,
            by_region: Mutex::new(HashMap::new()),
        }
    }

    fn sender(&self, region: &RegionName) -> watch::Sender<u64> {
        // A poisoned lock means a panic while inserting; the map is still whole.
        let mut map = self.by_region.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(region.clone())
            .or_insert_with(|| watch::channel(self.base).0)
            .clone()
    }

    /// `region` has news: answer its watch call now.
    pub fn notify(&self, region: &RegionName) {
        self.sender(region).send_modify(|n| *n += 1);
        metrics::counter!("coordinator_notices_total").increment(1);
    }

    /// The region's notice number once it differs from `seen`, or after
    /// `wait_ms` (at most [`WATCH_WAIT_MS_MAX`]) at the latest.
    pub async fn wait(&self, region: &RegionName, seen: u64, wait_ms: u64) -> u64 {
        let mut rx = self.sender(region).subscribe();
        let wait = Duration::from_millis(wait_ms.min(WATCH_WAIT_MS_MAX));
        let _ = tokio::time::timeout(wait, rx.wait_for(|n| *n != seen)).await;
        let notice = *rx.borrow();
        notice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a watch returns at once when the number already moved, waits
    /// for a notice otherwise, and gives up after its bound.
    #[tokio::test(start_paused = true)]
    async fn a_watch_wakes_on_news_or_after_its_bound() {
        let notices = std::sync::Arc::new(Notices::new(100));
        let eu = RegionName::parse("eu").unwrap();
        assert_eq!(
            notices.wait(&eu, 7, 1_000).await,
            100,
            "unseen number: at once"
        );
        let waiting = {
            let (notices, eu) = (notices.clone(), eu.clone());
            tokio::spawn(async move { notices.wait(&eu, 100, 1_000).await })
        };
        tokio::task::yield_now().await;
        notices.notify(&eu);
        assert_eq!(waiting.await.unwrap(), 101);
        let started = tokio::time::Instant::now();
        assert_eq!(notices.wait(&eu, 101, 60_000).await, 101);
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(WATCH_WAIT_MS_MAX),
            "bounded"
        );
    }
}
