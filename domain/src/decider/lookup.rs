//! Claiming a lookup: of the workers that find an unknown operation due — several instances
//! sharing one ledger each see it — exactly one asks the provider each round.
//!
//! The claim is an event appended at the expected stream version, as a send's claim is, so the
//! store's version check picks the winner; the losers decide again on the claimed state and are
//! refused. It must never be taken before the lookup is due, nor while another worker's claim
//! holds; a claim whose lease ran out is how a worker that died mid-lookup hands its share on.

use super::attempt::{check_lease, lease_deadline};
use super::{On, Rejection};
use crate::event::{BudgetWait, LookupClaimed, OperationEvent};
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
