//! In-process workers: find due work through the work-queue projection and drive it with the
//! engine, with bounded concurrency and a clean shutdown.
//!
//! One task follows the global log (catch-up, then live) into a [`WorkQueue`], dispatches every
//! operation whose work is due (a send, a sweep of an expired lease, a lookup) to the engine, at
//! most `max_concurrent` at a time and never the same operation twice at once. Shutdown stops
//! dispatching and waits (bounded) for the drives in progress, so a send that was made is
//! recorded; a drive cut off by the bound leaves its attempt in flight, which the next run sweeps
//! to unknown and reconciles. It must never guess an outcome to finish faster.
//!
//! An event the workers cannot decode (damaged on disk, or written by a newer opledger) must not
//! stop the work of every other operation: it is logged with its position, stream and operation,
//! counted ([`WorkerCounters::undecodable_events`]), and its operation is set aside — never driven
//! again by this run, because its fold is missing an event and any send decided on it could be
//! wrong. A person must look (`opledger verify`, `opledger trace <operation id>`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use opledger_domain::app::AppError;
use opledger_domain::codec;
use opledger_domain::engine::Engine;
use opledger_domain::ids::OperationId;
use opledger_domain::ports::{Clock, IdSource};
use opledger_domain::provider::Providers;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, StoreError, Subscription};
use opledger_projections::work_queue::WorkQueue;
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tracing::{debug, warn};

/// Drives run at once when nothing says otherwise: enough to hide a provider's latency, few
/// enough that a slow provider is not flooded.
pub const DEFAULT_MAX_CONCURRENT: usize = 16;
/// Most drives any configuration may run at once.
pub const MAX_CONCURRENT_LIMIT: usize = 1024;
const _: () = assert!(0 < DEFAULT_MAX_CONCURRENT && DEFAULT_MAX_CONCURRENT <= MAX_CONCURRENT_LIMIT);
/// The longest head start a caller may get before the workers take a send, in milliseconds.
pub const MAX_SEND_DELAY_MS: u64 = 10 * 60 * 1000;

/// How the workers pace themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Most operations driven at once (sends, sweeps and lookups together).
    pub max_concurrent: usize,
    /// The longest sleep between looks at the queue when nothing is due, in milliseconds.
    pub idle_poll_ms: u64,
    /// The shortest pause before the same operation is driven again when nothing about it
    /// changed (a drive failed, or found nothing to do), in milliseconds.
    pub redrive_pause_ms: u64,
    /// How long after a send falls due the workers take it, in milliseconds: the head start a
    /// caller executing the operation itself gets (0: at once).
    pub send_delay_ms: u64,
    /// How long shutdown waits for drives in progress, in milliseconds.
    pub shutdown_grace_ms: u64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            idle_poll_ms: 200,
            redrive_pause_ms: 500,
            send_delay_ms: 0,
            shutdown_grace_ms: 10_000,
        }
    }
}

/// What the workers did, reported at shutdown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Drives started.
    pub drives: u64,
    /// Drives that failed (the store or a decode failed); their operations are retried later.
    pub failed_drives: u64,
    /// Drives still running when the shutdown grace ran out.
    pub abandoned_at_shutdown: usize,
    /// Of those, attempts then recorded as unknown (the rest had no attempt of ours in flight).
    pub recorded_unknown_at_shutdown: usize,
    /// Events of the log that could not be decoded and were skipped.
    pub undecodable_events: u64,
    /// Operations set aside because an event of theirs could not be decoded: not driven.
    pub set_aside_operations: usize,
}

/// What the workers have counted so far, readable while they run (the metrics read it).
#[derive(Clone, Debug, Default)]
pub struct WorkerCounters {
    undecodable_events: Arc<AtomicU64>,
}

impl WorkerCounters {
    /// Events of the log the workers could not decode and skipped, since they started.
    pub fn undecodable_events(&self) -> u64 {
        self.undecodable_events.load(Ordering::Relaxed)
    }
}

/// Why the workers stopped on their own.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The log subscription failed.
    #[error("the workers' log subscription failed: {0}")]
    Store(#[from] StoreError),
}

/// Running workers.
#[derive(Debug)]
pub struct Workers {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<WorkerStats, WorkerError>>,
    counters: WorkerCounters,
}

