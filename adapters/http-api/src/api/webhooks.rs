//! Webhook endpoints for operators and tenants: list them with state and lag, pause, resume,
//! replay from a position or a time, and read the attempt log and what an attempt sent; define,
//! change and delete endpoints, rotate their secrets, send a test event and resend one event,
//! without a restart. An operator limited to some tenants sees and acts on only the endpoints
//! whose tenants are all theirs, and defines only such endpoints. A tenant's token manages its
//! own endpoints only (defined, changed, tested and read; pausing and replays are operators'):
//! they receive that tenant's events alone, and it never sees or touches another tenant's or an
//! operator's endpoint, which answer as if they did not exist. Endpoints from the configuration
//! file are changed there, not here.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{EventStore, LogStart};
use opledger_webhooks::endpoint::{check_url, is_loopback_url, MAX_ENDPOINT_ID_BYTES};
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
use crate::Principal;
use crate::{ServeStore, Shared};
use opledger_domain::ids::TenantId;

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

/// Most endpoints one tenant may define through the API: the server delivers at most
/// [`opledger_webhooks::MAX_ENDPOINTS`], and one tenant must not take them all from the others.
pub(crate) const MAX_ENDPOINTS_PER_TENANT: usize = 8;
const _: () = assert!(MAX_ENDPOINTS_PER_TENANT < opledger_webhooks::MAX_ENDPOINTS);

/// Who manages endpoints through a request: an operator within their scope, or a tenant's token
/// over its own endpoints.
enum Manager {
    Operator { name: String, scope: Scope },
    Tenant(TenantId),
}

impl Manager {
    /// The caller of `route`, when it may manage endpoints there: an operator anywhere, a tenant
    /// where `tenants_too`; 403 otherwise, naming the route.
    fn of(principal: &Principal, route: &str, tenants_too: bool) -> Result<Self, ApiError> {
        match principal {
            Principal::Tenant(tenant) if tenants_too => Ok(Self::Tenant(tenant.clone())),
            _ => {
                let (name, scope) = operator_for_route(principal, route)?;
                Ok(Self::Operator {
                    name: name.to_owned(),
                    scope,
                })
            }
        }
    }

    /// Whether this caller sees `endpoint`: an operator, if every tenant it delivers is theirs;
    /// a tenant, if it is the tenant's own.
    fn sees(&self, endpoint: &EndpointOverview) -> bool {
        match self {
            Self::Operator { scope, .. } => visible(scope, endpoint),
            Self::Tenant(tenant) => endpoint.managed_by.as_deref() == Some(tenant.as_str()),
        }
    }

    /// The name the logs and a test event give the caller.
    fn name(&self) -> String {
        match self {
            Self::Operator { name, .. } => name.clone(),
            Self::Tenant(tenant) => format!("tenant {tenant}"),
        }
    }

    /// The scope a definition's tenants are checked against.
    fn scope(&self) -> Scope {
        match self {
            Self::Operator { scope, .. } => scope.clone(),
            Self::Tenant(tenant) => {
                Scope::Tenants(std::collections::BTreeSet::from([tenant.clone()]))
            }
        }
    }
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let manager = Manager::of(
        shared.tokens.authenticate(&headers)?,
        "GET /v1/webhooks",
        true,
    )?;
    let head = head(&shared).await?;
    let endpoints = shared
        .webhooks
        .overview(head)
        .await
        .map_err(webhook_error)?
        .into_iter()
        .filter(|endpoint| manager.sees(endpoint))
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
    endpoint_manager(&shared, &headers, &id, "attempts", true).await?;
    let Query(query) = query?;
    let limit = super::page_limit(query.limit.as_deref())?;
    let attempts = shared
        .webhooks
        .attempts(&id, limit as u64)
        .await
        .map_err(webhook_error)?;
    let store = shared.engine.ledger().store();
    let mut operations: std::collections::HashMap<u64, Option<String>> =
        std::collections::HashMap::new();
    let mut rows = Vec::with_capacity(attempts.len());
    for attempt in attempts {
        // Which operation the delivered event belongs to, so an attempt links to it (a test
        // event, at position 0, to none).
        let operation = match operations.get(&attempt.position) {
            Some(known) => known.clone(),
            None => {
                let found = operation_at(store, attempt.position).await?;
                operations.insert(attempt.position, found.clone());
                found
            }
        };
        let mut row = json!(attempt);
        row["operation_id"] = json!(operation);
        rows.push(row);
    }
    Ok(json_reply(StatusCode::OK, &json!({ "attempts": rows })))
}

