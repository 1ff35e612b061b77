//! The batch's end: memory follows what was stored (units moved, live holds
//! kept, drift noticed), and every command is answered: held, replayed,
//! parked, sold out or paused.

use super::work::{PendingReserve, Phase, TakeEnd, Work};
use super::{
    ActReply, AdminReply, CommitError, Io, PauseReason, Reply, ReserveReply, SkuOwner,
    CREDITED_GRANTS_KEPT,
};
use crate::batch::{Batch, BatchOutcome, SkuRecord, StockChange};
use crate::ids::RequestKey;
use crate::ledger::LedgerError;
use crate::reservation::{Status, Transition};

impl SkuOwner {
    /// Takes stored state as the truth, refusing to sell on drift.
    pub(super) fn adopt(&mut self, record: SkuRecord) {
        self.ledger = record.ledger;
        self.settings = record.settings;
        self.paused = record.paused;
        self.mode = record.mode;
        self.drifted = !record.rows_agree();
        self.rows_drift = record.rows_drift();
        self.expiry = record
            .holds
            .iter()
            .filter(|r| r.request_key.cart().is_none())
            .map(|r| (r.expires_at_ms, r.request_key.clone()))
            .collect();
        self.aside.clear();
        self.holds = record
            .holds
            .into_iter()
            .map(|r| (r.request_key.clone(), r))
            .collect();
    }

    /// Keeps memory's live holds as a committed transition left them.
    pub(super) fn settle(&mut self, key: &RequestKey, change: Transition) {
        let Some(r) = self.holds.get_mut(key) else {
            return;
        };
        self.expiry.remove(&(r.expires_at_ms, key.clone()));
        r.apply(change);
        if r.status == Status::Held && key.cart().is_none() {
            self.expiry.insert((r.expires_at_ms, key.clone()));
        } else {
            self.holds.remove(key);
        }
    }

    /// The batch is durable: move the same units in memory, then answer.
    pub(super) fn committed(&mut self, mut work: Work, outcome: BatchOutcome) {
        assert_eq!(
            outcome.inserted.len(),
            work.batch.holds.len(),
            "one insert verdict per hold"
        );
        let now_ms = work.now_ms;
        for grant in &work.batch.grants {
            if self.credited_grants.len() == CREDITED_GRANTS_KEPT {
                self.credited_grants.pop_front();
            }
            self.credited_grants.push_back(grant.id.clone());
        }
        for id in &outcome.applied_grants {
            let grant = work
                .batch
                .grants
                .iter()
                .find(|g| &g.id == id)
                .expect("the store credits only grants of this batch");
            self.ledger.receive(grant.units);
        }
        for (hold, inserted) in work.batch.holds.iter().zip(&outcome.inserted) {
            if *inserted {
                let moved = self.ledger.hold(hold.qty.units());
                self.check(moved);
                self.expiry
                    .insert((hold.expires_at_ms, hold.request_key.clone()));
                self.holds
                    .insert(hold.request_key.clone(), hold.reservation(&self.sku));
            }
        }
        for (p, hold) in std::mem::take(&mut work.setting_aside) {
            let moved = self.ledger.hold(hold.qty.units());
            self.check(moved);
            let r = hold.reservation(&self.sku);
            self.aside.insert(hold.request_key.clone(), hold);
            self.reply(p.ticket, Reply::Reserve(ReserveReply::Held(r)));
        }
        self.measure(now_ms);
        for ret in &work.batch.returns {
            let moved = self.ledger.return_units(ret.units);
            self.check(moved);
            // Those units are free in the pool now: not sold out everywhere.
            self.sold_out_everywhere = false;
        }
        for (key, qty, change) in &work.batch.transitions {
            let moved = change.apply_to_ledger(&mut self.ledger, *qty);
            self.check(moved);
            self.settle(key, *change);
            if matches!(change, Transition::Release | Transition::Expire) {
                self.freed_at_ms = Some(now_ms);
            }
        }

        for (a, result) in std::mem::take(&mut work.acts)
            .into_iter()
            .zip(std::mem::take(&mut work.act_results))
        {
            let reply = match result {
                None => ActReply::NotFound,
                Some((Ok(()), r)) => ActReply::Accepted(r),
                Some((Err(_), r)) => ActReply::Refused(r),
            };
            self.reply(a.ticket, Reply::Act(reply));
        }

        for (p, r) in std::mem::take(&mut work.confirmed) {
            self.reply(p.ticket, Reply::Reserve(ReserveReply::Held(r)));
        }
        let mut existing = std::mem::take(&mut work.lookups);
        let holding = std::mem::take(&mut work.holding);
        for ((p, hold), inserted) in holding
            .into_iter()
            .zip(&work.batch.holds)
            .zip(&outcome.inserted)
        {
            if *inserted {
                let r = hold.reservation(&self.sku);
                self.reply(p.ticket, Reply::Reserve(ReserveReply::Held(r)));
            } else {
                existing.push(p);
            }
        }
        if existing.is_empty() {
            return self.settle_overflow(work);
        }
        let keys = existing
            .iter()
            .map(|p| p.request.request_key.clone())
            .collect();
        work.existing = existing;
        self.io = Some(Io::Read(keys));
        self.phase = Phase::ReadingExisting(work);
    }

