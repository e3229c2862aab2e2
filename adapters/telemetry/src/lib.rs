//! OpenTelemetry wiring: the `tracing` spans the code already has, exported as OTLP traces, with
//! W3C trace context in and out, and the log format.
//!
//! The rest of the code depends on `tracing` and on the domain's trace context port
//! (`opledger_domain::trace_context`) only; this crate is the one place that knows
//! OpenTelemetry. [`install`] sets up the process's subscriber: the log layer (text or JSON) with
//! the `-v`/`RUST_LOG` filter, and, when export is configured, the span layer (`layer.rs`) with a
//! filter of its own (the ledger's spans at info and above, whatever the log level), sampling
//! parent-based by ratio. HTTP/protobuf spans are encoded where they end into per-thread queues
//! (`spool.rs`) that our own thread posts; gRPC's go to the SDK's batch processor, which exports
//! on its own thread.
//!
//! It must never make the ledger wait for, or fail because of, a collector: spans are queued
//! (bounded, the overflow dropped) and exported in the background, and a failed export or a
//! dropped span costs a count in `/metrics` (`opledger_trace_export_failures_total`). With export off and text logs,
//! nothing here runs per request.

#![forbid(unsafe_code)]

pub mod config;
mod context;
mod export;
mod json_log;
mod layer;
#[cfg(test)]
mod layer_cost;
mod log_filter;
mod otlp_proto;
mod scrubbed;
mod spool;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SpanProcessor};
use opentelemetry_sdk::Resource;
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use config::{ConfigError, Export, LogFormat, Protocol, Sampling, Settings};

use layer::{Backlog, Sink, SpanLayer};
use log_filter::LogFilter;

/// The instrumentation scope's name on every exported span.
const TRACER_NAME: &str = "opledger";

/// The instrumentation scope of every exported span.
fn scope() -> opentelemetry::InstrumentationScope {
    opentelemetry::InstrumentationScope::builder(TRACER_NAME).build()
}

/// Telemetry that could not be started.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The OTLP exporter could not be built from checked settings (a TLS or runtime problem).
    #[error("the OTLP trace exporter could not be built: {0}")]
    Exporter(String),
    /// A subscriber was set already.
    #[error("logging was set up twice: {0}")]
    Subscriber(String),
}

/// Keeps the exporter; [`Telemetry::shutdown`] exports what is queued before the process ends.
#[derive(Debug, Default)]
pub struct Telemetry {
    sink: Option<Arc<Sink>>,
}

impl Telemetry {
    /// Exports what is queued (bounded by the export timeout) and stops the exporter. Called
    /// from a thread that may block: the export thread is joined.
    pub fn shutdown(self) {
        if let Some(sink) = self.sink {
            sink.shutdown();
        }
    }

    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.sink.is_some()
    }
}

/// Installs the process's subscriber: logs on stderr in `settings.log_format` filtered by
/// `log_filter()`, and the trace exporter when `settings.export` says so. `log_filter` is called
/// twice when spans are traced: the log layer's filter, and a copy the span layer asks about
/// the callsites it does not export (`layer.rs`, `register_callsite`), so both must be the
/// same filter. Call it inside the tokio runtime (the gRPC exporter's channel is built on it).
pub fn install(
    settings: &Settings,
    log_filter: impl Fn() -> EnvFilter,
) -> Result<Telemetry, InitError> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let log_layer = match settings.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(scrubbed::Stderr)
            .with_ansi(ansi)
            .with_filter(LogFilter::of(log_filter()))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(json_log::JsonWithTrace)
            .with_writer(scrubbed::Stderr)
            .with_filter(LogFilter::of(log_filter()))
            .boxed(),
    };
    let sink = settings
        .export
        .as_ref()
        .map(exporting_sink)
        .transpose()?
        .map(Arc::new);
    // JSON logs carry trace ids even with export off, so a caller's `traceparent` still ties
    // their trace to these lines: the span layer runs, with nowhere to send spans.
    let sampling = settings
        .export
        .as_ref()
        .map_or(Sampling::EVERY_TRACE, |export| export.sampling);
    let span_layer = match (&settings.export, settings.log_format) {
        (Some(_), _) | (None, LogFormat::Json) => Some(span_layer(
            sink.clone(),
            sampling,
            Some(LogFilter::of(log_filter())),
        )),
        (None, LogFormat::Text) => None,
    };
    let tracing_spans = span_layer.is_some();
    tracing_subscriber::registry()
        .with(log_layer)
        .with(span_layer)
        .try_init()
        .map_err(|error| InitError::Subscriber(error.to_string()))?;
    if tracing_spans {
        opledger_domain::trace_context::install(Box::new(context::Adapter::new(sampling)));
    }
    Ok(Telemetry { sink })
}

/// The layer giving the ledger's spans OpenTelemetry ids and sending them to `sink`.
/// No per-layer filter: the layer decides its interest once per callsite with
/// [`exported`] and, for every other callsite, `logged` (a copy of the log layer's filter).
fn span_layer(sink: Option<Arc<Sink>>, sampling: Sampling, logged: Option<LogFilter>) -> SpanLayer {
    SpanLayer::new(sink, sampling, logged)
}

