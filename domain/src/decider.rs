//! The Decider: `decide(command, state, now)` gives the events a command produces, or why it is
//! refused. Pure: no I/O, no clock, no randomness — ids and time arrive in the command and `now`.
//!
//! These are the arrows of the design's state machine, and only these:
//!
//! ```text
//! new              --RecordIntent--------------------------> awaiting_approval | pending
//! awaiting_approval--GrantApproval (same args hash)--------> pending
//! awaiting_approval--DenyApproval (same args hash)---------> denied
//! pending          --StartAttempt (binding, contract)------> in_flight
//! in_flight        --RecordSuccess (external id)-----------> succeeded
//! in_flight        --RecordRejection-----------------------> rejected (unknown after an unclear attempt)
//! in_flight        --RecordUnknown / ExpireLease-----------> unknown
//! in_flight        --RecordNotSent (provably nothing sent)-> pending (as claimed, budget counts)
//! unknown          --RecordReconciliation: found-----------> succeeded
//! unknown          --RecordReconciliation: none, contract--> pending (same key)
//! unknown          --RecordReconciliation: may still show--> unknown (look again later)
//! unknown          --RecordReconciliation: inconclusive----> unknown (look again before any retry)
//! unknown          --RecordReconciliation: none, no contract> needs_review
//! unknown, pending --RequireReview-------------------------> needs_review
//! needs_review     --ResolveReview: retry | confirm | give up> pending | succeeded | abandoned
//! succeeded        --a different external id---------------> succeeded + DuplicateDetected
//! ```
//!
//! Refinements the design implies, each tested:
//! - a late confirmation of one of our own attempts is the provider's own evidence and settles
//!   an attempted operation that is not confirmed yet — rejected and abandoned included (it is the
//!   `in_flight → succeeded` response arriving late);
//! - a refusal ends an operation as rejected only if no earlier attempt may have applied it;
//!   after an unclear attempt it stays unknown (a retry refused as "duplicate" is evidence the
//!   first attempt worked);
//! - an attempt provably not sent (never connected, 429, the key still in flight) returns the
//!   operation to pending under exactly the conditions it was claimed under, and still counts
//!   against the attempt budget;
//! - an empty answer from a lagging search (inside its lag) or an inconclusive lookup keeps the
//!   operation unknown for another look, within the lookup budget — it never authorises a create;
//! - a pending operation whose send became impossible while queued (the retry contract ran out,
//!   rule 9: "re-checked right before each send"; the binding changed) goes to review.

use chrono::{DateTime, Utc};

use crate::args::ArgsHash;
use crate::command::{
    Command, MAX_LEASE_MS, MAX_NOTE_BYTES, MAX_PROVIDER_TEXT_BYTES, MAX_SCHEDULE_AHEAD_MS,
    MIN_LEASE_MS,
};
use crate::contract::{
    check_automatic_retry, check_binding, check_retry_budget, milliseconds, ContractViolation,
    LookupSupport, ProviderCapabilities, RetryPolicy, MAX_ATTEMPTS_LIMIT,
};
use crate::error::ValidationError;
use crate::event::{
    ApprovalDenied, ApprovalGranted, AttemptNotSent, AttemptRejected, AttemptStarted,
    AttemptSucceeded, DuplicateDetected, LateResponse, LateResponseReceived, LeaseExpired,
    OperationEvent, OutcomeUnknown, ReconciliationRecorded, ReconciliationResult, RetryScheduled,
    ReviewDecision, ReviewRequired, ReviewResolved,
};
use crate::ids::{AccountId, AttemptId, ExternalObjectId};
use crate::state::{OperationState, PendingSince, Status};

