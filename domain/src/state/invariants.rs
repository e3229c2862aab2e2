//! The relations every reachable [`OperationState`] keeps, stated in one place and checked on
//! entry and exit of [`super::evolve`] (debug builds) and after every step of the decider's
//! property test.
//!
//! Each relation follows from the decider and the fold together; a state that breaks one came
//! from a history the decider never wrote (or from a bug in either), so these are assertions,
//! never errors a caller could handle.

use super::{OperationState, Status};
use crate::contract::MAX_ATTEMPTS_LIMIT;
// Only the step check (debug builds) names an event; without the gate release builds warn.
#[cfg(debug_assertions)]
use crate::event::OperationEvent;

impl OperationState {
    /// Panics unless every invariant of a state folded from a history the decider wrote holds:
    ///
    /// - only a new operation has no intent, no time and no attempts;
    /// - the attempts count equals the attempt ids, which are distinct and within
    ///   [`MAX_ATTEMPTS_LIMIT`]; the current attempt is the last of them and carries its number;
    ///   the first attempt's time is known exactly when there was one;
    /// - an operation in flight has a current attempt; one awaiting approval or denied was never
    ///   attempted, and a rejected one was, with no attempt of unknown outcome before it;
    /// - the fields of a status exist only in it: why it is pending and when it may be sent again
    ///   only while pending, the review reason exactly while in review, when it fell into unknown
    ///   while unknown and the next lookup's time and a lookup's claim only then;
    /// - duplicates exist only beside a confirmed success (which has an external id by its type),
    ///   and are distinct from it and from each other.
    #[track_caller]
    pub fn assert_invariants(&self) {
        self.assert_new_is_empty();
        self.assert_attempts_consistent();
        self.assert_status_fields();
        self.assert_duplicates();
    }

    #[track_caller]
    fn assert_new_is_empty(&self) {
        let new = self.status == Status::New;
        assert_eq!(
            new,
            self.intent.is_none(),
            "only a new operation has no intent"
        );
        assert_eq!(
            new,
            self.updated_at.is_none(),
            "only a new operation has no time"
        );
        if new {
            assert_eq!(self.attempts, 0, "a new operation was never attempted");
        }
    }

    #[track_caller]
    fn assert_attempts_consistent(&self) {
        assert!(
            self.attempts <= MAX_ATTEMPTS_LIMIT,
            "{} attempts exceed the hard limit {MAX_ATTEMPTS_LIMIT}",
            self.attempts
        );
        assert_eq!(
            usize::try_from(self.attempts).ok(),
            Some(self.attempt_ids.len()),
            "the attempts count equals the attempt ids"
        );
        for (index, id) in self.attempt_ids.iter().enumerate() {
            assert!(
                !self.attempt_ids[..index].contains(id),
                "attempt id {id} is used twice"
            );
        }
        let attempted = self.attempts > 0;
        assert_eq!(
            attempted,
            self.first_attempt_at.is_some(),
            "the first attempt's time"
        );
        assert_eq!(
            attempted,
            self.current_attempt.is_some(),
            "the current attempt"
        );
        if let Some(current) = &self.current_attempt {
            assert_eq!(
                current.number, self.attempts,
                "the current attempt is the latest"
            );
            assert_eq!(
                self.attempt_ids.last(),
                Some(&current.attempt_id),
                "the current attempt's id is the last one"
            );
        }
        assert!(
            self.uncertain_attempts <= self.attempts,
            "{} attempts of unknown outcome out of {}",
            self.uncertain_attempts,
            self.attempts
        );
    }

    #[track_caller]
    fn assert_status_fields(&self) {
        let status = &self.status;
        let name = status.name();
        match status {
            Status::InFlight => assert!(
                self.current_attempt.is_some(),
                "in flight without an attempt"
            ),
            Status::AwaitingApproval | Status::Denied => {
                assert_eq!(self.attempts, 0, "a {name} operation was never sent");
            }
            // A refusal settles an operation only when no earlier attempt may have applied it.
            Status::Rejected => assert!(
                self.attempts > 0 && self.uncertain_attempts == 0,
                "rejected after {} attempts, {} of them of unknown outcome",
                self.attempts,
                self.uncertain_attempts
            ),
            _ => {}
        }
        let pending = *status == Status::Pending;
        assert_eq!(
            pending,
            self.pending_since.is_some(),
            "why it is pending, while {name}"
        );
        assert!(
            pending || self.retry_not_before.is_none(),
            "a retry time while {name}"
        );
        let in_review = *status == Status::NeedsReview;
        assert_eq!(
            in_review,
            self.review_reason.is_some(),
            "a review reason while {name}"
        );
        let unknown = *status == Status::Unknown;
        assert!(
            !unknown || self.unknown_since.is_some(),
            "unknown since when?"
        );
        // A succeeded operation may wait for one more look (after a lagging search's lag).
        let succeeded = matches!(status, Status::Succeeded { .. });
        assert!(
            unknown || succeeded || self.next_check_not_before.is_none(),
            "a lookup time while {name}"
        );
        assert!(
            unknown || self.lookup_claim.is_none(),
            "a lookup claimed while {name}"
        );
    }

