//! Reading many operations: listings from the read models, the operators' review queue, and
//! the chain behind any id.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;

use std::collections::BTreeSet;

use crate::render::AsOf;
use opledger_readmodel::{
    OperationPage, PastReadModels, PastScope, ReviewCursor, ReviewFilter, ReviewOrder, ReviewPage,
    REVIEW_STATES,
};

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
    /// Only this action's operations.
    action: Option<String>,
    /// Only the operation(s) recorded from this delivery id.
    source_id: Option<String>,
    /// Only operations recorded at or after this RFC 3339 time.
    since: Option<String>,
    /// Only operations for this owner.
    owner: Option<String>,
    /// Only operations whose top-level argument has a value: `name:value` (e.g.
    /// `title:Call the client`), matched whole whatever its case and spacing.
    arg: Option<String>,
    /// `oldest` (the default) or `newest` first.
    order: Option<String>,
    /// The listing as it was at this global position or RFC 3339 time.
    as_of: Option<String>,
    /// Argument names whose values each row carries in `args` (comma-separated), for the
    /// columns a person chose.
    args: Option<String>,
}

/// `arg=name:value` read as (name, value); the name is an argument's, the value what to find.
fn argument_search(text: &str) -> Result<(String, String), ApiError> {
    let refuse = |why: &str| {
        ApiError::invalid(ValidationError::new(
            "arg",
            format!("{why}; write arg=NAME:VALUE with an argument's name and the value to find, e.g. arg=title:Call the client"),
        ))
    };
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| refuse(&format!("`{text}` has no `:` between a name and a value")))?;
    let name = name.trim();
    if name.is_empty() || name.len() > opledger_readmodel::terms::MAX_TERM_NAME_BYTES {
        return Err(refuse(&format!(
            "the argument's name is empty or longer than {} bytes",
            opledger_readmodel::terms::MAX_TERM_NAME_BYTES
        )));
    }
    if value.trim().is_empty() {
        return Err(refuse("the value to find is empty"));
    }
    Ok((name.to_owned(), value.to_owned()))
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
    let action = query
        .action
        .as_deref()
        .map(|text| ActionName::new(text).map_err(|e| field("action", e)))
        .transpose()?;
    let source_id = query
        .source_id
        .as_deref()
        .map(|text| SourceId::new(text).map_err(|e| field("source_id", e)))
        .transpose()?;
    let since = query
        .since
        .as_deref()
        .map(|text| {
            DateTime::parse_from_rfc3339(text)
                .map(|time| time.with_timezone(&Utc))
                .map_err(|error| {
                    ApiError::invalid(ValidationError::new(
                        "since",
                        format!("`{text}` is not an RFC 3339 time ({error}); write e.g. 2026-12-01T14:02:00Z"),
                    ))
                })
        })
        .transpose()?;
    let newest_first = review_order(query.order.as_deref())? == ReviewOrder::NewestFirst;
    let argument = query.arg.as_deref().map(argument_search).transpose()?;
    let owner = query.owner.clone().filter(|owner| !owner.trim().is_empty());
    let as_of = query.as_of.as_deref().map(parse_as_of).transpose()?;
    let shown_args = argument_names(query.args.as_deref())?;
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
            since,
            action,
            source_id,
            owner,
            argument,
            newest_first,
        };
        let page = past.list_operations(&filter, limit, after)?;
        let shown = page_shown(&shared, &page, shown_args).await?;
        return Ok(page_reply(&page, shown, now, Some(position)));
    }
    fresh_read_models(&shared).await?;
    let now = Utc::now();
    let filter = OperationFilter {
        state: query.state.clone(),
        tenant: tenant.clone(),
        provider,
        account,
        older_than: older_than.map(|duration| now - duration),
        since,
        action,
        source_id,
        owner,
        argument,
        newest_first,
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
    let shown = page_shown(&shared, &page, shown_args).await?;
    Ok(page_reply(&page, shown, now, None))
}

/// The owner and chosen arguments of a page's operations.
async fn page_shown(
    shared: &Shared,
    page: &OperationPage,
    names: Vec<String>,
) -> Result<std::collections::HashMap<OperationId, opledger_readmodel::Shown>, ApiError> {
    let ids = page.operations.iter().map(|row| row.operation_id).collect();
    shown_of(shared, ids, names).await
}

