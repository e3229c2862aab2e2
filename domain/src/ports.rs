//! Ports the application services need besides the event store: time and fresh ids.
//!
//! The domain never reads the clock or draws random numbers itself; adapters provide these, and
//! tests provide fixed or simulated ones.

use chrono::{DateTime, Utc};

use crate::ids::{AttemptId, IdempotencyKey, OperationId};

/// Tells the time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// Makes fresh identities. Implementations must draw from a cryptographically secure source:
/// idempotency keys must not be guessable and must not collide across tenants.
pub trait IdSource: Send + Sync {
    /// A new operation id, for an intent without a source delivery id.
    fn new_operation_id(&self) -> OperationId;
    /// A new attempt id.
    fn new_attempt_id(&self) -> AttemptId;
    /// A new idempotency key: random, with no personal data in it.
    fn new_idempotency_key(&self) -> IdempotencyKey;
    /// A uniformly random number in `0..bound` (0 when `bound` is 0), for jittered backoff.
    fn random_below(&self, bound: u64) -> u64;
}
