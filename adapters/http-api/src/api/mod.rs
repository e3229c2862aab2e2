//! The HTTP API's routes, and what every handler shares: the path and body extractors with
//! their errors, the operation view, the tenant checks and the read-your-writes wait.
//!
//! Every handler authenticates first, checks its whole input before it touches the ledger, and
//! decides nothing itself: recording, approving, executing and reviewing go through the ledger
//! and the engine, listings come from the read models, single operations from their own stream.
//! A handler never returns 2xx for something the ledger has not durably recorded. The handlers
//! live by concern: operations.rs (record, show, history, approve/deny, execute), queries.rs
//! (listings, the review queue, trace), review.rs (an operator's decision), mcp.rs (the MCP
//! tools over the same paths, at `/mcp`), actions.rs (the actions as tools for agent frameworks),
//! steps.rs (steps the caller's own code carries out: record, claim, report).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, Utc};
use opledger_domain::app::{AppError, IntentRequest, LoadedOperation};
use opledger_domain::args::ArgsHash;
use opledger_domain::error::ValidationError;
use opledger_domain::event::ReviewDecision;
use opledger_domain::ids::{
    AccountId, ActionName, ActorId, AttemptId, ExternalObjectId, GlobalPosition, OperationId,
    ProviderId, SourceId, StreamVersion, TenantId,
};
use opledger_domain::in_span::InSpanExt;
use opledger_domain::provider::{BindingQuery, Providers};
use opledger_domain::state::Status;
use opledger_domain::store::EventStore;
use opledger_readmodel::{OperationCursor, OperationFilter, ReadModelError, MAX_QUERY_ROWS};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::{info, warn};

use super::auth::{approver_for, operator_of, principal_of, tenant_of, Scope};
use super::error::{json_reply, ApiError};
use super::{events, metrics, Principal, Shared};
use crate::render::{operation_json, view_of, RenderError};

mod actions;
mod bulk;
mod claim;
mod log;
mod mcp;
mod operations;
mod probes;
mod queries;
mod review;
mod steps;
mod webhooks;

pub use self::mcp::McpLedger;