/// The operation whose event is at `position`, if one is (none for 0, a test event's).
async fn operation_at(store: &ServeStore, position: u64) -> Result<Option<String>, ApiError> {
    if position == 0 {
        return Ok(None);
    }
    let start = LogStart::After(GlobalPosition::new(position - 1));
    Ok(store
        .read_all(start, 1)
        .await?
        .into_iter()
        .next()
        .filter(|event| event.position.value() == position)
        .and_then(|event| event.stream.operation_id())
        .map(|operation| operation.to_string()))
}

/// Authenticates an operator who may act on endpoint `id` (at its route ending in `what`); their
/// name.
async fn operator_endpoint(
    shared: &Shared,
    headers: &HeaderMap,
    id: &str,
    what: &str,
) -> Result<String, ApiError> {
    Ok(endpoint_manager(shared, headers, id, what, false)
        .await?
        .name())
}

/// Authenticates a caller who may act on endpoint `id` at its route ending in `what` (a tenant's
/// token too where `tenants_too`, on its own endpoints). An endpoint the caller may not see is
/// not found, exactly as one that does not exist.
async fn endpoint_manager(
    shared: &Shared,
    headers: &HeaderMap,
    id: &str,
    what: &str,
    tenants_too: bool,
) -> Result<Manager, ApiError> {
    let method = if what == "attempts" || what == "payload" {
        "GET"
    } else {
        "POST"
    };
    let route = format!("{method} /v1/webhooks/{{id}}/{what}");
    let manager = Manager::of(shared.tokens.authenticate(headers)?, &route, tenants_too)?;
    // Another instance may have defined it a moment ago.
    if shared.webhooks.endpoint(id, None).await.is_err() {
        let _ = shared.webhooks.sync().await;
    }
    let endpoint = shared
        .webhooks
        .endpoint(id, None)
        .await
        .map_err(webhook_error)?;
    if !manager.sees(&endpoint) {
        return Err(no_such_endpoint(id));
    }
    Ok(manager)
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
    manager: &Manager,
    definition: &Definition,
) -> Result<(), ApiError> {
    let scope = &manager.scope();
    if let Some(tenant) = &definition.managed_by {
        // A tenant's endpoint stays its tenant's whoever changes it: an operator widening it
        // would send one tenant's events to another's receiver.
        if definition.tenants.as_deref() != Some(std::slice::from_ref(tenant)) {
            return Err(invalid(
                "tenants",
                format!("endpoint is managed by tenant `{tenant}` and receives its events only; leave tenants out or name [\"{tenant}\"]"),
            ));
        }
        if definition.allow_private_network {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("allow_private_network is an operator's decision; an endpoint managed by tenant `{tenant}` reaches public addresses only"),
            ));
        }
        // Loopback is the server's own host: a tenant posting there could probe its ports
        // (each delivery's status and error are shown to the tenant).
        let loopback = is_loopback_url(&definition.url);
        let allowed = TenantId::new(tenant.clone())
            .is_ok_and(|id| shared.webhook_loopback_tenants.contains(&id));
        if loopback && !allowed {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("an endpoint managed by tenant `{tenant}` may not post to loopback (this server's own host); use a public https:// URL, or an operator sets webhooks_to_loopback = true in the tenant's [[tenants]] entry (for development)"),
            ));
        }
    }
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
    let manager = Manager::of(principal, "POST /v1/webhooks", true)?;
    let name = manager.name();
    let mut create: CreateRequest = body(&shared, request).await?;
    check_id(&create.id)?;
    let managed_by = match &manager {
        Manager::Tenant(tenant) => {
            // Its own tenant's events, whether it names the tenant or leaves tenants out.
            if create.tenants.is_none() {
                create.tenants = Some(vec![tenant.to_string()]);
            }
            let own = shared
                .webhooks
                .overview(None)
                .await
                .map_err(webhook_error)?
                .iter()
                .filter(|endpoint| manager.sees(endpoint))
                .count();
            if own >= MAX_ENDPOINTS_PER_TENANT {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "too_many_endpoints",
                    format!("tenant `{tenant}` has {own} endpoints, the most one tenant may define ({MAX_ENDPOINTS_PER_TENANT}); delete one first"),
                ));
            }
            Some(tenant.to_string())
        }
        Manager::Operator { .. } => None,
    };
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
        managed_by,
    };
    check_definition(&shared, &manager, &definition)?;
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
) -> Result<(Manager, Definition), ApiError> {
    let manager = Manager::of(shared.tokens.authenticate(headers)?, route, true)?;
    let endpoint = shared
        .webhooks
        .endpoint(id, None)
        .await
        .map_err(webhook_error)?;
    if !manager.sees(&endpoint) {
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
    Ok((manager, definition))
}

pub(super) async fn update(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let (manager, mut definition) =
        managed(&shared, &headers, &id, "PATCH /v1/webhooks/{id}").await?;
    let name = manager.name();
    let update: UpdateRequest = body(&shared, request).await?;
    if let Some(url) = update.url {
        definition.url = url.trim().to_owned();
    }
    if let Some(events) = update.events {
        definition.events = events;
    }
    if let Some(tenants) = update.tenants {
        // A tenant's endpoint left without tenants is still its own tenant's only.
        definition.tenants = match (tenants, &definition.managed_by) {
            (None, Some(tenant)) => Some(vec![tenant.clone()]),
            (tenants, _) => tenants,
        };
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
    check_definition(&shared, &manager, &definition)?;
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
    let name = managed(&shared, &headers, &id, "DELETE /v1/webhooks/{id}")
        .await?
        .0
        .name();
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
    let (manager, mut definition) = managed(
        &shared,
        &headers,
        &id,
        "POST /v1/webhooks/{id}/rotate-secret",
    )
    .await?;
    let name = manager.name();
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
    let name = endpoint_manager(&shared, &headers, &id, "test", true)
        .await?
        .name();
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
    let name = endpoint_manager(&shared, &headers, &id, "resend", true)
        .await?
        .name();
    let resend: ResendRequest = body(&shared, request).await?;
    let (event, body) = rendered(&shared, &id, resend.position).await?;
    let body = serde_json::to_vec(&body)
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

/// The event at `position` and the payload endpoint `id` is sent for it (rendered as its
/// delivery renders it); invalid input when no event is there or the endpoint does not receive
/// it (its types or tenants).
async fn rendered(
    shared: &Shared,
    id: &str,
    position: u64,
) -> Result<(opledger_domain::store::RecordedEvent, serde_json::Value), ApiError> {
    let store = shared.engine.ledger().store();
    let start = LogStart::After(GlobalPosition::new(position.saturating_sub(1)));
    let event = store
        .read_all(start, 1)
        .await?
        .into_iter()
        .next()
        .filter(|event| event.position.value() == position)
        .ok_or_else(|| {
            invalid(
                "position",
                format!("no event is at position {position}; GET /v1/webhooks/{id}/attempts lists the positions delivered"),
            )
        })?;
    let endpoint = shared
        .webhooks
        .endpoint(id, None)
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
                format!("the event at position {position} is not one endpoint `{id}` receives (its types or tenants)"),
            )
        })?;
    let body = json!({
        "data": message.data,
        "timestamp": message.at,
        "type": format!("operation.{}", message.kind),
    });
    Ok((event, body))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PayloadQuery {
    position: String,
}

/// `GET /v1/webhooks/{id}/payload?position=N`: what the endpoint is sent for the event at a
/// position (the body an attempt there carried, rendered again from the log), so an attempt in
/// the log can be read with its payload.
pub(super) async fn payload(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    query: Result<Query<PayloadQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    endpoint_manager(&shared, &headers, &id, "payload", true).await?;
    let Query(query) = query?;
    let position = query
        .position
        .parse::<u64>()
        .ok()
        .filter(|position| *position > 0)
        .ok_or_else(|| {
            invalid(
                "position",
                format!(
                    "`{}` is not a log position; pass an attempt's `position` (1 or more)",
                    query.position
                ),
            )
        })?;
    let (event, body) = rendered(&shared, &id, position).await?;
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "endpoint": id,
            "position": position,
            "operation_id": event.stream.operation_id().map(|operation| operation.to_string()),
            "webhook_id": opledger_webhooks::signing::webhook_id(event.event_id),
            "payload": body,
        }),
    ))
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

