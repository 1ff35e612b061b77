//! JSON request bodies with the contract's rules: `application/json`, at
//! most 16 KiB, unknown fields refused, and every failure a 400 naming
//! what is wrong (axum's own extractor answers 413/415/422 instead).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Largest request body accepted.
pub const BODY_BYTES_MAX: usize = 16 * 1024;

/// A JSON body parsed into `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// A JSON body that may also be absent (empty or `null`), parsed into `T`
/// if present.
#[derive(Debug)]
pub struct OptionalJsonBody<T>(pub Option<T>);

async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state)
        .await
        .map_err(|_| ApiError::BadRequest(format!("body must be at most {BODY_BYTES_MAX} bytes")))
}

fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(&req) {
            return Err(ApiError::BadRequest(
                "Content-Type must be application/json".into(),
            ));
        }
        let bytes = read_body(req, state).await?;
        parse(&bytes).map(JsonBody)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = is_json(&req);
        let bytes = read_body(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(None));
        }
        if !json {
            return Err(ApiError::BadRequest(
                "Content-Type must be application/json".into(),
            ));
        }
        // `null` is no body, as a JSON null for an optional field is no field.
        parse(&bytes).map(OptionalJsonBody)
    }
}
