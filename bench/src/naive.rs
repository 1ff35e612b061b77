//! The naive baseline: one PostgreSQL transaction per sale.
//!
//! This is what the source article calls doing one database right, and what
//! most users would build first: per request, `BEGIN`, insert the
//! reservation row (the primary key judges idempotency, a partial unique
//! index the one-active-per-user rule), then the single conditional
//! `UPDATE ... SET available = available - qty WHERE id = $1 AND available >= qty`
//! on the hot row, touched last, then `COMMIT`. Every sale holds the hot
//! row's lock through its own commit and log flush, so sales on one SKU run
//! one after another; that ceiling is what the agent's group commit lifts.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post, put};
use axum::Router;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::wire;

/// The naive server's tables. Its own database, never the agent's.
pub const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS naive_stock (
        id        text PRIMARY KEY,
        available bigint NOT NULL CHECK (available >= 0)
    );
    CREATE TABLE IF NOT EXISTS naive_reservations (
        tenant      text NOT NULL,
        request_key text NOT NULL,
        sku         text NOT NULL,
        user_id     text NOT NULL,
        qty         integer NOT NULL CHECK (qty >= 1),
        status      text NOT NULL CHECK (status IN ('HELD', 'SOLD', 'RELEASED', 'EXPIRED')),
        expires_at  timestamptz NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant, request_key)
    );
    CREATE UNIQUE INDEX IF NOT EXISTS naive_one_active_per_user
        ON naive_reservations (tenant, sku, user_id) WHERE status IN ('HELD', 'SOLD');
";

/// The naive server's state.
#[derive(Debug, Clone)]
pub struct Naive {
    /// Its database.
    pub pool: PgPool,
    /// The tenant it sells for.
    pub tenant: String,
    /// The tenant's buyer API key.
    pub tenant_key: String,
    /// The admin token for `PUT /v1/admin/skus/...`.
    pub admin_token: String,
}

/// Creates the naive server's tables if they do not exist.
pub async fn prepare(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(SCHEMA).execute(pool).await?;
    Ok(())
}

/// The naive server's router: reserve, create a SKU, health.
pub fn app(naive: Naive) -> Router {
    Router::new()
        .route("/v1/reservations", post(reserve))
        .route("/v1/admin/skus/{tenant}/{sku}", put(put_sku))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(naive)
}

/// The stock row's id of a tenant's SKU.
pub fn stock_id(tenant: &str, sku: &str) -> String {
    format!("{tenant}/{sku}")
}

fn internal(error: sqlx::Error) -> Response {
    tracing::warn!(%error, "naive: database error");
    wire::outcome(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL")
}

async fn readyz(State(naive): State<Naive>) -> Response {
    match sqlx::query("SELECT 1").execute(&naive.pool).await {
        Ok(_) => wire::outcome(StatusCode::OK, "READY"),
        Err(e) => internal(e),
    }
}

async fn put_sku(
    State(naive): State<Naive>,
    headers: HeaderMap,
    Path((tenant, sku)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    if !wire::has_bearer(&headers, &naive.admin_token) {
        return wire::outcome(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    }
    let body: wire::PutSkuBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => return wire::bad_request(format!("invalid JSON body: {e}")),
    };
    if body.total < 0 {
        return wire::bad_request("total must be at least 0".into());
    }
    let result = sqlx::query(
        "INSERT INTO naive_stock (id, available) VALUES ($1, $2)
         ON CONFLICT (id) DO UPDATE SET available = EXCLUDED.available",
    )
    .bind(stock_id(&tenant, &sku))
    .bind(body.total)
    .execute(&naive.pool)
    .await;
    match result {
        Ok(_) => wire::outcome(StatusCode::CREATED, "CREATED"),
        Err(e) => internal(e),
    }
}

async fn reserve(State(naive): State<Naive>, headers: HeaderMap, body: Bytes) -> Response {
    if !wire::has_bearer(&headers, &naive.tenant_key) {
        return wire::outcome(StatusCode::UNAUTHORIZED, "UNAUTHORIZED");
    }
    let reserve = match crate::ceiling::parse_reserve(&headers, &body) {
        Ok(reserve) => reserve,
        Err(error) => return wire::bad_request(error),
    };
    let now_ms = wire::now_ms();
    match sell(&naive, &reserve, now_ms).await {
        Ok(Sale::Held) => wire::held(&reserve, now_ms),
        Ok(Sale::Replay) => wire::outcome(StatusCode::OK, "REPLAY"),
        Ok(Sale::UserLimit) => wire::outcome(StatusCode::CONFLICT, "USER_LIMIT"),
        Ok(Sale::SoldOut) => wire::outcome(StatusCode::CONFLICT, "SOLD_OUT"),
        Err(e) => internal(e),
    }
}

/// What one transaction decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sale {
    /// Committed a new hold.
    Held,
    /// The key already had a reservation.
    Replay,
    /// The user already holds one; nothing written.
    UserLimit,
    /// No unit left; nothing written.
    SoldOut,
}

/// One sale in one transaction: insert the row, then decrement the hot row
/// only if enough is left; no row changed means sold out and a rollback.
pub async fn sell(
    naive: &Naive,
    reserve: &wire::Reserve,
    now_ms: u64,
) -> Result<Sale, sqlx::Error> {
    let expires_at = DateTime::<Utc>::from_timestamp_millis((now_ms + reserve.ttl_ms) as i64)
        .unwrap_or(DateTime::<Utc>::MAX_UTC);
    let mut tx = naive.pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO naive_reservations (tenant, request_key, sku, user_id, qty, status, expires_at)
         VALUES ($1, $2, $3, $4, $5, 'HELD', $6)
         ON CONFLICT DO NOTHING",
    )
    .bind(&naive.tenant)
    .bind(reserve.request_key.as_str())
    .bind(reserve.sku.as_str())
    .bind(reserve.user_id.as_str())
    .bind(reserve.qty.get() as i32)
    .bind(expires_at)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        tx.rollback().await?;
        let exists: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM naive_reservations WHERE tenant = $1 AND request_key = $2",
        )
        .bind(&naive.tenant)
        .bind(reserve.request_key.as_str())
        .fetch_optional(&naive.pool)
        .await?;
        return Ok(if exists.is_some() {
            Sale::Replay
        } else {
            Sale::UserLimit
        });
    }
    let updated = sqlx::query(
        "UPDATE naive_stock SET available = available - $2 WHERE id = $1 AND available >= $2",
    )
    .bind(stock_id(&naive.tenant, reserve.sku.as_str()))
    .bind(i64::from(reserve.qty.get()))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 0 {
        tx.rollback().await?;
        return Ok(Sale::SoldOut);
    }
    tx.commit().await?;
    Ok(Sale::Held)
}
