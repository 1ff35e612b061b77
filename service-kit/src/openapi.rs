//! What both services' OpenAPI documents have alike beside their routes'
//! annotations ([`Completion`]), and rendering a document for
//! `GET /openapi.json`.

use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::Modify;

use crate::ops::{add_operations, OperationsDoc};

/// Fields of a Link Object that utoipa 5.5 serializes in snake case
/// (`operation_id`) where OpenAPI names them in camel case
/// (`operationId`): a tool reading the document would find no target
/// operation, and schemathesis refuses the links of its stateful phase.
const LINK_FIELDS: [(&str, &str); 3] = [
    ("operation_id", "operationId"),
    ("operation_ref", "operationRef"),
    ("request_body", "requestBody"),
];

/// What a service's document says beside its routes' annotations, added
/// as a modifier (`#[openapi(modifiers(&COMPLETION))]`): its credential
/// and its operations endpoints.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// Which bearer token goes where.
    pub bearer: &'static str,
    /// The service's words on its operations endpoints.
    pub operations: OperationsDoc,
}

impl Modify for Completion {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        add_bearer(doc, self.bearer);
        add_operations(doc, &self.operations);
    }
}

/// Declares the one kind of credential both services take, a bearer
/// token, as the security scheme `bearer`; `which` says which token goes
/// where.
fn add_bearer(doc: &mut utoipa::openapi::OpenApi, which: &str) {
    let scheme = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .description(Some(which))
        .build();
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme("bearer", SecurityScheme::Http(scheme));
}

/// The document as JSON text, with the links' field names as OpenAPI
/// spells them.
pub fn render(doc: &utoipa::openapi::OpenApi) -> String {
    // A document of maps, strings and numbers always converts.
    let mut json = serde_json::to_value(doc).expect("an OpenAPI document converts to JSON");
    let operations = json
        .get_mut("paths")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let links = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|responses| responses.values_mut())
            .filter_map(|response| response.get_mut("links"))
            .filter_map(Value::as_object_mut)
            .flat_map(|links| links.values_mut())
            .filter_map(Value::as_object_mut);
        for link in links {
            for (snake, camel) in LINK_FIELDS {
                if let Some(value) = link.remove(snake) {
                    link.insert(camel.to_owned(), value);
                }
            }
        }
    }
    json.to_string()
}

#[cfg(test)]
mod tests {
    use utoipa::openapi::link::LinkBuilder;
    use utoipa::openapi::path::{OperationBuilder, PathItem};
    use utoipa::openapi::{HttpMethod, OpenApiBuilder, PathsBuilder, ResponseBuilder};

    use super::*;

    /// Goal: a response's link names its target with `operationId`, the
    /// field OpenAPI defines, whatever utoipa writes.
    #[test]
    fn links_name_their_operation_in_camel_case() {
        let link = LinkBuilder::new()
            .operation_id("confirm")
            .parameter("request_key", "$response.body#/request_key")
            .build();
        let response = ResponseBuilder::new()
            .description("held")
            .link("Confirm", link)
            .build();
        let operation = OperationBuilder::new().response("201", response).build();
        let doc = OpenApiBuilder::new()
            .paths(PathsBuilder::new().path("/r", PathItem::new(HttpMethod::Post, operation)))
            .build();
        let json: Value = serde_json::from_str(&render(&doc)).unwrap();
        let link = &json["paths"]["/r"]["post"]["responses"]["201"]["links"]["Confirm"];
        assert_eq!(link["operationId"], "confirm");
        assert!(link.get("operation_id").is_none());
        assert_eq!(
            link["parameters"]["request_key"],
            "$response.body#/request_key"
        );
    }
}
