//! Events of the log as outcomes: the friendly types (`succeeded`, `unknown`, `duplicate`, …) that
//! `opledger tail` prints and the server's event stream sends, and one outcome as JSON.

use std::collections::BTreeSet;

use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::event::{LateResponse, OperationEvent, ReconciliationResult, ReviewDecision};
use opledger_domain::ids::{OperationId, StreamVersion};
use opledger_domain::state::{evolve, OperationState, Status};
use opledger_domain::store::{EventStore, RecordedEvent, MAX_READ_BATCH};
use serde_json::json;

use super::{timeline, RenderError};

/// Every friendly type `--type` accepts; see `opledger tail --help` for the events behind each.
pub const TYPES: [&str; 15] = [
    "succeeded",
    "unknown",
    "rejected",
    "needs_review",
    "duplicate",
    "denied",
    "abandoned",
    "recorded",
    "approved",
    "started",
    "not_sent",
    "lookup_claimed",
    "lookup",
    "retry",
    "late",
];
/// The outcomes printed when `--type` is not given.
pub const DEFAULT_TYPES: [&str; 7] = [
    "succeeded",
    "unknown",
    "rejected",
    "needs_review",
    "duplicate",
    "denied",
    "abandoned",
];

/// The friendly types named in `given` (the defaults when empty); `field` names the input in errors.
pub fn wanted_types(
    field: &str,
    given: &[String],
) -> Result<BTreeSet<&'static str>, ValidationError> {
    if given.is_empty() {
        return Ok(DEFAULT_TYPES.into_iter().collect());
    }
    let mut wanted = BTreeSet::new();
    for name in given.iter().map(|name| name.trim()) {
        if name == "all" {
            wanted.extend(TYPES);
            continue;
        }
        let known = TYPES.iter().find(|known| **known == name).ok_or_else(|| {
            ValidationError::new(
                field,
                format!(
                    "`{name}` is not an event type; use `all` or some of {}",
                    TYPES.join(", ")
                ),
            )
        })?;
        wanted.insert(*known);
    }
    Ok(wanted)
}

/// An event of the log as an outcome: its operation, friendly type and decoded event.
pub struct Outcome {
    /// The operation it belongs to.
    pub operation_id: OperationId,
    /// Its friendly type (one of [`TYPES`]).
    pub kind: &'static str,
    /// The event.
    pub event: OperationEvent,
}

/// What a subscriber is told about one event, the same on the event stream (`GET /v1/events`,
/// the SSE `data`) and in a webhook (its `data`): the event (its friendly type, the stored type,
/// its position, stream version and time), the operation it belongs to (tenant, owner, source
/// id, provider, account, action; the attempt the event is about, if any), and where the
/// operation stands after it (its state, external id, and the agent's sentence in the action's
/// configured words, `description`). One JSON Schema per type documents it
/// (`docs/src/subscribers/events/`). It never carries the operation's arguments or its key: they
/// may hold personal data or secrets a subscriber has no need for, and the operation's own
/// route shows them to whoever may see them.
pub fn event_payload(
    recorded: &RecordedEvent,
    outcome: &Outcome,
    after: &OperationState,
    description: Option<&str>,
) -> serde_json::Value {
    let intent = after.intent.as_ref();
    json!({
        "type": outcome.kind,
        "event_type": recorded.event_type,
        "position": recorded.position,
        "version": recorded.version,
        "at": outcome.event.at(),
        "operation_id": outcome.operation_id,
        "tenant": intent.map(|intent| &intent.tenant),
        "owner": intent.and_then(|intent| intent.owner.as_ref()),
        "source_id": intent.and_then(|intent| intent.source_id.as_ref()),
        "provider": intent.map(|intent| &intent.provider),
        "account": intent.map(|intent| &intent.account),
        "action": intent.map(|intent| &intent.action),
        "attempt_id": attempt_of(&outcome.event),
        "state": after.status.name(),
        "external_id": after.external_id(),
        "sentence": opledger_domain::sentence::described_sentence(after, description),
    })
}

/// The attempt an event is about, if it is about one.
fn attempt_of(event: &OperationEvent) -> Option<opledger_domain::ids::AttemptId> {
    match event {
        OperationEvent::AttemptStarted(e) => Some(e.attempt_id),
        OperationEvent::AttemptSucceeded(e) => Some(e.attempt_id),
        OperationEvent::AttemptRejected(e) => Some(e.attempt_id),
        OperationEvent::OutcomeUnknown(e) => Some(e.attempt_id),
        OperationEvent::AttemptNotSent(e) => Some(e.attempt_id),
        OperationEvent::LeaseExpired(e) => Some(e.attempt_id),
        OperationEvent::LateResponseReceived(e) => Some(e.attempt_id),
        _ => None,
    }
}