/// How long a listing waits for the read models to reach the log's head as it was when the
/// request arrived (read your writes), before answering from where they are.
const FRESHNESS_WAIT: Duration = Duration::from_secs(2);
/// How often the wait above looks again.
const FRESHNESS_POLL: Duration = Duration::from_millis(2);
/// Rows in a page when `limit` is not given.
const DEFAULT_PAGE_ROWS: usize = 50;
/// The longest a client may take to send its request body.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The API's routes; `/v1/openapi.json` describes each of them (a test keeps the two in step,
/// and the black-box tests call each route of the router). The metrics label requests with these
/// templates only, so the set of `route` values is bounded.
pub(crate) const ROUTES: [(&str, &str); 46] = [
    ("post", "/v1/operations"),
    ("get", "/v1/operations"),
    ("get", "/v1/operations/{id}"),
    ("get", "/v1/operations/{id}/events"),
    ("get", "/v1/operations/{id}/deliveries"),
    ("post", "/v1/operations/{id}/approve"),
    ("post", "/v1/operations/{id}/deny"),
    ("post", "/v1/operations/{id}/execute"),
    ("post", "/v1/operations/{id}/review"),
    ("post", "/v1/steps"),
    ("post", "/v1/operations/{id}/claim"),
    ("post", "/v1/operations/{id}/attempts/{attempt_id}/outcome"),
    ("get", "/v1/review"),
    ("get", "/v1/review/{id}"),
    ("post", "/v1/review/bulk"),
    ("post", "/v1/review/{id}/claim"),
    ("post", "/v1/review/{id}/release"),
    ("get", "/v1/trace/{id}"),
    ("get", "/v1/events"),
    ("get", "/metrics"),
    ("get", "/healthz"),
    ("get", "/livez"),
    ("get", "/readyz"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/webhooks"),
    ("post", "/v1/webhooks/{id}/pause"),
    ("post", "/v1/webhooks/{id}/resume"),
    ("post", "/v1/webhooks/{id}/replay"),
    ("post", "/v1/webhooks"),
    ("patch", "/v1/webhooks/{id}"),
    ("delete", "/v1/webhooks/{id}"),
    ("post", "/v1/webhooks/{id}/rotate-secret"),
    ("post", "/v1/webhooks/{id}/test"),
    ("post", "/v1/webhooks/{id}/resend"),
    ("get", "/v1/webhooks/{id}/attempts"),
    ("get", "/v1/webhooks/{id}/payload"),
    ("get", "/v1/whoami"),
    ("get", "/v1/counts"),
    ("get", "/v1/actions"),
    ("get", "/v1/subjects"),
    ("get", "/v1/subjects/{subject}"),
    ("post", "/v1/subjects/{subject}/erase"),
    ("get", "/v1/log/checkpoint"),
    // Served as `/v1/log/tile/{*path}` (a tile's path holds slashes), so its metrics' route
    // label is `other`; the document names the path parameter `tile`.
    ("get", "/v1/log/tile/{tile}"),
    ("get", "/v1/log/proof/inclusion"),
    ("get", "/v1/log/proof/consistency"),
];

/// The states an operation shows through the API: every state a recorded operation can be in
/// (the fold's `new` is the state before its intent, which no operation the API can name is in).
/// The OpenAPI document's `State` enum is this list (a test keeps them equal).
pub(crate) const API_STATES: [&str; 9] = [
    "awaiting_approval",
    "denied",
    "pending",
    "in_flight",
    "succeeded",
    "rejected",
    "unknown",
    "needs_review",
    "abandoned",
];

/// The router over the shared state.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/v1/operations",
            post(operations::record).get(queries::list),
        )
        .route("/v1/operations/{id}", get(operations::show))
        .route("/v1/operations/{id}/events", get(operations::history))
        .route("/v1/operations/{id}/deliveries", get(webhooks::deliveries))
        .route("/v1/operations/{id}/approve", post(operations::approve))
        .route("/v1/operations/{id}/deny", post(operations::deny))
        .route("/v1/operations/{id}/execute", post(operations::execute))
        .route("/v1/operations/{id}/review", post(review::review))
        .route("/v1/steps", post(steps::record))
        .route("/v1/operations/{id}/claim", post(steps::claim))
        .route(
            "/v1/operations/{id}/attempts/{attempt_id}/outcome",
            post(steps::outcome),
        )
        .route("/v1/review", get(queries::review_queue))
        .route("/v1/review/{id}", get(queries::review_item))
        .route("/v1/review/bulk", post(bulk::bulk))
        .route("/v1/review/{id}/claim", post(claim::claim))
        .route("/v1/review/{id}/release", post(claim::release))
        .route("/v1/trace/{id}", get(queries::trace))
        .route("/v1/events", get(events::stream))
        .route("/metrics", get(metrics::render))
        .route("/healthz", get(health))
        .route("/livez", get(probes::live))
        .route("/readyz", get(probes::ready))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/whoami", get(whoami))
        .route("/v1/counts", get(queries::counts))
        .route("/v1/actions", get(actions::list))
        // The transparency log's routes follow C2SP tlog-tiles and tlog-checkpoint (text and
        // binary answers a generic tlog client reads), specified in the book
        // (docs/src/auditors/transparency-log.md); the OpenAPI document lists them too.
        .route("/v1/log/checkpoint", get(log::checkpoint))
        .route("/v1/log/tile/{*path}", get(log::tile))
        .route("/v1/log/proof/inclusion", get(log::inclusion))
        .route("/v1/log/proof/consistency", get(log::consistency))
        .route("/v1/webhooks", get(webhooks::list).post(webhooks::create))
        .route(
            "/v1/webhooks/{id}",
            axum::routing::patch(webhooks::update).delete(webhooks::remove),
        )
        .route("/v1/webhooks/{id}/rotate-secret", post(webhooks::rotate))
        .route("/v1/webhooks/{id}/test", post(webhooks::test))
        .route("/v1/webhooks/{id}/resend", post(webhooks::resend))
        .route("/v1/webhooks/{id}/pause", post(webhooks::pause))
        .route("/v1/webhooks/{id}/resume", post(webhooks::resume))
        .route("/v1/webhooks/{id}/replay", post(webhooks::replay))
        .route("/v1/webhooks/{id}/attempts", get(webhooks::attempts))
        .route("/v1/webhooks/{id}/payload", get(webhooks::payload))
        .route("/v1/subjects", get(crate::personal::list))
        .route("/v1/subjects/{subject}", get(crate::personal::show))
        .route("/v1/subjects/{subject}/erase", post(crate::personal::erase))
        .merge(mcp::route(Arc::clone(&shared)))
        .merge(super::console::routes())
        .fallback(not_a_route)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside the metrics layer, so the time to open personal values is measured with the
        // request it belongs to.
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            crate::personal::open_sealed_answers,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            metrics::observe,
        ))
        .with_state(shared)
}