    /// What did not fit: units freed by replays may still serve it next
    /// batch; otherwise it is sold out only if nothing is free anywhere,
    /// else paused.
    pub(super) fn settle_overflow(&mut self, mut work: Work) {
        let mut overflow = std::mem::take(&mut work.overflow);
        overflow.sort_by_key(|p| p.request.qty);
        for p in overflow {
            if p.request.qty.units() <= self.ledger.available {
                self.overflow.push_back(p);
            } else {
                match work.take {
                    TakeEnd::Exhausted => {
                        self.reply(p.ticket, Reply::Reserve(ReserveReply::SoldOut));
                    }
                    TakeEnd::Unreachable => {
                        let reply = ReserveReply::Paused(PauseReason::CoordinatorUnreachable);
                        self.reply(p.ticket, Reply::Reserve(reply));
                    }
                    TakeEnd::Moving | TakeEnd::NotAsked
                        if self.parked.len() < self.cfg.parked_max =>
                    {
                        self.parked.push_back(p);
                    }
                    // Never waited: the list of waiting requests is full.
                    TakeEnd::Moving | TakeEnd::NotAsked => {
                        self.reply(p.ticket, Reply::Reserve(ReserveReply::QueueFull));
                    }
                }
            }
        }
        self.settle_later(std::mem::take(&mut work.later));
        // Parked requests keep their arrival order: the oldest is served first.
        self.parked.make_contiguous().sort_by_key(|p| p.ticket);
        self.phase = Phase::Idle;
    }

    /// Second copies of a key in the batch: tried first in the next batch,
    /// which answers them from what their first copy did, unless the first
    /// waits for units from elsewhere; then they wait with it, parked
    /// (carried as overflow, they would start batch after batch, each
    /// sending them back behind the first, until the units came).
    fn settle_later(&mut self, later: Vec<PendingReserve>) {
        let mut next = Vec::new();
        for p in later {
            let key = &p.request.request_key;
            if !self.parked.iter().any(|q| &q.request.request_key == key) {
                next.push(p);
            } else if self.parked.len() < self.cfg.parked_max {
                self.parked.push_back(p);
            } else {
                self.reply(p.ticket, Reply::Reserve(ReserveReply::QueueFull));
            }
        }
        for p in next.into_iter().rev() {
            self.overflow.push_front(p);
        }
    }