/// The target prefix of the ledger's own spans (a prefix covers every `opledger_*` crate).
const OUR_TARGET: &str = "opledger";
/// The CRM stand's target: a test and demo tool standing in for a CRM, whose own tracing (where
/// it has any) goes to its own collector. `opledger bench http` and `demo` run it in the server's
/// process, where exporting its spans would be counted as the ledger's cost.
const STAND_TARGET: &str = "opledger_crm_stand";

/// What the OpenTelemetry layer sees, whatever the log level says: the ledger's own spans at info
/// and above, and of its log lines only warnings and errors, as events on their span (an outcome
/// unknown with its error). Nobody else's: the HTTP clients' own spans would include the
/// exporter's requests. Info lines say what a span's `state` and `external_id` say already, and
/// each would cost an event on its span (five per operation in `bench http`); they stay in the
/// logs. Decided once per call site (tracing caches the answer).
fn exported(meta: &tracing::Metadata<'_>) -> bool {
    let target = meta.target();
    let ours = target.starts_with(OUR_TARGET) && !target.starts_with(STAND_TARGET);
    let level = if meta.is_span() {
        Level::INFO
    } else {
        Level::WARN
    };
    ours && *meta.level() <= level
}

fn exporting_sink(export: &Export) -> Result<Sink, InitError> {
    let timeout = Duration::from_millis(export.export_timeout_ms);
    match export.protocol {
        Protocol::HttpProtobuf => {
            let exporter = export::OtlpHttp::new(export.endpoint.clone(), &export.headers, timeout)
                .map_err(InitError::Exporter)?;
            let mut encoder = otlp_proto::Encoder::default();
            encoder.set_resource(&resource(export));
            let spool = spool::Spool::start(
                encoder,
                exporter,
                Arc::new(Backlog::new(export.max_queued_spans)),
                scope(),
                spool::Timing {
                    delay: Duration::from_millis(export.schedule_delay_ms),
                    batch_spans: export.max_export_batch_spans,
                },
            )
            .map_err(|error| InitError::Exporter(error.to_string()))?;
            Ok(Sink::spooled(spool))
        }
        // gRPC keeps opentelemetry-otlp's exporter (tonic): the less common choice, and a
        // second transport for the encoder would be a gRPC client of our own.
        Protocol::Grpc => {
            let mut headers = http::HeaderMap::new();
            for (name, value) in &export.headers {
                // Both were checked as HTTP header name and value when the settings were read.
                if let (Ok(name), Ok(value)) = (
                    http::HeaderName::from_bytes(name.as_bytes()),
                    http::HeaderValue::from_str(value),
                ) {
                    headers.insert(name, value);
                }
            }
            let metadata =
                opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(headers);
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(export.endpoint.clone())
                .with_timeout(timeout)
                .with_metadata(metadata)
                .build()
                .map_err(|error| InitError::Exporter(error.to_string()))?;
            Ok(sink_exporting_to(exporter, export))
        }
    }
}

/// The SDK's batch processor (its own thread, its batching, its shutdown) exporting to
/// `exporter`, fed by the span layer directly: no tracer provider, sampler or span builder in
/// between (the layer samples and builds each `SpanData` itself).
fn sink_exporting_to(
    exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static,
    export: &Export,
) -> Sink {
    let backlog = Arc::new(Backlog::new(export.max_queued_spans));
    // The `OTEL_BSP_*` values as the settings read and checked them (the builder's default reads
    // the variables again, and takes its default for a malformed one).
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(export.max_queued_spans)
        .with_scheduled_delay(Duration::from_millis(export.schedule_delay_ms))
        .with_max_export_batch_size(export.max_export_batch_spans)
        .build();
    let mut processor =
        BatchSpanProcessor::builder(export::Counted::new(exporter, Arc::clone(&backlog)))
            .with_batch_config(config)
            .build();
    processor.set_resource(&resource(export));
    Sink::new(Box::new(processor), backlog)
}

/// The process's resource: its service name, the build's version, and an id of this process
/// (`service.instance.id`: the instance's own id when it has one, so its spans are found by the
/// id its logs, metrics and ledger events carry; else random per start, as the conventions ask),
/// so two instances' spans are told apart in a collector.
fn resource(export: &Export) -> Resource {
    Resource::builder()
        .with_service_name(export.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            export.instance_id.clone().unwrap_or_else(instance_id),
        ))
        .build()
}

/// A random 128-bit id written as a UUID (version 4 bits set), from the SDK's id generator.
fn instance_id() -> String {
    use opentelemetry_sdk::trace::IdGenerator as _;
    let random = u128::from_be_bytes(
        opentelemetry_sdk::trace::RandomIdGenerator::default()
            .new_trace_id()
            .to_bytes(),
    );
    let uuid = (random & !(0xf << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let hex = format!("{uuid:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledgers_spans_are_exported_with_its_warnings_but_not_its_info_lines_nor_the_stands_spans(
    ) {
        let spans = layer::testing::spans_of(1.0, || {
            tracing::info_span!("send").in_scope(|| {
                tracing::info!("confirmed");
                tracing::warn!("outcome unknown");
                tracing::info_span!(target: "opledger_crm_stand::exchange", "stand.request")
                    .in_scope(|| {});
            });
        });
        let names: Vec<&str> = spans.iter().map(|span| span.name.as_ref()).collect();
        assert_eq!(names, ["send"]);
        let events: Vec<&str> = spans[0]
            .events
            .iter()
            .map(|event| event.name.as_ref())
            .collect();
        assert_eq!(events, ["outcome unknown"]);
    }
}
