//! Approval: a person approves or denies exactly the recorded snapshot.
//!
//! It must never let an approval of other arguments through (design rule 1: an approval covers
//! exactly that snapshot), nor approve what was denied.

use super::{check_hash, check_note, On, Rejection};
use crate::args::ArgsHash;
use crate::event::{ApprovalDenied, ApprovalGranted, OperationEvent, Principal};
use crate::ids::ActorId;
use crate::state::Status;

/// `awaiting_approval --GrantApproval (same args hash)--> pending`.
pub(super) fn grant(
    on: &On<'_>,
    approver: &ActorId,
    principal: Option<&Principal>,
    args_hash: &ArgsHash,
) -> Result<Vec<OperationEvent>, Rejection> {
    check_hash(&on.intent.args_hash, args_hash)?;
    match on.state.status {
        Status::AwaitingApproval => Ok(vec![OperationEvent::ApprovalGranted(ApprovalGranted {
            approver: approver.clone(),
            principal: principal.cloned(),
            args_hash: args_hash.clone(),
            at: on.now,
        })]),
        // Approving what is already approved repeats a recorded fact.
        _ if on.intent.requires_approval && on.state.status != Status::Denied => Ok(Vec::new()),
        _ => Err(on.refuse()),
    }
}

/// `awaiting_approval --DenyApproval (same args hash)--> denied`.
pub(super) fn deny(
    on: &On<'_>,
    approver: &ActorId,
    principal: Option<&Principal>,
    args_hash: &ArgsHash,
    reason: &str,
) -> Result<Vec<OperationEvent>, Rejection> {
    check_hash(&on.intent.args_hash, args_hash)?;
    check_note("reason", reason)?;
    match on.state.status {
        Status::AwaitingApproval => Ok(vec![OperationEvent::ApprovalDenied(ApprovalDenied {
            approver: approver.clone(),
            principal: principal.cloned(),
            args_hash: args_hash.clone(),
            reason: reason.to_owned(),
            at: on.now,
        })]),
        Status::Denied => Ok(Vec::new()),
        _ => Err(on.refuse()),
    }
}
