//! A client for the buyer and admin APIs, which the coordinator and the
//! region agents (standalone ones serve the admin API too) speak alike.

use std::time::{Duration, Instant};

use reqwest::{Client, Method, RequestBuilder, StatusCode};
use serde_json::{json, Value};

/// The admin token every test service is started with.
pub const ADMIN: &str = "admin-secret";
/// Tenant `acme`'s key.
pub const ACME_KEY: &str = "acme-key";
/// Tenant `other`'s key.
pub const OTHER_KEY: &str = "other-key";

/// Most 503 answers [`Api::reserve_until_final`] retries before failing.
const RETRIES_MAX: u32 = 2_000;
/// Pause between two of those retries.
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// An HTTP client sized for thousands of concurrent buyers.
pub fn client() -> Client {
    Client::builder()
        .pool_max_idle_per_host(4096)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A reserve's final (non-503) answer after retrying with the same key.
#[derive(Debug)]
pub struct Final {
    /// The final status.
    pub status: StatusCode,
    /// Its body.
    pub body: Value,
    /// How many 503 answers came before it.
    pub retries: u32,
    /// When the request that got it was sent.
    pub sent: Instant,
    /// When it came back.
    pub answered: Instant,
}

/// A client for one service: admin calls with [`ADMIN`], buyer calls as
/// tenant `acme`.
#[derive(Clone)]
pub struct Api {
    /// `http://host:port` of the service.
    pub url: String,
    /// The underlying client, for requests the helpers do not cover.
    pub client: Client,
}

/// The `tenant/sku` of every SKU of a page of `GET /v1/admin/skus[/...]`
/// (or of `escrowctl sku list --json`, which prints the page).
pub fn page_ids(page: &Value) -> Vec<String> {
    let skus = page["skus"].as_array().unwrap();
    let id = |s: &Value| {
        format!(
            "{}/{}",
            s["tenant"].as_str().unwrap(),
            s["sku"].as_str().unwrap()
        )
    };
    skus.iter().map(id).collect()
}

impl Api {
    /// A client for the service at `url`.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            client: client(),
        }
    }

    /// Sends `request`, returning the status and the JSON body (`Null` if none).
    async fn send(request: RequestBuilder) -> (StatusCode, Value) {
        let r = request.send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `PUT /v1/admin/skus/{tenant}/{sku}`.
    pub async fn put_sku(&self, tenant: &str, sku: &str, body: Value) -> (StatusCode, Value) {
        let url = format!("{}/v1/admin/skus/{tenant}/{sku}", self.url);
        Self::send(self.client.put(url).bearer_auth(ADMIN).json(&body)).await
    }

    /// An admin POST to `path`, with a JSON body if given.
    pub async fn admin_post(&self, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self
            .client
            .post(format!("{}{path}", self.url))
            .bearer_auth(ADMIN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        Self::send(request).await
    }

    /// An admin GET of `path`.
    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        let url = format!("{}{path}", self.url);
        Self::send(self.client.get(url).bearer_auth(ADMIN)).await
    }

    /// The admin view of one SKU.
    pub async fn admin_sku(&self, tenant: &str, sku: &str) -> Value {
        self.admin_get(&format!("/v1/admin/skus/{tenant}/{sku}"))
            .await
            .1
    }

    /// The audit right now, asserting that every SKU's drifts (each field
    /// of its line named `*drift`) and `drift_total` are 0: the invariant
    /// holds at every moment, not only once things settle.
    pub async fn assert_no_drift(&self) -> Value {
        let (status, audit) = self.admin_get("/v1/admin/audit").await;
        assert_eq!(status, StatusCode::OK, "{audit}");
        for sku in audit["skus"].as_array().unwrap() {
            for (field, value) in sku.as_object().unwrap() {
                if field.ends_with("drift") {
                    assert_eq!(value, 0, "{field} in {sku:#}");
                }
            }
        }
        assert_eq!(audit["drift_total"], 0, "{audit:#}");
        audit
    }

    /// A request of tenant `acme` to `path`, for what the helpers here do
    /// not send (a raw body, another content type, a header to read).
    pub fn buyer_request(&self, method: Method, path: &str) -> RequestBuilder {
        let url = format!("{}{path}", self.url);
        self.client.request(method, url).bearer_auth(ACME_KEY)
    }

    /// A buyer POST of `body` (as JSON) to `path`.
    pub async fn buyer_post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        Self::send(self.buyer_request(Method::POST, path).json(&body)).await
    }

    /// A buyer GET of `path`.
    pub async fn buyer_get(&self, path: &str) -> (StatusCode, Value) {
        Self::send(self.buyer_request(Method::GET, path)).await
    }

    /// One reserve attempt; an error if the service could not be reached.
    pub async fn try_reserve(
        &self,
        key: &str,
        user: &str,
        sku: &str,
    ) -> reqwest::Result<(StatusCode, Value)> {
        let r = self
            .client
            .post(format!("{}/v1/reservations", self.url))
            .bearer_auth(ACME_KEY)
            .json(&json!({"request_key": key, "user_id": user, "sku": sku}))
            .send()
            .await?;
        let status = r.status();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    /// One reserve.
    pub async fn reserve(&self, key: &str, user: &str, sku: &str) -> (StatusCode, Value) {
        self.try_reserve(key, user, sku).await.unwrap()
    }

    /// One reserve in a task of its own, for a test that does something
    /// else while it is in flight.
    pub fn spawn_reserve(
        &self,
        key: &str,
        user: &str,
        sku: &str,
    ) -> tokio::task::JoinHandle<(StatusCode, Value)> {
        let (api, key, user, sku) = (
            self.clone(),
            key.to_owned(),
            user.to_owned(),
            sku.to_owned(),
        );
        tokio::spawn(async move { api.reserve(&key, &user, &sku).await })
    }

    /// Reserves, retrying with the same key while the answer is a 503 (the
    /// contract makes that always safe), until a final answer.
    pub async fn reserve_until_final(&self, key: &str, user: &str, sku: &str) -> Final {
        for retries in 0..RETRIES_MAX {
            let sent = Instant::now();
            let (status, body) = self.reserve(key, user, sku).await;
            if status != StatusCode::SERVICE_UNAVAILABLE {
                return Final {
                    status,
                    body,
                    retries,
                    sent,
                    answered: Instant::now(),
                };
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        panic!("no final answer for {key} after {RETRIES_MAX} attempts");
    }

    /// `POST /v1/reservations/{key}/{action}` without a body.
    pub async fn action(&self, key: &str, action: &str) -> (StatusCode, Value) {
        let url = format!("{}/v1/reservations/{key}/{action}", self.url);
        Self::send(self.client.post(url).bearer_auth(ACME_KEY)).await
    }

    /// `GET /v1/reservations/{key}`.
    pub async fn get(&self, key: &str) -> (StatusCode, Value) {
        let url = format!("{}/v1/reservations/{key}", self.url);
        Self::send(self.client.get(url).bearer_auth(ACME_KEY)).await
    }
}
