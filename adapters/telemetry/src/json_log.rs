//! `--log-format json`: one JSON object per line, with the trace and span ids of the span the
//! line was written in, so a log shipper's lines open the trace they belong to.
//!
//! tracing-subscriber's own JSON format knows nothing of OpenTelemetry ids; this is that format
//! (time, level, target, fields, the spans with their fields) plus `trace_id` and `span_id`.

use std::fmt;

use opentelemetry::trace::{SpanId, TraceId};
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, Registry};

use crate::layer::SpanRecord;

pub(crate) struct JsonWithTrace;

struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().to_owned(), Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

/// The ids of the innermost span around `event` that the span layer knows.
///
/// They are looked up in the registry itself, not in this layer's context: this layer sees only
/// the spans its log filter lets through, and at the default level (`warn`) that is none of the
/// ledger's, so a warning written inside a send or a worker's lookup would have no trace. The
/// process's subscriber is global ([`crate::install`]), so it is the default here.
fn trace_of(event: &Event<'_>) -> Option<(TraceId, SpanId)> {
    tracing::dispatcher::get_default(|dispatch| {
        let registry = dispatch.downcast_ref::<Registry>()?;
        let id = match event.parent() {
            Some(id) => id.clone(),
            None if event.is_contextual() => dispatch.current_span().id()?.clone(),
            None => return None,
        };
        let span = registry.span(&id)?;
        let found = span.scope().find_map(|span| {
            let extensions = span.extensions();
            let record = extensions.get::<SpanRecord>()?;
            Some((record.trace_id, record.span_id))
        });
        found
    })
}

impl<S, N> FormatEvent<S, N> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        line.insert("timestamp".into(), time.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        let mut fields = Map::new();
        event.record(&mut Fields(&mut fields));
        line.insert("fields".into(), fields.into());
        let mut spans = Vec::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let mut entry = extensions
                    .get::<FormattedFields<N>>()
                    .and_then(|formatted| {
                        serde_json::from_str::<Map<String, Value>>(formatted).ok()
                    })
                    .unwrap_or_default();
                entry.insert("name".into(), span.name().into());
                spans.push(Value::Object(entry));
            }
        }
        if let Some(last) = spans.last().cloned() {
            line.insert("span".into(), last);
            line.insert("spans".into(), spans.into());
        }
        if let Some((trace_id, span_id)) = trace_of(event) {
            line.insert("trace_id".into(), trace_id.to_string().into());
            line.insert("span_id".into(), span_id.to_string().into());
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}
