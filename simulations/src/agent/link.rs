//! The agent's calls to the coordinator: takes for buyers waiting on
//! units, the sync loop's reports (with the borrows and loans not yet
//! settled), and the watch's notices, each with the client timeout the
//! real agent uses.

use escrow_core::owner::TAKE_BUDGET_MIN_MS;
use escrow_core::protocol::{
    merge_transfers, SkuDirective, SkuReport, SyncRequest, SyncResponse, TakeRequest, TakeResponse,
    TransferMsg, WatchResponse,
};

use super::{Agent, Effect, Timer};
use crate::network::Payload;

/// The sync in flight: its call, when it left, and what it carried, for
/// [`Reports::answered`](escrow_core::Reports::answered) when its answer comes.
#[derive(Debug)]
pub(super) struct SyncCall {
    pub(super) call: u64,
    sent_us: u64,
    req: SyncRequest,
}

impl Agent {
    pub(super) fn send_take(&mut self, now_us: u64, request: TakeRequest, out: &mut Vec<Effect>) {
        self.call_seq += 1;
        let call = self.call_seq;
        self.stats.takes += 1;
        self.take_call = Some(call);
        self.send(now_us, call, Payload::Take(request), out);
        let timeout_us = now_us + self.client_timeout_us();
        // As the agent does: no buyer waits past its deadline for a take.
        let deadline_us = self
            .owner
            .take_deadline_ms()
            .map_or(u64::MAX, |at| at.saturating_mul(1_000));
        let timer = if deadline_us < timeout_us {
            let budget_us = deadline_us.saturating_sub(now_us);
            self.take_late_possible = budget_us < TAKE_BUDGET_MIN_MS * 1_000;
            self.timer(deadline_us.max(now_us), Timer::TakeDeadline(call))
        } else {
            self.timer(timeout_us, Timer::TakeTimeout(call))
        };
        out.push(timer);
    }

    /// The coordinator answered a take (a late answer finds no take waiting: dropped).
    pub fn on_take_reply(
        &mut self,
        now_us: u64,
        call: u64,
        resp: &TakeResponse,
        out: &mut Vec<Effect>,
    ) {
        if self.take_call != Some(call) {
            return;
        }
        self.take_call = None;
        self.link_down = false;
        self.owner.handle_take_answer(Some(resp.clone()));
        self.pump(now_us, out);
    }

    /// A take got no answer: the coordinator is unreachable (`link_down`),
    /// or merely slower than the buyers' deadline.
    pub(super) fn take_failed(
        &mut self,
        now_us: u64,
        call: u64,
        link_down: bool,
        out: &mut Vec<Effect>,
    ) {
        if self.take_call != Some(call) {
            return;
        }
        self.take_call = None;
        self.link_down |= link_down;
        if !link_down && self.take_late_possible {
            self.owner.handle_take_late();
        } else {
            self.owner.handle_take_answer(None);
        }
        self.pump(now_us, out);
    }

    /// The coordinator refused a call at once (connection refused).
    pub fn on_refused(&mut self, now_us: u64, call: u64, out: &mut Vec<Effect>) {
        if self.sync_call.as_ref().map(|c| c.call) == Some(call) {
            self.sync_failed(now_us, out);
        } else if self.is_limits_call(call) {
            self.limits_failed(now_us, call, out);
        } else {
            self.take_failed(now_us, call, true, out);
        }
    }

