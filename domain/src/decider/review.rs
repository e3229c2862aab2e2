//! Review: automation stops and a person decides (design rule 10); their decision is an event.
//!
//! A person may decide an operation that needs review, and one that is still unknown: when the
//! provider is down for long, an operator confirms an id found by hand, gives up, or retries
//! accepting the duplicate risk, without waiting for the lookup budget to run out first. The same
//! rules hold for both.
//!
//! It must never hand a settled operation to a person, let a person decide one that was never
//! attempted or is in flight (its outcome is on its way), nor let a reviewer's retry pass the
//! hard attempt limit.

use super::attempt::check_attempt_limit;
use super::{check_note, clip, On, Rejection};
use crate::contract::{check_retry_contract, ProviderCapabilities, SendBinding};
use crate::event::{OperationEvent, Principal, ReviewDecision, ReviewRequired, ReviewResolved};
use crate::ids::ActorId;
use crate::state::Status;

/// `unknown, pending --RequireReview--> needs_review`.
pub(super) fn require(
    on: &On<'_>,
    reason: &str,
    evidence: &str,
) -> Result<Vec<OperationEvent>, Rejection> {
    // From pending too: a send can become impossible while queued (the retry contract ran out,
    // the account's binding changed), and only a person can decide what then.
    if !matches!(on.state.status, Status::Unknown | Status::Pending) {
        return Err(on.refuse());
    }
    check_note("reason", reason)?;
    Ok(vec![OperationEvent::ReviewRequired(ReviewRequired {
        reason: reason.to_owned(),
        evidence: clip(evidence),
        at: on.now,
    })])
}

/// `needs_review, unknown --ResolveReview: retry | confirm | give up--> pending | succeeded |
/// abandoned`.
pub(super) fn resolve(
    on: &On<'_>,
    decided: &Decision<'_>,
) -> Result<Vec<OperationEvent>, Rejection> {
    if !matches!(on.state.status, Status::NeedsReview | Status::Unknown) {
        return Err(on.refuse());
    }
    check_note("note", decided.note)?;
    let retry = *decided.decision == ReviewDecision::Retry;
    if retry {
        check_attempt_limit(on.state.attempts)?;
        if !decided.accept_duplicate_risk {
            if let Some(why) = duplicate_risk(on, decided.capabilities) {
                return Err(Rejection::DuplicateRiskNotAccepted { why });
            }
        }
    }
    Ok(vec![OperationEvent::ReviewResolved(ReviewResolved {
        reviewer: decided.reviewer.clone(),
        principal: decided.principal.cloned(),
        decision: decided.decision.clone(),
        note: decided.note.to_owned(),
        // Only a retry can create anything; the flag on another decision would claim a risk
        // that was never taken.
        accept_duplicate_risk: retry && decided.accept_duplicate_risk,
        at: on.now,
    })])
}

/// The fields of [`crate::command::Command::ResolveReview`], borrowed.
pub(super) struct Decision<'a> {
    pub(super) reviewer: &'a ActorId,
    pub(super) principal: Option<&'a Principal>,
    pub(super) decision: &'a ReviewDecision,
    pub(super) note: &'a str,
    pub(super) accept_duplicate_risk: bool,
    pub(super) capabilities: Option<&'a ProviderCapabilities>,
}

/// Why a retry now could make a second object, if it could: the contract cannot tell it from
/// a new request (no deduplication, a key past its retention's safe part, or a contract this
/// caller does not know). The binding is checked at the send itself, as for every attempt.
fn duplicate_risk(on: &On<'_>, capabilities: Option<&ProviderCapabilities>) -> Option<String> {
    if on.state.uncertain_attempts == 0 {
        // Every attempt so far provably applied nothing: the retry is the first real send.
        return None;
    }
    let Some(capabilities) = capabilities else {
        return Some(
            "the action's deduplication contract is not known here (its provider is not configured for this command)"
                .to_owned(),
        );
    };
    let Some(intent) = on.state.intent.as_ref() else {
        return Some("the operation has no recorded intent".to_owned());
    };
    // The binding the retry will be sent under is checked at its send; here only the contract
    // counts, so the intent's own binding stands in for it.
    let binding = SendBinding {
        account: intent.account.clone(),
        credential_fingerprint: intent.credential_fingerprint.clone(),
        args_hash: intent.args_hash.clone(),
    };
    check_retry_contract(capabilities, on.state, &binding, on.now)
        .err()
        .map(|violation| violation.to_string())
}
