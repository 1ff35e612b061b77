//! The JSON bodies the coordinator answers with, as types: the handlers
//! serialize these, and the OpenAPI document (`http::openapi`) derives its
//! schemas from the same types, so the published schema is what is sent.
//! Here are the error answers and the envelopes; the admin views inside
//! them are the store's read model (`store::admin::view`), serialized as
//! they are, with no copy here.

use serde::Serialize;
use utoipa::ToSchema;

use crate::store::RegionSync;

/// Every `outcome` an error answer of the coordinator can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// Malformed input; nothing written (400).
    BadRequest,
    /// Missing or unknown credentials (401).
    Unauthorized,
    /// Another region's token (403).
    Forbidden,
    /// No such SKU, or the region has no part in it (404).
    UnknownSku,
    /// The change conflicts with units leased, held or sold, or an
    /// idempotency key was used for another change (409).
    Conflict,
    /// An older agent process of a region that has a newer one (409).
    Fenced,
    /// Too many requests in flight, or one ran too long; nothing committed (503).
    Overloaded,
    /// The coordinator's database cannot be reached or failed (no primary,
    /// a failover, a connection lost); retry (503).
    Unavailable,
    /// A row that cannot be right (a bug or a corrupt database), logged
    /// only (500).
    Internal,
}

/// An error answer, with what is wrong for `BAD_REQUEST` and `CONFLICT`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutcomeBody {
    /// What happened.
    pub outcome: Outcome,
    /// What is wrong (`BAD_REQUEST`, `CONFLICT` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/admin/regions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct RegionsBody {
    /// Every region that ever synced.
    pub regions: Vec<RegionSync>,
}
