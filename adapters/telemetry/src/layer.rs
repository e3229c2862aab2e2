//! The `tracing` layer that turns the ledger's spans into OpenTelemetry spans: ids, sampling,
//! attributes, warnings as events, and on close the span handed to the exporter's queue (encoded
//! there for HTTP/protobuf, as a `SpanData` for the SDK's processor).
//!
//! Our own instead of tracing-opentelemetry's, for what it cost in the request path (docs/src/performance.md): that layer keeps a `SpanBuilder` and a `Context` per span, stamps an end time
//! on every poll's exit and builds the finished span through the SDK's tracer; this one keeps a
//! fixed [`SpanRecord`] in the span's extensions, does nothing on enter and exit, and writes
//! the attributes as protobuf as they are recorded ([`EncodedAttributes`]), copying each string
//! once, into the bytes that are exported.
//!
//! It must never block the ledger: a finished span is queued without waiting, and one that finds
//! `OTEL_BSP_MAX_QUEUE_SIZE` spans ([`crate::config::DEFAULT_MAX_QUEUED_SPANS`] unless set)
//! already waiting for export is dropped and counted in
//! `opledger_trace_export_failures_total`.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, Key, KeyValue, Value};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks, SpanProcessor,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::Layer;

pub(crate) use crate::config::Sampling;
use crate::log_filter::LogFilter;
use crate::otlp_proto::{EncodedAttributes, Scalar, SpanParts};
use crate::spool::Spool;

/// A span's OpenTelemetry identity and, when it is recorded, what it will export. Kept in the
/// span's extensions from `new_span` to `close`; [`crate::context`] and [`crate::json_log`] read
/// its ids.
#[derive(Debug)]
pub(crate) struct SpanRecord {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// `SpanId::INVALID` for a span that starts a trace.
    pub(crate) parent_span_id: SpanId,
    pub(crate) sampled: bool,
    /// A caller's W3C `tracestate` (vendors' entries), carried by every span of its trace in
    /// this process as the standard asks; empty (no allocation) otherwise.
    trace_state: TraceState,
    /// Whether attributes, events and links are kept: exported somewhere, and sampled or a
    /// span starting a trace (a caller's sampled `traceparent` may still make it the child of a
    /// sampled span). An unrecorded span only has ids (for `traceparent` and the JSON log).
    recording: bool,
    name: Cow<'static, str>,
    kind: SpanKind,
    start: SystemTime,
    attributes: EncodedAttributes,
    /// Which of the callsite's fields (by index, the first 64) `attributes` holds.
    written: u64,
    events: Vec<Event>,
    links: Vec<Link>,
    status: Status,
}

impl SpanRecord {
    /// Makes the span the child of a caller's span (a remote parent): its trace, and the
    /// sampling decision [`Sampling::samples_child_of`] made for it.
    pub(crate) fn set_remote_parent(&mut self, parent: &SpanContext, sampled: bool) {
        self.trace_id = parent.trace_id();
        self.parent_span_id = parent.span_id();
        self.sampled = sampled;
        self.trace_state = parent.trace_state().clone();
        if !self.sampled {
            self.recording = false;
            self.attributes.clear();
            self.written = 0;
        }
    }

    /// Whether this is the span of a request this process serves (`otel.kind = "server"`).
    pub(crate) fn serves(&self) -> bool {
        self.kind == SpanKind::Server
    }

    pub(crate) fn add_link(&mut self, to: SpanContext, attributes: Vec<KeyValue>) {
        if self.recording {
            self.links.push(Link::new(to, attributes, 0));
        }
    }

    /// The W3C `traceparent` of this span: `00-<trace id>-<span id>-<flags>`, in lower-case
    /// hex written byte by byte (the ids' `Display` formats a u128 and a u64 through the
    /// formatter's padding machinery, per request).
    pub(crate) fn traceparent(&self) -> String {
        let mut header = String::with_capacity(TRACEPARENT_BYTES);
        header.push_str("00-");
        push_hex(&mut header, &self.trace_id.to_bytes());
        header.push('-');
        push_hex(&mut header, &self.span_id.to_bytes());
        header.push_str(if self.sampled { "-01" } else { "-00" });
        debug_assert_eq!(header.len(), TRACEPARENT_BYTES);
        header
    }
}

/// `00-` + 32 hex digits + `-` + 16 + `-` + 2.
const TRACEPARENT_BYTES: usize = 55;

fn push_hex(text: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
}

/// Where finished spans go, behind a bounded count of what waits for export: HTTP/protobuf's
/// spool (encoded here, posted from its own thread), or a span processor (gRPC: the SDK's batch
/// processor, which exports from its own thread).
#[derive(Debug)]
pub(crate) struct Sink {
    route: Route,
    scope: InstrumentationScope,
}