    /// Answers every command of a batch that was not committed PAUSED,
    /// for `reason`: nothing of theirs was written.
    pub(super) fn refuse(&mut self, mut work: Work, reason: PauseReason) {
        for (ticket, _) in std::mem::take(&mut work.admins) {
            self.reply(ticket, Reply::Admin(AdminReply::Paused(reason)));
        }
        for a in std::mem::take(&mut work.acts) {
            self.reply(a.ticket, Reply::Act(ActReply::Paused(reason)));
        }
        let reserves = [
            std::mem::take(&mut work.fresh),
            std::mem::take(&mut work.holding),
            std::mem::take(&mut work.overflow),
            std::mem::take(&mut work.lookups),
            std::mem::take(&mut work.later),
            std::mem::take(&mut work.existing),
            work.confirmed.drain(..).map(|(p, _)| p).collect(),
            work.setting_aside.drain(..).map(|(p, _)| p).collect(),
        ];
        for p in reserves.into_iter().flatten() {
            self.reply(p.ticket, Reply::Reserve(ReserveReply::Paused(reason)));
        }
        self.phase = Phase::Idle;
    }

    /// A commit failed, and it may have happened all the same (its
    /// connection broke before the answer, the primary died): nobody is
    /// answered from a guess. The SKU is read again from the database and
    /// the batch decided again on what it holds: a hold that did commit is
    /// found by its key and answered HELD once the batch's new commit is
    /// durable, the rest try once more. Without `settle_until_ms`, if the
    /// read or that second commit fails too they are told PAUSED
    /// (`storage`); with it (the first commit's outcome is unknown) both
    /// are tried again until then. Returns `batch` carried may be in the
    /// pool now: the SKU is no longer known to be sold out everywhere, and
    /// a sync delivers whatever the outbox holds.
    pub(super) fn retry_after_failed_commit(
        &mut self,
        batch: &Batch,
        mut work: Work,
        settle_until_ms: Option<u64>,
    ) {
        self.needs_reload = true;
        if !batch.returns.is_empty() {
            self.sold_out_everywhere = false;
        }
        self.sync_due |= !batch.returns.is_empty() || !batch.grants.is_empty();
        let mut retry = Work::new(self.tenant.clone(), self.sku.clone(), work.now_ms);
        retry.retrying = true;
        retry.settle_until_ms = settle_until_ms;
        let confirmed = work.confirmed.drain(..).map(|(p, _)| p);
        for mut p in std::mem::take(&mut work.holding)
            .into_iter()
            .chain(confirmed)
        {
            p.in_failed_commit = true;
            retry.fresh.push(p);
        }
        let aside = work.setting_aside.drain(..).map(|(p, _)| p);
        retry.fresh.extend(aside);
        let others = [
            std::mem::take(&mut work.fresh),
            std::mem::take(&mut work.overflow),
            std::mem::take(&mut work.lookups),
            std::mem::take(&mut work.later),
            std::mem::take(&mut work.existing),
        ];
        retry.fresh.extend(others.into_iter().flatten());
        retry.acts = std::mem::take(&mut work.acts);
        retry.admins = std::mem::take(&mut work.admins);
        self.phase = Phase::Reloading(retry);
        self.io = Some(Io::Reload);
    }

    /// Stops the owner after a failed commit; the reason its buyers are told.
    pub(super) fn commit_failed(&mut self, error: CommitError) -> PauseReason {
        match error {
            CommitError::Fenced => {
                self.fenced = true;
                PauseReason::Halted
            }
            CommitError::Failed | CommitError::Unknown => {
                self.needs_reload = true;
                PauseReason::Storage
            }
        }
    }

    pub(super) fn apply_change(&mut self, change: StockChange) {
        let applied = match change {
            StockChange::Receive(units) => {
                self.ledger.receive(units);
                Ok(())
            }
            StockChange::Return(units) => self.ledger.return_units(units),
            StockChange::Settings(settings) => {
                self.settings = settings;
                Ok(())
            }
            StockChange::Pause(paused) => {
                self.paused = paused;
                Ok(())
            }
            StockChange::Mode(mode) => {
                self.mode = mode;
                Ok(())
            }
        };
        self.check(applied);
    }

    /// Records a ledger move that must succeed after a commit; a failure
    /// means memory and database disagree, so the SKU stops selling.
    pub(super) fn check(&mut self, moved: Result<(), LedgerError>) {
        if moved.is_err() {
            self.drifted = true;
        }
    }
}
