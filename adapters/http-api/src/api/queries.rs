//! Reading many operations: listings from the read models, the operators' review queue, and
//! the chain behind any id.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;

use std::collections::BTreeSet;

use crate::render::AsOf;
use opledger_readmodel::{OperationPage, PastReadModels, PastScope};

/// Most operations a traced id may match.
const MAX_TRACE_MATCHES: usize = 10;
/// The longest id `trace` takes, in bytes.
pub(super) const MAX_TRACE_ID_BYTES: usize = 512;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    state: Option<String>,
    older_than: Option<String>,
    limit: Option<String>,
    after: Option<String>,
    tenant: Option<String>,
    provider: Option<String>,
    account: Option<String>,
    /// The listing as it was at this global position or RFC 3339 time.
    as_of: Option<String>,
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(&headers)?;
    let scope = Scope::of(principal);
    let Query(query) = query?;
    check_state(query.state.as_deref())?;
    let older_than = query
        .older_than
        .as_deref()
        .map(|text| crate::input::parse_duration("older_than", text))
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
    let tenant = listed_tenant(&scope, query.tenant.as_deref())?;
    let provider = query
        .provider
        .as_deref()
        .map(|text| {
            ProviderId::new(text).map_err(|error| ValidationError::new("provider", error.message))
        })
        .transpose()?;
    let account = query
        .account
        .as_deref()
        .map(|text| {
            AccountId::new(text).map_err(|error| ValidationError::new("account", error.message))
        })
        .transpose()?;
    let as_of = query.as_of.as_deref().map(parse_as_of).transpose()?;
    if let Some(as_of) = as_of {
        let scope = PastScope {
            tenants: tenant.clone().map(|tenant| BTreeSet::from([tenant])),
            provider: provider.clone(),
            account: account.clone(),
        };
        let (past, position) = past_at(&shared, as_of, &scope).await?;
        // Ages and `older_than` are measured from the moment, as the live listing measured them
        // from when it answered.
        let now = moment_time(as_of, &past);
        let filter = OperationFilter {
            state: query.state.clone(),
            tenant,
            provider,
            account,
            older_than: older_than.map(|duration| now - duration),
        };
        let page = past.list_operations(&filter, limit, after)?;
        return Ok(page_reply(&page, now, Some(position)));
    }
    fresh_read_models(&shared).await?;
    let now = Utc::now();
    let filter = OperationFilter {
        state: query.state.clone(),
        tenant: tenant.clone(),
        provider,
        account,
        older_than: older_than.map(|duration| now - duration),
    };
    let page = shared
        .read_models
        .call(move |store| {
            let cursor = match after {
                Some(operation_id) => Some(cursor_of(store, operation_id, tenant.as_ref())?),
                None => None,
            };
            store.list_operations(&filter, limit, cursor.as_ref())
        })
        .await?;
    Ok(page_reply(&page, now, None))
}

/// A page of operations as the listing answers it, ages measured from `now`; as of a moment,
/// with the log position the moment resolved to.
fn page_reply(page: &OperationPage, now: DateTime<Utc>, as_of_position: Option<u64>) -> Response {
    let rows: Vec<Value> = page
        .operations
        .iter()
        .map(|row| operation_json(row, now))
        .collect();
    let next = page.next.as_ref().map(|cursor| cursor.operation_id);
    let mut body = json!({"operations": rows, "next": next});
    if let Some(position) = as_of_position {
        body["as_of_position"] = json!(position);
    }
    json_reply(StatusCode::OK, &body)
}

/// `as_of`: a global position or an RFC 3339 time.
fn parse_as_of(text: &str) -> Result<AsOf, ApiError> {
    AsOf::parse(text).map_err(|problem| ApiError::invalid(ValidationError::new("as_of", problem)))
}

/// The read models of `scope` as they stood at `as_of` (checked against the log first), and the
/// log position the moment resolved to.
async fn past_at(
    shared: &Shared,
    as_of: AsOf,
    scope: &PastScope,
) -> Result<(PastReadModels, u64), ApiError> {
    let store = shared.engine.ledger().store();
    let position = crate::render::resolve_as_of(store, as_of, Utc::now()).await?;
    Ok((
        PastReadModels::fold(store, as_of.moment(), scope).await?,
        position,
    ))
}

/// The time a moment stands for, from which ages are measured: the time asked, or the time of
/// the last event up to the position asked.
fn moment_time(as_of: AsOf, past: &PastReadModels) -> DateTime<Utc> {
    match as_of {
        AsOf::Time(time) => time,
        AsOf::Position(_) => past.time().unwrap_or_else(Utc::now),
    }
}

