//! The simulated coordinator: escrow-core's [`PoolLedger`] and [`Policy`]
//! behind the agent-coordinator protocol.
//!
//! It follows `coordinator/src/store.rs` step for step and keeps what that
//! keeps in PostgreSQL: the pool ledger, each region's latest report and
//! (epoch, seq), cumulative returned units and pending recalls, the outbox of
//! grants not yet acknowledged, the ids of returns applied and of takes
//! granted (so a repeated take gets the same grant). Every sync applies acks,
//! returns and (if newer) the report, then rebalances with the policy plus
//! [`retired_recalls`]; the directive carries the cumulative `return_until`.
//! A take asks [`decide_take`] and, when units are free elsewhere, rebalances
//! so the policy asks for them back. State survives an outage: the outage
//! only makes it unreachable.

use std::collections::{BTreeMap, HashMap, HashSet};

use escrow_core::policy::{decide_take, is_exhausted, retired_recalls};
use escrow_core::protocol::{
    SkuDirective, SyncRequest, SyncResponse, TakeRequest, TakeResponse, TransferMsg,
};
use escrow_core::{Mode, Policy, PoolLedger, RegionState, SkuState};

/// What the coordinator knows of one region (its `sku_regions` and `regions` rows).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegionView {
    /// Available at the latest report.
    pub available: u64,
    /// Held at the latest report.
    pub held: u64,
    /// Sold at the latest report.
    pub sold: u64,
    /// Sale rate at the latest report.
    pub sale_rate_per_s: f64,
    /// Round trip the agent measured.
    pub rtt_ms: u64,
    /// (epoch, seq) of the latest report; older reports are not applied, older epochs are fenced.
    pub last_report: Option<(i64, u64)>,
    /// Units this region returned, cumulative.
    pub returned: u64,
    /// Units asked back and not yet returned.
    pub recall_pending: u64,
}

/// Counters of the coordinator's work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    /// Fresh reports that ran the policy.
    pub plans: u64,
    /// Units granted by plans.
    pub planned_grant_units: u64,
    /// Units granted by takes.
    pub take_grant_units: u64,
    /// Units recalled by plans.
    pub recalled_units: u64,
}

/// The coordinator of one SKU.
#[derive(Debug)]
pub struct Coordinator {
    /// Pool, in transit and leases.
    pub ledger: PoolLedger,
    /// Escrow or central.
    pub mode: Mode,
    /// When the SKU switched to central mode, µs of simulated time.
    pub central_since_us: Option<u64>,
    policy: Box<dyn Policy>,
    weights: Vec<u32>,
    /// Latest report per region.
    pub views: Vec<RegionView>,
    /// Grants per region not yet acknowledged, by id.
    pub outbox: Vec<BTreeMap<String, u64>>,
    /// Ids of returns applied, per region.
    pub applied_returns: Vec<HashSet<String>>,
    /// Take ids that were granted units, and how many.
    take_grants: HashMap<String, u64>,
    grant_seq: u64,
    busy_until_us: u64,
    service_us: u64,
    tenant: String,
    sku: String,
    max_per_user: u32,
    hold_ttl_ms: u64,
    /// Work done.
    pub stats: CoordinatorStats,
}

/// Identity and settings of the simulated SKU.
#[derive(Debug, Clone)]
pub struct SkuIdentity {
    /// Tenant name.
    pub tenant: String,
    /// SKU name.
    pub sku: String,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold.
    pub hold_ttl_ms: u64,
}

