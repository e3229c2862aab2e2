//! Feeding the read models from the log: the async handle, the checkpointed runner and the lag.
//!
//! [`ReadModels`] is the async face of the blocking [`ReadModelStore`]: every call runs on a
//! blocking thread (`spawn_blocking`), never on an executor thread. [`ReadModelRunner::run`]
//! subscribes to the log right after the checkpoint (catch-up, then live) and applies whatever has
//! arrived, up to a bounded batch, in one transaction at a time. Its only memory is one batch and
//! a bounded buffer of events read ahead. It must never acknowledge progress it has not committed:
//! the checkpoint it resumes from is the one in the file, written with the changes it covers.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, StoreError, Subscription};
use tokio::sync::{mpsc, watch, Notify};
use tracing::{debug, info, Instrument};

use super::{BatchOutcome, ReadModelError, ReadModelStore, MAX_BATCH_EVENTS};

/// Most events the runner reads ahead of what it has applied: two batches, so the next batch is
/// usually ready when a commit ends, while a slow disk stops the reading instead of filling memory.
pub const RUNNER_BUFFER_EVENTS: usize = 2 * MAX_BATCH_EVENTS;
/// The longest a batch may wait for more events, in milliseconds.
pub const MAX_LINGER_MS: u64 = 1_000;

/// The read models, shared: cloning gives another handle to the same file and connection. Calls
/// from several tasks are serialised on the one connection, each waiting at most one batch.
#[derive(Clone, Debug)]
pub struct ReadModels {
    store: Arc<Mutex<ReadModelStore>>,
    path: Arc<PathBuf>,
    /// Rung by a reader waiting for the read models to catch up: a lingering batch commits now.
    hurry: Arc<Notify>,
    /// Counts committed batches, so the workers wake when the work queue may have changed.
    pub(super) committed: Arc<watch::Sender<u64>>,
}

impl ReadModels {
    /// Opens the read models in the file at `path` (see [`ReadModelStore::open`]) on a blocking
    /// thread.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, ReadModelError> {
        let path = path.as_ref().to_path_buf();
        let store = blocking(move || ReadModelStore::open(path)).await?;
        Ok(Self::from_store(store))
    }

    /// Shares a store opened with [`ReadModelStore::open`].
    pub fn from_store(store: ReadModelStore) -> Self {
        let path = Arc::new(store.path().to_path_buf());
        Self {
            store: Arc::new(Mutex::new(store)),
            path,
            hurry: Arc::new(Notify::new()),
            committed: Arc::new(watch::channel(0).0),
        }
    }

    /// Asks a runner's lingering batch to commit without waiting out its linger: someone is
    /// waiting to read what it holds. Lingering pays off under a stream of writes, not when a
    /// reader waits; without this a listing right after a write would wait out the linger.
    pub fn hurry(&self) {
        // No permit is stored: a call while no batch lingers must not cut the next batch short
        // (a reader still waiting asks again, as `fresh_read_models` does every few ms).
        self.hurry.notify_waiters();
    }

    /// The file the read models live in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on the store on a blocking thread: the way to every query, e.g.
    /// `read_models.call(|store| store.review_queue(20)).await`.
    pub async fn call<T, F>(&self, work: F) -> Result<T, ReadModelError>
    where
        F: FnOnce(&mut ReadModelStore) -> Result<T, ReadModelError> + Send + 'static,
        T: Send + 'static,
    {
        let store = Arc::clone(&self.store);
        blocking(move || work(&mut lock(&store))).await
    }

    /// The position of the last event applied.
    pub async fn checkpoint(&self) -> Result<Option<GlobalPosition>, ReadModelError> {
        self.call(|store| store.checkpoint()).await
    }

    /// Applies a batch in one transaction (see [`ReadModelStore::apply_batch`]).
    pub async fn apply_batch(
        &self,
        events: Vec<RecordedEvent>,
    ) -> Result<BatchOutcome, ReadModelError> {
        let outcome = self.call(move |store| store.apply_batch(&events)).await?;
        self.committed
            .send_modify(|batches| *batches = batches.wrapping_add(1));
        Ok(outcome)
    }

    /// How far the read models are behind `store`'s log.
    pub async fn lag<S: EventStore>(&self, store: &S) -> Result<Lag, ReadModelError> {
        // Checkpoint first: the head can only move forward meanwhile, so the figure may
        // overstate the lag by what arrived in between, never understate it.
        let checkpoint = self.checkpoint().await?;
        let head = store.head_position().await?;
        Ok(Lag::between(head, checkpoint))
    }
}

