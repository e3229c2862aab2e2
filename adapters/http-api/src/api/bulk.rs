//! One decision for many operations of the review queue: after a provider's outage, hundreds of
//! operations need the same retry or abandon. Each is still its own decision: one event per
//! operation, appended at the version read for it here (a concurrent lookup or decision makes it
//! refused, not overwritten), checked against its own state and contract by the engine. What
//! cannot take the decision is listed with why, never skipped in silence. A dry run reads the same
//! operations and says which would be decided, writing nothing.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;

use super::queries::review_filter;
use opledger_readmodel::{ReviewFilter, ReviewOrder};

/// The most operations one bulk decision takes: a page of the API's largest. More are decided by
/// sending the request again (those decided have left the queue).
pub(crate) const MAX_BULK_OPERATIONS: usize = MAX_QUERY_ROWS;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    /// `retry` or `abandon` (a confirmation names each operation's own object: one at a time).
    decision: String,
    note: String,
    /// These operations...
    operation_ids: Option<Vec<String>>,
    /// ...or every item of the review queue matching this filter (oldest first).
    #[serde(rename = "filter")]
    matching: Option<BulkFilter>,
    /// With `filter`: at most this many of the matching items, oldest first.
    limit: Option<usize>,
    /// Say what would happen, write nothing.
    #[serde(default)]
    dry_run: bool,
    /// With `retry`: as for one decision.
    #[serde(default)]
    accept_duplicate_risk: bool,
}

/// A bulk decision's `filter`: the review queue's search, so "every item matching" decides
/// exactly the items the queue lists for it.
type BulkFilter = super::queries::ReviewSearch;

/// `POST /v1/review/bulk`.
pub(super) async fn bulk(
    State(shared): State<Arc<Shared>>,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let (name, scope) = operator_of(principal)?;
    let reviewer = ActorId::new(name.to_owned())?;
    // Each decision records who made it, as a single decision does.
    let decided_by = crate::auth::principal_of(principal);
    let body: BulkBody = body(&shared, request).await?;
    let decision = match body.decision.as_str() {
        "retry" => ReviewDecision::Retry,
        "abandon" => ReviewDecision::Abandon,
        other => {
            return Err(ApiError::invalid(ValidationError::new(
                "decision",
                format!("`{other}` is not a bulk decision; use retry or abandon (confirm names each operation's own object: decide those one at a time)"),
            )))
        }
    };
    if body.accept_duplicate_risk && body.decision != "retry" {
        return Err(ApiError::invalid(ValidationError::new(
            "accept_duplicate_risk",
            "is only taken with decision `retry`",
        )));
    }
    if body.note.trim().is_empty() {
        return Err(ApiError::invalid(ValidationError::new(
            "note",
            "is required: say why, for whoever reads these operations' histories",
        )));
    }
    let ids = chosen_operations(
        &shared,
        &scope,
        body.operation_ids,
        body.matching,
        body.limit,
    )
    .await?;
    let mut decided = Vec::new();
    let mut refused = Vec::new();
    for operation_id in &ids {
        let operation_id = *operation_id;
        let refuse = |code: &str, message: String| json!({"operation_id": operation_id, "code": code, "message": message});
        let loaded = match visible(&shared, &scope, operation_id).await {
            Ok(loaded) => loaded,
            Err(error) => {
                refused.push(refuse(error.code, error.message));
                continue;
            }
        };
        if let Some(claim) = shared
            .claims
            .held_by_other(operation_id, name, Utc::now())
            .await?
        {
            let error = super::claim::held_error(operation_id, &claim);
            refused.push(refuse(error.code, error.message));
            continue;
        }
        let state = loaded.state.status.name();
        if state != "unknown" && state != "needs_review" {
            refused.push(refuse(
                "not_waiting",
                format!("it is {state}, not waiting for a decision"),
            ));
            continue;
        }
        if body.dry_run {
            decided.push(json!({"operation_id": operation_id, "state": state, "version": loaded.version.map(StreamVersion::value)}));
            continue;
        }
        let engine = Arc::clone(&shared.engine);
        let (reviewer, decision, note) = (reviewer.clone(), decision.clone(), body.note.clone());
        let decided_by = decided_by.clone();
        let accept = body.accept_duplicate_risk;
        let outcome = tokio::spawn(super::operations::boxed(async move {
            engine
                .resolve_review_seen(loaded, reviewer, Some(decided_by), decision, note, accept)
                .await
        }))
        .await
        .map_err(|error| ApiError::internal("a bulk decision failed", error))?;
        match outcome {
            Ok(report) => decided.push(json!({
                "operation_id": operation_id,
                "state": report.operation.state.status.name(),
            })),
            Err(error) => {
                let error = ApiError::from(error);
                refused.push(refuse(error.code, error.message));
            }
        }
    }
    Ok(json_reply(
        StatusCode::OK,
        &json!({
            "dry_run": body.dry_run,
            "decision": body.decision,
            "matched": ids.len(),
            "decided": decided,
            "refused": refused,
        }),
    ))
}

/// The operations a bulk decision names: the ids given (each checked later, one by one), or the
/// review items matching the filter in the caller's scope, oldest first, at most
/// [`MAX_BULK_OPERATIONS`].
async fn chosen_operations(
    shared: &Shared,
    scope: &Scope,
    ids: Option<Vec<String>>,
    matching: Option<BulkFilter>,
    limit: Option<usize>,
) -> Result<Vec<OperationId>, ApiError> {
    let limit = limit.unwrap_or(MAX_BULK_OPERATIONS);
    if !(1..=MAX_BULK_OPERATIONS).contains(&limit) {
        return Err(ApiError::invalid(ValidationError::new(
            "limit",
            format!("must be 1 to {MAX_BULK_OPERATIONS}"),
        )));
    }
    match (ids, matching) {
        (Some(ids), None) => {
            if ids.is_empty() || ids.len() > MAX_BULK_OPERATIONS {
                return Err(ApiError::invalid(ValidationError::new(
                    "operation_ids",
                    format!("must name 1 to {MAX_BULK_OPERATIONS} operations"),
                )));
            }
            let mut seen = std::collections::BTreeSet::new();
            let mut chosen = Vec::with_capacity(ids.len());
            for id in &ids {
                let id = operation_id(id)?;
                if seen.insert(id) {
                    chosen.push(id);
                }
            }
            Ok(chosen)
        }
        (None, Some(matching)) => {
            let filter: ReviewFilter = review_filter(scope, matching)?;
            fresh_read_models(shared).await?;
            let page = shared
                .read_models
                .call(move |store| {
                    store.review_page(
                        &filter,
                        ReviewOrder::OldestFirst,
                        limit,
                        None,
                    )
                })
                .await?;
            Ok(page.items.iter().map(|item| item.operation_id).collect())
        }
        _ => Err(ApiError::invalid(ValidationError::new(
            "operation_ids",
            "name the operations (`operation_ids`) or the review items to decide (`filter`), one of the two",
        ))),
    }
}
