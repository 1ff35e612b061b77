//! The tokio driver of one SKU's owner.
//!
//! Every decision lives in escrow-core's [`SkuOwner`], the state machine the
//! simulator drives too. This task only does its I/O: it takes up to
//! `max_in_flight` commands from the SKU's bounded queue, hands them to the
//! owner, and carries out what the owner asks (read rows, take from the
//! coordinator, commit a batch, reload) until the owner is idle; then it
//! answers the waiting requests. While one batch commits the next one queues,
//! so a busy SKU gets large batches and one log flush serves many buyers.
//!
//! Directives and grants from the coordinator arrive on their own channel,
//! which keeps only the latest one and can never be refused by a full
//! buyer queue. Decisions never run in a request's future: a client that
//! disconnects drops only its reply channel, never a half-done transaction.

pub mod view;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use escrow_core::batch::{Batch, BatchOutcome, SkuRecord};
use escrow_core::owner::{
    CartEnd, Command as OwnerCommand, CommitError, Io, OwnerConfig, Reply, SkuOwner, Ticket,
    RELOAD_RETRY_MS, SWEEP_INTERVAL_MS, TAKE_BUDGET_MIN_MS,
};
use escrow_core::protocol::{SkuDirective, TakeRequest, TakeResponse, TransferMsg};
use escrow_core::{Deadline, RegionName, RequestKey, Reservation};
use tokio::sync::{mpsc, oneshot, watch};

pub use escrow_core::owner::{
    ActReply, Action, AdminChange, AdminReply, PauseReason, ReserveReply, ReserveRequest,
};
pub use view::{SkuSnapshot, SkuView};

use crate::clock::Clock;
use crate::committer::{answered, Committer};
use crate::coordinator_client::{ClientError, CoordinatorLink};
use crate::fence::Fence;
use crate::keys::KnownKeys;
use crate::store::{Store, StoreError};

/// How a take ended, as the driver saw it.
enum TakeEnd {
    /// The coordinator answered.
    Answered(TakeResponse),
    /// It could not be asked (or refused): the buyers are told PAUSED.
    Failed,
    /// No answer before the earliest deadline of its buyers, who had
    /// less than [`TAKE_BUDGET_MIN_MS`] left to wait.
    Late,
}
/// Bounds on one owner's work.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most requests decided and committed in one transaction.
    pub max_in_flight: usize,
    /// Most requests waiting in one owner's queue.
    pub max_waiting: usize,
    /// Longest a request may wait in the queue before it is refused unserved.
    pub wait_timeout_ms: u64,
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
    /// A cart wants units set aside ([`OwnerCommand::SetAside`]).
    SetAside(ReserveRequest, Deadline, oneshot::Sender<ReserveReply>),
}

/// How a cart's commit ended for one item, and who waits to hear it was
/// taken in.
pub type CartEndNote = (RequestKey, CartEnd, oneshot::Sender<()>);

/// The coordinator's latest word for one SKU: its directive and the grants
/// to this region not yet acknowledged.
#[derive(Debug, Clone)]
pub struct Control {
    /// The directive.
    pub directive: SkuDirective,
    /// Grants to credit (each at most once).
    pub grants: Vec<TransferMsg>,
}

/// The ways into an owner, and its published view.
#[derive(Debug, Clone)]
pub struct OwnerHandle {
    /// The owner's published state.
    pub view: Arc<SkuView>,
    /// The owner's bounded queue of buyer and admin commands.
    pub queue: mpsc::Sender<Command>,
    /// The coordinator's latest directive; a newer one replaces an unread one.
    pub control: Arc<watch::Sender<Option<Control>>>,
    /// How carts' commits ended for their items here
    /// ([`SkuOwner::handle_cart_end`]): never refused, however full the
    /// queue, as what they say already happened. The sender hears when
    /// the owner's memory (and the gate's view) follows.
    pub cart_ends: mpsc::UnboundedSender<CartEndNote>,
}

