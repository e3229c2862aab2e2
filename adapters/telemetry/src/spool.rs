//! Finished spans, encoded as OTLP protobuf on the thread where they end, waiting in per-thread
//! queues for the export thread, which frames whatever is queued into one request and posts it
//! (HTTP/protobuf export; gRPC keeps the SDK's batch processor).
//!
//! Why not the SDK's batch processor: it moves each `SpanData` (a few hundred bytes, a `String`
//! or a vector per attribute) through a channel to its thread, which gathers a new vector per
//! batch, encodes from cold memory and frees every string a worker allocated: a send per span,
//! and frees across threads that keep the workers' allocator pages from being reused (seen in
//! profiles of `bench http` with export on). Here a span is encoded where it ends, while its fields are
//! in the cache, its strings are freed by the thread that (almost always) allocated them, and
//! what crosses to the export thread is bytes, taken a whole queue at a time.
//!
//! It must never block the ledger: a push takes its thread's own queue lock (contended only
//! while the export thread swaps the queue out), and a span that finds `OTEL_BSP_MAX_QUEUE_SIZE`
//! spans queued is dropped and counted in `opledger_trace_export_failures_total`. A failed post
//! costs the same count and nothing else. Stopping exports everything queued.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::layer::Backlog;
use crate::otlp_proto::{span_field, Encoder, SpanParts};
use opentelemetry::InstrumentationScope;

/// Queues per spool: each thread pushes to one (chosen round robin at its first span), so the
/// tokio workers of a small machine rarely share one. More than the machine's threads buys
/// nothing; each costs a few hundred bytes when empty.
const MAX_QUEUES: usize = 16;

/// Where a body goes. The export thread owns it; `post` may take the body's buffer (and should
/// hand it back when it can, so the next body reuses its capacity).
pub(crate) trait Post: Send + 'static {
    /// Posts one `ExportTraceServiceRequest` body.
    fn post(&mut self, body: &mut Vec<u8>) -> Result<(), String>;
}

/// How the spool exports: the SDK's `OTEL_BSP_*` meanings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// A post at least this often while spans are queued (`OTEL_BSP_SCHEDULE_DELAY`).
    pub(crate) delay: Duration,
    /// A post as soon as this many spans are queued (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    pub(crate) batch_spans: usize,
}

/// The queues, shared by the layer (pushing) and the export thread.
#[derive(Debug)]
pub(crate) struct Spool {
    queues: Box<[Queue]>,
    backlog: Arc<Backlog>,
    scope: InstrumentationScope,
    batch_spans: usize,
    control: Mutex<Control>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// One thread's (or a few threads') queue, on its own cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Queue {
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Whole `ScopeSpans.spans` fields, back to back.
    bytes: Vec<u8>,
    /// Where each span's field ends in `bytes`, so a post carries at most a batch.
    ends: Vec<usize>,
}

#[derive(Debug, Default)]
struct Control {
    /// A batch's worth is queued: post without waiting for the delay.
    batch_ready: bool,
    stopping: bool,
    /// Flushes asked for and done, so a waiter knows its own is done.
    flushes_asked: u64,
    flushes_done: u64,
}