async fn not_a_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_such_route",
        "no such route; GET /v1/openapi.json lists them",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method; GET /v1/openapi.json lists them",
    )
}

// ---- extractors ----

/// The `{id}` of a route, with a JSON error when the path cannot be decoded (e.g. `%FF`).
struct IdPath(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(Self(id)),
            Err(rejection) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                format!("the path is not understood: {}", rejection.body_text()),
            )),
        }
    }
}

/// Reads the body (at most the configured size) and parses it as `T`, with errors that say
/// where the JSON is wrong.
/// [`body`] for routes outside this module.
pub(crate) async fn body_of<T: DeserializeOwned>(
    shared: &Shared,
    request: Request,
) -> Result<T, ApiError> {
    body(shared, request).await
}

async fn body<T: DeserializeOwned>(shared: &Shared, request: Request) -> Result<T, ApiError> {
    let limit = shared.limits.max_body_bytes;
    let read = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(request.into_body(), limit),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} s; send it whole",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )
    })?;
    let bytes = read.map_err(|error| {
        if is_length_limit(&error) {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the request body is larger than {limit} bytes; send less (arguments are frozen snapshots, not documents)"),
            )
        } else {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "body_unreadable",
                format!("the request body could not be read ({error}); send it again"),
            )
        }
    })?;
    let parsed = serde_json::from_slice(&bytes).map_err(|error| {
        use serde_json::error::Category;
        match error.classify() {
            Category::Data => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_input",
                format!(
                    "the body does not match the request: {error}{}",
                    query_option_hint(&error)
                ),
            ),
            _ => ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("the body is not valid JSON: {error}"),
            ),
        }
    })?;
    // After the parse, so malformed JSON gets its own answer; before anything is recorded, so a
    // number the ledger would store as a different number is refused, not rounded, and a key
    // given twice (in `args` too) is refused, not settled by whichever of the two a parser keeps.
    opledger_domain::args::check_json(&bytes, "").map_err(ApiError::invalid)?;
    Ok(parsed)
}

/// The options a first try puts in the body although they are query parameters (a new user did,
/// with `execute`): the refusal then says where they go.
const QUERY_OPTIONS: [&str; 2] = ["execute", "wait_ms"];

fn query_option_hint(error: &serde_json::Error) -> String {
    let message = error.to_string();
    QUERY_OPTIONS
        .iter()
        .find(|option| message.starts_with(&format!("unknown field `{option}`")))
        .map(|option| {
            format!(
                "; `{option}` is a query parameter, not a field of the body: e.g. \
                 POST /v1/operations?execute=true&wait_ms=5000"
            )
        })
        .unwrap_or_default()
}

/// Whether reading a body failed on the size limit (rather than on the connection).
fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if current.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = current.source();
    }
    false
}

fn operation_id(text: &str) -> Result<OperationId, ApiError> {
    text.parse::<OperationId>()
        .map_err(|error| ApiError::invalid(ValidationError::new("id", error.message)))
}

// ---- read models ----

/// An operation as every endpoint returns it (see [`crate::render::OperationBody`]).
type OperationView<'a> = crate::render::OperationBody<'a>;

