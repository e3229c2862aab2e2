//! Recording the intent: the only command decided on an operation with no history.
//!
//! It must never record an intent over an existing one, nor one whose hash does not match its
//! arguments (design rule 1: the hash is the check that the request did not change).

use super::Rejection;
use crate::error::ValidationError;
use crate::event::{IntentRecorded, OperationEvent};
use crate::state::{OperationState, Status};

/// `new --RecordIntent--> awaiting_approval | pending`.
pub(super) fn record(
    state: &OperationState,
    intent: &IntentRecorded,
) -> Result<Vec<OperationEvent>, Rejection> {
    if state.status != Status::New {
        return Err(Rejection::AlreadyRecorded {
            status: state.status.name(),
        });
    }
    // A keyed hash (personal data) is computed with the subject's key, which the decider
    // never holds; the ledger computed it from these very arguments.
    if !intent.args_hash.is_keyed() && intent.args.hash() != intent.args_hash {
        return Err(ValidationError::new(
            "args_hash",
            "does not match the arguments; compute it with ArgsSnapshot::hash",
        )
        .into());
    }
    Ok(vec![OperationEvent::IntentRecorded(intent.clone())])
}
