//! An operator's decision on an operation that is unknown or needs review: retry with the same
//! key, confirm an object found by hand, or abandon — optionally pinned to the version the
//! operator looked at.

// The handlers share the parent module's imports, extractors and helpers.
use super::*;

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
    /// With `retry`: the reviewer accepts that the provider may not tell the retry from a second
    /// request (no deduplication, or a key past its retention). Without it such a retry is 409.
    #[serde(default)]
    accept_duplicate_risk: bool,
}

pub(super) async fn review(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    request: Request,
) -> Result<Response, ApiError> {
    let principal = shared.tokens.authenticate(request.headers())?;
    let (name, scope) = operator_of(principal)?;
    let reviewer = ActorId::new(name.to_owned())?;
    let decided_by = principal_of(principal);
    let operation_id = operation_id(&id)?;
    let body: ReviewBody = body(&shared, request).await?;
    if body.accept_duplicate_risk && body.decision != "retry" {
        return Err(ApiError::invalid(ValidationError::new(
            "accept_duplicate_risk",
            "is only taken with decision `retry`: only a retry can create a second object",
        )));
    }
    let accept_duplicate_risk = body.accept_duplicate_risk;
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
    if let Some(claim) = shared
        .claims
        .held_by_other(operation_id, name, Utc::now())
        .await?
    {
        return Err(super::claim::held_error(operation_id, &claim));
    }
    if let Some(expected) = body.expected_version {
        let current = loaded.version.map(StreamVersion::value);
        if current != Some(expected) {
            let changed = what_changed(&shared, operation_id, expected).await?;
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "stale",
                format!(
                    "the operation is at version {} now, not {expected}: {changed}; look again before deciding",
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
    let report = tokio::spawn(super::operations::boxed(async move {
        if pinned {
            engine
                .resolve_review_seen(
                    loaded,
                    reviewer,
                    Some(decided_by),
                    decision,
                    body.note,
                    accept_duplicate_risk,
                )
                .await
        } else {
            engine
                .resolve_review(
                    operation_id,
                    reviewer,
                    Some(decided_by),
                    decision,
                    body.note,
                    accept_duplicate_risk,
                )
                .await
        }
    }))
    .await
    .map_err(|error| ApiError::internal("a review decision failed", error))??;
    Ok(view_reply(
        StatusCode::OK,
        &operation_view(&shared, &report.operation),
    ))
}

/// Most events after the version an operator saw that a stale refusal reads to say what changed.
const MAX_CHANGES_READ: usize = 64;

/// What happened to `operation_id` after version `seen`, in words: who decided what (another
/// operator's decision is the usual reason), else which evidence arrived.
async fn what_changed(
    shared: &Shared,
    operation_id: OperationId,
    seen: u64,
) -> Result<String, ApiError> {
    let store = shared.engine.ledger().store();
    let stream = opledger_domain::store::StreamName::for_operation(operation_id);
    let events = store
        .read_stream(
            &stream,
            StreamVersion::new(seen.saturating_add(1)),
            MAX_CHANGES_READ,
        )
        .await?;
    let mut evidence = Vec::new();
    for recorded in &events {
        let Ok(event) = opledger_domain::codec::decode(recorded) else {
            continue;
        };
        if let opledger_domain::event::OperationEvent::ReviewResolved(resolved) = &event {
            let decision = match &resolved.decision {
                ReviewDecision::Retry => "to retry it".to_owned(),
                ReviewDecision::Abandon => "to abandon it".to_owned(),
                ReviewDecision::ConfirmSucceeded { external_id } => {
                    format!("that it succeeded as {external_id}")
                }
            };
            let note = if resolved.note.trim().is_empty() {
                String::new()
            } else {
                format!(" (note: \"{}\")", resolved.note.trim())
            };
            return Ok(format!(
                "{} decided {decision} at {}{note}",
                resolved.reviewer,
                resolved
                    .at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            ));
        }
        evidence.push(recorded.event_type.clone());
    }
    Ok(if evidence.is_empty() {
        "it changed since you loaded it".to_owned()
    } else {
        format!("new evidence arrived ({})", evidence.join(", "))
    })
}
