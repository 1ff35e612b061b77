//! Which SKU reports an agent's next sync carries, and whether it is full.
//!
//! Reports are deltas: a sync reports the SKUs whose counters changed since
//! the last report the coordinator answered ([`SkuReport::differs_from`]),
//! and the SKUs it returns units of. The first sync, the one after a failed
//! sync (whose report may or may not have been applied) and every
//! [`FULL_SYNC_EVERY`]-th are full: every SKU, and every directive back. So
//! a SKU left out is one whose last answered report is still the
//! coordinator's view of it.
//!
//! The region agent, the simulator's agent and `bench coordinator`'s played
//! agents all decide with [`Reports`], so what they send is the same.

use std::collections::HashMap;

use crate::ids::{Sku, Tenant};
use crate::protocol::{SkuReport, SyncRequest, TransferMsg, FULL_SYNC_EVERY};

/// What the coordinator has of one agent process's reports: per SKU, the
/// last report it answered; and when the next sync must be full. A new
/// process starts with [`Reports::default`], so its first sync is full.
#[derive(Debug, Clone, Default)]
pub struct Reports {
    answered: HashMap<(Tenant, Sku), SkuReport>,
    /// Syncs answered since the last full one answered; `None`: the next is full.
    since_full: Option<u64>,
}

impl Reports {
    /// Whether the next sync is full.
    pub fn next_is_full(&self) -> bool {
        self.since_full.is_none_or(|n| n + 1 >= FULL_SYNC_EVERY)
    }

    /// The reports to send out of `all` (every SKU's, as of the sync's
    /// snapshot) when the sync carries `returns`, and whether it is full.
    pub fn to_send(&self, all: Vec<SkuReport>, returns: &[TransferMsg]) -> (Vec<SkuReport>, bool) {
        if self.next_is_full() {
            return (all, true);
        }
        let delta = all
            .into_iter()
            .filter(|r| {
                let key = (r.tenant.clone(), r.sku.clone());
                self.answered
                    .get(&key)
                    .is_none_or(|sent| r.differs_from(sent))
                    || returns
                        .iter()
                        .any(|t| (&t.tenant, &t.sku) == (&r.tenant, &r.sku))
            })
            .collect();
        (delta, false)
    }

    /// The coordinator answered `req`: its reports are the coordinator's
    /// view, and after a full one no other SKU's older report counts.
    pub fn answered(&mut self, req: &SyncRequest) {
        // A delta is sent only after an answered sync, with no failure
        // between: one sync at a time is in flight.
        assert!(
            req.full || self.since_full.is_some(),
            "a delta sync answered without an answered sync before it"
        );
        if req.full {
            self.answered.clear();
        }
        for report in &req.skus {
            self.answered
                .insert((report.tenant.clone(), report.sku.clone()), report.clone());
        }
        self.since_full = Some(match (req.full, self.since_full) {
            (false, Some(n)) => n + 1,
            _ => 0,
        });
        assert!(self.since_full.is_some_and(|n| n < FULL_SYNC_EVERY));
    }

