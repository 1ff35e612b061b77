//! The coordinator's rules for one SKU: what a sync, a take or an admin
//! change does to the pool, the grants in transit and each region's lease,
//! and what goes back to the agents.
//!
//! [`Allocation`] is everything the coordinator decides with for one SKU.
//! The coordinator loads it from PostgreSQL under the SKU's row lock, calls
//! one method and writes the difference back in the same transaction; the
//! simulator keeps it in memory. Neither driver decides anything itself, so
//! the simulator measures the rules the service runs.
//!
//! `pool + in_transit + sum(leased) = total` holds before and after every
//! move, and each move asserts it at both ends. A grant moves units pool ->
//! in transit; the region's ack moves them in transit -> leased; a return
//! moves them leased -> pool. A refused input (an error) changes nothing:
//! every check runs before the first move.
//!
//! The rules keep no history. Which return ids were already applied, and
//! what a take's id was used for, live in the driver's store (the
//! `transfers` table, or the simulator's sets); the driver looks up the ids
//! a request names and passes what it found, and records what the rules
//! say was applied.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::ids::{Sku, SkuSettings, Tenant, ID_LEN_MAX};
use crate::policy::{decide_take, retired_recalls, Mode, Policy, RegionState, SkuState};
use crate::protocol::{
    SkuDirective, SkuReport, SyncRequest, TakeRequest, TakeResponse, TransferMsg,
};

/// Longest round trip an agent may report, ms; a larger one counts as this.
pub const RTT_MS_MAX: u64 = 60_000;

/// Most units a region may report of one SKU (available + held + sold): a
/// thousand times the largest stock an admin can add at once, so no real
/// report comes near it, and the policy's sums over thousands of regions
/// cannot overflow.
pub const REPORT_UNITS_MAX: u64 = 1_000_000_000_000_000;

/// Why an input was refused. A refused input changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// A request from an agent process older than one already seen.
    #[error("stale agent epoch")]
    StaleEpoch,
    /// Lowering the total would need units that are leased, held or sold.
    #[error(
        "total may only be lowered by what is in the pool ({pool} units); the rest is leased, held or sold"
    )]
    TotalBelowPool {
        /// Units in the pool.
        pool: u64,
    },
    /// A message that cannot be right (no units, a bad id, a return beyond the lease).
    #[error("{0}")]
    Invalid(String),
}

/// A region's last report of one SKU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Report {
    /// Units it could hold.
    pub available: u64,
    /// Units held.
    pub held: u64,
    /// Units sold.
    pub sold: u64,
    /// Units per second it recently held; finite and not negative.
    pub sale_rate_per_s: f64,
}

impl Report {
    /// Everything the region has of the SKU: available, held and sold.
    pub fn on_hand(&self) -> u64 {
        self.available + self.held + self.sold
    }
}

/// One region's share of one SKU at the coordinator.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RegionAllocation {
    /// Relative share of the total; 0 once removed from the SKU.
    pub weight: u32,
    /// Units delivered to the region minus units it returned.
    pub leased: u64,
    /// Grants to the region not yet acknowledged, units by id.
    pub grants: BTreeMap<String, u64>,
    /// Units the region returned, cumulative.
    pub returned: u64,
    /// Units asked back and not yet returned.
    pub recall_pending: u64,
    /// Its last report.
    pub report: Report,
    /// When its last report was applied, ms since the epoch; `None` before the first.
    pub reported_at_ms: Option<u64>,
    /// Its agent's last measured round trip, ms.
    pub rtt_ms: u64,
    /// `(epoch, seq)` of the sync request whose report is the last one
    /// applied; `(0, 0)` before the first. Orders reports per SKU.
    pub reported_by: (i64, u64),
}

impl RegionAllocation {
    /// Units granted to the region and not yet acknowledged.
    pub fn in_transit(&self) -> u64 {
        self.grants.values().sum()
    }
}

/// The coordinator's state of one SKU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Allocation {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// The SKU.
    pub sku: Sku,
    /// Units the SKU has in all.
    pub total: u64,
    /// Units not leased to any region nor in transit.
    pub pool: u64,
    /// Escrow or central.
    pub mode: Mode,
    /// Paused by an admin: no grants, and agents stop selling.
    pub paused: bool,
    /// Per-user limit and default hold.
    pub settings: SkuSettings,
    /// One entry per region taking part, by index.
    pub regions: Vec<RegionAllocation>,
}