impl Coordinator {
    /// A new SKU of `total` units split by `policy` over regions of `weights`.
    pub fn new(
        total: u64,
        weights: Vec<u32>,
        policy: Box<dyn Policy>,
        service_us: u64,
        id: SkuIdentity,
    ) -> Self {
        let regions = weights.len();
        let mut c = Self {
            ledger: PoolLedger::new(total, regions),
            mode: if policy.starts_central() {
                Mode::Central
            } else {
                Mode::Escrow
            },
            central_since_us: None,
            policy,
            weights,
            views: vec![RegionView::default(); regions],
            outbox: vec![BTreeMap::new(); regions],
            applied_returns: vec![HashSet::new(); regions],
            take_grants: HashMap::new(),
            grant_seq: 0,
            busy_until_us: 0,
            service_us,
            tenant: id.tenant,
            sku: id.sku,
            max_per_user: id.max_per_user,
            hold_ttl_ms: id.hold_ttl_ms,
            stats: CoordinatorStats::default(),
        };
        if c.mode == Mode::Central {
            c.central_since_us = Some(0);
        }
        let split = c.policy.initial_split(total, &c.weights);
        assert!(
            split.iter().sum::<u64>() <= total,
            "initial split exceeds total"
        );
        for (r, units) in split.into_iter().enumerate() {
            c.grant(r, units);
        }
        c
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    fn grant(&mut self, r: usize, units: u64) {
        if units == 0 {
            return;
        }
        self.ledger
            .grant(r, units)
            .expect("policies never grant more than the pool holds");
        self.grant_seq += 1;
        self.outbox[r].insert(format!("g-{}", self.grant_seq), units);
    }

    /// The SKU as the policy sees it.
    pub fn sku_state(&self) -> SkuState {
        SkuState {
            total: self.ledger.total,
            pool: self.ledger.pool,
            mode: self.mode,
            regions: self
                .views
                .iter()
                .enumerate()
                .map(|(i, v)| RegionState {
                    weight: self.weights[i],
                    leased: self.ledger.regions[i].leased,
                    in_transit: self.ledger.regions[i].in_transit,
                    available: v.available,
                    sale_rate_per_s: v.sale_rate_per_s,
                    rtt_ms: v.rtt_ms,
                    recall_pending: v.recall_pending,
                })
                .collect(),
        }
    }

    /// When an answer to a request arriving at `now_us` leaves: requests
    /// are served one at a time, each taking the service time.
    pub fn reply_at(&mut self, now_us: u64) -> u64 {
        let start = now_us.max(self.busy_until_us);
        self.busy_until_us = start + self.service_us;
        self.busy_until_us
    }

    /// The contract's audit from the coordinator's ledger and the latest
    /// reports: `pool + in_transit + sum(available + held + sold) - total`.
    pub fn drift(&self) -> i128 {
        let reported: u64 = self
            .views
            .iter()
            .map(|v| v.available + v.held + v.sold)
            .sum();
        i128::from(self.ledger.pool) + i128::from(self.ledger.in_transit()) + i128::from(reported)
            - i128::from(self.ledger.total)
    }

    /// Applies a sync as `store.rs` does: a request from an older epoch is
    /// fenced (`None`); acks move grants to leased; each new return goes back
    /// to the pool and settles recalls; a newer report replaces the last one;
    /// then the SKU is rebalanced and the directive says how far to give back.
    pub fn on_sync(&mut self, now_us: u64, r: usize, req: &SyncRequest) -> Option<SyncResponse> {
        let last = self.views[r].last_report;
        if last.is_some_and(|(epoch, _)| req.epoch < epoch) {
            return None;
        }
        let fresh = last.is_none_or(|l| (req.epoch, req.seq) > l);
        let mut confirmed = Vec::with_capacity(req.acks.len());
        for id in &req.acks {
            if let Some(units) = self.outbox[r].remove(id) {
                self.ledger
                    .deliver(r, units)
                    .expect("a grant in the outbox is in transit");
            }
            confirmed.push(id.clone());
        }
        let mut applied = Vec::with_capacity(req.returns.len());
        for t in &req.returns {
            if self.applied_returns[r].insert(t.id.clone()) {
                self.ledger
                    .take_back(r, t.units)
                    .expect("a return comes out of units the region leased");
                let v = &mut self.views[r];
                v.returned += t.units;
                v.recall_pending = v.recall_pending.saturating_sub(t.units);
            }
            applied.push(t.id.clone());
        }
        if fresh {
            let v = &mut self.views[r];
            if let Some(rep) = req.skus.first() {
                v.available = rep.available;
                v.held = rep.held;
                v.sold = rep.sold;
                v.sale_rate_per_s = rep.sale_rate_per_s;
                v.recall_pending = v.recall_pending.min(rep.available);
            }
            v.rtt_ms = req.rtt_ms.min(60_000);
            v.last_report = Some((req.epoch, req.seq));
        }
        let state = self.rebalance(now_us);
        let v = &self.views[r];
        Some(SyncResponse {
            grants: self.outbox[r]
                .iter()
                .map(|(id, units)| self.transfer(id, *units))
                .collect(),
            confirmed,
            applied_returns: applied,
            skus: vec![SkuDirective {
                tenant: self.tenant.clone(),
                sku: self.sku.clone(),
                mode: self.mode,
                paused: false,
                max_per_user: self.max_per_user,
                hold_ttl_ms: self.hold_ttl_ms,
                return_until: v.returned + v.recall_pending,
                sold_out: is_exhausted(&state),
            }],
        })
    }

    /// Runs the policy and carries out its plan; returns the state after it.
    fn rebalance(&mut self, now_us: u64) -> SkuState {
        let state = self.sku_state();
        let mut plan = self.policy.plan(&state);
        plan.recalls.extend(retired_recalls(&state));
        self.stats.plans += 1;
        for &(i, units) in &plan.grants {
            self.grant(i, units);
            self.stats.planned_grant_units += units;
        }
        for &(i, units) in &plan.recalls {
            self.views[i].recall_pending += units;
            self.stats.recalled_units += units;
        }
        if plan.central && self.mode != Mode::Central {
            self.mode = Mode::Central;
            self.central_since_us = Some(now_us);
        }
        self.sku_state()
    }

    fn transfer(&self, id: &str, units: u64) -> TransferMsg {
        TransferMsg {
            id: id.to_owned(),
            tenant: self.tenant.clone(),
            sku: self.sku.clone(),
            units,
        }
    }

    /// A synchronous take as `store.rs` decides it: a repeated id gets its
    /// grant again; otherwise [`decide_take`] grants from the pool, and if
    /// units are free elsewhere the SKU is rebalanced so they are asked back.
    pub fn on_take(&mut self, now_us: u64, r: usize, req: &TakeRequest) -> TakeResponse {
        if let Some(&units) = self.take_grants.get(&req.id) {
            return TakeResponse {
                grant: Some(self.transfer(&req.id, units)),
                exhausted: false,
                paused: false,
            };
        }
        let decision = decide_take(&self.sku_state(), r, req.units);
        let grant = (decision.granted > 0).then(|| {
            self.ledger
                .grant(r, decision.granted)
                .expect("decide_take grants at most the pool");
            self.outbox[r].insert(req.id.clone(), decision.granted);
            self.take_grants.insert(req.id.clone(), decision.granted);
            self.stats.take_grant_units += decision.granted;
            self.transfer(&req.id, decision.granted)
        });
        if !decision.exhausted && decision.granted < req.units {
            self.rebalance(now_us);
        }
        TakeResponse {
            grant,
            exhausted: decision.exhausted,
            paused: false,
        }
    }
}