/// Shared services every owner uses.
#[derive(Clone)]
pub struct OwnerDeps {
    /// Persistence.
    pub store: Arc<dyn Store>,
    /// Commits batches, many SKUs' to a transaction.
    pub committer: Committer,
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

/// Where a command's answer goes.
enum Responder {
    Reserve(oneshot::Sender<ReserveReply>),
    Act(oneshot::Sender<ActReply>),
    Admin(oneshot::Sender<AdminReply>),
    /// A cart's item: its cart counts and remembers what is held.
    SetAside(oneshot::Sender<ReserveReply>),
}

/// The owner task: the state machine plus its I/O.
struct Driver {
    deps: OwnerDeps,
    view: Arc<SkuView>,
    queue: mpsc::Receiver<Command>,
    cart_ends: mpsc::UnboundedReceiver<CartEndNote>,
    control: watch::Receiver<Option<Control>>,
    /// The same channel's sending end: the owner takes what it read, so
    /// grants are handed over once and do not pile up in the channel.
    control_tx: Arc<watch::Sender<Option<Control>>>,
    owner: SkuOwner,
    waiting: HashMap<Ticket, Responder>,
    next_ticket: Ticket,
    /// The batch in progress asked the coordinator: its holds paid a round trip.
    took: bool,
}

/// Starts the owner of a loaded SKU and returns its handle.
pub fn spawn(deps: OwnerDeps, record: SkuRecord) -> (OwnerHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(deps.limits.max_waiting);
    let (cart_ends_tx, cart_ends) = mpsc::unbounded_channel();
    let (control_tx, control_rx) = watch::channel(None);
    let control_tx = Arc::new(control_tx);
    let view = Arc::new(SkuView::new(record.tenant.clone(), record.sku.clone()));
    let cfg = OwnerConfig {
        max_in_flight: deps.limits.max_in_flight,
        parked_max: deps.limits.max_waiting,
        coordinated: deps.link.is_some(),
        transfer_id_prefix: format!("{}-{}", deps.region, uuid::Uuid::new_v4().simple()),
    };
    let owner = SkuOwner::new(cfg, record, deps.clock.now_ms());
    let driver = Driver {
        deps,
        view: view.clone(),
        queue: rx,
        cart_ends,
        control: control_rx,
        control_tx: control_tx.clone(),
        owner,
        waiting: HashMap::new(),
        next_ticket: 0,
        took: false,
    };
    driver.report_drift();
    driver.publish();
    let task = tokio::spawn(driver.run());
    let handle = OwnerHandle {
        view,
        queue: tx,
        control: control_tx,
        cart_ends: cart_ends_tx,
    };
    (handle, task)
}

impl Driver {
    fn labels(&self) -> [(&'static str, String); 2] {
        [
            ("tenant", self.view.tenant.to_string()),
            ("sku", self.view.sku.to_string()),
        ]
    }

    fn publish(&self) {
        let fenced = self.deps.fence.is_fenced();
        self.view.publish(&self.owner, self.deps.link.is_some());
        if fenced {
            self.view.halt();
        }
        let available = self.owner.ledger().available as f64;
        metrics::gauge!("escrow_available_units", &self.labels()).set(available);
        metrics::gauge!("escrow_queue_depth", &self.labels()).set(self.queue.len() as f64);
    }

    fn report_drift(&self) {
        let drift = self.owner.rows_drift();
        metrics::gauge!("escrow_drift_units", &self.labels()).set(drift as f64);
        if self.owner.is_drifted() {
            tracing::error!(tenant = %self.view.tenant, sku = %self.view.sku,
                ledger = ?self.owner.ledger(), rows_drift = drift,
                "DRIFT: counters disagree with reservation rows; SKU stopped until repaired");
        }
    }

    async fn run(mut self) {
        let mut control_open = true;
        loop {
            let mut commands = Vec::with_capacity(self.owner.batch_room());
            if !self.owner.has_overflow() {
                let now_ms = self.deps.clock.now_ms();
                let wait_ms = self
                    .owner
                    .poll_timeout()
                    .saturating_sub(now_ms)
                    .min(SWEEP_INTERVAL_MS);
                // Biased: a timeout is handled only with the queue empty,
                // as the owner reads an empty batch as time without requests.
                tokio::select! {
                    biased;
                    Some((key, end, taken)) = self.cart_ends.recv() => {
                        self.owner.handle_cart_end(&key, end);
                        self.publish();
                        let _ = taken.send(());
                        continue;
                    }
                    changed = self.control.changed(), if control_open => {
                        match changed {
                            Ok(()) => self.follow(),
                            Err(_) => control_open = false,
                        }
                        continue;
                    }
                    command = self.queue.recv() => match command {
                        Some(command) => commands.push(command),
                        None => break,
                    },
                    () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {
                        let now_ms = self.deps.clock.now_ms();
                        if now_ms >= self.owner.poll_timeout() {
                            self.owner.handle_timeout(now_ms);
                            self.drive().await;
                            self.publish();
                        }
                        continue;
                    }
                }
            }
            while commands.len() < self.owner.batch_room() {
                match self.queue.try_recv() {
                    Ok(command) => commands.push(command),
                    Err(_) => break,
                }
            }
            if control_open && self.control.has_changed().unwrap_or(false) {
                self.follow();
            }
            let mut taken = Vec::new();
            while let Ok((key, end, told)) = self.cart_ends.try_recv() {
                self.owner.handle_cart_end(&key, end);
                taken.push(told);
            }
            if !taken.is_empty() {
                self.publish();
                for told in taken {
                    let _ = told.send(());
                }
            }
            if self.deps.fence.is_fenced() {
                self.owner.handle_fenced();
            }
            let commands = commands.into_iter().map(|c| self.ticket(c)).collect();
            self.owner
                .handle_commands(self.deps.clock.now_ms(), commands);
            self.drive().await;
            self.publish();
        }
        // The queue is closed and drained: every accepted request was answered.
        self.owner.handle_close();
        self.deliver();
    }

    /// Hands the latest directive to the owner.
    fn follow(&mut self) {
        self.control.borrow_and_update();
        let mut latest = None;
        // Taken without a new notice: the receiver marked it seen above.
        self.control_tx.send_if_modified(|control| {
            latest = control.take();
            false
        });
        let Some(control) = latest else {
            return;
        };
        let mode = self.owner.mode();
        self.owner
            .handle_directive(&control.directive, control.grants);
        if self.owner.mode() != mode {
            tracing::info!(tenant = %self.view.tenant, sku = %self.view.sku,
                mode = self.owner.mode().as_str(), "mode changed");
        }
        self.publish();
    }

    /// Gives a queued command a ticket and remembers where its answer goes.
    fn ticket(&mut self, command: Command) -> OwnerCommand {
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        let (command, responder) = match command {
            Command::Reserve(request, deadline, reply) => {
                let known = self
                    .deps
                    .keys
                    .contains(&self.view.tenant, &request.request_key);
                let command = OwnerCommand::Reserve {
                    ticket,
                    request,
                    deadline,
                    known,
                };
                (command, Responder::Reserve(reply))
            }
            Command::Act(key, action, deadline, reply) => {
                let command = OwnerCommand::Act {
                    ticket,
                    key,
                    action,
                    deadline,
                };
                (command, Responder::Act(reply))
            }
            Command::Admin(change, reply) => (
                OwnerCommand::Admin { ticket, change },
                Responder::Admin(reply),
            ),
            Command::SetAside(request, deadline, reply) => {
                let command = OwnerCommand::SetAside {
                    ticket,
                    request,
                    deadline,
                };
                (command, Responder::SetAside(reply))
            }
        };
        self.waiting.insert(ticket, responder);
        command
    }

    /// Carries out the owner's I/O until it is idle, answering as it goes.
    async fn drive(&mut self) {
        let drifted = self.owner.is_drifted();
        self.took = false;
        let mut reload_failed = false;
        loop {
            self.deliver();
            if self.owner.take_sync_due() {
                // The sync reads the region's demand from the view, which
                // is otherwise published only after the batch: a first
                // figure of demand went out as the 0 before it, and the
                // coordinator heard it a round trip and a sync interval
                // later (a far region's units stayed frozen meanwhile).
                self.view.publish_rate(&self.owner);
                self.request_sync();
            }
            let Some(io) = self.owner.poll_io() else {
                break;
            };
            match io {
                Io::Read(keys) => {
                    let rows = self.read(&keys).await;
                    self.owner.handle_read(rows);
                }
                Io::Take(request) => {
                    let answer = self.take(&request).await;
                    self.took = true;
                    match answer {
                        TakeEnd::Answered(resp) => self.owner.handle_take_answer(Some(resp)),
                        TakeEnd::Failed => self.owner.handle_take_answer(None),
                        TakeEnd::Late => self.owner.handle_take_late(),
                    }
                }
                Io::Commit(batch) => {
                    let (batch, result) = self.commit(batch).await;
                    self.owner.handle_commit_result(batch, result);
                }
                Io::Reload => {
                    if reload_failed {
                        tokio::time::sleep(Duration::from_millis(RELOAD_RETRY_MS)).await;
                    }
                    let record = self.reload().await;
                    reload_failed = record.is_none();
                    self.owner.handle_reload(self.deps.clock.now_ms(), record);
                    self.report_drift();
                }
            }
        }
        if self.owner.is_drifted() && !drifted {
            tracing::error!(tenant = %self.view.tenant, sku = %self.view.sku,
                "ledger refused a committed move; SKU stopped");
        }
    }

    fn request_sync(&self) {
        if let Some(link) = &self.deps.link {
            link.request_sync();
        }
    }

    /// Sends every answer the owner has, counting it.
    fn deliver(&mut self) {
        while let Some((ticket, reply)) = self.owner.poll_reply() {
            let responder = self
                .waiting
                .remove(&ticket)
                .expect("the owner answers each ticket once");
            // A closed channel means the client went away; the decision
            // stands and the key finds it later.
            match (responder, reply) {
                (Responder::Reserve(tx), Reply::Reserve(reply)) => {
                    if let ReserveReply::Held(r) = &reply {
                        self.deps.keys.insert(
                            &self.view.tenant,
                            &self.view.sku,
                            r.request_key.clone(),
                        );
                        let path = if self.took { "take" } else { "local" };
                        metrics::counter!("escrow_holds_total", "path" => path).increment(1);
                    }
                    metrics::counter!("escrow_reservations_total", "outcome" => reply.outcome())
                        .increment(1);
                    let _ = tx.send(reply);
                }
                (Responder::Act(tx), Reply::Act(reply)) => {
                    metrics::counter!("escrow_actions_total", "outcome" => reply.outcome())
                        .increment(1);
                    let _ = tx.send(reply);
                }
                (Responder::Admin(tx), Reply::Admin(reply)) => {
                    let _ = tx.send(reply);
                }
                (Responder::SetAside(tx), Reply::Reserve(reply)) => {
                    let _ = tx.send(reply);
                }
                _ => unreachable!("a reply matches its command's kind"),
            }
        }
    }

    async fn read(&self, keys: &[RequestKey]) -> Option<Vec<Reservation>> {
        let read = self.deps.store.reservations(&self.view.tenant, keys);
        match answered(self.deps.store.as_ref(), read).await {
            Some(Ok(rows)) => Some(rows),
            Some(Err(error)) => {
                tracing::warn!(%error, "reading reservations failed");
                None
            }
            None => {
                tracing::warn!("no answer to a read of reservations, or the primary moved");
                None
            }
        }
    }

    /// Asks the coordinator for units.
    async fn take(&self, request: &TakeRequest) -> TakeEnd {
        let link = self
            .deps
            .link
            .as_ref()
            .expect("only a coordinated owner takes");
        let now_ms = self.deps.clock.now_ms();
        let wait_ms = self
            .owner
            .take_deadline_ms()
            .map_or(u64::MAX, |at| at.saturating_sub(now_ms));
        let answer =
            tokio::time::timeout(Duration::from_millis(wait_ms), link.client.take(request)).await;
        match answer {
            Ok(Ok(resp)) => {
                link.set_down(false);
                TakeEnd::Answered(resp)
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "take failed; the units it asked for are not sold");
                if matches!(error, ClientError::Unreachable(_)) {
                    link.set_down(true);
                }
                TakeEnd::Failed
            }
            // A grant it made arrives by sync like any unanswered take's.
            Err(_) if wait_ms < TAKE_BUDGET_MIN_MS => TakeEnd::Late,
            Err(_) => {
                tracing::warn!("no answer to a take before its buyers' deadline");
                TakeEnd::Failed
            }
        }
    }