/// The operation as the API shows it; its sentence in the words of the action's configured
/// description.
fn operation_view<'a>(shared: &Shared, loaded: &'a LoadedOperation) -> OperationView<'a> {
    let description = loaded.state.intent.as_ref().and_then(|intent| {
        shared
            .engine
            .providers()
            .action_description(&intent.provider, &intent.action)
    });
    crate::render::operation_body(loaded, description.as_deref())
}

/// Answers with an operation's view.
fn view_reply(status: StatusCode, view: &OperationView<'_>) -> Response {
    match serde_json::to_vec(view) {
        Ok(body) => (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(error) => {
            ApiError::internal("an operation could not be written as JSON", error).into_response()
        }
    }
}

/// Loads an operation the caller may see; anything else is the same 404 as a missing one.
async fn visible(
    shared: &Shared,
    scope: &Scope,
    operation_id: OperationId,
) -> Result<LoadedOperation, ApiError> {
    let loaded = shared.engine.ledger().get(operation_id).await?;
    let tenant = loaded.state.intent.as_ref().map(|intent| &intent.tenant);
    if tenant.is_some_and(|tenant| scope.allows(tenant)) {
        Ok(loaded)
    } else {
        Err(ApiError::not_found(format!("operation {operation_id}")))
    }
}

/// Checks the caller may act on an operation without reading its stream when its tenant is
/// known (its tenant never changes); anything else is the same 404 as a missing operation.
async fn check_visible(
    shared: &Shared,
    scope: &Scope,
    operation_id: OperationId,
) -> Result<TenantId, ApiError> {
    let tenant = shared
        .tenants
        .tenant_of(shared.engine.ledger().store(), operation_id)
        .await?;
    match tenant {
        Some(tenant) if scope.allows(&tenant) => Ok(tenant),
        _ => Err(ApiError::not_found(format!("operation {operation_id}"))),
    }
}

async fn health(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let store = shared.engine.ledger().store();
    let runner = shared.runner_health.report();
    // A fault that keeps the runner from writing may keep us from reading too: that is an
    // answer about health (degraded), not an error of this request.
    let lag = shared.read_models.lag(store).await;
    let (code, status, reason, probe) = match &lag {
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "degraded",
            Some(format!(
                "the log or the read models cannot be read: {error}"
            )),
            Some(PROBE_OUT_OF_ROTATION),
        ),
        Ok(lag) => match runner.problem(lag.positions) {
            Some(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "degraded",
                Some(reason),
                Some(if runner.needs_restart() {
                    PROBE_RESTART
                } else {
                    PROBE_OUT_OF_ROTATION
                }),
            ),
            // Ready once the read models are near the log: far behind (a start after a long
            // stop), the runner is still catching up and listings would be stale.
            None if lag.positions > crate::READY_LAG_POSITIONS => (
                StatusCode::SERVICE_UNAVAILABLE,
                "catching_up",
                Some(format!(
                    "the read models are {} positions behind the log and catching up",
                    lag.positions
                )),
                Some(PROBE_WAIT),
            ),
            None => (StatusCode::OK, "ok", None, None),
        },
    };
    // Webhook delivery that has stopped or cannot write its journal is reported as degraded too
    // (design: /healthz says so when a component has stopped); the read models' verdict wins.
    let webhooks_problem = shared.webhooks.problem();
    let (code, status, reason, probe) = match (&webhooks_problem, code) {
        (Some(problem), StatusCode::OK) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "degraded",
            Some(problem.clone()),
            Some(PROBE_WEBHOOKS),
        ),
        _ => (code, status, reason, probe),
    };
    let lag = lag.ok();
    let mut body = json!({
        "status": status,
        "log_head": lag.and_then(|lag| lag.head),
        "read_model_checkpoint": lag.and_then(|lag| lag.checkpoint),
        // Events for SQLite; byte offsets in the log for KurrentDB.
        "read_model_lag_positions": lag.map(|lag| lag.positions),
        "read_model_runner": {
            "state": runner_state_name(&runner.state),
            "failures_total": runner.failures_total,
            "since_progress_ms": runner.since_progress_ms,
        },
    });
    if let Some(reason) = reason {
        body["reason"] = reason.into();
    }
    if let Some(probe) = probe {
        body["probe"] = probe.into();
    }
    Ok(json_reply(code, &body))
}