/// How far the read models are behind the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lag {
    /// The newest position in the log.
    pub head: Option<GlobalPosition>,
    /// The last position applied.
    pub checkpoint: Option<GlobalPosition>,
    /// `head − checkpoint`, in positions (0 when caught up). For the SQLite and memory stores a
    /// position is one event; for KurrentDB positions are byte offsets in its log.
    pub positions: u64,
}

impl Lag {
    /// The lag between a head and a checkpoint.
    pub fn between(head: Option<GlobalPosition>, checkpoint: Option<GlobalPosition>) -> Self {
        let value = |position: Option<GlobalPosition>| position.map_or(0, GlobalPosition::value);
        Self {
            head,
            checkpoint,
            positions: value(head).saturating_sub(value(checkpoint)),
        }
    }
}

/// What a run did before it stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Transactions committed.
    pub batches: u64,
    /// Events applied.
    pub applied: u64,
    /// The checkpoint when it stopped.
    pub checkpoint: Option<GlobalPosition>,
}

/// Applies the log to the read models, from the checkpoint on, in bounded batches.
#[derive(Clone, Copy, Debug)]
pub struct ReadModelRunner {
    max_batch_events: usize,
    /// How long a batch may wait for more events after its first one (zero: not at all).
    linger: Duration,
}

impl Default for ReadModelRunner {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadModelRunner {
    /// A runner with batches of up to [`MAX_BATCH_EVENTS`].
    pub fn new() -> Self {
        Self {
            max_batch_events: MAX_BATCH_EVENTS,
            linger: Duration::ZERO,
        }
    }

    /// The same runner letting each batch wait up to `linger_ms` (at most [`MAX_LINGER_MS`]) after
    /// its first event for more to arrive. Under steady traffic a few large commits cost far less
    /// than many small ones (each commit rewrites the hot pages it touched); the price is that
    /// the read models trail the log by up to that much more.
    pub fn with_linger_ms(self, linger_ms: u64) -> Self {
        Self {
            linger: Duration::from_millis(linger_ms.min(MAX_LINGER_MS)),
            ..self
        }
    }

    /// The same runner with batches of up to `events` (kept between 1 and [`MAX_BATCH_EVENTS`]).
    /// Smaller batches commit more often, so progress is visible sooner and a crash loses less
    /// work, at one fsync per batch.
    pub fn with_max_batch_events(self, events: usize) -> Self {
        Self {
            max_batch_events: events.clamp(1, MAX_BATCH_EVENTS),
            ..self
        }
    }

    /// Follows `store`'s log from the read models' checkpoint until `stop` completes or something
    /// fails. Each batch is whatever has arrived (at least one event, at most the batch limit),
    /// committed with its checkpoint; `stop` is honoured between batches, so a batch being
    /// written is finished first. An error leaves the read models at the last committed batch;
    /// running again resumes there.
    pub async fn run<S: EventStore>(
        &self,
        store: &S,
        read_models: &ReadModels,
        stop: impl Future<Output = ()>,
    ) -> Result<RunReport, ReadModelError> {
        let checkpoint = read_models.checkpoint().await?;
        info!(?checkpoint, path = %read_models.path().display(), "projection runner starting");
        let subscription = store
            .subscribe_all(checkpoint.map_or(LogStart::Beginning, LogStart::After))
            .await?;
        let (sender, receiver) = mpsc::channel(RUNNER_BUFFER_EVENTS);
        // The subscription is read in its own future, so the next events arrive while a batch
        // commits. A read error travels down the channel behind the events read before it, so
        // those are still applied, in order, before the run stops.
        let feed = feed(subscription, sender);
        let apply = self.apply(read_models, receiver, stop, checkpoint);
        tokio::select! {
            biased;
            result = apply => result,
            () = feed => Err(feed_ended()),
        }
    }

