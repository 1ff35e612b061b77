//! The cart API: hold several SKUs together, look a cart up, and confirm,
//! release or extend all its items at once.
//!
//! Handlers validate; the cart's decisions are its items' owners' and its
//! writes one transaction's ([`crate::carts`]).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use escrow_core::cart::{checked_items, CartAction, CartItem, ITEMS_MAX};
use escrow_core::{Qty, RequestKey, Sku, Tenant, TtlMs, UserId};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::admin::admin_only;
use super::bodies::{CartBody, CartOutcome, CartRefusal, NotFoundBody, Outcome, OutcomeBody};
use super::buyer::{bad, tenant_of};
use super::error::ApiError;
use super::failures::{ActFailures, AdminReadFailures, BuyerReadFailures};
use super::json::{JsonBody, OptionalJsonBody};
use crate::carts::{self, ActReply, HoldReply, HoldRequest};
use crate::owner::ReserveReply;
use crate::state::AppState;

/// One item of `POST /v1/carts`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CartItemRequest {
    /// The SKU, of the key's tenant.
    #[schema(
        pattern = "^[A-Za-z0-9._:-]{1,128}$",
        min_length = 1,
        max_length = 128,
        example = "ticket"
    )]
    sku: String,
    /// Units, 1..=the SKU's `max_per_user`; default 1.
    #[schema(minimum = 1)]
    qty: Option<i64>,
}

/// `POST /v1/carts` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CartRequestBody {
    /// The idempotency key, one space with reservations' keys: a retry
    /// with the same key is answered REPLAY.
    #[schema(
        pattern = "^[A-Za-z0-9._:-]{1,128}$",
        min_length = 1,
        max_length = 128,
        example = "cart-1"
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
    /// 1 to 20 distinct SKUs, held all or nothing.
    #[schema(min_items = 1, max_items = 20)]
    items: Vec<CartItemRequest>,
    /// Hold duration; default the shortest `hold_ttl_ms` of its SKUs.
    #[schema(minimum = 1000, maximum = 3_600_000)]
    ttl_ms: Option<i64>,
}

/// `POST /v1/carts/{request_key}/extend` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CartExtendBody {
    /// The new hold duration from now; default the shortest `hold_ttl_ms`
    /// of its SKUs.
    #[schema(minimum = 1000, maximum = 3_600_000)]
    ttl_ms: Option<i64>,
}

/// The path `/v1/carts/{request_key}[/...]`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CartPath {
    /// The cart's idempotency key
    #[param(example = json!("cart-1"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    request_key: String,
}

/// The path `/v1/admin/carts/{tenant}/{request_key}`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AdminCartPath {
    /// The cart's tenant
    #[param(example = json!("acme"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    tenant: String,
    /// The cart's idempotency key
    #[param(example = json!("cart-1"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    request_key: String,
}

/// C of `tenant`'s cart `key`, as committed, or 404.
async fn cart_json(
    state: &AppState,
    tenant: &Tenant,
    key: &RequestKey,
) -> Result<Response, ApiError> {
    let cart = state
        .store()
        .cart(tenant, key)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(CartBody::new(&cart, state.region().as_str())).into_response())
}

fn cart_outcome(
    state: &AppState,
    status: StatusCode,
    outcome: Outcome,
    cart: &escrow_core::cart::Cart,
) -> Response {
    let body = CartOutcome {
        outcome,
        cart: CartBody::new(cart, state.region().as_str()),
    };
    (status, Json(body)).into_response()
}

fn item_refused(status: StatusCode, outcome: Outcome, sku: &Sku) -> Response {
    let body = CartRefusal {
        outcome,
        sku: sku.clone(),
    };
    (status, Json(body)).into_response()
}

/// The request's items, checked: each SKU this tenant's, each qty within
/// its SKU's `max_per_user`; and the cart's hold duration.
fn parse_items(
    state: &AppState,
    tenant: &Tenant,
    body: &CartRequestBody,
) -> Result<Result<(Vec<CartItem>, TtlMs), Response>, ApiError> {
    if body.items.len() > ITEMS_MAX {
        return Err(bad(format!("a cart holds at most {ITEMS_MAX} items")));
    }
    let mut raw = Vec::with_capacity(body.items.len());
    for item in &body.items {
        let sku = Sku::parse(&item.sku).map_err(bad)?;
        let qty = item.qty.unwrap_or(1);
        if qty < 1 {
            return Err(bad("qty must be a positive integer"));
        }
        raw.push((sku, qty));
    }
    // Checked before their SKUs are looked up: an empty cart or a SKU twice
    // is malformed whatever the SKUs are.
    let shape: Vec<CartItem> = raw
        .iter()
        .map(|(sku, _)| CartItem {
            sku: sku.clone(),
            qty: Qty::from_stored(1),
        })
        .collect();
    checked_items(shape).map_err(bad)?;
    let ttl = body.ttl_ms.map(TtlMs::parse).transpose().map_err(bad)?;
    let mut items = Vec::with_capacity(raw.len());
    let mut shortest: Option<TtlMs> = None;
    for (sku, qty) in raw {
        let Some(handle) = state.registry().get(tenant, &sku) else {
            metrics::counter!("escrow_carts_total", "outcome" => "UNKNOWN_SKU").increment(1);
            return Ok(Err(item_refused(
                StatusCode::NOT_FOUND,
                Outcome::UnknownSku,
                &sku,
            )));
        };
        let settings = handle.view.settings();
        let qty = Qty::parse(qty, settings.max_per_user).map_err(bad)?;
        shortest = Some(shortest.map_or(settings.hold_ttl, |t| t.min(settings.hold_ttl)));
        items.push(CartItem { sku, qty });
    }
    let items = checked_items(items).map_err(bad)?;
    let ttl = ttl.or(shortest).expect("a checked cart has an item");
    Ok(Ok((items, ttl)))
}

