//! Claiming a lookup: of the workers that find an unknown operation due — several instances
//! sharing one ledger each see it — exactly one asks the provider each round.
//!
//! The claim is an event appended at the expected stream version, as a send's claim is, so the
//! store's version check picks the winner; the losers decide again on the claimed state and are
//! refused. It must never be taken before the lookup is due, nor while another worker's claim
//! holds; a claim whose lease ran out is how a worker that died mid-lookup hands its share on.

use chrono::{DateTime, Utc};

use super::attempt::{check_lease, lease_deadline};
use super::{clip, schedule, On, Rejection};
use crate::event::{BudgetWait, LookupClaimed, LookupPostponed, OperationEvent};
use crate::ids::WorkerId;
use crate::state::Status;

/// `unknown --ClaimLookup--> unknown`, with the lookup claimed by `worker` for `lease_ms`.
pub(super) fn claim(
    on: &On<'_>,
    worker: &WorkerId,
    lease_ms: u64,
    budget_wait: Option<&BudgetWait>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    if state.status != Status::Unknown {
        return Err(on.refuse());
    }
    check_lease(lease_ms)?;
    if let Some(not_before) = state
        .next_check_not_before
        .filter(|not_before| on.now < *not_before)
    {
        return Err(Rejection::NotYetDue { not_before });
    }
    // Also the worker's own live claim: a second claim by one worker would be a second lookup
    // in flight, which is what the claim exists to prevent.
    if let Some(held) = state
        .lookup_claim
        .as_ref()
        .filter(|held| on.now < held.lease_deadline)
    {
        return Err(Rejection::LookupClaimed {
            worker: held.worker.clone(),
            lease_deadline: held.lease_deadline,
        });
    }
    Ok(vec![OperationEvent::LookupClaimed(LookupClaimed {
        worker: worker.clone(),
        lease_deadline: lease_deadline(on.now, lease_ms)?,
        budget_wait: budget_wait.cloned(),
        at: on.now,
    })])
}

/// `unknown --PostponeLookup--> unknown`, no lookup counted: what the lookup needs before it
/// goes out is not there until `not_before`. Taken with `worker`'s own claim (the lookup found
/// the account without a token after claiming) or with none; another worker's live claim means
/// that worker is asking, and is left to record what it finds.
pub(super) fn postpone(
    on: &On<'_>,
    worker: &WorkerId,
    reason: &str,
    not_before: DateTime<Utc>,
) -> Result<Vec<OperationEvent>, Rejection> {
    let state = on.state;
    // A confirmed operation's look for a duplicate after a search's lag is put off as well.
    let duplicate_check =
        matches!(state.status, Status::Succeeded { .. }) && state.next_check_not_before.is_some();
    if state.status != Status::Unknown && !duplicate_check {
        return Err(on.refuse());
    }
    if let Some(held) = state
        .lookup_claim
        .as_ref()
        .filter(|held| held.worker != *worker && on.now < held.lease_deadline)
    {
        return Err(Rejection::LookupClaimed {
            worker: held.worker.clone(),
            lease_deadline: held.lease_deadline,
        });
    }
    Ok(vec![OperationEvent::LookupPostponed(LookupPostponed {
        reason: clip(reason),
        not_before: schedule(not_before, on.now),
        at: on.now,
    })])
}
