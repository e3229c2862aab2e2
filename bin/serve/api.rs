//! The HTTP API's routes and handlers (JSON in and out).
//!
//! Every handler authenticates first, checks its whole input before it touches the ledger, and
//! decides nothing itself: recording, approving, executing and reviewing go through the ledger
//! and the engine, listings come from the read models, single operations from their own stream.
//! A handler never returns 2xx for something the ledger has not durably recorded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::Utc;
use opledger_adapters::readmodel::{
    OperationCursor, OperationFilter, ReadModelError, MAX_QUERY_ROWS,
};
use opledger_domain::app::{IntentRequest, LoadedOperation};
use opledger_domain::args::ArgsHash;
use opledger_domain::error::ValidationError;
use opledger_domain::event::ReviewDecision;
use opledger_domain::ids::{ActorId, ExternalObjectId, OperationId, StreamVersion, TenantId};
use opledger_domain::provider::Providers;
use opledger_domain::sentence::agent_sentence;
use opledger_domain::state::Status;
use opledger_domain::store::EventStore;
use opledger_projections::operations::STATE_NAMES;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::{info, Instrument};

use super::auth::{approver_for, operator_of, tenant_of, Scope};
use super::error::{json_reply, ApiError};
use super::{events, metrics, Shared};
use crate::ops::{operation_json, view_of};

/// How long a listing waits for the read models to reach the log's head as it was when the
/// request arrived (read your writes), before answering from where they are.
const FRESHNESS_WAIT: Duration = Duration::from_secs(2);
/// How often the wait above looks again.
const FRESHNESS_POLL: Duration = Duration::from_millis(2);
/// While another worker's attempt is in flight, an execute call looks for its outcome after this
/// pause, doubling up to [`IN_FLIGHT_POLL_MAX`]: a send usually ends within milliseconds.
const IN_FLIGHT_POLL_MIN: Duration = Duration::from_millis(1);
const IN_FLIGHT_POLL_MAX: Duration = Duration::from_millis(20);
/// Most operations a traced id may match.
const MAX_TRACE_MATCHES: usize = 10;
/// The longest id `trace` takes, in bytes.
const MAX_TRACE_ID_BYTES: usize = 512;
/// Rows in a page when `limit` is not given.
const DEFAULT_PAGE_ROWS: usize = 50;
/// The longest a client may take to send its request body.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The API's routes; `/v1/openapi.json` describes each of them (a test keeps the two in step,
/// and the black-box tests call each route of the router).
#[cfg(test)]
const ROUTES: [(&str, &str); 14] = [
    ("post", "/v1/operations"),
    ("get", "/v1/operations"),
    ("get", "/v1/operations/{id}"),
    ("get", "/v1/operations/{id}/events"),
    ("post", "/v1/operations/{id}/approve"),
    ("post", "/v1/operations/{id}/deny"),
    ("post", "/v1/operations/{id}/execute"),
    ("post", "/v1/operations/{id}/review"),
    ("get", "/v1/review"),
    ("get", "/v1/trace/{id}"),
    ("get", "/v1/events"),
    ("get", "/metrics"),
    ("get", "/healthz"),
    ("get", "/v1/openapi.json"),
];

/// The router over the shared state.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/operations", post(record).get(list))
        .route("/v1/operations/{id}", get(show))
        .route("/v1/operations/{id}/events", get(history))
        .route("/v1/operations/{id}/approve", post(approve))
        .route("/v1/operations/{id}/deny", post(deny))
        .route("/v1/operations/{id}/execute", post(execute))
        .route("/v1/operations/{id}/review", post(review))
        .route("/v1/review", get(review_queue))
        .route("/v1/trace/{id}", get(trace))
        .route("/v1/events", get(events::stream))
        .route("/metrics", get(metrics::render))
        .route("/healthz", get(health))
        .route("/v1/openapi.json", get(openapi))
        .fallback(not_a_route)
        .method_not_allowed_fallback(method_not_allowed)
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

