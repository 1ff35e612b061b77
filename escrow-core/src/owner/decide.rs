//! The batch's steps up to its commit: admin changes one at a time, the
//! reserves sorted, holds planned first fit, a take for what does not fit,
//! and the batch built (holds, actions, expiries, grants and returns).

use std::collections::HashSet;

use super::work::{quantities, PendingReserve, Phase, TakeEnd, Work};
use super::{
    Action, AdminChange, AdminReply, Io, PauseReason, Reply, ReserveReply, SkuOwner,
    TAKE_PREFETCH_MS,
};
use crate::admission::plan_reserves;
use crate::batch::{Batch, BatchOutcome, NewHold, StockChange};
use crate::ids::RequestKey;
use crate::policy::{units_to_return, Mode};
use crate::protocol::{TakeRequest, TransferMsg};
use crate::reservation::Transition;

impl SkuOwner {
    /// Commits the next admin change, or goes on to serve buyers.
    pub(super) fn next_admin(&mut self, mut work: Work) {
        while let Some((ticket, change)) = work.admins.pop_front() {
            match self.admin_changes(change) {
                Err(reply) => self.reply(ticket, Reply::Admin(reply)),
                Ok(changes) if changes.is_empty() => {
                    self.reply(ticket, Reply::Admin(AdminReply::Done));
                }
                Ok(changes) => {
                    let mut batch = Batch::new(self.tenant.clone(), self.sku.clone(), work.now_ms);
                    batch.changes = changes;
                    self.io = Some(Io::Commit(batch));
                    self.phase = Phase::Admin(work, ticket);
                    return;
                }
            }
        }
        self.serve(work);
    }

    /// The stored changes an admin change needs, or why it is refused.
    fn admin_changes(&self, change: AdminChange) -> Result<Vec<StockChange>, AdminReply> {
        let mut changes = Vec::with_capacity(2);
        match change {
            AdminChange::Configure { total, settings } => {
                let quota = self.ledger.quota();
                if total >= quota {
                    changes.push(StockChange::Receive(total - quota));
                } else if quota - total <= self.ledger.available {
                    changes.push(StockChange::Return(quota - total));
                } else {
                    return Err(AdminReply::BelowCommitted {
                        committed: self.ledger.held + self.ledger.sold,
                    });
                }
                if settings != self.settings {
                    changes.push(StockChange::Settings(settings));
                }
            }
            AdminChange::AddStock(units) => changes.push(StockChange::Receive(units)),
            AdminChange::Pause(paused) => changes.push(StockChange::Pause(paused)),
        }
        changes.retain(|c| !matches!(c, StockChange::Receive(0) | StockChange::Return(0)));
        Ok(changes)
    }

    /// Sorts the reserves: a hold found after a commit of unknown outcome is
    /// answered HELD; a known key is answered from its row; the first copy
    /// of a new key tries to hold; a second copy waits for the next batch.
    fn serve(&mut self, mut work: Work) {
        let mut seen = HashSet::new();
        for p in std::mem::take(&mut work.fresh) {
            let committed = self.holds.get(&p.request.request_key).filter(|r| {
                p.in_failed_commit && r.user_id == p.request.user_id && r.qty == p.request.qty
            });
            if let Some(r) = committed {
                let r = r.clone();
                work.confirmed.push((p, r));
            } else if self.paused {
                let reply = ReserveReply::Paused(PauseReason::AdminPause);
                self.reply(p.ticket, Reply::Reserve(reply));
            } else if p.known || self.holds.contains_key(&p.request.request_key) {
                // A key with a live hold (memory has it after a reload,
                // though the driver's key memory may not) is answered from
                // its row, never decided again: a retry after a commit of
                // unknown outcome hears the truth, not SOLD_OUT.
                work.lookups.push(p);
            } else if seen.insert(p.request.request_key.clone()) {
                work.fresh.push(p);
            } else {
                work.later.push(p);
            }
        }
        // Live holds are in memory; only keys this owner does not hold
        // (final reservations, or none at all) are read.
        let mut unheld = Vec::new();
        for a in &work.acts {
            if work.rows.contains_key(&a.key) || unheld.contains(&a.key) {
                continue;
            }
            match self.holds.get(&a.key) {
                Some(r) => {
                    work.rows.insert(a.key.clone(), r.clone());
                }
                None => unheld.push(a.key.clone()),
            }
        }
        if unheld.is_empty() {
            return self.plan(work);
        }
        self.io = Some(Io::Read(unheld));
        self.phase = Phase::ReadingActs(work);
    }

