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
//! pending (a step) --ClaimStep (the caller claims)---------> in_flight
//! in_flight        --RecordSuccess (external id)-----------> succeeded
//! in_flight        --RecordRejection-----------------------> rejected (unknown after an unclear attempt)
//! in_flight        --RecordUnknown / ExpireLease-----------> unknown
//! in_flight        --RecordNotSent (provably nothing sent)-> pending (as claimed, budget counts)
//! unknown          --ClaimLookup (due, no live claim)------> unknown (one worker looks it up)
//! unknown          --RecordReconciliation: found-----------> succeeded
//! unknown          --RecordReconciliation: none, contract--> pending (same key)
//! unknown          --RecordReconciliation: may still show--> unknown (look again later)
//! unknown          --RecordReconciliation: inconclusive----> unknown (look again before any retry)
//! unknown          --RecordReconciliation: in progress, budget spent> needs_review (never a retry)
//! unknown          --RecordReconciliation: none, no contract> needs_review
//! unknown, pending --RequireReview-------------------------> needs_review
//! needs_review,
//! unknown          --ResolveReview: retry | confirm | give up> pending | succeeded | abandoned
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
//! - a lookup saying the first request is still in progress at the provider keeps looking while
//!   the lookup budget and the total time budget last, then goes to a person: a retry then would
//!   be refused as in flight (spending the attempt budget) or race the first request;
//! - a lookup is claimed before it is made (`LookupClaimed`, with a lease), so of several workers
//!   sharing the ledger one looks each round up; a claim whose lease ran out may be taken over,
//!   and a lookup recorded by anyone — the claimant or a worker it outlived — is evidence all the
//!   same (the claim decides who asks the provider, never what its answer means);
//! - a step the caller's own code carries out is claimed by the caller (`ClaimStep`), never
//!   sent by the ledger (`StartAttempt` is refused for it), and a connector's operation is never
//!   claimed by a caller; what the caller reports of its attempt is decided as a provider's
//!   answer is, so a report after the lease ran out is a late answer (a success settles the
//!   unknown step; a different object after a success is a detected duplicate);
//! - a pending operation whose send became impossible while queued (the retry contract ran out,
//!   rule 9: "re-checked right before each send"; the binding changed) goes to review.

use chrono::{DateTime, Utc};

use crate::args::ArgsHash;
use crate::command::{Command, MAX_NOTE_BYTES, MAX_PROVIDER_TEXT_BYTES, MAX_SCHEDULE_AHEAD_MS};
use crate::contract::{milliseconds, ContractViolation};
use crate::error::ValidationError;
use crate::event::{DuplicateDetected, IntentRecorded, OperationEvent};
use crate::ids::{AccountId, AttemptId, ExternalObjectId, WorkerId};
use crate::state::OperationState;

