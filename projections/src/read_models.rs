//! All read models at once: one event in, every read model's change out.
//!
//! This is the one entry point a runner calls per event. It checks that the event continues its
//! operation's stream, folds the operation's state with the domain's own [`evolve`], and asks each
//! read model for its change given the state before and after. The runner writes the changes and
//! the new state together; keeping the state beside the read models (not in memory) is what lets
//! the runner resume anywhere and hold no more than one batch in memory. Nothing here does I/O.

use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::state::{evolve, OperationState};

use crate::context::{check_continuity, FoldContext, FoldError};
use crate::duplicates::{self, DuplicateChange, SimilarIntent};
use crate::id_index::{self, IdIndexChange};
use crate::metrics::{self, Counter};
use crate::operations::{self, OperationRow};
use crate::review_queue::{self, ReviewChange};

/// Every read model's change for one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changes {
    /// The operation's new row.
    pub operation: OperationRow,
    /// The review queue's change.
    pub review: Option<ReviewChange>,
    /// New duplicate records.
    pub duplicates: Vec<DuplicateChange>,
    /// New index entries.
    pub id_index: Vec<IdIndexChange>,
    /// Counters to raise by one.
    pub metrics: Vec<Counter>,
}

/// An event folded: the operation's new state (to store for its next event) and the changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Folded {
    /// The operation's state after the event.
    pub state: OperationState,
    /// What every read model does with the event.
    pub changes: Changes,
}

/// Every read model's change for one event but the operation's row: what a fold that keeps the
/// operation's state (see [`fold_in_place`]) writes per event. The row it builds from the state
/// when it writes it ([`operations::row`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventChanges {
    /// The review queue's change.
    pub review: Option<ReviewChange>,
    /// New duplicate records.
    pub duplicates: Vec<DuplicateChange>,
    /// New index entries.
    pub id_index: Vec<IdIndexChange>,
    /// Counters to raise by one.
    pub metrics: Vec<Counter>,
}

/// Every read model's change for one event, given its context.
pub fn project(ctx: &FoldContext<'_>, event: &OperationEvent) -> Result<Changes, FoldError> {
    let operation = operations::change(ctx, event).ok_or(FoldError::NoIntent {
        operation_id: ctx.operation_id,
        version: ctx.version,
    })?;
    let EventChanges {
        review,
        duplicates,
        id_index,
        metrics,
    } = project_event(ctx, event);
    Ok(Changes {
        operation,
        review,
        duplicates,
        id_index,
        metrics,
    })
}

/// Every read model's change for one event but the operation's row.
pub fn project_event(ctx: &FoldContext<'_>, event: &OperationEvent) -> EventChanges {
    EventChanges {
        review: review_queue::changes(ctx, event),
        duplicates: duplicates::changes(ctx, event),
        id_index: id_index::changes(ctx, event),
        metrics: metrics::changes(ctx, event),
    }
}

/// Folds the event at `version` of `operation_id`'s stream, at `position` in the log, onto the
/// operation's previous state and version (`None`: nothing folded for it yet).
///
/// `similar_intents` are the earlier intents found with
/// [`duplicates::similar_intent_query`] when the event is an intent; empty otherwise.
pub fn fold_event(
    operation_id: OperationId,
    previous: Option<(OperationState, StreamVersion)>,
    version: StreamVersion,
    position: GlobalPosition,
    similar_intents: &[SimilarIntent],
    event: &OperationEvent,
) -> Result<Folded, FoldError> {
    let (mut state, last) = match previous {
        Some((state, last)) => (state, Some(last)),
        None => (OperationState::initial(), None),
    };
    let EventChanges {
        review,
        duplicates,
        id_index,
        metrics,
    } = fold_in_place(
        operation_id,
        &mut state,
        last,
        version,
        position,
        similar_intents,
        event,
    )?;
    let operation = operations::row(operation_id, &state, version, position, event.at()).ok_or(
        FoldError::NoIntent {
            operation_id,
            version,
        },
    )?;
    Ok(Folded {
        state,
        changes: Changes {
            operation,
            review,
            duplicates,
            id_index,
            metrics,
        },
    })
}