/// A listed state must be one of the API's.
fn check_state(state: Option<&str>) -> Result<(), ApiError> {
    match state {
        Some(state) if !API_STATES.contains(&state) => {
            Err(ApiError::invalid(ValidationError::new(
                "state",
                format!(
                    "`{state}` is not a state; use one of {}",
                    API_STATES.join(", ")
                ),
            )))
        }
        _ => Ok(()),
    }
}

/// Whose operations a listing shows: a tenant lists its own; an operator one tenant of its scope
/// at a time, or all of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CountsQuery {
    tenant: Option<String>,
}

/// `GET /v1/counts`: operations per state, the oldest unknown one and the duplicates detected,
/// for the caller's tenant (or the one named) or, for a token that sees every tenant and names
/// none, for all; one grouped count and two reads of small tables in the read models.
pub(super) async fn counts(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<CountsQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = Scope::of(shared.tokens.authenticate(&headers)?);
    let Query(query) = query?;
    let tenant = listed_tenant(&scope, query.tenant.as_deref())?;
    fresh_read_models(&shared).await?;
    let counted = tenant.clone();
    let (by_state, numbers) = shared
        .read_models
        .call(move |store| {
            Ok((
                store.count_by_state(counted.as_ref())?,
                store.scope_numbers(counted.as_ref())?,
            ))
        })
        .await?;
    // The API's states: the fold's less `new`, the state before an intent.
    let by_state: serde_json::Map<String, Value> = API_STATES
        .iter()
        .map(|state| {
            (
                (*state).to_owned(),
                json!(by_state.get(state).copied().unwrap_or(0)),
            )
        })
        .collect();
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "tenant": tenant,
            "by_state": by_state,
            "oldest_unknown": numbers.oldest_unknown.map(|oldest| json!({
                "operation_id": oldest.operation_id,
                "since": oldest.since,
            })),
            "duplicates_detected": numbers.duplicates_detected,
        }),
    ))
}

fn listed_tenant(scope: &Scope, named: Option<&str>) -> Result<Option<TenantId>, ApiError> {
    match (scope, named) {
        (_, Some(text)) => {
            let tenant = TenantId::new(text).map_err(|e| field("tenant", e))?;
            if !scope.allows(&tenant) {
                return Err(ApiError::not_found(format!("tenant {tenant}")));
            }
            Ok(Some(tenant))
        }
        (Scope::Tenants(tenants), None) if tenants.len() == 1 => Ok(tenants.iter().next().cloned()),
        (Scope::All, None) => Ok(None),
        (Scope::Tenants(_), None) => Err(ApiError::invalid(ValidationError::new(
            "tenant",
            "this token sees several tenants; name one with ?tenant=",
        ))),
    }
}