    /// Plans holds first fit; asks the coordinator for what does not fit.
    pub(super) fn plan(&mut self, mut work: Work) {
        let quantities = quantities(&work);
        work.plan = plan_reserves(self.ledger.available, &quantities);
        work.take = TakeEnd::Exhausted;
        if !work.plan.overflow.is_empty() && self.cfg.coordinated && !self.sold_out_everywhere {
            // What fits is committed now and what did not waits for the
            // next batch's take, right after this commit: the buyers this
            // region can serve do not wait for a round trip to the
            // coordinator that only the others need (across an ocean, a
            // quarter of a second for a whole batch when a region runs out).
            // Units granted and not yet credited are credited by this
            // commit and planned with by the next batch, before any take:
            // otherwise they would sit uncredited for the take's round trip
            // while the buyers they could serve wait for it.
            if work.now_ms < self.next_take_ms
                || !work.plan.try_hold.is_empty()
                || !self.pending_grants.is_empty()
            {
                work.take = TakeEnd::NotAsked;
                return self.build(work);
            }
            let wanted: u64 = work.plan.overflow.iter().map(|&i| quantities[i]).sum();
            // In escrow mode a take also brings a little of the region's
            // near-term demand, so the next buyers sell locally instead of
            // each batch asking again; central mode keeps every unit central.
            let prefetch = match self.mode {
                Mode::Escrow => (self.rate_per_s * TAKE_PREFETCH_MS as f64 / 1_000.0).ceil() as u64,
                Mode::Central => 0,
            };
            let id = self.next_transfer_id("t");
            self.io = Some(Io::Take(TakeRequest {
                id,
                tenant: self.tenant.clone(),
                sku: self.sku.clone(),
                units: wanted,
                prefetch,
                received: self.ledger.received,
                returned: self.ledger.returned,
            }));
            self.phase = Phase::Taking(work);
            return;
        }
        self.build(work);
    }

    /// Writes the batch: holds, actions in decision order, the expiry of
    /// due holds, grants, directive changes and returns.
    pub(super) fn build(&mut self, mut work: Work) {
        let now_ms = work.now_ms;
        let local_demand = !work.fresh.is_empty();
        let mut slots: Vec<Option<PendingReserve>> = std::mem::take(&mut work.fresh)
            .into_iter()
            .map(Some)
            .collect();
        for &index in &work.plan.try_hold {
            // Plan indices are distinct positions in `fresh`.
            let Some(p) = slots[index].take() else {
                unreachable!("a plan names each request once");
            };
            let ttl = p.request.ttl.unwrap_or(self.settings.hold_ttl);
            let hold = NewHold {
                request_key: p.request.request_key.clone(),
                user_id: p.request.user_id.clone(),
                qty: p.request.qty,
                expires_at_ms: now_ms + ttl.get(),
                borrow: p.request.borrow.clone(),
            };
            if p.aside {
                work.setting_aside.push((p, hold));
            } else {
                work.batch.holds.push(hold);
                work.holding.push(p);
            }
        }
        work.overflow = work
            .plan
            .overflow
            .iter()
            .filter_map(|&i| slots[i].take())
            .collect();

        // Actions decide on the rows as each earlier action of this batch left them.
        for a in &work.acts {
            let Some(row) = work.rows.get_mut(&a.key) else {
                work.act_results.push(None);
                continue;
            };
            let verdict = match a.action {
                Action::Confirm => row.confirm(now_ms),
                Action::Release => row.release(now_ms),
                Action::Extend(ttl) => row.extend(now_ms, ttl.unwrap_or(self.settings.hold_ttl)),
            };
            if let Some(change) = verdict.change {
                work.batch
                    .transitions
                    .push((a.key.clone(), row.qty, change));
                row.apply(change);
            }
            work.act_results.push(Some((verdict.result, row.clone())));
        }

        for grant in self.pending_grants.drain(..) {
            if !work.batch.grants.iter().any(|g| g.id == grant.id) {
                work.batch.grants.push(grant);
            }
        }
        work.batch.changes.append(&mut self.pending_changes);
        if self.cfg.coordinated {
            let free = (self.ledger.available + work.granted)
                .checked_sub(work.plan.units)
                .expect("a plan holds no more than is available");
            // Units this batch's own buyers could not get are not given
            // away under them: while there is overflow, nothing is spare.
            let spare = if work.overflow.is_empty() { free } else { 0 };
            let freed_ms_ago = self
                .freed_at_ms
                .map_or(u64::MAX, |at| now_ms.saturating_sub(at));
            let units = units_to_return(
                self.mode,
                spare,
                self.return_until,
                self.ledger.returned,
                local_demand,
                freed_ms_ago,
            );
            if units > 0 {
                let id = self.next_transfer_id("r");
                work.batch.returns.push(TransferMsg {
                    id,
                    tenant: self.tenant.clone(),
                    sku: self.sku.clone(),
                    units,
                });
            }
        }
        // Due holds expire; one an action of this batch touched was
        // decided by the action (which expires what it finds due).
        let any_due = self.expiry.first().is_some_and(|(at, _)| *at <= now_ms);
        let acted: HashSet<&RequestKey> = if any_due {
            work.acts.iter().map(|a| &a.key).collect()
        } else {
            HashSet::new()
        };
        let due: Vec<RequestKey> = self
            .expiry
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .map(|(_, key)| key)
            .filter(|key| !acted.contains(key))
            .cloned()
            .collect();
        for key in due {
            let qty = self.holds[&key].qty;
            work.batch.transitions.push((key, qty, Transition::Expire));
        }
        // A retried batch commits even when empty: its durable commit is
        // what makes the rows it found safe to answer from.
        if work.batch.is_empty() && !work.retrying {
            return self.committed(work, BatchOutcome::default());
        }
        let batch = std::mem::replace(
            &mut work.batch,
            Batch::new(self.tenant.clone(), self.sku.clone(), work.now_ms),
        );
        self.io = Some(Io::Commit(batch));
        self.phase = Phase::Committing(work);
    }
}