/// Why a command was refused. Nothing was recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The command's own input is invalid.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// An intent exists already under this operation id.
    #[error("the operation is already recorded (it is {status})")]
    AlreadyRecorded {
        /// Its current status.
        status: &'static str,
    },
    /// There is no such operation.
    #[error("no intent is recorded for this operation")]
    NotRecorded,
    /// The command does not apply in the current state.
    #[error("cannot {command} an operation that is {status}")]
    NotAllowed {
        /// The command refused.
        command: &'static str,
        /// The operation's status.
        status: &'static str,
    },
    /// An approval or denial names a snapshot other than the recorded one.
    #[error("the approval is for arguments {offered}, but the operation froze {recorded}; show the approver the recorded arguments and send their hash")]
    ArgsHashMismatch {
        /// The recorded snapshot's hash.
        recorded: ArgsHash,
        /// The hash the approver sent.
        offered: ArgsHash,
    },
    /// A scheduled retry is not due yet.
    #[error("the next attempt may not start before {not_before}")]
    NotYetDue {
        /// When it may.
        not_before: DateTime<Utc>,
    },
    /// The send would not be bound to what the intent froze.
    #[error("the send is not bound to the intent: {0}")]
    BindingChanged(ContractViolation),
    /// An automatic retry is not safe or not within budget now.
    #[error("an automatic retry is not allowed: {0}")]
    RetryNotAllowed(ContractViolation),
    /// The attempt's lease has not run out.
    #[error("the lease of the attempt runs until {lease_deadline}")]
    LeaseStillValid {
        /// When it runs out.
        lease_deadline: DateTime<Utc>,
    },
    /// A response names an attempt this operation never started.
    #[error("attempt {attempt_id} is not an attempt of this operation")]
    UnknownAttempt {
        /// The attempt named.
        attempt_id: AttemptId,
    },
    /// Reconciliation evidence belongs to another account, so it is no evidence for this operation.
    #[error("the object found belongs to account `{found}`, but the operation is bound to `{bound}`; it is not evidence")]
    EvidenceFromAnotherAccount {
        /// The operation's account.
        bound: AccountId,
        /// The account of the object found.
        found: AccountId,
    },
}

