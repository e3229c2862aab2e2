//! The domain's trace context port, implemented with OpenTelemetry's W3C propagator.

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::KeyValue;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Registry;

use crate::layer::{Sampling, SpanRecord};

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

pub(crate) struct Adapter {
    propagator: TraceContextPropagator,
    /// Decides a span's sampling when it gets a remote parent (the span layer's, for spans that
    /// start a trace).
    sampling: Sampling,
}

impl Adapter {
    pub(crate) fn new(sampling: Sampling) -> Self {
        Self {
            propagator: TraceContextPropagator::new(),
            sampling,
        }
    }

    /// The span context a `traceparent` names, when it is valid (W3C Trace Context: garbage is
    /// ignored).
    fn extract(&self, traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
        let traceparent = known_flags_only(traceparent)?;
        let context = self.propagator.extract(&Incoming {
            traceparent: &traceparent,
            tracestate,
        });
        let span = context.span().span_context().clone();
        span.is_valid().then_some(span)
    }
}

/// `traceparent` with the trace flags this version knows only (the sampled bit), so a caller
/// setting others is followed rather than ignored. W3C Trace Context says a receiver ignores the
/// flag bits it does not know, not the header: Level 2 adds the random-trace-id bit (`03` is
/// what the Python OpenTelemetry SDK sends for a sampled trace), and more may come. The SDK's
/// propagator refuses a version-00 header with any flag above `02`, so the flags are masked
/// before it reads them. `None` for a version-00 header whose flags are not two hex digits.
fn known_flags_only(traceparent: &str) -> Option<std::borrow::Cow<'_, str>> {
    const SAMPLED: u8 = 0x01;
    let traceparent = traceparent.trim();
    if !traceparent.starts_with("00-") {
        // Another version: the propagator's own rules.
        return Some(traceparent.into());
    }
    // version (2) - trace id (32) - parent id (16) - flags (2): the flags start at 53.
    let (head, flags) = traceparent.split_at_checked(53)?;
    if !head.ends_with('-') || flags.len() != 2 || !flags.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let value = u8::from_str_radix(flags, 16).ok()?;
    Some(if value > SAMPLED {
        format!("{head}{:02x}", value & SAMPLED).into()
    } else {
        traceparent.into()
    })
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

/// Runs `work` on the layer's record of `span`, or of the closest span around it that has one
/// (a span only the log wants, a debug one with `-vv`, has none); `None` when there is none at
/// all (disabled, or no layer of ours in the process's subscriber).
pub(crate) fn with_record<T>(
    span: &tracing::Span,
    work: impl FnOnce(&mut SpanRecord) -> T,
) -> Option<T> {
    span.with_subscriber(|(id, dispatch)| with_record_of(id, dispatch, work))
        .flatten()
}

/// [`with_record`] of the span `id` in `dispatch`.
fn with_record_of<T>(
    id: &tracing::Id,
    dispatch: &tracing::Dispatch,
    work: impl FnOnce(&mut SpanRecord) -> T,
) -> Option<T> {
    let registry = dispatch.downcast_ref::<Registry>()?;
    let recorded = registry
        .span(id)?
        .scope()
        .find(|span| span.extensions().get::<SpanRecord>().is_some())?;
    let mut extensions = recorded.extensions_mut();
    extensions.get_mut::<SpanRecord>().map(work)
}

impl opledger_domain::trace_context::TraceContext for Adapter {
    fn traceparent_of(&self, span: &tracing::Span) -> Option<String> {
        with_record(span, |record| record.traceparent())
    }

    /// Read where the current span is, by its id: no `Span` handle cloned and dropped for it.
    fn traceparent_of_current(&self) -> Option<String> {
        tracing::dispatcher::get_default(|dispatch| {
            let current = dispatch.current_span();
            with_record_of(current.id()?, dispatch, |record| record.traceparent())
        })
    }

    fn set_remote_parent(&self, span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
        if let Some(parent) = self.extract(traceparent, tracestate) {
            let sampled = self.sampling.samples_child_of(&parent);
            with_record(span, |record| record.set_remote_parent(&parent, sampled));
        }
    }

