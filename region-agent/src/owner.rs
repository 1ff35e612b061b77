//! The single writer of one SKU: decides in memory, commits in batches.
//!
//! Each (tenant, sku) has one owner task holding the region's [`Ledger`] for
//! it. Requests arrive on a bounded queue; the owner drains up to
//! `batch_size_max` of them, decides with escrow-core, commits the whole batch
//! in one transaction whose SQL re-checks every condition, and only then
//! answers. While one batch commits the next one queues, so a busy SKU gets
//! large batches and one log flush serves many buyers (group commit).
//!
//! Decisions never run in a request's future: a client that disconnects
//! drops only its reply channel, never a half-done transaction.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use escrow_core::policy::units_to_return;
use escrow_core::protocol::{SkuDirective, TakeRequest, TransferMsg};
use escrow_core::{
    plan_reserves, Deadline, Ledger, Mode, Qty, RateMeter, Refusal, RegionName, RequestKey,
    Reservation, Sku, SkuSettings, Status, Tenant, TtlMs, UserId,
};
use tokio::sync::{mpsc, oneshot};

use crate::clock::Clock;
use crate::coordinator_client::{ClientError, CoordinatorLink};
use crate::fence::Fence;
use crate::keys::KnownKeys;
use crate::store::{Batch, BatchOutcome, NewHold, SkuRecord, StockChange, Store, StoreError};

/// How often an owner with holds looks for expired ones.
pub const SWEEP_INTERVAL_MS: u64 = 250;

/// Bounds on one owner's work.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most requests decided and committed in one transaction.
    pub batch_size_max: usize,
    /// Most requests waiting in one owner's queue.
    pub queue_max: usize,
    /// Longest a request may wait in the queue before it is refused unserved.
    pub wait_timeout_ms: u64,
}

/// A buyer's request for new units.
#[derive(Debug)]
pub struct ReserveRequest {
    /// The buyer's key.
    pub request_key: RequestKey,
    /// The buyer.
    pub user_id: UserId,
    /// Units asked for.
    pub qty: Qty,
    /// Hold duration asked for, else the SKU's.
    pub ttl: Option<TtlMs>,
}

/// The answer to a [`ReserveRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReserveReply {
    /// A new hold.
    Held(Reservation),
    /// The key's existing reservation.
    Replay(Reservation),
    /// Nothing available; nothing written.
    SoldOut,
    /// The user already has an active reservation; nothing written.
    UserLimit,
    /// The key was used for another user, SKU or quantity.
    KeyReused,
    /// The SKU cannot sell now.
    Paused,
    /// Waited in the queue too long; nothing written.
    WaitTimeout,
}

/// A buyer action on an existing reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// HELD -> SOLD.
    Confirm,
    /// HELD -> RELEASED.
    Release,
    /// Later expiry, once.
    Extend(Option<TtlMs>),
}

/// The answer to an [`Action`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActReply {
    /// Done (or already done); the reservation now.
    Accepted(Reservation),
    /// Not possible in the reservation's state; the reservation now.
    Refused(Reservation),
    /// No such reservation.
    NotFound,
    /// The SKU cannot be written now.
    Paused,
    /// Waited in the queue too long; nothing written.
    WaitTimeout,
}

/// An admin change routed through the owner so the counters keep one writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminChange {
    /// Set the SKU's total and settings together (standalone), all or nothing.
    Configure {
        /// The new total.
        total: u64,
        /// The new settings.
        settings: SkuSettings,
    },
    /// Add units.
    AddStock(u64),
    /// Stop or resume selling.
    Pause(bool),
}

/// The answer to an [`AdminChange`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminReply {
    /// Applied.
    Done,
    /// The new total is below what is held or sold.
    BelowCommitted {
        /// Units held or sold, the lowest total allowed.
        committed: u64,
    },
    /// The SKU cannot be written now.
    Paused,
}

/// What an owner's queue carries.
#[derive(Debug)]
pub enum Command {
    /// A buyer wants units.
    Reserve(ReserveRequest, Deadline, oneshot::Sender<ReserveReply>),
    /// A buyer acts on a reservation.
    Act(RequestKey, Action, Deadline, oneshot::Sender<ActReply>),
    /// An admin changes the SKU.
    Admin(AdminChange, oneshot::Sender<AdminReply>),
    /// The coordinator's directive and grants for this SKU, from a sync.
    Sync(SkuDirective, Vec<TransferMsg>),
}

