//! The coordinator: owns each SKU's total and the pool not yet leased to
//! regions, and moves quota between the pool and region agents as
//! transfers that apply exactly once.
//!
//! A thin driver around escrow-core's [`escrow_core::allocation`] rules and
//! [`escrow_core::Policy`]: [`store`] keeps the books in PostgreSQL,
//! [`http`] serves the admin API and the region API (sync and take), and
//! [`run`] serves until shutdown.

pub mod auth;
pub mod config;
pub mod http;
pub mod notices;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use escrow_core::policy::{
    CentralOnly, ProportionalShare, RefillOnLowWater, StaticSplit, TailMerge,
};
use escrow_core::Policy;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::auth::Auth;
use crate::store::Store;

/// Shared state of a running coordinator; cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    store: Store,
    auth: Auth,
    policy: Box<dyn Policy>,
    stale_report_ms: u64,
    metrics: PrometheusHandle,
}

impl AppState {
    /// State over a migrated database.
    pub fn new(store: Store, auth: Auth, policy: Box<dyn Policy>, stale_report_ms: u64) -> Self {
        Self(Arc::new(Inner {
            store,
            auth,
            policy,
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
    /// The rebalancing policy.
    pub fn policy(&self) -> &dyn Policy {
        self.0.policy.as_ref()
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

/// The policy of a name given on the command line.
pub fn policy_named(name: &str, sync_interval_ms: u64) -> Option<Box<dyn Policy>> {
    let mut tail = TailMerge::default();
    tail.settings.refill.sync_interval_ms = sync_interval_ms;
    let mut refill = RefillOnLowWater::default();
    refill.settings.sync_interval_ms = sync_interval_ms;
    Some(match name {
        "tail-merge" => Box::new(tail),
        "refill" => Box::new(refill),
        "proportional" => Box::new(ProportionalShare::default()),
        "static" => Box::new(StaticSplit),
        "central" => Box::new(CentralOnly),
        _ => return None,
    })
}

/// The HTTP router of a coordinator.
pub fn app(state: AppState) -> Router {
    http::router(state)
}

/// Serves `state` on `listener` until `shutdown` resolves, finishing every
/// in-flight request.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}