/// A page of operations as the listing answers it, ages measured from `now`; as of a moment,
/// with the log position the moment resolved to.
fn page_reply(
    page: &OperationPage,
    mut shown: std::collections::HashMap<OperationId, opledger_readmodel::Shown>,
    now: DateTime<Utc>,
    as_of_position: Option<u64>,
) -> Response {
    let rows: Vec<Value> = page
        .operations
        .iter()
        .map(|row| {
            let mut json = operation_json(row, now);
            put_shown(&mut json, shown.remove(&row.operation_id));
            json
        })
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
    // A token that sees several tenants and names none counts all of them: the badge of an
    // operator of several tenants needs the whole scope's numbers, not a choice first.
    let counted: Vec<Option<TenantId>> = match (&scope, query.tenant.as_deref()) {
        (Scope::Tenants(tenants), None) if tenants.len() > 1 => {
            tenants.iter().cloned().map(Some).collect()
        }
        _ => vec![listed_tenant(&scope, query.tenant.as_deref())?],
    };
    let tenant = match counted.as_slice() {
        [one] => one.clone(),
        _ => None,
    };
    fresh_read_models(&shared).await?;
    let (by_state, numbers) = shared
        .read_models
        .call(move |store| {
            let mut by_state: std::collections::BTreeMap<&'static str, u64> = Default::default();
            let mut oldest: Option<opledger_readmodel::OldestUnresolved> = None;
            let mut duplicates = 0;
            for tenant in &counted {
                for (state, count) in store.count_by_state(tenant.as_ref())? {
                    *by_state.entry(state).or_default() += count;
                }
                let numbers = store.scope_numbers(tenant.as_ref())?;
                duplicates += numbers.duplicates_detected;
                if let Some(found) = numbers.oldest_unknown {
                    if oldest.as_ref().is_none_or(|o| {
                        (found.since, found.operation_id) < (o.since, o.operation_id)
                    }) {
                        oldest = Some(found);
                    }
                }
            }
            Ok((
                by_state,
                opledger_readmodel::ScopeNumbers {
                    oldest_unknown: oldest,
                    duplicates_detected: duplicates,
                },
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
    /// The `next` of the previous page.
    after: Option<String>,
    /// `oldest` (the default) or `newest` first.
    order: Option<String>,
    /// `full` (the default: each item with its arguments, attempts and lookups, one stream read
    /// per row) or `none` (the queue's own rows only, for a list that refreshes often).
    detail: Option<String>,
    tenant: Option<String>,
    provider: Option<String>,
    account: Option<String>,
    state: Option<String>,
    /// Only items for this owner.
    owner: Option<String>,
    /// Only items whose top-level argument has a value: `name:value`, as in `GET /v1/operations`.
    arg: Option<String>,
    /// Only items unresolved at or after this RFC 3339 time.
    since: Option<String>,
    /// Only items unresolved before this RFC 3339 time.
    until: Option<String>,
    /// Argument names whose values each row carries in `args` (comma-separated), for the
    /// columns a person chose.
    args: Option<String>,
}

/// What a review search may name, as text from a query string or a bulk decision's `filter`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReviewSearch {
    pub(super) tenant: Option<String>,
    pub(super) provider: Option<String>,
    pub(super) account: Option<String>,
    pub(super) state: Option<String>,
    pub(super) owner: Option<String>,
    pub(super) arg: Option<String>,
    pub(super) since: Option<String>,
    pub(super) until: Option<String>,
}

/// `GET /v1/review`: a page of the review queue in the caller's scope, filtered, in either order,
/// with the number of items matching the filter (`total`) and the cursor of the next page.
pub(super) async fn review_queue(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ReviewQueueQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, scope) = operator_of(shared.tokens.authenticate(&headers)?)?;
    let Query(query) = query?;
    let limit = page_limit(query.limit.as_deref())?;
    let as_of = query.as_of.as_deref().map(parse_as_of).transpose()?;
    let order = review_order(query.order.as_deref())?;
    let full = match query.detail.as_deref() {
        None | Some("full") => true,
        Some("none") => false,
        Some(other) => {
            return Err(ApiError::invalid(ValidationError::new(
                "detail",
                format!("`{other}` is not a detail level; use full or none"),
            )))
        }
    };
    let after = query
        .after
        .as_deref()
        .map(ReviewCursor::parse)
        .transpose()?;
    let shown_args = argument_names(query.args.as_deref())?;
    let filter = review_filter(
        &scope,
        ReviewSearch {
            tenant: query.tenant,
            provider: query.provider,
            account: query.account,
            state: query.state,
            owner: query.owner,
            arg: query.arg,
            since: query.since,
            until: query.until,
        },
    )?;
    let (page, total, now, position) = match as_of {
        Some(as_of) => {
            let tenants = match &scope {
                Scope::All => None,
                Scope::Tenants(tenants) => Some(tenants.clone()),
            };
            let scope = PastScope {
                tenants,
                ..PastScope::default()
            };
            let (past, position) = past_at(&shared, as_of, &scope).await?;
            let now = moment_time(as_of, &past);
            let terms = filter.terms();
            let mut items = past.review_queue(usize::MAX);
            items.retain(|item| past.has_terms(item.operation_id, &terms));
            let (page, total) = past_review_page(items, &filter, order, limit, after.as_ref());
            (page, total, now, Some(position))
        }
        None => {
            fresh_read_models(&shared).await?;
            let (page, total) = shared
                .read_models
                .call(move |store| {
                    Ok((
                        store.review_page(&filter, order, limit, after.as_ref())?,
                        store.review_count(&filter)?,
                    ))
                })
                .await?;
            (page, total, Utc::now(), None)
        }
    };
    // Claims are the present's (kept beside the log, not in it): none as of a past moment.
    let claims = match as_of {
        None => {
            let ids: Vec<_> = page.items.iter().map(|item| item.operation_id).collect();
            shared.claims.running(&ids, Utc::now()).await?
        }
        Some(_) => std::collections::HashMap::new(),
    };
    let ids: Vec<OperationId> = page.items.iter().map(|item| item.operation_id).collect();
    let mut shown = shown_of(&shared, ids, shown_args).await?;
    let mut rows: Vec<Value> = Vec::with_capacity(page.items.len());
    for item in &page.items {
        let mut row = crate::render::review_item_json(item, now);
        row["claim"] = claims
            .get(&item.operation_id)
            .map_or(Value::Null, super::claim::claim_json);
        put_shown(&mut row, shown.remove(&item.operation_id));
        if full {
            row["detail"] = review_detail(&shared, item.operation_id, as_of).await?;
        }
        rows.push(row);
    }
    let mut body = json!({
        "queue": rows,
        "next": page.next.as_ref().map(ReviewCursor::token),
        "total": total,
    });
    if let Some(position) = position {
        body["as_of_position"] = json!(position);
    }
    Ok(json_reply(StatusCode::OK, &body))
}

/// `GET /v1/review/{id}`: one operation of the review queue with everything a person deciding
/// needs (the row, its arguments, attempts and lookups), without reading the rest of the queue.
pub(super) async fn review_item(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (_, scope) = operator_of(shared.tokens.authenticate(&headers)?)?;
    let operation_id = operation_id(&id)?;
    fresh_read_models(&shared).await?;
    let tenants = match &scope {
        Scope::All => None,
        Scope::Tenants(tenants) => Some(tenants.iter().cloned().collect::<Vec<_>>()),
    };
    let item = shared
        .read_models
        .call(move |store| store.review_item(operation_id, tenants.as_deref()))
        .await?;
    let Some(item) = item else {
        // Whether it exists elsewhere (settled, or another tenant's) is the operation's own
        // route to say, with its own scope check.
        return Err(ApiError::not_found(format!(
            "operation {operation_id} in the review queue (it is settled, not yet unresolved, or not yours); GET /v1/operations/{operation_id} says which"
        )));
    };
    let mut row = crate::render::review_item_json(&item, Utc::now());
    row["claim"] = claim_of(&shared, item.operation_id).await?;
    row["detail"] = review_detail(&shared, item.operation_id, None).await?;
    Ok(json_reply(StatusCode::OK, &row))
}

/// The running claim on an item, or null.
async fn claim_of(shared: &Shared, operation_id: OperationId) -> Result<Value, ApiError> {
    Ok(shared
        .claims
        .of(operation_id, Utc::now())
        .await?
        .map_or(Value::Null, |claim| super::claim::claim_json(&claim)))
}

/// An item's detail from its stream (as of a moment, the events up to it) with its action's
/// description.
async fn review_detail(
    shared: &Shared,
    operation_id: OperationId,
    as_of: Option<AsOf>,
) -> Result<Value, ApiError> {
    let store = shared.engine.ledger().store();
    let view = match as_of {
        Some(as_of) => crate::render::view_as_of(store, operation_id, as_of).await?,
        None => crate::render::view_of(store, operation_id).await?,
    };
    let mut detail = crate::render::review_detail_json(&view.history);
    let description = view.loaded.state.intent.as_ref().and_then(|intent| {
        shared
            .engine
            .providers()
            .action_description(&intent.provider, &intent.action)
    });
    detail["description"] = json!(description);
    detail["owner"] = json!(view
        .loaded
        .state
        .intent
        .as_ref()
        .and_then(|intent| intent.owner.as_ref()));
    detail["contract"] = view
        .loaded
        .state
        .intent
        .as_ref()
        .map_or(Value::Null, |intent| {
            contract_json(shared, intent, Utc::now())
        });
    Ok(detail)
}

/// What the action's provider promises about a repeated request, as configured now (the
/// contract every retry is checked against), so a person reads it from data: the deduplication
/// kind, and for an idempotency key whether this operation's key is still remembered. Null when
/// the action is not bound any more (provider, account or action gone from the configuration).
fn contract_json(
    shared: &Shared,
    intent: &opledger_domain::event::IntentRecorded,
    now: DateTime<Utc>,
) -> Value {
    let query = opledger_domain::provider::BindingQuery {
        tenant: &intent.tenant,
        provider: &intent.provider,
        account: &intent.account,
        action: &intent.action,
    };
    let Ok(binding) = shared.engine.providers().bind(&query) else {
        return Value::Null;
    };
    let deduplication = binding.capabilities.deduplication;
    let key_usable_until = match deduplication {
        opledger_domain::contract::Deduplication::IdempotencyKey {
            retention_s,
            safety_margin_s,
        } => Some(
            intent.at
                + chrono::Duration::seconds(
                    i64::try_from(retention_s.saturating_sub(safety_margin_s)).unwrap_or(i64::MAX),
                ),
        ),
        _ => None,
    };
    json!({
        "deduplication": super::actions::deduplication_name(deduplication),
        "key_usable_until": key_usable_until,
        "key_expired": key_usable_until.map(|until| until <= now),
    })
}

/// `order`: `oldest` (the default) or `newest`.
pub(super) fn review_order(text: Option<&str>) -> Result<ReviewOrder, ApiError> {
    match text {
        None | Some("oldest") => Ok(ReviewOrder::OldestFirst),
        Some("newest") => Ok(ReviewOrder::NewestFirst),
        Some(other) => Err(ApiError::invalid(ValidationError::new(
            "order",
            format!("`{other}` is not an order; use oldest or newest"),
        ))),
    }
}

/// The review filter a caller in `scope` asks for; a tenant outside the scope is not found.
pub(super) fn review_filter(scope: &Scope, search: ReviewSearch) -> Result<ReviewFilter, ApiError> {
    let ReviewSearch {
        tenant,
        provider,
        account,
        state,
        owner,
        arg,
        since,
        until,
    } = search;
    let since = since
        .as_deref()
        .map(|text| rfc3339("since", text))
        .transpose()?;
    let until = until
        .as_deref()
        .map(|text| rfc3339("until", text))
        .transpose()?;
    let tenant = tenant
        .as_deref()
        .map(|text| {
            let tenant = TenantId::new(text).map_err(|e| field("tenant", e))?;
            if scope.allows(&tenant) {
                Ok(tenant)
            } else {
                Err(ApiError::not_found(format!("tenant {tenant}")))
            }
        })
        .transpose()?;
    if let Some(state) = state.as_deref() {
        if !REVIEW_STATES.contains(&state) {
            return Err(ApiError::invalid(ValidationError::new(
                "state",
                format!(
                    "`{state}` is not a state of the review queue; use one of {}",
                    REVIEW_STATES.join(", ")
                ),
            )));
        }
    }
    Ok(ReviewFilter {
        scope: match scope {
            Scope::All => None,
            Scope::Tenants(tenants) => Some(tenants.iter().cloned().collect()),
        },
        tenant,
        provider: provider
            .as_deref()
            .map(|text| ProviderId::new(text).map_err(|e| field("provider", e)))
            .transpose()?,
        account: account
            .as_deref()
            .map(|text| AccountId::new(text).map_err(|e| field("account", e)))
            .transpose()?,
        state,
        owner: owner.filter(|owner| !owner.trim().is_empty()),
        argument: arg.as_deref().map(argument_search).transpose()?,
        since,
        until,
    })
}

/// An RFC 3339 time given as `name`.
fn rfc3339(name: &str, text: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(text)
        .map(|time| time.with_timezone(&Utc))
        .map_err(|error| {
            ApiError::invalid(ValidationError::new(
                name,
                format!(
                    "`{text}` is not an RFC 3339 time ({error}); write e.g. 2026-12-01T14:02:00Z"
                ),
            ))
        })
}

/// Most argument names one listing shows values of (`args=`).
pub(super) const MAX_SHOWN_ARGS: usize = 8;

/// `args=title,amount`: the argument names whose values each listed row carries.
pub(super) fn argument_names(text: Option<&str>) -> Result<Vec<String>, ApiError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    if names.len() > MAX_SHOWN_ARGS
        || names
            .iter()
            .any(|name| name.len() > opledger_readmodel::terms::MAX_TERM_NAME_BYTES)
    {
        return Err(ApiError::invalid(ValidationError::new(
            "args",
            format!(
                "names at most {MAX_SHOWN_ARGS} arguments of at most {} bytes each, comma-separated, e.g. args=title,amount",
                opledger_readmodel::terms::MAX_TERM_NAME_BYTES
            ),
        )));
    }
    Ok(names)
}

/// The owner and the named arguments' values of each of `ids`, from the read models' stored
/// states (one read by key per row: a page, never the ledger).
pub(super) async fn shown_of(
    shared: &Shared,
    ids: Vec<OperationId>,
    names: Vec<String>,
) -> Result<std::collections::HashMap<OperationId, opledger_readmodel::Shown>, ApiError> {
    if ids.is_empty() {
        return Ok(std::collections::HashMap::new());
    }
    Ok(shared
        .read_models
        .call(move |store| store.shown(&ids, &names))
        .await?)
}

/// Puts a row's owner and shown arguments (`{}` when none were asked or the read models have no
/// state for it) into its JSON.
pub(super) fn put_shown(row: &mut Value, shown: Option<opledger_readmodel::Shown>) {
    let shown = shown.unwrap_or_default();
    row["owner"] = json!(shown.owner);
    row["args"] = Value::Object(shown.args);
}

/// A page of a past review queue (folded in memory, already in the caller's scope) with the same
/// filter, order and cursor as the live one, and the number matching.
fn past_review_page(
    mut items: Vec<opledger_readmodel::ReviewItem>,
    filter: &ReviewFilter,
    order: ReviewOrder,
    limit: usize,
    after: Option<&ReviewCursor>,
) -> (ReviewPage, u64) {
    let limit = limit.min(MAX_QUERY_ROWS);
    items.retain(|item| {
        filter.tenant.as_ref().is_none_or(|t| *t == item.tenant)
            && filter.provider.as_ref().is_none_or(|p| *p == item.provider)
            && filter.account.as_ref().is_none_or(|a| *a == item.account)
            && filter.state.as_deref().is_none_or(|s| s == item.state)
            && filter.since.is_none_or(|since| item.since >= since)
            && filter.until.is_none_or(|until| item.since < until)
    });
    let total = items.len() as u64;
    if order == ReviewOrder::NewestFirst {
        items.reverse();
    }
    let key = |item: &opledger_readmodel::ReviewItem| (item.since, item.operation_id);
    if let Some(cursor) = after {
        let cursor = (cursor.since, cursor.operation_id);
        items.retain(|item| match order {
            ReviewOrder::OldestFirst => key(item) > cursor,
            ReviewOrder::NewestFirst => key(item) < cursor,
        });
    }
    let next = (items.len() > limit).then(|| {
        let last = &items[limit - 1];
        ReviewCursor {
            since: last.since,
            operation_id: last.operation_id,
        }
    });
    items.truncate(limit);
    (ReviewPage { items, next }, total)
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