/// What a move did besides the state change: the grants created, the
/// recalls asked, and whether the tail merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moves {
    /// Grants created: region index, grant id, units.
    pub grants: Vec<(usize, String, u64)>,
    /// Units asked back, by region index.
    pub recalls: Vec<(usize, u64)>,
    /// The SKU switched to central mode.
    pub merged: bool,
}

impl Moves {
    /// Units granted in all.
    pub fn granted_units(&self) -> u64 {
        self.grants.iter().map(|g| g.2).sum()
    }

    /// Indices (below `regions`) of the regions these moves give something
    /// to do: a grant to credit, a recall to return, a mode change. Their
    /// agents are told at once (a notice) rather than at their next sync.
    pub fn regions_to_notify(&self, regions: usize) -> Vec<usize> {
        (0..regions)
            .filter(|&i| {
                self.merged
                    || self.grants.iter().any(|g| g.0 == i)
                    || self.recalls.iter().any(|r| r.0 == i && r.1 > 0)
            })
            .collect()
    }
}

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

/// What the driver's store holds under a take's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeHistory {
    /// Nothing: a new take.
    Unused,
    /// A grant of this SKU to this region, of these units: the take is repeated.
    GrantedHere(u64),
    /// Some other transfer.
    UsedElsewhere,
}

/// The result of a take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The answer to the agent.
    pub response: TakeResponse,
    /// Units newly granted by this take (0 for a repeat).
    pub granted: u64,
    /// What the rebalance after a short take did.
    pub moves: Moves,
}

fn check_transfer(kind: &str, id: &str, units: u64) -> Result<(), AllocationError> {
    if units == 0 || id.is_empty() || id.len() > ID_LEN_MAX {
        return Err(AllocationError::Invalid(format!(
            "{kind} needs units >= 1 and an id of 1..={ID_LEN_MAX} characters"
        )));
    }
    Ok(())
}

impl Allocation {
    /// A new SKU: `total` units in the pool, then the policy's initial split
    /// granted to regions of `weights`. Grant ids come from `new_id`.
    pub fn create(
        tenant: Tenant,
        sku: Sku,
        total: u64,
        settings: SkuSettings,
        weights: &[u32],
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> String,
    ) -> (Self, Moves) {
        let mut allocation = Self {
            tenant,
            sku,
            total,
            pool: total,
            mode: if policy.starts_central() {
                Mode::Central
            } else {
                Mode::Escrow
            },
            paused: false,
            settings,
            regions: weights
                .iter()
                .map(|&weight| RegionAllocation {
                    weight,
                    ..RegionAllocation::default()
                })
                .collect(),
        };
        let split = policy.initial_split(total, weights);
        assert_eq!(split.len(), weights.len(), "one share per region");
        assert!(
            split.iter().sum::<u64>() <= total,
            "initial split exceeds total"
        );
        let mut moves = Moves::default();
        for (region, units) in split.into_iter().enumerate() {
            if units > 0 {
                moves.grants.push(allocation.grant(region, new_id(), units));
            }
        }
        (allocation, moves)
    }

    /// Units in transit to all regions.
    pub fn in_transit(&self) -> u64 {
        self.regions.iter().map(RegionAllocation::in_transit).sum()
    }

    /// Units leased to all regions.
    pub fn leased(&self) -> u64 {
        self.regions.iter().map(|r| r.leased).sum()
    }

    /// `pool + in_transit + leased - total`: the coordinator's own books; 0
    /// unless the stored state is corrupt.
    pub fn ledger_drift(&self) -> i128 {
        i128::from(self.pool) + i128::from(self.in_transit()) + i128::from(self.leased())
            - i128::from(self.total)
    }

    /// The contract's audit over the latest reports:
    /// `pool + in_transit + sum(available + held + sold) - total`.
    pub fn drift(&self) -> i128 {
        let reported: u64 = self.regions.iter().map(|r| r.report.on_hand()).sum();
        i128::from(self.pool) + i128::from(self.in_transit()) + i128::from(reported)
            - i128::from(self.total)
    }

