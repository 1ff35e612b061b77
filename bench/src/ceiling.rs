//! The HTTP ceiling: the buyer API's reserve call answered without storage.
//!
//! It does what every server must do before it can decide anything (check
//! the key, parse and validate the same JSON, write the same 201 body) and
//! nothing else, on the same axum and tokio as the agent. No storage design
//! can beat it on this machine, so the agent's throughput divided by this
//! one says how much of the HTTP budget storage costs.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;

use crate::wire::{self, ReserveBody};

/// The ceiling's settings.
#[derive(Debug, Clone)]
pub struct Ceiling {
    /// The buyer API key accepted.
    pub tenant_key: String,
}

/// The ceiling's router: reserve, a no-op admin PUT, health.
pub fn app(ceiling: Ceiling) -> Router {
    Router::new()
        .route("/v1/reservations", post(reserve))
        .route("/v1/admin/skus/{tenant}/{sku}", put(put_sku))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(ceiling)
}

/// Parses a reserve body the way the agent does: JSON only, unknown fields
/// refused, identifiers validated. The error is the 400's message.
pub fn parse_reserve(headers: &HeaderMap, body: &[u8]) -> Result<wire::Reserve, String> {
    let is_json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !is_json {
        return Err("Content-Type must be application/json".into());
    }
    let body: ReserveBody =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    body.validate()
}

async fn reserve(State(ceiling): State<Ceiling>, headers: HeaderMap, body: Bytes) -> Response {
    if !wire::has_bearer(&headers, &ceiling.tenant_key) {
        return wire::outcome(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    }
    match parse_reserve(&headers, &body) {
        Ok(reserve) => wire::held(&reserve, wire::now_ms()),
        Err(error) => wire::bad_request(error),
    }
}

async fn put_sku() -> StatusCode {
    StatusCode::CREATED
}