#[derive(Debug)]
enum Route {
    Spool(Arc<Spool>),
    Processor {
        processor: Box<dyn SpanProcessor>,
        backlog: Arc<Backlog>,
    },
}

impl Sink {
    /// `backlog` must be the one the processor's exporter reports to ([`crate::export::Counted`]).
    pub(crate) fn new(processor: Box<dyn SpanProcessor>, backlog: Arc<Backlog>) -> Self {
        Self {
            route: Route::Processor { processor, backlog },
            scope: crate::scope(),
        }
    }

    pub(crate) fn spooled(spool: Arc<Spool>) -> Self {
        Self {
            route: Route::Spool(spool),
            scope: crate::scope(),
        }
    }

    pub(crate) fn shutdown(&self) {
        // A collector that is down loses what is queued; that is all it may cost.
        match &self.route {
            Route::Spool(spool) => spool.shutdown(),
            Route::Processor { processor, .. } => {
                let _ = processor.shutdown();
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn force_flush(&self) {
        match &self.route {
            Route::Spool(spool) => spool.flush(),
            Route::Processor { processor, .. } => {
                let _ = processor.force_flush();
            }
        }
    }

    /// Queues a sampled, recorded span that ended at `end`.
    fn send(&self, record: SpanRecord, end: SystemTime) {
        match &self.route {
            // Encoded here, attributes as they were written; the span's buffers are freed here,
            // by the thread that (almost always) allocated them.
            Route::Spool(spool) => spool.push(&SpanParts {
                trace_id: record.trace_id,
                span_id: record.span_id,
                trace_state: &record.trace_state,
                parent_span_id: record.parent_span_id,
                name: &record.name,
                kind: &record.kind,
                start: record.start,
                end,
                attributes: &[],
                encoded_attributes: &record.attributes,
                dropped_attributes: 0,
                events: &record.events,
                dropped_events: 0,
                links: &record.links,
                dropped_links: 0,
                status: &record.status,
                flags: TraceFlags::SAMPLED,
            }),
            // The SDK's processor takes a `SpanData`: the attributes are read back into values
            // (gRPC only, where the SDK's exporter converts every span again anyway).
            Route::Processor { processor, backlog } => {
                if backlog.admit().is_some() {
                    processor.on_end(SpanData {
                        span_context: SpanContext::new(
                            record.trace_id,
                            record.span_id,
                            TraceFlags::SAMPLED,
                            false,
                            record.trace_state,
                        ),
                        parent_span_id: record.parent_span_id,
                        span_kind: record.kind,
                        name: record.name,
                        start_time: record.start,
                        end_time: end,
                        attributes: record.attributes.key_values(),
                        dropped_attributes_count: 0,
                        events: span_events(record.events),
                        links: span_links(record.links),
                        status: record.status,
                        instrumentation_scope: self.scope.clone(),
                    });
                }
            }
        }
    }
}

/// How many finished spans wait for export. The SDK's queue drops silently when full; counting
/// here, before it, lets a drop cost a count in `/metrics` like a failed export.
#[derive(Debug)]
pub(crate) struct Backlog {
    queued: AtomicUsize,
    limit: usize,
    dropped: AtomicU64,
}

impl Backlog {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            queued: AtomicUsize::new(0),
            limit,
            dropped: AtomicU64::new(0),
        }
    }

    /// Takes a place for one span (`Some` of the spans now queued, this one included), or counts
    /// it dropped.
    pub(crate) fn admit(&self) -> Option<usize> {
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued < self.limit).then_some(queued + 1)
            })
            .ok()
            .map(|before| before + 1);
        if admitted.is_none() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            opledger_domain::trace_context::count_export_failure();
        }
        admitted
    }

    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// `spans` left the queue (exported or failed).
    pub(crate) fn exported(&self, spans: usize) {
        let _ = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                Some(queued.saturating_sub(spans))
            });
    }

    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The sampling decisions: the settings are read in `config.rs`.
impl Sampling {
    /// `TraceIdRatioBased`'s decision: the trace id's low 63 bits below the ratio's share.
    fn samples(self, trace_id: TraceId) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        let bound = (self.ratio.max(0.0) * (1u64 << 63) as f64) as u64;
        let bytes = trace_id.to_bytes();
        let mut low = [0; 8];
        low.copy_from_slice(&bytes[8..]);
        (u64::from_be_bytes(low) >> 1) < bound
    }

    /// The decision for a span whose parent is remote: a caller's span, or the span an
    /// operation's intent was recorded in.
    pub(crate) fn samples_child_of(self, parent: &SpanContext) -> bool {
        if self.follow_caller {
            parent.is_sampled()
        } else {
            self.samples(parent.trace_id())
        }
    }
}