    fn continue_from(&self, span: &tracing::Span, stored: &str) {
        let Some(origin) = self.extract(stored, None) else {
            return;
        };
        with_record(span, |record| {
            if record.trace_id == origin.trace_id() {
                return;
            }
            if record.parent_span_id == opentelemetry::trace::SpanId::INVALID && !record.serves() {
                // A span that started a trace of its own (a worker's drive): it belongs to the
                // operation's trace instead, so the whole history is one trace.
                record.set_remote_parent(&origin, self.sampling.samples_child_of(&origin));
            } else {
                // Work inside someone else's trace (an operator's request, whether its caller
                // sent a `traceparent` or not: the request's span is its caller's): linked.
                record.add_link(
                    origin,
                    vec![KeyValue::new("opledger.link", "operation_intent")],
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::SpanId;
    use opentelemetry_sdk::trace::SpanData;
    use opledger_domain::trace_context::TraceContext as _;

    use super::*;

    const STORED_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const STORED_SPAN: &str = "00f067aa0ba902b7";

    fn stored() -> String {
        format!("00-{STORED_TRACE}-{STORED_SPAN}-01")
    }

    /// Runs `work` under a subscriber exporting to memory (a unit test's double of a collector)
    /// and returns the finished spans.
    fn spans_of(work: impl FnOnce()) -> Vec<SpanData> {
        crate::layer::testing::spans_of(1.0, work)
    }

    /// The trace ids `span` is linked to, in order.
    fn linked_traces(span: &SpanData) -> Vec<String> {
        span.links
            .iter()
            .map(|link| link.span_context.trace_id().to_string())
            .collect()
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
            Adapter::new(Sampling::EVERY_TRACE).continue_from(&drive, &stored());
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
            Adapter::new(Sampling::EVERY_TRACE).continue_from(&execute, &stored());
            execute.in_scope(|| {});
            drop(execute);
        });
        let (request, execute) = (named(&spans, "request"), named(&spans, "execute"));
        assert_eq!(
            execute.span_context.trace_id(),
            request.span_context.trace_id()
        );
        assert_eq!(execute.parent_span_id, request.span_context.span_id());
        assert_eq!(linked_traces(execute), [STORED_TRACE]);
    }

    #[test]
    fn a_request_span_without_a_caller_is_linked_to_the_stored_trace_not_moved_into_it() {
        let spans = spans_of(|| {
            let request = tracing::info_span!("request", otel.kind = "server");
            Adapter::new(Sampling::EVERY_TRACE).continue_from(&request, &stored());
            request.in_scope(|| tracing::info_span!("claim").in_scope(|| {}));
        });
        let (request, claim) = (named(&spans, "request"), named(&spans, "claim"));
        assert_eq!(request.parent_span_id, SpanId::INVALID);
        assert_ne!(request.span_context.trace_id().to_string(), STORED_TRACE);
        assert_eq!(
            claim.span_context.trace_id(),
            request.span_context.trace_id()
        );
        assert_eq!(linked_traces(request), [STORED_TRACE]);
    }

    #[test]
    fn a_span_only_the_log_wants_speaks_for_the_exported_span_around_it() {
        let adapter = Adapter::new(Sampling::EVERY_TRACE);
        let mut headers = (None, None);
        let (spans, _) = crate::layer::testing::spans_and_log("debug", || {
            let request = tracing::info_span!("request", otel.kind = "server");
            let execute = request.in_scope(|| tracing::debug_span!("execute"));
            adapter.continue_from(&execute, &stored());
            headers = (
                adapter.traceparent_of(&execute),
                adapter.traceparent_of(&request),
            );
            drop(execute);
        });
        let request = named(&spans, "request");
        assert_eq!(spans.len(), 1, "{spans:?}");
        assert!(headers.0.is_some());
        assert_eq!(headers.0, headers.1);
        assert_eq!(request.links.len(), 1, "{request:?}");
    }

    #[test]
    fn the_current_spans_traceparent_is_read_in_place_as_its_handle_would_give_it() {
        let adapter = Adapter::new(Sampling::EVERY_TRACE);
        let mut read = Vec::new();
        crate::layer::testing::spans_and_log("debug", || {
            read.push(("outside", adapter.traceparent_of_current(), None));
            let request = tracing::info_span!("request", otel.kind = "server");
            let send = request.in_scope(|| tracing::info_span!("send"));
            let execute = send.in_scope(|| tracing::debug_span!("execute"));
            for (name, span) in [
                ("request", &request),
                ("send", &send),
                ("execute", &execute),
            ] {
                span.in_scope(|| {
                    let by_handle = adapter.traceparent_of(&tracing::Span::current());
                    read.push((name, adapter.traceparent_of_current(), by_handle));
                });
            }
        });
        assert_eq!(read[0], ("outside", None, None));
        for (name, in_place, by_handle) in &read[1..] {
            assert!(in_place.is_some(), "{name}");
            assert_eq!(in_place, by_handle, "{name}");
        }
        // A log-only span speaks for the exported one around it, and the two exported spans
        // differ: the reads are of the current span, not of whatever was entered first.
        assert_eq!(read[3].1, read[2].1);
        assert_ne!(read[1].1, read[2].1);
    }

    #[test]
    fn a_caller_setting_flags_this_version_does_not_know_is_followed_by_its_sampled_bit() {
        let adapter = Adapter::new(Sampling::EVERY_TRACE);
        // 03: sampled and the Level 2 random-trace-id bit; 09: sampled and an unknown bit;
        // 02: the random bit alone, not sampled.
        for (flags, sampled) in [
            ("01", true),
            ("03", true),
            ("09", true),
            ("02", false),
            ("ff", true),
        ] {
            let header = format!("00-{STORED_TRACE}-{STORED_SPAN}-{flags}");
            let parent = adapter
                .extract(&header, None)
                .unwrap_or_else(|| panic!("flags {flags} were refused"));
            assert_eq!(parent.trace_id().to_string(), STORED_TRACE, "{flags}");
            assert_eq!(parent.span_id().to_string(), STORED_SPAN, "{flags}");
            assert_eq!(parent.is_sampled(), sampled, "{flags}");
        }
        for garbage in [
            format!("00-{STORED_TRACE}-{STORED_SPAN}-0g"),
            format!("00-{STORED_TRACE}-{STORED_SPAN}-+1"),
            format!("00-{STORED_TRACE}-{STORED_SPAN}-013"),
            format!("00-{STORED_TRACE}-{STORED_SPAN}"),
        ] {
            assert_eq!(adapter.extract(&garbage, None), None, "{garbage}");
        }
    }

    #[test]
    fn a_remote_parent_is_taken_from_a_traceparent_and_given_back_for_a_child() {
        let mut header = None;
        let spans = spans_of(|| {
            let adapter = Adapter::new(Sampling::EVERY_TRACE);
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
        // The caller's vendors' entries travel with its trace, on the child too.
        for span in [request, send] {
            assert_eq!(span.span_context.trace_state().header(), "vendor=x");
        }
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
