//! The failures several routes answer alike, declared once for the OpenAPI
//! document: a route lists the sets that apply to it beside its own
//! answers. Each description is the variant's doc line.

use utoipa::IntoResponses;

use super::bodies::{NotFoundBody, OutcomeBody};

/// What an admin route that reads may answer besides its own outcomes.
#[derive(Debug, IntoResponses)]
pub enum AdminReadFailures {
    /// `UNAUTHORIZED`: missing or wrong admin token
    #[response(status = 401)]
    Unauthorized(OutcomeBody),
    /// `REJECTED_QUEUE_FULL`: the process-wide limit of requests in flight is reached; `PAUSED` with `reason` `storage`: the database could not be read (unreachable, or no primary)
    #[response(status = 503, headers(("Retry-After" = u32, description = "Always 1")))]
    Unavailable(OutcomeBody),
}

/// What an admin route that changes a SKU through its owner may answer
/// besides its own outcomes.
#[derive(Debug, IntoResponses)]
pub enum AdminChangeFailures {
    /// `UNAUTHORIZED`: missing or wrong admin token
    #[response(status = 401)]
    Unauthorized(OutcomeBody),
    /// `PAUSED` with `reason`: `halted` (fenced, drift, reload) or `storage` (the commit failed)
    #[response(status = 503, headers(("Retry-After" = u32, description = "Always 1")))]
    Paused(OutcomeBody),
}

/// What a change to an existing SKU may answer besides
/// [`AdminChangeFailures`].
#[derive(Debug, IntoResponses)]
pub enum SkuChangeFailures {
    /// `UNKNOWN_SKU`
    #[response(status = 404)]
    UnknownSku(OutcomeBody),
    /// `CONFLICT`: this agent is managed by a coordinator; change the SKU there
    #[response(status = 409)]
    Managed(OutcomeBody),
}

/// What a buyer route that answers from memory or one read may answer
/// besides its own outcomes.
#[derive(Debug, IntoResponses)]
pub enum BuyerReadFailures {
    /// `UNAUTHORIZED`: missing or wrong tenant key
    #[response(status = 401)]
    Unauthorized(OutcomeBody),
    /// `REJECTED_QUEUE_FULL`: the process-wide limit of requests in flight is reached; `PAUSED` with `reason` `storage`: the database could not be read (unreachable, or no primary)
    #[response(status = 503, headers(("Retry-After" = u32, description = "Always 1")))]
    Unavailable(OutcomeBody),
}

/// What an action on a reservation (confirm, release, extend) may answer
/// besides the reservation itself.
#[derive(Debug, IntoResponses)]
pub enum ActFailures {
    /// `BAD_REQUEST`: malformed key or body; nothing written
    #[response(status = 400)]
    BadRequest(OutcomeBody),
    /// `UNAUTHORIZED`: missing or wrong tenant key
    #[response(status = 401)]
    Unauthorized(OutcomeBody),
    /// No committed reservation has this key for this tenant
    #[response(status = 404)]
    NotFound(NotFoundBody),
    /// `INTERNAL`: the handler's read failed; details logged only
    #[response(status = 500)]
    Internal(OutcomeBody),
    /// `PAUSED` with `reason`: `halted` (drift, fencing, reload) or `storage` (the owner's read or a commit failed); `REJECTED_QUEUE_FULL` or `REJECTED_WAIT_TIMEOUT`
    #[response(status = 503, headers(("Retry-After" = u32, description = "Always 1")))]
    Paused(OutcomeBody),
}
