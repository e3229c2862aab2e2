//! The domain's trace context port, implemented with OpenTelemetry's W3C propagator.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
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
        let mut carrier = HashMap::with_capacity(2);
        carrier.insert(TRACEPARENT.to_owned(), traceparent.to_owned());
        if let Some(tracestate) = tracestate {
            carrier.insert(TRACESTATE.to_owned(), tracestate.to_owned());
        }
        self.propagator.extract(&carrier)
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
        let mut carrier = HashMap::with_capacity(2);
        self.propagator.inject_context(&context, &mut carrier);
        carrier.remove(TRACEPARENT)
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