/// What `/healthz` tells a probe when the instance should get no traffic until it says ok again.
const PROBE_OUT_OF_ROTATION: &str = "fail readiness: send no traffic here until /healthz says ok; do not restart for this alone: the read models resume by themselves once the cause (a full disk, an unwritable file, a store that is down) is gone, and a restart would not remove it";
/// What `/healthz` tells a probe when only a restart (after fixing the cause) helps.
const PROBE_RESTART: &str = "fail readiness and liveness: this instance will not recover on its own; fix the cause named in reason, then restart it";
/// What `/healthz` tells a probe when webhook delivery has stopped or is retrying a fault.
const PROBE_WEBHOOKS: &str = "fail readiness: webhook delivery cannot write its journal or read the log; it resumes from its checkpoint once the cause (a full disk, an unwritable file, a store that is down) is gone, so do not restart for this alone";
/// What `/healthz` tells a probe during a catch-up that is making progress.
const PROBE_WAIT: &str =
    "fail readiness until /healthz says ok; the read models are advancing, so do not restart";

fn runner_state_name(state: &opledger_readmodel::RunnerState) -> &'static str {
    use opledger_readmodel::RunnerState;
    match state {
        RunnerState::Running => "running",
        RunnerState::Retrying { .. } => "retrying",
        RunnerState::Stopped { .. } => "stopped",
        RunnerState::Finished => "finished",
    }
}

/// Who the bearer token stands for, so a client (the console) shows only what it may do instead
/// of probing routes: its kind, its name, and the tenants it sees (`null`: every tenant).
async fn whoami(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (kind, name, tenants) = match shared.tokens.authenticate(&headers)? {
        Principal::Tenant(tenant) => ("tenant", tenant.to_string(), Some(vec![tenant.clone()])),
        Principal::Operator { name, tenants } => (
            "operator",
            name.clone(),
            tenants
                .as_ref()
                .map(|tenants| tenants.iter().cloned().collect()),
        ),
        Principal::Approver { name, tenants } => (
            "approver",
            name.clone(),
            tenants
                .as_ref()
                .map(|tenants| tenants.iter().cloned().collect()),
        ),
    };
    Ok(json_reply(
        StatusCode::OK,
        &json!({"kind": kind, "name": name, "tenants": tenants}),
    ))
}

async fn openapi(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        Body::from(shared.openapi.clone()),
    )
        .into_response()
}

// ---- helpers ----

/// How far the read models had got when [`fresh_read_models`] stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Freshness {
    /// They had applied the log up to its head as it was when the request arrived.
    Fresh,
    /// They were still behind after the wait: an answer from them may miss the newest events
    /// (`applied` is their checkpoint, `head` the log's last position).
    Behind {
        applied: Option<GlobalPosition>,
        head: GlobalPosition,
    },
}

/// Waits (bounded) until the read models have applied the log up to its head as it is now, so
/// a listing right after a write shows the write. A listing answers from where they are after
/// the wait; a lookup that finds nothing must say "not yet" rather than "does not exist", so the
/// answer says which.
async fn fresh_read_models(shared: &Shared) -> Result<Freshness, ApiError> {
    let Some(head) = shared.engine.ledger().store().head_position().await? else {
        return Ok(Freshness::Fresh);
    };
    let started = Instant::now();
    loop {
        let checkpoint = shared.read_models.checkpoint().await?;
        if checkpoint.is_some_and(|checkpoint| checkpoint >= head) {
            return Ok(Freshness::Fresh);
        }
        // Behind: the runner may be lingering over a batch, waiting for more events; we are
        // waiting for it instead. Asked on every look, since the events up to `head` may take
        // more than one batch.
        shared.read_models.hurry();
        if started.elapsed() >= FRESHNESS_WAIT {
            warn!(?checkpoint, %head, "answering from read models that are behind the log");
            return Ok(Freshness::Behind {
                applied: checkpoint,
                head,
            });
        }
        tokio::time::sleep(FRESHNESS_POLL).await;
    }
}

