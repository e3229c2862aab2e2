//! Claiming an attempt: the single-sender move `pending → in_flight` (design rule 5).
//!
//! It must never start an attempt outside `pending`, reuse an attempt id, send under another
//! binding (rule 4), or start an automatic retry the contract and budget do not allow (rule 9).

use chrono::DateTime;
use chrono::Utc;

use super::{clip, schedule, On, Rejection};
use crate::command::{MAX_LEASE_MS, MIN_LEASE_MS};
use crate::contract::{
    check_automatic_retry, check_binding, check_retry_time, milliseconds, ContractViolation,
    ProviderCapabilities, RetryPolicy, SendBinding, MAX_ATTEMPTS_LIMIT,
};
use crate::error::{OutOfRange, ValidationError};
use crate::event::{AttemptStarted, BudgetWait, OperationEvent, SendPostponed};
use crate::ids::{AttemptId, WorkerId};
use crate::state::{PendingSince, Status};

/// The fields of [`crate::command::Command::StartAttempt`], borrowed.
pub(super) struct Claim<'a> {
    pub(super) attempt_id: AttemptId,
    pub(super) worker: &'a WorkerId,
    pub(super) lease_ms: u64,
    pub(super) binding: &'a SendBinding,
    pub(super) capabilities: &'a ProviderCapabilities,
    pub(super) policy: &'a RetryPolicy,
    pub(super) budget_wait: Option<&'a BudgetWait>,
    pub(super) request: Option<&'a String>,
}

/// `pending --StartAttempt (binding, contract)--> in_flight`; the same claim again is nothing.
pub(super) fn start(on: &On<'_>, claim: &Claim<'_>) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    if on.intent.executed_by_caller() {
        return Err(Rejection::WrongExecutor {
            executor: on.intent.executor,
        });
    }
    if state.knows_attempt(claim.attempt_id) {
        // The same claim again (its append's outcome was unclear): nothing new. Any other reuse
        // of an attempt id would let a late answer to one attempt pass for another's.
        if state.status == Status::InFlight && state.is_current_attempt(claim.attempt_id) {
            return Ok(Vec::new());
        }
        return Err(ValidationError::new(
            "attempt_id",
            format!(
                "{} was already used by an earlier attempt; every attempt needs a fresh id",
                claim.attempt_id
            ),
        )
        .into());
    }
    if state.status != Status::Pending {
        return Err(on.refuse());
    }
    check_lease(claim.lease_ms)?;
    if let Some(not_before) = state
        .retry_not_before
        .filter(|not_before| on.now < *not_before)
    {
        return Err(Rejection::NotYetDue { not_before });
    }
    check_binding(state, claim.binding).map_err(Rejection::BindingChanged)?;
    check_may_send_again(on, claim)?;
    Ok(vec![OperationEvent::AttemptStarted(AttemptStarted {
        attempt_id: claim.attempt_id,
        attempt_number: state.attempts + 1,
        worker: claim.worker.clone(),
        lease_deadline: lease_deadline(on.now, claim.lease_ms)?,
        budget_wait: claim.budget_wait.cloned(),
        request: claim.request.cloned(),
        at: on.now,
    })])
}

/// `pending --ClaimStep--> in_flight`: the caller claims its step's next attempt; the same claim
/// again is nothing. No binding or retry contract to check: the caller's function is bound to
/// nothing the ledger configures, and a step is only pending again after a person decided to
/// retry it (its contract is "none": an unknown step is never retried automatically).
pub(super) fn claim_step(
    on: &On<'_>,
    attempt_id: AttemptId,
    caller: &WorkerId,
    lease_ms: u64,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    if !on.intent.executed_by_caller() {
        return Err(Rejection::WrongExecutor {
            executor: on.intent.executor,
        });
    }
    if state.knows_attempt(attempt_id) {
        if state.status == Status::InFlight && state.is_current_attempt(attempt_id) {
            return Ok(Vec::new());
        }
        return Err(ValidationError::new(
            "attempt_id",
            format!("{attempt_id} was already used by an earlier attempt; every attempt needs a fresh id"),
        )
        .into());
    }
    if state.status != Status::Pending {
        return Err(on.refuse());
    }
    check_lease(lease_ms)?;
    if let Some(not_before) = state
        .retry_not_before
        .filter(|not_before| on.now < *not_before)
    {
        return Err(Rejection::NotYetDue { not_before });
    }
    check_attempt_limit(state.attempts)?;
    Ok(vec![OperationEvent::AttemptStarted(AttemptStarted {
        attempt_id,
        attempt_number: state.attempts + 1,
        worker: caller.clone(),
        lease_deadline: lease_deadline(on.now, lease_ms)?,
        budget_wait: None,
        request: None,
        at: on.now,
    })])
}

/// `pending --PostponeSend--> pending`, no attempt started: what the send needs before its claim
/// (the account's credentials, a budget slot) is not there until `not_before`.
pub(super) fn postpone(
    on: &On<'_>,
    reason: &str,
    not_before: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    if on.state.status != Status::Pending {
        return Err(on.refuse());
    }
    Ok(vec![OperationEvent::SendPostponed(SendPostponed {
        reason: clip(reason),
        not_before: schedule(not_before, on.now),
        at: on.now,
    })])
}

/// The lease's range has one owner, shared with [`crate::engine::EnginePolicy::validate`].
pub(super) fn check_lease(lease_ms: u64) -> Result<(), ValidationError> {
    Ok(OutOfRange::check(
        "lease_ms",
        lease_ms,
        MIN_LEASE_MS,
        MAX_LEASE_MS,
    )?)
}

/// The checks a send needs beyond the binding, by how the operation came to be pending.
fn check_may_send_again(on: &On<'_>, claim: &Claim<'_>) -> Result<(), Rejection> {
    let state = on.state;
    match state.pending_since {
        Some(PendingSince::RetryScheduled) => {
            check_automatic_retry(
                claim.capabilities,
                claim.policy,
                state,
                claim.binding,
                on.now,
            )
            .map_err(Rejection::RetryNotAllowed)?;
        }
        // Pending since it was recorded, with attempts made: every one of them was provably
        // not sent (429, no connection; any other answer moves it on for good or to unknown).
        // They risk nothing, so they do not use up the attempts the policy allows (which bound
        // the risky ones); the time budget still ends a CRM that keeps refusing at a person, and
        // the hard limit below still holds.
        Some(PendingSince::Recorded) if state.attempts > 0 => {
            debug_assert_eq!(
                state.uncertain_attempts, 0,
                "a recorded operation's attempts were all not sent"
            );
            check_retry_time(claim.policy, state, on.now).map_err(Rejection::RetryNotAllowed)?;
        }
        // A reviewer's retry is the person's decision; only the hard limit applies.
        _ => {}
    }
    check_attempt_limit(state.attempts)
}

/// The hard limit no policy and no person can lift.
pub(super) fn check_attempt_limit(attempts: u32) -> Result<(), Rejection> {
    if attempts >= MAX_ATTEMPTS_LIMIT {
        return Err(Rejection::RetryNotAllowed(
            ContractViolation::AttemptsExhausted {
                attempts,
                max_attempts: MAX_ATTEMPTS_LIMIT,
            },
        ));
    }
    Ok(())
}

pub(super) fn lease_deadline(
    now: DateTime<Utc>,
    lease_ms: u64,
) -> Result<DateTime<Utc>, ValidationError> {
    now.checked_add_signed(milliseconds(lease_ms))
        .ok_or_else(|| ValidationError::new("now", "is too close to the end of time for a lease"))
}
