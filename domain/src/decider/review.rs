//! Review: automation stops and a person decides (design rule 10); their decision is an event.
//!
//! It must never hand a settled operation to a person, nor let a reviewer's retry pass the hard
//! attempt limit.

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

/// `needs_review --ResolveReview: retry | confirm | give up--> pending | succeeded | abandoned`.
pub(super) fn resolve(
    on: &On<'_>,
    reviewer: &ActorId,
    decision: &ReviewDecision,
    note: &str,
) -> Result<Vec<OperationEvent>, Rejection> {
    if on.state.status != Status::NeedsReview {
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
