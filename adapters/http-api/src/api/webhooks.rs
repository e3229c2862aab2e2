//! Webhook endpoints for operators: list them with state and lag, pause, resume, replay from a
//! position or a time, and read the attempt log; define, change and delete endpoints, rotate
//! their secrets, send a test event and resend one event, without a restart. Operator tokens
//! only; an operator limited to some tenants sees and acts on only the endpoints whose tenants
//! are all theirs, and defines only such endpoints. Endpoints from the configuration file are
//! changed there, not here.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{EventStore, LogStart};
use opledger_webhooks::endpoint::{check_url, MAX_ENDPOINT_ID_BYTES};
use opledger_webhooks::managed::{
    Definition, StoredSecret, DEFAULT_ROTATION_OVERLAP_S, MAX_ROTATION_OVERLAP_S,
};
use opledger_webhooks::schedule::{DEFAULT_RETRY_WINDOW_S, MAX_RETRY_WINDOW_S};
use opledger_webhooks::signing::Secret;
use opledger_webhooks::{
    EndpointOverview, WebhookError, DEFAULT_REQUEST_TIMEOUT_MS, MAX_REQUEST_TIMEOUT_MS,
    MIN_REQUEST_TIMEOUT_MS,
};
use serde::Deserialize;
use serde_json::json;

use super::{body, IdPath};
use crate::auth::{operator_for_route, Scope};
use crate::error::{json_reply, ApiError};
use crate::render::wanted_types;
use crate::{ServeStore, Shared};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AttemptsQuery {
    limit: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    /// Deliver again every event after this position (0: from the beginning).
    after_position: Option<u64>,
    /// Deliver again every event from this time on.
    since: Option<DateTime<Utc>>,
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, scope) = operator_for_route(shared.tokens.authenticate(&headers)?, "GET /v1/webhooks")?;
    let head = head(&shared).await?;
    let endpoints = shared
        .webhooks
        .overview(head)
        .await
        .map_err(webhook_error)?
        .into_iter()
        .filter(|endpoint| visible(&scope, endpoint))
        .collect::<Vec<_>>();
    Ok(json_reply(
        StatusCode::OK,
        &json!({ "endpoints": endpoints }),
    ))
}

pub(super) async fn pause(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let name = operator_endpoint(&shared, &headers, &id, "pause").await?;
    shared
        .webhooks
        .pause(&id, &name)
        .await
        .map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, "webhook endpoint paused");
    overview(&shared, &id).await
}

pub(super) async fn resume(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let name = operator_endpoint(&shared, &headers, &id, "resume").await?;
    shared.webhooks.resume(&id).await.map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, "webhook endpoint resumed");
    overview(&shared, &id).await
}

pub(super) async fn replay(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let name = operator_endpoint(&shared, &headers, &id, "replay").await?;
    let replay: ReplayRequest = body(&shared, request).await?;
    let after = match (replay.after_position, replay.since) {
        (Some(position), None) => (position > 0).then_some(position),
        (None, Some(since)) => position_before(shared.engine.ledger().store(), since).await?,
        _ => {
            return Err(ApiError::invalid(ValidationError::new(
                "after_position",
                "give exactly one of after_position (a log position; 0 for the beginning) or since (an RFC 3339 time)",
            )))
        }
    };
    let head = head(&shared).await?;
    shared
        .webhooks
        .replay(&id, after, head)
        .await
        .map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, after = ?after, "webhook endpoint replays");
    overview(&shared, &id).await
}

pub(super) async fn attempts(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    query: Result<Query<AttemptsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    operator_endpoint(&shared, &headers, &id, "attempts").await?;
    let Query(query) = query?;
    let limit = super::page_limit(query.limit.as_deref())?;
    let attempts = shared
        .webhooks
        .attempts(&id, limit as u64)
        .await
        .map_err(webhook_error)?;
    Ok(json_reply(StatusCode::OK, &json!({ "attempts": attempts })))
}