/// What request handlers may read of a SKU without asking its owner.
#[derive(Debug)]
pub struct SkuView {
    /// The SKU's tenant.
    pub tenant: Tenant,
    /// The SKU.
    pub sku: Sku,
    available: AtomicU64,
    held: AtomicU64,
    sold: AtomicU64,
    quota: AtomicU64,
    paused: AtomicBool,
    halted: AtomicBool,
    max_per_user: AtomicU32,
    hold_ttl_ms: AtomicU64,
    central: AtomicBool,
    sold_out_everywhere: AtomicBool,
    rate_bits: AtomicU64,
}

/// A point-in-time copy of a [`SkuView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SkuSnapshot {
    /// Units that may be held now.
    pub available: u64,
    /// Units held.
    pub held: u64,
    /// Units sold.
    pub sold: u64,
    /// The region's quota (standalone: the total).
    pub total: u64,
    /// Paused by an admin.
    pub paused: bool,
    /// Stopped by the agent itself: drift, fencing or a failed commit.
    pub halted: bool,
    /// Units per reservation at most.
    pub max_per_user: u32,
    /// Default hold duration.
    pub hold_ttl_ms: u64,
}

impl SkuView {
    fn new(tenant: Tenant, sku: Sku) -> Self {
        Self {
            tenant,
            sku,
            available: AtomicU64::new(0),
            held: AtomicU64::new(0),
            sold: AtomicU64::new(0),
            quota: AtomicU64::new(0),
            paused: AtomicBool::new(true),
            halted: AtomicBool::new(true),
            max_per_user: AtomicU32::new(1),
            hold_ttl_ms: AtomicU64::new(0),
            central: AtomicBool::new(false),
            sold_out_everywhere: AtomicBool::new(false),
            rate_bits: AtomicU64::new(0),
        }
    }

    /// Whether the SKU sells in central mode (tail merged).
    pub fn is_central(&self) -> bool {
        self.central.load(Ordering::Acquire)
    }

    /// Whether the coordinator said no unit is free anywhere.
    pub fn is_sold_out_everywhere(&self) -> bool {
        self.sold_out_everywhere.load(Ordering::Acquire)
    }

    /// Units held per second, recently.
    pub fn sale_rate_per_s(&self) -> f64 {
        f64::from_bits(self.rate_bits.load(Ordering::Acquire))
    }

    /// Units available now, as of the last commit.
    pub fn available(&self) -> u64 {
        self.available.load(Ordering::Acquire)
    }

    /// Whether the SKU refuses to sell (admin pause, drift, fencing, failed commit).
    pub fn is_stopped(&self) -> bool {
        self.paused.load(Ordering::Acquire) || self.halted.load(Ordering::Acquire)
    }

    /// The SKU's current settings.
    pub fn settings(&self) -> SkuSettings {
        SkuSettings {
            max_per_user: self.max_per_user.load(Ordering::Acquire),
            hold_ttl: TtlMs::parse(self.hold_ttl_ms.load(Ordering::Acquire) as i64)
                .unwrap_or(SkuSettings::default().hold_ttl),
        }
    }

    /// A copy of every field.
    pub fn snapshot(&self) -> SkuSnapshot {
        SkuSnapshot {
            available: self.available(),
            held: self.held.load(Ordering::Acquire),
            sold: self.sold.load(Ordering::Acquire),
            total: self.quota.load(Ordering::Acquire),
            paused: self.paused.load(Ordering::Acquire),
            halted: self.halted.load(Ordering::Acquire),
            max_per_user: self.max_per_user.load(Ordering::Acquire),
            hold_ttl_ms: self.hold_ttl_ms.load(Ordering::Acquire),
        }
    }
}

/// The queue into an owner and its view.
#[derive(Debug, Clone)]
pub struct OwnerHandle {
    /// The owner's published state.
    pub view: Arc<SkuView>,
    /// The owner's bounded queue.
    pub queue: mpsc::Sender<Command>,
}