impl Workers {
    /// Starts the workers for `engine`.
    pub fn spawn<S, C, I, P>(engine: Arc<Engine<S, C, I, P>>, config: WorkerConfig) -> Self
    where
        S: EventStore + 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let config = WorkerConfig {
            max_concurrent: config.max_concurrent.clamp(1, MAX_CONCURRENT_LIMIT),
            ..config
        };
        let counters = WorkerCounters::default();
        let task = tokio::spawn(run(engine, config, stopped, counters.clone()));
        Self {
            stop,
            task,
            counters,
        }
    }

    /// The live counters, for metrics: a handle that stays readable after a shutdown.
    pub fn counters(&self) -> WorkerCounters {
        self.counters.clone()
    }

    /// Stops dispatching, waits for the drives in progress (up to the grace), and reports.
    pub async fn shutdown(self) -> Result<WorkerStats, WorkerError> {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(result) => result,
            Err(error) => Err(WorkerError::Store(StoreError::Unavailable {
                reason: format!("the worker task failed: {error}"),
            })),
        }
    }
}

async fn run<S, C, I, P>(
    engine: Arc<Engine<S, C, I, P>>,
    config: WorkerConfig,
    mut stopped: watch::Receiver<bool>,
    counters: WorkerCounters,
) -> Result<WorkerStats, WorkerError>
where
    S: EventStore + 'static,
    C: Clock + 'static,
    I: IdSource + 'static,
    P: Providers + 'static,
{
    let mut subscription = engine
        .ledger()
        .store()
        .subscribe_all(LogStart::Beginning)
        .await?;
    let send_delay = i64::try_from(config.send_delay_ms.min(MAX_SEND_DELAY_MS)).unwrap_or(0);
    let mut queue = WorkQueue::with_send_delay(chrono::Duration::milliseconds(send_delay));
    let mut drives = Drives::default();
    let idle = Duration::from_millis(config.idle_poll_ms.max(1));
    let redrive_pause = Duration::from_millis(config.redrive_pause_ms);

    loop {
        let now = engine.ledger().clock().now();
        drives.dispatch_due(&engine, &queue, now, config.max_concurrent, redrive_pause);
        let wait = queue
            .next_due_at()
            .and_then(|due_at| (due_at - now).to_std().ok())
            .map_or(idle, |until_due| until_due.min(idle));

        // Each future is dropped before its branch's handler runs, so the handlers may use
        // `drives` although `join_next` borrows it.
        tokio::select! {
            biased;
            _ = stopped.changed() => break,
            event = subscription.next() => drives.observe(&mut queue, &event?, &counters),
            Some(done) = drives.running.join_next(), if !drives.running.is_empty() => {
                drives.finished(done);
            }
            () = tokio::time::sleep(wait) => {}
        }
    }

    drives
        .shut_down(&engine, Duration::from_millis(config.shutdown_grace_ms))
        .await;
    let mut stats = drives.stats;
    stats.undecodable_events = counters.undecodable_events();
    stats.set_aside_operations = drives.set_aside.len();
    Ok(stats)
}

/// What a drive task returns: its operation and how the drive ended.
type DriveOutcome = (OperationId, Result<(), AppError>);

/// The drives the workers started, and what they remember of each operation between events.
#[derive(Default)]
struct Drives {
    /// The drives in progress.
    running: JoinSet<DriveOutcome>,
    /// The operations being driven now: none is dispatched twice at once.
    busy: HashSet<OperationId>,
    /// When each operation was last dispatched, so an unchanged one waits before it is driven
    /// again.
    last_driven: HashMap<OperationId, Instant>,
    // Not bounded by a limit: it grows only by undecodable events, each one logged and counted,
    // and forgetting one would let later events fold onto a state that misses an event.
    set_aside: HashSet<OperationId>,
    stats: WorkerStats,
}

impl Drives {
    /// Starts a drive for each due operation, up to `max_concurrent` in progress, skipping those
    /// running now or dispatched less than `redrive_pause` ago.
    fn dispatch_due<S, C, I, P>(
        &mut self,
        engine: &Arc<Engine<S, C, I, P>>,
        queue: &WorkQueue,
        now: DateTime<Utc>,
        max_concurrent: usize,
        redrive_pause: Duration,
    ) where
        S: EventStore + 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
    {
        let room = max_concurrent.saturating_sub(self.running.len());
        if room == 0 {
            return;
        }
        // Ask for more than there is room for: some due operations are already running.
        let asked = room + self.busy.len() + self.last_driven.len();
        for (operation_id, work) in queue.due(now, asked) {
            if self.running.len() >= max_concurrent {
                break;
            }
            let recently = self
                .last_driven
                .get(&operation_id)
                .is_some_and(|at| at.elapsed() < redrive_pause);
            if self.busy.contains(&operation_id) || recently {
                continue;
            }
            debug!(%operation_id, ?work, "dispatching");
            self.busy.insert(operation_id);
            self.last_driven.insert(operation_id, Instant::now());
            self.stats.drives += 1;
            let engine = Arc::clone(engine);
            self.running
                .spawn(async move { (operation_id, engine.drive(operation_id).await.map(drop)) });
        }
    }