/// Authenticates an operator who may act on endpoint `id` (at its route ending in `what`); their
/// name.
async fn operator_endpoint(
    shared: &Shared,
    headers: &HeaderMap,
    id: &str,
    what: &str,
) -> Result<String, ApiError> {
    let method = if what == "attempts" { "GET" } else { "POST" };
    // Another instance may have defined it a moment ago.
    if shared.webhooks.endpoint(id, None).await.is_err() {
        let _ = shared.webhooks.sync().await;
    }
    let route = format!("{method} /v1/webhooks/{{id}}/{what}");
    let (name, scope) = operator_for_route(shared.tokens.authenticate(headers)?, &route)?;
    let endpoint = shared
        .webhooks
        .endpoint(id, None)
        .await
        .map_err(webhook_error)?;
    if !visible(&scope, &endpoint) {
        return Err(no_such_endpoint(id));
    }
    Ok(name.to_owned())
}

async fn overview(shared: &Shared, id: &str) -> Result<Response, ApiError> {
    let head = head(shared).await?;
    let endpoint = shared
        .webhooks
        .endpoint(id, head)
        .await
        .map_err(webhook_error)?;
    Ok(json_reply(StatusCode::OK, &json!(endpoint)))
}

async fn head(shared: &Shared) -> Result<Option<u64>, ApiError> {
    Ok(shared
        .engine
        .ledger()
        .store()
        .head_position()
        .await?
        .map(GlobalPosition::value))
}

/// Whether an operator with `scope` may see `endpoint`: every tenant it delivers must be theirs.
fn visible(scope: &Scope, endpoint: &EndpointOverview) -> bool {
    match (scope, &endpoint.tenants) {
        (Scope::All, _) => true,
        (Scope::Tenants(_), None) => false,
        (Scope::Tenants(mine), Some(tenants)) => tenants
            .iter()
            .all(|tenant| mine.iter().any(|m| m.as_str() == tenant)),
    }
}

/// The position just before the first event at or after `since` (`None`: the log's beginning),
/// found by bisecting positions, so it costs a few dozen one-event reads however long the log.
/// Events are appended in time order by one writer, so their times grow with their positions
/// (clock steps aside, which may move the start by as much as the step).
async fn position_before(
    store: &ServeStore,
    since: DateTime<Utc>,
) -> Result<Option<u64>, ApiError> {
    let Some(head) = store.head_position().await? else {
        return Ok(None);
    };
    // The smallest `low` whose first event at or after it happened at or after `since` (the
    // head's successor when none did); the events from it on are the ones to deliver again.
    let (mut low, mut high) = (1u64, head.value().saturating_add(1));
    while low < high {
        let middle = low + (high - low) / 2;
        let start = LogStart::After(GlobalPosition::new(middle - 1));
        let at = match store.read_all(start, 1).await?.first() {
            Some(event) => codec::decode(event)
                .map_err(|error| ApiError::internal("a stored event could not be read", error))?
                .at(),
            // Nothing at or after `middle`: no event there is before `since` either.
            None => since,
        };
        if at >= since {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    let after = low - 1;
    Ok((after > 0).then_some(after))
}

fn no_such_endpoint(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "webhook endpoint `{id}` does not exist (or is not yours); GET /v1/webhooks lists them"
        ),
    )
}

fn webhook_error(error: WebhookError) -> ApiError {
    match error {
        WebhookError::NoSuchEndpoint { id } => no_such_endpoint(&id),
        beyond @ WebhookError::ReplayBeyondHead { .. } => {
            ApiError::invalid(ValidationError::new("after_position", beyond.to_string()))
        }
        WebhookError::Definition { reason } => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_input", reason)
        }
        none @ WebhookError::NoJournal => {
            ApiError::new(StatusCode::CONFLICT, "no_webhooks_here", none.to_string())
        }
        other => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("webhook delivery's journal is unavailable ({other}); try again shortly"),
        ),
    }
}

/// `POST /v1/webhooks`: an endpoint defined through the API.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    id: String,
    url: String,
    events: Vec<String>,
    tenants: Option<Vec<String>>,
    #[serde(default)]
    allow_private_network: bool,
    retry_window_s: Option<u64>,
    request_timeout_ms: Option<u64>,
    /// A `whsec_…` secret; one is made when left out.
    secret: Option<String>,
}