    /// Whether `pool + in_transit + leased = total` and no grant is empty.
    pub fn is_balanced(&self) -> bool {
        self.ledger_drift() == 0
            && self
                .regions
                .iter()
                .all(|r| r.grants.values().all(|&u| u > 0))
    }

    fn assert_balanced(&self) {
        assert!(self.is_balanced(), "allocation invariant broken: {self:?}");
    }

    /// The SKU as the policy sees it.
    pub fn policy_view(&self) -> SkuState {
        SkuState {
            total: self.total,
            pool: self.pool,
            mode: self.mode,
            regions: self
                .regions
                .iter()
                .map(|r| RegionState {
                    weight: r.weight,
                    leased: r.leased,
                    in_transit: r.in_transit(),
                    available: r.report.available,
                    sale_rate_per_s: r.report.sale_rate_per_s,
                    rtt_ms: r.rtt_ms,
                    recall_pending: r.recall_pending,
                })
                .collect(),
        }
    }

    /// Whether nothing is free anywhere: not in the pool, in transit, or
    /// available in a region's last report.
    pub fn is_exhausted(&self) -> bool {
        self.policy_view().remainder() == 0
    }

    /// The directive for `region`: mode, pause, settings, how far to give
    /// back, and whether the SKU is sold out.
    pub fn directive(&self, region: usize) -> SkuDirective {
        let r = &self.regions[region];
        SkuDirective {
            tenant: self.tenant.as_str().to_owned(),
            sku: self.sku.as_str().to_owned(),
            mode: self.mode,
            paused: self.paused,
            max_per_user: self.settings.max_per_user,
            hold_ttl_ms: self.settings.hold_ttl.get(),
            return_until: r.returned + r.recall_pending,
            sold_out: self.is_exhausted(),
        }
    }

    fn transfer(&self, id: &str, units: u64) -> TransferMsg {
        TransferMsg {
            id: id.to_owned(),
            tenant: self.tenant.as_str().to_owned(),
            sku: self.sku.as_str().to_owned(),
            units,
        }
    }

    /// Every grant to `region` not yet acknowledged, as sent to it.
    pub fn pending_grants(&self, region: usize) -> Vec<TransferMsg> {
        self.regions[region]
            .grants
            .iter()
            .map(|(id, &units)| self.transfer(id, units))
            .collect()
    }

    fn is_for(&self, tenant: &str, sku: &str) -> bool {
        self.tenant.as_str() == tenant && self.sku.as_str() == sku
    }

    /// Debits the pool for a grant of `units` to `region` under `id`.
    fn grant(&mut self, region: usize, id: String, units: u64) -> (usize, String, u64) {
        self.assert_balanced();
        assert!(units > 0, "a grant moves at least one unit");
        assert!(
            units <= self.pool,
            "grant of {units} exceeds the pool of {}",
            self.pool
        );
        self.pool -= units;
        let previous = self.regions[region].grants.insert(id.clone(), units);
        assert!(previous.is_none(), "grant id {id} reused");
        self.assert_balanced();
        (region, id, units)
    }

    /// Moves the grant `id` of `region` from in transit to leased, if it is
    /// pending; a repeated ack changes nothing.
    fn deliver(&mut self, region: usize, id: &str) {
        self.assert_balanced();
        let r = &mut self.regions[region];
        if let Some(units) = r.grants.remove(id) {
            r.leased += units;
        }
        self.assert_balanced();
    }

