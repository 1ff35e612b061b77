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
    /// The database cannot be reached or failed: a pause, not a bug;
    /// logged, answered without details.
    #[error("database unavailable: {0}")]
    Unavailable(String),
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
            StoreError::Database(e) => ApiError::Unavailable(e),
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
            ApiError::Overloaded => return retry_later(Outcome::Overloaded),
            ApiError::Unavailable(detail) => {
                tracing::warn!(%detail, "the database cannot be reached or failed");
                return retry_later(Outcome::Unavailable);
            }
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, Outcome::Internal, None)
            }
        };
        (status, Json(OutcomeBody { outcome, error })).into_response()
    }
}

/// 503 with `outcome` and `Retry-After: 1`.
fn retry_later(outcome: Outcome) -> Response {
    let body = OutcomeBody {
        outcome,
        error: None,
    };
    let retry = [(axum::http::header::RETRY_AFTER, "1")];
    (StatusCode::SERVICE_UNAVAILABLE, retry, Json(body)).into_response()
}
