//! The port the workers find due work through: a durable, checkpointed work queue.
//!
//! The workers keep no copy of the queue. They ask a [`WorkSource`] (the read models'
//! `work_queue` table, fed from the log after their checkpoint) what is due now, and wait for it
//! to change; an operation's arguments are read from its stream when it is driven. So neither
//! their start-up nor their memory grows with the ledger's history: an operation waiting for a
//! person costs nothing until it is decided. A source lags the log; it must never be taken as a
//! ground for a decision — every drive reads the operation's stream and the decider decides.

use std::future::Future;

use chrono::{DateTime, Utc};
use opledger_domain::ids::{OperationId, StreamVersion};
use opledger_domain::state::Work;
use tokio::sync::watch;

/// One operation whose work is due, as the source last folded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DueWork {
    /// The operation.
    pub operation_id: OperationId,
    /// What it waits for.
    pub work: Work,
    /// When it fell due (for a send, before the send delay).
    pub due_at: DateTime<Utc>,
    /// The stream version the source computed it at: a different one later means the operation
    /// moved since.
    pub version: StreamVersion,
}

/// What is due now, and when the next work not yet due falls due.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DuePage {
    /// Due operations, the longest-waiting first.
    pub due: Vec<DueWork>,
    /// When the earliest work not in `due` falls due (a send's after its delay), if any waits.
    pub next_due_at: Option<DateTime<Utc>>,
}

/// A durable work queue the workers read.
pub trait WorkSource: Clone + Send + Sync + 'static {
    /// Why a read failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Up to `limit` operations whose work is due at `now` — sends only once `send_delay` has
    /// passed since they fell due — the longest-waiting first.
    fn due(
        &self,
        now: DateTime<Utc>,
        send_delay: chrono::Duration,
        limit: usize,
    ) -> impl Future<Output = Result<DuePage, Self::Error>> + Send;

    /// A receiver marked changed whenever the queue may hold new work (a batch was committed).
    fn changes(&self) -> watch::Receiver<u64>;
}
