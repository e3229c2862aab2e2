//! Handing an append to a store's single writer (a thread for SQLite, a task for PostgreSQL)
//! and waiting for its answer.
//!
//! The append is checked first ([`crate::rules::check_append`]), so a writer only ever sees
//! appends the port allows. A caller must never be answered success unless the writer said so:
//! a writer that stopped before answering leaves the outcome unknown, and says so.

use std::sync::{Mutex, PoisonError};

use opledger_domain::store::{AppendOutcome, EventData, ExpectedVersion, StoreError, StreamName};
use tokio::sync::{mpsc, oneshot};

use crate::rules;

/// One queued append and where to send its answer.
pub struct AppendRequest {
    /// The stream appended to.
    pub stream: StreamName,
    /// The version the caller expects the stream at.
    pub expected: ExpectedVersion,
    /// The events, checked against the port's limits.
    pub events: Vec<EventData>,
    /// Where the writer answers.
    pub reply: oneshot::Sender<Result<AppendOutcome, StoreError>>,
}

/// How the messages name a store's writer when it is gone.
pub struct WriterGone {
    /// The reason when the queue no longer takes appends (nothing was written).
    pub stopped: &'static str,
    /// The reason when the writer took the append and stopped before answering.
    pub unanswered: &'static str,
}

/// Checks an append, queues it for the writer behind `queue` (`None`: the store is closed) and
/// waits for the writer's answer.
pub async fn append(
    queue: &Mutex<Option<mpsc::Sender<AppendRequest>>>,
    gone: &WriterGone,
    stream: &StreamName,
    expected: ExpectedVersion,
    events: Vec<EventData>,
) -> Result<AppendOutcome, StoreError> {
    rules::check_append(stream, &events)?;
    // The guarded value, an optional sender, is replaced whole: a poisoned lock still holds a
    // valid one.
    let sender = queue
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .ok_or(StoreError::Closed)?;
    let (reply, answer) = oneshot::channel();
    let request = AppendRequest {
        stream: stream.clone(),
        expected,
        events,
        reply,
    };
    // Holding a sender keeps the queue open, so a failed send means the writer died.
    sender
        .send(request)
        .await
        .map_err(|_| StoreError::Unavailable {
            reason: gone.stopped.into(),
        })?;
    drop(sender);
    answer.await.unwrap_or_else(|_| {
        Err(StoreError::AppendOutcomeUnknown {
            stream: stream.clone(),
            reason: gone.unanswered.into(),
        })
    })
}