    /// Credits the pool with a return of `units` from `region`'s lease; the
    /// return settles up to as many units of a pending recall.
    fn apply_return(&mut self, region: usize, units: u64) {
        self.assert_balanced();
        let r = &mut self.regions[region];
        assert!(
            units <= r.leased,
            "return of {units} exceeds the lease of {}",
            r.leased
        );
        r.leased -= units;
        r.returned += units;
        r.recall_pending = r.recall_pending.saturating_sub(units);
        self.pool += units;
        self.assert_balanced();
    }

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
        };
        r.recall_pending = r.recall_pending.min(report.available);
        r.reported_at_ms = Some(now_ms);
    }

    /// Runs the policy (none while paused) plus the recalls of retired
    /// regions, and carries out the plan.
    pub fn rebalance(&mut self, policy: &dyn Policy, new_id: &mut dyn FnMut() -> String) -> Moves {
        self.rebalance_as(policy, new_id, false)
    }

    /// [`Allocation::rebalance`], planned by [`Policy::plan_short`] when
    /// `short` (a take could not be granted in full).
    fn rebalance_as(
        &mut self,
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> String,
        short: bool,
    ) -> Moves {
        self.assert_balanced();
        let state = self.policy_view();
        let mut plan = if self.paused {
            Default::default()
        } else if short {
            policy.plan_short(&state)
        } else {
            policy.plan(&state)
        };
        plan.recalls.extend(retired_recalls(&state));
        let mut moves = Moves::default();
        for (region, units) in plan.grants {
            if units > 0 {
                moves.grants.push(self.grant(region, new_id(), units));
            }
        }
        for &(region, units) in &plan.recalls {
            self.regions[region].recall_pending += units;
        }
        moves.recalls = plan.recalls;
        if plan.central && self.mode != Mode::Central {
            self.mode = Mode::Central;
            moves.merged = true;
        }
        self.assert_balanced();
        moves
    }

    /// Adds `units` of new stock to the pool and the total.
    pub fn add_stock(&mut self, units: u64) {
        self.assert_balanced();
        self.total += units;
        self.pool += units;
        self.assert_balanced();
    }

    /// Sets the total; lowering it takes units out of the pool only.
    pub fn set_total(&mut self, total: u64) -> Result<(), AllocationError> {
        self.assert_balanced();
        if total >= self.total {
            self.add_stock(total - self.total);
            return Ok(());
        }
        let cut = self.total - total;
        if cut > self.pool {
            return Err(AllocationError::TotalBelowPool { pool: self.pool });
        }
        self.total = total;
        self.pool -= cut;
        self.assert_balanced();
        Ok(())
    }

    /// Sets every region's weight: `weights` has one per region known so
    /// far (0 retires it) and one per region joining, which starts empty.
    pub fn set_weights(&mut self, weights: &[u32]) {
        assert!(
            weights.len() >= self.regions.len(),
            "a region is never dropped, only given weight 0"
        );
        for (i, &weight) in weights.iter().enumerate() {
            match self.regions.get_mut(i) {
                Some(r) => r.weight = weight,
                None => self.regions.push(RegionAllocation {
                    weight,
                    ..RegionAllocation::default()
                }),
            }
        }
    }

    /// A take of units for `region`, asked synchronously by its agent.
    /// A repeated id gets its grant again; otherwise the pool grants what it
    /// can, and when units are free elsewhere the SKU is rebalanced so the
    /// policy asks for them back. Exhausted only when nothing is free anywhere.
    pub fn take(
        &mut self,
        region: usize,
        req: &TakeRequest,
        history: TakeHistory,
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> String,
    ) -> Result<Taken, AllocationError> {
        check_transfer("take", &req.id, req.units)?;
        assert!(
            self.is_for(&req.tenant, &req.sku),
            "take routed to another SKU"
        );
        let answer = |grant, exhausted, paused| TakeResponse {
            grant,
            exhausted,
            paused,
        };
        match history {
            TakeHistory::UsedElsewhere => {
                return Err(AllocationError::Invalid(
                    "transfer id already used for something else".into(),
                ))
            }
            TakeHistory::GrantedHere(units) => {
                return Ok(Taken {
                    response: answer(Some(self.transfer(&req.id, units)), false, self.paused),
                    granted: 0,
                    moves: Moves::default(),
                })
            }
            TakeHistory::Unused => {}
        }
        if self.paused {
            return Ok(Taken {
                response: answer(None, false, true),
                granted: 0,
                moves: Moves::default(),
            });
        }
        // What the taker will still see or free: grants it has not credited
        // and returns that have not arrived (its own counters say).
        let r = &self.regions[region];
        let granted_ever = r.leased + r.returned + r.in_transit();
        let unseen = granted_ever
            .saturating_sub(req.received)
            .saturating_add(req.returned.saturating_sub(r.returned));
        let decision = decide_take(&self.policy_view(), region, req.units, req.prefetch, unseen);
        let grant = (decision.granted > 0).then(|| {
            self.grant(region, req.id.clone(), decision.granted);
            self.transfer(&req.id, decision.granted)
        });
        let moves = if !decision.exhausted && decision.granted < req.units {
            self.rebalance_as(policy, new_id, true)
        } else {
            Moves::default()
        };
        Ok(Taken {
            response: answer(grant, decision.exhausted, false),
            granted: decision.granted,
            moves,
        })
    }
}

