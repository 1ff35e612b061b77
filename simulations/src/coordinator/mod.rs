//! The simulated coordinator: escrow-core's [`Allocation`] rules behind the
//! agent-coordinator protocol, with an in-memory store instead of
//! PostgreSQL.
//!
//! Every decision is the rules' (the same calls `coordinator/src/store/`
//! makes); this module keeps only what the coordinator's database keeps
//! beside the SKU's state: each region's agent session (epoch, seq), the
//! ids of returns applied and of takes granted (so repeats are recognised),
//! and the grant ids it hands out; plus the simulated time a request takes
//! to serve. State survives an outage: the outage only makes it unreachable.
//!
//! This file holds the SKU's quota and the watch answers; the relay of
//! borrowed places under a global per-user limit is in `limits.rs`.

mod limits;

use std::collections::{HashMap, HashSet};

use escrow_core::allocation::{
    self, AgentSession, Allocation, AllocationError, Moves, TakeHistory,
};
use escrow_core::protocol::{
    LimitsDown, SkuDirective, SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchResponse,
};
use escrow_core::{Mode, Policy, RegionName, Sku, SkuSettings, Tenant, TransferId, UserLimitScope};

use limits::Borrows;

/// The coordinator of one SKU.
#[derive(Debug)]
pub struct Coordinator {
    allocation: Allocation,
    /// When the SKU switched to central mode, µs of simulated time.
    pub central_since_us: Option<u64>,
    policy: Box<dyn Policy>,
    sessions: Vec<Option<AgentSession>>,
    /// Ids of returns applied, per region.
    pub applied_returns: Vec<HashSet<TransferId>>,
    /// Take ids that were granted units: the region and how many.
    take_grants: HashMap<TransferId, (usize, u64)>,
    grant_seq: u64,
    busy_until_us: u64,
    service_us: u64,
    /// Regions with news since the world last asked.
    noticed: Vec<usize>,
    /// Per region: its news includes the SKU's directive and grants (not
    /// only borrows and loans).
    sku_news: Vec<bool>,
    /// Per region: the borrows and loans its next watch answer carries.
    carry: Vec<LimitsDown>,
    /// The regions, in the scenario's order (a region's index is its place here).
    names: Vec<RegionName>,
    /// Under a global per-user limit, the regions sorted, as directives name them.
    limit_regions: Vec<RegionName>,
    /// Borrowed places relayed between regions.
    borrows: Borrows,
}

/// Identity and settings of the simulated SKU.
#[derive(Debug, Clone)]
pub struct SkuIdentity {
    /// Tenant name.
    pub tenant: Tenant,
    /// SKU name.
    pub sku: Sku,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold.
    pub hold_ttl_ms: u64,
    /// Whether a user's one reservation counts per region or across all.
    pub user_limit_scope: UserLimitScope,
    /// The regions it is sold in, in the scenario's order.
    pub regions: Vec<RegionName>,
}

fn next_grant_id(seq: &mut u64) -> TransferId {
    *seq += 1;
    TransferId::try_from(format!("g-{seq}")).expect("g- and a number is a valid id")
}

impl Coordinator {
    /// A new SKU of `total` units split by `policy` over regions of `weights`.
    ///
    /// Panics if the settings are not valid: the world has already checked
    /// them.
    pub fn new(
        total: u64,
        weights: Vec<u32>,
        policy: Box<dyn Policy>,
        service_us: u64,
        id: SkuIdentity,
    ) -> Self {
        let settings = SkuSettings::parse(
            Some(i64::from(id.max_per_user)),
            i64::try_from(id.hold_ttl_ms).ok(),
        )
        .expect("the world checked the SKU's settings")
        .with_scope(id.user_limit_scope);
        assert_eq!(weights.len(), id.regions.len(), "one weight per region");
        let limit_regions = match id.user_limit_scope {
            UserLimitScope::Region => Vec::new(),
            UserLimitScope::Global => {
                let mut sorted = id.regions.clone();
                sorted.sort();
                sorted
            }
        };
        let names = id.regions;
        let mut grant_seq = 0;
        let (allocation, _) = Allocation::create(
            id.tenant,
            id.sku,
            total,
            settings,
            &weights,
            policy.as_ref(),
            &mut || next_grant_id(&mut grant_seq),
        );
        let regions = weights.len();
        Self {
            central_since_us: (allocation.mode == Mode::Central).then_some(0),
            allocation,
            policy,
            sessions: vec![None; regions],
            applied_returns: vec![HashSet::new(); regions],
            take_grants: HashMap::new(),
            grant_seq,
            busy_until_us: 0,
            service_us,
            noticed: Vec::new(),
            sku_news: vec![false; regions],
            carry: vec![LimitsDown::default(); regions],
            names,
            limit_regions,
            borrows: Borrows::default(),
        }
    }

    /// The SKU's state: pool, grants in transit, leases, latest reports.
    pub fn allocation(&self) -> &Allocation {
        &self.allocation
    }

