//! The operations endpoints both services serve without credentials —
//! `GET /healthz` (the process is up), `GET /readyz` (it can serve),
//! `GET /metrics` (Prometheus text) and `GET /openapi.json` (its OpenAPI
//! document) — and how that document lists them.

use std::future::Future;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use utoipa::openapi::path::{HttpMethod, OperationBuilder};
use utoipa::openapi::tag::TagBuilder;
use utoipa::openapi::{ContentBuilder, ObjectBuilder, OpenApi, Response as Answer};
use utoipa::openapi::{ResponseBuilder, Type};

use crate::openapi::render;

/// What a service tells its operations endpoints.
pub trait Operated: Clone + Send + Sync + 'static {
    /// Why the service cannot serve now, if it cannot: `GET /readyz`
    /// answers it with 503.
    fn unready(&self) -> impl Future<Output = Option<&'static str>> + Send;

    /// This process's metrics as Prometheus text, for `GET /metrics`.
    fn scrape(&self) -> String;
}

/// The operations routes of a service whose OpenAPI document is `document`
/// (rendered here, once).
pub fn routes<S: Operated>(document: &OpenApi) -> Router<S> {
    let document = Bytes::from(render(document));
    let json = [(header::CONTENT_TYPE, "application/json")];
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<S>))
        .route("/metrics", get(metrics::<S>))
        .route(
            "/openapi.json",
            get(move || async move { (json, document) }),
        )
}

async fn metrics<S: Operated>(State(state): State<S>) -> String {
    state.scrape()
}

async fn readyz<S: Operated>(State(state): State<S>) -> Response {
    match state.unready().await {
        None => "ready".into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

/// Why a service whose database answered `ready` cannot serve, if it
/// cannot: `database unavailable`, the error logged.
pub fn database_unready(ready: Result<(), impl std::fmt::Display>) -> Option<&'static str> {
    let error = ready.err()?;
    tracing::warn!(%error, "not ready");
    Some("database unavailable")
}

/// What a service's document says of its operations endpoints where the
/// two services differ.
#[derive(Debug, Clone, Copy)]
pub struct OperationsDoc {
    /// The service, as `/openapi.json`'s answer names it: `coordinator`.
    pub service: &'static str,
    /// When `/readyz` answers `ready`, as the end of a sentence.
    pub ready_when: &'static str,
    /// What `/readyz` answers with 503, and when.
    pub unready: &'static str,
}

/// Adds the operations endpoints to `doc`, under the tag `operations`
/// (declared last).
pub fn add_operations(doc: &mut OpenApi, words: &OperationsDoc) {
    let document = ResponseBuilder::new()
        .description(format!(
            "The OpenAPI 3.1 document of this {}",
            words.service
        ))
        .content("application/json", ContentBuilder::new().build())
        .build();
    let operations = [
        (
            "/healthz",
            "healthz",
            "`GET /healthz`: the process is up.".to_owned(),
            vec![("200", text("`ok`"))],
        ),
        (
            "/readyz",
            "readyz",
            format!("`GET /readyz`: {}", words.ready_when),
            vec![("200", text("`ready`")), ("503", text(words.unready))],
        ),
        (
            "/metrics",
            "metrics",
            "`GET /metrics`: Prometheus text.".to_owned(),
            vec![("200", text("Prometheus text format"))],
        ),
        (
            "/openapi.json",
            "document",
            "`GET /openapi.json`: this document.".to_owned(),
            vec![("200", document)],
        ),
    ];
    for (path, id, summary, answers) in operations {
        let operation = answers.into_iter().fold(
            OperationBuilder::new()
                .tag("operations")
                .summary(Some(summary))
                .operation_id(Some(id)),
            |operation, (status, answer)| operation.response(status, answer),
        );
        doc.paths
            .add_path_operation(path, vec![HttpMethod::Get], operation.build());
    }
    let tag = TagBuilder::new()
        .name("operations")
        .description(Some(
            "Health, readiness, metrics and this document; no credentials",
        ))
        .build();
    doc.tags.get_or_insert_with(Vec::new).push(tag);
}

/// A plain-text answer.
fn text(description: &str) -> Answer {
    let string = ObjectBuilder::new().schema_type(Type::String).build();
    ResponseBuilder::new()
        .description(description)
        .content(
            "text/plain",
            ContentBuilder::new().schema(Some(string)).build(),
        )
        .build()
}
