//! The bounds both services put on what they take in: a request body's
//! size, the requests in flight and, if bounded, a request's run time. A
//! request beyond them is refused at once, before any work, rather than
//! queued without bound in front of the database or the owners.

use std::future::Future;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::response::Response;
use axum::{BoxError, Router};
use tower::timeout::TimeoutLayer;
use tower::ServiceBuilder;

/// What a service takes in at once.
#[derive(Debug, Clone, Copy)]
pub struct Intake {
    /// Largest request body accepted.
    pub body_bytes_max: usize,
    /// Most requests handled at once.
    pub requests_in_flight_max: usize,
    /// Longest a request may run before it is abandoned, if bounded.
    pub request_timeout: Option<Duration>,
}

/// `router` within `intake`: a request past the requests in flight, or
/// one that ran past the timeout, is answered by `refuse`, given why (a
/// [`tower::load_shed::error::Overloaded`] or a
/// [`tower::timeout::error::Elapsed`]).
pub fn bounded<S, Refuse, Answer>(router: Router<S>, intake: Intake, refuse: Refuse) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Refuse: Fn(BoxError) -> Answer + Clone + Send + Sync + 'static,
    Answer: Future<Output = Response> + Send + 'static,
{
    router
        .layer(DefaultBodyLimit::max(intake.body_bytes_max))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::<_, ()>::new(refuse))
                .load_shed()
                .concurrency_limit(intake.requests_in_flight_max)
                .option_layer(intake.request_timeout.map(TimeoutLayer::new))
                // A route never fails; its error type joins the timeout's.
                .map_err(BoxError::from),
        )
}
