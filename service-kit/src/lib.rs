//! Plumbing the coordinator and the region agent share, so both services
//! authenticate, log, export metrics, bound what they take in
//! ([`intake`]), serve and shut down ([`serve`]), answer operators
//! ([`ops`]), open their database ([`db`]) and write its SQL once for both
//! backends ([`sql`]), complete their OpenAPI document ([`openapi`]),
//! prune a batch at a time ([`retention`]) and take the path and stock of
//! the SKU admin API ([`sku_admin`]) the same way.
//!
//! Nothing here decides anything about stock; that is escrow-core's job.

pub mod db;
pub mod intake;
pub mod openapi;
pub mod ops;
pub mod primary;
pub mod retention;
pub mod sku_admin;
pub mod sql;

use std::future::Future;
use std::sync::OnceLock;

use axum::http::{header, HeaderMap};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

/// The token of an `Authorization: Bearer <token>` header, if any.
pub fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let token = value.strip_prefix(b"Bearer ")?;
    (!token.is_empty()).then_some(token)
}

/// Whether `presented` equals `secret`, in time independent of where they differ.
pub fn token_matches(secret: &[u8], presented: &[u8]) -> bool {
    bool::from(secret.ct_eq(presented))
}

/// A future whose end starts a service's graceful shutdown
/// ([`shutdown_signal`] in production, whatever a test chooses).
pub trait Shutdown: Future<Output = ()> + Send + 'static {}

impl<F: Future<Output = ()> + Send + 'static> Shutdown for F {}

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and finishes every request in flight.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    shutdown: impl Shutdown,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Resolves on SIGTERM or Ctrl-C: the start of a graceful drain.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received; draining");
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
}

/// Latency buckets in seconds, from a fast commit to a slow one.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
];
/// Batch size buckets, up to the largest batch allowed.
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// The handle that renders this process's metrics, installing the
/// Prometheus recorder on first use. `metrics` has one global recorder per
/// process, so several services in one test process share it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("escrow_batch_size".into()),
                        BATCH_BUCKETS,
                    )
                })
                .map(PrometheusBuilder::build_recorder)
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; ours then renders empty.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}
