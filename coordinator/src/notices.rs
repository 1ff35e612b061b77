//! News for regions, delivered by held-open watch calls.
//!
//! Each region has a notice number. When a sync, a take or an admin change
//! gives a region something to do (a recall, a grant, a mode change), its
//! number moves on and any watch call it holds open is answered at once;
//! the agent then syncs without waiting for its interval. So a recall made
//! for a starving region reaches the others in one network hop. The numbers
//! live in memory: after a restart they start from a new base, so an agent
//! sees a different number and syncs once.
//!
//! Beside the numbers, each region has its news: the SKUs whose directive
//! for it changed since its last sync (a recall, a mode change, a pause,
//! sold out set or cleared, a grant). An agent's sync reports only the SKUs
//! whose counters changed, so the coordinator answers directives for those
//! and for its news; the news lives in memory, and a region the
//! coordinator has not seen since it started has "everything" as news, so
//! nothing a restart forgot is missed.
//!
//! And each region has the borrows and loans of the per-user limit across
//! regions that a watch answer may carry ahead of the sync: loans asked of
//! it as a home, answers to its borrows. Best effort: the sync answers
//! all of them anyway, so one lost here costs time, never a place.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use escrow_core::protocol::LimitsDown;
use escrow_core::{RegionName, Sku, Tenant};
use tokio::sync::watch;

/// Longest a watch call is held open, whatever the agent asks; shorter
/// than an agent's client timeout.
pub const WATCH_WAIT_MS_MAX: u64 = 1_500;

/// Most SKUs of news kept per region; beyond, its news is "everything".
pub const NEWS_SKUS_MAX: usize = 4_096;

/// Most borrows and loans kept per region for its watch; beyond, the rest
/// wait for its sync.
pub const LIMITS_NEWS_MAX: usize = 1_024;

/// The SKUs with news for one region, by (tenant, sku).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct News {
    /// SKUs whose directive for the region changed.
    pub skus: BTreeSet<(Tenant, Sku)>,
    /// Every SKU of the region may have news: the coordinator started
    /// since the region's last sync, or more than [`NEWS_SKUS_MAX`] changed.
    pub all: bool,
}

impl News {
    fn everything() -> Self {
        Self {
            skus: BTreeSet::new(),
            all: true,
        }
    }

    fn add(&mut self, key: (Tenant, Sku)) {
        if self.all {
            return;
        }
        self.skus.insert(key);
        if self.skus.len() > NEWS_SKUS_MAX {
            *self = Self::everything();
        }
    }
}

/// Every region's notice number and news.
#[derive(Debug)]
pub struct Notices {
    base: u64,
    by_region: Mutex<HashMap<RegionName, watch::Sender<u64>>>,
    news: Mutex<HashMap<RegionName, News>>,
    limits: Mutex<HashMap<RegionName, LimitsDown>>,
}

impl Notices {
    /// Notice numbers starting from `base` (e.g. the start time, so a
    /// restarted coordinator never repeats an old number).
    pub fn new(base: u64) -> Self {
        Self {
            base,
            by_region: Mutex::new(HashMap::new()),
            news: Mutex::new(HashMap::new()),
            limits: Mutex::new(HashMap::new()),
        }
    }

    fn news_map(&self) -> std::sync::MutexGuard<'_, HashMap<RegionName, News>> {
        // A poisoned lock means a panic while changing a set; at worst a
        // SKU's news is lost, and the agent's next full sync brings it.
        self.news.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `tenant/sku` has news for `region`, for its next sync.
    pub fn record(&self, region: &RegionName, tenant: &Tenant, sku: &Sku) {
        self.news_map()
            .entry(region.clone())
            .or_insert_with(News::everything)
            .add((tenant.clone(), sku.clone()));
    }

    /// The region's news, which its sync now answers; from now on its news
    /// starts empty.
    pub fn take_news(&self, region: &RegionName) -> News {
        self.news_map()
            .insert(region.clone(), News::default())
            .unwrap_or_else(News::everything)
    }

    /// The region's news without taking it: what a watch answer carries
    /// ahead of the sync, which still takes and answers it.
    pub fn peek_news(&self, region: &RegionName) -> News {
        self.news_map()
            .get(region)
            .cloned()
            .unwrap_or_else(News::everything)
    }

    /// Gives back news a sync took and could not answer.
    pub fn restore_news(&self, region: &RegionName, news: News) {
        let mut map = self.news_map();
        let kept = map.entry(region.clone()).or_insert_with(News::everything);
        if news.all {
            *kept = News::everything();
        } else {
            for key in news.skus {
                kept.add(key);
            }
        }
    }

    /// Adds to what `region`'s next watch answer carries of borrows and
    /// loans (committed already), up to [`LIMITS_NEWS_MAX`] of each kind.
    pub fn add_limits(&self, region: &RegionName, add: impl FnOnce(&mut LimitsDown)) {
        let mut map = self.limits.lock().unwrap_or_else(|e| e.into_inner());
        let kept = map.entry(region.clone()).or_default();
        add(kept);
        kept.answers.truncate(LIMITS_NEWS_MAX);
        kept.lend_asks.truncate(LIMITS_NEWS_MAX);
        kept.lend_returns.truncate(LIMITS_NEWS_MAX);
    }

    /// Takes what `region`'s watch answer carries of borrows and loans.
    pub fn take_limits(&self, region: &RegionName) -> LimitsDown {
        let mut map = self.limits.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(region).unwrap_or_default()
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

    /// Goal: a region first seen has everything as news; afterwards only
    /// what was recorded, once; news given back is kept; too much news
    /// becomes everything.
    #[test]
    fn news_is_taken_once_and_starts_as_everything() {
        let notices = Notices::new(0);
        let eu = RegionName::parse("eu").unwrap();
        assert!(notices.take_news(&eu).all, "first sight");
        assert_eq!(notices.take_news(&eu), News::default());
        let t = Tenant::parse("t").unwrap();
        notices.record(&eu, &t, &Sku::parse("a").unwrap());
        let news = notices.take_news(&eu);
        assert_eq!(news.skus.len(), 1);
        assert_eq!(notices.take_news(&eu), News::default(), "taken once");
        notices.restore_news(&eu, news.clone());
        assert_eq!(notices.take_news(&eu), news);
        for i in 0..=NEWS_SKUS_MAX {
            notices.record(&eu, &t, &Sku::parse(&format!("s{i}")).unwrap());
        }
        assert!(notices.take_news(&eu).all);
    }

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
