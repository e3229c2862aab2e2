//! A readable timeline of one operation: every event with its offset from the intent and what it
//! means, for people reading a demo, an incident or an audit.

use opledger_domain::codec;
use opledger_domain::event::{
    BudgetWait, LateResponse, OperationEvent, ReconciliationResult, ReviewDecision,
};
use opledger_domain::ids::{OperationId, StreamVersion};
use opledger_domain::store::{EventStore, RecordedEvent, StreamName, MAX_READ_BATCH};

use super::RenderError;

/// Every event of the operation's stream, decoded, in order.
pub async fn history<S: EventStore>(
    store: &S,
    operation_id: OperationId,
) -> Result<Vec<OperationEvent>, RenderError> {
    Ok(recorded_history(store, operation_id)
        .await?
        .into_iter()
        .map(|(_, event)| event)
        .collect())
}

/// Every event of the operation's stream as stored (version, position, raw data) and decoded.
pub async fn recorded_history<S: EventStore>(
    store: &S,
    operation_id: OperationId,
) -> Result<Vec<(RecordedEvent, OperationEvent)>, RenderError> {
    let stream = StreamName::for_operation(operation_id);
    let mut events = Vec::new();
    let mut from = StreamVersion::FIRST;
    loop {
        let batch = store.read_stream(&stream, from, MAX_READ_BATCH).await?;
        let full = batch.len() == MAX_READ_BATCH;
        for recorded in batch {
            let event = codec::decode(&recorded).map_err(opledger_domain::app::AppError::from)?;
            from = recorded.version.next();
            events.push((recorded, event));
        }
        if !full {
            return Ok(events);
        }
    }
}

/// The timeline as lines: `+   12 ms  AttemptStarted        attempt #1 by demo-worker`.
pub fn lines(events: &[OperationEvent]) -> Vec<String> {
    let Some(start) = events.first().map(OperationEvent::at) else {
        return Vec::new();
    };
    events
        .iter()
        .map(|event| {
            let offset_ms = (event.at() - start).num_milliseconds();
            format!(
                "+{offset_ms:>6} ms  {:<24}{}",
                event.type_name(),
                describe(event)
            )
        })
        .collect()
}

/// `, after it waited 1.2 s for main's lookup budget`, or nothing.
fn after_wait(wait: Option<&BudgetWait>) -> String {
    wait.map_or_else(String::new, |wait| format!(", after it {wait}"))
}

/// The token behind a decision, as ` (with the approver token finance-lead)`; nothing for a
/// decision recorded without one.
fn decided_with(principal: Option<&opledger_domain::event::Principal>) -> String {
    principal.map_or_else(String::new, |principal| {
        format!(" ({})", principal.phrase())
    })
}

/// What one event means, in a phrase.
pub fn describe(event: &OperationEvent) -> String {
    match event {
        OperationEvent::IntentRecorded(e) => format!(
            "{} at {}/{} key {} args {}",
            e.action,
            e.provider,
            e.account,
            e.idempotency_key,
            e.args.canonical_json()
        ),
        OperationEvent::ApprovalGranted(e) => {
            format!("by {}{}", e.approver, decided_with(e.principal.as_ref()))
        }
        OperationEvent::ApprovalDenied(e) => format!(
            "by {}{}: {}",
            e.approver,
            decided_with(e.principal.as_ref()),
            e.reason
        ),
        OperationEvent::AttemptStarted(e) => format!(
            "attempt #{} ({}) by {}{}{}",
            e.attempt_number,
            e.attempt_id,
            e.worker,
            after_wait(e.budget_wait.as_ref()),
            e.request
                .as_ref()
                .map_or_else(String::new, |request| format!(": {request}"))
        ),
        OperationEvent::AttemptSucceeded(e) => format!("confirmed: object {}", e.external_id),
        OperationEvent::AttemptRejected(e) => format!("refused: {} {}", e.code, e.message),
        OperationEvent::OutcomeUnknown(e) => format!("no outcome: {}", e.error),
        OperationEvent::AttemptNotSent(e) => format!("nothing applied: {}", e.reason),
        OperationEvent::SendPostponed(e) => {
            format!("not sent, waiting until {}: {}", e.not_before, e.reason)
        }
        OperationEvent::LeaseExpired(e) => format!("lease of {} ran out", e.attempt_id),
        OperationEvent::LookupPostponed(e) => {
            format!(
                "not looked up, waiting until {}: {}",
                e.not_before, e.reason
            )
        }
        OperationEvent::LookupClaimed(e) => format!(
            "lookup claimed by {} until {}{}",
            e.worker,
            e.lease_deadline,
            after_wait(e.budget_wait.as_ref())
        ),
        OperationEvent::ReconciliationRecorded(e) => match &e.result {
            ReconciliationResult::Found {
                external_id,
                account,
            } => {
                format!("found object {external_id} in {account} ({})", e.evidence)
            }
            ReconciliationResult::NotFound { authoritative } => format!(
                "not found{} ({})",
                if *authoritative {
                    ""
                } else {
                    ", which proves nothing yet"
                },
                e.evidence
            ),
            ReconciliationResult::Inconclusive { reason } => format!("inconclusive: {reason}"),
        },
        OperationEvent::RetryScheduled(e) => format!("same key, {}", e.reason),
        OperationEvent::ReviewRequired(e) => e.reason.clone(),
        OperationEvent::ReviewResolved(e) => {
            let decision = match &e.decision {
                ReviewDecision::Retry => "retry".to_owned(),
                ReviewDecision::ConfirmSucceeded { external_id } => {
                    format!("confirmed object {external_id}")
                }
                ReviewDecision::Abandon => "abandoned".to_owned(),
            };
            format!(
                "{}{} decided: {decision} ({})",
                e.reviewer,
                decided_with(e.principal.as_ref()),
                e.note
            )
        }
        OperationEvent::LateResponseReceived(e) => match &e.response {
            LateResponse::Succeeded { external_id, .. } => {
                format!("late confirmation: object {external_id}")
            }
            LateResponse::Rejected { code, .. } => format!("late refusal: {code}"),
        },
        OperationEvent::DuplicateDetected(e) => format!(
            "object {} duplicates {} ({})",
            e.duplicate_external_id, e.confirmed_external_id, e.found_by
        ),
    }
}
