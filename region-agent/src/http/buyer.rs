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
use escrow_core::{
    Deadline, Qty, RequestKey, Reservation, Sku, Tenant, TtlMs, UserId, UserLimitScope,
};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};
use utoipa::{IntoParams, ToSchema};

use super::bodies::{
    NotFoundBody, Outcome, OutcomeBody, ReservationBody, ReservationOutcome, SkuStatusBody,
};
use super::error::ApiError;
use super::failures::{ActFailures, BuyerReadFailures};
use super::json::{JsonBody, OptionalJsonBody};
use crate::borrows::{place, Place};
use crate::owner::{
    ActReply, Action, Command, OwnerHandle, PauseReason, ReserveReply, ReserveRequest,
};
use crate::state::AppState;

/// `POST /v1/reservations` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    /// The idempotency key: a retry with the same key is answered REPLAY.
    #[schema(
        pattern = "^[A-Za-z0-9._:-]{1,128}$",
        min_length = 1,
        max_length = 128,
        example = "order-1"
    )]
    request_key: String,
    /// The buyer.
    #[schema(
        pattern = "^[A-Za-z0-9._:-]{1,128}$",
        min_length = 1,
        max_length = 128,
        example = "alice"
    )]
    user_id: String,
    /// The SKU, of the key's tenant.
    #[schema(
        pattern = "^[A-Za-z0-9._:-]{1,128}$",
        min_length = 1,
        max_length = 128,
        example = "drop"
    )]
    sku: String,
    /// Units, 1..=the SKU's `max_per_user`; default 1.
    #[schema(minimum = 1)]
    qty: Option<i64>,
    /// Hold duration; default the SKU's `hold_ttl_ms`.
    #[schema(minimum = 1000, maximum = 3_600_000)]
    ttl_ms: Option<i64>,
}

/// `POST /v1/reservations/{request_key}/extend` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    /// The new hold duration from now; default the SKU's `hold_ttl_ms`.
    #[schema(minimum = 1000, maximum = 3_600_000)]
    ttl_ms: Option<i64>,
}

/// The path `/v1/reservations/{request_key}[/...]`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    /// The reservation's idempotency key
    #[param(example = json!("order-1"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    request_key: String,
}

pub(super) fn bad(e: impl ToString) -> ApiError {
    ApiError::BadRequest(e.to_string())
}

/// The caller's tenant, from its key.
pub(super) fn tenant_of(state: &AppState, headers: &HeaderMap) -> Result<Tenant, ApiError> {
    state.auth().tenant(headers).ok_or(ApiError::Unauthorized)
}

/// The contract's reservation body R.
fn reservation_json(state: &AppState, r: &Reservation) -> Json<ReservationBody> {
    Json(ReservationBody::new(r, state.region().as_str()))
}

fn with_outcome(
    state: &AppState,
    status: StatusCode,
    outcome: Outcome,
    r: &Reservation,
) -> Response {
    let body = ReservationOutcome {
        outcome,
        reservation: ReservationBody::new(r, state.region().as_str()),
    };
    (status, Json(body)).into_response()
}

fn outcome_only(status: StatusCode, outcome: Outcome) -> Response {
    (status, Json(OutcomeBody::of(outcome))).into_response()
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
        with_outcome(state, StatusCode::OK, Outcome::Replay, r)
    } else {
        metrics::counter!("escrow_reservations_total", "outcome" => "KEY_REUSED").increment(1);
        outcome_only(StatusCode::UNPROCESSABLE_ENTITY, Outcome::KeyReused)
    }
}

fn enqueue(handle: &OwnerHandle, command: Command) -> Result<(), ApiError> {
    handle.queue.try_send(command).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => {
            metrics::counter!("escrow_reservations_total", "outcome" => "REJECTED_QUEUE_FULL")
                .increment(1);
            ApiError::QueueFull
        }
        mpsc::error::TrySendError::Closed(_) => ApiError::Paused(PauseReason::Halted),
    })
}