    /// A sync failed: nobody knows which of its reports the coordinator
    /// applied, so the next sync is full.
    pub fn failed(&mut self) {
        self.since_full = None;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ids::TransferId;

    fn report(sku: &str, available: u64) -> SkuReport {
        SkuReport {
            tenant: Tenant::parse("t").unwrap(),
            sku: Sku::parse(sku).unwrap(),
            available,
            held: 0,
            sold: 0,
            sale_rate_per_s: 0.0,
            set_aside: 0,
        }
    }

    fn request(skus: Vec<SkuReport>, full: bool) -> SyncRequest {
        SyncRequest {
            limits: Default::default(),
            epoch: 1,
            seq: 1,
            rtt_ms: 0,
            skus,
            acks: Vec::new(),
            returns: Vec::new(),
            full,
        }
    }

    fn ret(sku: &str) -> TransferMsg {
        TransferMsg {
            id: TransferId::parse(&format!("r-{sku}")).unwrap(),
            tenant: Tenant::parse("t").unwrap(),
            sku: Sku::parse(sku).unwrap(),
            units: 1,
        }
    }

    /// Sends what `reports` decides out of `all` and has it answered.
    fn sync_answered(reports: &mut Reports, all: Vec<SkuReport>) -> (Vec<SkuReport>, bool) {
        let (skus, full) = reports.to_send(all, &[]);
        reports.answered(&request(skus.clone(), full));
        (skus, full)
    }

    /// Goal: a new process's first sync is full and carries every SKU.
    #[test]
    fn the_first_sync_is_full() {
        let reports = Reports::default();
        let (skus, full) = reports.to_send(vec![report("a", 1), report("b", 2)], &[]);
        assert!(full);
        assert_eq!(skus, vec![report("a", 1), report("b", 2)]);
    }

    /// Goal: after an answered sync, only the SKUs whose counters changed
    /// are sent, and none when nothing changed.
    #[test]
    fn deltas_follow_an_answered_sync() {
        let mut reports = Reports::default();
        sync_answered(&mut reports, vec![report("a", 1), report("b", 2)]);
        let (skus, full) = sync_answered(&mut reports, vec![report("a", 1), report("b", 3)]);
        assert_eq!(
            (skus, full),
            (vec![report("b", 3)], false),
            "only b changed"
        );
        let (skus, full) = sync_answered(&mut reports, vec![report("a", 1), report("b", 3)]);
        assert_eq!((skus.len(), full), (0, false), "nothing changed");
    }

    /// Goal: a SKU the sync returns units of is reported even unchanged, so
    /// the coordinator applies the return with the counters that follow it.
    #[test]
    fn a_returns_sku_is_always_sent() {
        let mut reports = Reports::default();
        sync_answered(&mut reports, vec![report("a", 1), report("b", 2)]);
        let (skus, full) = reports.to_send(vec![report("a", 1), report("b", 2)], &[ret("a")]);
        assert_eq!((skus, full), (vec![report("a", 1)], false));
    }

    /// Goal: after a failed sync the next is full, whatever was answered
    /// before; and after it deltas resume.
    #[test]
    fn a_failure_makes_the_next_full() {
        let mut reports = Reports::default();
        let all = || vec![report("a", 1), report("b", 2)];
        sync_answered(&mut reports, all());
        sync_answered(&mut reports, all());
        reports.failed();
        let (skus, full) = sync_answered(&mut reports, all());
        assert_eq!((skus, full), (all(), true));
        assert!(!reports.next_is_full());
    }

    /// Goal: with nothing changing and nothing failing, exactly one sync in
    /// every `FULL_SYNC_EVERY` is full.
    #[test]
    fn every_full_sync_every_th_is_full() {
        let mut reports = Reports::default();
        let all = || vec![report("a", 1)];
        let fulls: Vec<bool> = (0..3 * FULL_SYNC_EVERY)
            .map(|_| sync_answered(&mut reports, all()).1)
            .collect();
        for (i, full) in fulls.iter().enumerate() {
            assert_eq!(*full, i as u64 % FULL_SYNC_EVERY == 0, "sync {i}");
        }
    }

    /// One step of an agent's life: a sync of the given counters per SKU
    /// (`None`: the SKU is gone), with a return of one SKU, that the
    /// coordinator answers, applies without answering, or never gets.
    #[derive(Debug, Clone)]
    struct Step {
        available: Vec<Option<u64>>,
        returned: Option<usize>,
        fate: Fate,
    }

    #[derive(Debug, Clone, Copy)]
    enum Fate {
        Answered,
        AppliedThenLost,
        Lost,
    }

    const SKUS: usize = 4;

    fn step() -> impl Strategy<Value = Step> {
        (
            proptest::collection::vec(proptest::option::weighted(0.9, 0..3u64), SKUS),
            proptest::option::of(0..SKUS),
            prop_oneof![
                6 => Just(Fate::Answered),
                1 => Just(Fate::AppliedThenLost),
                1 => Just(Fate::Lost),
            ],
        )
            .prop_map(|(available, returned, fate)| Step {
                available,
                returned,
                fate,
            })
    }

    proptest! {
        /// Goal: whatever the coordinator applies of failed syncs, after
        /// every answered sync its view of each SKU the agent has is that
        /// SKU's counters; and a full sync comes at least once in every
        /// `FULL_SYNC_EVERY` syncs.
        #[test]
        fn the_coordinators_view_matches_after_every_answer(
            steps in proptest::collection::vec(step(), 1..300)
        ) {
            let mut reports = Reports::default();
            let mut view: HashMap<Sku, SkuReport> = HashMap::new();
            let mut since_full = 0u64;
            for s in steps {
                let all: Vec<SkuReport> = s
                    .available
                    .iter()
                    .enumerate()
                    .filter_map(|(i, a)| a.map(|a| report(&format!("s{i}"), a)))
                    .collect();
                let returns: Vec<TransferMsg> = s
                    .returned
                    .filter(|&i| s.available[i].is_some())
                    .map(|i| ret(&format!("s{i}")))
                    .into_iter()
                    .collect();
                let (skus, full) = reports.to_send(all.clone(), &returns);
                for t in &returns {
                    prop_assert!(skus.iter().any(|r| r.sku == t.sku), "a return's SKU is sent");
                }
                since_full = if full { 0 } else { since_full + 1 };
                prop_assert!(since_full < FULL_SYNC_EVERY);
                let req = request(skus, full);
                if !matches!(s.fate, Fate::Lost) {
                    for r in &req.skus {
                        view.insert(r.sku.clone(), r.clone());
                    }
                }
                match s.fate {
                    Fate::Answered => {
                        reports.answered(&req);
                        for r in &all {
                            prop_assert_eq!(view.get(&r.sku), Some(r));
                        }
                    }
                    Fate::AppliedThenLost | Fate::Lost => reports.failed(),
                }
            }
        }
    }
}
