//! What the live view shows at one moment, gathered from three sources:
//! the crowd's answers and hold waits as they come (the buyers'
//! [`Progress`]), the
//! coordinator's view of the SKU (the sampler's latest: pool, units in
//! transit, mode, and each region as of its last report), and the
//! coordinator's audit, polled every [`AUDIT_INTERVAL`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::crowd::{Progress, RegionProgress};
use harness::outcome::{Outcome, Tally};
use harness::report::thousands;
use harness::sale::{audit, Audit};
use harness::sampler::SkuView;
use harness::shape::Sale;
use harness::ADMIN_TOKEN;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often the audit is read during the sale.
pub const AUDIT_INTERVAL: Duration = Duration::from_millis(500);
/// A region's sale rate is measured over this window.
pub const RATE_WINDOW: Duration = Duration::from_secs(1);

/// Where the demo is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Buyers are arriving or still retrying.
    Selling,
    /// Every buyer is done; waiting for every region's last report.
    Settling,
    /// The sale is over and checked.
    Over,
}

impl Stage {
    /// How the view names it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Selling => "selling",
            Stage::Settling => "settling",
            Stage::Over => "over",
        }
    }
}

/// One region at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionLine {
    /// Its name.
    pub name: String,
    /// Its share of the buyers, percent.
    pub share_percent: f64,
    /// Units it can sell, held and sold, as of its last report to the
    /// coordinator (zero before the first).
    pub available: i64,
    /// See `available`.
    pub held: i64,
    /// See `available`.
    pub sold: i64,
    /// Units held per second over the last [`RATE_WINDOW`], by the buyers' answers.
    pub rate_per_s: f64,
    /// Its buyers' answers so far, its round trip to the coordinator,
    /// and how long its holds took.
    pub buyers: RegionProgress,
}

impl RegionLine {
    /// Reserve answers that are neither HELD, SOLD_OUT nor PAUSED.
    pub fn other_answers(&self) -> u64 {
        other_answers(&self.buyers.answers)
    }

    /// Its round trip to the coordinator, ms (0: loopback).
    pub fn rtt_ms(&self) -> u64 {
        self.buyers.rtt_ms
    }

    /// The p50 and p99 of its buyers' waits from their first send to
    /// their HELD so far, µs; `None` before the first hold.
    pub fn hold_wait_us(&self) -> Option<[u64; 2]> {
        let p50 = self.buyers.hold_wait_at_us(0.5)?;
        let p99 = self.buyers.hold_wait_at_us(0.99)?;
        Some([p50, p99])
    }
}

/// A wait of `us` µs in ms: to a tenth below 10 ms (`3.1 ms`), whole
/// above (`1,250 ms`).
pub fn ms(us: u64) -> String {
    let ms = us as f64 / 1_000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{} ms", thousands(ms))
    }
}

/// A share as a whole percent: `97%`.
pub fn percent(share: f64) -> String {
    format!("{:.0}%", 100.0 * share)
}

/// Answers to reserves that are neither HELD, SOLD_OUT nor PAUSED.
pub fn other_answers(answers: &Tally) -> u64 {
    answers.total() - answers[Outcome::Held] - answers[Outcome::SoldOut] - answers[Outcome::Paused]
}

/// Everything the view shows at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Time since the sale started.
    pub elapsed: Duration,
    /// Where the demo is.
    pub stage: Stage,
    /// The coordinator's `--policy`.
    pub policy: String,
    /// Units on sale.
    pub units: u64,
    /// Buyers in all.
    pub buyers: u64,
    /// The coordinator's latest view of the SKU.
    pub view: Option<SkuView>,
    /// The latest audit.
    pub audit: Option<Audit>,
    /// The regions, in the sale's order.
    pub regions: Vec<RegionLine>,
}

impl Snapshot {
    /// Buyers that arrived, over all regions.
    pub fn arrived(&self) -> u64 {
        self.regions.iter().map(|r| r.buyers.arrived).sum()
    }

    /// Buyers whose story ended, over all regions.
    pub fn ended(&self) -> u64 {
        self.regions.iter().map(|r| r.buyers.ended).sum()
    }

    /// Units held or sold, by the buyers' answers.
    pub fn held_units(&self) -> u64 {
        self.regions.iter().map(|r| r.buyers.held_units).sum()
    }

    /// Every reserve answer so far.
    pub fn answers(&self) -> Tally {
        let mut all = Tally::default();
        for region in &self.regions {
            all.merge(&region.buyers.answers);
        }
        all
    }
}

/// The sources of the view, and the rate's memory.
pub struct Live {
    progress: Arc<Progress>,
    view: watch::Receiver<Option<SkuView>>,
    audit: watch::Receiver<Option<Audit>>,
    audit_task: JoinHandle<()>,
    started: Instant,
    /// Units held per region at recent moments, oldest first: the last one
    /// at least [`RATE_WINDOW`] old, and every later one.
    history: VecDeque<(Instant, Vec<u64>)>,
    regions: Vec<(String, f64)>,
    policy: String,
    units: u64,
    buyers: u64,
}