    #[track_caller]
    fn assert_duplicates(&self) {
        if self.duplicates.is_empty() {
            return;
        }
        let confirmed = self
            .external_id()
            .expect("duplicates are detected only beside a confirmed success");
        assert!(
            !self.duplicates.contains(confirmed),
            "the confirmed object {confirmed} is not its own duplicate"
        );
        for (index, id) in self.duplicates.iter().enumerate() {
            assert!(
                !self.duplicates[..index].contains(id),
                "duplicate {id} listed twice"
            );
        }
    }
}

/// What one step of the fold must not lose: taken before the step, checked after it.
#[cfg(debug_assertions)]
pub(super) struct Before {
    status: Status,
    attempts: usize,
}

#[cfg(debug_assertions)]
impl Before {
    pub(super) fn of(state: &OperationState) -> Self {
        Self {
            status: state.status.clone(),
            attempts: state.attempt_ids.len(),
        }
    }

    /// Panics if `event` took `after` somewhere no step may go: a confirmed success keeps its
    /// first external id (design rule 7); attempts are only added; a terminal state is left
    /// only by the documented late confirmation — the provider's own answer to one of our
    /// attempts settling a rejected or abandoned operation as succeeded.
    #[track_caller]
    pub(super) fn assert_step(&self, after: &OperationState, event: &OperationEvent) {
        if let Status::Succeeded { external_id } = &self.status {
            assert_eq!(
                after.external_id(),
                Some(external_id),
                "a success keeps its first external id"
            );
        }
        assert!(
            after.attempt_ids.len() >= self.attempts,
            "attempts are never forgotten"
        );
        if self.status.is_terminal() && after.status != self.status {
            let late_confirmation = matches!(self.status, Status::Rejected | Status::Abandoned)
                && after.external_id().is_some()
                && matches!(event, OperationEvent::LateResponseReceived(_));
            assert!(
                late_confirmation,
                "{} left a terminal {} for {}",
                event.type_name(),
                self.status.name(),
                after.status.name()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::decider::decide;
    use crate::event::OperationEvent;
    use crate::state::{fold, Status};
    use crate::testing::{attempt, intent, keyed, start, success, t0};

    fn in_flight() -> crate::state::OperationState {
        let recorded = fold(&[OperationEvent::IntentRecorded(intent(false))]);
        let events = decide(&start(1, keyed()), &recorded, t0()).expect("claimed");
        events.iter().fold(recorded, crate::state::evolve)
    }

    #[test]
    fn a_state_folded_from_decided_events_keeps_every_invariant() {
        let state = in_flight();
        state.assert_invariants();
        let events = decide(&success(1, "731"), &state, t0()).expect("confirmed");
        events
            .iter()
            .fold(state, crate::state::evolve)
            .assert_invariants();
    }

    #[test]
    #[should_panic(expected = "the attempts count equals the attempt ids")]
    fn attempts_that_disagree_with_the_attempt_ids_are_caught() {
        let mut state = in_flight();
        state.attempt_ids.push(attempt(2));
        state.assert_invariants();
    }

    #[test]
    #[should_panic(expected = "why it is pending")]
    fn a_pending_reason_outside_pending_is_caught() {
        let mut state = in_flight();
        state.pending_since = Some(crate::state::PendingSince::Recorded);
        state.assert_invariants();
    }

    #[test]
    fn a_terminal_status_may_become_only_the_late_confirmation() {
        let succeeded = Status::Succeeded {
            external_id: crate::testing::external("731"),
        };
        let other = Status::Succeeded {
            external_id: crate::testing::external("732"),
        };
        assert!(Status::Rejected.may_become(&succeeded));
        assert!(Status::Abandoned.may_become(&succeeded));
        assert!(!Status::Denied.may_become(&succeeded));
        assert!(!succeeded.may_become(&Status::Unknown));
        assert!(
            !succeeded.may_become(&other),
            "a success keeps its first id"
        );
        assert!(succeeded.may_become(&succeeded));
        assert!(!Status::Rejected.may_become(&Status::Pending));
    }
}