/// Decides what `command` does to an operation in `state` at `now`: the events to append, in
/// order, or why nothing may be. An empty list means the command changes nothing (it repeats
/// what is already recorded), so retried commands are harmless.
pub fn decide(
    command: &Command,
    state: &OperationState,
    now: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let refuse = || Rejection::NotAllowed {
        command: command.name(),
        status: state.status.name(),
    };
    if let Command::RecordIntent(intent) = command {
        if state.status != Status::New {
            return Err(Rejection::AlreadyRecorded {
                status: state.status.name(),
            });
        }
        if intent.args.hash() != intent.args_hash {
            return Err(ValidationError::new(
                "args_hash",
                "does not match the arguments; compute it with ArgsSnapshot::hash",
            )
            .into());
        }
        return Ok(vec![OperationEvent::IntentRecorded(intent.clone())]);
    }
    let Some(intent) = &state.intent else {
        return Err(Rejection::NotRecorded);
    };
    let events = match command {
        Command::RecordIntent(_) => unreachable!("handled above"),
        Command::GrantApproval {
            approver,
            args_hash,
        } => {
            check_hash(&intent.args_hash, args_hash)?;
            match state.status {
                Status::AwaitingApproval => {
                    vec![OperationEvent::ApprovalGranted(ApprovalGranted {
                        approver: approver.clone(),
                        args_hash: args_hash.clone(),
                        at: now,
                    })]
                }
                // Approving what is already approved repeats a recorded fact.
                _ if intent.requires_approval && state.status != Status::Denied => Vec::new(),
                _ => return Err(refuse()),
            }
        }
        Command::DenyApproval {
            approver,
            args_hash,
            reason,
        } => {
            check_hash(&intent.args_hash, args_hash)?;
            check_note("reason", reason)?;
            match state.status {
                Status::AwaitingApproval => vec![OperationEvent::ApprovalDenied(ApprovalDenied {
                    approver: approver.clone(),
                    args_hash: args_hash.clone(),
                    reason: reason.clone(),
                    at: now,
                })],
                Status::Denied => Vec::new(),
                _ => return Err(refuse()),
            }
        }
        Command::StartAttempt {
            attempt_id,
            worker,
            lease_ms,
            binding,
            capabilities,
            policy,
        } => {
            if state.knows_attempt(*attempt_id) {
                // The same claim again (its append's outcome was unclear): nothing new. Any other
                // reuse of an attempt id would let a late answer to one attempt pass for another's.
                if state.status == Status::InFlight && state.is_current_attempt(*attempt_id) {
                    return Ok(Vec::new());
                }
                return Err(ValidationError::new(
                    "attempt_id",
                    format!("{attempt_id} was already used by an earlier attempt; every attempt needs a fresh id"),
                )
                .into());
            }
            if state.status != Status::Pending {
                return Err(refuse());
            }
            if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(lease_ms) {
                return Err(ValidationError::new(
                    "lease_ms",
                    format!("is {lease_ms}; it must be between {MIN_LEASE_MS} and {MAX_LEASE_MS}"),
                )
                .into());
            }
            if let Some(not_before) = state
                .retry_not_before
                .filter(|not_before| now < *not_before)
            {
                return Err(Rejection::NotYetDue { not_before });
            }
            check_binding(state, binding).map_err(Rejection::BindingChanged)?;
            match state.pending_since {
                Some(PendingSince::RetryScheduled) => {
                    check_automatic_retry(capabilities, policy, state, binding, now)
                        .map_err(Rejection::RetryNotAllowed)?;
                }
                // Attempts provably not sent (429, no connection) still count against the
                // budget: a CRM that keeps refusing must end with a person, not loop.
                Some(PendingSince::Recorded) if state.attempts > 0 => {
                    check_retry_budget(policy, state, now).map_err(Rejection::RetryNotAllowed)?;
                }
                // A reviewer's retry is the person's decision; only the hard limit applies.
                _ => {}
            }
            if state.attempts >= MAX_ATTEMPTS_LIMIT {
                return Err(Rejection::RetryNotAllowed(
                    ContractViolation::AttemptsExhausted {
                        attempts: state.attempts,
                        max_attempts: MAX_ATTEMPTS_LIMIT,
                    },
                ));
            }
            vec![OperationEvent::AttemptStarted(AttemptStarted {
                attempt_id: *attempt_id,
                attempt_number: state.attempts + 1,
                worker: worker.clone(),
                lease_deadline: now.checked_add_signed(milliseconds(*lease_ms)).ok_or_else(
                    || ValidationError::new("now", "is too close to the end of time for a lease"),
                )?,
                at: now,
            })]
        }
        Command::RecordSuccess {
            attempt_id,
            external_id,
            provider_request_id,
        } => {
            check_attempt(state, *attempt_id)?;
            match &state.status {
                Status::InFlight if state.is_current_attempt(*attempt_id) => {
                    vec![OperationEvent::AttemptSucceeded(AttemptSucceeded {
                        attempt_id: *attempt_id,
                        external_id: external_id.clone(),
                        provider_request_id: provider_request_id.clone(),
                        at: now,
                    })]
                }
                Status::Succeeded {
                    external_id: confirmed,
                } if confirmed == external_id => Vec::new(),
                _ => {
                    let late = OperationEvent::LateResponseReceived(LateResponseReceived {
                        attempt_id: *attempt_id,
                        response: LateResponse::Succeeded {
                            external_id: external_id.clone(),
                            provider_request_id: provider_request_id.clone(),
                        },
                        at: now,
                    });
                    let mut events = vec![late];
                    events.extend(duplicate_of(
                        state,
                        external_id,
                        &format!("late response to attempt {attempt_id}"),
                        now,
                    ));
                    events
                }
            }
        }
        Command::RecordRejection {
            attempt_id,
            code,
            message,
        } => {
            check_attempt(state, *attempt_id)?;
            let code = clip(code);
            let message = clip(message);
            match state.status {
                Status::InFlight if state.is_current_attempt(*attempt_id) => {
                    vec![OperationEvent::AttemptRejected(AttemptRejected {
                        attempt_id: *attempt_id,
                        code,
                        message,
                        at: now,
                    })]
                }
                Status::Rejected if state.is_current_attempt(*attempt_id) => Vec::new(),
                // A refusal that arrives late proves nothing about the other attempts: keep it as
                // evidence and let reconciliation or a person settle the operation.
                _ => vec![OperationEvent::LateResponseReceived(LateResponseReceived {
                    attempt_id: *attempt_id,
                    response: LateResponse::Rejected { code, message },
                    at: now,
                })],
            }
        }
        Command::RecordNotSent {
            attempt_id,
            reason,
            retry_not_before,
        } => {
            check_attempt(state, *attempt_id)?;
            match state.status {
                Status::InFlight if state.is_current_attempt(*attempt_id) => {
                    vec![OperationEvent::AttemptNotSent(AttemptNotSent {
                        attempt_id: *attempt_id,
                        reason: clip(reason),
                        retry_not_before: schedule(*retry_not_before, now),
                        at: now,
                    })]
                }
                // Settled or superseded already: "nothing was sent" adds nothing.
                _ => Vec::new(),
            }
        }
        Command::RecordUnknown { attempt_id, error } => {
            check_attempt(state, *attempt_id)?;
            match state.status {
                Status::InFlight if state.is_current_attempt(*attempt_id) => {
                    vec![OperationEvent::OutcomeUnknown(OutcomeUnknown {
                        attempt_id: *attempt_id,
                        error: clip(error),
                        at: now,
                    })]
                }
                // The attempt was already settled or superseded; an unclear ending adds nothing.
                _ => Vec::new(),
            }
        }
        Command::ExpireLease { attempt_id } => {
            check_attempt(state, *attempt_id)?;
            match (&state.status, &state.current_attempt) {
                (Status::InFlight, Some(current)) if current.attempt_id == *attempt_id => {
                    if now < current.lease_deadline {
                        return Err(Rejection::LeaseStillValid {
                            lease_deadline: current.lease_deadline,
                        });
                    }
                    vec![OperationEvent::LeaseExpired(LeaseExpired {
                        attempt_id: *attempt_id,
                        lease_deadline: current.lease_deadline,
                        at: now,
                    })]
                }
                _ => Vec::new(),
            }
        }
        Command::RecordReconciliation {
            result,
            evidence,
            binding,
            capabilities,
            policy,
            retry_not_before,
            next_check_not_before,
        } => {
            if let ReconciliationResult::Found { account, .. } = result {
                if *account != intent.account {
                    return Err(Rejection::EvidenceFromAnotherAccount {
                        bound: intent.account.clone(),
                        found: account.clone(),
                    });
                }
            }
            let recorded = |next_check_not_before| {
                OperationEvent::ReconciliationRecorded(ReconciliationRecorded {
                    result: result.clone(),
                    evidence: clip(evidence),
                    next_check_not_before,
                    at: now,
                })
            };
            match (&state.status, result) {
                (Status::Unknown, ReconciliationResult::Found { .. }) => vec![recorded(None)],
                // An inconclusive answer ("the first request is still being processed", a lookup
                // that failed) is not "no evidence": a retry now would race the first request or
                // be refused, spending the attempt budget. Look again first, while the lookup
                // budget lasts; only then do a retry or a person come in.
                (Status::Unknown, ReconciliationResult::Inconclusive { .. })
                    if may_keep_checking(result, capabilities, policy, state, now) =>
                {
                    vec![recorded(Some(schedule(*next_check_not_before, now)))]
                }
                (Status::Unknown, _) => {
                    match check_automatic_retry(capabilities, policy, state, binding, now) {
                        Ok(()) => vec![
                            recorded(None),
                            OperationEvent::RetryScheduled(RetryScheduled {
                                not_before: schedule(*retry_not_before, now),
                                reason:
                                    "no evidence of the earlier attempts; the retry contract holds"
                                        .to_owned(),
                                at: now,
                            }),
                        ],
                        Err(_) if may_keep_checking(result, capabilities, policy, state, now) => {
                            vec![recorded(Some(schedule(*next_check_not_before, now)))]
                        }
                        Err(violation) => vec![
                            recorded(None),
                            OperationEvent::ReviewRequired(ReviewRequired {
                                reason: format!("no evidence, and no safe retry: {violation}"),
                                evidence: clip(evidence),
                                at: now,
                            }),
                        ],
                    }
                }
                (
                    Status::Succeeded {
                        external_id: confirmed,
                    },
                    ReconciliationResult::Found { external_id, .. },
                ) => {
                    if confirmed == external_id {
                        Vec::new()
                    } else {
                        let mut events = vec![recorded(None)];
                        events.extend(duplicate_of(state, external_id, "reconciliation", now));
                        events
                    }
                }
                (Status::Succeeded { .. }, _) => Vec::new(),
                _ => return Err(refuse()),
            }
        }
        Command::RequireReview { reason, evidence } => {
            // From pending too: a send can become impossible while queued (the retry contract ran
            // out, the account's binding changed), and only a person can decide what then.
            if !matches!(state.status, Status::Unknown | Status::Pending) {
                return Err(refuse());
            }
            check_note("reason", reason)?;
            vec![OperationEvent::ReviewRequired(ReviewRequired {
                reason: reason.clone(),
                evidence: clip(evidence),
                at: now,
            })]
        }
        Command::ResolveReview {
            reviewer,
            decision,
            note,
        } => {
            if state.status != Status::NeedsReview {
                return Err(refuse());
            }
            check_note("note", note)?;
            if *decision == ReviewDecision::Retry && state.attempts >= MAX_ATTEMPTS_LIMIT {
                return Err(Rejection::RetryNotAllowed(
                    ContractViolation::AttemptsExhausted {
                        attempts: state.attempts,
                        max_attempts: MAX_ATTEMPTS_LIMIT,
                    },
                ));
            }
            vec![OperationEvent::ReviewResolved(ReviewResolved {
                reviewer: reviewer.clone(),
                decision: decision.clone(),
                note: note.clone(),
                at: now,
            })]
        }
    };
    Ok(events)
}

