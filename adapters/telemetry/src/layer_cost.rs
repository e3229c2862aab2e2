//! What recording and ending one of the ledger's spans costs the thread that does it, export on
//! (HTTP/protobuf's spool, posting nowhere): a measurement, not a check, run by hand against two
//! builds:
//! `cargo test --release -p opledger-telemetry layer_cost -- --ignored --nocapture`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;

use crate::layer::{Backlog, Sink};
use crate::otlp_proto::Encoder;
use crate::spool::{Post, Spool, Timing};

struct Discard;

impl Post for Discard {
    fn post(&mut self, _: &mut Vec<u8>) -> Result<(), String> {
        Ok(())
    }
}

/// This thread's user and system CPU, in clock ticks (1/100 s on Linux).
fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("the thread's stat");
    let after_name = &stat[stat.rfind(')').expect("a name") + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // Fields 14 and 15 (utime, stime); `after_name` starts at field 3.
    let ticks = |index: usize| fields[index].parse::<u64>().expect("a tick count");
    ticks(11) + ticks(12)
}

const SPANS: u64 = 2_000_000;

#[test]
#[ignore = "a measurement, run by hand"]
fn layer_cost_of_a_recorded_span() {
    let backlog = Arc::new(Backlog::new(1 << 22));
    let timing = Timing {
        delay: Duration::from_millis(5),
        batch_spans: 512,
    };
    let spool =
        Spool::start(Encoder::default(), Discard, backlog, crate::scope(), timing).expect("spool");
    let sink = Arc::new(Sink::spooled(spool));
    let subscriber = tracing_subscriber::registry().with(crate::span_layer(
        Some(Arc::clone(&sink)),
        crate::layer::Sampling::EVERY_TRACE,
        None,
    ));
    tracing::subscriber::with_default(subscriber, || {
        let (ticks, wall) = (thread_cpu_ticks(), Instant::now());
        for number in 0..SPANS {
            // A `send` span's shape: an id by Display, a tenant, a number, two fields recorded
            // later, and its kind.
            let span = tracing::info_span!(
                target: "opledger_engine",
                "send",
                operation_id = %format_args!("op_{number:032}"),
                tenant = "acme",
                attempt = number,
                state = tracing::field::Empty,
                external_id = tracing::field::Empty,
                otel.kind = "client",
            );
            span.record("state", "succeeded");
            span.record("external_id", number);
            drop(span);
        }
        let ticks = thread_cpu_ticks() - ticks;
        println!(
            "layer_cost: {:.3} µs of the thread's CPU per span ({ticks} ticks, {:?} wall)",
            ticks as f64 * 10_000.0 / SPANS as f64,
            wall.elapsed()
        );
    });
    sink.shutdown();
}

/// How many times each step of [`layer_cost_of_entering_a_span`] runs.
const ENTERS: u64 = 10_000_000;

/// The thread's CPU per run of `step`, in µs, over [`ENTERS`] runs.
fn per_run(step: &mut dyn FnMut()) -> f64 {
    let ticks = thread_cpu_ticks();
    for _ in 0..ENTERS {
        step();
    }
    (thread_cpu_ticks() - ticks) as f64 * 10_000.0 / ENTERS as f64
}

/// What one enter and exit of an exported span costs with the subscriber `install` builds (the
/// registry, the log layer with its per-layer filter, the span layer), with the log at `warn`
/// (the default: the log's filter disables the ledger's spans) and at `info` (`-v`: it enables
/// them), its filter an `EnvFilter` or the [`LogFilter`](crate::log_filter::LogFilter) `install`
/// makes of it; and what a finished future costs in `tracing`'s `Instrumented` against the
/// domain's `InSpan`: multiply by the enters an operation
/// makes to price them.
#[test]
#[ignore = "a measurement, run by hand"]
fn layer_cost_of_entering_a_span() {
    use crate::log_filter::LogFilter;
    use tracing_subscriber::EnvFilter;
    for directives in ["warn", "info"] {
        let env = || EnvFilter::new(directives);
        entering_a_span(
            &format!("{directives}, EnvFilter"),
            env(),
            LogFilter::of(env()),
        );
        let ours = LogFilter::of(env());
        assert!(matches!(ours, LogFilter::Targets(_)));
        entering_a_span(
            &format!("{directives}, LogFilter"),
            ours,
            LogFilter::of(env()),
        );
    }
}

fn entering_a_span<F>(label: &str, log_filter: F, logged: crate::log_filter::LogFilter)
where
    F: tracing_subscriber::layer::Filter<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    use opledger_domain::in_span::InSpanExt;
    use std::future::Future;
    use tracing::Instrument;
    use tracing_subscriber::Layer;

    let log_layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::sink)
        .with_filter(log_filter);
    let subscriber = tracing_subscriber::registry()
        .with(log_layer)
        .with(crate::span_layer(
            None,
            crate::layer::Sampling::EVERY_TRACE,
            Some(logged),
        ));
    tracing::subscriber::with_default(subscriber, || {
        let request = tracing::info_span!(target: "opledger_http_api", "POST /v1/operations");
        let _request = request.enter();
        let send = tracing::info_span!(target: "opledger_engine", "send");
        let enter_exit = per_run(&mut || drop(send.enter()));
        let clone_drop = per_run(&mut || drop(send.clone()));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let instrumented = per_run(&mut || {
            let mut future = std::pin::pin!(std::future::ready(1).instrument(send.clone()));
            assert!(future.as_mut().poll(&mut cx).is_ready());
        });
        let in_span = per_run(&mut || {
            let mut future = std::pin::pin!(std::future::ready(1).in_span(send.clone()));
            assert!(future.as_mut().poll(&mut cx).is_ready());
        });
        println!(
            "layer_cost ({label}): µs of the thread's CPU: enter and exit {enter_exit:.4}, span clone and drop {clone_drop:.4}, a finished future in Instrumented {instrumented:.4}, in InSpan {in_span:.4}"
        );
    });
}
