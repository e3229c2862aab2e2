//! The domain's trace context port, implemented with OpenTelemetry's W3C propagator.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::{OpenTelemetrySpanExt, OtelData};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Registry;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

pub(crate) struct Adapter {
    propagator: TraceContextPropagator,
}

impl Adapter {
    pub(crate) fn new() -> Self {
        Self {
            propagator: TraceContextPropagator::new(),
        }
    }

    fn extract(&self, traceparent: &str, tracestate: Option<&str>) -> Context {
        self.propagator.extract(&Incoming {
            traceparent,
            tracestate,
        })
    }
}

/// The headers a context is read from, borrowed: the propagator asks for two keys, and a map of
/// owned strings would cost four allocations on every request and every drive.
struct Incoming<'a> {
    traceparent: &'a str,
    tracestate: Option<&'a str>,
}

impl Extractor for Incoming<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(self.traceparent),
            TRACESTATE => self.tracestate,
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// Keeps the `traceparent` the propagator writes and nothing else (no map, no key copies).
#[derive(Default)]
struct Outgoing(Option<String>);

impl Injector for Outgoing {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.0 = Some(value);
        }
    }
}

/// Whether `span` has an OpenTelemetry parent: a caller's context, or a span of this process.
/// `None` when the span is not recorded at all.
fn has_parent(span: &tracing::Span) -> Option<bool> {
    let mut found = None;
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<Registry>()?;
        let data = registry.span(id)?;
        let extensions = data.extensions();
        found = extensions
            .get::<OtelData>()
            .map(|otel| otel.parent_cx.has_active_span());
        Some(())
    });
    found
}

impl opledger_domain::trace_context::TraceContext for Adapter {
    fn traceparent_of(&self, span: &tracing::Span) -> Option<String> {
        let context = span.context();
        if !context.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = Outgoing::default();
        self.propagator.inject_context(&context, &mut carrier);
        carrier.0
    }

    fn set_remote_parent(&self, span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
        let context = self.extract(traceparent, tracestate);
        if context.span().span_context().is_valid() {
            span.set_parent(context);
        }
    }

    fn continue_from(&self, span: &tracing::Span, stored: &str) {
        let origin = self.extract(stored, None);
        let origin = origin.span().span_context().clone();
        if !origin.is_valid() {
            return;
        }
        let current = span.context().span().span_context().trace_id();
        if current == origin.trace_id() || current == TraceId::INVALID {
            return;
        }
        match has_parent(span) {
            // A span that started a trace of its own (a worker's drive): it belongs to the
            // operation's trace instead, so the whole history is one trace.
            Some(false) => span.set_parent(Context::new().with_remote_span_context(origin)),
            // Work inside someone else's trace (an operator's request): linked.
            Some(true) => span.add_link_with_attributes(
                origin,
                vec![KeyValue::new("opledger.link", "operation_intent")],
            ),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use opledger_domain::trace_context::TraceContext as _;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    const STORED_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const STORED_SPAN: &str = "00f067aa0ba902b7";

    fn stored() -> String {
        format!("00-{STORED_TRACE}-{STORED_SPAN}-01")
    }

    /// Runs `work` under a subscriber exporting to memory (a unit test's double of a collector)
    /// and returns the finished spans.
    fn spans_of(work: impl FnOnce()) -> Vec<SpanData> {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, work);
        provider.force_flush().expect("flushed");
        exporter.get_finished_spans().expect("spans")
    }

    fn named<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
        spans
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no span {name}"))
    }

    #[test]
    fn a_span_that_starts_a_trace_joins_the_stored_one_as_its_child() {
        let spans = spans_of(|| {
            let drive = tracing::info_span!("drive");
            Adapter::new().continue_from(&drive, &stored());
            drive.in_scope(|| tracing::info_span!("lookup").in_scope(|| {}));
        });
        let (drive, lookup) = (named(&spans, "drive"), named(&spans, "lookup"));
        assert_eq!(drive.span_context.trace_id().to_string(), STORED_TRACE);
        assert_eq!(drive.parent_span_id, SpanId::from_hex(STORED_SPAN).unwrap());
        assert_eq!(lookup.span_context.trace_id().to_string(), STORED_TRACE);
        assert!(drive.links.is_empty());
    }

    #[test]
    fn a_span_inside_another_trace_is_linked_to_the_stored_one_and_keeps_its_parent() {
        let spans = spans_of(|| {
            let request = tracing::info_span!("request");
            let execute = request.in_scope(|| tracing::info_span!("execute"));
            Adapter::new().continue_from(&execute, &stored());
            execute.in_scope(|| {});
            drop(execute);
        });
        let (request, execute) = (named(&spans, "request"), named(&spans, "execute"));
        assert_eq!(
            execute.span_context.trace_id(),
            request.span_context.trace_id()
        );
        assert_eq!(execute.parent_span_id, request.span_context.span_id());
        let links: Vec<String> = execute
            .links
            .iter()
            .map(|link| link.span_context.trace_id().to_string())
            .collect();
        assert_eq!(links, [STORED_TRACE]);
    }

    #[test]
    fn a_remote_parent_is_taken_from_a_traceparent_and_given_back_for_a_child() {
        let mut header = None;
        let spans = spans_of(|| {
            let adapter = Adapter::new();
            let request = tracing::info_span!("request");
            adapter.set_remote_parent(&request, &stored(), Some("vendor=x"));
            let send = request.in_scope(|| tracing::info_span!("send"));
            header = adapter.traceparent_of(&send);
            // Garbage is ignored, as W3C Trace Context says: the span keeps its own trace.
            let other = tracing::info_span!("other");
            adapter.set_remote_parent(&other, "00-zzzz-yyyy-01", None);
            other.in_scope(|| {});
            send.in_scope(|| {});
        });
        let (request, send) = (named(&spans, "request"), named(&spans, "send"));
        assert_eq!(
            request.parent_span_id,
            SpanId::from_hex(STORED_SPAN).unwrap()
        );
        assert_eq!(
            header,
            Some(format!(
                "00-{STORED_TRACE}-{}-01",
                send.span_context.span_id()
            ))
        );
        assert_ne!(
            named(&spans, "other").span_context.trace_id().to_string(),
            STORED_TRACE
        );
    }
}