/// Shared services every owner uses.
#[derive(Clone)]
pub struct OwnerDeps {
    /// Persistence.
    pub store: Arc<dyn Store>,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// The region's fencing state.
    pub fence: Arc<Fence>,
    /// Request keys with a committed reservation.
    pub keys: Arc<KnownKeys>,
    /// Queue and batch bounds.
    pub limits: Limits,
    /// The region served (names return transfers).
    pub region: RegionName,
    /// The coordinator, if this agent has one; `None` is standalone.
    pub link: Option<Arc<CoordinatorLink>>,
}

/// How a synchronous take from the coordinator ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    /// No unit is free anywhere: the rest is sold out.
    Exhausted,
    /// Units may exist elsewhere, or the coordinator could not be asked: pause.
    Unsure,
}

/// One reserve request taken from the queue, with its reply channel.
struct PendingReserve {
    request: ReserveRequest,
    deadline: Deadline,
    reply: oneshot::Sender<ReserveReply>,
}

/// One action taken from the queue, with its reply channel.
struct PendingAct {
    key: RequestKey,
    action: Action,
    reply: oneshot::Sender<ActReply>,
}

/// The owner task's state.
struct Owner {
    deps: OwnerDeps,
    view: Arc<SkuView>,
    queue: mpsc::Receiver<Command>,
    ledger: Ledger,
    settings: SkuSettings,
    paused: bool,
    /// Counters disagree with rows: never sell until an operator looks.
    drifted: bool,
    /// A commit failed with an unknown outcome: reload before deciding again.
    needs_reload: bool,
    overflow: VecDeque<PendingReserve>,
    next_sweep_ms: u64,
    mode: Mode,
    /// Cumulative returned units the coordinator asked for; `None` until told.
    return_until: Option<u64>,
    /// Grants from syncs, credited with the next batch.
    pending_grants: Vec<TransferMsg>,
    /// Directive changes to persist with the next batch.
    pending_changes: Vec<StockChange>,
    rate: RateMeter,
    /// Since when this region has had free units (central mode keeps them
    /// for its own buyers for a while).
    free_since_ms: Option<u64>,
}

/// Starts the owner of a loaded SKU and returns its handle.
pub fn spawn(deps: OwnerDeps, record: SkuRecord) -> (OwnerHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(deps.limits.queue_max);
    let view = Arc::new(SkuView::new(record.tenant.clone(), record.sku.clone()));
    let now_ms = deps.clock.now_ms();
    let mut owner = Owner {
        mode: record.mode,
        return_until: None,
        pending_grants: Vec::new(),
        pending_changes: Vec::new(),
        rate: RateMeter::new(now_ms, 2_000),
        free_since_ms: None,
        deps,
        view: view.clone(),
        queue: rx,
        ledger: Ledger::default(),
        settings: record.settings,
        paused: record.paused,
        drifted: false,
        needs_reload: false,
        overflow: VecDeque::new(),
        next_sweep_ms: 0,
    };
    owner.adopt(record);
    owner.publish();
    let task = tokio::spawn(owner.run());
    (OwnerHandle { view, queue: tx }, task)
}