/// `POST /v1/reservations`.
#[utoipa::path(
    post,
    path = "/v1/reservations",
    tag = "buyer",
    request_body = ReserveBody,
    responses(
        (status = 201, description = "`HELD`: a new hold, committed", body = ReservationOutcome, links(("GetReservation" = (operation_id = "get_reservation", parameters(("request_key" = "$response.body#/reservation/request_key")))), ("Confirm" = (operation_id = "confirm", parameters(("request_key" = "$response.body#/reservation/request_key")))), ("Release" = (operation_id = "release", parameters(("request_key" = "$response.body#/reservation/request_key")))), ("Extend" = (operation_id = "extend", parameters(("request_key" = "$response.body#/reservation/request_key")))))),
        (status = 200, description = "`REPLAY`: this key exists; its current state", body = ReservationOutcome),
        (status = 400, description = "`BAD_REQUEST`: malformed body or field; nothing written", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: missing or wrong tenant key", body = OutcomeBody),
        (status = 404, description = "`UNKNOWN_SKU`: no such SKU for this tenant", body = OutcomeBody),
        (status = 409, description = "`SOLD_OUT` or `USER_LIMIT`; nothing written", body = OutcomeBody),
        (status = 422, description = "`KEY_REUSED`: the key has a reservation for another user, SKU or qty, or a cart", body = OutcomeBody),
        (status = 500, description = "`INTERNAL`: the read of a known key failed; details logged only", body = OutcomeBody),
        (status = 503, description = "`PAUSED` with `reason`: `admin_pause` (paused by an admin), `halted` (drift, fencing, reload), `coordinator_unreachable` (a take failed, the link is down) or `storage` (a commit or read failed); `REJECTED_QUEUE_FULL` (the owner's queue or its list of buyers waiting for units is full) or `REJECTED_WAIT_TIMEOUT`", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
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

    if state.keys().may_know(&tenant, &key) {
        let existing = state.store().reservation(&tenant, &key).await?;
        if let Some(r) = existing {
            return Ok(replay_or_reused(&state, &r, &user, &sku, qty));
        }
        // Keys are one space for reservations and carts.
        if state.store().cart(&tenant, &key).await?.is_some() {
            metrics::counter!("escrow_reservations_total", "outcome" => "KEY_REUSED").increment(1);
            return Ok(outcome_only(
                StatusCode::UNPROCESSABLE_ENTITY,
                Outcome::KeyReused,
            ));
        }
    }
    let link_down = state.link().is_some_and(|l| l.is_down());
    if let Some(reply) = gate(&view.gate_view(link_down), qty.units()) {
        metrics::counter!("escrow_reservations_total", "outcome" => reply.outcome()).increment(1);
        return match reply {
            ReserveReply::SoldOut => Ok(outcome_only(StatusCode::CONFLICT, Outcome::SoldOut)),
            ReserveReply::Paused(reason) => Err(ApiError::Paused(reason)),
            other => Err(ApiError::Internal(format!(
                "the gate answered {}",
                other.outcome()
            ))),
        };
    }
    let asked = Asked {
        tenant,
        key,
        user,
        sku,
        qty,
        ttl,
    };
    if view.settings().user_limit_scope == UserLimitScope::Global && state.link().is_some() {
        // A place borrowed for this request must go home unless it is
        // held: in a task of its own, so a client that goes away strands
        // no place.
        return tokio::spawn(decide(state, handle, asked))
            .await
            .map_err(|_| ApiError::Paused(PauseReason::Halted))?;
    }
    decide(state, handle, asked).await
}

/// A reserve request past its checks and the gate.
struct Asked {
    tenant: Tenant,
    key: RequestKey,
    user: UserId,
    sku: Sku,
    qty: Qty,
    ttl: Option<TtlMs>,
}

/// Has `asked` decided by its SKU's owner, on a place borrowed from the
/// user's home region when the SKU's per-user limit is global and the user
/// is at home elsewhere; the borrow goes home unless the hold is made.
async fn decide(state: AppState, handle: OwnerHandle, asked: Asked) -> Result<Response, ApiError> {
    let borrow = match place(
        &state,
        &handle.view,
        &asked.tenant,
        &asked.sku,
        &asked.user,
        &asked.key,
    )
    .await
    {
        Ok(Place::Here) => None,
        Ok(Place::Borrowed(id)) => Some(id),
        Ok(Place::Taken) => match state.store().reservation(&asked.tenant, &asked.key).await? {
            Some(r) => {
                return Ok(replay_or_reused(
                    &state,
                    &r,
                    &asked.user,
                    &asked.sku,
                    asked.qty,
                ))
            }
            None => {
                metrics::counter!("escrow_reservations_total", "outcome" => "USER_LIMIT")
                    .increment(1);
                return Ok(outcome_only(StatusCode::CONFLICT, Outcome::UserLimit));
            }
        },
        Err(reason) => return Err(ApiError::Paused(reason)),
    };
    let deadline = Deadline::after(state.now_ms(), state.wait_timeout_ms());
    let (tx, rx) = oneshot::channel();
    let request = ReserveRequest {
        borrow: borrow.clone(),
        request_key: asked.key,
        user_id: asked.user,
        qty: asked.qty,
        ttl: asked.ttl,
    };
    let queued = enqueue(&handle, Command::Reserve(request, deadline, tx));
    // The owner answers every queued request; a dropped sender means it stopped.
    let reply = match queued {
        Ok(()) => rx.await.ok(),
        Err(_) => None,
    };
    if let Some(id) = borrow.filter(|_| !matches!(reply, Some(ReserveReply::Held(_)))) {
        state.borrows().give_back(&state, &id).await?;
    }
    queued?;
    let reply = reply.ok_or(ApiError::Paused(PauseReason::Halted))?;
    Ok(match reply {
        ReserveReply::Held(r) => with_outcome(&state, StatusCode::CREATED, Outcome::Held, &r),
        ReserveReply::Replay(r) => with_outcome(&state, StatusCode::OK, Outcome::Replay, &r),
        ReserveReply::SoldOut => outcome_only(StatusCode::CONFLICT, Outcome::SoldOut),
        ReserveReply::UserLimit => outcome_only(StatusCode::CONFLICT, Outcome::UserLimit),
        ReserveReply::KeyReused => {
            outcome_only(StatusCode::UNPROCESSABLE_ENTITY, Outcome::KeyReused)
        }
        ReserveReply::Paused(reason) => return Err(ApiError::Paused(reason)),
        ReserveReply::QueueFull => return Err(ApiError::QueueFull),
        ReserveReply::WaitTimeout => return Err(ApiError::WaitTimeout),
    })
}

/// `GET /v1/reservations/{request_key}`.
#[utoipa::path(
    get,
    path = "/v1/reservations/{request_key}",
    operation_id = "get_reservation",
    tag = "buyer",
    params(KeyPath),
    responses(
        (status = 200, description = "R, as committed", body = ReservationBody),
        (status = 400, description = "`BAD_REQUEST`: malformed key", body = OutcomeBody),
        (status = 404, description = "No committed reservation has this key for this tenant", body = NotFoundBody),
        (status = 500, description = "`INTERNAL`: the read failed; details logged only", body = OutcomeBody),
        BuyerReadFailures,
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<KeyPath>,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&path.request_key).map_err(bad)?;
    let r = state
        .store()
        .reservation(&tenant, &key)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(reservation_json(&state, &r).into_response())
}

async fn act(
    state: AppState,
    headers: HeaderMap,
    path: KeyPath,
    action: Action,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&path.request_key).map_err(bad)?;
    // Keys of the idempotency window are in memory with their SKU; the row
    // is read only for a key memory does not hold (older, or unknown).
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
    let reply = rx
        .await
        .map_err(|_| ApiError::Paused(PauseReason::Halted))?;
    Ok(match reply {
        ActReply::Accepted(r) => reservation_json(&state, &r).into_response(),
        ActReply::Refused(r) => {
            (StatusCode::CONFLICT, reservation_json(&state, &r)).into_response()
        }
        ActReply::NotFound => return Err(ApiError::NotFound),
        ActReply::Paused(reason) => return Err(ApiError::Paused(reason)),
        ActReply::WaitTimeout => return Err(ApiError::WaitTimeout),
    })
}

