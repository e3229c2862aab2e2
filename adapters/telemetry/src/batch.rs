//! The export queue and its thread: finished spans pushed by the span layer into one bounded
//! vector, taken whole by a thread of its own and exported in batches.
//!
//! Ours instead of the SDK's batch processor, for what that cost on its thread (README, "Trace
//! export"): a fresh `Vec<SpanData>` per batch, whose pages the kernel zeroed, and every span
//! moved through a channel. Here the pushers and the thread swap two vectors that keep their
//! capacity, and HTTP/protobuf batches are encoded from a slice.
//!
//! It must never block the ledger: a push takes a short lock and never waits for an export; a
//! span that finds `max_queued_spans` waiting is dropped and counted in
//! `opledger_trace_export_failures_total`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry_sdk::trace::SpanData;

/// Spans per export request, at most (the SDK's `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` default).
pub(crate) const MAX_EXPORT_BATCH_SPANS: usize = 512;
/// How long a span may wait for a batch to fill before it is exported anyway, in milliseconds
/// (the SDK's `OTEL_BSP_SCHEDULE_DELAY` default).
pub(crate) const EXPORT_DELAY_MS: u64 = 5_000;

/// Where batches go: the HTTP/protobuf exporter (from a slice) or gRPC's (an owned batch).
pub(crate) trait Exporter: Send + 'static {
    /// Exports `spans`, which the caller clears afterwards.
    fn export(&mut self, spans: &mut Vec<SpanData>) -> Result<(), String>;
}

/// The queue, shared by the span layer's pushes and the export thread.
#[derive(Debug)]
pub(crate) struct Batcher {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// The export thread waits on it for a full batch or the stop.
    wake: Condvar,
    max_queued_spans: usize,
    batch_spans: usize,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    spans: Vec<SpanData>,
    stop: bool,
}

impl Batcher {
    /// Starts the export thread. `max_queued_spans` bounds what waits; batches are at most
    /// `batch_spans`.
    pub(crate) fn start(
        exporter: impl Exporter,
        max_queued_spans: usize,
        batch_spans: usize,
    ) -> std::io::Result<Self> {
        assert!(batch_spans >= 1 && max_queued_spans >= 1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                spans: Vec::with_capacity(max_queued_spans),
                ..State::default()
            }),
            wake: Condvar::new(),
            max_queued_spans,
            batch_spans: batch_spans.min(max_queued_spans),
            dropped: AtomicU64::new(0),
        });
        let thread = std::thread::Builder::new()
            .name("opledger-trace-export".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || export_loop(&shared, exporter)
            })?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues `span`, or drops and counts it when the queue is full.
    pub(crate) fn push(&self, span: SpanData) {
        let shared = &*self.shared;
        let mut state = lock(&shared.state);
        if state.stop {
            // The process is ending: nothing left to count it against.
            return;
        }
        if state.spans.len() >= shared.max_queued_spans {
            drop(state);
            shared.dropped.fetch_add(1, Ordering::Relaxed);
            opledger_domain::trace_context::count_export_failure();
            return;
        }
        state.spans.push(span);
        let full = state.spans.len() == shared.batch_spans;
        drop(state);
        if full {
            shared.wake.notify_one();
        }
    }

    /// Exports what is queued and stops the thread (each export bounded by its timeout).
    pub(crate) fn shutdown(&self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_one();
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            // A panicked export thread has nothing left to export.
            let _ = thread.join();
        }
    }

    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// A poisoned lock only means a pusher panicked between two lines that leave the vector whole.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn export_loop(shared: &Shared, mut exporter: impl Exporter) {
    let delay = Duration::from_millis(EXPORT_DELAY_MS);
    // The vector the thread exports from; swapped with the queue's, so both keep their capacity.
    let mut taken: Vec<SpanData> = Vec::with_capacity(shared.max_queued_spans);
    let mut batch: Vec<SpanData> = Vec::with_capacity(shared.batch_spans);
    let mut deadline = Instant::now() + delay;
    loop {
        let mut state = lock(&shared.state);
        while state.spans.len() < shared.batch_spans && !state.stop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            state = shared
                .wake
                .wait_timeout(state, deadline - now)
                .map(|(state, _)| state)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
        std::mem::swap(&mut state.spans, &mut taken);
        let stop = state.stop;
        drop(state);
        deadline = Instant::now() + delay;
        export_all(&mut exporter, &mut taken, &mut batch, shared.batch_spans);
        if stop {
            return;
        }
    }
}

/// Exports `taken` in batches of at most `batch_spans`, leaving it empty with its capacity.
fn export_all(
    exporter: &mut impl Exporter,
    taken: &mut Vec<SpanData>,
    batch: &mut Vec<SpanData>,
    batch_spans: usize,
) {
    if taken.len() <= batch_spans {
        export_counted(exporter, taken);
        taken.clear();
        return;
    }
    let mut spans = taken.drain(..);
    loop {
        batch.extend(spans.by_ref().take(batch_spans));
        if batch.is_empty() {
            return;
        }
        export_counted(exporter, batch);
        batch.clear();
    }
}

/// One export; a failure counts in `/metrics` and is logged on the 1st, 2nd, 4th, 8th… (a
/// collector that is down must not flood the logs either).
fn export_counted(exporter: &mut impl Exporter, spans: &mut Vec<SpanData>) {
    if spans.is_empty() {
        return;
    }
    let count = spans.len();
    if let Err(error) = exporter.export(spans) {
        opledger_domain::trace_context::count_export_failure();
        let failures = opledger_domain::trace_context::export_failures();
        if failures.is_power_of_two() {
            tracing::warn!(%error, spans = count, failures, "trace export failed; the spans are dropped");
        }
    }
}