/// `PATCH /v1/webhooks/{id}`: the fields to change (the secret is rotated on its own route).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateRequest {
    url: Option<String>,
    events: Option<Vec<String>>,
    /// `null` for every tenant.
    #[serde(default, with = "double_option")]
    tenants: Option<Option<Vec<String>>>,
    allow_private_network: Option<bool>,
    retry_window_s: Option<u64>,
    request_timeout_ms: Option<u64>,
}

/// `POST /v1/webhooks/{id}/rotate-secret`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RotateRequest {
    /// The new `whsec_…` secret; one is made when left out.
    secret: Option<String>,
    /// How long the old secret keeps signing beside the new one, in seconds.
    overlap_s: Option<u64>,
}

/// `POST /v1/webhooks/{id}/resend`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResendRequest {
    /// The log position of the event to deliver again.
    position: u64,
}

/// Tells a field left out (`None`) from one set to null (`Some(None)`).
mod double_option {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(deserializer).map(Some)
    }
}

fn invalid(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(ValidationError::new(field, message.into()))
}

/// A fresh `whsec_…` secret: 32 bytes from two v4 UUIDs (244 random bits from the UUID crate's
/// cryptographically secure generator; the version and variant bits are fixed).
fn fresh_secret() -> String {
    let mut key = Vec::with_capacity(32);
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    Secret::encode(&key)
}

fn checked_secret(field: &str, secret: Option<String>) -> Result<String, ApiError> {
    let secret = secret.unwrap_or_else(fresh_secret);
    Secret::parse(&secret).map_err(|message| invalid(field, message))?;
    // Kept out of every log line and answer but the one that hands it over.
    opledger_domain::redact::register(&secret);
    Ok(secret)
}

/// Checks the parts of a definition only the server knows (event types, tenants within the
/// operator's scope, ranges); the URL's address rules are checked by the webhooks crate as it
/// is defined.
fn check_definition(
    shared: &Shared,
    scope: &Scope,
    definition: &Definition,
) -> Result<(), ApiError> {
    wanted_types("events", &definition.events).map_err(ApiError::invalid)?;
    if definition.events.is_empty() {
        return Err(invalid(
            "events",
            "is empty; list the event types it receives, e.g. [\"succeeded\", \"needs_review\"], or [\"all\"]",
        ));
    }
    let known = shared.tokens.tenants();
    match (&definition.tenants, scope) {
        (None, Scope::Tenants(_)) => {
            return Err(invalid(
                "tenants",
                "is required for an operator limited to some tenants: name tenants of yours",
            ))
        }
        (Some(tenants), _) => {
            if tenants.is_empty() {
                return Err(invalid(
                    "tenants",
                    "is empty; name at least one tenant, or leave tenants out (null) for all",
                ));
            }
            for tenant in tenants {
                let yours = match scope {
                    Scope::All => true,
                    Scope::Tenants(mine) => mine.iter().any(|m| m.as_str() == tenant),
                };
                if !known.contains(tenant.as_str()) || !yours {
                    return Err(invalid(
                        "tenants",
                        format!("`{tenant}` is not a tenant of yours; name tenants from [[tenants]] that your token covers"),
                    ));
                }
            }
        }
        (None, Scope::All) => {}
    }
    if !(1..=MAX_RETRY_WINDOW_S).contains(&definition.retry_window_s) {
        return Err(invalid(
            "retry_window_s",
            format!("is {}; use 1 to {MAX_RETRY_WINDOW_S} seconds (the default, {DEFAULT_RETRY_WINDOW_S}, is three days)", definition.retry_window_s),
        ));
    }
    if !(MIN_REQUEST_TIMEOUT_MS..=MAX_REQUEST_TIMEOUT_MS).contains(&definition.request_timeout_ms) {
        return Err(invalid(
            "request_timeout_ms",
            format!("is {}; use {MIN_REQUEST_TIMEOUT_MS} to {MAX_REQUEST_TIMEOUT_MS} ms (the default is {DEFAULT_REQUEST_TIMEOUT_MS})", definition.request_timeout_ms),
        ));
    }
    check_url(&definition.url, definition.allow_private_network)
        .map_err(|message| invalid("url", message))?;
    Ok(())
}

