//! The region agent: sells one region's quota to buyers.
//!
//! A thin driver around escrow-core. [`start`] takes the region's fencing
//! epoch, loads every SKU (stopping any whose counters disagree with its
//! rows) and starts one owner task per SKU; [`app`] is the HTTP router;
//! [`run`] serves it until shutdown, then drains the owners so no accepted
//! request goes unanswered.
//!
//! - [`owner`]: the single writer per SKU with group commit.
//! - [`committer`]: one transaction for the ready batches of many SKUs.
//! - [`store`]: persistence behind a narrow trait; PostgreSQL or SQLite.
//! - [`http`]: buyer, admin and operations endpoints.
//! - [`state`]: what every handler and loop shares ([`AppState`]).
//! - [`borrows`]: places borrowed from and lent to other regions under a
//!   global per-user limit.

pub mod auth;
pub mod borrows;
pub mod cart_committer;
pub mod carts;
pub mod clock;
pub mod committer;
pub mod config;
pub mod coordinator_client;
pub mod fence;
pub mod http;
pub mod keys;
pub mod owner;
pub mod registry;
pub mod state;
pub mod store;
pub mod sync;

use std::io;
use std::sync::Arc;

use escrow_core::{RegionName, RequestKey};
use service_kit::Shutdown;
use tokio::net::TcpListener;

use crate::auth::Auth;
use crate::borrows::Borrows;
use crate::cart_committer::CartCommitter;
use crate::clock::Clock;
use crate::committer::Committer;
use crate::coordinator_client::CoordinatorLink;
use crate::fence::Fence;
use crate::keys::KnownKeys;
use crate::owner::{Limits, OwnerDeps};
use crate::registry::Registry;
use crate::state::Parts;
use crate::store::{Store, StoreError};

/// The HTTP router of an agent.
pub use http::router as app;
pub use state::AppState;

/// What an agent needs besides its store and clock.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// The region this agent sells.
    pub region: RegionName,
    /// Tenant keys and the admin token.
    pub auth: Auth,
    /// Queue and batch bounds.
    pub limits: Limits,
    /// The coordinator; `None` runs standalone.
    pub coordinator: Option<Arc<CoordinatorLink>>,
    /// How long request keys stay in memory.
    pub keys: KeyMemory,
}

/// How long request keys stay in memory, and the filter behind them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyMemory {
    /// The idempotency window, ms: a key stays in memory for one to two
    /// windows after its reservation was created; a retry after that is
    /// answered from the database.
    pub window_ms: u64,
    /// Keys the filter of every key holds at its nominal false positive
    /// rate (1%): about 1.2 bytes of memory per key.
    pub filter_capacity: usize,
}

impl Default for KeyMemory {
    /// A window of 24 hours; a filter for 10 million keys (12 MiB).
    fn default() -> Self {
        Self {
            window_ms: 24 * 3_600_000,
            filter_capacity: 10_000_000,
        }
    }
}

/// Takes the region's lease, loads every SKU and starts their owners.
pub async fn start(
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    settings: AgentSettings,
) -> Result<AppState, StoreError> {
    let metrics = service_kit::metrics_handle();
    // A database is either standalone or coordinator-managed for life: stock
    // created standalone exists in no coordinator's ledger, and granted stock
    // sold standalone would leave the coordinator's lease wrong.
    let provenance = store.provenance().await?;
    match (&settings.coordinator, provenance) {
        (Some(_), p) if !p.not_granted.is_empty() => {
            return Err(StoreError::Conflict(format!(
                "this database holds standalone stock ({}); a coordinator-managed agent needs its own database",
                p.not_granted.join(", ")
            )));
        }
        (None, p) if p.has_grants => {
            return Err(StoreError::Conflict(
                "this database holds coordinator grants; run it with --coordinator-url".into(),
            ));
        }
        _ => {}
    }
    let epoch = store.take_lease(&settings.region).await?;
    tracing::info!(region = %settings.region, epoch = epoch.0, "took the region lease");
    let fence = Arc::new(Fence::new(epoch));
    let keys = Arc::new(KnownKeys::new(
        settings.keys.window_ms,
        settings.keys.filter_capacity,
    ));
    let deps = OwnerDeps {
        committer: Committer::spawn(store.clone(), fence.clone()),
        store: store.clone(),
        clock: clock.clone(),
        fence: fence.clone(),
        keys: keys.clone(),
        limits: settings.limits,
        region: settings.region.clone(),
        link: settings.coordinator.clone(),
    };
    let cart_committer = CartCommitter::spawn(store.clone(), fence.clone());
    let registry = Registry::new(deps);
    for record in store.load_skus().await? {
        let (tenant, sku, now_ms) = (&record.tenant, &record.sku, clock.now_ms());
        store
            .for_each_key(tenant, sku, &mut |key, created_ms| {
                // A cart's key is known by its items' keys.
                if let Some(cart) = key.cart().and_then(|cart| RequestKey::parse(cart).ok()) {
                    keys.load(tenant, sku, cart, created_ms, now_ms);
                }
                keys.load(tenant, sku, key, created_ms, now_ms);
            })
            .await?;
        registry.start(record);
    }
    tokio::spawn(keys::rotate_every(Arc::downgrade(&keys)));
    let (stop_sync, stop_rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(Parts {
        region: settings.region,
        auth: settings.auth,
        store,
        clock,
        fence,
        keys,
        registry,
        cart_expiry: Arc::default(),
        borrows: Borrows::default(),
        cart_committer,
        limits: settings.limits,
        link: settings.coordinator.clone(),
        stop_sync,
        sync_task: std::sync::Mutex::new(None),
        metrics,
    });
    tokio::spawn(carts::expire_forever(state.clone()));
    if let Some(link) = settings.coordinator {
        state.set_sync_task(tokio::spawn(sync::run(state.clone(), link, stop_rx)));
    }
    Ok(state)
}

/// Serves `state` on `listener` until `shutdown` resolves, then stops
/// accepting, finishes every in-flight request and drains the owners.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Shutdown,
) -> io::Result<()> {
    service_kit::serve(listener, app(state.clone()), shutdown).await?;
    // The sync loop first: it may start owners, which must be closed after it.
    state.stop_syncing().await;
    for task in state.registry().close() {
        let _ = task.await;
    }
    tracing::info!("drained; every accepted request was answered");
    Ok(())
}
