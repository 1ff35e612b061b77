//! A region's sync, SKU by SKU: the request checked and admitted against
//! the agent's standing, then acks, returns and the report applied and the
//! SKU rebalanced.

use std::collections::HashSet;

use super::{
    check_transfer, Allocation, AllocationError, Moves, Report, REPORT_UNITS_MAX, RTT_MS_MAX,
};
use crate::ids::TransferId;
use crate::policy::Policy;
use crate::protocol::{SkuDirective, SkuReport, SyncRequest, TransferMsg};

/// A region agent's standing: its process's fencing epoch, the sequence
/// number of its last applied report, and its round trip then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentSession {
    /// The agent's fencing epoch.
    pub epoch: i64,
    /// Sequence number of the last report applied.
    pub seq: u64,
    /// Round trip the agent measured, ms, at most [`RTT_MS_MAX`].
    pub rtt_ms: u64,
}

/// The result of one SKU's part of a region's sync.
#[derive(Debug, Clone, PartialEq)]
pub struct SkuSynced {
    /// Every grant of this SKU to the region not yet acknowledged.
    pub grants: Vec<TransferMsg>,
    /// The SKU's directive for the region.
    pub directive: SkuDirective,
    /// Returns applied now; the driver records their ids so a repeat is
    /// recognised.
    pub applied: Vec<TransferMsg>,
    /// What the rebalance did.
    pub moves: Moves,
}

/// Checks a sync request as a whole, before any SKU is touched: every
/// return names an id and moves units, and no report counts more units
/// than [`REPORT_UNITS_MAX`]. A refused request changes nothing anywhere.
pub fn check_sync(req: &SyncRequest) -> Result<(), AllocationError> {
    check_reports(req)?;
    for ret in &req.returns {
        check_transfer("return", ret.units)?;
    }
    Ok(())
}

/// Admits a region agent's sync against its standing: a request from an
/// older epoch is refused; one newer than every request seen (by `(epoch,
/// seq)`) gives the region its new standing, with its round trip. `None`:
/// the standing stays as it was (an older or repeated request, whose acks
/// and returns still apply, SKU by SKU).
pub fn admit(
    session: Option<AgentSession>,
    req: &SyncRequest,
) -> Result<Option<AgentSession>, AllocationError> {
    if session.is_some_and(|s| req.epoch < s.epoch) {
        return Err(AllocationError::StaleEpoch);
    }
    let newer = session.is_none_or(|s| (req.epoch, req.seq) > (s.epoch, s.seq));
    Ok(newer.then_some(AgentSession {
        epoch: req.epoch,
        seq: req.seq,
        rtt_ms: req.rtt_ms.min(RTT_MS_MAX),
    }))
}

impl Allocation {
    /// Replaces `region`'s report; a recall never asks for more than it has
    /// available.
    fn apply_report(&mut self, region: usize, report: &SkuReport, now_ms: u64) {
        let rate = report.sale_rate_per_s;
        let r = &mut self.regions[region];
        r.report = Report {
            available: report.available,
            held: report.held,
            sold: report.sold,
            sale_rate_per_s: if rate.is_finite() { rate.max(0.0) } else { 0.0 },
            set_aside: report.set_aside.min(report.held),
        };
        r.recall_pending = r.recall_pending.min(report.available);
        r.reported_at_ms = Some(now_ms);
    }

