//! The coordinator's error type, mapped to a status and an outcome body;
//! 5xx details are logged, never returned.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::bodies::{Outcome, OutcomeBody};
use crate::store::StoreError;

/// Everything a coordinator handler can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed input; nothing written.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Missing or unknown credentials.
    #[error("unauthorized")]
    Unauthorized,
    /// A valid token for something else (another region's).
    #[error("forbidden")]
    Forbidden,
    /// No such SKU.
    #[error("unknown sku")]
    UnknownSku,
    /// The change conflicts with units already leased, held or sold.
    #[error("conflict: {0}")]
    Conflict(String),
    /// An older agent process for a region that has a newer one.
    #[error("fenced")]
    Fenced,
    /// More requests in flight than the coordinator serves at once, or a
    /// request that ran past [`super::REQUEST_TIMEOUT`]: nothing of it
    /// committed; the agent retries with the same ids.
    #[error("overloaded")]
    Overloaded,
    /// Logged, answered without details.
    #[error("internal: {0}")]
    Internal(String),
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::UnknownSku => ApiError::UnknownSku,
            StoreError::Conflict(why) => ApiError::Conflict(why),
            StoreError::StaleEpoch => ApiError::Fenced,
            StoreError::Invalid(why) => ApiError::BadRequest(why),
            StoreError::Corrupt(why) => ApiError::Internal(why),
            StoreError::Database(e) => ApiError::Internal(e),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, outcome, error) = match self {
            ApiError::BadRequest(error) => {
                (StatusCode::BAD_REQUEST, Outcome::BadRequest, Some(error))
            }
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, Outcome::Unauthorized, None),
            ApiError::Forbidden => (StatusCode::FORBIDDEN, Outcome::Forbidden, None),
            ApiError::UnknownSku => (StatusCode::NOT_FOUND, Outcome::UnknownSku, None),
            ApiError::Conflict(error) => (StatusCode::CONFLICT, Outcome::Conflict, Some(error)),
            ApiError::Fenced => (StatusCode::CONFLICT, Outcome::Fenced, None),
            ApiError::Overloaded => {
                let body = OutcomeBody {
                    outcome: Outcome::Overloaded,
                    error: None,
                };
                let retry = [(axum::http::header::RETRY_AFTER, "1")];
                return (StatusCode::SERVICE_UNAVAILABLE, retry, Json(body)).into_response();
            }
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, Outcome::Internal, None)
            }
        };
        (status, Json(OutcomeBody { outcome, error })).into_response()
    }
}