thread_local! {
    /// This thread's queue (an index into any spool's queues, modulo their count).
    static QUEUE: Cell<Option<usize>> = const { Cell::new(None) };
    /// A span's message while its length is measured; keeps its capacity.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Hands out queues round robin to threads as they push their first span.
static NEXT_QUEUE: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a queue leaves whole span fields in it (a push extends only after
    // encoding); the bytes are still worth exporting.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Spool {
    /// A spool whose export thread encodes with `encoder` (its resource set) and posts with
    /// `post`; `backlog` bounds what is queued.
    pub(crate) fn start(
        encoder: Encoder,
        post: impl Post,
        backlog: Arc<Backlog>,
        scope: InstrumentationScope,
        timing: Timing,
    ) -> Result<Arc<Self>, std::io::Error> {
        let queues = std::thread::available_parallelism()
            .map_or(4, usize::from)
            .clamp(1, MAX_QUEUES);
        let spool = Arc::new(Self {
            queues: (0..queues).map(|_| Queue::default()).collect(),
            backlog,
            scope,
            batch_spans: timing.batch_spans.max(1),
            control: Mutex::new(Control::default()),
            wake: Condvar::new(),
            thread: Mutex::new(None),
        });
        let exporting = Arc::clone(&spool);
        let thread = std::thread::Builder::new()
            .name("opledger-otlp".into())
            .spawn(move || exporting.run(encoder, post, timing.delay))?;
        *lock(&spool.thread) = Some(thread);
        Ok(spool)
    }

    /// Queues `span`, encoded here, or counts it dropped when the queue is full.
    pub(crate) fn push(&self, span: &SpanParts<'_>) {
        let Some(queued) = self.backlog.admit() else {
            return;
        };
        let index = QUEUE.with(|queue| {
            queue.get().unwrap_or_else(|| {
                let assigned = NEXT_QUEUE.fetch_add(1, Ordering::Relaxed);
                queue.set(Some(assigned));
                assigned
            })
        }) % self.queues.len();
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let mut held = lock(&self.queues[index].held);
            let Held { bytes, ends } = &mut *held;
            span_field(span, &mut scratch, bytes);
            ends.push(bytes.len());
        });
        // Once per batch, not per span: the export thread is woken by the push that reaches it.
        if queued == self.batch_spans {
            lock(&self.control).batch_ready = true;
            self.wake.notify_one();
        }
    }

    /// Exports what is queued and waits until it is posted (or failed).
    #[cfg(test)]
    pub(crate) fn flush(&self) {
        let mut control = lock(&self.control);
        if control.stopping {
            return;
        }
        control.flushes_asked += 1;
        let asked = control.flushes_asked;
        self.wake.notify_one();
        while control.flushes_done < asked && !control.stopping {
            control = self
                .wake
                .wait(control)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Exports everything queued and stops the export thread (joined: may block for the post's
    /// timeout).
    pub(crate) fn shutdown(&self) {
        lock(&self.control).stopping = true;
        self.wake.notify_all();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }

    fn run(&self, mut encoder: Encoder, mut post: impl Post, delay: Duration) {
        let mut taken: Vec<Held> = (0..self.queues.len()).map(|_| Held::default()).collect();
        let mut body = Vec::new();
        loop {
            let (stopping, flush) = self.wait(delay);
            // Stopping drains: pushes racing the stop land in a later round.
            while self.export_queued(&mut encoder, &mut post, &mut taken, &mut body) > 0 && stopping
            {
            }
            if let Some(asked) = flush {
                lock(&self.control).flushes_done = asked;
                self.wake.notify_all();
            }
            if stopping {
                return;
            }
        }
    }

    /// Waits for a batch, a flush, the stop or the delay; says whether stopping and which flush
    /// was asked for.
    fn wait(&self, delay: Duration) -> (bool, Option<u64>) {
        let control = lock(&self.control);
        let (mut control, _) = self
            .wake
            .wait_timeout_while(control, delay, |control| {
                !control.batch_ready
                    && !control.stopping
                    && control.flushes_asked == control.flushes_done
            })
            .unwrap_or_else(PoisonError::into_inner);
        control.batch_ready = false;
        let flush =
            (control.flushes_asked != control.flushes_done).then_some(control.flushes_asked);
        (control.stopping, flush)
    }

    #[cfg(test)]
    fn held_spans(&self) -> usize {
        self.queues
            .iter()
            .map(|queue| lock(&queue.held).ends.len())
            .sum()
    }

    /// Takes every queue's spans and posts them, at most a batch per request; returns how many
    /// spans.
    fn export_queued(
        &self,
        encoder: &mut Encoder,
        post: &mut impl Post,
        taken: &mut [Held],
        body: &mut Vec<u8>,
    ) -> usize {
        for (queue, into) in self.queues.iter().zip(taken.iter_mut()) {
            into.bytes.clear();
            into.ends.clear();
            // The queue keeps the emptied buffers of the last round: both keep their capacity.
            std::mem::swap(&mut *lock(&queue.held), into);
        }
        let mut runs: Vec<&[u8]> = Vec::new();
        let (mut in_batch, mut exported) = (0, 0);
        for held in taken.iter() {
            let mut from = 0;
            for end in &held.ends {
                in_batch += 1;
                if in_batch == self.batch_spans {
                    runs.push(&held.bytes[from..*end]);
                    from = *end;
                    self.post_batch(encoder, post, &runs, in_batch, body);
                    exported += in_batch;
                    runs.clear();
                    in_batch = 0;
                }
            }
            if from < held.bytes.len() {
                runs.push(&held.bytes[from..]);
            }
        }
        if in_batch > 0 {
            self.post_batch(encoder, post, &runs, in_batch, body);
            exported += in_batch;
        }
        exported
    }

    fn post_batch(
        &self,
        encoder: &Encoder,
        post: &mut impl Post,
        runs: &[&[u8]],
        spans: usize,
        body: &mut Vec<u8>,
    ) {
        encoder.frame(&self.scope, runs, body);
        let result = post.post(body);
        self.backlog.exported(spans);
        if let Err(error) = result {
            crate::export::count_failure(&error, spans);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
    use prost::Message as _;

    use super::*;

    fn span(number: u64) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(u128::from(number) + 1),
                SpanId::from(number + 1),
                TraceFlags::SAMPLED,
                false,
                Default::default(),
            ),
            parent_span_id: SpanId::INVALID,
            span_kind: SpanKind::Internal,
            name: format!("span {number}").into(),
            start_time: std::time::SystemTime::now(),
            end_time: std::time::SystemTime::now(),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder(crate::TRACER_NAME).build(),
        }
    }

    /// Decodes every body and sends its span names to the test; with `stuck`, waits for the
    /// test's word before each post (a collector that does not answer).
    struct Collector {
        names: mpsc::Sender<Vec<String>>,
        stuck: Option<mpsc::Receiver<()>>,
    }

    impl Post for Collector {
        fn post(&mut self, body: &mut Vec<u8>) -> Result<(), String> {
            if let Some(stuck) = &self.stuck {
                let _ = stuck.recv();
            }
            let request =
                ExportTraceServiceRequest::decode(body.as_slice()).map_err(|e| e.to_string())?;
            let names = request
                .resource_spans
                .iter()
                .flat_map(|resource| &resource.scope_spans)
                .flat_map(|scope| &scope.spans)
                .map(|span| span.name.clone())
                .collect();
            let _ = self.names.send(names);
            Ok(())
        }
    }

    fn spool(limit: usize, batch_spans: usize, post: Collector) -> (Arc<Spool>, Arc<Backlog>) {
        let backlog = Arc::new(Backlog::new(limit));
        let spool = Spool::start(
            Encoder::default(),
            post,
            Arc::clone(&backlog),
            InstrumentationScope::builder(crate::TRACER_NAME).build(),
            Timing {
                // Only batches, flushes and the stop post in these tests.
                delay: Duration::from_secs(3_600),
                batch_spans,
            },
        )
        .expect("the export thread starts");
        (spool, backlog)
    }

    #[test]
    fn stopping_exports_every_queued_span_from_every_thread() {
        let (names, posted) = mpsc::channel();
        let (spool, backlog) = spool(100, 1_000, Collector { names, stuck: None });
        std::thread::scope(|threads| {
            for thread in 0..3 {
                let spool = &spool;
                threads.spawn(move || {
                    for number in 0..5 {
                        spool.push(&SpanParts::of(&span(thread * 10 + number)));
                    }
                });
            }
        });
        spool.shutdown();
        let mut exported: Vec<String> = posted.try_iter().flatten().collect();
        exported.sort();
        let mut expected: Vec<String> = (0..3)
            .flat_map(|thread| (0..5).map(move |number| format!("span {}", thread * 10 + number)))
            .collect();
        expected.sort();
        assert_eq!(exported, expected);
        assert_eq!(backlog.queued(), 0);
        assert_eq!(backlog.dropped(), 0);
    }

    #[test]
    fn a_full_batch_is_posted_without_waiting_for_the_delay_and_a_flush_waits_for_its_post() {
        let (names, posted) = mpsc::channel();
        let (spool, _) = spool(100, 3, Collector { names, stuck: None });
        for number in 0..3 {
            spool.push(&SpanParts::of(&span(number)));
        }
        let batch = posted
            .recv_timeout(Duration::from_secs(10))
            .expect("the batch is posted long before the hour's delay");
        assert_eq!(batch, ["span 0", "span 1", "span 2"]);
        spool.push(&SpanParts::of(&span(3)));
        spool.flush();
        assert_eq!(posted.try_recv().expect("posted by the flush"), ["span 3"]);
        spool.shutdown();
    }

    #[test]
    fn a_post_carries_at_most_a_batch_even_when_more_waited() {
        let (names, posted) = mpsc::channel();
        let (release, stuck) = mpsc::channel();
        let (spool, _) = spool(
            100,
            4,
            Collector {
                names,
                stuck: Some(stuck),
            },
        );
        // The fourth span wakes the export thread, which takes four and sticks in their post
        // while seven more wait.
        for number in 0..4 {
            spool.push(&SpanParts::of(&span(number)));
        }
        while spool.held_spans() > 0 {
            std::thread::yield_now();
        }
        for number in 4..11 {
            spool.push(&SpanParts::of(&span(number)));
        }
        drop(release);
        spool.shutdown();
        let sizes: Vec<usize> = posted.try_iter().map(|names| names.len()).collect();
        assert_eq!(sizes, [4, 4, 3]);
    }

    #[test]
    fn spans_beyond_the_queue_limit_are_dropped_and_counted_without_waiting_for_the_collector() {
        let limit = 4;
        let (names, posted) = mpsc::channel();
        let (release, stuck) = mpsc::channel();
        let (spool, backlog) = spool(
            limit,
            1,
            Collector {
                names,
                stuck: Some(stuck),
            },
        );
        let failures = opledger_domain::trace_context::export_failures();
        // The first span's batch is taken by the export thread, which then sticks in its post:
        // the span is still counted as queued until the post ends.
        spool.push(&SpanParts::of(&span(0)));
        while spool.held_spans() > 0 {
            std::thread::yield_now();
        }
        for number in 1..limit as u64 + 2 {
            spool.push(&SpanParts::of(&span(number)));
        }
        assert_eq!(backlog.dropped(), 2);
        assert!(opledger_domain::trace_context::export_failures() >= failures + 2);
        drop(release);
        spool.shutdown();
        let exported: usize = posted.try_iter().map(|names| names.len()).sum();
        assert_eq!(exported, limit);
        assert_eq!(backlog.queued(), 0);
    }
}
