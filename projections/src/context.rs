//! What every read-model fold is given besides the event: where the event sits and what the
//! operation looked like before and after it.
//!
//! A read model that needs an operation's history does not keep it in memory: whoever runs the
//! folds stores the folded [`OperationState`] beside the read model (the SQLite read-model store
//! keeps it as JSON in the operations table) and hands it back here. The folds themselves stay
//! pure. This module must never read anything but its arguments.

use std::fmt;

use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::state::{OperationState, Status};

use crate::duplicates::SimilarIntent;

/// One event's place in the ledger and the operation's state around it.
#[derive(Clone, Copy, Debug)]
pub struct FoldContext<'a> {
    /// The operation whose stream holds the event.
    pub operation_id: OperationId,
    /// The event's version in that stream.
    pub version: StreamVersion,
    /// The event's position in the global log.
    pub position: GlobalPosition,
    /// Where the operation stood before this event. Only its status: the folds compare where an
    /// operation stood with where it stands, and giving them no more lets a fold run in place
    /// without a copy of the whole state per event.
    pub status_before: &'a Status,
    /// The operation folded up to and including this event.
    pub after: &'a OperationState,
    /// For an `IntentRecorded`: earlier intents of the same tenant, provider, account, action and
    /// arguments recorded near it (see [`crate::duplicates::SimilarIntentQuery`]); empty for
    /// every other event.
    pub similar_intents: &'a [SimilarIntent],
}

/// Why an event cannot be folded. Each one means the log or the read model is not what the
/// folds were promised; the runner stops instead of guessing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FoldError {
    /// The event does not continue its stream: a gap or a repeat. A repeat means an event would
    /// be applied twice; a gap means one was skipped.
    OutOfOrder {
        /// The operation.
        operation_id: OperationId,
        /// The version of the last event folded for it (`None`: none yet).
        last: Option<StreamVersion>,
        /// The version of the event offered.
        found: StreamVersion,
    },
    /// The operation's stream does not start with its intent.
    NoIntent {
        /// The operation.
        operation_id: OperationId,
        /// The version of the event that has no intent before it.
        version: StreamVersion,
    },
}

impl fmt::Display for FoldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutOfOrder {
                operation_id,
                last,
                found,
            } => {
                let last = last.map_or_else(|| "nothing".to_owned(), |v| format!("version {v}"));
                write!(
                    f,
                    "event {found} of operation {operation_id} does not follow {last} already folded; \
                     the read model and the log disagree, rebuild the read models"
                )
            }
            Self::NoIntent {
                operation_id,
                version,
            } => write!(
                f,
                "event {version} of operation {operation_id} has no IntentRecorded before it; \
                 the stream is corrupt"
            ),
        }
    }
}

impl std::error::Error for FoldError {}

/// Checks that an event at `found` is the next one of a stream whose last folded event is at
/// `last`: version 0 for a new stream, one more than the last otherwise.
pub fn check_continuity(
    operation_id: OperationId,
    last: Option<StreamVersion>,
    found: StreamVersion,
) -> Result<(), FoldError> {
    let expected = last.map_or(StreamVersion::FIRST, StreamVersion::next);
    if found == expected {
        Ok(())
    } else {
        Err(FoldError::OutOfOrder {
            operation_id,
            last,
            found,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn only_the_next_version_continues_a_stream() {
        let operation = OperationId::from_uuid(Uuid::from_u128(1));
        let v = StreamVersion::new;
        assert!(check_continuity(operation, None, v(0)).is_ok());
        assert!(check_continuity(operation, Some(v(3)), v(4)).is_ok());
        let repeat = check_continuity(operation, Some(v(3)), v(3)).unwrap_err();
        assert!(repeat.to_string().contains("rebuild"), "{repeat}");
        assert!(check_continuity(operation, Some(v(3)), v(5)).is_err());
        assert!(check_continuity(operation, None, v(1)).is_err());
    }
}
