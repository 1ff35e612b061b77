//! What every request handler and background loop of an agent shares.
//!
//! [`AppState`] is created once by `start` and cloned into the router and
//! the sync loop; the HTTP layer and the sync loop read it from here rather
//! than from the crate root.

use std::sync::Arc;

use escrow_core::RegionName;

use crate::auth::Auth;
use crate::borrows::Borrows;
use crate::cart_committer::CartCommitter;
use crate::carts::CartExpiry;
use crate::clock::Clock;
use crate::coordinator_client::CoordinatorLink;
use crate::fence::Fence;
use crate::keys::KnownKeys;
use crate::owner::Limits;
use crate::registry::Registry;
use crate::store::Store;

/// Shared state of a running agent; cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Parts>);

/// What an [`AppState`] is made of.
pub(crate) struct Parts {
    pub(crate) region: RegionName,
    pub(crate) auth: Auth,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) fence: Arc<Fence>,
    pub(crate) keys: Arc<KnownKeys>,
    pub(crate) registry: Registry,
    pub(crate) cart_expiry: Arc<CartExpiry>,
    pub(crate) borrows: Borrows,
    pub(crate) cart_committer: CartCommitter,
    pub(crate) limits: Limits,
    pub(crate) link: Option<Arc<CoordinatorLink>>,
    pub(crate) stop_sync: tokio::sync::watch::Sender<bool>,
    /// The sync loop, once started; it may start owners of new SKUs.
    pub(crate) sync_task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(crate) metrics: metrics_exporter_prometheus::PrometheusHandle,
}

impl AppState {
    /// The shared state made of `parts`.
    pub(crate) fn new(parts: Parts) -> Self {
        Self(Arc::new(parts))
    }

    /// Remembers the running sync loop, for [`Self::stop_syncing`].
    pub(crate) fn set_sync_task(&self, task: tokio::task::JoinHandle<()>) {
        *self.0.sync_task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    /// Stops the sync loop and waits until it has: after this no owner of
    /// a new SKU can start.
    pub(crate) async fn stop_syncing(&self) {
        self.0.stop_sync.send_replace(true);
        let task = self
            .0
            .sync_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// The region served.
    pub fn region(&self) -> &RegionName {
        &self.0.region
    }
    /// Credentials.
    pub fn auth(&self) -> &Auth {
        &self.0.auth
    }
    /// Persistence.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.0.store
    }
    /// The current time, ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.0.clock.now_ms()
    }
    /// This process's lease on the region.
    pub fn fence(&self) -> &Fence {
        &self.0.fence
    }
    /// Committed request keys.
    pub fn keys(&self) -> &KnownKeys {
        &self.0.keys
    }
    /// The SKU owners.
    pub fn registry(&self) -> &Registry {
        &self.0.registry
    }
    /// Commits carts, many to a transaction.
    pub fn cart_committer(&self) -> &CartCommitter {
        &self.0.cart_committer
    }
    /// Held carts by expiry.
    pub fn cart_expiry(&self) -> &CartExpiry {
        &self.0.cart_expiry
    }
    /// Places borrowed from and lent to other regions.
    pub fn borrows(&self) -> &Borrows {
        &self.0.borrows
    }
    /// How long a request may wait in an owner's queue.
    pub fn wait_timeout_ms(&self) -> u64 {
        self.0.limits.wait_timeout_ms
    }
    /// The Prometheus renderer.
    pub fn metrics(&self) -> &metrics_exporter_prometheus::PrometheusHandle {
        &self.0.metrics
    }
    /// The coordinator link; `None` when standalone.
    pub fn link(&self) -> Option<&Arc<CoordinatorLink>> {
        self.0.link.as_ref()
    }
}
