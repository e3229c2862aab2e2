//! In-process workers: find due work in the durable work queue and drive it with the engine,
//! with bounded concurrency and a clean shutdown.
//!
//! One task asks a [`WorkSource`] (the read models' work queue, fed from the log after their
//! checkpoint) what is due now (a send, a sweep of an expired lease, a lookup), dispatches each
//! due operation to the engine, at most `max_concurrent` at a time and never the same operation
//! twice at once, and waits until the queue changes, a drive ends or the next work falls due.
//! It keeps no copy of the queue: start-up reads nothing of the history, an operation's
//! arguments are read from its stream when it is driven, and an operation waiting for a person
//! costs no memory. What it remembers is bounded: the drives running (`max_concurrent`), the
//! operations dispatched within the last redrive pause, and those set aside (below).
//!
//! Several instances sharing one ledger (KurrentDB) each run these workers over their own read
//! models, so each sees every due operation. Nothing here shares the work out: the engine claims
//! every send and every lookup with a conditional append, so one instance wins each and the
//! others' drives find the operation claimed and end. A claimed lookup leaves the queue until its
//! claim's lease runs out, which is when another instance takes over from one that died.
//!
//! Shutdown stops dispatching and waits (bounded) for the drives in progress, so a send that was
//! made is recorded; a drive cut off by the bound leaves its attempt in flight, which the next run
//! sweeps to unknown and reconciles. It must never guess an outcome to finish faster.
//!
//! An operation whose stream the engine cannot decode (damaged on disk, or written by a newer
//! opledger) must not stop the work of every other operation: the failed drive is logged,
//! counted ([`WorkerCounters::undecodable_events`]), and the operation is set aside — never driven
//! again by this run, because its fold is missing an event and any send decided on it could be
//! wrong. A person must look (`opledger verify`, `opledger trace <operation id>`). (The read
//! models stop at such an event, so work recorded after it reaches the queue only once it is
//! repaired; `/healthz` shows their lag growing.)

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use opledger_domain::app::AppError;
use opledger_domain::engine::Engine;
use opledger_domain::ids::{OperationId, StreamVersion};
use opledger_domain::in_span::InSpanExt;
use opledger_domain::ports::{Clock, IdSource};
use opledger_domain::provider::Providers;
use opledger_domain::store::{EventStore, StoreError};
use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tracing::{debug, info_span, warn};

use crate::work_source::{DuePage, WorkSource};

