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
use crate::event::{OperationEvent, ReviewDecision, ReviewRequired, ReviewResolved};
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
    reviewer: &ActorId,
    decision: &ReviewDecision,
    note: &str,
) -> Result<Vec<OperationEvent>, Rejection> {
    if !matches!(on.state.status, Status::NeedsReview | Status::Unknown) {
        return Err(on.refuse());
    }
    check_note("note", note)?;
    if *decision == ReviewDecision::Retry {
        check_attempt_limit(on.state.attempts)?;
    }
    Ok(vec![OperationEvent::ReviewResolved(ReviewResolved {
        reviewer: reviewer.clone(),
        decision: decision.clone(),
        note: note.to_owned(),
        at: on.now,
    })])
}
