//! `GET /v1/events`: outcome events as Server-Sent Events.
//!
//! Each event's `data` is the payload webhooks carry too ([`crate::render::event_payload`]; one
//! JSON Schema per event type in the book's event catalog). While nothing is sent, a comment
//! line (`:` and nothing else) keeps the connection open every 15 seconds (axum's default
//! keep-alive), which SSE clients skip.
//!
//! Each event's SSE id is its global position in the log, so a client that reconnects with
//! `Last-Event-ID` (browsers' EventSource does this by itself) resumes exactly after the last
//! event it received — across server restarts too, because positions are the log's, not the
//! connection's. A stream shows only the caller's tenants' operations and ends when the server
//! shuts down; the number of open streams is bounded.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion, TenantId};
use opledger_domain::provider::Providers as _;
use opledger_domain::store::{EventStore, LogStart, StreamName, Subscription};
use serde::Deserialize;
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, warn};

use super::auth::Scope;
use super::config::Principal;
use super::error::ApiError;
use super::{ServeStore, Shared};
use crate::render::{event_payload, outcome_of, state_through, wanted_types};

/// Most operations whose tenant is remembered; the cache is emptied when full (a miss costs one
/// read of the operation's first event).
const MAX_CACHED_TENANTS: usize = 100_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Friendly types, comma-separated (as `opledger tail --type`); default: the outcomes.
    types: Option<String>,
    /// Start after this position (`Last-Event-ID` wins when both are given).
    after: Option<String>,
}

/// Which operation belongs to which tenant, remembered for the streams.
#[derive(Debug, Default)]
pub struct TenantCache {
    tenants: Mutex<HashMap<OperationId, TenantId>>,
}

impl TenantCache {
    /// Remembers the tenant of an operation just recorded.
    pub fn remember(&self, operation_id: OperationId, tenant: TenantId) {
        let mut tenants = self.lock();
        if tenants.len() >= MAX_CACHED_TENANTS {
            tenants.clear();
        }
        tenants.insert(operation_id, tenant);
    }

    /// The tenant of an operation (`None`: no such operation), from memory or its first event.
    /// An operation's tenant never changes, so a remembered one is never stale.
    pub async fn tenant_of(
        &self,
        store: &ServeStore,
        operation_id: OperationId,
    ) -> Result<Option<TenantId>, ApiError> {
        if let Some(tenant) = self.lock().get(&operation_id) {
            return Ok(Some(tenant.clone()));
        }
        let first = store
            .read_stream(
                &StreamName::for_operation(operation_id),
                StreamVersion::FIRST,
                1,
            )
            .await?;
        let Some(recorded) = first.first() else {
            return Ok(None);
        };
        let event = codec::decode(recorded)
            .map_err(|error| ApiError::internal("a stored event could not be read", error))?;
        let OperationEvent::IntentRecorded(intent) = event else {
            return Ok(None);
        };
        self.remember(operation_id, intent.tenant.clone());
        Ok(Some(intent.tenant))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<OperationId, TenantId>> {
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Everything one open stream holds.
struct Feed {
    shared: Arc<Shared>,
    subscription: <ServeStore as EventStore>::Subscription,
    scope: Scope,
    wanted: BTreeSet<&'static str>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    // Released when the stream is dropped, freeing a place for another stream.
    _permit: OwnedSemaphorePermit,
    _own_place: StreamPlace,
}

/// Whose streams count together against the per-holder limit: a tenant's, or one operator's or
/// approver's.
fn holder_of(principal: &Principal) -> String {
    match principal {
        Principal::Tenant(tenant) => format!("tenant:{tenant}"),
        Principal::Operator { name, .. } => format!("operator:{name}"),
        Principal::Approver { name, .. } => format!("approver:{name}"),
    }
}

/// Streams open per holder, so one tenant cannot take every place.
#[derive(Debug, Default)]
pub struct StreamsPerHolder {
    open: Mutex<HashMap<String, usize>>,
}

/// One holder's place for one stream; given back when dropped.
struct StreamPlace {
    shared: Arc<Shared>,
    holder: String,
}

impl StreamPlace {
    fn take(shared: &Arc<Shared>, holder: String) -> Result<Self, ApiError> {
        let limit = shared.limits.max_sse_connections_per_holder;
        let mut open = shared
            .streams
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(holder.clone()).or_default();
        if *count >= limit {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams",
                format!("this token's tenant or person has {limit} event streams open, the configured limit per holder; close one"),
            ));
        }
        *count += 1;
        Ok(Self {
            shared: Arc::clone(shared),
            holder,
        })
    }
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        let mut open = self
            .shared
            .streams
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.holder) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.holder);
            }
        }
    }
}