/// `POST /v1/reservations/{request_key}/confirm`.
#[utoipa::path(
    post,
    path = "/v1/reservations/{request_key}/confirm",
    tag = "buyer",
    params(KeyPath),
    responses(
        (status = 200, description = "R with `SOLD` (also if it already was)", body = ReservationBody),
        (status = 409, description = "R with `EXPIRED` or `RELEASED`", body = ReservationBody),
        ActFailures,
    ),
    security(("bearer" = []))
)]
pub async fn confirm(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<KeyPath>,
) -> Result<Response, ApiError> {
    act(state, headers, path, Action::Confirm).await
}

/// `POST /v1/reservations/{request_key}/release`.
#[utoipa::path(
    post,
    path = "/v1/reservations/{request_key}/release",
    tag = "buyer",
    params(KeyPath),
    responses(
        (status = 200, description = "R with `RELEASED`, or `EXPIRED` if it had expired", body = ReservationBody),
        (status = 409, description = "R with `SOLD`", body = ReservationBody),
        ActFailures,
    ),
    security(("bearer" = []))
)]
pub async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<KeyPath>,
) -> Result<Response, ApiError> {
    act(state, headers, path, Action::Release).await
}

/// `POST /v1/reservations/{request_key}/extend`.
#[utoipa::path(
    post,
    path = "/v1/reservations/{request_key}/extend",
    tag = "buyer",
    params(KeyPath),
    request_body(content = Option<ExtendBody>, description = "Optional; an empty body needs no Content-Type"),
    responses(
        (status = 200, description = "R with the new `expires_at`", body = ReservationBody),
        (status = 409, description = "R: already extended, expired, sold or released", body = ReservationBody),
        ActFailures,
    ),
    security(("bearer" = []))
)]
pub async fn extend(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<KeyPath>,
    OptionalJsonBody(body): OptionalJsonBody<ExtendBody>,
) -> Result<Response, ApiError> {
    let ttl = body
        .and_then(|b| b.ttl_ms)
        .map(TtlMs::parse)
        .transpose()
        .map_err(bad)?;
    act(state, headers, path, Action::Extend(ttl)).await
}

/// `GET /v1/skus/{sku}`: from memory, cacheable for a second.
#[utoipa::path(
    get,
    path = "/v1/skus/{sku}",
    tag = "buyer",
    params(("sku" = String, Path, description = "The SKU, of the key's tenant", example = json!("drop"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)),
    responses(
        (status = 200, description = "This region's units, from memory", body = SkuStatusBody, headers(("Cache-Control" = String, description = "`public, max-age=1`"))),
        (status = 400, description = "`BAD_REQUEST`: malformed SKU", body = OutcomeBody),
        (status = 404, description = "`UNKNOWN_SKU`: no such SKU for this tenant", body = OutcomeBody),
        BuyerReadFailures,
    ),
    security(("bearer" = []))
)]
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
        Json(SkuStatusBody {
            sku,
            available,
            sold_out,
        }),
    )
        .into_response())
}