impl Owner {
    fn labels(&self) -> [(&'static str, String); 2] {
        [
            ("tenant", self.view.tenant.to_string()),
            ("sku", self.view.sku.to_string()),
        ]
    }

    /// Takes stored state as the truth, refusing to sell on drift.
    fn adopt(&mut self, record: SkuRecord) {
        self.ledger = record.ledger;
        self.settings = record.settings;
        self.paused = record.paused;
        self.mode = record.mode;
        self.drifted = !record.rows_agree();
        let drift = (record.rows_held as i64 - record.ledger.held as i64).abs()
            + (record.rows_sold as i64 - record.ledger.sold as i64).abs();
        metrics::gauge!("escrow_drift_units", &self.labels()).set(drift as f64);
        if self.drifted {
            tracing::error!(
                tenant = %record.tenant, sku = %record.sku, ledger = ?record.ledger,
                rows_held = record.rows_held, rows_sold = record.rows_sold,
                "DRIFT: counters disagree with reservation rows; SKU stopped until repaired"
            );
        }
    }

    fn publish(&self) {
        let v = &self.view;
        v.available.store(self.ledger.available, Ordering::Release);
        v.held.store(self.ledger.held, Ordering::Release);
        v.sold.store(self.ledger.sold, Ordering::Release);
        v.quota.store(self.ledger.quota(), Ordering::Release);
        v.max_per_user
            .store(self.settings.max_per_user, Ordering::Release);
        v.hold_ttl_ms
            .store(self.settings.hold_ttl.get(), Ordering::Release);
        v.paused.store(self.paused, Ordering::Release);
        let halted = self.drifted || self.needs_reload || self.deps.fence.is_fenced();
        v.halted.store(halted, Ordering::Release);
        v.central
            .store(self.mode == Mode::Central, Ordering::Release);
        metrics::gauge!("escrow_available_units", &self.labels()).set(self.ledger.available as f64);
        metrics::gauge!("escrow_queue_depth", &self.labels()).set(self.queue.len() as f64);
    }

    async fn run(mut self) {
        let batch_max = self.deps.limits.batch_size_max;
        loop {
            let mut commands = Vec::with_capacity(batch_max);
            if self.overflow.is_empty() {
                tokio::select! {
                    command = self.queue.recv() => match command {
                        Some(command) => commands.push(command),
                        None => break,
                    },
                    () = tokio::time::sleep(Duration::from_millis(SWEEP_INTERVAL_MS)) => {}
                }
            }
            while commands.len() + self.overflow.len() < batch_max {
                match self.queue.try_recv() {
                    Ok(command) => commands.push(command),
                    Err(_) => break,
                }
            }
            self.step(commands).await;
            self.publish();
        }
        // The queue is closed and drained: every accepted request was answered.
        for pending in self.overflow.drain(..) {
            let _ = pending.reply.send(ReserveReply::Paused);
        }
    }

    async fn step(&mut self, commands: Vec<Command>) {
        let now_ms = self.deps.clock.now_ms();
        let mut reserves: Vec<PendingReserve> = self.overflow.drain(..).collect();
        let mut acts = Vec::new();
        let mut admins = Vec::new();
        for command in commands {
            match command {
                Command::Reserve(request, deadline, reply) => reserves.push(PendingReserve {
                    request,
                    deadline,
                    reply,
                }),
                Command::Act(key, action, deadline, reply) => {
                    if deadline.passed(now_ms) {
                        let _ = reply.send(ActReply::WaitTimeout);
                        metrics::counter!("escrow_actions_total", "outcome" => "REJECTED_WAIT_TIMEOUT").increment(1);
                    } else {
                        acts.push(PendingAct { key, action, reply });
                    }
                }
                Command::Admin(change, reply) => admins.push((change, reply)),
                Command::Sync(directive, grants) => self.follow(directive, grants),
            }
        }
        reserves.retain_mut(|p| {
            if p.deadline.passed(now_ms) {
                let reply = std::mem::replace(&mut p.reply, oneshot::channel().0);
                answer(reply, ReserveReply::WaitTimeout);
                false
            } else {
                true
            }
        });

        if !self.ready_to_write().await {
            for p in reserves {
                answer(p.reply, ReserveReply::Paused);
            }
            for a in acts {
                let _ = a.reply.send(ActReply::Paused);
            }
            for (_, reply) in admins {
                let _ = reply.send(AdminReply::Paused);
            }
            return;
        }
        for (change, reply) in admins {
            let result = self.admin(change, now_ms).await;
            // The reply shows the state after the change.
            self.publish();
            let _ = reply.send(result);
        }
        self.serve(reserves, acts, now_ms).await;
    }

    /// Takes in a coordinator directive: settings, pause, mode, how much to
    /// give back, whether the SKU is sold out everywhere; grants wait for
    /// the next batch.
    fn follow(&mut self, d: SkuDirective, grants: Vec<TransferMsg>) {
        if d.paused != self.paused {
            self.paused = d.paused;
            self.pending_changes.push(StockChange::Pause(d.paused));
        }
        if d.mode != self.mode {
            tracing::info!(tenant = %self.view.tenant, sku = %self.view.sku, mode = d.mode.as_str(), "mode changed");
            self.mode = d.mode;
            self.pending_changes.push(StockChange::Mode(d.mode));
        }
        if let Ok(hold_ttl) = TtlMs::parse(d.hold_ttl_ms as i64) {
            let settings = SkuSettings {
                max_per_user: d.max_per_user.clamp(1, escrow_core::ids::MAX_PER_USER_MAX),
                hold_ttl,
            };
            if settings != self.settings {
                self.settings = settings;
                self.pending_changes.push(StockChange::Settings(settings));
            }
        }
        self.return_until = Some(d.return_until);
        self.view
            .sold_out_everywhere
            .store(d.sold_out, Ordering::Release);
        for grant in grants {
            if !self.pending_grants.iter().any(|g| g.id == grant.id) {
                self.pending_grants.push(grant);
            }
        }
    }

    /// Asks the coordinator for `units` now; adds any grant to the batch.
    async fn take(&self, batch: &mut Batch, units: u64) -> (u64, Take) {
        let Some(link) = &self.deps.link else {
            return (0, Take::Exhausted);
        };
        if self.view.is_sold_out_everywhere() {
            return (0, Take::Exhausted);
        }
        let req = TakeRequest {
            id: format!("t-{}-{}", self.deps.region, uuid::Uuid::new_v4()),
            tenant: self.view.tenant.to_string(),
            sku: self.view.sku.to_string(),
            units,
        };
        match link.client.take(&req).await {
            Ok(resp) => {
                link.set_down(false);
                let granted = resp.grant.as_ref().map_or(0, |g| g.units);
                if let Some(grant) = resp.grant {
                    batch.grants.push(grant);
                }
                if resp.exhausted {
                    self.view.sold_out_everywhere.store(true, Ordering::Release);
                    (granted, Take::Exhausted)
                } else {
                    (granted, Take::Unsure)
                }
            }
            Err(error) => {
                tracing::warn!(%error, "take failed; answering PAUSED");
                if matches!(error, ClientError::Unreachable(_)) {
                    link.set_down(true);
                }
                (0, Take::Unsure)
            }
        }
    }

    /// Whether this owner may write now; reloads after a failed commit.
    async fn ready_to_write(&mut self) -> bool {
        if self.deps.fence.is_fenced() || self.drifted {
            return false;
        }
        if self.needs_reload {
            let store = &self.deps.store;
            let loaded = store.load_sku(&self.view.tenant, &self.view.sku).await;
            let keys = store.keys_of(&self.view.tenant, &self.view.sku).await;
            match (loaded, keys) {
                (Ok(Some(record)), Ok(keys)) => {
                    self.deps.keys.extend(&self.view.tenant, keys);
                    self.needs_reload = false;
                    self.adopt(record);
                    tracing::info!(tenant = %self.view.tenant, sku = %self.view.sku, "reloaded after a failed commit");
                }
                (Ok(None), _) => {
                    tracing::error!(tenant = %self.view.tenant, sku = %self.view.sku, "SKU vanished from the database");
                    return false;
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "reload failed; SKU stays paused");
                    return false;
                }
            }
        }
        !self.drifted
    }