fn check_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ENDPOINT_ID_BYTES
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "id",
            format!("`{id}` is not an endpoint id; use 1 to {MAX_ENDPOINT_ID_BYTES} letters, digits, `-` or `_`, e.g. \"billing\""),
        ))
    }
}

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let (name, scope) = operator_for_route(principal, "POST /v1/webhooks")?;
    let name = name.to_owned();
    let create: CreateRequest = body(&shared, request).await?;
    check_id(&create.id)?;
    if shared.webhooks.endpoint(&create.id, None).await.is_ok() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "exists",
            format!("webhook endpoint `{}` exists already; change it with PATCH /v1/webhooks/{}, or choose another id", create.id, create.id),
        ));
    }
    let secret = checked_secret("secret", create.secret)?;
    let definition = Definition {
        url: create.url.trim().to_owned(),
        events: create.events,
        tenants: create.tenants,
        allow_private_network: create.allow_private_network,
        retry_window_s: create.retry_window_s.unwrap_or(DEFAULT_RETRY_WINDOW_S),
        request_timeout_ms: create
            .request_timeout_ms
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS),
        secrets: vec![StoredSecret {
            secret: secret.clone(),
            expires_at: None,
        }],
    };
    check_definition(&shared, &scope, &definition)?;
    shared
        .webhooks
        .define(&create.id, &definition)
        .await
        .map_err(webhook_error)?;
    tracing::info!(endpoint = %create.id, operator = %name, "webhook endpoint defined");
    let mut answer = overview_json(&shared, &create.id).await?;
    answer["secret"] = json!(secret);
    Ok(json_reply(StatusCode::CREATED, &answer))
}

/// The definition of an endpoint the caller may change through the API.
async fn managed(
    shared: &Shared,
    headers: &HeaderMap,
    id: &str,
    route: &str,
) -> Result<(String, Scope, Definition), ApiError> {
    let (name, scope) = operator_for_route(shared.tokens.authenticate(headers)?, route)?;
    let endpoint = shared
        .webhooks
        .endpoint(id, None)
        .await
        .map_err(webhook_error)?;
    if !visible(&scope, &endpoint) {
        return Err(no_such_endpoint(id));
    }
    let definition = shared
        .webhooks
        .definition(id)
        .await
        .map_err(webhook_error)?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "configured_in_file",
                format!("webhook endpoint `{id}` is defined in the configuration file; change it there (the API changes only the endpoints it defined)"),
            )
        })?;
    Ok((name.to_owned(), scope, definition))
}

pub(super) async fn update(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let (name, scope, mut definition) =
        managed(&shared, &headers, &id, "PATCH /v1/webhooks/{id}").await?;
    let update: UpdateRequest = body(&shared, request).await?;
    if let Some(url) = update.url {
        definition.url = url.trim().to_owned();
    }
    if let Some(events) = update.events {
        definition.events = events;
    }
    if let Some(tenants) = update.tenants {
        definition.tenants = tenants;
    }
    if let Some(allow) = update.allow_private_network {
        definition.allow_private_network = allow;
    }
    if let Some(window) = update.retry_window_s {
        definition.retry_window_s = window;
    }
    if let Some(timeout) = update.request_timeout_ms {
        definition.request_timeout_ms = timeout;
    }
    check_definition(&shared, &scope, &definition)?;
    shared
        .webhooks
        .define(&id, &definition)
        .await
        .map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, "webhook endpoint changed");
    Ok(json_reply(
        StatusCode::OK,
        &overview_json(&shared, &id).await?,
    ))
}

pub(super) async fn remove(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (name, _, _) = managed(&shared, &headers, &id, "DELETE /v1/webhooks/{id}").await?;
    shared.webhooks.delete(&id).await.map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, "webhook endpoint deleted");
    Ok(json_reply(
        StatusCode::OK,
        &json!({"id": id, "deleted": true}),
    ))
}

