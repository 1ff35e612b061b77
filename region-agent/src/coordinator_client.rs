//! The agent's line to the coordinator, behind a trait.
//!
//! The agent always initiates: a sync on a schedule, a take when a buyer
//! needs units the region lacks, and a limits call when a borrow or a loan
//! should not wait for the next sync. [`HttpCoordinator`] speaks HTTP with
//! reqwest; tests wrap it to duplicate, delay, reorder and lose messages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use escrow_core::protocol::{
    LimitsDown, LimitsUp, SyncRequest, SyncResponse, TakeRequest, TakeResponse, WatchRequest,
    WatchResponse,
};
use escrow_core::RegionName;
use tokio::sync::Notify;

/// Why a call to the coordinator failed. The outcome is unknown: the
/// coordinator may have applied the request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer (connection refused, timeout, reset).
    #[error("coordinator unreachable: {0}")]
    Unreachable(String),
    /// An answer that is not a success.
    #[error("coordinator refused: {status} {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
}

/// What the agent needs from the coordinator.
#[async_trait]
pub trait CoordinatorClient: Send + Sync + 'static {
    /// Report, acknowledge, return; receive grants and directives.
    async fn sync(&self, req: &SyncRequest) -> Result<SyncResponse, ClientError>;
    /// Ask for units now.
    async fn take(&self, req: &TakeRequest) -> Result<TakeResponse, ClientError>;
    /// Wait (bounded) for the coordinator to have news for this region.
    async fn watch(&self, req: &WatchRequest) -> Result<WatchResponse, ClientError>;
    /// Borrows and loans of the per-user limit across regions, at once,
    /// ahead of the next sync (which carries them again).
    async fn limits(&self, req: &LimitsUp) -> Result<LimitsDown, ClientError>;
}

/// The coordinator over HTTP.
#[derive(Debug, Clone)]
pub struct HttpCoordinator {
    base: String,
    region: RegionName,
    token: String,
    client: reqwest::Client,
}

impl HttpCoordinator {
    /// A client for `base` (e.g. `http://127.0.0.1:7000`) acting as `region`.
    pub fn new(
        base: &str,
        region: RegionName,
        token: String,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            region,
            token,
            client,
        })
    }

    async fn post<Req: serde::Serialize + Sync, Resp: serde::de::DeserializeOwned>(
        &self,
        what: &str,
        req: &Req,
    ) -> Result<Resp, ClientError> {
        let url = format!("{}/v1/regions/{}/{what}", self.base, self.region);
        let response = self
            .client
            .post(url)
            .bearer_auth(&self.token)
            .json(req)
            .send()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ClientError::Refused {
                status: status.as_u16(),
                body,
            });
        }
        response
            .json()
            .await
            .map_err(|e| ClientError::Unreachable(e.to_string()))
    }
}

#[async_trait]
impl CoordinatorClient for HttpCoordinator {
    async fn sync(&self, req: &SyncRequest) -> Result<SyncResponse, ClientError> {
        self.post("sync", req).await
    }

    async fn take(&self, req: &TakeRequest) -> Result<TakeResponse, ClientError> {
        self.post("take", req).await
    }

    async fn watch(&self, req: &WatchRequest) -> Result<WatchResponse, ClientError> {
        self.post("watch", req).await
    }

    async fn limits(&self, req: &LimitsUp) -> Result<LimitsDown, ClientError> {
        self.post("limits", req).await
    }
}

/// The client and whether the coordinator answered lately.
pub struct CoordinatorLink {
    /// The client.
    pub client: Arc<dyn CoordinatorClient>,
    /// How often to sync.
    pub sync_interval_ms: u64,
    down: AtomicBool,
    sync_now: Notify,
}

impl std::fmt::Debug for CoordinatorLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorLink")
            .field("sync_interval_ms", &self.sync_interval_ms)
            .field("down", &self.is_down())
            .finish()
    }
}

impl CoordinatorLink {
    /// A link, assumed down until the first sync succeeds.
    pub fn new(client: Arc<dyn CoordinatorClient>, sync_interval_ms: u64) -> Self {
        Self {
            client,
            sync_interval_ms,
            down: AtomicBool::new(true),
            sync_now: Notify::new(),
        }
    }

    /// Asks the sync loop to sync at once (units were returned, or buyers
    /// wait for units from elsewhere) rather than at its next interval.
    /// Requests made before the loop wakes count once.
    pub fn request_sync(&self) {
        self.sync_now.notify_one();
    }

    /// Resolves when a sync was requested.
    pub async fn sync_requested(&self) {
        self.sync_now.notified().await;
    }

    /// Whether the last call failed.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Records the outcome of a call.
    pub fn set_down(&self, down: bool) {
        let was = self.down.swap(down, Ordering::AcqRel);
        if was != down {
            if down {
                tracing::warn!("coordinator unreachable: central-mode SKUs pause, escrow-mode SKUs sell local quota");
            } else {
                tracing::info!("coordinator reachable");
            }
            metrics::gauge!("escrow_coordinator_down").set(if down { 1.0 } else { 0.0 });
        }
    }
}