    /// Commits a batch (with other SKUs' batches) and gets it back.
    async fn commit(&self, batch: Batch) -> (Batch, Result<BatchOutcome, CommitError>) {
        metrics::histogram!("escrow_batch_size")
            .record((batch.holds.len() + batch.transitions.len()) as f64);
        let (batch, result) = self.deps.committer.commit(batch).await;
        let result = match result {
            Ok(outcome) => {
                let expired = batch.expired_units();
                if expired > 0 {
                    metrics::counter!("escrow_expired_units_total").increment(expired);
                }
                Ok(outcome)
            }
            Err(StoreError::Fenced) => {
                self.deps.fence.set_fenced();
                Err(CommitError::Fenced)
            }
            Err(error @ StoreError::OutcomeUnknown(_)) => {
                tracing::error!(tenant = %self.view.tenant, sku = %self.view.sku, %error,
                    "commit outcome unknown; settling it from the database");
                Err(CommitError::Unknown)
            }
            Err(error) => {
                tracing::error!(tenant = %self.view.tenant, sku = %self.view.sku, %error,
                    "commit failed; SKU paused until its state is reloaded");
                Err(CommitError::Failed)
            }
        };
        (batch, result)
    }

    /// The SKU's stored state and keys, or `None` if they could not be read.
    async fn reload(&self) -> Option<SkuRecord> {
        let store = &self.deps.store;
        let (tenant, sku) = (&self.view.tenant, &self.view.sku);
        let (keys, now_ms) = (&self.deps.keys, self.deps.clock.now_ms());
        let mut load = |key, created_ms| keys.load(tenant, sku, key, created_ms, now_ms);
        let read = async {
            (
                store.load_sku(tenant, sku).await,
                store.for_each_key(tenant, sku, &mut load).await,
            )
        };
        let Some(read) = answered(store.as_ref(), read).await else {
            tracing::warn!("no answer to a reload, or the primary moved; SKU stays paused");
            return None;
        };
        match read {
            (Ok(Some(record)), Ok(())) => {
                tracing::info!(%tenant, %sku, "reloaded after a failed commit");
                Some(record)
            }
            (Ok(None), _) => {
                tracing::error!(%tenant, %sku, "SKU vanished from the database");
                None
            }
            (Err(error), _) | (_, Err(error)) => {
                tracing::warn!(%error, "reload failed; SKU stays paused");
                None
            }
        }
    }
}
