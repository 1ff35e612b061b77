//! What a driver tells the owner: commands, directives, and how the I/O
//! the owner asked for ended (`handle_*`).
//!
//! Each handler moves the batch in progress to its next step (in
//! `decide.rs`) or settles it (in `settle.rs`); none does I/O itself.

use std::collections::HashMap;

use super::work::{quantities, PendingAct, PendingReserve, Phase, TakeEnd, Work};
use super::{
    ActReply, AdminReply, CartEnd, Command, CommitError, Io, PauseReason, Reply, ReserveReply,
    SkuOwner, SETTLE_MS, SWEEP_INTERVAL_MS, TAKE_RETRY_MS,
};
use crate::admission::plan_reserves;
use crate::batch::{Batch, BatchOutcome, SkuRecord, StockChange};
use crate::ids::{RequestKey, SkuSettings};
use crate::protocol::{merge_transfers, SkuDirective, TakeResponse, TransferMsg};
use crate::reservation::{Reservation, Transition};

impl SkuOwner {
    /// A directive (and the grants not yet acknowledged) from a sync; may
    /// arrive at any time. Changes are persisted with the next batch.
    pub fn handle_directive(&mut self, d: &SkuDirective, grants: Vec<TransferMsg>) {
        if d.paused != self.paused {
            self.paused = d.paused;
            self.pending_changes.push(StockChange::Pause(d.paused));
        }
        if d.mode != self.mode {
            self.mode = d.mode;
            self.pending_changes.push(StockChange::Mode(d.mode));
        }
        // Settings the coordinator could not have meant are not guessed at:
        // the owner keeps its own until a valid directive comes.
        let parsed = i64::try_from(d.hold_ttl_ms)
            .ok()
            .and_then(|ttl| SkuSettings::parse(Some(i64::from(d.max_per_user)), Some(ttl)).ok())
            .map(|settings| settings.with_scope(d.user_limit_scope));
        if let Some(settings) = parsed {
            if settings != self.settings {
                self.settings = settings;
                self.pending_changes.push(StockChange::Settings(settings));
            }
        }
        let recalled = d.return_until > self.return_until.unwrap_or(0).max(self.ledger.returned);
        self.return_until = Some(d.return_until);
        self.sold_out_everywhere = d.sold_out_everywhere;
        // Something moved: waiting requests may ask again at once.
        self.next_take_ms = 0;
        let new = grants
            .into_iter()
            .filter(|g| !self.credited_grants.contains(&g.id));
        merge_transfers(&mut self.pending_grants, new);
        // A recall, a grant or a change to persist is worth a batch now,
        // not at the next tick: another region's buyers may be waiting.
        if recalled || !self.pending_grants.is_empty() || !self.pending_changes.is_empty() {
            self.next_tick_ms = 0;
        }
    }

    /// Starts a batch with `commands` (at most `max_in_flight` of them,
    /// fewer when overflow is waiting). Only while idle.
    pub fn handle_commands(&mut self, now_ms: u64, commands: Vec<Command>) {
        assert!(self.is_idle(), "one batch at a time");
        self.next_tick_ms = now_ms + SWEEP_INTERVAL_MS;
        self.decided_ms = now_ms;
        let mut work = Work::new(self.tenant.clone(), self.sku.clone(), now_ms);
        let mut reserves: Vec<PendingReserve> = self.parked.drain(..).collect();
        reserves.extend(self.overflow.drain(..));
        let mut asked = 0;
        for command in commands {
            match command {
                Command::Reserve {
                    ticket,
                    request,
                    deadline,
                    known,
                } => reserves.push({
                    if !known {
                        asked += request.qty.units();
                    }
                    PendingReserve {
                        ticket,
                        request,
                        deadline,
                        known,
                        in_failed_commit: false,
                        aside: false,
                    }
                }),
                Command::SetAside {
                    ticket,
                    request,
                    deadline,
                } => {
                    asked += request.qty.units();
                    reserves.push(PendingReserve {
                        ticket,
                        request,
                        deadline,
                        known: false,
                        in_failed_commit: false,
                        aside: true,
                    });
                }
                Command::Act {
                    ticket,
                    key,
                    action,
                    deadline,
                } => {
                    if deadline.passed(now_ms) {
                        self.reply(ticket, Reply::Act(ActReply::WaitTimeout));
                    } else {
                        work.acts.push(PendingAct {
                            ticket,
                            key,
                            action,
                            deadline,
                        });
                    }
                }
                Command::Admin { ticket, change } => work.admins.push_back((ticket, change)),
            }
        }
        // Demand, not sales: a region starved of units still wants them.
        self.rate.record(now_ms, asked);
        self.measure(now_ms);
        for p in reserves {
            if p.deadline.passed(now_ms) {
                self.reply(p.ticket, Reply::Reserve(ReserveReply::WaitTimeout));
            } else {
                work.fresh.push(p);
            }
        }
        if self.fenced || self.drifted {
            return self.refuse(work, PauseReason::Halted);
        }
        if self.needs_reload {
            self.phase = Phase::Reloading(work);
            self.io = Some(Io::Reload);
            return;
        }
        self.next_admin(work);
    }