fn page_limit(text: Option<&str>) -> Result<usize, ApiError> {
    let Some(text) = text else {
        return Ok(DEFAULT_PAGE_ROWS);
    };
    text.parse::<usize>()
        .ok()
        .filter(|limit| (1..=MAX_QUERY_ROWS).contains(limit))
        .ok_or_else(|| {
            ApiError::invalid(ValidationError::new(
                "limit",
                format!("`{text}` must be a whole number from 1 to {MAX_QUERY_ROWS}"),
            ))
        })
}

/// A validation error re-labelled with the body field it came from.
fn field(name: &str, error: ValidationError) -> ApiError {
    ApiError::invalid(ValidationError::new(name, error.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_describes_exactly_the_routes_served() {
        let spec: Value = serde_json::from_str(super::super::OPENAPI).expect("the spec is JSON");
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, methods) in spec["paths"].as_object().expect("paths") {
            for method in methods.as_object().expect("methods").keys() {
                documented.push((method.clone(), path.clone()));
            }
        }
        documented.sort();
        let mut served: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(method, path)| ((*method).to_owned(), (*path).to_owned()))
            .collect();
        served.sort();
        assert_eq!(documented, served);
    }

    fn spec() -> Value {
        serde_json::from_str(super::super::OPENAPI).expect("the spec is JSON")
    }

    /// The schema of query or path parameter `name` of `method path`.
    fn parameter(spec: &Value, path: &str, method: &str, name: &str) -> Value {
        spec["paths"][path][method]["parameters"]
            .as_array()
            .and_then(|parameters| parameters.iter().find(|p| p["name"] == name))
            .map(|parameter| parameter["schema"].clone())
            .unwrap_or_else(|| panic!("{method} {path} documents no parameter {name}"))
    }

    fn strings(value: &Value) -> Vec<String> {
        value
            .as_array()
            .expect("an array")
            .iter()
            .map(|item| item.as_str().expect("a string").to_owned())
            .collect()
    }

    #[test]
    fn the_documented_limits_are_the_servers_constants() {
        let spec = spec();
        let limits = crate::Limits::default();
        for (path, method) in [
            ("/v1/operations", "post"),
            ("/v1/operations/{id}/execute", "post"),
        ] {
            let wait = parameter(&spec, path, method, "wait_ms");
            assert_eq!(wait["minimum"], 0, "{method} {path}");
            assert_eq!(wait["maximum"], limits.max_wait_ms, "{method} {path}");
            assert_eq!(wait["default"], limits.default_wait_ms, "{method} {path}");
        }
        for (path, method) in [("/v1/operations", "get"), ("/v1/review", "get")] {
            let limit = parameter(&spec, path, method, "limit");
            assert_eq!(limit["minimum"], 1, "{method} {path}");
            assert_eq!(limit["maximum"], MAX_QUERY_ROWS, "{method} {path}");
            assert_eq!(limit["default"], DEFAULT_PAGE_ROWS, "{method} {path}");
        }
        let schemas = &spec["components"]["schemas"];
        assert_eq!(
            schemas["TextId"]["maxLength"],
            opledger_domain::ids::MAX_TEXT_ID_BYTES
        );
        assert_eq!(
            schemas["Note"]["maxLength"],
            opledger_domain::command::MAX_NOTE_BYTES
        );
        let lease = &schemas["StepClaimRequest"]["properties"]["lease_ms"];
        assert_eq!(lease["minimum"], opledger_domain::command::MIN_LEASE_MS);
        assert_eq!(lease["maximum"], opledger_domain::command::MAX_LEASE_MS);
        assert_eq!(lease["default"], opledger_domain::command::DEFAULT_LEASE_MS);
        let trace = parameter(&spec, "/v1/trace/{id}", "get", "id");
        assert_eq!(trace["maxLength"], queries::MAX_TRACE_ID_BYTES);
        assert!(
            spec["components"]["schemas"]["RecordRequest"]["description"]
                .as_str()
                .is_some_and(
                    |text| text.contains(&opledger_domain::args::MAX_ARGS_BYTES.to_string())
                )
        );
    }

    #[test]
    fn the_documented_enums_are_the_servers_lists() {
        let spec = spec();
        let schemas = &spec["components"]["schemas"];
        assert_eq!(strings(&schemas["State"]["enum"]), API_STATES);
        // The API's states are the fold's, less `new` (the state before an intent).
        let fold_states: Vec<&str> = opledger_projections::operations::STATE_NAMES
            .into_iter()
            .filter(|name| *name != "new")
            .collect();
        assert_eq!(fold_states, API_STATES);
        assert_eq!(
            strings(&schemas["OutcomeEvent"]["properties"]["type"]["enum"]),
            crate::render::TYPES
        );
        assert_eq!(
            strings(&schemas["Action"]["properties"]["deduplication"]["enum"]),
            actions::DEDUPLICATIONS
        );
    }

    #[test]
    fn the_served_document_states_the_configured_wait() {
        let limits = crate::Limits {
            max_wait_ms: 120_000,
            default_wait_ms: 1_000,
            ..crate::Limits::default()
        };
        let served: Value =
            serde_json::from_str(&crate::openapi_for(&limits)).expect("the served spec is JSON");
        for (path, method) in [
            ("/v1/operations", "post"),
            ("/v1/operations/{id}/execute", "post"),
        ] {
            let wait = parameter(&served, path, method, "wait_ms");
            assert_eq!(wait["maximum"], 120_000, "{method} {path}");
            assert_eq!(wait["default"], 1_000, "{method} {path}");
        }
    }

    #[test]
    fn the_served_document_adds_no_member_the_shipped_one_lacks() {
        let served: Value = serde_json::from_str(&crate::openapi_for(&crate::Limits::default()))
            .expect("the served spec is JSON");
        // With the default limits the served document is the shipped one, member for member:
        // stating the limits must change values only, never add keys (once it added
        // `"parameters": null` to every route without parameters).
        assert_eq!(served, spec());
        for (path, methods) in served["paths"].as_object().expect("paths") {
            for (method, operation) in methods.as_object().expect("methods") {
                if let Some(parameters) = operation.get("parameters") {
                    assert!(parameters.is_array(), "{method} {path}: {parameters}");
                }
            }
        }
    }

    #[test]
    fn every_route_has_a_tag_the_document_declares() {
        let spec = spec();
        let declared = spec["tags"]
            .as_array()
            .expect("tags")
            .iter()
            .map(|tag| tag["name"].clone())
            .collect::<Vec<_>>();
        for (path, methods) in spec["paths"].as_object().expect("paths") {
            for (method, operation) in methods.as_object().expect("methods") {
                let tags = operation["tags"].as_array().expect("a route's tags");
                assert_eq!(tags.len(), 1, "{method} {path}");
                assert!(declared.contains(&tags[0]), "{method} {path}");
            }
        }
    }

    #[test]
    fn every_documented_error_status_uses_the_error_shape() {
        let spec: Value = serde_json::from_str(super::super::OPENAPI).expect("the spec is JSON");
        for (path, methods) in spec["paths"].as_object().expect("paths") {
            for (method, operation) in methods.as_object().expect("methods") {
                for (status, response) in operation["responses"].as_object().expect("responses") {
                    // A readiness probe's 503 answers its own status body while the read
                    // models catch up (a load balancer reads the status, not an error), and
                    // the error shape otherwise: the one documented exception.
                    if path == "/healthz" && status == "503" {
                        let shapes = &response["content"]["application/json"]["schema"]["oneOf"];
                        assert_eq!(shapes[1]["$ref"], "#/components/schemas/Error");
                        continue;
                    }
                    // The probes answer their own body, read by status code alone.
                    if ["/livez", "/readyz"].contains(&path.as_str()) && status == "503" {
                        let schema = &response["content"]["application/json"]["schema"];
                        assert_eq!(schema["$ref"], "#/components/schemas/Probe");
                        continue;
                    }
                    if status.starts_with('4') || status.starts_with('5') {
                        assert_eq!(
                            response["$ref"], "#/components/responses/Error",
                            "{method} {path} {status}"
                        );
                    }
                }
            }
        }
    }
}
