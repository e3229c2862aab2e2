//! The review queue: every operation whose outcome nobody knows yet (`unknown`) or that waits for
//! a person (`needs_review`), with the evidence gathered so far.
//!
//! This is what an operator works through, oldest first (design rule 10: the operator gets the
//! operation, its account, its times and every response known). An operation enters when it
//! becomes unresolved, stays while it moves between `unknown` and `needs_review` (the clock keeps
//! running), and leaves the moment it is resolved either way. It must never hold an operation that
//! is not unresolved now, and never lose one that is.

use chrono::{DateTime, Utc};
use opledger_domain::event::{OperationEvent, ReconciliationResult};
use opledger_domain::ids::{AccountId, OperationId, ProviderId, TenantId};
use opledger_domain::state::{OperationState, Status};

use crate::context::FoldContext;

/// What a lookup at the provider last found, for the reviewer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupEvidence {
    /// What was found, in a phrase: `found 731 in acct-1`, `not found (search may lag)`, ….
    pub result: String,
    /// The evidence as the provider gave it.
    pub evidence: String,
    /// When the lookup was recorded.
    pub at: DateTime<Utc>,
}

/// Why automation handed the operation to a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewEvidence {
    /// Why automation cannot go on.
    pub reason: String,
    /// What was known when it stopped.
    pub evidence: String,
}

/// An operation entering the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewEntry {
    /// The operation.
    pub operation_id: OperationId,
    /// `unknown` or `needs_review`.
    pub state: &'static str,
    /// When it became unresolved: the queue's order.
    pub since: DateTime<Utc>,
    /// Whose it is.
    pub tenant: TenantId,
    /// Where it was sent.
    pub provider: ProviderId,
    /// The account it is bound to.
    pub account: AccountId,
    /// The facts that change while it waits.
    pub progress: ReviewProgress,
}

/// What changes about an operation while it waits in the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewProgress {
    /// `unknown` or `needs_review`.
    pub state: &'static str,
    /// Attempts started so far.
    pub attempts: u32,
    /// Lookups made since it last became unknown.
    pub lookups: u32,
    /// The latest error or refusal.
    pub last_error: Option<String>,
    /// When the latest event happened.
    pub updated_at: DateTime<Utc>,
    /// Set when this event is a lookup; a lookup replaces the previous one.
    pub lookup: Option<LookupEvidence>,
    /// Set when this event hands the operation to a person.
    pub review: Option<ReviewEvidence>,
}

/// How one event changes the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReviewChange {
    /// The operation became unresolved.
    Enter(ReviewEntry),
    /// The operation is still unresolved; its entry keeps its `since` and earlier evidence not
    /// replaced by this event.
    Update {
        /// The operation.
        operation_id: OperationId,
        /// What changed.
        progress: ReviewProgress,
    },
    /// The operation was resolved (or moved on to a retry) and leaves the queue.
    Leave {
        /// The operation.
        operation_id: OperationId,
    },
}

/// Whether an operation in `state` belongs in the queue.
pub fn is_unresolved(state: &OperationState) -> bool {
    is_unresolved_status(&state.status)
}

/// Whether an operation whose status is `status` belongs in the queue.
pub fn is_unresolved_status(status: &Status) -> bool {
    matches!(status, Status::Unknown | Status::NeedsReview)
}

/// The queue's change for one event, if any.
pub fn changes(ctx: &FoldContext<'_>, event: &OperationEvent) -> Option<ReviewChange> {
    let operation_id = ctx.operation_id;
    match (
        is_unresolved_status(ctx.status_before),
        is_unresolved(ctx.after),
    ) {
        (false, false) => None,
        (true, false) => Some(ReviewChange::Leave { operation_id }),
        (was, true) => {
            let progress = progress(ctx.after, event);
            if was {
                return Some(ReviewChange::Update {
                    operation_id,
                    progress,
                });
            }
            let intent = ctx.after.intent.as_ref()?;
            Some(ReviewChange::Enter(ReviewEntry {
                operation_id,
                state: progress.state,
                since: event.at(),
                tenant: intent.tenant.clone(),
                provider: intent.provider.clone(),
                account: intent.account.clone(),
                progress,
            }))
        }
    }
}

fn progress(after: &OperationState, event: &OperationEvent) -> ReviewProgress {
    ReviewProgress {
        state: after.status.name(),
        attempts: after.attempts,
        lookups: after.reconciliations,
        last_error: after.last_error.clone(),
        updated_at: event.at(),
        lookup: match event {
            OperationEvent::ReconciliationRecorded(reconciled) => Some(LookupEvidence {
                result: describe(&reconciled.result),
                evidence: reconciled.evidence.clone(),
                at: reconciled.at,
            }),
            _ => None,
        },
        review: match event {
            OperationEvent::ReviewRequired(review) => Some(ReviewEvidence {
                reason: review.reason.clone(),
                evidence: review.evidence.clone(),
            }),
            _ => None,
        },
    }
}

/// A lookup result in a phrase a reviewer can read at a glance.
pub fn describe(result: &ReconciliationResult) -> String {
    match result {
        ReconciliationResult::Found {
            external_id,
            account,
        } => format!("found {external_id} in {account}"),
        ReconciliationResult::NotFound {
            authoritative: true,
        } => "not found (consistent lookup)".to_owned(),
        ReconciliationResult::NotFound {
            authoritative: false,
        } => "not found (search may lag)".to_owned(),
        ReconciliationResult::Inconclusive { reason } => format!("inconclusive: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_models::test_support::{at, events, fold_all, operation};

    #[test]
    fn an_operation_enters_when_unknown_carries_evidence_into_review_and_keeps_its_since() {
        let steps = fold_all(&events::unknown_then_review(operation(1)));
        let queue: Vec<_> = steps.iter().map(|step| step.review.clone()).collect();
        // intent, attempt: not in the queue.
        assert_eq!(queue[0], None);
        assert_eq!(queue[1], None);
        let Some(ReviewChange::Enter(entry)) = &queue[2] else {
            panic!("the timeout enters the queue: {:?}", queue[2]);
        };
        assert_eq!(entry.state, "unknown");
        assert_eq!(entry.since, at(5));
        assert_eq!(entry.progress.last_error.as_deref(), Some("timeout"));
        let Some(ReviewChange::Update { progress, .. }) = &queue[3] else {
            panic!("the lookup updates the entry: {:?}", queue[3]);
        };
        let lookup = progress.lookup.as_ref().expect("the lookup is evidence");
        assert_eq!(lookup.result, "not found (consistent lookup)");
        assert_eq!(lookup.evidence, "GET /tasks?label=… → []");
        let Some(ReviewChange::Update { progress, .. }) = &queue[4] else {
            panic!("the hand-over updates the entry: {:?}", queue[4]);
        };
        assert_eq!(progress.state, "needs_review");
        assert_eq!(
            progress.review.as_ref().map(|r| r.reason.as_str()),
            Some("no safe retry")
        );
        assert_eq!(
            progress.lookup, None,
            "a hand-over keeps the earlier lookup"
        );
    }

    #[test]
    fn a_found_object_takes_the_operation_out_of_the_queue() {
        let steps = fold_all(&events::unknown_then_found(operation(1), "731"));
        let last = steps.last().expect("steps").review.clone();
        assert_eq!(
            last,
            Some(ReviewChange::Leave {
                operation_id: operation(1)
            })
        );
    }

    #[test]
    fn lookups_are_described_for_people() {
        assert_eq!(
            describe(&ReconciliationResult::Inconclusive {
                reason: "503".into()
            }),
            "inconclusive: 503"
        );
    }
}