    /// This SKU's part of `region`'s sync, all or nothing, independent of
    /// the request's other SKUs: acks of this SKU's grants move them to
    /// leased; each of its returns not applied before goes back to the pool
    /// and settles recalls; its report replaces the region's last one if
    /// the request is newer, by `(epoch, seq)`, than the one that brought
    /// that (so a late or repeated request never stores an older view);
    /// then the SKU is rebalanced.
    ///
    /// `applied_before` holds the ids among this SKU's returns that the
    /// driver's store already applied. A request without a report of this
    /// SKU (a delta report: the agent's counters did not change) applies
    /// its acks and returns and keeps the last report: the agent sends a
    /// SKU's report whenever its counters changed, so the stored one is
    /// still its view. Refused (changing nothing) if the returns would take
    /// more than the region's lease, counting the grants this request
    /// acknowledges.
    pub fn sync(
        &mut self,
        region: usize,
        req: &SyncRequest,
        applied_before: &HashSet<TransferId>,
        now_ms: u64,
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> TransferId,
    ) -> Result<SkuSynced, AllocationError> {
        let new_returns = self.returns_to_apply(region, req, applied_before)?;
        for id in &req.acks {
            self.deliver(region, id);
        }
        for ret in &new_returns {
            self.apply_return(region, ret.units);
        }
        let newer = (req.epoch, req.seq) > self.regions[region].reported_by;
        let report = req.skus.iter().find(|s| self.is_for(&s.tenant, &s.sku));
        if let (true, Some(report)) = (newer, report) {
            self.apply_report(region, report, now_ms);
            let r = &mut self.regions[region];
            r.reported_by = (req.epoch, req.seq);
            r.rtt_ms = req.rtt_ms.min(RTT_MS_MAX);
        }
        let moves = self.rebalance(policy, new_id);
        Ok(SkuSynced {
            grants: self.pending_grants(region),
            directive: self.directive(region),
            applied: new_returns.into_iter().cloned().collect(),
            moves,
        })
    }

    /// Whether this SKU's part of `req` could change anything for `region`:
    /// an ack of one of its grants in transit, a return of this SKU, or a
    /// report newer than the stored one that differs from it
    /// ([`SkuReport::differs_from`]). When false, [`Allocation::sync`] would
    /// only store the same view again and rebalance a SKU nothing changed
    /// in: the driver answers its directive and pending grants from what it
    /// read and takes no lock.
    pub fn sync_changes(&self, region: usize, req: &SyncRequest) -> bool {
        let r = &self.regions[region];
        let stored = SkuReport {
            tenant: self.tenant.clone(),
            sku: self.sku.clone(),
            available: r.report.available,
            held: r.report.held,
            sold: r.report.sold,
            sale_rate_per_s: r.report.sale_rate_per_s,
            set_aside: r.report.set_aside,
        };
        let newer = (req.epoch, req.seq) > r.reported_by;
        r.grants.keys().any(|id| req.acks.contains(id))
            || req.returns.iter().any(|t| self.is_for(&t.tenant, &t.sku))
            || req.skus.iter().any(|report| {
                self.is_for(&report.tenant, &report.sku)
                    && newer
                    && (r.reported_at_ms.is_none() || report.differs_from(&stored))
            })
    }

    /// This SKU's returns in `req` to apply now: not applied before, each id
    /// once, together within the region's lease (counting the grants the
    /// request acknowledges).
    fn returns_to_apply<'r>(
        &self,
        region: usize,
        req: &'r SyncRequest,
        applied_before: &HashSet<TransferId>,
    ) -> Result<Vec<&'r TransferMsg>, AllocationError> {
        let r = &self.regions[region];
        let acks: HashSet<&TransferId> = req.acks.iter().collect();
        let acked: u64 = r
            .grants
            .iter()
            .filter(|(id, _)| acks.contains(id))
            .map(|(_, units)| units)
            .sum();
        let mut room = r.leased + acked;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for ret in req
            .returns
            .iter()
            .filter(|t| self.is_for(&t.tenant, &t.sku))
        {
            check_transfer("return", ret.units)?;
            if applied_before.contains(&ret.id) || !seen.insert(&ret.id) {
                continue;
            }
            room = room.checked_sub(ret.units).ok_or_else(|| {
                AllocationError::Invalid(format!("return {} exceeds the region's lease", ret.id))
            })?;
            out.push(ret);
        }
        Ok(out)
    }
}

/// Refuses a request whose report of a SKU counts more units than
/// [`REPORT_UNITS_MAX`]: no region can hold them, and the policy's
/// arithmetic on them would overflow.
fn check_reports(req: &SyncRequest) -> Result<(), AllocationError> {
    for report in &req.skus {
        let on_hand = report
            .available
            .checked_add(report.held)
            .and_then(|units| units.checked_add(report.sold));
        if on_hand.is_none_or(|units| units > REPORT_UNITS_MAX) {
            return Err(AllocationError::Invalid(format!(
                "report of {}/{}: available + held + sold must be at most {REPORT_UNITS_MAX}",
                report.tenant, report.sku
            )));
        }
    }
    Ok(())
}