// ---- request bodies ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordBody {
    provider: String,
    account: String,
    action: String,
    args: Value,
    source_id: Option<String>,
    owner: Option<String>,
    #[serde(default)]
    requires_approval: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalBody {
    /// Who decides; required with a tenant token, taken from the token for an approver.
    approver: Option<String>,
    args_hash: String,
    /// Why, when denying.
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewBody {
    /// `retry`, `confirm` or `abandon`.
    decision: String,
    /// With `confirm`: the object found at the provider.
    external_id: Option<String>,
    note: String,
    /// The operation's version the reviewer looked at; a decision on older evidence is refused.
    expected_version: Option<u64>,
}

/// Reads the body (at most the configured size) and parses it as `T`, with errors that say
/// where the JSON is wrong.
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
    serde_json::from_slice(&bytes).map_err(|error| {
        use serde_json::error::Category;
        match error.classify() {
            Category::Data => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_input",
                format!("the body does not match the request: {error}"),
            ),
            _ => ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("the body is not valid JSON: {error}"),
            ),
        }
    })
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

// ---- views ----

/// An operation as every endpoint returns it.
fn operation_view(loaded: &LoadedOperation) -> Value {
    let state = &loaded.state;
    let intent = state.intent.as_ref();
    json!({
        "operation_id": loaded.operation_id,
        "state": state.status.name(),
        "message": agent_sentence(state),
        "external_id": state.external_id(),
        "attempts": state.attempts,
        "attempt_ids": state.attempt_ids,
        "tenant": intent.map(|i| &i.tenant),
        "provider": intent.map(|i| &i.provider),
        "account": intent.map(|i| &i.account),
        "action": intent.map(|i| &i.action),
        "args": intent.map(|i| i.args.as_map()),
        "args_hash": intent.map(|i| &i.args_hash),
        "idempotency_key": intent.map(|i| &i.idempotency_key),
        "source_id": intent.and_then(|i| i.source_id.as_ref()),
        "owner": intent.and_then(|i| i.owner.as_ref()),
        "requires_approval": intent.map(|i| i.requires_approval),
        "last_error": state.last_error,
        "review_reason": state.review_reason,
        "unknown_since": state.unknown_since,
        "duplicates": state.duplicates,
        "updated_at": state.updated_at,
        "version": loaded.version,
    })
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

// ---- handlers ----

async fn record(State(shared): State<Arc<Shared>>, request: Request) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let tenant = tenant_of(principal)?.clone();
    let body: RecordBody = body(&shared, request).await?;
    let provider = opledger_domain::ids::ProviderId::new(body.provider.clone())?;
    let account = opledger_domain::ids::AccountId::new(body.account.clone())?;
    let providers = shared.engine.providers();
    if providers.capabilities(&provider).is_none() {
        return Err(ApiError::invalid(ValidationError::new(
            "provider",
            format!("`{provider}` is not configured on this server; use one of its [[providers]]"),
        )));
    }
    let fingerprint = providers
        .credential_fingerprint(&provider, &account)
        .ok_or_else(|| {
            ApiError::invalid(ValidationError::new(
                "account",
                format!("`{account}` is not an account of provider `{provider}` on this server"),
            ))
        })?;
    let request = IntentRequest {
        tenant: tenant.to_string(),
        owner: body.owner,
        provider: body.provider,
        account: body.account,
        credential_fingerprint: fingerprint.to_string(),
        action: body.action,
        args: body.args,
        source_id: body.source_id,
        requires_approval: body.requires_approval,
    };
    // `record_intent` validates every field before it appends, so a bad field writes nothing.
    let recorded = shared.engine.ledger().record_intent(request).await?;
    shared
        .tenants
        .remember(recorded.operation.operation_id, tenant.clone());
    let status = if recorded.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut view = operation_view(&recorded.operation);
    view["created"] = json!(recorded.created);
    info!(operation_id = %recorded.operation.operation_id, created = recorded.created, %tenant, "intent recorded");
    Ok(json_reply(status, &view))
}

async fn show(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = Scope::of(shared.tokens.authenticate(&headers)?);
    let loaded = visible(&shared, &scope, operation_id(&id)?).await?;
    Ok(json_reply(StatusCode::OK, &operation_view(&loaded)))
}

