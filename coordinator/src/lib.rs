//! The coordinator: owns each SKU's total and the pool not yet leased to
//! regions, and moves quota between the pool and region agents as
//! transfers that apply exactly once.
//!
//! A thin driver around escrow-core's [`escrow_core::allocation`] rules and
//! [`escrow_core::Policy`]: [`store`] keeps the books in PostgreSQL or in
//! an embedded SQLite file, [`http`] serves the admin API and the region API (sync and take), and
//! [`run`] serves until shutdown.

pub mod auth;
pub mod config;
pub mod http;
pub mod notices;
pub mod policies;
pub mod store;

use std::io;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use service_kit::Shutdown;
use tokio::net::TcpListener;

use crate::auth::Auth;
use crate::policies::Policies;
use crate::store::Store;

/// The HTTP router of a coordinator.
pub use http::router as app;

/// Shared state of a running coordinator; cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    store: Store,
    auth: Auth,
    policies: Policies,
    stale_report_ms: u64,
    metrics: PrometheusHandle,
}

impl AppState {
    /// State over a migrated database.
    pub fn new(store: Store, auth: Auth, policies: Policies, stale_report_ms: u64) -> Self {
        Self(Arc::new(Inner {
            store,
            auth,
            policies,
            stale_report_ms,
            metrics: service_kit::metrics_handle(),
        }))
    }
    /// The store.
    pub fn store(&self) -> &Store {
        &self.0.store
    }
    /// Credentials.
    pub fn auth(&self) -> &Auth {
        &self.0.auth
    }
    /// The default policy and each SKU's choice.
    pub fn policies(&self) -> &Policies {
        &self.0.policies
    }
    /// Age after which a region's report counts as stale.
    pub fn stale_report_ms(&self) -> u64 {
        self.0.stale_report_ms
    }
    /// The Prometheus renderer.
    pub fn metrics(&self) -> &PrometheusHandle {
        &self.0.metrics
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, finishing every
/// in-flight request.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Shutdown,
) -> io::Result<()> {
    service_kit::serve(listener, app(state), shutdown).await
}