/// [`fold_event`] on a state held by the caller: `state` (folded up to the event at `last`) is
/// advanced over the event, and the changes of every read model but the operation's row are
/// returned. On an error `state` is left as it was. Nothing is copied but the status before the
/// event, so a fold that keeps many operations' states pays per event only for what changes.
pub fn fold_in_place(
    operation_id: OperationId,
    state: &mut OperationState,
    last: Option<StreamVersion>,
    version: StreamVersion,
    position: GlobalPosition,
    similar_intents: &[SimilarIntent],
    event: &OperationEvent,
) -> Result<EventChanges, FoldError> {
    check_continuity(operation_id, last, version)?;
    // A stream starts with its intent; without it the rows would be invented, not folded.
    if state.intent.is_none() && !matches!(event, OperationEvent::IntentRecorded(_)) {
        return Err(FoldError::NoIntent {
            operation_id,
            version,
        });
    }
    let status_before = state.status.clone();
    *state = evolve(std::mem::take(state), event);
    // Every state after an event has its intent: the first event is the intent (checked above)
    // and `evolve` never drops it.
    debug_assert!(
        state.intent.is_some(),
        "a folded operation keeps its intent"
    );
    let ctx = FoldContext {
        operation_id,
        version,
        position,
        status_before: &status_before,
        after: state,
        similar_intents,
    };
    Ok(project_event(&ctx, event))
}

#[cfg(test)]
pub(crate) mod test_support;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_models::test_support::{events, intent, operation};
    use opledger_domain::state::fold;

    #[test]
    fn folding_event_by_event_keeps_the_state_the_domain_folds() {
        let history = events::late_duplicate(operation(1), "731", "732");
        let mut previous = None;
        for (index, event) in history.iter().enumerate() {
            let version = StreamVersion::new(index as u64);
            let folded = fold_event(
                operation(1),
                previous,
                version,
                GlobalPosition::new(index as u64 + 1),
                &[],
                event,
            )
            .expect("folds");
            previous = Some((folded.state, version));
        }
        assert_eq!(previous.map(|(state, _)| state), Some(fold(&history)));
    }

    #[test]
    fn an_event_applied_twice_or_skipped_is_refused() {
        let history = events::unknown_then_found(operation(1), "731");
        let first = fold_event(
            operation(1),
            None,
            StreamVersion::FIRST,
            GlobalPosition::new(1),
            &[],
            &history[0],
        )
        .expect("folds");
        let previous = Some((first.state.clone(), StreamVersion::FIRST));
        let again = fold_event(
            operation(1),
            previous.clone(),
            StreamVersion::FIRST,
            GlobalPosition::new(1),
            &[],
            &history[0],
        );
        assert!(matches!(again, Err(FoldError::OutOfOrder { .. })));
        let skipped = fold_event(
            operation(1),
            previous,
            StreamVersion::new(2),
            GlobalPosition::new(3),
            &[],
            &history[2],
        );
        assert!(matches!(skipped, Err(FoldError::OutOfOrder { .. })));
    }

    #[test]
    fn a_stream_that_does_not_start_with_its_intent_is_refused() {
        let history = events::unknown_then_found(operation(1), "731");
        let refused = fold_event(
            operation(1),
            None,
            StreamVersion::FIRST,
            GlobalPosition::new(1),
            &[],
            &history[1],
        );
        assert!(matches!(refused, Err(FoldError::NoIntent { .. })));
        assert!(fold_event(
            operation(2),
            None,
            StreamVersion::FIRST,
            GlobalPosition::new(1),
            &[],
            &intent(operation(2), None, 0),
        )
        .is_ok());
    }
}