async fn history(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = Scope::of(shared.tokens.authenticate(&headers)?);
    let operation_id = operation_id(&id)?;
    // Checked on the same read that is returned, so the answer cannot leak another tenant's.
    let view = view_of(shared.engine.ledger().store(), operation_id)
        .await
        .map_err(ApiError::from)?;
    let tenant = view
        .loaded
        .state
        .intent
        .as_ref()
        .map(|intent| &intent.tenant);
    if !tenant.is_some_and(|tenant| scope.allows(tenant)) {
        return Err(ApiError::not_found(format!("operation {operation_id}")));
    }
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "operation_id": operation_id,
            "state": view.loaded.state.status.name(),
            "version": view.loaded.version,
            "events": view.events,
            "timeline": view.lines,
        }),
    ))
}

async fn approve(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    approval(&shared, &id, request, Approval::Grant).await
}

async fn deny(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    approval(&shared, &id, request, Approval::Deny).await
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Approval {
    Grant,
    Deny,
}

/// Approves or denies exactly the recorded snapshot (named by its hash), as the approver the
/// token stands for (see [`approver_for`]).
async fn approval(
    shared: &Shared,
    id: &str,
    request: Request,
    kind: Approval,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let scope = Scope::of(principal);
    let operation_id = operation_id(id)?;
    let body: ApprovalBody = body(shared, request).await?;
    let args_hash = ArgsHash::parse(&body.args_hash).map_err(|e| field("args_hash", e))?;
    let reason = match (kind, body.reason) {
        (Approval::Deny, Some(reason)) => Some(reason),
        (Approval::Deny, None) => {
            return Err(ApiError::invalid(ValidationError::new(
                "reason",
                "is required to deny: say why, in a sentence",
            )))
        }
        (Approval::Grant, Some(_)) => {
            return Err(ApiError::invalid(ValidationError::new(
                "reason",
                "is only taken when denying",
            )))
        }
        (Approval::Grant, None) => None,
    };
    let tenant = check_visible(shared, &scope, operation_id).await?;
    let name = approver_for(principal, &tenant, &shared.approval_guard, body.approver)?;
    let approver = ActorId::new(name).map_err(|e| field("approver", e))?;
    let ledger = shared.engine.ledger();
    let loaded = match reason {
        Some(reason) => {
            ledger
                .deny(operation_id, approver, args_hash, reason)
                .await?
        }
        None => ledger.approve(operation_id, approver, args_hash).await?,
    };
    Ok(json_reply(StatusCode::OK, &operation_view(&loaded)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteQuery {
    wait_ms: Option<String>,
}

async fn execute(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    query: Result<Query<ExecuteQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let scope = Scope::of(principal);
    tenant_of(principal)?;
    let operation_id = operation_id(&id)?;
    let Query(query) = query.map_err(|error| query_error(&error))?;
    let wait_ms = match query.wait_ms.as_deref() {
        None => shared.limits.default_wait_ms,
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|wait| *wait <= shared.limits.max_wait_ms)
            .ok_or_else(|| {
                ApiError::invalid(ValidationError::new(
                    "wait_ms",
                    format!(
                        "`{text}` must be a whole number of milliseconds from 0 to {}",
                        shared.limits.max_wait_ms
                    ),
                ))
            })?,
    };
    check_visible(&shared, &scope, operation_id).await?;
    let span = tracing::info_span!("execute", %operation_id, wait_ms);
    let loaded = drive_until(&shared, operation_id, Duration::from_millis(wait_ms))
        .instrument(span)
        .await?;
    Ok(json_reply(StatusCode::OK, &operation_view(&loaded)))
}

/// Drives the operation until it settles, needs a person, or the wait runs out — whichever comes
/// first. A drive in progress is never cut off by the deadline: an outcome the provider gave is
/// always recorded before answering.
async fn drive_until(
    shared: &Shared,
    operation_id: OperationId,
    wait: Duration,
) -> Result<LoadedOperation, ApiError> {
    let deadline = Instant::now() + wait;
    let mut in_flight_pause = IN_FLIGHT_POLL_MIN;
    loop {
        // Spawned, so a caller who hangs up cannot cancel a send half-way: the drive always
        // records what the provider answered.
        let engine = Arc::clone(&shared.engine);
        let report = tokio::spawn(async move { engine.drive(operation_id).await })
            .await
            .map_err(|error| ApiError::internal("a drive failed", error))??;
        let state = report.state();
        let now = Instant::now();
        if now >= deadline {
            return Ok(report.operation);
        }
        let pause = match (&state.status, state.next_work()) {
            // Another worker is sending it: look for its outcome soon.
            (Status::InFlight, _) => {
                let pause = in_flight_pause;
                in_flight_pause = (in_flight_pause * 2).min(IN_FLIGHT_POLL_MAX);
                pause
            }
            (Status::Pending | Status::Unknown, Some((due_at, _))) => (due_at - Utc::now())
                .to_std()
                .unwrap_or(Duration::ZERO)
                .max(Duration::from_millis(1)),
            // Settled, awaiting approval, or with a person: nothing more will happen by waiting.
            _ => return Ok(report.operation),
        };
        let remaining = deadline - now;
        if pause >= remaining {
            return Ok(report.operation);
        }
        let mut shutdown = shared.shutdown.clone();
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            // A server going down answers with where the operation stands now.
            _ = shutdown.wait_for(|stopping| *stopping) => return Ok(report.operation),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    older_than: Option<String>,
    limit: Option<String>,
    after: Option<String>,
    tenant: Option<String>,
}

async fn list(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let scope = Scope::of(principal);
    let Query(query) = query.map_err(|error| query_error(&error))?;
    if let Some(state) = &query.state {
        if state == "new" || !STATE_NAMES.contains(&state.as_str()) {
            return Err(ApiError::invalid(ValidationError::new(
                "state",
                format!(
                    "`{state}` is not a state; use one of {}",
                    STATE_NAMES
                        .iter()
                        .filter(|name| **name != "new")
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )));
        }
    }
    let older_than = query
        .older_than
        .as_deref()
        .map(|text| crate::views::parse_duration("older_than", text))
        .transpose()?;
    let limit = page_limit(query.limit.as_deref())?;
    let after = query
        .after
        .as_deref()
        .map(|text| {
            text.parse::<OperationId>()
                .map_err(|error| ValidationError::new("after", error.message))
        })
        .transpose()?;
    // A tenant lists its own operations; an operator one tenant of its scope at a time or all.
    let tenant = match (&scope, query.tenant.as_deref()) {
        (_, Some(text)) => {
            let tenant = TenantId::new(text).map_err(|e| field("tenant", e))?;
            if !scope.allows(&tenant) {
                return Err(ApiError::not_found(format!("tenant {tenant}")));
            }
            Some(tenant)
        }
        (Scope::Tenants(tenants), None) if tenants.len() == 1 => tenants.iter().next().cloned(),
        (Scope::All, None) => None,
        (Scope::Tenants(_), None) => {
            return Err(ApiError::invalid(ValidationError::new(
                "tenant",
                "this token sees several tenants; name one with ?tenant=",
            )))
        }
    };
    fresh_read_models(&shared).await?;
    let now = Utc::now();
    let filter = OperationFilter {
        state: query.state.clone(),
        tenant: tenant.clone(),
        older_than: older_than.map(|duration| now - duration),
    };
    let page = shared
        .read_models
        .call(move |store| {
            let cursor = match after {
                Some(operation_id) => match store.operation(operation_id)? {
                    // The cursor must be an operation of the listed tenant, or paging would tell
                    // another tenant's operation ids apart from unknown ones.
                    Some(row) if tenant.as_ref().is_none_or(|t| *t == row.tenant) => {
                        Some(OperationCursor {
                            created_at: row.created_at,
                            operation_id,
                        })
                    }
                    _ => {
                        return Err(ReadModelError::InvalidQuery {
                            reason: format!(
                                "after={operation_id} names no operation of yours; pass the `next` of the previous page"
                            ),
                        })
                    }
                },
                None => None,
            };
            store.list_operations(&filter, limit, cursor.as_ref())
        })
        .await?;
    let rows: Vec<Value> = page
        .operations
        .iter()
        .map(|row| operation_json(row, now))
        .collect();
    let next = page.next.as_ref().map(|cursor| cursor.operation_id);
    Ok(json_reply(
        StatusCode::OK,
        &json!({"operations": rows, "next": next}),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewQueueQuery {
    limit: Option<String>,
}

async fn review_queue(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ReviewQueueQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, scope) = operator_of(shared.tokens.authenticate(&headers)?)?;
    let Query(query) = query.map_err(|error| query_error(&error))?;
    let limit = page_limit(query.limit.as_deref())?;
    fresh_read_models(&shared).await?;
    let queue = shared
        .read_models
        .call(move |store| match scope {
            Scope::All => store.review_queue(limit),
            Scope::Tenants(tenants) => {
                store.review_queue_of(&tenants.into_iter().collect::<Vec<_>>(), limit)
            }
        })
        .await?;
    let now = Utc::now();
    let rows: Vec<Value> = queue
        .iter()
        .map(|item| {
            json!({
                "operation_id": item.operation_id,
                "state": item.state,
                "since": item.since,
                "age_s": (now - item.since).num_seconds().max(0),
                "tenant": item.tenant,
                "provider": item.provider,
                "account": item.account,
                "attempts": item.attempts,
                "lookups": item.lookups,
                "last_error": item.last_error,
                "last_lookup": item.last_lookup.as_ref().map(|lookup| json!({
                    "result": lookup.result,
                    "evidence": lookup.evidence,
                    "at": lookup.at,
                })),
                "reason": item.review.as_ref().map(|review| &review.reason),
                "evidence": item.review.as_ref().map(|review| &review.evidence),
                "updated_at": item.updated_at,
            })
        })
        .collect();
    Ok(json_reply(StatusCode::OK, &json!({"queue": rows})))
}

async fn review(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let (name, scope) = operator_of(principal)?;
    let reviewer = ActorId::new(name.to_owned())?;
    let operation_id = operation_id(&id)?;
    let body: ReviewBody = body(&shared, request).await?;
    let decision = match (body.decision.as_str(), body.external_id) {
        ("retry", None) => ReviewDecision::Retry,
        ("abandon", None) => ReviewDecision::Abandon,
        ("confirm", Some(external_id)) => ReviewDecision::ConfirmSucceeded {
            external_id: ExternalObjectId::new(external_id).map_err(|e| field("external_id", e))?,
        },
        ("confirm", None) => {
            return Err(ApiError::invalid(ValidationError::new(
                "external_id",
                "is required with decision `confirm`: the id of the object found at the provider",
            )))
        }
        ("retry" | "abandon", Some(_)) => {
            return Err(ApiError::invalid(ValidationError::new(
                "external_id",
                "is only taken with decision `confirm`",
            )))
        }
        (other, _) => {
            return Err(ApiError::invalid(ValidationError::new(
                "decision",
                format!("`{other}` is not a decision; use retry, confirm or abandon"),
            )))
        }
    };
    let loaded = visible(&shared, &scope, operation_id).await?;
    if let Some(expected) = body.expected_version {
        let current = loaded.version.map(StreamVersion::value);
        if current != Some(expected) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "stale",
                format!(
                    "the operation is at version {} now, not {expected}: new evidence arrived; look again before deciding",
                    current.unwrap_or(0)
                ),
            ));
        }
    }
    // With `expected_version` the decision is appended on exactly that version (a concurrent
    // lookup or late answer makes it `stale`, atomically); without, on the current one.
    // Spawned for the same reason as a drive: a retry decided here sends at once.
    let engine = Arc::clone(&shared.engine);
    let pinned = body.expected_version.is_some();
    let report = tokio::spawn(async move {
        if pinned {
            engine
                .resolve_review_seen(loaded, reviewer, decision, body.note)
                .await
        } else {
            engine
                .resolve_review(operation_id, reviewer, decision, body.note)
                .await
        }
    })
    .await
    .map_err(|error| ApiError::internal("a review decision failed", error))??;
    Ok(json_reply(
        StatusCode::OK,
        &operation_view(&report.operation),
    ))
}

async fn trace(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = Scope::of(shared.tokens.authenticate(&headers)?);
    let id = id.trim().to_owned();
    if id.is_empty() || id.len() > MAX_TRACE_ID_BYTES {
        return Err(ApiError::invalid(ValidationError::new(
            "id",
            format!("must be 1 to {MAX_TRACE_ID_BYTES} bytes: an operation, attempt, external object or source id"),
        )));
    }
    fresh_read_models(&shared).await?;
    let query = id.clone();
    let visible_scope = scope.clone();
    // Filtered by tenant before the cap: short external ids ("731") and source ids repeat across
    // tenants, and another tenant's matches must not crowd out the caller's own.
    let candidates = shared
        .read_models
        .call(move |store| {
            let mut visible = Vec::new();
            for candidate in store.trace_candidates(&query, MAX_QUERY_ROWS)? {
                let allowed = match &visible_scope {
                    Scope::All => true,
                    Scope::Tenants(_) => store
                        .operation(candidate)?
                        .is_some_and(|row| visible_scope.allows(&row.tenant)),
                };
                if allowed {
                    visible.push(candidate);
                }
                if visible.len() >= MAX_TRACE_MATCHES {
                    break;
                }
            }
            Ok(visible)
        })
        .await?;
    let store = shared.engine.ledger().store();
    let mut matches = Vec::new();
    for candidate in candidates {
        let view = view_of(store, candidate).await.map_err(ApiError::from)?;
        let tenant = view
            .loaded
            .state
            .intent
            .as_ref()
            .map(|intent| &intent.tenant);
        if tenant.is_some_and(|tenant| scope.allows(tenant)) {
            matches.push(view);
        }
    }
    let Some(first) = matches.first() else {
        return Err(ApiError::not_found(format!("anything matching `{id}`")));
    };
    let others: Vec<OperationId> = matches[1..]
        .iter()
        .map(|view| view.loaded.operation_id)
        .collect();
    let mut body = operation_view(&first.loaded);
    body["query"] = json!(id);
    body["events"] = json!(first.events);
    body["timeline"] = json!(first.lines);
    body["other_matches"] = json!(others);
    Ok(json_reply(StatusCode::OK, &body))
}

async fn health(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let store = shared.engine.ledger().store();
    let lag = shared.read_models.lag(store).await?;
    let head = store.head_position().await?;
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "log_head": head,
            "read_model_checkpoint": lag.checkpoint,
            "read_model_lag_events": lag.positions,
        }),
    ))
}

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        Body::from(super::OPENAPI),
    )
        .into_response()
}

// ---- helpers ----

/// Waits (bounded) until the read models have applied the log up to its head as it is now, so
/// a listing right after a write shows the write.
async fn fresh_read_models(shared: &Shared) -> Result<(), ApiError> {
    let Some(head) = shared.engine.ledger().store().head_position().await? else {
        return Ok(());
    };
    let started = Instant::now();
    loop {
        let checkpoint = shared.read_models.checkpoint().await?;
        if checkpoint.is_some_and(|checkpoint| checkpoint >= head) {
            return Ok(());
        }
        if started.elapsed() >= FRESHNESS_WAIT {
            tracing::warn!(?checkpoint, %head, "answering from read models that are behind the log");
            return Ok(());
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

fn query_error(error: &axum::extract::rejection::QueryRejection) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_input",
        format!("the query string is not understood: {}", error.body_text()),
    )
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

    #[test]
    fn every_documented_error_status_uses_the_error_shape() {
        let spec: Value = serde_json::from_str(super::super::OPENAPI).expect("the spec is JSON");
        for (path, methods) in spec["paths"].as_object().expect("paths") {
            for (method, operation) in methods.as_object().expect("methods") {
                for (status, response) in operation["responses"].as_object().expect("responses") {
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