/// `POST /v1/carts`.
#[utoipa::path(
    post,
    path = "/v1/carts",
    tag = "buyer",
    request_body = CartRequestBody,
    responses(
        (status = 201, description = "`HELD`: every item held, in one commit", body = CartOutcome, links(("GetCart" = (operation_id = "get_cart", parameters(("request_key" = "$response.body#/cart/request_key")))), ("ConfirmCart" = (operation_id = "confirm_cart", parameters(("request_key" = "$response.body#/cart/request_key")))), ("ReleaseCart" = (operation_id = "release_cart", parameters(("request_key" = "$response.body#/cart/request_key")))), ("ExtendCart" = (operation_id = "extend_cart", parameters(("request_key" = "$response.body#/cart/request_key")))))),
        (status = 200, description = "`REPLAY`: this key's cart; its current state", body = CartOutcome),
        (status = 400, description = "`BAD_REQUEST`: malformed body, an empty cart, a SKU twice, more than 20 items, a bad qty; nothing written", body = OutcomeBody),
        (status = 401, description = "`UNAUTHORIZED`: missing or wrong tenant key", body = OutcomeBody),
        (status = 404, description = "`UNKNOWN_SKU` naming the item: no such SKU for this tenant", body = CartRefusal),
        (status = 409, description = "`SOLD_OUT` or `USER_LIMIT` naming an item that could not be held; nothing held", body = CartRefusal),
        (status = 422, description = "`KEY_REUSED`: the key has a cart for another user or other items, or a reservation", body = OutcomeBody),
        (status = 503, description = "`PAUSED` with `reason`, `REJECTED_QUEUE_FULL` or `REJECTED_WAIT_TIMEOUT`, as for a reservation; nothing held", body = OutcomeBody, headers(("Retry-After" = u32, description = "Always 1"))),
    ),
    security(("bearer" = []))
)]
pub async fn hold(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CartRequestBody>,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&body.request_key).map_err(bad)?;
    let user_id = UserId::parse(&body.user_id).map_err(bad)?;
    let (items, ttl) = match parse_items(&state, &tenant, &body)? {
        Ok(parsed) => parsed,
        Err(unknown) => return Ok(unknown),
    };
    let request = HoldRequest {
        key,
        user_id,
        items,
        ttl,
    };
    let named = request.items.clone();
    let reply = carts::hold(state.clone(), tenant, request).await;
    let outcome = match &reply {
        HoldReply::Held(_) => "HELD",
        HoldReply::Replay(_) => "REPLAY",
        HoldReply::SoldOut(_) => "SOLD_OUT",
        HoldReply::UserLimit(_) => "USER_LIMIT",
        HoldReply::KeyReused => "KEY_REUSED",
        HoldReply::Refused(refused) => refused.outcome(),
    };
    if !matches!(reply, HoldReply::Held(_)) {
        metrics::counter!("escrow_carts_total", "outcome" => outcome).increment(1);
    }
    Ok(match reply {
        HoldReply::Held(cart) => cart_outcome(&state, StatusCode::CREATED, Outcome::Held, &cart),
        HoldReply::Replay(cart) => cart_outcome(&state, StatusCode::OK, Outcome::Replay, &cart),
        HoldReply::SoldOut(i) => {
            item_refused(StatusCode::CONFLICT, Outcome::SoldOut, &named[i].sku)
        }
        HoldReply::UserLimit(i) => {
            item_refused(StatusCode::CONFLICT, Outcome::UserLimit, &named[i].sku)
        }
        HoldReply::KeyReused => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(OutcomeBody::of(Outcome::KeyReused)),
        )
            .into_response(),
        HoldReply::Refused(ReserveReply::Paused(reason)) => return Err(ApiError::Paused(reason)),
        HoldReply::Refused(ReserveReply::QueueFull) => return Err(ApiError::QueueFull),
        HoldReply::Refused(ReserveReply::WaitTimeout) => return Err(ApiError::WaitTimeout),
        HoldReply::Refused(other) => {
            return Err(ApiError::Internal(format!(
                "a cart's item was answered {}",
                other.outcome()
            )))
        }
    })
}

