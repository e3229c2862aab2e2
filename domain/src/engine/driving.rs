//! One driver per operation in this process: every drive of an operation — a background
//! worker's, an execute call's, a reviewer's retry — holds its [`DriveGuard`] while it claims,
//! sends, sweeps or looks up, and a second driver of the same operation waits until the first
//! is done, then starts from the operation as the first left it.
//!
//! Across processes the conditional appends already make one sender win; what they cannot stop
//! is two lookups (or a lookup and a send) of one operation running at once, since a lookup is
//! appended only after the provider answered. Inside one process this guard stops that: double
//! load on the provider and half the lookup budget for nothing. It must never be held across
//! anything but the drive itself, and never taken twice by one drive (that would wait forever).
//!
//! Plain `std` (a mutex and wakers), since the domain depends on no runtime. The map holds only
//! operations being driven right now, so it is bounded by the drives in progress (the workers'
//! `max_concurrent` plus the execute calls the API admits), and each entry's wakers by the
//! drivers waiting for it.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::ids::OperationId;

/// The operations being driven in this process, each with the drivers waiting for it.
#[derive(Debug, Default)]
pub(super) struct Driving {
    active: Mutex<HashMap<OperationId, Vec<Waker>>>,
}

impl Driving {
    /// Waits until no other drive of `operation_id` is in progress, then holds it until the
    /// guard is dropped.
    pub(super) fn acquire(&self, operation_id: OperationId) -> Acquire<'_> {
        Acquire {
            driving: self,
            operation_id,
            waited: false,
        }
    }

    /// Whether a drive of `operation_id` is in progress (for tests).
    #[cfg(test)]
    fn is_driven(&self, operation_id: OperationId) -> bool {
        self.lock().contains_key(&operation_id)
    }

    /// How many drivers wait for `operation_id` (for tests).
    #[cfg(test)]
    fn waiting(&self, operation_id: OperationId) -> usize {
        self.lock().get(&operation_id).map_or(0, Vec::len)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<OperationId, Vec<Waker>>> {
        // A panic while holding this lock cannot leave the map half-changed (every change is
        // one insert or one remove), so a poisoned lock is still a correct one.
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The future of [`Driving::acquire`].
#[derive(Debug)]
pub(super) struct Acquire<'a> {
    driving: &'a Driving,
    operation_id: OperationId,
    waited: bool,
}

impl<'a> Future for Acquire<'a> {
    type Output = DriveGuard<'a>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<DriveGuard<'a>> {
        let this = self.get_mut();
        let mut active = this.driving.lock();
        match active.entry(this.operation_id) {
            Entry::Vacant(free) => {
                free.insert(Vec::new());
                Poll::Ready(DriveGuard {
                    driving: this.driving,
                    operation_id: this.operation_id,
                    waited: this.waited,
                })
            }
            Entry::Occupied(mut driven) => {
                // Registered under the same lock the guard's drop takes, so a wake-up between
                // this check and the registration cannot be lost.
                let waiting = driven.get_mut();
                if !waiting.iter().any(|waker| waker.will_wake(context.waker())) {
                    waiting.push(context.waker().clone());
                }
                this.waited = true;
                Poll::Pending
            }
        }
    }
}

/// This drive's hold on its operation; dropping it lets the next driver in.
#[derive(Debug)]
pub(super) struct DriveGuard<'a> {
    driving: &'a Driving,
    operation_id: OperationId,
    waited: bool,
}

impl DriveGuard<'_> {
    /// Whether another drive of the operation ran while this one waited: a copy of the
    /// operation taken before is stale, and the lookup it says is due may just have been made.
    pub(super) fn waited(&self) -> bool {
        self.waited
    }
}

impl Drop for DriveGuard<'_> {
    fn drop(&mut self) {
        let waiting = self.driving.lock().remove(&self.operation_id);
        // Woken outside the lock; every waiter polls again and one of them takes the guard.
        for waker in waiting.into_iter().flatten() {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn operation(n: u128) -> OperationId {
        OperationId::from_uuid(uuid::Uuid::from_u128(n))
    }

    #[tokio::test]
    async fn a_second_driver_of_one_operation_waits_for_the_first_and_knows_it_waited() {
        let driving = Arc::new(Driving::default());
        let first = driving.acquire(operation(1)).await;
        assert!(!first.waited());
        assert!(driving.is_driven(operation(1)));
        let other = driving.acquire(operation(2)).await;
        assert!(!other.waited(), "another operation is not held up");

        let second = {
            let driving = Arc::clone(&driving);
            tokio::spawn(async move { driving.acquire(operation(1)).await.waited() })
        };
        for _ in 0..1_000 {
            if driving.waiting(operation(1)) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(driving.waiting(operation(1)), 1, "the second driver waits");
        assert!(!second.is_finished());
        drop(first);
        assert!(second.await.expect("the waiting driver"), "it waited");
        assert!(
            !driving.is_driven(operation(1)),
            "released after the second"
        );
        drop(other);
        assert!(!driving.is_driven(operation(2)));
    }
}
