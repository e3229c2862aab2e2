//! The catch-up subscription both stores hand out: stored events first, then live ones, with no
//! gap and no repeat at the seam.
//!
//! It needs two things from a store: a way to read the global log after a position, and a
//! `watch` channel on which the store publishes the newest committed position *after* the commit.
//! The subscription remembers the last position it delivered and only ever reads strictly after
//! it, so it cannot repeat; it cannot skip because a store assigns positions in commit order from
//! a single writer, so nothing can later commit below a position already readable. It must never
//! deliver an event out of position order: a batch that breaks the order is reported as corrupt.

use std::collections::VecDeque;
use std::future::Future;

use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{LogStart, RecordedEvent, StoreError, MAX_READ_BATCH};
use tokio::sync::watch;

/// How long a caught-up subscription waits for its own store's commit notice before it looks at
/// the log anyway, in milliseconds: another process writing to the same file (a CLI recording a
/// review decision beside a running service) commits without notifying this one.
pub const UNANNOUNCED_POLL_MS: u64 = 250;

/// How many events a subscription reads from the store at once; bounds its buffer.
pub const SUBSCRIPTION_READ_BATCH: usize = 512;
const _: () = assert!(SUBSCRIPTION_READ_BATCH <= MAX_READ_BATCH);

/// What a subscription reads the global log through.
pub trait LogSource: Send + Sync + 'static {
    /// Up to `max_count` events after `start`, in position order.
    fn read_log(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send;

    /// How long a caught-up subscription waits for a commit notice before it reads the log
    /// anyway (a store whose notices can be lost, as PostgreSQL's, sets its own).
    fn unannounced_poll(&self) -> std::time::Duration {
        std::time::Duration::from_millis(UNANNOUNCED_POLL_MS)
    }
}

/// A catch-up subscription over a [`LogSource`] and the store's head-position channel.
pub struct CatchUp<S> {
    source: S,
    /// Everything up to here has been delivered (or was excluded by the start).
    delivered: LogStart,
    /// Read but not yet delivered; never more than one read batch.
    buffer: VecDeque<RecordedEvent>,
    /// The newest committed position, as published by the store after each commit.
    head: watch::Receiver<Option<GlobalPosition>>,
}

impl<S: LogSource> CatchUp<S> {
    /// A subscription delivering every event after `start`.
    pub fn new(source: S, start: LogStart, head: watch::Receiver<Option<GlobalPosition>>) -> Self {
        Self {
            source,
            delivered: start,
            buffer: VecDeque::new(),
            head,
        }
    }

    /// The next event after the last one delivered, waiting for a commit when caught up.
    /// Fails with [`StoreError::Closed`] when the store closes while it waits (and with whatever
    /// the source returns when a read fails).
    pub async fn next(&mut self) -> Result<RecordedEvent, StoreError> {
        loop {
            if let Some(event) = self.buffer.pop_front() {
                self.delivered = LogStart::After(event.position);
                return Ok(event);
            }
            // Mark the published head as seen *before* reading: a commit published after this
            // line wakes `changed()` below, and one published before it is visible to the read.
            let head = *self.head.borrow_and_update();
            if head.is_some_and(|head| self.delivered.admits(head)) {
                let batch = self
                    .source
                    .read_log(self.delivered, SUBSCRIPTION_READ_BATCH)
                    .await?;
                self.accept(batch, head)?;
                continue;
            }
            // Caught up. An error here means the store dropped its sender: it is closed, and
            // any head it published before closing was already seen by `borrow_and_update`.
            let wait = self.source.unannounced_poll();
            match tokio::time::timeout(wait, self.head.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(StoreError::Closed),
                Err(_) => {
                    // No notice: look for commits another process made. Positions are assigned
                    // under the file's write lock, in commit order, so reading after the last
                    // delivered position still cannot skip or repeat.
                    let batch = self
                        .source
                        .read_log(self.delivered, SUBSCRIPTION_READ_BATCH)
                        .await?;
                    if !batch.is_empty() {
                        self.accept(batch, None)?;
                    }
                }
            }
        }
    }

    /// Buffers a batch after checking it continues the delivered sequence in position order.
    fn accept(
        &mut self,
        batch: Vec<RecordedEvent>,
        head: Option<GlobalPosition>,
    ) -> Result<(), StoreError> {
        if batch.is_empty() {
            // The store published a head it cannot read back: waiting would hang forever.
            return Err(StoreError::Corrupt {
                reason: format!(
                    "the log's head is at {head:?} but nothing after {:?} can be read",
                    self.delivered
                ),
            });
        }
        let mut last = self.delivered;
        for event in &batch {
            if !last.admits(event.position) {
                return Err(StoreError::Corrupt {
                    reason: format!(
                        "the log returned position {} after {last:?}",
                        event.position
                    ),
                });
            }
            last = LogStart::After(event.position);
        }
        self.buffer.extend(batch);
        Ok(())
    }
}