pub(super) async fn rotate(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let (name, _, mut definition) = managed(
        &shared,
        &headers,
        &id,
        "POST /v1/webhooks/{id}/rotate-secret",
    )
    .await?;
    let rotate: RotateRequest = body(&shared, request).await?;
    let overlap_s = rotate.overlap_s.unwrap_or(DEFAULT_ROTATION_OVERLAP_S);
    if overlap_s > MAX_ROTATION_OVERLAP_S {
        return Err(invalid(
            "overlap_s",
            format!("is {overlap_s}; the old secret may keep signing 0 to {MAX_ROTATION_OVERLAP_S} seconds (a week)"),
        ));
    }
    let secret = checked_secret("secret", rotate.secret)?;
    let now = Utc::now();
    let overlap_ends = now + chrono::Duration::seconds(i64::try_from(overlap_s).unwrap_or(0));
    definition
        .rotate(secret.clone(), overlap_ends, now)
        .map_err(|message| ApiError::new(StatusCode::CONFLICT, "too_many_secrets", message))?;
    shared
        .webhooks
        .define(&id, &definition)
        .await
        .map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, overlap_s, "webhook endpoint's secret rotated");
    let mut answer = overview_json(&shared, &id).await?;
    answer["secret"] = json!(secret);
    answer["previous_secret_expires_at"] = json!((overlap_s > 0).then_some(overlap_ends));
    Ok(json_reply(StatusCode::OK, &answer))
}

pub(super) async fn test(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let name = operator_endpoint(&shared, &headers, &id, "test").await?;
    let now = Utc::now();
    let body = serde_json::to_vec(&json!({
        "data": {"endpoint": id, "sent_by": name, "message": "a test event from opledger; no operation changed"},
        "timestamp": now,
        "type": "webhook.test",
    }))
    .map_err(|error| ApiError::internal("a test event could not be written", error))?;
    let webhook_id = format!("msg_test_{}", uuid::Uuid::new_v4().simple());
    let attempt = shared
        .webhooks
        .send_once(&id, 0, &webhook_id, &body)
        .await
        .map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, status = ?attempt.status, "webhook test event sent");
    Ok(json_reply(StatusCode::OK, &json!({"attempt": attempt})))
}

pub(super) async fn resend(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let name = operator_endpoint(&shared, &headers, &id, "resend").await?;
    let resend: ResendRequest = body(&shared, request).await?;
    let store = shared.engine.ledger().store();
    let start = LogStart::After(GlobalPosition::new(resend.position.saturating_sub(1)));
    let event = store
        .read_all(start, 1)
        .await?
        .into_iter()
        .next()
        .filter(|event| event.position.value() == resend.position)
        .ok_or_else(|| {
            invalid(
                "position",
                format!("no event is at position {}; GET /v1/webhooks/{id}/attempts lists the positions delivered", resend.position),
            )
        })?;
    let endpoint = shared
        .webhooks
        .endpoint(&id, None)
        .await
        .map_err(webhook_error)?;
    let kinds = endpoint.events.iter().cloned().collect();
    let render = crate::webhooks::OutcomeRender {
        store: store.clone(),
        engine: Arc::clone(&shared.engine),
        states: std::sync::Mutex::default(),
    };
    let message = opledger_webhooks::Render::render(&render, &event, &kinds)
        .await
        .map_err(|error| ApiError::internal("the event could not be rendered", error))?
        .filter(|message| {
            endpoint
                .tenants
                .as_ref()
                .is_none_or(|tenants| tenants.contains(&message.tenant))
        })
        .ok_or_else(|| {
            invalid(
                "position",
                format!("the event at position {} is not one endpoint `{id}` receives (its types or tenants)", resend.position),
            )
        })?;
    let body = serde_json::to_vec(&json!({
        "data": message.data,
        "timestamp": message.at,
        "type": format!("operation.{}", message.kind),
    }))
    .map_err(|error| ApiError::internal("the event could not be written", error))?;
    // The delivery's own id: a receiver that has it already deduplicates, as for any repeat.
    let webhook_id = opledger_webhooks::signing::webhook_id(event.event_id);
    let attempt = shared
        .webhooks
        .send_once(&id, resend.position, &webhook_id, &body)
        .await
        .map_err(webhook_error)?;
    tracing::info!(endpoint = %id, operator = %name, position = resend.position, status = ?attempt.status, "webhook event resent");
    Ok(json_reply(StatusCode::OK, &json!({"attempt": attempt})))
}

async fn overview_json(shared: &Shared, id: &str) -> Result<serde_json::Value, ApiError> {
    let head = head(shared).await?;
    let endpoint = shared
        .webhooks
        .endpoint(id, head)
        .await
        .map_err(webhook_error)?;
    Ok(json!(endpoint))
}
