//! The failures several admin routes answer alike, declared once for the
//! OpenAPI document: a route lists the sets that apply to it beside its
//! own answers. Each description is the variant's doc line.

use utoipa::IntoResponses;

use super::bodies::OutcomeBody;

/// What every admin route may answer besides its own outcomes.
#[derive(Debug, IntoResponses)]
pub enum AdminFailures {
    /// `UNAUTHORIZED`: missing or wrong admin token
    #[response(status = 401)]
    Unauthorized(OutcomeBody),
    /// `INTERNAL`: a row that cannot be right; details logged only
    #[response(status = 500)]
    Internal(OutcomeBody),
    /// `OVERLOADED`: too many requests in flight, or the request ran too long; nothing committed; `UNAVAILABLE`: the database cannot be reached (no primary, failing over); a change sent with an Idempotency-Key is safe to retry
    #[response(status = 503, headers(("Retry-After" = u32, description = "Always 1")))]
    Overloaded(OutcomeBody),
}

/// What a change to an existing SKU may answer besides [`AdminFailures`].
#[derive(Debug, IntoResponses)]
pub enum ChangeFailures {
    /// `UNKNOWN_SKU`
    #[response(status = 404)]
    UnknownSku(OutcomeBody),
    /// `CONFLICT`: the Idempotency-Key was used for another change; nothing applied
    #[response(status = 409)]
    KeyReused(OutcomeBody),
}