/// One outcome as JSON, as `tail --json` prints it.
pub fn outcome_json(recorded: &RecordedEvent, outcome: &Outcome) -> serde_json::Value {
    json!({
        "position": recorded.position,
        "type": outcome.kind,
        "event_type": recorded.event_type,
        "operation_id": outcome.operation_id,
        "version": recorded.version,
        "at": outcome.event.at(),
        "detail": timeline::describe(&outcome.event),
    })
}

/// Classifies one event of the log; `None` for events outside operation streams.
pub async fn outcome_of<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
) -> Result<Option<Outcome>, RenderError> {
    outcome_after(store, recorded, None).await
}

/// [`outcome_of`] for a reader that may already hold the operation's state just before
/// `recorded` (`before`): the stream is read back only when it is needed and not given.
pub async fn outcome_after<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
    before: Option<&OperationState>,
) -> Result<Option<Outcome>, RenderError> {
    // Only operation streams carry operation events.
    let Some(operation_id) = recorded.stream.operation_id() else {
        return Ok(None);
    };
    let event = codec::decode(recorded).map_err(opledger_domain::app::AppError::from)?;
    let kind = match friendly_type(&event) {
        Some(kind) => kind,
        // Whether a late success or a found object settles the operation depends on the state
        // before it: on an operation already confirmed it is a late answer or a lookup (its
        // duplicate, if any, follows as its own event), never a second success.
        None => {
            let read;
            let before = match before {
                Some(before) => before,
                None => {
                    read = state_before(store, recorded).await?;
                    &read
                }
            };
            match (&event, &before.status) {
                (_, Status::Succeeded { .. })
                    if matches!(event, OperationEvent::ReconciliationRecorded(_)) =>
                {
                    "lookup"
                }
                (_, Status::Succeeded { .. }) => "late",
                _ => "succeeded",
            }
        }
    };
    Ok(Some(Outcome {
        operation_id,
        kind,
        event,
    }))
}

/// The friendly type of an event; `None` for a late success or a found object, which need the
/// state before them.
fn friendly_type(event: &OperationEvent) -> Option<&'static str> {
    Some(match event {
        OperationEvent::IntentRecorded(_) => "recorded",
        OperationEvent::ApprovalGranted(_) => "approved",
        OperationEvent::ApprovalDenied(_) => "denied",
        OperationEvent::AttemptStarted(_) => "started",
        OperationEvent::AttemptSucceeded(_) => "succeeded",
        OperationEvent::AttemptRejected(_) => "rejected",
        OperationEvent::OutcomeUnknown(_) | OperationEvent::LeaseExpired(_) => "unknown",
        // Nothing was sent either; the type list (and the API's schema) stays as it was.
        OperationEvent::AttemptNotSent(_) | OperationEvent::SendPostponed(_) => "not_sent",
        OperationEvent::LookupClaimed(_) => "lookup_claimed",
        // The lookup's news (put off, nothing asked); the type list stays as it was.
        OperationEvent::LookupPostponed(_) => "lookup",
        OperationEvent::ReconciliationRecorded(e) => match e.result {
            ReconciliationResult::Found { .. } => return None,
            _ => "lookup",
        },
        OperationEvent::RetryScheduled(_) => "retry",
        OperationEvent::ReviewRequired(_) => "needs_review",
        OperationEvent::ReviewResolved(e) => match e.decision {
            ReviewDecision::Retry => "retry",
            ReviewDecision::ConfirmSucceeded { .. } => "succeeded",
            ReviewDecision::Abandon => "abandoned",
        },
        OperationEvent::LateResponseReceived(e) => match e.response {
            LateResponse::Succeeded { .. } => return None,
            LateResponse::Rejected { .. } => "late",
        },
        OperationEvent::DuplicateDetected(_) => "duplicate",
    })
}

/// The operation's state just before `recorded`, folded from its stream.
async fn state_before<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
) -> Result<OperationState, RenderError> {
    state_until(store, recorded, recorded.version).await
}

/// The operation's state just after `recorded`: what a subscriber is told it now is.
pub async fn state_through<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
) -> Result<OperationState, RenderError> {
    state_until(store, recorded, recorded.version.next()).await
}

/// The operation's state folded from the events of `recorded`'s stream before version `end`.
async fn state_until<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
    end: StreamVersion,
) -> Result<OperationState, RenderError> {
    let mut state = OperationState::initial();
    let mut from = StreamVersion::FIRST;
    while from < end {
        let wanted = usize::try_from(end.value() - from.value())
            .unwrap_or(MAX_READ_BATCH)
            .min(MAX_READ_BATCH);
        let batch = store.read_stream(&recorded.stream, from, wanted).await?;
        let Some(last) = batch.last() else { break };
        from = last.version.next();
        for event in batch.iter().filter(|event| event.version < end) {
            let decoded = codec::decode(event).map_err(opledger_domain::app::AppError::from)?;
            state = evolve(state, &decoded);
        }
    }
    Ok(state)
}