/// Checks a sync request as a whole, before any SKU is touched: every
/// return names an id and moves units, and no report counts more units
/// than [`REPORT_UNITS_MAX`]. A refused request changes nothing anywhere.
pub fn check_sync(req: &SyncRequest) -> Result<(), AllocationError> {
    check_reports(req)?;
    for ret in &req.returns {
        check_transfer("return", &ret.id, ret.units)?;
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
        applied_before: &HashSet<String>,
        now_ms: u64,
        policy: &dyn Policy,
        new_id: &mut dyn FnMut() -> String,
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
            tenant: self.tenant.as_str().to_owned(),
            sku: self.sku.as_str().to_owned(),
            available: r.report.available,
            held: r.report.held,
            sold: r.report.sold,
            sale_rate_per_s: r.report.sale_rate_per_s,
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
        applied_before: &HashSet<String>,
    ) -> Result<Vec<&'r TransferMsg>, AllocationError> {
        let r = &self.regions[region];
        let acks: HashSet<&str> = req.acks.iter().map(String::as_str).collect();
        let acked: u64 = r
            .grants
            .iter()
            .filter(|(id, _)| acks.contains(id.as_str()))
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
            check_transfer("return", &ret.id, ret.units)?;
            if applied_before.contains(&ret.id) || !seen.insert(ret.id.as_str()) {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::{CentralOnly, ProportionalShare, RefillOnLowWater, StaticSplit, TailMerge};

    fn ids() -> impl FnMut() -> String {
        let mut next = 0u64;
        move || {
            next += 1;
            format!("g-{next}")
        }
    }

    fn new_sku(total: u64, weights: &[u32], policy: &dyn Policy) -> Allocation {
        Allocation::create(
            Tenant::parse("t").unwrap(),
            Sku::parse("s").unwrap(),
            total,
            SkuSettings::default(),
            weights,
            policy,
            &mut ids(),
        )
        .0
    }

    fn sync_req(
        seq: u64,
        acks: Vec<String>,
        returns: Vec<TransferMsg>,
        available: u64,
    ) -> SyncRequest {
        SyncRequest {
            epoch: 1,
            seq,
            rtt_ms: 50,
            skus: vec![SkuReport {
                tenant: "t".into(),
                sku: "s".into(),
                available,
                held: 0,
                sold: 0,
                sale_rate_per_s: 1.0,
            }],
            acks,
            returns,
            full: true,
        }
    }

    fn ret(id: &str, units: u64) -> TransferMsg {
        TransferMsg {
            id: id.into(),
            tenant: "t".into(),
            sku: "s".into(),
            units,
        }
    }

    /// Region 0's sync under the static split: admitted, then applied to
    /// the one SKU; the new standing, if any, beside the SKU's result.
    fn sync_static(
        sku: &mut Allocation,
        session: Option<AgentSession>,
        req: &SyncRequest,
        applied: &HashSet<String>,
        now_ms: u64,
    ) -> Result<(Option<AgentSession>, SkuSynced), AllocationError> {
        check_sync(req)?;
        let admitted = admit(session, req)?;
        let synced = sku.sync(0, req, applied, now_ms, &StaticSplit, &mut ids())?;
        Ok((admitted, synced))
    }

    /// Goal: a grant, its ack and a return keep the total; a repeated ack or
    /// return changes nothing; a return beyond the lease and an older epoch
    /// are refused without a trace.
    #[test]
    fn transfers_apply_once_and_refusals_change_nothing() {
        let mut sku = new_sku(10, &[1, 1], &StaticSplit);
        assert_eq!((sku.pool, sku.in_transit()), (0, 10));
        let grant = sku.pending_grants(0)[0].clone();
        let req = sync_req(1, vec![grant.id.clone()], vec![ret("r-1", 2)], 3);
        let none = HashSet::new();
        let (session, out) = sync_static(&mut sku, None, &req, &none, 7).unwrap();
        assert_eq!(sku.regions[0].leased, 3);
        assert_eq!(sku.pool, 2);
        assert_eq!(out.applied, vec![ret("r-1", 2)]);
        assert!(out.grants.iter().all(|g| g.id != grant.id));
        assert_eq!(sku.regions[0].reported_at_ms, Some(7));
        assert_eq!(sku.regions[0].reported_by, (1, 1));
        assert!(session.is_some());

        let applied: HashSet<String> = ["r-1".to_owned()].into();
        let after = sku.clone();
        let (again, _) = sync_static(&mut sku, session, &req, &applied, 8).unwrap();
        assert_eq!(sku, after, "a replayed sync moves nothing");
        assert_eq!(again, None, "an old request leaves the standing as it was");

        let mut older = sync_req(0, vec![], vec![], 9);
        older.skus[0].held = 1;
        sync_static(&mut sku, session, &older, &applied, 8).unwrap();
        assert_eq!(sku, after, "an older report never replaces a newer one");
        let delta = SyncRequest {
            skus: Vec::new(),
            ..sync_req(2, vec![], vec![], 0)
        };
        sync_static(&mut sku, session, &delta, &applied, 9).unwrap();
        assert_eq!(
            sku, after,
            "a request without this SKU's report keeps the last one"
        );
        assert!(!sku.sync_changes(0, &delta), "nothing to apply");
        assert!(
            !sku.sync_changes(0, &sync_req(3, vec![], vec![], 3)),
            "the same report"
        );
        assert!(
            sku.sync_changes(0, &sync_req(3, vec![], vec![], 2)),
            "a new report"
        );
        assert!(
            !sku.sync_changes(0, &sync_req(0, vec![], vec![], 2)),
            "an older report"
        );
        assert!(sku.sync_changes(0, &sync_req(3, vec![], vec![ret("r-9", 1)], 3)));
        let pending = sku.pending_grants(1)[0].id.clone();
        assert!(
            !sku.sync_changes(1, &delta),
            "a grant in transit, not acked"
        );
        let acked = sync_req(3, vec![pending], vec![], 3);
        assert!(sku.sync_changes(1, &acked), "an ack of a grant in transit");

        let too_much = sync_req(2, vec![], vec![ret("r-2", 4)], 1);
        assert!(matches!(
            sync_static(&mut sku, session, &too_much, &applied, 9),
            Err(AllocationError::Invalid(_))
        ));
        let mut old = sync_req(3, vec![], vec![], 0);
        old.epoch = 0;
        assert_eq!(
            sync_static(&mut sku, session, &old, &applied, 9).map(|_| ()),
            Err(AllocationError::StaleEpoch)
        );
        assert_eq!(sku, after);
        assert!(sku.set_total(7).is_err());
        sku.set_total(8).unwrap();
        assert_eq!((sku.total, sku.pool), (8, 0));
    }

    /// Goal: a take grants from the pool, a repeat gets the same grant, a
    /// paused SKU grants nothing, and exhausted is said only when nothing is
    /// free anywhere.
    #[test]
    fn takes_grant_from_the_pool_once() {
        let mut a = new_sku(3, &[1, 1], &CentralOnly);
        assert_eq!(a.mode, Mode::Central);
        let take = |a: &mut Allocation, region, id: &str, units, history| {
            let req = TakeRequest {
                id: id.into(),
                tenant: "t".into(),
                sku: "s".into(),
                units,
                prefetch: 0,
                received: 0,
                returned: 0,
            };
            a.take(region, &req, history, &CentralOnly, &mut ids())
        };
        let out = take(&mut a, 0, "t-1", 2, TakeHistory::Unused).unwrap();
        assert_eq!((out.granted, out.response.exhausted, a.pool), (2, false, 1));
        let again = take(&mut a, 0, "t-1", 2, TakeHistory::GrantedHere(2)).unwrap();
        let units = again.response.grant.map(|g| g.units);
        assert_eq!((again.granted, units), (0, Some(2)));
        assert!(take(&mut a, 0, "t-1", 2, TakeHistory::UsedElsewhere).is_err());
        a.paused = true;
        let paused = take(&mut a, 1, "t-2", 1, TakeHistory::Unused).unwrap();
        assert!(paused.response.paused && paused.response.grant.is_none());
        a.paused = false;
        let short = take(&mut a, 1, "t-3", 2, TakeHistory::Unused).unwrap();
        assert_eq!(short.granted, 1);
        let why = "2 units are still in transit to region 0";
        assert!(!short.response.exhausted, "{why}");
    }

    fn policy(i: u8) -> Box<dyn Policy> {
        match i % 5 {
            0 => Box::new(StaticSplit),
            1 => Box::new(RefillOnLowWater::default()),
            2 => Box::new(ProportionalShare::default()),
            3 => Box::new(TailMerge::default()),
            _ => Box::new(CentralOnly),
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A region syncs: acks the grants picked by `acks` (a bit mask over
        /// its pending grants), returns `returns` units under a new or the
        /// last id, reports `available`, with a new or a repeated seq.
        Sync {
            region: u8,
            acks: u8,
            returns: u8,
            repeat_return: bool,
            available: u8,
            rate: u8,
            new_seq: bool,
        },
        /// A region takes `units`, under a new or the last take id.
        Take {
            region: u8,
            units: u8,
            repeat: bool,
        },
        AddStock(u8),
        SetTotal(u16),
        Pause(bool),
        Retire(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..4u8, any::<u8>(), 0..8u8, any::<bool>(), 0..30u8, 0..50u8, any::<bool>()).prop_map(
                |(region, acks, returns, repeat_return, available, rate, new_seq)| Op::Sync {
                    region, acks, returns, repeat_return, available, rate, new_seq
                }
            ),
            3 => (0..4u8, 1..6u8, any::<bool>()).prop_map(|(region, units, repeat)| Op::Take { region, units, repeat }),
            1 => (0..20u8).prop_map(Op::AddStock),
            1 => (0..300u16).prop_map(Op::SetTotal),
            1 => any::<bool>().prop_map(Op::Pause),
            1 => (0..4u8).prop_map(Op::Retire),
        ]
    }

    proptest! {
        /// Goal: under any sequence of syncs (acks, returns, reports, repeats),
        /// takes (new and repeated) and admin changes, with any policy, the
        /// SKU's books stay balanced (asserted inside every move), units
        /// appear only by adding stock, a repeated transfer moves nothing, a
        /// refused input changes nothing, and exhausted is said only when
        /// nothing is free anywhere.
        #[test]
        fn random_sequences_keep_the_books(
            total in 0..200u64,
            weights in proptest::collection::vec(0..4u32, 1..5),
            which in any::<u8>(),
            ops in proptest::collection::vec(op(), 1..150),
        ) {
            let policy = policy(which);
            let mut next_id = ids();
            let (mut a, moves) = Allocation::create(
                Tenant::parse("t").unwrap(), Sku::parse("s").unwrap(), total,
                SkuSettings::default(), &weights, policy.as_ref(), &mut next_id,
            );
            prop_assert!(a.is_balanced());
            prop_assert_eq!(moves.granted_units(), a.in_transit());
            let regions = weights.len();
            let mut sessions: Vec<Option<AgentSession>> = vec![None; regions];
            let mut seqs = vec![0u64; regions];
            let mut applied: Vec<HashSet<String>> = vec![HashSet::new(); regions];
            let mut last_return: Vec<Option<TransferMsg>> = vec![None; regions];
            let mut takes: Vec<(usize, String, u64)> = Vec::new();
            let mut returns = 0u64;
            for op in ops {
                let before = a.clone();
                let sets_total = matches!(op, Op::AddStock(_) | Op::SetTotal(_));
                match op {
                    Op::Sync { region, acks, returns: units, repeat_return, available, rate, new_seq } => {
                        let r = usize::from(region) % regions;
                        let ack_ids: Vec<String> = a.regions[r].grants.keys().enumerate()
                            .filter(|(i, _)| acks & (1 << (i % 8)) != 0)
                            .map(|(_, id)| id.clone())
                            .collect();
                        let acked: u64 = ack_ids.iter().map(|id| a.regions[r].grants[id]).sum();
                        let mut rets = Vec::new();
                        if repeat_return {
                            rets.extend(last_return[r].clone());
                        } else if units > 0 {
                            returns += 1;
                            rets.push(ret(&format!("r-{returns}"), u64::from(units)));
                        }
                        if new_seq { seqs[r] += 1; }
                        let mut req = sync_req(seqs[r], ack_ids.clone(), rets.clone(), u64::from(available));
                        req.skus[0].sale_rate_per_s = f64::from(rate);
                        let new_units: u64 = rets.iter().filter(|t| !applied[r].contains(&t.id)).map(|t| t.units).sum();
                        let out = admit(sessions[r], &req)
                            .and_then(|admitted| Ok((admitted, a.sync(r, &req, &applied[r], 1_000, policy.as_ref(), &mut next_id)?)));
                        match out {
                            Ok((admitted, out)) => {
                                prop_assert!(new_units <= before.regions[r].leased + acked);
                                prop_assert_eq!(a.regions[r].returned, before.regions[r].returned + new_units);
                                prop_assert_eq!(out.applied.iter().map(|t| t.units).sum::<u64>(), new_units);
                                for id in &ack_ids {
                                    prop_assert!(!a.regions[r].grants.contains_key(id));
                                }
                                prop_assert_eq!(&out.grants, &a.pending_grants(r));
                                prop_assert_eq!(out.directive.sold_out, a.is_exhausted());
                                prop_assert!(a.regions[r].reported_by >= before.regions[r].reported_by);
                                if let Some(s) = admitted { sessions[r] = Some(s); }
                                for t in &rets { applied[r].insert(t.id.clone()); }
                                if let Some(t) = rets.last() { last_return[r] = Some(t.clone()); }
                            }
                            Err(_) => {
                                prop_assert!(new_units > before.regions[r].leased + acked);
                                prop_assert_eq!(&a, &before);
                            }
                        }
                    }
                    Op::Take { region, units, repeat } => {
                        let r = usize::from(region) % regions;
                        let (id, history) = match takes.last() {
                            Some((owner, id, granted)) if repeat => (
                                id.clone(),
                                if *owner == r { TakeHistory::GrantedHere(*granted) } else { TakeHistory::UsedElsewhere },
                            ),
                            _ => (format!("t-{}", takes.len()), TakeHistory::Unused),
                        };
                        let req = TakeRequest { id: id.clone(), tenant: "t".into(), sku: "s".into(), units: u64::from(units), prefetch: 0, received: 0, returned: 0 };
                        match a.take(r, &req, history, policy.as_ref(), &mut next_id) {
                            Ok(out) => {
                                prop_assert!(out.granted <= before.pool.min(u64::from(units)));
                                if out.response.exhausted {
                                    prop_assert_eq!(a.pool, 0);
                                    // Every other region has nothing; the asker speaks for itself.
                                    prop_assert!(before.regions.iter().enumerate().all(|(i, x)| i == r || (x.in_transit() == 0 && x.report.available == 0)));
                                }
                                if let TakeHistory::GrantedHere(units) = history {
                                    prop_assert_eq!(out.response.grant.map(|g| g.units), Some(units));
                                    prop_assert_eq!(&a, &before);
                                } else if out.granted > 0 {
                                    takes.push((r, id, out.granted));
                                }
                            }
                            Err(_) => {
                                prop_assert_eq!(history, TakeHistory::UsedElsewhere);
                                prop_assert_eq!(&a, &before);
                            }
                        }
                    }
                    Op::AddStock(n) => {
                        a.add_stock(u64::from(n));
                        prop_assert_eq!(a.total, before.total + u64::from(n));
                    }
                    Op::SetTotal(n) => match a.set_total(u64::from(n)) {
                        Ok(()) => prop_assert_eq!(a.total, u64::from(n)),
                        Err(_) => {
                            prop_assert!(before.total - u64::from(n) > before.pool);
                            prop_assert_eq!(&a, &before);
                        }
                    },
                    Op::Pause(paused) => a.paused = paused,
                    Op::Retire(region) => {
                        let mut w: Vec<u32> = a.regions.iter().map(|x| x.weight).collect();
                        w[usize::from(region) % regions] = 0;
                        a.set_weights(&w);
                        a.rebalance(policy.as_ref(), &mut next_id);
                    }
                }
                prop_assert!(a.is_balanced());
                prop_assert!(a.regions.iter().zip(&before.regions).all(|(x, y)| x.returned >= y.returned));
                if !sets_total {
                    prop_assert_eq!(a.total, before.total, "units appear only as added stock");
                }
            }
        }
    }
}