mod approval;
mod attempt;
mod intent;
mod lookup;
mod outcome;
mod reconciliation;
mod review;

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
    #[error(
        "cannot {} an operation that is {status}",
        crate::command::user_name(command)
    )]
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
    /// The command belongs to the other kind of sender: the ledger never sends a caller's step,
    /// and a caller never claims a connector's operation.
    #[error("{}", wrong_executor(*executor))]
    WrongExecutor {
        /// Who carries the operation out.
        executor: crate::event::Executor,
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
    /// Another worker's claim on the operation's lookup has not run out.
    #[error("{worker} is looking the operation up; its claim runs until {lease_deadline}")]
    LookupClaimed {
        /// The worker holding the claim.
        worker: WorkerId,
        /// When the claim runs out.
        lease_deadline: DateTime<Utc>,
    },
    /// A response names an attempt this operation never started.
    #[error("attempt {attempt_id} is not an attempt of this operation")]
    UnknownAttempt {
        /// The attempt named.
        attempt_id: AttemptId,
    },
    /// A reviewer's retry the contract cannot make safe, without the duplicate risk accepted.
    #[error("a retry could create a second object: {why}; to retry anyway, accept the duplicate risk explicitly (accept_duplicate_risk: true), or confirm or abandon the operation instead")]
    DuplicateRiskNotAccepted {
        /// Why the provider could not tell the retry from a second request.
        why: String,
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

fn wrong_executor(executor: crate::event::Executor) -> &'static str {
    match executor {
        crate::event::Executor::Caller => "the operation is a step the caller's own code carries out; the ledger never sends it: the caller claims it and reports its outcome",
        crate::event::Executor::Ledger => "the operation is carried out by its connector; only an operation recorded as a step is claimed by its caller",
    }
}

/// Decides what `command` does to an operation in `state` at `now`: the events to append, in
/// order, or why nothing may be. An empty list means the command changes nothing (it repeats
/// what is already recorded), so retried commands are harmless.
pub fn decide(
    command: &Command,
    state: &OperationState,
    now: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let events = dispatch(command, state, now)?;
    #[cfg(debug_assertions)]
    assert_allowed_next_state(command, state, &events);
    Ok(events)
}

/// One line per command: everything about a command lives in the file of its theme.
fn dispatch(
    command: &Command,
    state: &OperationState,
    now: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    if let Command::RecordIntent(intent) = command {
        return intent::record(state, intent);
    }
    let Some(intent) = &state.intent else {
        return Err(Rejection::NotRecorded);
    };
    let on = On {
        state,
        intent,
        now,
        command: command.name(),
    };
    // A table, one row per command, so the formatter is told to leave it as one.
    #[rustfmt::skip]
    let events = match command {
        Command::RecordIntent(_) => unreachable!("handled above: the one command without an intent"),
        Command::GrantApproval { approver, principal, args_hash } => approval::grant(&on, approver, principal.as_ref(), args_hash),
        Command::DenyApproval { approver, principal, args_hash, reason } => approval::deny(&on, approver, principal.as_ref(), args_hash, reason),
        Command::StartAttempt { attempt_id, worker, lease_ms, binding, capabilities, policy, budget_wait, request } =>
            attempt::start(&on, &attempt::Claim { attempt_id: *attempt_id, worker, lease_ms: *lease_ms, binding, capabilities, policy, budget_wait: budget_wait.as_ref(), request: request.as_ref() }),
        Command::ClaimStep { attempt_id, caller, lease_ms } => attempt::claim_step(&on, *attempt_id, caller, *lease_ms),
        Command::PostponeSend { reason, not_before } => attempt::postpone(&on, reason, *not_before),
        Command::RecordSuccess { attempt_id, external_id, provider_request_id } =>
            outcome::success(&on, *attempt_id, external_id, provider_request_id.as_ref()),
        Command::RecordRejection { attempt_id, code, message } => outcome::rejection(&on, *attempt_id, code, message),
        Command::RecordNotSent { attempt_id, reason, retry_not_before } =>
            outcome::not_sent(&on, *attempt_id, reason, *retry_not_before),
        Command::RecordUnknown { attempt_id, error, check_not_before } => outcome::unknown(&on, *attempt_id, error, *check_not_before),
        Command::ExpireLease { attempt_id } => outcome::expire_lease(&on, *attempt_id),
        Command::ClaimLookup { worker, lease_ms, budget_wait } => lookup::claim(&on, worker, *lease_ms, budget_wait.as_ref()),
        Command::PostponeLookup { worker, reason, not_before } => lookup::postpone(&on, worker, reason, *not_before),
        Command::RecordReconciliation { result, duplicates, evidence, binding, capabilities, policy, retry_not_before, next_check_not_before, in_progress } =>
            reconciliation::record(&on, &reconciliation::Lookup { result, duplicates, evidence, binding, capabilities, policy, retry_not_before: *retry_not_before, next_check_not_before: *next_check_not_before, in_progress: *in_progress }),
        Command::SettleWithoutLookup { binding, capabilities, policy, retry_not_before } =>
            reconciliation::without_lookup(&on, binding, capabilities, policy, *retry_not_before),
        Command::RequireReview { reason, evidence } => review::require(&on, reason, evidence),
        Command::ResolveReview { reviewer, principal, decision, note, accept_duplicate_risk, capabilities } =>
            review::resolve(&on, &review::Decision { reviewer, principal: principal.as_ref(), decision, note, accept_duplicate_risk: *accept_duplicate_risk, capabilities: capabilities.as_ref() }),
    };
    events
}

/// What every command after the intent is decided against.
struct On<'a> {
    /// The operation's current state.
    state: &'a OperationState,
    /// Its frozen intent.
    intent: &'a IntentRecorded,
    /// When the command is decided.
    now: DateTime<Utc>,
    /// The command's name, for refusals.
    command: &'static str,
}

impl On<'_> {
    /// The refusal of a command that does not apply in the current state.
    fn refuse(&self) -> Rejection {
        Rejection::NotAllowed {
            command: self.command,
            status: self.state.status.name(),
        }
    }
}

/// Design rules 5–7 stated once more on the result: whatever a command decided must fold to a
/// state that keeps every invariant and is an arrow of the state machine above. A failure is a
/// bug in one of the theme files, caught in debug builds and in the property test.
#[cfg(debug_assertions)]
fn assert_allowed_next_state(command: &Command, state: &OperationState, events: &[OperationEvent]) {
    let next = events.iter().fold(state.clone(), crate::state::evolve);
    next.assert_invariants();
    assert!(
        state.status.may_become(&next.status),
        "{} decided {} → {}, which is no arrow of the state machine",
        command.name(),
        state.status.name(),
        next.status.name()
    );
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
mod step_tests;
#[cfg(test)]
mod tests;
