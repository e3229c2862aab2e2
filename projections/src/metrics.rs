//! The metrics read model: counters of facts an operator watches.
//!
//! Only what cannot be read off the other read models is counted here: how often a lookup
//! confirmed an operation nobody knew the outcome of, how many duplicates were detected, how many
//! attempts and unclear outcomes there were. Counts by state, attempts per operation and the
//! oldest unknown operation are derived by query from the operations and review-queue models, so
//! they cannot drift from them. Counters only ever grow, by one per fact; a counter that is off
//! means an event was applied twice or skipped, which is why they are worth comparing with a
//! fold of the whole log.

use opledger_domain::event::{OperationEvent, ReconciliationResult};
use opledger_domain::state::Status;

use crate::context::FoldContext;

/// A counter of the metrics read model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Counter {
    /// Events folded.
    Events,
    /// Intents recorded.
    IntentsRecorded,
    /// Attempts started.
    AttemptsStarted,
    /// Attempts that ended without a known outcome (timeouts, expired leases).
    UnknownOutcomes,
    /// Lookups that found the object of an operation not yet confirmed, and so confirmed it.
    ReconciliationsConfirmed,
    /// Hand-overs to a person.
    ReviewsRequired,
    /// Second objects found for confirmed operations.
    DuplicatesDetected,
}

impl Counter {
    /// Every counter.
    pub const ALL: [Counter; 7] = [
        Counter::Events,
        Counter::IntentsRecorded,
        Counter::AttemptsStarted,
        Counter::UnknownOutcomes,
        Counter::ReconciliationsConfirmed,
        Counter::ReviewsRequired,
        Counter::DuplicatesDetected,
    ];

    /// The counter's name as stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            Self::Events => "events",
            Self::IntentsRecorded => "intents_recorded",
            Self::AttemptsStarted => "attempts_started",
            Self::UnknownOutcomes => "unknown_outcomes",
            Self::ReconciliationsConfirmed => "reconciliations_confirmed",
            Self::ReviewsRequired => "reviews_required",
            Self::DuplicatesDetected => "duplicates_detected",
        }
    }
}

/// The counters one event raises, each by one.
pub fn changes(ctx: &FoldContext<'_>, event: &OperationEvent) -> Vec<Counter> {
    let fact = match event {
        OperationEvent::IntentRecorded(_) => Some(Counter::IntentsRecorded),
        OperationEvent::AttemptStarted(_) => Some(Counter::AttemptsStarted),
        OperationEvent::OutcomeUnknown(_) | OperationEvent::LeaseExpired(_) => {
            Some(Counter::UnknownOutcomes)
        }
        // A find for an operation already confirmed is either the same object again or a
        // duplicate; only the find that settles the operation confirms a success.
        OperationEvent::ReconciliationRecorded(reconciled) => {
            let settled = !matches!(ctx.status_before, Status::Succeeded { .. })
                && ctx.after.external_id().is_some();
            (matches!(reconciled.result, ReconciliationResult::Found { .. }) && settled)
                .then_some(Counter::ReconciliationsConfirmed)
        }
        OperationEvent::ReviewRequired(_) => Some(Counter::ReviewsRequired),
        OperationEvent::DuplicateDetected(_) => Some(Counter::DuplicatesDetected),
        OperationEvent::ApprovalGranted(_)
        | OperationEvent::ApprovalDenied(_)
        | OperationEvent::AttemptSucceeded(_)
        | OperationEvent::AttemptRejected(_)
        | OperationEvent::AttemptNotSent(_)
        | OperationEvent::SendPostponed(_)
        | OperationEvent::LookupPostponed(_)
        | OperationEvent::LookupClaimed(_)
        | OperationEvent::RetryScheduled(_)
        | OperationEvent::ReviewResolved(_)
        | OperationEvent::LateResponseReceived(_) => None,
    };
    std::iter::once(Counter::Events).chain(fact).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_models::test_support::{events, fold_all, operation};

    fn counted(events: &[OperationEvent]) -> Vec<Counter> {
        let mut all: Vec<_> = fold_all(events)
            .into_iter()
            .flat_map(|step| step.metrics)
            .filter(|counter| *counter != Counter::Events)
            .collect();
        all.sort();
        all
    }

    #[test]
    fn a_lookup_that_settles_an_unknown_operation_counts_as_a_confirmation() {
        assert_eq!(
            counted(&events::unknown_then_found(operation(1), "731")),
            vec![
                Counter::IntentsRecorded,
                Counter::AttemptsStarted,
                Counter::UnknownOutcomes,
                Counter::ReconciliationsConfirmed,
            ]
        );
    }

    #[test]
    fn a_lookup_finding_a_second_object_is_a_duplicate_not_a_confirmation() {
        let counters = counted(&events::found_duplicate_by_lookup(
            operation(1),
            "731",
            "732",
        ));
        assert!(counters.contains(&Counter::DuplicatesDetected));
        assert!(!counters.contains(&Counter::ReconciliationsConfirmed));
    }

    #[test]
    fn every_event_counts_once_as_an_event() {
        let history = events::late_duplicate(operation(1), "731", "732");
        let events_counted = fold_all(&history)
            .into_iter()
            .flat_map(|step| step.metrics)
            .filter(|counter| *counter == Counter::Events)
            .count();
        assert_eq!(events_counted, history.len());
        assert_eq!(Counter::ALL.len(), 7);
    }
}