    /// A newer process holds the region: this owner never writes again.
    pub fn handle_fenced(&mut self) {
        self.fenced = true;
    }

    /// How the commit of a cart with an item here ended for the item
    /// `key`, or the cart's later transition; at any time. Memory follows
    /// the database: units set aside become the cart's hold or free
    /// again; a transition moves the item's units as a batch's would. An
    /// end memory cannot place (a reload came between) reloads the SKU
    /// before the next decision instead of guessing.
    pub fn handle_cart_end(&mut self, key: &RequestKey, end: CartEnd) {
        let aside = self.aside.remove(key);
        match end {
            CartEnd::Held => match aside {
                Some(hold) => {
                    self.holds.insert(key.clone(), hold.reservation(&self.sku));
                }
                None if self.holds.contains_key(key) => {}
                None => self.needs_reload = true,
            },
            CartEnd::Dropped => {
                if let Some(hold) = aside {
                    let moved = self.ledger.unhold(hold.qty.units());
                    self.check(moved);
                    self.freed_at_ms = Some(self.decided_ms);
                    self.next_tick_ms = 0;
                }
            }
            CartEnd::Unknown => self.needs_reload = true,
            CartEnd::Moved(change) => {
                let Some(qty) = self.holds.get(key).map(|r| r.qty) else {
                    // Memory was read after the move: it has it already.
                    return;
                };
                let moved = change.apply_to_ledger(&mut self.ledger, qty);
                self.check(moved);
                self.settle(key, change);
                if matches!(change, Transition::Release | Transition::Expire) {
                    self.freed_at_ms = Some(self.decided_ms);
                    self.next_tick_ms = 0;
                }
            }
        }
    }

    /// The driver stops: requests left over from the last batch are
    /// answered PAUSED (nothing of theirs was written). Only while idle.
    pub fn handle_close(&mut self) {
        assert!(self.is_idle(), "close between batches");
        let waiting: Vec<PendingReserve> = self
            .parked
            .drain(..)
            .chain(self.overflow.drain(..))
            .collect();
        for p in waiting {
            self.reply(
                p.ticket,
                Reply::Reserve(ReserveReply::Paused(PauseReason::Halted)),
            );
        }
    }