pub async fn stream(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let scope = Scope::of(principal);
    let holder = holder_of(principal);
    let Query(query) = query?;
    let types: Vec<String> = query
        .types
        .as_deref()
        .map(|text| text.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let wanted = wanted_types("types", &types)?;
    let start = match (headers.get("last-event-id"), query.after.as_deref()) {
        (Some(value), _) => position("Last-Event-ID", value.to_str().unwrap_or("?"))?,
        (None, Some(text)) => position("after", text)?,
        (None, None) => LogStart::Beginning,
    };
    let own_place = StreamPlace::take(&shared, holder)?;
    let permit = Arc::clone(&shared.sse).try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            format!(
                "{} event streams are open, the configured limit; close one or try again later",
                shared.limits.max_sse_connections
            ),
        )
    })?;
    let subscription = shared.engine.ledger().store().subscribe_all(start).await?;
    debug!(?start, "event stream opened");
    let feed = Feed {
        shutdown: shared.shutdown.clone(),
        shared,
        subscription,
        scope,
        wanted,
        _permit: permit,
        _own_place: own_place,
    };
    let events = stream::unfold(feed, |mut feed| async move {
        let event = next_event(&mut feed).await?;
        Some((Ok::<_, Infallible>(event), feed))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

fn position(field: &str, text: &str) -> Result<LogStart, ApiError> {
    text.trim()
        .parse::<u64>()
        .map(|value| LogStart::After(GlobalPosition::new(value)))
        .map_err(|_| {
            ApiError::invalid(ValidationError::new(
                field,
                format!("`{text}` is not a log position; pass the id of the last event received"),
            ))
        })
}

/// The next event the caller may see, or `None` when the stream should end (shutdown, or the
/// log could not be read: the client reconnects with its Last-Event-ID).
async fn next_event(feed: &mut Feed) -> Option<Event> {
    loop {
        let recorded = tokio::select! {
            next = feed.subscription.next() => next,
            _ = feed.shutdown.wait_for(|stopping| *stopping) => return None,
        };
        let recorded = match recorded {
            Ok(recorded) => recorded,
            Err(error) => {
                warn!(%error, "event stream ends: the log could not be read");
                return None;
            }
        };
        let store = feed.shared.engine.ledger().store();
        let Some(operation_id) = recorded.stream.operation_id() else {
            continue;
        };
        // The tenant first: another tenant's events are never decoded for this stream, so
        // nothing of theirs can end it or slow it.
        let visible = match &feed.scope {
            Scope::All => true,
            Scope::Tenants(_) => match feed.shared.tenants.tenant_of(store, operation_id).await {
                Ok(tenant) => tenant.is_some_and(|tenant| feed.scope.allows(&tenant)),
                Err(error) => {
                    warn!(message = %error.message, %operation_id, "event stream ends: a tenant could not be read");
                    return None;
                }
            },
        };
        if !visible {
            continue;
        }
        let outcome = match outcome_of(store, &recorded).await {
            Ok(Some(outcome)) => outcome,
            Ok(None) => continue,
            Err(error) => {
                warn!(%error, position = %recorded.position, "event stream ends: an event could not be read");
                return None;
            }
        };
        if !feed.wanted.contains(outcome.kind) {
            continue;
        }
        // Where the operation stands after the event, read only for the events sent.
        let after = match state_through(store, &recorded).await {
            Ok(after) => after,
            Err(error) => {
                warn!(%error, position = %recorded.position, "event stream ends: an operation could not be read");
                return None;
            }
        };
        let description = after.intent.as_ref().and_then(|intent| {
            feed.shared
                .engine
                .providers()
                .action_description(&intent.provider, &intent.action)
        });
        let mut data = event_payload(&recorded, &outcome, &after, description.as_deref());
        opledger_domain::personal::open_anywhere(crate::personal::port(&feed.shared), &mut data);
        return Some(
            Event::default()
                .id(recorded.position.value().to_string())
                .event(outcome.kind)
                .data(data.to_string()),
        );
    }
}
