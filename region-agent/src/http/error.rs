//! The agent's one error type, mapped to a status and an outcome body.
//!
//! Bodies name the outcome from the contract and, for bad input, what is
//! wrong; 5xx details are logged, never returned.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::StoreError;

/// Everything a handler can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed input; nothing written.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Missing or wrong credentials.
    #[error("unauthorized")]
    Unauthorized,
    /// The SKU does not exist for this tenant.
    #[error("unknown sku")]
    UnknownSku,
    /// No committed reservation for this key.
    #[error("not found")]
    NotFound,
    /// A state conflict an admin must resolve.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The SKU cannot sell now.
    #[error("paused")]
    Paused,
    /// The owner's queue is full; nothing written.
    #[error("queue full")]
    QueueFull,
    /// The request waited too long; nothing written.
    #[error("wait timeout")]
    WaitTimeout,
    /// Anything else; logged, answered without details.
    #[error("internal: {0}")]
    Internal(String),
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Fenced => ApiError::Paused,
            other => ApiError::Internal(other.to_string()),
        }
    }
}

fn retry_after(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::BadRequest(error) => (
                StatusCode::BAD_REQUEST,
                Json(json!({"outcome": "BAD_REQUEST", "error": error})),
            )
                .into_response(),
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                Json(json!({"outcome": "UNAUTHORIZED"})),
            )
                .into_response(),
            ApiError::UnknownSku => (
                StatusCode::NOT_FOUND,
                Json(json!({"outcome": "UNKNOWN_SKU"})),
            )
                .into_response(),
            ApiError::NotFound => {
                (StatusCode::NOT_FOUND, Json(json!({"status": "NOT_FOUND"}))).into_response()
            }
            ApiError::Conflict(error) => (
                StatusCode::CONFLICT,
                Json(json!({"outcome": "CONFLICT", "error": error})),
            )
                .into_response(),
            ApiError::Paused => retry_after(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"outcome": "PAUSED"})),
                )
                    .into_response(),
            ),
            ApiError::QueueFull => retry_after(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"outcome": "REJECTED_QUEUE_FULL"})),
                )
                    .into_response(),
            ),
            ApiError::WaitTimeout => retry_after(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"outcome": "REJECTED_WAIT_TIMEOUT"})),
                )
                    .into_response(),
            ),
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Json(json!({"outcome": "INTERNAL"})),
                )
                    .into_response()
            }
        }
    }
}