/// Most events of one operation whose deliveries `GET /v1/operations/{id}/deliveries` looks up
/// (an operation has a handful: intent, attempts, outcomes, lookups, decisions).
const MAX_DELIVERY_EVENTS: usize = 1_000;

/// `GET /v1/operations/{id}/deliveries`: every webhook attempt made for the operation's events,
/// grouped by endpoint and event: which endpoint, the event, how many attempts, the last status
/// and error. An operator sees the endpoints of their scope; a tenant's token its own endpoints.
pub(super) async fn deliveries(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let manager = Manager::of(principal, "GET /v1/operations/{id}/deliveries", true)?;
    let operation_id = super::operation_id(&id)?;
    super::visible(&shared, &manager.scope(), operation_id).await?;
    let store = shared.engine.ledger().store();
    let stream = opledger_domain::store::StreamName::for_operation(operation_id);
    let events = store
        .read_stream(
            &stream,
            opledger_domain::ids::StreamVersion::new(0),
            MAX_DELIVERY_EVENTS,
        )
        .await?;
    let positions: Vec<u64> = events.iter().map(|event| event.position.value()).collect();
    let types: std::collections::HashMap<u64, &str> = events
        .iter()
        .map(|event| (event.position.value(), event.event_type.as_str()))
        .collect();
    let endpoints = shared
        .webhooks
        .overview(None)
        .await
        .map_err(webhook_error)?
        .into_iter()
        .filter(|endpoint| manager.sees(endpoint))
        .collect::<Vec<_>>();
    let mut deliveries = Vec::new();
    for endpoint in &endpoints {
        let attempts = shared
            .webhooks
            .attempts_at(&endpoint.id, &positions)
            .await
            .map_err(webhook_error)?;
        // Newest first: the first row of a position is its latest attempt.
        let mut by_position: std::collections::BTreeMap<u64, Vec<_>> = Default::default();
        for attempt in attempts {
            by_position
                .entry(attempt.position)
                .or_default()
                .push(attempt);
        }
        for (position, attempts) in by_position {
            let latest = &attempts[0];
            deliveries.push(json!({
                "endpoint": endpoint.id,
                "position": position,
                "event_type": types.get(&position).copied(),
                "webhook_id": latest.webhook_id,
                "attempts": attempts.len(),
                "delivered": attempts.iter().any(|attempt| attempt.error.is_none()),
                "last_status": latest.status,
                "last_error": attempts.iter().find_map(|attempt| attempt.error.clone()),
                "last_at": latest.at,
            }));
        }
    }
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "operation_id": operation_id,
            "deliveries": deliveries,
            // What a delivery not yet attempted waits on: each endpoint's checkpoint against
            // the operation's newest event.
            "endpoints": endpoints.iter().map(|endpoint| json!({
                "id": endpoint.id,
                "status": endpoint.status,
                "checkpoint": endpoint.checkpoint,
                "behind": endpoint.checkpoint.unwrap_or(0) < positions.last().copied().unwrap_or(0),
            })).collect::<Vec<_>>(),
        }),
    ))
}