/// The layer. With no sink (JSON logs, no export) it still gives every span ids, so log lines
/// carry a caller's trace.
#[derive(Debug)]
pub(crate) struct SpanLayer {
    sink: Option<Arc<Sink>>,
    /// How a trace that starts here is sampled; a span with a parent in this process follows
    /// the parent's decision.
    sampling: Sampling,
    ids: RandomIdGenerator,
    /// The log layer's filter (a copy: the log layer has its own), asked at each callsite this
    /// layer does not export, so that the callsite stays as enabled or disabled as the log alone
    /// would have it. `None`: no log layer (unit tests), nothing else is enabled.
    logged: Option<LogFilter>,
}

impl SpanLayer {
    pub(crate) fn new(
        sink: Option<Arc<Sink>>,
        sampling: Sampling,
        logged: Option<LogFilter>,
    ) -> Self {
        Self {
            sink,
            sampling,
            ids: RandomIdGenerator::default(),
            logged,
        }
    }
}

/// The closest span around a new span or an event that this layer records (that has a
/// [`SpanRecord`]). The layer has no per-layer filter, so the span around may be one only the
/// log layer wants (a debug span with `-vv`): the walk goes up past those to the closest
/// exported one.
fn parent_of<'a, S>(
    explicit: Option<&Id>,
    contextual: bool,
    ctx: &'a Context<'_, S>,
) -> Option<SpanRef<'a, S>>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    let around = match explicit {
        Some(parent) => ctx.span(parent),
        None if contextual => ctx.lookup_current(),
        None => None,
    }?;
    around
        .scope()
        .find(|span| span.extensions().get::<SpanRecord>().is_some())
}

impl<S> Layer<S> for SpanLayer
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    /// The one interest decision per callsite, in place of a per-layer filter: a per-layer
    /// filter makes tracing-subscriber look the span up in the registry on every callback for
    /// this layer — every enter and exit, and an instrumented future enters and exits on every
    /// poll — only to learn what the callsite already said. The ledger's own spans (and warnings)
    /// are always of interest; any other callsite is what the log's filter says of it, since a
    /// plain layer answering `never` would disable it for the log layer too, and `always` would
    /// enable every callsite in the process.
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if crate::exported(meta) {
            return Interest::always();
        }
        match &self.logged {
            Some(logged) => <LogFilter as Filter<S>>::callsite_enabled(logged, meta),
            None => Interest::never(),
        }
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        // A span only the log layer wants (no per-layer filter keeps it away).
        if !crate::exported(attrs.metadata()) {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let parent = parent_of(attrs.parent(), attrs.is_contextual(), &ctx).and_then(|parent| {
            let extensions = parent.extensions();
            let record = extensions.get::<SpanRecord>()?;
            Some((
                record.trace_id,
                record.span_id,
                record.sampled,
                record.trace_state.clone(),
            ))
        });
        let (trace_id, parent_span_id, sampled, trace_state) = match parent {
            Some(inherited) => inherited,
            None => {
                let trace_id = self.ids.new_trace_id();
                let sampled = self.sampling.samples(trace_id);
                (trace_id, SpanId::INVALID, sampled, TraceState::default())
            }
        };
        let meta = attrs.metadata();
        let recording = self.sink.is_some() && (sampled || parent_span_id == SpanId::INVALID);
        let mut record = SpanRecord {
            trace_id,
            span_id: self.ids.new_span_id(),
            parent_span_id,
            sampled,
            trace_state,
            recording,
            name: Cow::Borrowed(meta.name()),
            kind: SpanKind::Internal,
            start: SystemTime::now(),
            attributes: EncodedAttributes::with_capacity(if recording {
                meta.fields().len() * ATTRIBUTE_BYTES
            } else {
                0
            }),
            written: 0,
            events: Vec::new(),
            links: Vec::new(),
            status: Status::Unset,
        };
        if recording {
            attrs.record(&mut Fields {
                record: &mut record,
            });
        }
        span.extensions_mut().insert(record);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(record) = extensions.get_mut::<SpanRecord>() {
            if record.recording {
                values.record(&mut Fields { record });
            }
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        let Some(follows) = ctx.span(follows) else {
            return;
        };
        let Some(to) = follows.extensions().get::<SpanRecord>().map(|followed| {
            SpanContext::new(
                followed.trace_id,
                followed.span_id,
                flags(followed.sampled),
                false,
                TraceState::default(),
            )
        }) else {
            return;
        };
        if let Some(span) = ctx.span(id) {
            if let Some(record) = span.extensions_mut().get_mut::<SpanRecord>() {
                record.add_link(to, Vec::new());
            }
        }
    }

    /// The ledger's warnings and errors (the only events the filter lets through) as events on
    /// their span; an error marks the span's status.
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if !crate::exported(event.metadata()) {
            return;
        }
        let Some(span) = parent_of(event.parent(), event.is_contextual(), &ctx) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        let Some(record) = extensions.get_mut::<SpanRecord>() else {
            return;
        };
        if !record.recording {
            return;
        }
        let meta = event.metadata();
        let mut fields = EventFields {
            name: None,
            // No semantic convention names a span event's level or its Rust module: the
            // ledger's own, in its namespace.
            attributes: vec![
                KeyValue::new("opledger.level", meta.level().as_str()),
                KeyValue::new("opledger.target", meta.target()),
            ],
        };
        event.record(&mut fields);
        if *meta.level() == Level::ERROR && record.status == Status::Unset {
            record.status = Status::error("");
        }
        record.events.push(Event::new(
            fields.name.unwrap_or(Cow::Borrowed(meta.name())),
            SystemTime::now(),
            fields.attributes,
            0,
        ));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(sink) = &self.sink else { return };
        let Some(span) = ctx.span(&id) else { return };
        let Some(record) = span.extensions_mut().remove::<SpanRecord>() else {
            return;
        };
        if !(record.recording && record.sampled) {
            return;
        }
        sink.send(record, SystemTime::now());
    }
}