    /// Nothing came for a while: expire due holds and return units if due.
    /// Only while idle.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        if self.is_idle() {
            self.handle_commands(now_ms, Vec::new());
        }
    }

    /// The stored state after [`Io::Reload`] at `now_ms`, or `None` if it
    /// could not be read. A batch settling a commit of unknown outcome asks
    /// again after a failed read, until its time is up (then PAUSED).
    pub fn handle_reload(&mut self, now_ms: u64, record: Option<SkuRecord>) {
        let Phase::Reloading(work) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            panic!("a reload answer without a reload");
        };
        if work.settle_until_ms.is_some_and(|until| now_ms >= until) {
            return self.refuse(work, PauseReason::Storage);
        }
        match record {
            Some(record) => {
                self.needs_reload = false;
                self.adopt(record);
                if self.drifted {
                    return self.refuse(work, PauseReason::Halted);
                }
                self.next_admin(work);
            }
            None if work.settle_until_ms.is_some() => {
                self.phase = Phase::Reloading(work);
                self.io = Some(Io::Reload);
            }
            None => self.refuse(work, PauseReason::Storage),
        }
    }

    /// The rows asked for by [`Io::Read`] (missing keys have none), or
    /// `None` if they could not be read.
    pub fn handle_read(&mut self, rows: Option<Vec<Reservation>>) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::ReadingActs(mut work) => match rows {
                Some(rows) => {
                    work.rows.extend(
                        rows.into_iter()
                            .filter(|r| r.sku == self.sku)
                            .map(|r| (r.request_key.clone(), r)),
                    );
                    self.plan(work);
                }
                // Unknown is not "not found": refuse, nothing was written.
                None => self.refuse(work, PauseReason::Storage),
            },
            Phase::ReadingExisting(mut work) => {
                match rows {
                    Some(rows) => {
                        let rows: HashMap<&RequestKey, &Reservation> =
                            rows.iter().map(|r| (&r.request_key, r)).collect();
                        for p in std::mem::take(&mut work.existing) {
                            let reply = match rows.get(&p.request.request_key) {
                                Some(r)
                                    if r.user_id == p.request.user_id
                                        && r.sku == self.sku
                                        && r.qty == p.request.qty =>
                                {
                                    ReserveReply::Replay((*r).clone())
                                }
                                Some(_) => ReserveReply::KeyReused,
                                None => ReserveReply::UserLimit,
                            };
                            self.reply(p.ticket, Reply::Reserve(reply));
                        }
                    }
                    None => {
                        for p in std::mem::take(&mut work.existing) {
                            let reply = ReserveReply::Paused(PauseReason::Storage);
                            self.reply(p.ticket, Reply::Reserve(reply));
                        }
                    }
                }
                self.settle_overflow(work);
            }
            other => panic!("a read answer in phase {other:?}"),
        }
    }

    /// The coordinator's answer to [`Io::Take`], or `None` if it could not be asked.
    pub fn handle_take_answer(&mut self, answer: Option<TakeResponse>) {
        let Phase::Taking(mut work) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            panic!("a take answer without a take");
        };
        work.take = TakeEnd::Unreachable;
        self.next_take_ms = work.now_ms + TAKE_RETRY_MS;
        if let Some(resp) = answer {
            work.take = TakeEnd::Moving;
            if let Some(grant) = resp.grant {
                work.granted = grant.units;
                work.batch.grants.push(grant);
            }
            if resp.sold_out_everywhere {
                self.sold_out_everywhere = true;
                work.take = TakeEnd::Exhausted;
            } else {
                let quantities = quantities(&work);
                let needed: u64 = work.plan.overflow.iter().map(|&i| quantities[i]).sum();
                if work.granted < needed {
                    // Buyers wait for units elsewhere: report the demand now.
                    self.sync_due = true;
                } else {
                    // Everything asked for came: the next batch may ask at once.
                    self.next_take_ms = 0;
                }
            }
            if work.granted > 0 {
                work.plan = plan_reserves(self.ledger.available + work.granted, &quantities(&work));
            }
        }
        self.build(work);
    }

    /// The take was not answered before the earliest deadline of the
    /// buyers it was for: the coordinator is slow, not known to be gone.
    /// Nothing of theirs was written; what the take may have granted
    /// arrives by sync. Those past their deadline are answered
    /// REJECTED_WAIT_TIMEOUT (they waited); the others keep waiting and
    /// ask again, instead of all being told PAUSED.
    pub fn handle_take_late(&mut self) {
        let Phase::Taking(mut work) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            panic!("a late take without a take");
        };
        work.take = TakeEnd::NotAsked;
        self.next_take_ms = work.now_ms + TAKE_RETRY_MS;
        self.build(work);
    }

    /// How [`Io::Commit`] ended, with the batch handed back (the owner
    /// lends it to the driver rather than copy it on every commit).
    pub fn handle_commit_result(
        &mut self,
        batch: Batch,
        result: Result<BatchOutcome, CommitError>,
    ) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Admin(work, ticket) => match result {
                Ok(_) => {
                    for change in &batch.changes {
                        self.apply_change(*change);
                    }
                    self.reply(ticket, Reply::Admin(AdminReply::Done));
                    self.next_admin(work);
                }
                Err(error) => {
                    let reason = self.commit_failed(error);
                    self.reply(ticket, Reply::Admin(AdminReply::Paused(reason)));
                    self.refuse(work, reason);
                }
            },
            Phase::Committing(mut work) => match result {
                Ok(outcome) => {
                    self.sync_due |= !batch.returns.is_empty() || !batch.grants.is_empty();
                    work.batch = batch;
                    self.committed(work, outcome)
                }
                Err(CommitError::Unknown) => {
                    let until = work.settle_until_ms.unwrap_or_else(|| settle_until(&work));
                    self.retry_after_failed_commit(&batch, work, Some(until))
                }
                Err(CommitError::Failed) if !work.retrying || work.settle_until_ms.is_some() => {
                    let until = work.settle_until_ms;
                    self.retry_after_failed_commit(&batch, work, until)
                }
                Err(error) => {
                    let reason = self.commit_failed(error);
                    self.refuse(work, reason);
                }
            },
            other => panic!("a commit result in phase {other:?}"),
        }
    }
}

/// When a batch whose commit outcome is unknown stops settling: when the
/// last of its requests stops waiting (a buyer is answered by its own
/// deadline, PAUSED if the database has not answered by then, and its
/// retry with the same key gets the truth), at most [`SETTLE_MS`] after
/// the batch started.
fn settle_until(work: &Work) -> u64 {
    let waiting = work
        .fresh
        .iter()
        .chain(&work.holding)
        .chain(&work.overflow)
        .chain(&work.lookups)
        .chain(&work.later)
        .chain(&work.existing)
        .chain(work.confirmed.iter().map(|(p, _)| p))
        .chain(work.setting_aside.iter().map(|(p, _)| p))
        .map(|p| p.deadline.at_ms)
        .chain(work.acts.iter().map(|a| a.deadline.at_ms))
        .max();
    let cap = work.now_ms + SETTLE_MS;
    waiting.map_or(cap, |at| at.min(cap))
}
