//! `/console`: the operator console's files (the `opledger-console` crate, built into the
//! binary), each answered with the console's Content-Security-Policy.
//!
//! The console is a client of the JSON API like any other: this module serves static bytes and
//! nothing else. It must never read the ledger, take a token or set a cookie: the console keeps
//! its bearer token in the browser tab and calls `/v1/...` with it.

use std::sync::Arc;

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use opledger_console::{Asset, CONTENT_SECURITY_POLICY, INDEX};

use super::error::ApiError;
use super::Shared;

/// The console's routes: its start page at `/console` and `/console/`, its files below.
pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/{*path}", get(file))
}

async fn index() -> Response {
    answer(INDEX)
}

async fn file(Path(path): Path<String>) -> Response {
    match opledger_console::asset(&path) {
        Some(asset) => answer(asset),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("the console has no file `{path}`; open /console"),
        )
        .into_response(),
    }
}

/// One file with the headers every console answer carries: the policy (no inline script, no
/// other origin), no MIME sniffing, no referrer (a page's fragment never leaves it anyway), no
/// framing, and `no-cache` so a new binary's console is seen at the next load.
fn answer(asset: &'static Asset) -> Response {
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, asset.body).into_response()
}