/// `GET /v1/carts/{request_key}`.
#[utoipa::path(
    get,
    path = "/v1/carts/{request_key}",
    operation_id = "get_cart",
    tag = "buyer",
    params(CartPath),
    responses(
        (status = 200, description = "C, as committed", body = CartBody),
        (status = 400, description = "`BAD_REQUEST`: malformed key", body = OutcomeBody),
        (status = 404, description = "No committed cart has this key for this tenant", body = NotFoundBody),
        BuyerReadFailures,
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<CartPath>,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&path.request_key).map_err(bad)?;
    cart_json(&state, &tenant, &key).await
}

async fn act(
    state: AppState,
    headers: HeaderMap,
    path: CartPath,
    action: CartAction,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&state, &headers)?;
    let key = RequestKey::parse(&path.request_key).map_err(bad)?;
    let body = |cart| Json(CartBody::new(cart, state.region().as_str()));
    Ok(
        match carts::act(&state, &tenant, &key, Some(action)).await {
            ActReply::Accepted(cart) => body(&cart).into_response(),
            ActReply::Refused(cart) => (StatusCode::CONFLICT, body(&cart)).into_response(),
            ActReply::NotFound => return Err(ApiError::NotFound),
            ActReply::Paused(reason) => return Err(ApiError::Paused(reason)),
        },
    )
}

/// `POST /v1/carts/{request_key}/confirm`.
#[utoipa::path(
    post,
    path = "/v1/carts/{request_key}/confirm",
    operation_id = "confirm_cart",
    tag = "buyer",
    params(CartPath),
    responses(
        (status = 200, description = "C with `SOLD`, every item (also if it already was)", body = CartBody),
        (status = 409, description = "C with `EXPIRED` or `RELEASED`", body = CartBody),
        ActFailures,
    ),
    security(("bearer" = []))
)]
pub async fn confirm(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<CartPath>,
) -> Result<Response, ApiError> {
    act(state, headers, path, CartAction::Confirm).await
}

/// `POST /v1/carts/{request_key}/release`.
#[utoipa::path(
    post,
    path = "/v1/carts/{request_key}/release",
    operation_id = "release_cart",
    tag = "buyer",
    params(CartPath),
    responses(
        (status = 200, description = "C with `RELEASED`, or `EXPIRED` if it had expired: every item's units back once", body = CartBody),
        (status = 409, description = "C with `SOLD`", body = CartBody),
        ActFailures,
    ),
    security(("bearer" = []))
)]
pub async fn release(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<CartPath>,
) -> Result<Response, ApiError> {
    act(state, headers, path, CartAction::Release).await
}

/// `POST /v1/carts/{request_key}/extend`.
#[utoipa::path(
    post,
    path = "/v1/carts/{request_key}/extend",
    operation_id = "extend_cart",
    tag = "buyer",
    params(CartPath),
    request_body(content = Option<CartExtendBody>, description = "Optional; an empty body needs no Content-Type"),
    responses(
        (status = 200, description = "C with the new `expires_at`, every item", body = CartBody),
        (status = 409, description = "C: already extended, expired, sold or released", body = CartBody),
        ActFailures,
    ),
    security(("bearer" = []))
)]
pub async fn extend(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<CartPath>,
    OptionalJsonBody(body): OptionalJsonBody<CartExtendBody>,
) -> Result<Response, ApiError> {
    let ttl = body
        .and_then(|b| b.ttl_ms)
        .map(TtlMs::parse)
        .transpose()
        .map_err(bad)?;
    act(state, headers, path, CartAction::Extend(ttl)).await
}

/// `GET /v1/admin/carts/{tenant}/{request_key}`: a tenant's cart, for an
/// operator (`escrowctl cart show`), in any mode.
#[utoipa::path(
    get,
    path = "/v1/admin/carts/{tenant}/{request_key}",
    operation_id = "admin_get_cart",
    tag = "admin",
    params(AdminCartPath),
    responses(
        (status = 200, description = "C, as committed", body = CartBody),
        (status = 400, description = "`BAD_REQUEST`: bad identifier", body = OutcomeBody),
        (status = 404, description = "No committed cart has this key for this tenant", body = NotFoundBody),
        AdminReadFailures,
    ),
    security(("bearer" = []))
)]
pub async fn admin_get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(path): Path<AdminCartPath>,
) -> Result<Response, ApiError> {
    admin_only(&state, &headers)?;
    let tenant = Tenant::parse(&path.tenant).map_err(bad)?;
    let key = RequestKey::parse(&path.request_key).map_err(bad)?;
    cart_json(&state, &tenant, &key).await
}