/// The first allocation for a span's attributes, per field of its callsite: a key and an id
/// (an operation id is 36 bytes) with their keys and lengths fit.
const ATTRIBUTE_BYTES: usize = 56;

pub(crate) fn flags(sampled: bool) -> TraceFlags {
    if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    }
}

fn span_events(events: Vec<Event>) -> SpanEvents {
    let mut span_events = SpanEvents::default();
    span_events.events = events;
    span_events
}

fn span_links(links: Vec<Link>) -> SpanLinks {
    let mut span_links = SpanLinks::default();
    span_links.links = links;
    span_links
}

/// A span's fields as attributes, with tracing-opentelemetry's conventions: `otel.name`,
/// `otel.kind`, `otel.status_code` and `otel.status_message` set the span's own properties, and
/// a field recorded again replaces its value (a span exports each attribute once).
struct Fields<'a> {
    record: &'a mut SpanRecord,
}

impl Fields<'_> {
    fn set(&mut self, field: &Field, value: Scalar<'_>) {
        // Only a field written before needs its bytes searched for: most fields recorded after
        // creation were empty until then. A field's index in its callsite says which it is.
        let replace = match 1_u64.checked_shl(field.index() as u32) {
            Some(bit) => {
                let written = self.record.written & bit != 0;
                self.record.written |= bit;
                written
            }
            // Past the 64th field (tracing's macros allow 32): searched every time.
            None => true,
        };
        let name = field.name();
        self.record
            .attributes
            .set_in(namespace_of(name), name, value, replace);
    }

    /// The `otel.*` fields; `true` when `field` was one.
    fn special(&mut self, field: &Field, value: &str) -> bool {
        let Some(property) = field.name().strip_prefix("otel.") else {
            return false;
        };
        let record = &mut *self.record;
        match property {
            "name" => record.name = Cow::Owned(value.to_owned()),
            "kind" => record.kind = kind(value),
            "status_code" => {
                record.status = match value {
                    s if s.eq_ignore_ascii_case("ok") => Status::Ok,
                    s if s.eq_ignore_ascii_case("error") => Status::error(""),
                    _ => Status::Unset,
                }
            }
            "status_message" => record.status = Status::error(value.to_owned()),
            _ => return false,
        }
        true
    }
}

/// The namespace an exported attribute's key takes before a field's name. A field named with a
/// namespace (`http.route`, `url.full`, `server.port`, `error.type`) is named after OpenTelemetry's
/// semantic conventions and is exported as it is; a bare field (`operation_id`, `attempt_id`,
/// `provider`, `state`) is the ledger's own and is exported as `opledger.<name>`, so it can never
/// collide with a convention's name or another library's. The JSON log keeps the bare names.
pub(crate) fn namespace_of(field: &str) -> &'static str {
    if field.contains('.') {
        ""
    } else {
        OWN_NAMESPACE
    }
}

/// The namespace of the ledger's own span and event attributes.
pub(crate) const OWN_NAMESPACE: &str = "opledger.";