fn check_hash(recorded: &ArgsHash, offered: &ArgsHash) -> Result<(), Rejection> {
    if recorded == offered {
        Ok(())
    } else {
        Err(Rejection::ArgsHashMismatch {
            recorded: recorded.clone(),
            offered: offered.clone(),
        })
    }
}

fn check_attempt(state: &OperationState, attempt_id: AttemptId) -> Result<(), Rejection> {
    if state.knows_attempt(attempt_id) {
        Ok(())
    } else {
        Err(Rejection::UnknownAttempt { attempt_id })
    }
}

fn check_note(field: &str, text: &str) -> Result<(), ValidationError> {
    if text.len() > MAX_NOTE_BYTES {
        return Err(ValidationError::new(
            field,
            format!(
                "is {} bytes long; the limit is {MAX_NOTE_BYTES} bytes",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// The duplicate a newly named object makes, if the operation is confirmed with another one.
fn duplicate_of(
    state: &OperationState,
    external_id: &ExternalObjectId,
    found_by: &str,
    now: DateTime<Utc>,
) -> Option<OperationEvent> {
    let confirmed = state.external_id()?;
    (confirmed != external_id).then(|| {
        OperationEvent::DuplicateDetected(DuplicateDetected {
            confirmed_external_id: confirmed.clone(),
            duplicate_external_id: external_id.clone(),
            found_by: found_by.to_owned(),
            at: now,
        })
    })
}

/// Whether an operation without a safe retry may stay unknown and be looked up again rather
/// than go to a person now: only while the lookup budget lasts, and only when the answer could
/// still change — the lookup was inconclusive, or a lagging search may not show the object yet.
fn may_keep_checking(
    result: &ReconciliationResult,
    capabilities: &ProviderCapabilities,
    policy: &RetryPolicy,
    state: &OperationState,
    now: DateTime<Utc>,
) -> bool {
    if state.reconciliations.saturating_add(1) >= policy.max_reconciliations {
        return false;
    }
    match (result, capabilities.lookup) {
        (ReconciliationResult::Inconclusive { .. }, _) => true,
        (
            ReconciliationResult::NotFound {
                authoritative: false,
            },
            LookupSupport::EventuallyConsistent { lag_ms },
        ) => state
            .unknown_since
            .and_then(|since| since.checked_add_signed(milliseconds(lag_ms)))
            .is_some_and(|indexed_by| now < indexed_by),
        _ => false,
    }
}

/// A caller's "not before" time, kept between now and [`MAX_SCHEDULE_AHEAD_MS`] from now: a
/// schedule in the past means "now", and one absurdly far ahead is a caller's bug that must not
/// park the operation for good (or write a timestamp other readers cannot parse).
fn schedule(requested: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    let latest = now
        .checked_add_signed(milliseconds(MAX_SCHEDULE_AHEAD_MS))
        .unwrap_or(now);
    requested.clamp(now, latest.max(now))
}

/// Cuts outside text to the limit at a character boundary.
fn clip(text: &str) -> String {
    if text.len() <= MAX_PROVIDER_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_PROVIDER_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