/// Drives run at once when nothing says otherwise: enough to hide a provider's latency, few
/// enough that a slow provider is not flooded.
pub const DEFAULT_MAX_CONCURRENT: usize = 16;
/// Most drives any configuration may run at once.
pub const MAX_CONCURRENT_LIMIT: usize = 1024;
const _: () = assert!(0 < DEFAULT_MAX_CONCURRENT && DEFAULT_MAX_CONCURRENT <= MAX_CONCURRENT_LIMIT);
/// The longest head start a caller may get before the workers take a send, in milliseconds.
pub const MAX_SEND_DELAY_MS: u64 = 10 * 60 * 1000;
/// Most due operations asked of the work queue at one look: room for the drives that may start
/// plus those skipped because they run or ran moments ago, capped so one look stays a bounded
/// read whatever the backlog.
pub const MAX_DUE_PER_LOOK: usize = 4 * MAX_CONCURRENT_LIMIT;
const _: () = assert!(MAX_CONCURRENT_LIMIT <= MAX_DUE_PER_LOOK);

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
    /// Operations whose stream could not be decoded when they were driven (one event each).
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
    /// Operations whose stream the workers could not decode (each set aside), since they started.
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
    /// Starts the workers for `engine`, finding due work in `queue`.
    pub fn spawn<S, C, I, P, Q>(
        engine: Arc<Engine<S, C, I, P>>,
        queue: Q,
        config: WorkerConfig,
    ) -> Self
    where
        S: EventStore + 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
        Q: WorkSource,
    {
        let (stop, stopped) = watch::channel(false);
        let config = WorkerConfig {
            max_concurrent: config.max_concurrent.clamp(1, MAX_CONCURRENT_LIMIT),
            ..config
        };
        let counters = WorkerCounters::default();
        let task = tokio::spawn(run(engine, queue, config, stopped, counters.clone()));
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

async fn run<S, C, I, P, Q>(
    engine: Arc<Engine<S, C, I, P>>,
    queue: Q,
    config: WorkerConfig,
    mut stopped: watch::Receiver<bool>,
    counters: WorkerCounters,
) -> Result<WorkerStats, WorkerError>
where
    S: EventStore + 'static,
    C: Clock + 'static,
    I: IdSource + 'static,
    P: Providers + 'static,
    Q: WorkSource,
{
    let send_delay = i64::try_from(config.send_delay_ms.min(MAX_SEND_DELAY_MS)).unwrap_or(0);
    let send_delay = chrono::Duration::milliseconds(send_delay);
    let mut changes = queue.changes();
    // A source that can no longer say it changed is still polled every idle period.
    let mut follow_changes = true;
    let mut drives = Drives::new(counters, Duration::from_millis(config.redrive_pause_ms));
    let idle = Duration::from_millis(config.idle_poll_ms.max(1));

    loop {
        let now = engine.ledger().clock().now();
        let next_due_at = drives
            .dispatch_due(&engine, &queue, now, send_delay, config.max_concurrent)
            .await;
        let wait = next_due_at
            .and_then(|due_at| (due_at - now).to_std().ok())
            .map_or(idle, |until_due| until_due.min(idle));

        // Each future is dropped before its branch's handler runs, so the handlers may use
        // `drives` although `join_next` borrows it.
        tokio::select! {
            biased;
            _ = stopped.changed() => break,
            Some(done) = drives.running.join_next(), if !drives.running.is_empty() => {
                drives.finished(done);
            }
            changed = changes.changed(), if follow_changes => follow_changes = changed.is_ok(),
            () = tokio::time::sleep(wait) => {}
        }
    }

    drives
        .shut_down(&engine, Duration::from_millis(config.shutdown_grace_ms))
        .await;
    let mut stats = drives.stats;
    stats.undecodable_events = drives.counters.undecodable_events();
    stats.set_aside_operations = drives.set_aside.len();
    Ok(stats)
}

/// What a drive task returns: its operation, its span (a failure is logged in it, so the line
/// carries the operation's trace) and how the drive ended.
type DriveOutcome = (OperationId, tracing::Span, Result<(), AppError>);

/// The drives the workers started, and the little they remember between looks at the queue.
struct Drives {
    /// The drives in progress.
    running: JoinSet<DriveOutcome>,
    /// The operations being driven now: none is dispatched twice at once.
    busy: HashSet<OperationId>,
    /// Operations dispatched less than `redrive_pause` ago, with the version the queue showed
    /// then. The queue lags the log, so right after a drive it may still offer the operation as
    /// it was; the same version within the pause is skipped, a new version is driven at once.
    /// Entries older than the pause are forgotten at every look, so this holds at most what was
    /// dispatched within one pause.
    last_driven: HashMap<OperationId, (Instant, StreamVersion)>,
    /// How long an unchanged operation waits before it is driven again.
    redrive_pause: Duration,
    // Not bounded by a limit: it grows only by operations found undecodable, each one logged
    // and counted, and forgetting one would let a drive decide on a fold that misses an event.
    set_aside: HashSet<OperationId>,
    counters: WorkerCounters,
    stats: WorkerStats,
}

impl Drives {
    fn new(counters: WorkerCounters, redrive_pause: Duration) -> Self {
        Self {
            running: JoinSet::new(),
            busy: HashSet::new(),
            last_driven: HashMap::new(),
            redrive_pause,
            set_aside: HashSet::new(),
            counters,
            stats: WorkerStats::default(),
        }
    }

    /// Starts a drive for each due operation in `queue`, up to `max_concurrent` in progress,
    /// skipping those running now, set aside, or dispatched within the redrive pause at the
    /// version the queue still shows; returns when the next work not offered falls due.
    async fn dispatch_due<S, C, I, P, Q>(
        &mut self,
        engine: &Arc<Engine<S, C, I, P>>,
        queue: &Q,
        now: DateTime<Utc>,
        send_delay: chrono::Duration,
        max_concurrent: usize,
    ) -> Option<DateTime<Utc>>
    where
        S: EventStore + 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
        Q: WorkSource,
    {
        let pause = self.redrive_pause;
        self.last_driven.retain(|_, (at, _)| at.elapsed() < pause);
        let room = max_concurrent.saturating_sub(self.running.len());
        if room == 0 {
            return None;
        }
        // Ask for more than there is room for: some due operations are running or just ran.
        let asked = (room + self.busy.len() + self.last_driven.len()).min(MAX_DUE_PER_LOOK);
        let page: DuePage = match queue.due(now, send_delay, asked).await {
            Ok(page) => page,
            Err(error) => {
                warn!(%error, "cannot read the work queue; looking again after the idle poll");
                return None;
            }
        };
        for item in page.due {
            if self.running.len() >= max_concurrent {
                break;
            }
            let operation_id = item.operation_id;
            let unchanged = self
                .last_driven
                .get(&operation_id)
                .is_some_and(|(_, version)| *version == item.version);
            if unchanged
                || self.busy.contains(&operation_id)
                || self.set_aside.contains(&operation_id)
            {
                continue;
            }
            self.start(engine, operation_id, item.version, item.work);
        }
        page.next_due_at
    }

    /// Starts one drive of `operation_id`, in a span that names it.
    fn start<S, C, I, P>(
        &mut self,
        engine: &Arc<Engine<S, C, I, P>>,
        operation_id: OperationId,
        version: StreamVersion,
        work: opledger_domain::state::Work,
    ) where
        S: EventStore + 'static,
        C: Clock + 'static,
        I: IdSource + 'static,
        P: Providers + 'static,
    {
        debug!(%operation_id, ?work, "dispatching");
        assert!(
            self.busy.insert(operation_id),
            "an operation is driven once at a time"
        );
        self.last_driven
            .insert(operation_id, (Instant::now(), version));
        self.stats.drives += 1;
        let engine = Arc::clone(engine);
        // A root of its own: the engine joins it to the trace its operation was recorded in.
        let span = info_span!(parent: None, "drive", %operation_id, ?work);
        let kept = span.clone();
        self.running.spawn(
            async move {
                (
                    operation_id,
                    kept,
                    engine.drive(operation_id).await.map(drop),
                )
            }
            .in_span(span),
        );
    }

    /// Frees a finished drive's operation and counts a failed drive: the queue offers it again,
    /// unless its stream cannot be decoded, which sets it aside.
    fn finished(&mut self, done: Result<DriveOutcome, JoinError>) {
        let Ok((operation_id, span, result)) = done else {
            return;
        };
        self.busy.remove(&operation_id);
        match result {
            Ok(()) => {}
            Err(AppError::Decode(error)) => {
                self.stats.failed_drives += 1;
                self.counters
                    .undecodable_events
                    .fetch_add(1, Ordering::Relaxed);
                self.set_aside.insert(operation_id);
                warn!(
                    parent: &span,
                    %operation_id,
                    %error,
                    "an event of this operation cannot be decoded; it is no longer driven: \
                     a person must look (opledger verify; opledger trace <operation id>)"
                );
            }
            Err(error) => {
                self.stats.failed_drives += 1;
                warn!(parent: &span, %operation_id, %error, "drive failed; the operation will be driven again");
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
                    if let Some(Ok((operation_id, _, _))) = done {
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
