//! The append rules every store applies, written once so the stores cannot disagree.
//!
//! These functions decide; they never touch storage. A store reads the stream's last version,
//! asks [`plan_append`] what to do, and reports refusals through the constructors here so every
//! store words them the same way.

use std::collections::HashSet;

use opledger_domain::ids::{EventId, StreamVersion};
use opledger_domain::store::{
    check_append_limits, EventData, ExpectedVersion, StoreError, StreamName,
};

/// Checks an append before it reaches storage: the port's limits, and that no event id appears
/// twice in it (two events with one id would make a retried append impossible to recognise).
pub fn check_append(stream: &StreamName, events: &[EventData]) -> Result<(), StoreError> {
    check_append_limits(stream, events)?;
    let mut seen = HashSet::with_capacity(events.len());
    for event in events {
        if !seen.insert(event.event_id) {
            return Err(StoreError::InvalidAppend {
                reason: format!(
                    "append to `{stream}` carries event id {} more than once; every event needs its own id",
                    event.event_id
                ),
            });
        }
    }
    Ok(())
}

/// What a store does with an append, given the stream's last version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendPlan {
    /// The stream is where the append expects it: write the events from this version on.
    Write {
        /// The version the first event gets.
        first: StreamVersion,
    },
    /// The stream is past the expected version: the append may be a retry of one that already
    /// happened. If the events stored from `first` on carry exactly the appended ids, in order,
    /// answer with their outcome; otherwise it is a conflict.
    CheckStored {
        /// The version the first event got, if the append happened.
        first: StreamVersion,
    },
    /// The stream is somewhere else (missing, or behind the expected version).
    Conflict,
}

/// Decides what to do with an append that expects `expected` of a stream whose last version is
/// `last` (`None`: the stream does not exist).
pub fn plan_append(expected: ExpectedVersion, last: Option<StreamVersion>) -> AppendPlan {
    match (expected, last) {
        (ExpectedVersion::NoStream, None) => AppendPlan::Write {
            first: StreamVersion::FIRST,
        },
        (ExpectedVersion::NoStream, Some(_)) => AppendPlan::CheckStored {
            first: StreamVersion::FIRST,
        },
        // Compare before calling `next()`: an expected version of u64::MAX must be a plain
        // conflict, not an overflow.
        (ExpectedVersion::Exact(wanted), Some(actual)) if wanted == actual => AppendPlan::Write {
            first: wanted.next(),
        },
        (ExpectedVersion::Exact(wanted), Some(actual)) if wanted < actual => {
            AppendPlan::CheckStored {
                first: wanted.next(),
            }
        }
        (ExpectedVersion::Exact(_), _) => AppendPlan::Conflict,
    }
}

/// Whether the stored event ids (read from the plan's `first` version on, at most as many as
/// appended) are exactly the appended ones, in order.
pub fn is_same_append(stored: &[EventId], events: &[EventData]) -> bool {
    stored.len() == events.len()
        && stored
            .iter()
            .zip(events)
            .all(|(stored, event)| *stored == event.event_id)
}

/// The refusal of an append whose stream is not at the expected version.
pub fn version_conflict(
    stream: &StreamName,
    expected: ExpectedVersion,
    actual: Option<StreamVersion>,
) -> StoreError {
    // Conflicts are the normal outcome of two workers racing for one operation; debug level
    // keeps them visible when chasing a race without flooding production logs.
    tracing::debug!(%stream, ?expected, ?actual, "append refused: version conflict");
    StoreError::VersionConflict {
        stream: stream.clone(),
        expected,
        actual,
    }
}

/// The refusal of an append that reuses an event id stored elsewhere.
pub fn event_id_reused(
    stream: &StreamName,
    event_id: EventId,
    stored_stream: &StreamName,
    stored_version: StreamVersion,
) -> StoreError {
    tracing::debug!(%stream, %event_id, %stored_stream, %stored_version, "append refused: event id reused");
    StoreError::InvalidAppend {
        reason: format!(
            "event id {event_id} appended to `{stream}` is already stored as version {stored_version} of \
             `{stored_stream}`; an event id names one event forever"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn event(id: u128) -> EventData {
        EventData {
            event_id: EventId::from_uuid(Uuid::from_u128(id)),
            event_type: "Tested".into(),
            data: b"{}".to_vec(),
            metadata: Vec::new(),
        }
    }

    #[test]
    fn an_append_matching_the_stream_is_written_after_its_last_version() {
        let v3 = StreamVersion::new(3);
        assert_eq!(
            plan_append(ExpectedVersion::NoStream, None),
            AppendPlan::Write {
                first: StreamVersion::FIRST
            }
        );
        assert_eq!(
            plan_append(ExpectedVersion::Exact(v3), Some(v3)),
            AppendPlan::Write { first: v3.next() }
        );
    }

    #[test]
    fn an_append_behind_the_stream_is_checked_against_what_is_stored() {
        let v3 = StreamVersion::new(3);
        assert_eq!(
            plan_append(ExpectedVersion::NoStream, Some(v3)),
            AppendPlan::CheckStored {
                first: StreamVersion::FIRST
            }
        );
        assert_eq!(
            plan_append(ExpectedVersion::Exact(StreamVersion::new(1)), Some(v3)),
            AppendPlan::CheckStored {
                first: StreamVersion::new(2)
            }
        );
    }

    #[test]
    fn an_append_ahead_of_the_stream_or_to_a_missing_one_conflicts_even_at_the_largest_version() {
        let v3 = StreamVersion::new(3);
        assert_eq!(
            plan_append(ExpectedVersion::Exact(v3), None),
            AppendPlan::Conflict
        );
        assert_eq!(
            plan_append(ExpectedVersion::Exact(v3.next()), Some(v3)),
            AppendPlan::Conflict
        );
        let largest = StreamVersion::new(u64::MAX);
        assert_eq!(
            plan_append(ExpectedVersion::Exact(largest), Some(v3)),
            AppendPlan::Conflict
        );
    }

    #[test]
    fn only_the_same_ids_in_the_same_order_count_as_the_same_append() {
        let ids = |ids: &[u128]| {
            ids.iter()
                .map(|id| EventId::from_uuid(Uuid::from_u128(*id)))
                .collect::<Vec<_>>()
        };
        let events = vec![event(1), event(2)];
        assert!(is_same_append(&ids(&[1, 2]), &events));
        assert!(!is_same_append(&ids(&[2, 1]), &events));
        assert!(!is_same_append(&ids(&[1]), &events));
        assert!(!is_same_append(&ids(&[1, 3]), &events));
    }

    #[test]
    fn an_append_carrying_one_event_id_twice_is_refused() {
        let stream = StreamName::new("s").expect("valid stream name");
        assert!(check_append(&stream, &[event(1), event(2)]).is_ok());
        let refused = check_append(&stream, &[event(1), event(1)]);
        assert!(
            matches!(refused, Err(StoreError::InvalidAppend { .. })),
            "{refused:?}"
        );
    }
}