    async fn admin(&mut self, change: AdminChange, now_ms: u64) -> AdminReply {
        let mut changes = Vec::with_capacity(2);
        match change {
            AdminChange::Configure { total, settings } => {
                let quota = self.ledger.quota();
                if total >= quota {
                    changes.push(StockChange::Receive(total - quota));
                } else if quota - total <= self.ledger.available {
                    changes.push(StockChange::GiveBack(quota - total));
                } else {
                    return AdminReply::BelowCommitted {
                        committed: self.ledger.held + self.ledger.sold,
                    };
                }
                if settings != self.settings {
                    changes.push(StockChange::Settings(settings));
                }
            }
            AdminChange::AddStock(units) => changes.push(StockChange::Receive(units)),
            AdminChange::Pause(paused) => changes.push(StockChange::Pause(paused)),
        }
        changes.retain(|c| !matches!(c, StockChange::Receive(0) | StockChange::GiveBack(0)));
        if changes.is_empty() {
            return AdminReply::Done;
        }
        let mut batch = Batch::new(self.view.tenant.clone(), self.view.sku.clone(), now_ms);
        batch.changes = changes;
        if self.commit(&batch).await.is_none() {
            return AdminReply::Paused;
        }
        for stock_change in batch.changes {
            let applied = match stock_change {
                StockChange::Receive(units) => {
                    self.ledger.receive(units);
                    Ok(())
                }
                StockChange::GiveBack(units) => self.ledger.give_back(units),
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
        AdminReply::Done
    }

    /// Commits a batch, timing it; on failure stops the SKU until reloaded.
    async fn commit(&mut self, batch: &Batch) -> Option<BatchOutcome> {
        let started = Instant::now();
        let result = self.deps.store.commit(self.deps.fence.epoch(), batch).await;
        metrics::histogram!("escrow_commit_seconds").record(started.elapsed().as_secs_f64());
        match result {
            Ok(outcome) => Some(outcome),
            Err(StoreError::Fenced) => {
                self.deps.fence.set_fenced();
                None
            }
            Err(error) => {
                tracing::error!(tenant = %self.view.tenant, sku = %self.view.sku, %error,
                    "commit failed; SKU paused until its state is reloaded");
                self.needs_reload = true;
                None
            }
        }
    }

    /// Records an internal ledger move that must succeed; a failure means
    /// memory and database disagree, so the SKU stops selling.
    fn check(&mut self, moved: Result<(), escrow_core::LedgerError>) {
        if let Err(error) = moved {
            tracing::error!(tenant = %self.view.tenant, sku = %self.view.sku, %error,
                "ledger refused a committed move; SKU stopped");
            self.drifted = true;
        }
    }

    async fn serve(&mut self, reserves: Vec<PendingReserve>, acts: Vec<PendingAct>, now_ms: u64) {
        let mut batch = Batch::new(self.view.tenant.clone(), self.view.sku.clone(), now_ms);

        // Reserve: the first request per key tries to hold; a known key is
        // answered from its committed row; a second copy of a key in this
        // batch waits for the next one, when the first copy's fate is known.
        let mut seen = HashSet::new();
        let mut fresh = Vec::new();
        let mut lookups = Vec::new();
        let mut later = Vec::new();
        for p in reserves {
            if self.paused {
                answer(p.reply, ReserveReply::Paused);
            } else if self
                .deps
                .keys
                .contains(&self.view.tenant, &p.request.request_key)
            {
                lookups.push(p);
            } else if seen.insert(p.request.request_key.clone()) {
                fresh.push(p);
            } else {
                later.push(p);
            }
        }
        let quantities: Vec<u64> = fresh.iter().map(|p| p.request.qty.units()).collect();
        let mut plan = plan_reserves(self.ledger.available, &quantities);
        let mut granted = 0;
        let mut take = Take::Exhausted;
        if !plan.overflow.is_empty() {
            let need = plan.overflow.iter().map(|&i| quantities[i]).sum();
            (granted, take) = self.take(&mut batch, need).await;
            if granted > 0 {
                plan = plan_reserves(self.ledger.available + granted, &quantities);
            }
        }
        let mut slots: Vec<Option<PendingReserve>> = fresh.into_iter().map(Some).collect();
        let mut holding = Vec::with_capacity(plan.try_hold.len());
        for &index in &plan.try_hold {
            let Some(p) = slots[index].take() else {
                continue;
            };
            let ttl = p.request.ttl.unwrap_or(self.settings.hold_ttl);
            batch.holds.push(NewHold {
                request_key: p.request.request_key.clone(),
                user_id: p.request.user_id.clone(),
                qty: p.request.qty,
                expires_at_ms: now_ms + ttl.get(),
            });
            holding.push(p);
        }
        let mut overflow: Vec<PendingReserve> = plan
            .overflow
            .iter()
            .filter_map(|&i| slots[i].take())
            .collect();

        // Actions: decide on the committed rows with escrow-core.
        let Some(mut act_rows) = self.rows_for(&acts).await else {
            // Unknown is not "not found": refuse, nothing was written.
            for a in acts {
                let _ = a.reply.send(ActReply::Paused);
            }
            return self.finish_reserves_unserved(holding, overflow, lookups, later);
        };
        let mut act_results = Vec::with_capacity(acts.len());
        for a in &acts {
            let Some(row) = act_rows.get_mut(&a.key) else {
                act_results.push(None);
                continue;
            };
            let verdict = match a.action {
                Action::Confirm => row.confirm(now_ms),
                Action::Release => row.release(now_ms),
                Action::Extend(ttl) => row.extend(now_ms, ttl.unwrap_or(self.settings.hold_ttl)),
            };
            if let Some(change) = verdict.change {
                batch.transitions.push((a.key.clone(), row.qty, change));
                row.apply(change);
            }
            act_results.push(Some((verdict.result, row.clone())));
        }

        for grant in self.pending_grants.drain(..) {
            if !batch.grants.iter().any(|g| g.id == grant.id) {
                batch.grants.push(grant);
            }
        }
        batch.changes.append(&mut self.pending_changes);
        if self.deps.link.is_some() {
            let free = (self.ledger.available + granted).saturating_sub(plan.units);
            let local_demand = !quantities.is_empty();
            let free_for_ms = self
                .free_since_ms
                .map_or(0, |since| now_ms.saturating_sub(since));
            let units = units_to_return(
                self.mode,
                free,
                self.return_until,
                self.ledger.returned,
                local_demand,
                free_for_ms,
            );
            if units > 0 {
                batch.returns.push(TransferMsg {
                    id: format!("r-{}-{}", self.deps.region, uuid::Uuid::new_v4()),
                    tenant: self.view.tenant.to_string(),
                    sku: self.view.sku.to_string(),
                    units,
                });
            }
        }

        // Actions decide expiry themselves (an expired hold's verdict expires it),
        // so the sweep only runs on its own schedule.
        batch.sweep = self.ledger.held > 0 && now_ms >= self.next_sweep_ms;
        if batch.sweep {
            self.next_sweep_ms = now_ms + SWEEP_INTERVAL_MS;
        }

        let outcome = if batch.is_empty() {
            Some(BatchOutcome::default())
        } else {
            metrics::histogram!("escrow_batch_size")
                .record((batch.holds.len() + batch.transitions.len()) as f64);
            self.commit(&batch).await
        };
        let Some(outcome) = outcome else {
            for a in acts {
                let _ = a.reply.send(ActReply::Paused);
            }
            return self.finish_reserves_unserved(holding, overflow, lookups, later);
        };

        // The batch is durable: move the same units in memory, then answer.
        for id in &outcome.applied_grants {
            if let Some(grant) = batch.grants.iter().find(|g| &g.id == id) {
                self.ledger.receive(grant.units);
            }
        }
        let mut held_units = 0;
        for (hold, inserted) in batch.holds.iter().zip(&outcome.inserted) {
            if *inserted {
                let moved = self.ledger.hold(hold.qty.units());
                self.check(moved);
                held_units += hold.qty.units();
                self.deps
                    .keys
                    .insert(&self.view.tenant, hold.request_key.clone());
            }
        }
        self.rate.record(now_ms, held_units);
        let rate = self.rate.rate_per_s(now_ms);
        self.view.rate_bits.store(rate.to_bits(), Ordering::Release);
        for ret in &batch.returns {
            let moved = self.ledger.give_back(ret.units);
            self.check(moved);
        }
        for (_, qty, change) in &batch.transitions {
            let moved = change.apply_to_ledger(&mut self.ledger, *qty);
            self.check(moved);
        }
        let mut expired_units = 0;
        for (_, qty) in &outcome.expired {
            let moved = self.ledger.unhold(qty.units());
            self.check(moved);
            expired_units += qty.units();
        }
        if expired_units > 0 {
            metrics::counter!("escrow_expired_units_total").increment(expired_units);
        }
        self.free_since_ms = match (self.ledger.available, self.free_since_ms) {
            (0, _) => None,
            (_, Some(since)) => Some(since),
            (_, None) => Some(now_ms),
        };

        for (a, result) in acts.into_iter().zip(act_results) {
            let reply = match result {
                None => ActReply::NotFound,
                Some((Ok(()), r)) => ActReply::Accepted(r),
                Some((
                    Err(Refusal::NotHeld | Refusal::AlreadyExtended | Refusal::AlreadySold),
                    r,
                )) => ActReply::Refused(r),
            };
            metrics::counter!("escrow_actions_total", "outcome" => act_outcome(&reply))
                .increment(1);
            let _ = a.reply.send(reply);
        }

        let mut not_inserted = lookups;
        for ((p, hold), inserted) in holding.into_iter().zip(&batch.holds).zip(&outcome.inserted) {
            if *inserted {
                let r = Reservation {
                    request_key: hold.request_key.clone(),
                    user_id: hold.user_id.clone(),
                    sku: self.view.sku.clone(),
                    qty: hold.qty,
                    status: Status::Held,
                    expires_at_ms: hold.expires_at_ms,
                    extended: false,
                };
                answer(p.reply, ReserveReply::Held(r));
            } else {
                not_inserted.push(p);
            }
        }
        self.answer_existing(not_inserted).await;

        self.overflow.extend(later);
        // Units freed by replays may still serve the overflow. Otherwise it
        // is sold out only if nothing is free anywhere; else pause.
        overflow.sort_by_key(|p| p.request.qty);
        for p in overflow {
            if p.request.qty.units() <= self.ledger.available {
                self.overflow.push_back(p);
            } else if take == Take::Exhausted {
                answer(p.reply, ReserveReply::SoldOut);
            } else {
                answer(p.reply, ReserveReply::Paused);
            }
        }
    }

    /// Refuses reserve requests of a batch that was not committed; nothing
    /// of theirs was written.
    fn finish_reserves_unserved(
        &mut self,
        holding: Vec<PendingReserve>,
        overflow: Vec<PendingReserve>,
        lookups: Vec<PendingReserve>,
        later: Vec<PendingReserve>,
    ) {
        for p in holding
            .into_iter()
            .chain(overflow)
            .chain(lookups)
            .chain(later)
        {
            answer(p.reply, ReserveReply::Paused);
        }
    }

    /// The committed rows of the acted-on keys, or `None` if the read failed.
    async fn rows_for(&mut self, acts: &[PendingAct]) -> Option<HashMap<RequestKey, Reservation>> {
        if acts.is_empty() {
            return Some(HashMap::new());
        }
        let keys: Vec<RequestKey> = acts.iter().map(|a| a.key.clone()).collect();
        match self.deps.store.reservations(&self.view.tenant, &keys).await {
            Ok(rows) => Some(
                rows.into_iter()
                    .filter(|r| r.sku == self.view.sku)
                    .map(|r| (r.request_key.clone(), r))
                    .collect(),
            ),
            Err(error) => {
                tracing::warn!(%error, "reading reservations failed");
                None
            }
        }
    }

    /// Answers requests whose key was not newly inserted: a replay, a reused
    /// key, or (no row at all) the per-user limit.
    async fn answer_existing(&mut self, pending: Vec<PendingReserve>) {
        if pending.is_empty() {
            return;
        }
        let keys: Vec<RequestKey> = pending
            .iter()
            .map(|p| p.request.request_key.clone())
            .collect();
        let rows = match self.deps.store.reservations(&self.view.tenant, &keys).await {
            Ok(rows) => rows,
            Err(error) => {
                tracing::warn!(%error, "reading replayed reservations failed");
                for p in pending {
                    answer(p.reply, ReserveReply::Paused);
                }
                return;
            }
        };
        let rows: HashMap<&RequestKey, &Reservation> =
            rows.iter().map(|r| (&r.request_key, r)).collect();
        for p in pending {
            let reply = match rows.get(&p.request.request_key) {
                Some(r)
                    if r.user_id == p.request.user_id
                        && r.sku == self.view.sku
                        && r.qty == p.request.qty =>
                {
                    ReserveReply::Replay((*r).clone())
                }
                Some(_) => ReserveReply::KeyReused,
                None => ReserveReply::UserLimit,
            };
            answer(p.reply, reply);
        }
    }
}

/// The metric label of an action's answer.
fn act_outcome(reply: &ActReply) -> &'static str {
    match reply {
        ActReply::Accepted(_) => "ACCEPTED",
        ActReply::Refused(_) => "REFUSED",
        ActReply::NotFound => "NOT_FOUND",
        ActReply::Paused => "PAUSED",
        ActReply::WaitTimeout => "REJECTED_WAIT_TIMEOUT",
    }
}

/// Sends a reserve answer and counts it. A closed channel means the client
/// went away; the decision stands and the key finds it later.
fn answer(reply: oneshot::Sender<ReserveReply>, outcome: ReserveReply) {
    metrics::counter!("escrow_reservations_total", "outcome" => outcome_name(&outcome))
        .increment(1);
    let _ = reply.send(outcome);
}

/// The contract's outcome name of a reserve answer.
pub fn outcome_name(reply: &ReserveReply) -> &'static str {
    match reply {
        ReserveReply::Held(_) => "HELD",
        ReserveReply::Replay(_) => "REPLAY",
        ReserveReply::SoldOut => "SOLD_OUT",
        ReserveReply::UserLimit => "USER_LIMIT",
        ReserveReply::KeyReused => "KEY_REUSED",
        ReserveReply::Paused => "PAUSED",
        ReserveReply::WaitTimeout => "REJECTED_WAIT_TIMEOUT",
    }
}