/// A `Debug` (or `%` Display) value as a string, written into a buffer that fits an id or a
/// short message at once, where `format!` grows from nothing.
fn debug_string(value: &dyn fmt::Debug) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(DEBUG_VALUE_BYTES);
    let _ = write!(text, "{value:?}");
    text
}

/// The first allocation for a value recorded with `?` or `%`: an operation id (36 bytes) or an
/// account name fits.
const DEBUG_VALUE_BYTES: usize = 48;

fn kind(value: &str) -> SpanKind {
    match value {
        "server" => SpanKind::Server,
        "client" => SpanKind::Client,
        "producer" => SpanKind::Producer,
        "consumer" => SpanKind::Consumer,
        _ => SpanKind::Internal,
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if !self.special(field, value) {
            self.set(field, Scalar::Str(value));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        with_debug_text(value, |text| {
            if !self.special(field, text) {
                self.set(field, Scalar::Str(text));
            }
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, Scalar::Int(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match i64::try_from(value) {
            Ok(value) => self.set(field, Scalar::Int(value)),
            // OpenTelemetry has no unsigned integer: a bigger one is its digits.
            Err(_) => self.set(field, Scalar::Str(&value.to_string())),
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, Scalar::Bool(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, Scalar::Double(value));
    }
}

thread_local! {
    /// Where a `?` or `%` value is formatted before it is written into the span's attributes:
    /// one buffer per thread instead of a `String` per value.
    static DEBUG_TEXT: std::cell::RefCell<String> =
        std::cell::RefCell::new(String::with_capacity(DEBUG_VALUE_BYTES));
}

/// Calls `each` with `value` formatted (`Debug`; a `%` value's `Display`).
fn with_debug_text(value: &dyn fmt::Debug, each: impl FnOnce(&str)) {
    DEBUG_TEXT.with(|text| match text.try_borrow_mut() {
        Ok(mut text) => {
            use std::fmt::Write as _;
            text.clear();
            let _ = write!(text, "{value:?}");
            each(&text);
            // A huge value once is not kept for the thread's life.
            if text.capacity() > MAX_KEPT_DEBUG_TEXT_BYTES {
                *text = String::with_capacity(DEBUG_VALUE_BYTES);
            }
        }
        // Formatting `value` recorded a field itself (a `Debug` that traces): its own buffer.
        Err(_) => each(&debug_string(value)),
    });
}

/// The most a thread's [`DEBUG_TEXT`] keeps between values.
const MAX_KEPT_DEBUG_TEXT_BYTES: usize = 4096;

/// OpenTelemetry has no unsigned integer: one that fits is an `i64`, a bigger one its digits.
fn u64_value(value: u64) -> Value {
    i64::try_from(value).map_or_else(|_| Value::String(value.to_string().into()), Value::I64)
}

/// An event's fields: `message` names it, the others are its attributes.
struct EventFields {
    name: Option<Cow<'static, str>>,
    attributes: Vec<KeyValue>,
}

impl EventFields {
    fn set(&mut self, field: &Field, value: Value) {
        let name = field.name();
        let key = match namespace_of(name) {
            "" => Key::from_static_str(name),
            namespace => Key::from(format!("{namespace}{name}")),
        };
        self.attributes.push(KeyValue::new(key, value));
    }
}

// A warning's fields carry what a provider answered (a refusal's message, an error): scrubbed of
// secrets before they become a span event (`opledger_domain::redact`).
impl Visit for EventFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        let value = opledger_domain::redact::scrub(value).into_owned();
        match field.name() {
            "message" => self.name = Some(Cow::Owned(value)),
            _ => self.set(field, Value::String(value.into())),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let value = opledger_domain::redact::scrub_owned(debug_string(value));
        match field.name() {
            "message" => self.name = Some(Cow::Owned(value)),
            _ => self.set(field, Value::String(value.into())),
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field, Value::I64(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field, u64_value(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field, Value::Bool(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field, Value::F64(value));
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SimpleSpanProcessor, SpanData};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::EnvFilter;

    use super::*;
    use crate::export::Counted;

    /// Runs `work` under a subscriber with the span layer sampling at `sampling_ratio` and
    /// exporting to memory (a unit test's double of a collector), and returns the finished spans.
    pub(crate) fn spans_of(sampling_ratio: f64, work: impl FnOnce()) -> Vec<SpanData> {
        let sampling = Sampling {
            ratio: sampling_ratio,
            follow_caller: true,
        };
        spans_sampled(sampling, work)
    }

    /// [`spans_of`] with any sampling.
    pub(crate) fn spans_sampled(sampling: Sampling, work: impl FnOnce()) -> Vec<SpanData> {
        let exporter = InMemorySpanExporter::default();
        let sink = memory_sink(&exporter);
        let subscriber = tracing_subscriber::registry().with(crate::span_layer(
            Some(Arc::clone(&sink)),
            sampling,
            None,
        ));
        tracing::subscriber::with_default(subscriber, work);
        sink.force_flush();
        exporter.get_finished_spans().expect("spans")
    }

    fn memory_sink(exporter: &InMemorySpanExporter) -> Arc<Sink> {
        let backlog = Arc::new(Backlog::new(crate::config::DEFAULT_MAX_QUEUED_SPANS));
        let processor = SimpleSpanProcessor::new(Counted::new(exporter.clone(), backlog.clone()));
        Arc::new(Sink::new(Box::new(processor), backlog))
    }

    /// What a log layer saw: the names of its spans and of its events, in order.
    #[derive(Clone, Default)]
    pub(crate) struct Logged(Arc<std::sync::Mutex<Vec<String>>>);

    impl Logged {
        pub(crate) fn seen(&self) -> Vec<String> {
            self.0.lock().expect("the log").clone()
        }
    }

    impl<S: Subscriber> Layer<S> for Logged {
        fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
            let name = format!("span {}", attrs.metadata().name());
            self.0.lock().expect("the log").push(name);
        }

        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let name = format!("event {}", event.metadata().level());
            self.0.lock().expect("the log").push(name);
        }
    }

    /// [`spans_of`] at ratio 1.0 beside a log layer filtered by `directives` (as `install`
    /// puts them together): the finished spans and what the log layer saw.
    pub(crate) fn spans_and_log(
        directives: &str,
        work: impl FnOnce(),
    ) -> (Vec<SpanData>, Vec<String>) {
        let exporter = InMemorySpanExporter::default();
        let sink = memory_sink(&exporter);
        let logged = Logged::default();
        let subscriber = tracing_subscriber::registry()
            .with(
                logged
                    .clone()
                    .with_filter(LogFilter::of(EnvFilter::new(directives))),
            )
            .with(crate::span_layer(
                Some(Arc::clone(&sink)),
                Sampling::EVERY_TRACE,
                Some(LogFilter::of(EnvFilter::new(directives))),
            ));
        tracing::subscriber::with_default(subscriber, work);
        sink.force_flush();
        (exporter.get_finished_spans().expect("spans"), logged.seen())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Mutex};

    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SpanExporter};
    use opledger_domain::trace_context::TraceContext as _;
    use tracing::field;
    use tracing_subscriber::layer::SubscriberExt;

    use super::testing::{spans_and_log, spans_of, spans_sampled};
    use super::*;
    use crate::context::Adapter;
    use crate::export::Counted;

    const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const CALLER_SPAN: &str = "00f067aa0ba902b7";

    fn named<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
        spans
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no span {name} in {spans:?}"))
    }

    fn attribute(span: &SpanData, key: &str) -> Vec<String> {
        span.attributes
            .iter()
            .filter(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
            .collect()
    }

    #[test]
    fn a_child_takes_its_trace_and_parent_from_the_closest_exported_span_around_it() {
        let spans = spans_of(1.0, || {
            let request = tracing::info_span!("request");
            request.in_scope(|| {
                let execute = tracing::info_span!("execute");
                execute.in_scope(|| {
                    // Debug spans are not exported: the send is the execute's child.
                    tracing::debug_span!("provider.execute")
                        .in_scope(|| tracing::info_span!("send").in_scope(|| {}));
                });
            });
            tracing::info_span!("elsewhere").in_scope(|| {});
        });
        let (request, execute, send) = (
            named(&spans, "request"),
            named(&spans, "execute"),
            named(&spans, "send"),
        );
        assert_eq!(request.parent_span_id, SpanId::INVALID);
        assert_eq!(execute.parent_span_id, request.span_context.span_id());
        assert_eq!(send.parent_span_id, execute.span_context.span_id());
        for span in [execute, send] {
            assert_eq!(
                span.span_context.trace_id(),
                request.span_context.trace_id()
            );
        }
        assert_ne!(
            named(&spans, "elsewhere").span_context.trace_id(),
            request.span_context.trace_id()
        );
        assert_eq!(spans.len(), 4, "{spans:?}");
    }

    #[test]
    fn with_warnings_logged_a_debug_callsite_stays_disabled_and_the_ledgers_info_spans_are_exported(
    ) {
        let (spans, logged) = spans_and_log("warn", || {
            // Disabled at the callsite, as the log's filter alone would have it: the span
            // layer's interest does not enable every callsite in the process.
            assert!(tracing::debug_span!("provider.execute").is_disabled());
            assert!(!tracing::enabled!(tracing::Level::DEBUG));
            tracing::info_span!("send").in_scope(|| {
                tracing::info!("confirmed");
                tracing::warn!("outcome unknown");
            });
        });
        let names: Vec<&str> = spans.iter().map(|span| span.name.as_ref()).collect();
        assert_eq!(names, ["send"]);
        assert_eq!(spans[0].events.len(), 1, "{spans:?}");
        // The log layer sees what its filter lets through, not the exported span.
        assert_eq!(logged, ["event WARN"]);
    }

    #[test]
    fn a_span_only_the_log_wants_is_not_exported_and_its_child_hangs_under_the_exported_span_around_it(
    ) {
        let (spans, logged) = spans_and_log("debug", || {
            tracing::info_span!("request").in_scope(|| {
                tracing::debug_span!("provider.execute").in_scope(|| {
                    tracing::info_span!("send").in_scope(|| tracing::warn!("outcome unknown"));
                });
            });
        });
        let names: Vec<&str> = spans.iter().map(|span| span.name.as_ref()).collect();
        assert_eq!(names, ["send", "request"]);
        let (send, request) = (named(&spans, "send"), named(&spans, "request"));
        assert_eq!(send.parent_span_id, request.span_context.span_id());
        assert_eq!(
            send.span_context.trace_id(),
            request.span_context.trace_id()
        );
        assert_eq!(send.events.len(), 1, "{spans:?}");
        assert_eq!(
            logged,
            [
                "span request",
                "span provider.execute",
                "span send",
                "event WARN"
            ]
        );
    }

    #[test]
    fn fields_recorded_after_creation_are_exported_once_with_their_last_value() {
        let spans = spans_of(1.0, || {
            let send = tracing::info_span!(
                "send",
                operation_id = "op-1",
                attempt = 2_u64,
                state = field::Empty,
                external_id = field::Empty,
                otel.kind = "client",
            );
            send.record("state", "unknown");
            send.record("state", "succeeded");
            send.record("external_id", field::display(731));
            send.in_scope(|| {});
        });
        let send = named(&spans, "send");
        assert_eq!(attribute(send, "opledger.operation_id"), ["op-1"]);
        assert_eq!(attribute(send, "opledger.attempt"), ["2"]);
        assert_eq!(attribute(send, "opledger.state"), ["succeeded"]);
        assert_eq!(attribute(send, "opledger.external_id"), ["731"]);
        assert!(attribute(send, "otel.kind").is_empty());
        assert_eq!(send.span_kind, SpanKind::Client);
        assert!(send.start_time <= send.end_time);
    }

    #[test]
    fn the_ledgers_own_fields_are_exported_in_its_namespace_and_semantic_conventions_as_named() {
        let spans = spans_of(1.0, || {
            let request = tracing::info_span!(
                "POST /v1/operations",
                operation_id = "op-1",
                http.request.method = "POST",
                url.scheme = "http",
                error.type = field::Empty,
            );
            request.record("error.type", "timeout");
            request.in_scope(
                || tracing::warn!(attempt_id = "at-1", error.type = "timeout", "outcome unknown"),
            );
        });
        let request = named(&spans, "POST /v1/operations");
        let mut keys: Vec<&str> = request
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "error.type",
                "http.request.method",
                "opledger.operation_id",
                "url.scheme"
            ]
        );
        let warning = request
            .events
            .iter()
            .next()
            .expect("the warning is an event");
        let mut keys: Vec<&str> = warning
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "error.type",
                "opledger.attempt_id",
                "opledger.level",
                "opledger.target"
            ]
        );
    }

    #[test]
    fn at_ratio_zero_nothing_is_exported_and_the_ids_still_say_unsampled() {
        let mut header = None;
        let spans = spans_of(0.0, || {
            let request = tracing::info_span!("request", tenant = "acme");
            let send = request.in_scope(|| tracing::info_span!("send"));
            header = Adapter::new(Sampling::EVERY_TRACE).traceparent_of(&send);
            let parent = Adapter::new(Sampling::EVERY_TRACE)
                .traceparent_of(&request)
                .expect("ids");
            let trace = parent.split('-').nth(1).expect("trace id").to_owned();
            assert!(header.as_deref().expect("ids").contains(&trace));
        });
        assert!(spans.is_empty(), "{spans:?}");
        assert!(header.expect("ids").ends_with("-00"));
    }

    #[test]
    fn a_callers_sampling_decision_wins_over_the_ratio() {
        let sampled = spans_of(0.0, || {
            let request = tracing::info_span!("request", tenant = "acme");
            Adapter::new(Sampling::EVERY_TRACE).set_remote_parent(
                &request,
                &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"),
                None,
            );
            request.in_scope(|| tracing::info_span!("send").in_scope(|| {}));
        });
        let request = named(&sampled, "request");
        assert_eq!(request.span_context.trace_id().to_string(), CALLER_TRACE);
        assert_eq!(request.parent_span_id.to_string(), CALLER_SPAN);
        // Recorded at creation, before the caller's decision was known.
        assert_eq!(attribute(request, "opledger.tenant"), ["acme"]);
        assert_eq!(
            named(&sampled, "send").parent_span_id,
            request.span_context.span_id()
        );
        let unsampled = spans_of(1.0, || {
            let request = tracing::info_span!("request");
            Adapter::new(Sampling::EVERY_TRACE).set_remote_parent(
                &request,
                &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-00"),
                None,
            );
            request.in_scope(|| tracing::info_span!("send").in_scope(|| {}));
        });
        assert!(unsampled.is_empty(), "{unsampled:?}");
    }

    #[test]
    fn a_sampler_that_is_not_parent_based_decides_a_callers_trace_by_its_ratio() {
        let request_of_a_caller = |sampling: Sampling, flags: &str| {
            spans_sampled(sampling, || {
                let request = tracing::info_span!("request");
                Adapter::new(sampling).set_remote_parent(
                    &request,
                    &format!("00-{CALLER_TRACE}-{CALLER_SPAN}-{flags}"),
                    None,
                );
                request.in_scope(|| tracing::info_span!("send").in_scope(|| {}));
            })
        };
        let always_on = Sampling {
            ratio: 1.0,
            follow_caller: false,
        };
        let spans = request_of_a_caller(always_on, "00");
        assert_eq!(spans.len(), 2, "{spans:?}");
        assert_eq!(
            named(&spans, "request").span_context.trace_id().to_string(),
            CALLER_TRACE
        );
        let always_off = Sampling {
            ratio: 0.0,
            follow_caller: false,
        };
        let spans = request_of_a_caller(always_off, "01");
        assert!(spans.is_empty(), "{spans:?}");
    }

    /// An exporter stuck until the test lets go (a collector that does not answer), saying
    /// when it is.
    #[derive(Debug)]
    struct Stuck {
        entered: mpsc::Sender<()>,
        release: Mutex<mpsc::Receiver<()>>,
        exported: Arc<AtomicUsize>,
    }

    impl SpanExporter for Stuck {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let _ = self.entered.send(());
            if let Ok(release) = self.release.lock() {
                // Returns at once when the test has dropped the sender.
                let _ = release.recv();
            }
            self.exported.fetch_add(batch.len(), Ordering::Relaxed);
            Ok(())
        }
    }

    #[test]
    fn spans_beyond_the_queue_limit_are_dropped_and_counted_without_waiting_for_the_exporter() {
        let limit = 4;
        let backlog = Arc::new(Backlog::new(limit));
        let (release, stuck) = mpsc::channel::<()>();
        let (entered, exporting) = mpsc::channel::<()>();
        let exported = Arc::new(AtomicUsize::new(0));
        let exporter = Stuck {
            entered,
            release: Mutex::new(stuck),
            exported: Arc::clone(&exported),
        };
        // Batches of one: the first span's export starts at once, and sticks.
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(limit)
            .with_max_export_batch_size(1)
            .build();
        let processor = BatchSpanProcessor::builder(Counted::new(exporter, Arc::clone(&backlog)))
            .with_batch_config(config)
            .build();
        let sink = Arc::new(Sink::new(Box::new(processor), Arc::clone(&backlog)));
        let failures = opledger_domain::trace_context::export_failures();
        let subscriber = tracing_subscriber::registry().with(crate::span_layer(
            Some(Arc::clone(&sink)),
            Sampling::EVERY_TRACE,
            None,
        ));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("send").in_scope(|| {});
            exporting.recv().expect("the export started");
            // The exporter is stuck with the first span; these close without waiting for it.
            for _ in 1..limit + 2 {
                tracing::info_span!("send").in_scope(|| {});
            }
        });
        assert_eq!(backlog.dropped(), 2);
        assert!(opledger_domain::trace_context::export_failures() >= failures + 2);
        drop(release);
        // The SDK exports one batch (here one span) per flush.
        for _ in 0..limit {
            sink.force_flush();
        }
        assert_eq!(exported.load(Ordering::Relaxed), limit);
        assert_eq!(backlog.queued.load(Ordering::Relaxed), 0);
        sink.shutdown();
    }
}
