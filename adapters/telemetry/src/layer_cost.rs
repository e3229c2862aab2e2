//! What recording and ending one of the ledger's spans costs the thread that does it, export on
//! (HTTP/protobuf's spool, posting nowhere): a measurement, not a check, run by hand against two
//! builds (README, "Trace export", the s41b round):
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
    let subscriber =
        tracing_subscriber::registry().with(crate::span_layer(Some(Arc::clone(&sink)), 1.0, None));
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