impl Live {
    /// Starts reading the audit of `coordinator`; the sale started now.
    pub fn start(
        coordinator: SocketAddr,
        sale: &Sale,
        policy: &str,
        progress: Arc<Progress>,
        view: watch::Receiver<Option<SkuView>>,
    ) -> Self {
        let (audit_sender, audit_receiver) = watch::channel(None);
        let audit_task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(AUDIT_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match audit(coordinator, ADMIN_TOKEN).await {
                    Ok(audit) => {
                        audit_sender.send_replace(Some(audit));
                    }
                    Err(error) => tracing::debug!(%error, "audit failed"),
                }
            }
        });
        let total_share: f64 = sale.regions.iter().map(|r| r.share).sum();
        Self {
            progress,
            view,
            audit: audit_receiver,
            audit_task,
            started: Instant::now(),
            history: VecDeque::new(),
            regions: sale
                .regions
                .iter()
                .map(|r| (r.name.clone(), 100.0 * r.share / total_share))
                .collect(),
            policy: policy.to_owned(),
            units: sale.units,
            buyers: sale.buyers() as u64,
        }
    }

    /// What the view shows now.
    pub fn snapshot(&mut self, stage: Stage) -> Snapshot {
        let now = Instant::now();
        let progress = self.progress.snapshot();
        let held: Vec<u64> = progress.iter().map(|p| p.held_units).collect();
        self.history.push_back((now, held.clone()));
        while self
            .history
            .get(1)
            .is_some_and(|(at, _)| now.duration_since(*at) >= RATE_WINDOW)
        {
            self.history.pop_front();
        }
        let (since, before) = self.history.front().cloned().unwrap_or((now, held.clone()));
        let span = now.duration_since(since).as_secs_f64();
        let view = self.view.borrow().clone();
        let regions = self
            .regions
            .iter()
            .zip(progress)
            .enumerate()
            .map(|(i, ((name, share_percent), buyers))| {
                let reported = view
                    .as_ref()
                    .and_then(|v| v.regions.iter().find(|r| &r.name == name));
                let gained = held[i].saturating_sub(before.get(i).copied().unwrap_or(0));
                RegionLine {
                    name: name.clone(),
                    share_percent: *share_percent,
                    available: reported.map_or(0, |r| r.available),
                    held: reported.map_or(0, |r| r.held),
                    sold: reported.map_or(0, |r| r.sold),
                    rate_per_s: if span > 0.0 {
                        gained as f64 / span
                    } else {
                        0.0
                    },
                    buyers,
                }
            })
            .collect();
        Snapshot {
            elapsed: now.duration_since(self.started),
            stage,
            policy: self.policy.clone(),
            units: self.units,
            buyers: self.buyers,
            view,
            audit: *self.audit.borrow(),
            regions,
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.audit_task.abort();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly on any unexpected error.

    use super::*;

    /// A moment of a sale in two regions: eu 80 ms from the coordinator
    /// with three holds (10, 20 and 100 ms; two faster than the round
    /// trip), us on loopback without holds yet.
    pub(crate) fn example() -> Snapshot {
        let mut eu = RegionProgress::new(80);
        for wait_us in [10_000, 20_000, 100_000] {
            eu.hold_wait_us.record(wait_us).unwrap();
        }
        eu.holds_under_rtt = 2;
        let line = |name: &str, buyers: RegionProgress| RegionLine {
            name: name.into(),
            share_percent: 50.0,
            available: 10,
            held: 3,
            sold: 0,
            rate_per_s: 3.0,
            buyers,
        };
        Snapshot {
            elapsed: Duration::from_secs(1),
            stage: Stage::Selling,
            policy: "tail-merge".into(),
            units: 20,
            buyers: 30,
            view: None,
            audit: None,
            regions: vec![line("eu", eu), line("us", RegionProgress::new(0))],
        }
    }

    /// Goal: a region's hold waits read as p50 and p99 within the
    /// histogram's 1%, none before the first hold, and waits print in ms.
    #[test]
    fn hold_waits_so_far() {
        let snapshot = example();
        let [p50, p99] = snapshot.regions[0].hold_wait_us().unwrap();
        assert!((20_000..=20_200).contains(&p50), "{p50}");
        assert!((100_000..=101_000).contains(&p99), "{p99}");
        assert_eq!(snapshot.regions[1].hold_wait_us(), None);
        assert_eq!(
            (ms(1_234), ms(25_400), ms(1_250_000)),
            ("1.2 ms".into(), "25 ms".into(), "1,250 ms".into())
        );
        assert_eq!(percent(2.0 / 3.0), "67%");
    }
}