    pub(super) fn on_sync_tick(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.call_seq += 1;
        self.sync_seq += 1;
        let call = self.call_seq;
        let all = vec![SkuReport::of(
            self.tenant.clone(),
            self.db.book.sku.clone(),
            self.db.book.ledger,
            self.owner.units_set_aside(),
            self.owner.sale_rate_per_s(),
        )];
        let returns: Vec<TransferMsg> = self
            .db
            .returns
            .iter()
            .map(|(id, units)| TransferMsg {
                id: id.clone(),
                tenant: self.tenant.clone(),
                sku: self.db.book.sku.clone(),
                units: *units,
            })
            .collect();
        let (skus, full) = self.reports.to_send(all, &returns);
        let req = SyncRequest {
            limits: self.limits_to_send(),
            epoch: i64::from(self.epoch),
            seq: self.sync_seq,
            rtt_ms: self.round_trip.estimate_ms(),
            skus,
            acks: self.db.pending_acks.clone(),
            returns,
            full,
        };
        self.stats.syncs += 1;
        self.sync_call = Some(SyncCall {
            call,
            sent_us: now_us,
            req: req.clone(),
        });
        self.send(now_us, call, Payload::Sync(req), out);
        out.push(self.timer(now_us + self.client_timeout_us(), Timer::SyncTimeout(call)));
    }

    pub(super) fn sync_failed(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.sync_call = None;
        self.reports.failed();
        self.link_down = true;
        self.schedule_sync(now_us, out);
    }

    /// The next sync: at once if one was asked for meanwhile, else after the interval.
    fn schedule_sync(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        self.sync_gen += 1;
        if std::mem::take(&mut self.sync_again) {
            return self.on_sync_tick(now_us, out);
        }
        let at = now_us + self.cfg.sync_interval_ms * 1_000;
        out.push(self.timer(at, Timer::SyncTick(self.sync_gen)));
    }

    /// Syncs at once (as the agent's sync loop does when asked): units
    /// were returned or received, buyers wait for units, or the
    /// coordinator's notice came. One already in flight: the next follows it.
    pub fn request_sync(&mut self, now_us: u64, out: &mut Vec<Effect>) {
        if !self.up {
            return;
        }
        if self.sync_call.is_some() {
            self.sync_again = true;
            return;
        }
        self.sync_gen += 1;
        self.on_sync_tick(now_us, out);
    }

    /// The coordinator's watch answer came with news: its borrows and
    /// loans are applied at once; its directive and grants go to the owner
    /// as a sync's would. The owner asks for a sync once it has acted on
    /// them (a return or a grant committed); only news without a directive
    /// is fetched by a sync at once.
    pub fn on_notice(&mut self, now_us: u64, news: &WatchResponse, out: &mut Vec<Effect>) {
        if !news.limits.is_empty() {
            self.apply_limits(now_us, &news.limits, out);
        }
        match news.skus.first() {
            Some(d) => self.follow(d, &news.grants),
            None => self.request_sync(now_us, out),
        }
        self.pump(now_us, out);
    }

    /// Keeps the coordinator's latest directive for the owner's next idle
    /// moment, with every grant not yet handed over (a watch's and a
    /// sync's answers can both arrive between two batches); the regions it
    /// names judge the per-user limit at once.
    fn follow(&mut self, d: &SkuDirective, grants: &[TransferMsg]) {
        self.borrowing.regions.clone_from(&d.limit_regions);
        let mut kept = self.control.take().map(|(_, g)| g).unwrap_or_default();
        merge_transfers(&mut kept, grants.iter().cloned());
        self.control = Some((d.clone(), kept));
    }

    /// The coordinator answered a sync (an answer to another call is dropped).
    pub fn on_sync_reply(
        &mut self,
        now_us: u64,
        call: u64,
        resp: &SyncResponse,
        out: &mut Vec<Effect>,
    ) {
        let Some(sent) = self.sync_call.take_if(|c| c.call == call) else {
            return;
        };
        self.reports.answered(&sent.req);
        self.round_trip.record((now_us - sent.sent_us) / 1_000);
        self.link_down = false;
        if let Some(d) = resp.skus.first() {
            self.follow(d, &resp.grants);
        }
        self.db
            .pending_acks
            .retain(|id| !resp.confirmed.contains(id));
        for id in &resp.applied_returns {
            self.db.returns.remove(id);
        }
        self.limits_sent(&sent.req.limits);
        // After the next sync is scheduled: borrows and loans applied now
        // may ask for one at once.
        self.schedule_sync(now_us, out);
        if !resp.limits.is_empty() {
            self.apply_limits(now_us, &resp.limits, out);
        }
        self.pump(now_us, out);
    }
}
