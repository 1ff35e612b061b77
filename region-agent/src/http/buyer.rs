//! The buyer API: reserve, look up, confirm, release, extend, SKU status.
//!
//! Handlers validate, then answer from memory where the contract allows
//! (sold out, paused, SKU status) and otherwise queue the request to the
//! SKU's owner and wait for its committed answer.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use escrow_core::owner::gate;
use escrow_core::{Deadline, Qty, RequestKey, Reservation, Sku, Tenant, TtlMs, UserId};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use super::error::ApiError;
use super::json::{JsonBody, OptionalJsonBody};
use crate::owner::{ActReply, Action, Command, OwnerHandle, ReserveReply, ReserveRequest};
use crate::state::AppState;

/// `POST /v1/reservations` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    request_key: String,
    user_id: String,
    sku: String,
    qty: Option<i64>,
    ttl_ms: Option<i64>,
}

/// `POST /v1/reservations/{key}/extend` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    ttl_ms: Option<i64>,
}

fn bad(e: impl ToString) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

/// The caller's tenant, from its key.
fn tenant_of(state: &AppState, headers: &HeaderMap) -> Result<Tenant, ApiError> {
    state.auth().tenant(headers).ok_or(ApiError::Unauthorized)
}

/// The contract's reservation body R.
pub fn reservation_json(state: &AppState, r: &Reservation) -> serde_json::Value {
    let expires_at = chrono::DateTime::from_timestamp_millis(r.expires_at_ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    json!({
        "request_key": r.request_key,
        "user_id": r.user_id,
        "sku": r.sku,
        "qty": r.qty,
        "status": r.status,
        "expires_at": expires_at,
        "region": state.region(),
    })
}

fn with_outcome(state: &AppState, status: StatusCode, outcome: &str, r: &Reservation) -> Response {
    (
        status,
        Json(json!({"outcome": outcome, "reservation": reservation_json(state, r)})),
    )
        .into_response()
}

fn outcome_only(status: StatusCode, outcome: &str) -> Response {
    (status, Json(json!({"outcome": outcome}))).into_response()
}

/// An existing key: its reservation if it matches the request, else KEY_REUSED.
fn replay_or_reused(
    state: &AppState,
    r: &Reservation,
    user: &UserId,
    sku: &Sku,
    qty: Qty,
) -> Response {
    if &r.user_id == user && &r.sku == sku && r.qty == qty {
        metrics::counter!("escrow_reservations_total", "outcome" => "REPLAY").increment(1);
        with_outcome(state, StatusCode::OK, "REPLAY", r)
    } else {
        metrics::counter!("escrow_reservations_total", "outcome" => "KEY_REUSED").increment(1);
        outcome_only(StatusCode::UNPROCESSABLE_ENTITY, "KEY_REUSED")
    }
}

fn enqueue(handle: &OwnerHandle, command: Command) -> Result<(), ApiError> {
    handle.queue.try_send(command).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => {
            metrics::counter!("escrow_reservations_total", "outcome" => "REJECTED_QUEUE_FULL")
                .increment(1);
            ApiError::QueueFull
        }
        mpsc::error::TrySendError::Closed(_) => ApiError::Paused,
    })
}

