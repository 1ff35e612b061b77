//! The admin console at `GET /console`: one page of plain HTML, CSS and
//! JavaScript (`coordinator/console/`), embedded in the binary, so running
//! it needs no build step and nothing beside the coordinator. It is not
//! part of the API, and so not in the OpenAPI document: the page calls the
//! admin API from the browser with the token the admin types in, as
//! `escrowctl` does, and the assets need no credentials themselves.

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::AppState;

/// The page's only document.
const INDEX_HTML: &str = include_str!("../../console/index.html");
/// Its style sheet.
const CONSOLE_CSS: &str = include_str!("../../console/console.css");
/// Its script: sign in, the SKU list, the live view and the admin actions.
const CONSOLE_JS: &str = include_str!("../../console/console.js");

/// Where the page may load from and talk to: this coordinator only, no
/// inline script, no framing, so a SKU name or an error text shown on the
/// page can never run as code, and no other site can wrap the page.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'none'; \
     base-uri 'none'; frame-ancestors 'none'";

/// The console's routes, merged into the coordinator's router.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/console",
            get(|| asset("text/html; charset=utf-8", INDEX_HTML)),
        )
        .route(
            "/console/console.css",
            get(|| asset("text/css; charset=utf-8", CONSOLE_CSS)),
        )
        .route(
            "/console/console.js",
            get(|| asset("text/javascript; charset=utf-8", CONSOLE_JS)),
        )
}

/// One embedded asset. `no-cache` makes a browser ask again after an
/// upgrade of the coordinator rather than run an old script against a
/// new API.
async fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
}