    /// Folds an event of the log into the queue, unless its operation is set aside; one that
    /// cannot be decoded sets its operation aside.
    fn observe(
        &mut self,
        queue: &mut WorkQueue,
        recorded: &RecordedEvent,
        counters: &WorkerCounters,
    ) {
        let Some(operation_id) = recorded.stream.operation_id() else {
            return;
        };
        if self.set_aside.contains(&operation_id) {
            return;
        }
        if !fold(queue, operation_id, recorded, counters) {
            self.set_aside.insert(operation_id);
        }
        // Something changed: it may be driven again at once (unless set aside).
        self.last_driven.remove(&operation_id);
    }

    /// Frees a finished drive's operation and counts a failed drive; the queue drives it again.
    fn finished(&mut self, done: Result<DriveOutcome, JoinError>) {
        if let Ok((operation_id, result)) = done {
            self.busy.remove(&operation_id);
            if let Err(error) = result {
                self.stats.failed_drives += 1;
                warn!(%operation_id, %error, "drive failed; the operation will be driven again");
            }
        }
    }

    /// Stops taking work and lets the drives in progress record what their sends did, for at
    /// most `grace`; then aborts the rest and records their attempts as unknown.
    async fn shut_down<S, C, I, P>(&mut self, engine: &Engine<S, C, I, P>, grace: Duration)
    where
        S: EventStore + 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
    {
        let grace = tokio::time::sleep(grace);
        tokio::pin!(grace);
        while !self.running.is_empty() {
            tokio::select! {
                done = self.running.join_next() => {
                    if let Some(Ok((operation_id, _))) = done {
                        self.busy.remove(&operation_id);
                    }
                }
                () = &mut grace => {
                    self.abandon(engine).await;
                    break;
                }
            }
        }
    }

    /// Aborts the drives still running and records each one's attempt cut off as unknown.
    async fn abandon<S, C, I, P>(&mut self, engine: &Engine<S, C, I, P>)
    where
        S: EventStore + 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
    {
        self.stats.abandoned_at_shutdown = self.running.len();
        self.running.abort_all();
        // Every aborted drive has stopped before anything is recorded for it.
        while self.running.join_next().await.is_some() {}
        // An attempt cut off is recorded as unknown now: the ledger never shows an
        // attempt in flight that nobody is sending, and the next start reconciles it.
        for operation_id in &self.busy {
            match engine.record_interrupted(*operation_id).await {
                Ok(true) => self.stats.recorded_unknown_at_shutdown += 1,
                Ok(false) => {}
                Err(error) => {
                    warn!(%operation_id, %error, "could not record an interrupted attempt; its lease will expire instead")
                }
            }
        }
        warn!(
            drives = self.stats.abandoned_at_shutdown,
            recorded_unknown = self.stats.recorded_unknown_at_shutdown,
            "shutdown grace ran out; attempts in progress were recorded as unknown"
        );
    }
}

/// Folds `recorded`, an event of `operation_id`'s stream, into the queue; `false` when it cannot
/// be decoded, after taking the operation out of the queue, counting and logging it.
fn fold(
    queue: &mut WorkQueue,
    operation_id: OperationId,
    recorded: &RecordedEvent,
    counters: &WorkerCounters,
) -> bool {
    match codec::decode(recorded) {
        Ok(event) => {
            queue.apply(operation_id, &event);
            true
        }
        Err(error) => {
            queue.remove(operation_id);
            counters.undecodable_events.fetch_add(1, Ordering::Relaxed);
            warn!(
                position = %recorded.position,
                stream = %recorded.stream,
                %operation_id,
                %error,
                "an event cannot be decoded; it is skipped and its operation is no longer driven: \
                 a person must look (opledger verify; opledger trace <operation id>)"
            );
            false
        }
    }
}