/// `POST /v1/reservations`.
pub async fn reserve(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ReserveBody>,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&body.request_key).map_err(bad)?;
    let user = UserId::parse(&body.user_id).map_err(bad)?;
    let sku = Sku::parse(&body.sku).map_err(bad)?;
    let raw_qty = body.qty.unwrap_or(1);
    if raw_qty < 1 {
        return Err(bad("qty must be a positive integer"));
    }
    let ttl = body.ttl_ms.map(TtlMs::parse).transpose().map_err(bad)?;
    let handle = state
        .registry()
        .get(&tenant, &sku)
        .ok_or(ApiError::UnknownSku)?;
    let view = &handle.view;
    let qty = Qty::parse(raw_qty, view.settings().max_per_user).map_err(bad)?;

    if state.keys().contains(&tenant, &key) {
        let existing = state.store().reservation(&tenant, &key).await?;
        if let Some(r) = existing {
            return Ok(replay_or_reused(&state, &r, &user, &sku, qty));
        }
    }
    let link_down = state.link().is_some_and(|l| l.is_down());
    if let Some(reply) = gate(&view.gate_view(link_down), qty.units()) {
        metrics::counter!("escrow_reservations_total", "outcome" => reply.outcome()).increment(1);
        return match reply {
            ReserveReply::SoldOut => Ok(outcome_only(StatusCode::CONFLICT, reply.outcome())),
            _ => Err(ApiError::Paused),
        };
    }
    let deadline = Deadline::after(state.now_ms(), state.wait_timeout_ms());
    let (tx, rx) = oneshot::channel();
    let request = ReserveRequest {
        request_key: key,
        user_id: user,
        qty,
        ttl,
    };
    enqueue(&handle, Command::Reserve(request, deadline, tx))?;
    // The owner answers every queued request; a dropped sender means it stopped.
    let reply = rx.await.map_err(|_| ApiError::Paused)?;
    let outcome = reply.outcome();
    Ok(match reply {
        ReserveReply::Held(r) => with_outcome(&state, StatusCode::CREATED, outcome, &r),
        ReserveReply::Replay(r) => with_outcome(&state, StatusCode::OK, outcome, &r),
        ReserveReply::SoldOut | ReserveReply::UserLimit => {
            outcome_only(StatusCode::CONFLICT, outcome)
        }
        ReserveReply::KeyReused => outcome_only(StatusCode::UNPROCESSABLE_ENTITY, outcome),
        ReserveReply::Paused => return Err(ApiError::Paused),
        ReserveReply::WaitTimeout => return Err(ApiError::WaitTimeout),
    })
}

/// `GET /v1/reservations/{request_key}`.
pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&key).map_err(bad)?;
    let r = state
        .store()
        .reservation(&tenant, &key)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(reservation_json(&state, &r)).into_response())
}

async fn act(
    state: AppState,
    headers: HeaderMap,
    key: String,
    action: Action,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&key).map_err(bad)?;
    // Every committed key is in memory with its SKU; the row is read only
    // for a key memory does not know, which then is most likely unknown.
    let sku = match state.keys().sku_of(&tenant, &key) {
        Some(sku) => sku,
        None => state
            .store()
            .reservation(&tenant, &key)
            .await?
            .map(|r| Arc::new(r.sku))
            .ok_or(ApiError::NotFound)?,
    };
    let handle = state
        .registry()
        .get(&tenant, &sku)
        .ok_or(ApiError::NotFound)?;
    let deadline = Deadline::after(state.now_ms(), state.wait_timeout_ms());
    let (tx, rx) = oneshot::channel();
    enqueue(&handle, Command::Act(key, action, deadline, tx))?;
    let reply = rx.await.map_err(|_| ApiError::Paused)?;
    Ok(match reply {
        ActReply::Accepted(r) => Json(reservation_json(&state, &r)).into_response(),
        ActReply::Refused(r) => {
            (StatusCode::CONFLICT, Json(reservation_json(&state, &r))).into_response()
        }
        ActReply::NotFound => return Err(ApiError::NotFound),
        ActReply::Paused => return Err(ApiError::Paused),
        ActReply::WaitTimeout => return Err(ApiError::WaitTimeout),
    })
}

/// `POST /v1/reservations/{request_key}/confirm`.
pub async fn confirm(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    act(state, headers, key, Action::Confirm).await
}

/// `POST /v1/reservations/{request_key}/release`.
pub async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Result<Response, ApiError> {
    act(state, headers, key, Action::Release).await
}

/// `POST /v1/reservations/{request_key}/extend`.
pub async fn extend(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key): Path<String>,
    OptionalJsonBody(body): OptionalJsonBody<ExtendBody>,
) -> Result<Response, ApiError> {
    let ttl = body
        .and_then(|b| b.ttl_ms)
        .map(TtlMs::parse)
        .transpose()
        .map_err(bad)?;
    act(state, headers, key, Action::Extend(ttl)).await
}

/// `GET /v1/skus/{sku}`: from memory, cacheable for a second.
pub async fn sku_status(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(sku): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let sku = Sku::parse(&sku).map_err(bad)?;
    let handle = state
        .registry()
        .get(&tenant, &sku)
        .ok_or(ApiError::UnknownSku)?;
    let available = handle.view.available();
    let sold_out =
        available == 0 && (state.link().is_none() || handle.view.is_sold_out_everywhere());
    Ok((
        [(header::CACHE_CONTROL, "public, max-age=1")],
        Json(json!({"sku": sku, "available": available, "sold_out": sold_out})),
    )
        .into_response())
}