    /// Applies what arrives on `receiver`, one batch per transaction, until `stop` completes
    /// (between batches) or something fails.
    async fn apply(
        &self,
        read_models: &ReadModels,
        mut receiver: mpsc::Receiver<Result<RecordedEvent, StoreError>>,
        stop: impl Future<Output = ()>,
        checkpoint: Option<GlobalPosition>,
    ) -> Result<RunReport, ReadModelError> {
        tokio::pin!(stop);
        let mut report = RunReport {
            checkpoint,
            ..RunReport::default()
        };
        loop {
            let first = tokio::select! {
                biased;
                () = &mut stop => return Ok(report),
                next = receiver.recv() => next,
            };
            let Some(first) = first else {
                return Err(feed_ended());
            };
            let (batch, failure) = self.gather(read_models, &mut receiver, first?).await;
            // A trace of its own: one batch holds events of many operations' traces.
            let span = tracing::info_span!(
                parent: None,
                "read_model_batch",
                events = batch.len(),
                checkpoint = tracing::field::Empty,
            );
            let outcome = read_models
                .apply_batch(batch)
                .instrument(span.clone())
                .await?;
            if let Some(checkpoint) = outcome.checkpoint {
                span.record("checkpoint", checkpoint.value());
            }
            report.batches += 1;
            report.applied += outcome.applied as u64;
            report.checkpoint = outcome.checkpoint;
            debug!(
                applied = outcome.applied,
                checkpoint = ?outcome.checkpoint,
                "read-model batch committed"
            );
            if let Some(error) = failure {
                return Err(error.into());
            }
        }
    }

    /// The batch that starts with `first`: what else has arrived, up to the batch limit, waiting
    /// up to the linger for more unless a reader hurries it; and the read error that ended it,
    /// if one did, to report once the events before it are committed.
    async fn gather(
        &self,
        read_models: &ReadModels,
        receiver: &mut mpsc::Receiver<Result<RecordedEvent, StoreError>>,
        first: RecordedEvent,
    ) -> (Vec<RecordedEvent>, Option<StoreError>) {
        let mut batch = vec![first];
        let linger_until = tokio::time::Instant::now() + self.linger;
        // Created here, so a `hurry` from now on ends this batch's linger even before
        // the wait below first polls it.
        let hurried = read_models.hurry.notified();
        tokio::pin!(hurried);
        while batch.len() < self.max_batch_events {
            let next = match receiver.try_recv() {
                Ok(next) => next,
                Err(_) if self.linger.is_zero() => break,
                Err(_) => {
                    let wait = tokio::time::timeout_at(linger_until, receiver.recv());
                    tokio::select! {
                        biased;
                        // A reader is waiting: commit what has arrived.
                        () = &mut hurried => break,
                        waited = wait => match waited {
                            Ok(Some(next)) => next,
                            // The linger ran out, or the feed ended (reported next round).
                            _ => break,
                        },
                    }
                }
            };
            match next {
                Ok(event) => batch.push(event),
                Err(error) => return (batch, Some(error)),
            }
        }
        (batch, None)
    }
}

/// Sends the subscription's events down the channel until a read fails (that error is sent
/// too) or the applier is gone; never completes.
async fn feed(
    mut subscription: impl Subscription,
    sender: mpsc::Sender<Result<RecordedEvent, StoreError>>,
) {
    loop {
        let next = subscription.next().await;
        let failed = next.is_err();
        if sender.send(next).await.is_err() || failed {
            break;
        }
    }
    // Ending here would end the run before it applied what is buffered; the run ends when the
    // applier reaches the error (or `stop`) instead.
    std::future::pending::<()>().await;
}

fn feed_ended() -> ReadModelError {
    ReadModelError::Worker {
        reason: "the log feed ended without an error".into(),
    }
}

async fn blocking<T, F>(work: F) -> Result<T, ReadModelError>
where
    F: FnOnce() -> Result<T, ReadModelError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| ReadModelError::Worker {
            reason: error.to_string(),
        })?
}

fn lock(store: &Mutex<ReadModelStore>) -> MutexGuard<'_, ReadModelStore> {
    // A call that panicked dropped its open transaction, and dropping a rusqlite transaction rolls
    // it back: the connection is as the last commit left it, so it is safe to go on using.
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_head_minus_checkpoint_and_never_negative() {
        let p = |value| Some(GlobalPosition::new(value));
        assert_eq!(Lag::between(None, None).positions, 0);
        assert_eq!(Lag::between(p(7), None).positions, 7);
        assert_eq!(Lag::between(p(7), p(4)).positions, 3);
        assert_eq!(Lag::between(p(7), p(7)).positions, 0);
        assert_eq!(Lag::between(p(4), p(7)).positions, 0);
    }

    #[test]
    fn batch_sizes_stay_within_the_limit() {
        assert_eq!(ReadModelRunner::new().max_batch_events, MAX_BATCH_EVENTS);
        let tiny = ReadModelRunner::new().with_max_batch_events(0);
        assert_eq!(tiny.max_batch_events, 1);
        let huge = ReadModelRunner::new().with_max_batch_events(usize::MAX);
        assert_eq!(huge.max_batch_events, MAX_BATCH_EVENTS);
    }
}
