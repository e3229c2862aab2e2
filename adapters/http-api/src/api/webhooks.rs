//! Webhook endpoints for operators: list them with state and lag, pause, resume, replay from a
//! position or a time, and read the attempt log. Operator tokens only; an operator limited to
//! some tenants sees and acts on only the endpoints whose tenants are all theirs.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{EventStore, LogStart};
use opledger_webhooks::{EndpointOverview, WebhookError};
use serde::Deserialize;
use serde_json::json;

use super::{body, IdPath};
use crate::auth::{operator_for_route, Scope};
use crate::error::{json_reply, ApiError};
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
        other => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("webhook delivery's journal is unavailable ({other}); try again shortly"),
        ),
    }
}
