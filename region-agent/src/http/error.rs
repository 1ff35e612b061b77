//! The agent's one error type, mapped to a status and an outcome body.
//!
//! Bodies name the outcome from the contract and, for bad input, what is
//! wrong; 5xx details are logged, never returned.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::bodies::{NotFoundBody, NotFoundStatus, Outcome, OutcomeBody};
use crate::owner::PauseReason;
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
    /// The SKU cannot sell now, for the reason given.
    #[error("paused: {}", .0.as_str())]
    Paused(PauseReason),
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
            StoreError::Fenced => ApiError::Paused(PauseReason::Halted),
            // Unreachable or failing storage is a pause, which a retry
            // outlives (a database failing over), not a server fault.
            StoreError::Database(why) | StoreError::OutcomeUnknown(why) => {
                tracing::warn!(error = %why, "storage read or write failed");
                ApiError::Paused(PauseReason::Storage)
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

fn retry_after(status: StatusCode, body: OutcomeBody) -> Response {
    let retry = [(header::RETRY_AFTER, "1")];
    (status, retry, Json(body)).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            ApiError::BadRequest(error) => (
                StatusCode::BAD_REQUEST,
                OutcomeBody {
                    outcome: Outcome::BadRequest,
                    error: Some(error),
                    reason: None,
                },
            ),
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                OutcomeBody::of(Outcome::Unauthorized),
            ),
            ApiError::UnknownSku => (StatusCode::NOT_FOUND, OutcomeBody::of(Outcome::UnknownSku)),
            ApiError::NotFound => {
                let body = NotFoundBody {
                    status: NotFoundStatus::NotFound,
                };
                return (StatusCode::NOT_FOUND, Json(body)).into_response();
            }
            ApiError::Conflict(error) => (
                StatusCode::CONFLICT,
                OutcomeBody {
                    outcome: Outcome::Conflict,
                    error: Some(error),
                    reason: None,
                },
            ),
            ApiError::Paused(reason) => {
                return retry_after(StatusCode::SERVICE_UNAVAILABLE, OutcomeBody::paused(reason))
            }
            ApiError::QueueFull => {
                return retry_after(
                    StatusCode::SERVICE_UNAVAILABLE,
                    OutcomeBody::of(Outcome::RejectedQueueFull),
                )
            }
            ApiError::WaitTimeout => {
                return retry_after(
                    StatusCode::SERVICE_UNAVAILABLE,
                    OutcomeBody::of(Outcome::RejectedWaitTimeout),
                )
            }
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    OutcomeBody::of(Outcome::Internal),
                )
            }
        };
        (status, Json(body)).into_response()
    }
}
