//! What became of an attempt: the provider's answer, an unclear ending, a lease that ran out, or
//! proof that nothing was sent.
//!
//! It must never turn a confirmed success back (design rule 7), let an answer to one attempt
//! settle another, end an operation as rejected while an earlier attempt may have applied it,
//! or treat an unclear ending as a failure (rule 6).

use chrono::{DateTime, Utc};

use super::{check_attempt, clip, duplicate_of, schedule, On, Rejection};
use crate::event::{
    AttemptNotSent, AttemptRejected, AttemptSucceeded, LateResponse, LateResponseReceived,
    LeaseExpired, OperationEvent, OutcomeUnknown,
};
use crate::ids::{AttemptId, ExternalObjectId, ProviderRequestId};
use crate::state::Status;

/// `in_flight --RecordSuccess--> succeeded`; a late or different confirmation is kept as
/// evidence, and a different object for a confirmed operation is a detected duplicate.
pub(super) fn success(
    on: &On<'_>,
    attempt_id: AttemptId,
    external_id: &ExternalObjectId,
    provider_request_id: Option<&ProviderRequestId>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    check_attempt(state, attempt_id)?;
    match &state.status {
        Status::InFlight if state.is_current_attempt(attempt_id) => {
            Ok(vec![OperationEvent::AttemptSucceeded(AttemptSucceeded {
                attempt_id,
                external_id: external_id.clone(),
                provider_request_id: provider_request_id.cloned(),
                at: on.now,
            })])
        }
        Status::Succeeded {
            external_id: confirmed,
        } if confirmed == external_id => Ok(Vec::new()),
        _ => {
            let late = OperationEvent::LateResponseReceived(LateResponseReceived {
                attempt_id,
                response: LateResponse::Succeeded {
                    external_id: external_id.clone(),
                    provider_request_id: provider_request_id.cloned(),
                },
                at: on.now,
            });
            let found_by = format!("late response to attempt {attempt_id}");
            let mut events = vec![late];
            events.extend(duplicate_of(state, external_id, &found_by, on.now));
            Ok(events)
        }
    }
}

/// `in_flight --RecordRejection--> rejected` (unknown after an unclear attempt, as the fold
/// decides); a late refusal is kept as evidence only.
pub(super) fn rejection(
    on: &On<'_>,
    attempt_id: AttemptId,
    code: &str,
    message: &str,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    check_attempt(state, attempt_id)?;
    let code = clip(code);
    let message = clip(message);
    match state.status {
        Status::InFlight if state.is_current_attempt(attempt_id) => {
            Ok(vec![OperationEvent::AttemptRejected(AttemptRejected {
                attempt_id,
                code,
                message,
                at: on.now,
            })])
        }
        Status::Rejected if state.is_current_attempt(attempt_id) => Ok(Vec::new()),
        // A refusal that arrives late proves nothing about the other attempts: keep it as
        // evidence and let reconciliation or a person settle the operation.
        _ => Ok(vec![OperationEvent::LateResponseReceived(
            LateResponseReceived {
                attempt_id,
                response: LateResponse::Rejected { code, message },
                at: on.now,
            },
        )]),
    }
}

/// `in_flight --RecordNotSent (provably nothing sent)--> pending`, as the attempt claimed it.
pub(super) fn not_sent(
    on: &On<'_>,
    attempt_id: AttemptId,
    reason: &str,
    retry_not_before: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    check_attempt(state, attempt_id)?;
    match state.status {
        Status::InFlight if state.is_current_attempt(attempt_id) => {
            Ok(vec![OperationEvent::AttemptNotSent(AttemptNotSent {
                attempt_id,
                reason: clip(reason),
                retry_not_before: schedule(retry_not_before, on.now),
                at: on.now,
            })])
        }
        // Settled or superseded already: "nothing was sent" adds nothing.
        _ => Ok(Vec::new()),
    }
}

/// `in_flight --RecordUnknown--> unknown`.
pub(super) fn unknown(
    on: &On<'_>,
    attempt_id: AttemptId,
    error: &str,
    check_not_before: Option<DateTime<Utc>>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    check_attempt(state, attempt_id)?;
    match state.status {
        Status::InFlight if state.is_current_attempt(attempt_id) => {
            Ok(vec![OperationEvent::OutcomeUnknown(OutcomeUnknown {
                attempt_id,
                error: clip(error),
                // Kept within what may be scheduled, as every other "not before".
                check_not_before: check_not_before.map(|at| schedule(at, on.now)),
                at: on.now,
            })])
        }
        // The attempt was already settled or superseded; an unclear ending adds nothing.
        _ => Ok(Vec::new()),
    }
}

/// `in_flight --ExpireLease--> unknown`, once the lease has run out: an expired lease does not
/// prove the request stopped.
pub(super) fn expire_lease(
    on: &On<'_>,
    attempt_id: AttemptId,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    check_attempt(state, attempt_id)?;
    match (&state.status, &state.current_attempt) {
        (Status::InFlight, Some(current)) if current.attempt_id == attempt_id => {
            if on.now < current.lease_deadline {
                return Err(Rejection::LeaseStillValid {
                    lease_deadline: current.lease_deadline,
                });
            }
            Ok(vec![OperationEvent::LeaseExpired(LeaseExpired {
                attempt_id,
                lease_deadline: current.lease_deadline,
                at: on.now,
            })])
        }
        _ => Ok(Vec::new()),
    }
}
