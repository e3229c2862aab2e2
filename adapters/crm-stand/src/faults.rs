//! The fault queue: faults queued through the admin API, consumed FIFO by matching provider
//! requests, one use per request.
//!
//! It only stores and matches faults; what a fault does to a request is `exchange.rs`'s job. It
//! must never hold more than [`MAX_QUEUED_FAULTS`] entries, nor accept a fault it could not carry
//! out (a status other than 500/502/503, a delay past [`MAX_LATE_DELAY_MS`], ...).

use std::collections::VecDeque;

use axum::http::Method;

use super::state::MAX_ACCOUNT_NAME_BYTES;
use super::wire::{Fault, FaultKind, Shape};

/// The most entries (each with its own `times`) the queue holds.
pub const MAX_QUEUED_FAULTS: usize = 1_000;
/// The most requests one queued fault may hit.
pub const MAX_FAULT_TIMES: u32 = 10_000;
/// The longest a `late_response` may hold its answer: long enough to outlast any client
/// timeout a test uses, short enough that a forgotten fault cannot pin a connection for long.
pub const MAX_LATE_DELAY_MS: u64 = 120_000;
/// The largest `retry_after_s` a `rate_limit` may announce.
pub const MAX_RETRY_AFTER_S: u64 = 86_400;
/// The statuses the error faults may answer.
const ERROR_STATUSES: [u16; 3] = [500, 502, 503];

/// Why a fault was not queued.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum QueueError {
    #[error("{0}")]
    Invalid(String),
    #[error("the fault queue already holds {MAX_QUEUED_FAULTS} entries")]
    Full,
}

#[derive(Debug)]
struct Queued {
    fault: Fault,
    remaining: u32,
}

impl Queued {
    fn matches(&self, shape: Shape, account: &str, method: &Method) -> bool {
        self.fault.shape.is_none_or(|s| s == shape)
            && self.fault.account.as_deref().is_none_or(|a| a == account)
            && self.fault.method.is_none_or(|m| m.matches(method))
    }
}

#[derive(Debug, Default)]
pub(super) struct FaultQueue {
    entries: VecDeque<Queued>,
}

impl FaultQueue {
    /// Queues a fault after checking it can be carried out.
    pub(super) fn push(&mut self, fault: Fault) -> Result<(), QueueError> {
        validate(&fault).map_err(QueueError::Invalid)?;
        if self.entries.len() >= MAX_QUEUED_FAULTS {
            return Err(QueueError::Full);
        }
        let remaining = fault.times;
        self.entries.push_back(Queued { fault, remaining });
        Ok(())
    }

    /// Consumes one use of the first queued fault that matches the request.
    pub(super) fn take(
        &mut self,
        shape: Shape,
        account: &str,
        method: &Method,
    ) -> Option<FaultKind> {
        let position = self
            .entries
            .iter()
            .position(|queued| queued.matches(shape, account, method))?;
        let queued = self.entries.get_mut(position)?;
        debug_assert!(queued.remaining > 0, "spent faults are removed at once");
        queued.remaining = queued.remaining.saturating_sub(1);
        let kind = queued.fault.kind.clone();
        if queued.remaining == 0 {
            self.entries.remove(position);
        }
        Some(kind)
    }

    /// Forgets every queued fault and says how many uses were left.
    pub(super) fn clear(&mut self) -> u64 {
        let pending = self.pending();
        self.entries.clear();
        pending
    }

    /// The uses left over all queued faults.
    pub(super) fn pending(&self) -> u64 {
        self.entries.iter().map(|q| u64::from(q.remaining)).sum()
    }
}