/// The page cursor `after` names. It must be an operation of the listed tenant, or paging would
/// tell another tenant's operation ids apart from unknown ones.
fn cursor_of(
    store: &opledger_readmodel::ReadModelStore,
    operation_id: OperationId,
    tenant: Option<&TenantId>,
) -> Result<OperationCursor, ReadModelError> {
    match store.operation(operation_id)? {
        Some(row) if tenant.is_none_or(|t| *t == row.tenant) => Ok(OperationCursor {
            created_at: row.created_at,
            operation_id,
        }),
        _ => Err(ReadModelError::InvalidQuery {
            reason: format!(
                "after={operation_id} names no operation of yours; pass the `next` of the previous page"
            ),
        }),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReviewQueueQuery {
    limit: Option<String>,
    /// The queue as it was at this global position or RFC 3339 time.
    as_of: Option<String>,
}

pub(super) async fn review_queue(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ReviewQueueQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, scope) = operator_of(shared.tokens.authenticate(&headers)?)?;
    let Query(query) = query?;
    let limit = page_limit(query.limit.as_deref())?;
    let as_of = query.as_of.as_deref().map(parse_as_of).transpose()?;
    let (queue, now, position) = match as_of {
        Some(as_of) => {
            let tenants = match scope {
                Scope::All => None,
                Scope::Tenants(tenants) => Some(tenants),
            };
            let scope = PastScope {
                tenants,
                ..PastScope::default()
            };
            let (past, position) = past_at(&shared, as_of, &scope).await?;
            let now = moment_time(as_of, &past);
            (past.review_queue(limit), now, Some(position))
        }
        None => {
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
            (queue, Utc::now(), None)
        }
    };
    let store = shared.engine.ledger().store();
    let mut rows: Vec<Value> = Vec::with_capacity(queue.len());
    for item in &queue {
        // One stream read per row, bounded by the page limit: the person deciding needs every
        // attempt and lookup, which the queue's row does not keep. As of a moment, the events
        // up to it.
        let view = match as_of {
            Some(as_of) => crate::render::view_as_of(store, item.operation_id, as_of).await?,
            None => crate::render::view_of(store, item.operation_id).await?,
        };
        let mut row = crate::render::review_item_json(item, now);
        row["detail"] = crate::render::review_detail_json(&view.history);
        let description = view.loaded.state.intent.as_ref().and_then(|intent| {
            shared
                .engine
                .providers()
                .action_description(&intent.provider, &intent.action)
        });
        row["detail"]["description"] = json!(description);
        rows.push(row);
    }
    let mut body = json!({"queue": rows});
    if let Some(position) = position {
        body["as_of_position"] = json!(position);
    }
    Ok(json_reply(StatusCode::OK, &body))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TraceQuery {
    /// The chain as it stood at this global position or RFC 3339 time.
    as_of: Option<String>,
}

pub(super) async fn trace(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    query: Result<Query<TraceQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = Scope::of(shared.tokens.authenticate(&headers)?);
    let Query(query) = query?;
    let resolved = match query.as_of.as_deref() {
        Some(as_of) => Some(super::operations::resolved_as_of(&shared, as_of).await?),
        None => None,
    };
    let position = resolved.map(|(_, position)| position);
    let id = id.trim().to_owned();
    if id.is_empty() || id.len() > MAX_TRACE_ID_BYTES {
        return Err(ApiError::invalid(ValidationError::new(
            "id",
            format!("must be 1 to {MAX_TRACE_ID_BYTES} bytes: an operation, attempt, external object or source id"),
        )));
    }
    let freshness = fresh_read_models(&shared).await?;
    let query = id.clone();
    let visible_scope = scope.clone();
    // Filtered by tenant in SQL, before the cap: short external ids ("731") and source ids repeat
    // across tenants, and another tenant's matches must not crowd out the caller's own.
    let candidates = shared
        .read_models
        .call(move |store| match &visible_scope {
            Scope::All => store.trace_candidates(&query, MAX_TRACE_MATCHES),
            Scope::Tenants(tenants) => {
                let tenants: Vec<TenantId> = tenants.iter().cloned().collect();
                store.trace_candidates_of(&query, &tenants, MAX_TRACE_MATCHES)
            }
        })
        .await?;
    let store = shared.engine.ledger().store();
    // An operation id is looked up in the ledger itself, so pasting one works even while the
    // read models are behind (they answer for attempt, external and source ids only).
    let direct = id
        .parse::<OperationId>()
        .ok()
        .filter(|operation| !candidates.contains(operation));
    let mut matches = Vec::new();
    for candidate in direct.into_iter().chain(candidates) {
        // As of a moment, the chain up to it: an operation recorded after it is not found.
        let viewed = match resolved {
            Some((as_of, _)) => crate::render::view_as_of(store, candidate, as_of).await,
            None => view_of(store, candidate).await,
        };
        let view = match viewed {
            Ok(view) => view,
            Err(RenderError::App(AppError::NotFound { .. }))
                if Some(candidate) == direct || position.is_some() =>
            {
                continue
            }
            Err(error) => return Err(ApiError::from(error)),
        };
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
        return Err(match freshness {
            Freshness::Fresh => ApiError::not_found(format!("anything matching `{id}`")),
            // "Does not exist" would be a guess: the attempt or object may be in the events the
            // read models have not applied yet.
            Freshness::Behind { applied, head } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "read_models_behind",
                format!(
                    "nothing matching `{id}` yet, but the read models are behind the log \
                     (applied up to position {}, the log is at {head}), so it may be among the \
                     newest events; retry in a moment, and see /healthz if this lasts",
                    applied.map_or_else(|| "none".to_owned(), |applied| applied.to_string())
                ),
            ),
        });
    };
    let others: Vec<OperationId> = matches[1..]
        .iter()
        .map(|view| view.loaded.operation_id)
        .collect();
    let mut body = serde_json::to_value(operation_view(&shared, &first.loaded))
        .map_err(|error| ApiError::internal("an operation could not be written as JSON", error))?;
    body["query"] = json!(id);
    body["events"] = json!(first.events);
    body["timeline"] = json!(first.lines);
    body["other_matches"] = json!(others);
    if let Some(position) = position {
        body["as_of_position"] = json!(position);
    }
    Ok(json_reply(StatusCode::OK, &body))
}