    /// The SKU's mode.
    pub fn mode(&self) -> Mode {
        self.allocation.mode
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// When an answer to a request arriving at `now_us` leaves: requests
    /// are served one at a time, each taking the service time.
    pub fn reply_at(&mut self, now_us: u64) -> u64 {
        let start = now_us.max(self.busy_until_us);
        self.busy_until_us = start + self.service_us;
        self.busy_until_us
    }

    /// The contract's audit from the coordinator's books and the latest
    /// reports: `pool + in_transit + sum(available + held + sold) - total`.
    pub fn drift(&self) -> i128 {
        self.allocation.drift()
    }

    fn merged_at(&mut self, merged: bool, now_us: u64) {
        if merged && self.central_since_us.is_none() {
            self.central_since_us = Some(now_us);
        }
    }

    /// Applies a sync through [`allocation::admit`] and
    /// [`Allocation::sync`]; a request from an older epoch is fenced
    /// (`None`: only the dead incarnation would read the error).
    pub fn on_sync(&mut self, now_us: u64, r: usize, req: &SyncRequest) -> Option<SyncResponse> {
        let admitted = match allocation::check_sync(req)
            .and_then(|()| allocation::admit(self.sessions[r], req))
        {
            Ok(admitted) => admitted,
            Err(AllocationError::StaleEpoch) => return None,
            Err(e) => panic!("the simulated agent sent a sync the rules refuse: {e}"),
        };
        let seq = &mut self.grant_seq;
        let synced = self
            .allocation
            .sync(
                r,
                req,
                &self.applied_returns[r],
                now_us / 1_000,
                self.policy.as_ref(),
                &mut || next_grant_id(seq),
            )
            .unwrap_or_else(|e| panic!("the simulated agent sent a sync the rules refuse: {e}"));
        if let Some(session) = admitted {
            self.sessions[r] = Some(session);
        }
        self.applied_returns[r].extend(synced.applied.into_iter().map(|t| t.id));
        self.merged_at(synced.moves.merged, now_us);
        self.news(&synced.moves);
        Some(SyncResponse {
            limits: self.relay_limits(r, &req.limits),
            grants: synced.grants,
            confirmed: req.acks.clone(),
            applied_returns: req.returns.iter().map(|t| t.id.clone()).collect(),
            skus: vec![self.with_regions(synced.directive)],
        })
    }

    /// A directive of the allocation's, naming the SKU's regions under a
    /// global per-user limit, as the real coordinator's does.
    fn with_regions(&self, mut d: SkuDirective) -> SkuDirective {
        d.limit_regions.clone_from(&self.limit_regions);
        d
    }

    /// A synchronous take through [`Allocation::take`], with the take ids
    /// this coordinator granted before as its history.
    pub fn on_take(&mut self, now_us: u64, r: usize, req: &TakeRequest) -> TakeResponse {
        let history = match self.take_grants.get(&req.id) {
            None => TakeHistory::Unused,
            Some(&(owner, units)) if owner == r => TakeHistory::GrantedHere(units),
            Some(_) => TakeHistory::UsedElsewhere,
        };
        let seq = &mut self.grant_seq;
        let taken = self
            .allocation
            .take(r, req, history, self.policy.as_ref(), &mut || {
                next_grant_id(seq)
            })
            .unwrap_or_else(|e| panic!("the simulated agent sent a take the rules refuse: {e}"));
        if taken.granted > 0 {
            self.take_grants.insert(req.id.clone(), (r, taken.granted));
        }
        self.merged_at(taken.moves.merged, now_us);
        self.news(&taken.moves);
        taken.response
    }

    fn news(&mut self, moves: &Moves) {
        let regions = self.allocation.regions.len();
        for r in moves.regions_to_notify(regions) {
            self.sku_news[r] = true;
            self.notice(r);
        }
    }

    /// Region `r`'s watch call is to be answered.
    fn notice(&mut self, r: usize) {
        if !self.noticed.contains(&r) {
            self.noticed.push(r);
        }
    }

    /// The answer to region `r`'s watch call when it has news: with news
    /// of the SKU, its directive and its grants pending to `r`, as the
    /// real coordinator answers (nothing for an incarnation that is not the
    /// region's current session, which the real one fences the same way);
    /// and the borrows and loans relayed to `r` since its last answer.
    pub fn watch_news(&mut self, r: usize, epoch: u32) -> WatchResponse {
        let current = self.sessions[r].is_some_and(|s| s.epoch == i64::from(epoch));
        let sku_news = std::mem::take(&mut self.sku_news[r]) && current;
        WatchResponse {
            limits: std::mem::take(&mut self.carry[r]),
            notice: 0,
            grants: if sku_news {
                self.allocation.pending_grants(r)
            } else {
                Vec::new()
            },
            skus: if sku_news {
                vec![self.with_regions(self.allocation.directive(r))]
            } else {
                Vec::new()
            },
        }
    }

    /// Regions told to sync at once since the last call (their watch calls answered).
    pub fn take_notices(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.noticed)
    }
}