fn validate(fault: &Fault) -> Result<(), String> {
    if fault.times == 0 || fault.times > MAX_FAULT_TIMES {
        return Err(format!("times must be 1 to {MAX_FAULT_TIMES}"));
    }
    if let Some(account) = &fault.account {
        if account.is_empty() || account.len() > MAX_ACCOUNT_NAME_BYTES {
            return Err(format!(
                "account must have 1 to {MAX_ACCOUNT_NAME_BYTES} bytes"
            ));
        }
    }
    match &fault.kind {
        FaultKind::DropRequest | FaultKind::DropResponse => Ok(()),
        FaultKind::LateResponse { delay_ms } => {
            if *delay_ms > MAX_LATE_DELAY_MS {
                Err(format!("delay_ms must be at most {MAX_LATE_DELAY_MS}"))
            } else {
                Ok(())
            }
        }
        FaultKind::ErrorAfterCommit {
            retry_after_s: Some(retry_after_s),
            ..
        } if *retry_after_s > MAX_RETRY_AFTER_S => {
            Err(format!("retry_after_s must be at most {MAX_RETRY_AFTER_S}"))
        }
        FaultKind::ErrorAfterCommit { status, .. } | FaultKind::ErrorBeforeCommit { status } => {
            if ERROR_STATUSES.contains(status) {
                Ok(())
            } else {
                Err(format!("status must be one of {ERROR_STATUSES:?}"))
            }
        }
        FaultKind::RateLimit { retry_after_s, .. } => {
            if *retry_after_s > MAX_RETRY_AFTER_S {
                Err(format!("retry_after_s must be at most {MAX_RETRY_AFTER_S}"))
            } else {
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FaultMethod;

    fn queue(faults: impl IntoIterator<Item = Fault>) -> FaultQueue {
        let mut queue = FaultQueue::default();
        for fault in faults {
            queue.push(fault).expect("test faults are valid");
        }
        queue
    }

    #[test]
    fn a_fault_hits_only_requests_its_matcher_names() {
        let mut q = queue([Fault::new(FaultKind::DropRequest)
            .shape(Shape::Keyed)
            .account("acct-2")
            .method(FaultMethod::Post)]);
        assert_eq!(q.take(Shape::Plain, "acct-2", &Method::POST), None);
        assert_eq!(q.take(Shape::Keyed, "acct-1", &Method::POST), None);
        assert_eq!(q.take(Shape::Keyed, "acct-2", &Method::GET), None);
        assert_eq!(
            q.take(Shape::Keyed, "acct-2", &Method::POST),
            Some(FaultKind::DropRequest)
        );
        assert_eq!(q.take(Shape::Keyed, "acct-2", &Method::POST), None);
    }

    #[test]
    fn faults_are_consumed_first_in_first_out_one_use_per_request() {
        let mut q = queue([
            Fault::new(FaultKind::DropResponse).times(2),
            Fault::new(FaultKind::DropRequest),
        ]);
        assert_eq!(q.pending(), 3);
        let taken: Vec<_> = (0..4)
            .map(|_| q.take(Shape::Labelled, "acct-1", &Method::PUT))
            .collect();
        assert_eq!(
            taken,
            [
                Some(FaultKind::DropResponse),
                Some(FaultKind::DropResponse),
                Some(FaultKind::DropRequest),
                None
            ]
        );
    }

    #[test]
    fn faults_that_cannot_be_carried_out_are_refused() {
        let mut q = FaultQueue::default();
        for fault in [
            Fault::new(FaultKind::ErrorAfterCommit {
                status: 404,
                retry_after_s: None,
            }),
            Fault::new(FaultKind::DropRequest).times(0),
            Fault::new(FaultKind::LateResponse {
                delay_ms: MAX_LATE_DELAY_MS + 1,
            }),
        ] {
            assert!(matches!(q.push(fault), Err(QueueError::Invalid(_))));
        }
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn the_queue_is_bounded() {
        let mut q = FaultQueue::default();
        for _ in 0..MAX_QUEUED_FAULTS {
            q.push(Fault::new(FaultKind::DropRequest))
                .expect("below the bound");
        }
        assert_eq!(
            q.push(Fault::new(FaultKind::DropRequest)),
            Err(QueueError::Full)
        );
    }
}
