//! The OTLP `ExportTraceServiceRequest` protobuf body of a batch, written straight from the SDK's
//! `SpanData`: each span where it ends ([`span_field`], kept by [`crate::spool`]), and the
//! request around a queue of them ([`Encoder::frame`]).
//!
//! opentelemetry-otlp's exporter clones every span of a batch, groups them by scope in a hash map,
//! converts each into the generated message types (a `String` or `Vec` per id, name, key and
//! value) and then encodes those: about 17 µs of CPU per operation of `bench http` (docs/src/performance.md). Nothing here needs a copy of a span: this writes the wire format (opentelemetry-proto's `trace.proto`, `common.proto`,
//! `resource.proto`) with prost's encoding primitives, reusing its buffers from batch to batch.
//! Proto3 rules as prost applies them: a scalar field at its default is left out, a oneof member
//! and a present message field are always written. The unit tests decode what it writes with
//! opentelemetry-proto's own types and compare with that crate's conversion.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Event, Link, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
#[cfg(test)]
use opentelemetry_sdk::trace::SpanData;
use opentelemetry_sdk::Resource;
use prost::encoding::{
    decode_key, decode_varint, encode_key, encode_varint, encoded_len_varint, key_len, WireType,
};

// Field numbers, from opentelemetry-proto's .proto files.
/// `ExportTraceServiceRequest.resource_spans`.
const REQUEST_RESOURCE_SPANS: u32 = 1;
/// `ResourceSpans`.
const RESOURCE_SPANS_RESOURCE: u32 = 1;
const RESOURCE_SPANS_SCOPE_SPANS: u32 = 2;
const RESOURCE_SPANS_SCHEMA_URL: u32 = 3;
/// `Resource.attributes`.
const RESOURCE_ATTRIBUTES: u32 = 1;
/// `ScopeSpans`.
const SCOPE_SPANS_SCOPE: u32 = 1;
const SCOPE_SPANS_SPANS: u32 = 2;
const SCOPE_SPANS_SCHEMA_URL: u32 = 3;
/// `InstrumentationScope`.
const SCOPE_NAME: u32 = 1;
const SCOPE_VERSION: u32 = 2;
const SCOPE_ATTRIBUTES: u32 = 3;
/// `Span`.
const SPAN_TRACE_ID: u32 = 1;
const SPAN_SPAN_ID: u32 = 2;
const SPAN_TRACE_STATE: u32 = 3;
const SPAN_PARENT_SPAN_ID: u32 = 4;
const SPAN_NAME: u32 = 5;
const SPAN_KIND: u32 = 6;
const SPAN_START_TIME: u32 = 7;
const SPAN_END_TIME: u32 = 8;
const SPAN_ATTRIBUTES: u32 = 9;
const SPAN_DROPPED_ATTRIBUTES: u32 = 10;
const SPAN_EVENTS: u32 = 11;
const SPAN_DROPPED_EVENTS: u32 = 12;
const SPAN_LINKS: u32 = 13;
const SPAN_DROPPED_LINKS: u32 = 14;
const SPAN_STATUS: u32 = 15;
const SPAN_FLAGS: u32 = 16;
/// `Span.Event`.
const EVENT_TIME: u32 = 1;
const EVENT_NAME: u32 = 2;
const EVENT_ATTRIBUTES: u32 = 3;
const EVENT_DROPPED_ATTRIBUTES: u32 = 4;
/// `Span.Link`.
const LINK_TRACE_ID: u32 = 1;
const LINK_SPAN_ID: u32 = 2;
const LINK_TRACE_STATE: u32 = 3;
const LINK_ATTRIBUTES: u32 = 4;
const LINK_DROPPED_ATTRIBUTES: u32 = 5;
const LINK_FLAGS: u32 = 6;
/// `Status`.
const STATUS_MESSAGE: u32 = 2;
const STATUS_CODE: u32 = 3;
/// `KeyValue`.
const KEY_VALUE_KEY: u32 = 1;
const KEY_VALUE_VALUE: u32 = 2;
/// `AnyValue`'s oneof members.
const ANY_STRING: u32 = 1;
const ANY_BOOL: u32 = 2;
const ANY_INT: u32 = 3;
const ANY_DOUBLE: u32 = 4;
const ANY_ARRAY: u32 = 5;
/// `ArrayValue.values`.
const ARRAY_VALUES: u32 = 1;

/// Writes batches; its buffers keep their capacity from one batch to the next.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    /// The `Resource` message's body, written once (`service.name` and the SDK's attributes).
    resource: Vec<u8>,
    resource_schema_url: String,
    /// One span's body, before its length is known.
    #[cfg(test)]
    span: Vec<u8>,
    /// One scope's spans, each with its key and length.
    #[cfg(test)]
    spans: Vec<u8>,
    /// The `ScopeSpans` fields, each with its key and length.
    #[cfg(test)]
    scopes: Vec<u8>,
}

impl Encoder {
    /// Sets the resource every batch is sent under.
    pub(crate) fn set_resource(&mut self, resource: &Resource) {
        self.resource.clear();
        for (key, value) in resource.iter() {
            let len = key_value_len(key.as_str(), value);
            len_delimited(RESOURCE_ATTRIBUTES, len, &mut self.resource);
            encode_key_value(key.as_str(), value, &mut self.resource);
        }
        self.resource_schema_url = resource.schema_url().unwrap_or_default().to_owned();
    }

    /// Writes `batch` as one `ExportTraceServiceRequest` into `body` (cleared first): one
    /// `ResourceSpans` with a `ScopeSpans` per instrumentation scope, in order of first use.
    /// The reference the spool's framing ([`Encoder::frame`]) is tested against: the batch
    /// processor no longer feeds this encoder (gRPC uses the SDK's own).
    #[cfg(test)]
    pub(crate) fn encode(&mut self, batch: &[SpanData], body: &mut Vec<u8>) {
        body.clear();
        self.scopes.clear();
        // Almost always one scope (the ledger's tracer): a linear search beats a map.
        let mut done: Vec<&InstrumentationScope> = Vec::new();
        for first in batch {
            let scope = &first.instrumentation_scope;
            if done.contains(&scope) {
                continue;
            }
            done.push(scope);
            self.spans.clear();
            for span in batch
                .iter()
                .filter(|span| span.instrumentation_scope == *scope)
            {
                self.span.clear();
                encode_span(span, &mut self.span);
                len_delimited(SCOPE_SPANS_SPANS, self.span.len(), &mut self.spans);
                self.spans.extend_from_slice(&self.span);
            }
            let scope_len = scope_len(scope);
            let schema_url = scope.schema_url().unwrap_or_default();
            let scope_spans_len = message_field_len(SCOPE_SPANS_SCOPE, scope_len)
                + self.spans.len()
                + string_field_len(SCOPE_SPANS_SCHEMA_URL, schema_url);
            len_delimited(
                RESOURCE_SPANS_SCOPE_SPANS,
                scope_spans_len,
                &mut self.scopes,
            );
            len_delimited(SCOPE_SPANS_SCOPE, scope_len, &mut self.scopes);
            encode_scope(scope, &mut self.scopes);
            self.scopes.extend_from_slice(&self.spans);
            string_field(SCOPE_SPANS_SCHEMA_URL, schema_url, &mut self.scopes);
        }
        let resource_spans_len = message_field_len(RESOURCE_SPANS_RESOURCE, self.resource.len())
            + self.scopes.len()
            + string_field_len(RESOURCE_SPANS_SCHEMA_URL, &self.resource_schema_url);
        body.reserve(resource_spans_len + 16);
        len_delimited(REQUEST_RESOURCE_SPANS, resource_spans_len, body);
        len_delimited(RESOURCE_SPANS_RESOURCE, self.resource.len(), body);
        body.extend_from_slice(&self.resource);
        body.extend_from_slice(&self.scopes);
        string_field(RESOURCE_SPANS_SCHEMA_URL, &self.resource_schema_url, body);
    }
}

/// One span as a `ScopeSpans.spans` field (key, length, message), appended to `out`: the form a
/// span is kept in between its end and its export ([`crate::spool`]). `scratch` holds the
/// message while its length is measured.
pub(crate) fn span_field(span: &SpanParts<'_>, scratch: &mut Vec<u8>, out: &mut Vec<u8>) {
    scratch.clear();
    encode_parts(span, scratch);
    len_delimited(SCOPE_SPANS_SPANS, scratch.len(), out);
    out.extend_from_slice(scratch);
}

impl Encoder {
    /// Writes one `ExportTraceServiceRequest` of spans already written by [`span_field`], all of
    /// `scope`, into `body` (cleared first): the same bytes [`Encoder::encode`] writes for those
    /// spans. `spans` are runs of whole span fields; at least one span in all.
    pub(crate) fn frame(&self, scope: &InstrumentationScope, spans: &[&[u8]], body: &mut Vec<u8>) {
        body.clear();
        let spans_len: usize = spans.iter().map(|run| run.len()).sum();
        let scope_len = scope_len(scope);
        let schema_url = scope.schema_url().unwrap_or_default();
        let scope_spans_len = message_field_len(SCOPE_SPANS_SCOPE, scope_len)
            + spans_len
            + string_field_len(SCOPE_SPANS_SCHEMA_URL, schema_url);
        let resource_spans_len = message_field_len(RESOURCE_SPANS_RESOURCE, self.resource.len())
            + message_field_len(RESOURCE_SPANS_SCOPE_SPANS, scope_spans_len)
            + string_field_len(RESOURCE_SPANS_SCHEMA_URL, &self.resource_schema_url);
        body.reserve(resource_spans_len + 16);
        len_delimited(REQUEST_RESOURCE_SPANS, resource_spans_len, body);
        len_delimited(RESOURCE_SPANS_RESOURCE, self.resource.len(), body);
        body.extend_from_slice(&self.resource);
        len_delimited(RESOURCE_SPANS_SCOPE_SPANS, scope_spans_len, body);
        len_delimited(SCOPE_SPANS_SCOPE, scope_len, body);
        encode_scope(scope, body);
        for run in spans {
            body.extend_from_slice(run);
        }
        string_field(SCOPE_SPANS_SCHEMA_URL, schema_url, body);
        string_field(RESOURCE_SPANS_SCHEMA_URL, &self.resource_schema_url, body);
    }
}

/// What one span writes, borrowed from the span layer's record without building a `SpanData`:
/// its attributes come already written ([`EncodedAttributes`]). The tests build it from a
/// `SpanData` (`SpanParts::of`).
pub(crate) struct SpanParts<'a> {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    pub(crate) trace_state: &'a TraceState,
    pub(crate) parent_span_id: SpanId,
    pub(crate) name: &'a str,
    pub(crate) kind: &'a SpanKind,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    pub(crate) attributes: &'a [KeyValue],
    /// Written after `attributes`, as they are.
    pub(crate) encoded_attributes: &'a EncodedAttributes,
    pub(crate) dropped_attributes: u32,
    pub(crate) events: &'a [Event],
    pub(crate) dropped_events: u32,
    pub(crate) links: &'a [Link],
    pub(crate) dropped_links: u32,
    pub(crate) status: &'a Status,
    pub(crate) flags: TraceFlags,
}

/// For [`SpanParts::of`]: a `SpanData` has its attributes as values.
#[cfg(test)]
static NO_ENCODED_ATTRIBUTES: EncodedAttributes = EncodedAttributes { bytes: Vec::new() };

/// A `SpanData`'s parts: the tests' spans (the layer writes its record's).
#[cfg(test)]
impl<'a> SpanParts<'a> {
    pub(crate) fn of(span: &'a SpanData) -> Self {
        let context = &span.span_context;
        Self {
            trace_id: context.trace_id(),
            span_id: context.span_id(),
            trace_state: context.trace_state(),
            parent_span_id: span.parent_span_id,
            name: &span.name,
            kind: &span.span_kind,
            start: span.start_time,
            end: span.end_time,
            attributes: &span.attributes,
            encoded_attributes: &NO_ENCODED_ATTRIBUTES,
            dropped_attributes: span.dropped_attributes_count,
            events: &span.events.events,
            dropped_events: span.events.dropped_count,
            links: &span.links.links,
            dropped_links: span.links.dropped_count,
            status: &span.status,
            flags: context.trace_flags(),
        }
    }
}

#[cfg(test)]
fn encode_span(span: &SpanData, buf: &mut Vec<u8>) {
    encode_parts(&SpanParts::of(span), buf);
}

fn encode_parts(span: &SpanParts<'_>, buf: &mut Vec<u8>) {
    bytes_field(SPAN_TRACE_ID, &span.trace_id.to_bytes(), buf);
    bytes_field(SPAN_SPAN_ID, &span.span_id.to_bytes(), buf);
    string_field(SPAN_TRACE_STATE, &span.trace_state.header(), buf);
    if span.parent_span_id != SpanId::INVALID {
        bytes_field(SPAN_PARENT_SPAN_ID, &span.parent_span_id.to_bytes(), buf);
    }
    string_field(SPAN_NAME, span.name, buf);
    varint_field(SPAN_KIND, kind_number(span.kind), buf);
    fixed64_field(SPAN_START_TIME, unix_nanos(span.start), buf);
    fixed64_field(SPAN_END_TIME, unix_nanos(span.end), buf);
    for attribute in span.attributes {
        key_value_field(SPAN_ATTRIBUTES, attribute, buf);
    }
    buf.extend_from_slice(&span.encoded_attributes.bytes);
    varint_field(
        SPAN_DROPPED_ATTRIBUTES,
        u64::from(span.dropped_attributes),
        buf,
    );
    for event in span.events {
        let name_len = string_field_len(EVENT_NAME, &event.name);
        let len = fixed64_field_len(EVENT_TIME, unix_nanos(event.timestamp))
            + name_len
            + attributes_len(EVENT_ATTRIBUTES, &event.attributes)
            + varint_field_len(
                EVENT_DROPPED_ATTRIBUTES,
                u64::from(event.dropped_attributes_count),
            );
        len_delimited(SPAN_EVENTS, len, buf);
        fixed64_field(EVENT_TIME, unix_nanos(event.timestamp), buf);
        string_field(EVENT_NAME, &event.name, buf);
        for attribute in &event.attributes {
            key_value_field(EVENT_ATTRIBUTES, attribute, buf);
        }
        varint_field(
            EVENT_DROPPED_ATTRIBUTES,
            u64::from(event.dropped_attributes_count),
            buf,
        );
    }
    varint_field(SPAN_DROPPED_EVENTS, u64::from(span.dropped_events), buf);
    for link in span.links {
        encode_link(link, buf);
    }
    varint_field(SPAN_DROPPED_LINKS, u64::from(span.dropped_links), buf);
    let (code, message) = match span.status {
        Status::Unset => (0, ""),
        Status::Ok => (1, ""),
        Status::Error { description } => (2, description.as_ref()),
    };
    let status_len =
        string_field_len(STATUS_MESSAGE, message) + varint_field_len(STATUS_CODE, code);
    len_delimited(SPAN_STATUS, status_len, buf);
    string_field(STATUS_MESSAGE, message, buf);
    varint_field(STATUS_CODE, code, buf);
    fixed32_field(SPAN_FLAGS, u32::from(span.flags.to_u8()), buf);
}

fn encode_link(link: &Link, buf: &mut Vec<u8>) {
    let context = &link.span_context;
    let trace_state = context.trace_state().header();
    let flags = u32::from(context.trace_flags().to_u8());
    let len = bytes_field_len(LINK_TRACE_ID, 16)
        + bytes_field_len(LINK_SPAN_ID, 8)
        + string_field_len(LINK_TRACE_STATE, &trace_state)
        + attributes_len(LINK_ATTRIBUTES, &link.attributes)
        + varint_field_len(
            LINK_DROPPED_ATTRIBUTES,
            u64::from(link.dropped_attributes_count),
        )
        + fixed32_field_len(LINK_FLAGS, flags);
    len_delimited(SPAN_LINKS, len, buf);
    bytes_field(LINK_TRACE_ID, &context.trace_id().to_bytes(), buf);
    bytes_field(LINK_SPAN_ID, &context.span_id().to_bytes(), buf);
    string_field(LINK_TRACE_STATE, &trace_state, buf);
    for attribute in &link.attributes {
        key_value_field(LINK_ATTRIBUTES, attribute, buf);
    }
    varint_field(
        LINK_DROPPED_ATTRIBUTES,
        u64::from(link.dropped_attributes_count),
        buf,
    );
    fixed32_field(LINK_FLAGS, flags, buf);
}

fn scope_len(scope: &InstrumentationScope) -> usize {
    string_field_len(SCOPE_NAME, scope.name())
        + string_field_len(SCOPE_VERSION, scope.version().unwrap_or_default())
        + scope
            .attributes()
            .map(|kv| {
                message_field_len(SCOPE_ATTRIBUTES, key_value_len(kv.key.as_str(), &kv.value))
            })
            .sum::<usize>()
}

fn encode_scope(scope: &InstrumentationScope, buf: &mut Vec<u8>) {
    string_field(SCOPE_NAME, scope.name(), buf);
    string_field(SCOPE_VERSION, scope.version().unwrap_or_default(), buf);
    for attribute in scope.attributes() {
        key_value_field(SCOPE_ATTRIBUTES, attribute, buf);
    }
}

fn kind_number(kind: &SpanKind) -> u64 {
    // `Span.SpanKind`: 0 is unspecified.
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

/// Nanoseconds since the Unix epoch; a time before it (a clock set wrong) as 0, as
/// opentelemetry-proto writes it.
fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

/// A span's attributes as its `Span.attributes` fields, written as the span layer records them
/// (so recording costs the request path little: docs/src/performance.md): no `KeyValue`, `Value` or `String` per attribute,
/// and nothing left to convert when the span ends. A key written again replaces its field where
/// it is, so a span exports each attribute once, with its last value, in order of first record.
#[derive(Debug, Default)]
pub(crate) struct EncodedAttributes {
    bytes: Vec<u8>,
}

impl EncodedAttributes {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
        }
    }

    pub(crate) fn clear(&mut self) {
        self.bytes = Vec::new();
    }

    /// Writes `key` = `value`. `replace`: a field of the same key may be there already (a
    /// span's creation writes each key once and says `false`, sparing the search).
    #[cfg(test)]
    pub(crate) fn set(&mut self, key: &str, value: Scalar<'_>, replace: bool) {
        self.set_in("", key, value, replace);
    }

    /// Writes `namespace` + `name` = `value`: the key is written in its two parts, so a
    /// namespaced key (`opledger.` + a field's name) costs no string of its own.
    pub(crate) fn set_in(&mut self, namespace: &str, name: &str, value: Scalar<'_>, replace: bool) {
        let existing = if replace {
            self.find(namespace, name)
        } else {
            None
        };
        let start = self.bytes.len();
        let key_len = namespace.len() + name.len();
        let len = bytes_field_len(KEY_VALUE_KEY, key_len)
            + message_field_len(KEY_VALUE_VALUE, scalar_len(value));
        len_delimited(SPAN_ATTRIBUTES, len, &mut self.bytes);
        if key_len > 0 {
            len_delimited(KEY_VALUE_KEY, key_len, &mut self.bytes);
            self.bytes.extend_from_slice(namespace.as_bytes());
            self.bytes.extend_from_slice(name.as_bytes());
        }
        len_delimited(KEY_VALUE_VALUE, scalar_len(value), &mut self.bytes);
        encode_scalar(value, &mut self.bytes);
        if let Some(old) = existing {
            // Rare (a field recorded twice): the new field moves into the old one's place.
            let written = self.bytes.split_off(start);
            self.bytes.splice(old, written);
        }
    }

    /// The byte range of the field whose key is `namespace` + `name`.
    fn find(&self, namespace: &str, name: &str) -> Option<std::ops::Range<usize>> {
        let mut at = 0;
        while at < self.bytes.len() {
            let (field, body) = self.field_at(at)?;
            let key = self.key_of(body.clone());
            if key.len() == namespace.len() + name.len()
                && key.starts_with(namespace.as_bytes())
                && key.ends_with(name.as_bytes())
            {
                return Some(field);
            }
            at = field.end;
        }
        None
    }

    /// The field starting at `at`: its whole range and its `KeyValue` body's range.
    fn field_at(&self, at: usize) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
        let mut rest = &self.bytes[at..];
        let (tag, _) = decode_key(&mut rest).ok()?;
        debug_assert_eq!(tag, SPAN_ATTRIBUTES);
        let len = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
        let body_start = self.bytes.len() - rest.len();
        let end = body_start.checked_add(len)?;
        (end <= self.bytes.len()).then_some((at..end, body_start..end))
    }

    /// The key of the `KeyValue` in `body` (empty when the field is left out, as for "").
    fn key_of(&self, body: std::ops::Range<usize>) -> &[u8] {
        let mut rest = &self.bytes[body.clone()];
        match decode_key(&mut rest) {
            Ok((KEY_VALUE_KEY, WireType::LengthDelimited)) => {
                let Ok(len) = decode_varint(&mut rest) else {
                    return &[];
                };
                let start = body.end - rest.len();
                let end = usize::try_from(len).map_or(body.end, |len| start + len);
                &self.bytes[start..end.min(body.end)]
            }
            _ => &[],
        }
    }

    /// The attributes as values, in order: for the SDK's span processor (gRPC) and the tests.
    pub(crate) fn key_values(&self) -> Vec<KeyValue> {
        let mut values = Vec::new();
        let mut at = 0;
        while let Some((field, body)) = (at < self.bytes.len()).then(|| self.field_at(at)).flatten()
        {
            let key = String::from_utf8_lossy(self.key_of(body.clone())).into_owned();
            let value = self.value_of(body).unwrap_or(Value::Bool(false));
            values.push(KeyValue::new(key, value));
            at = field.end;
        }
        values
    }

    /// The scalar of the `KeyValue` in `body` (this type writes nothing else).
    fn value_of(&self, body: std::ops::Range<usize>) -> Option<Value> {
        let mut rest = &self.bytes[body];
        loop {
            let (tag, wire) = decode_key(&mut rest).ok()?;
            let len = match wire {
                WireType::LengthDelimited => {
                    usize::try_from(decode_varint(&mut rest).ok()?).ok()?
                }
                _ => return None,
            };
            let (field, after) = rest.split_at_checked(len)?;
            rest = after;
            if tag != KEY_VALUE_VALUE {
                continue;
            }
            let mut any = field;
            let (member, _) = decode_key(&mut any).ok()?;
            return match member {
                ANY_STRING => {
                    let len = usize::try_from(decode_varint(&mut any).ok()?).ok()?;
                    let text = any.get(..len)?;
                    Some(Value::String(
                        String::from_utf8_lossy(text).into_owned().into(),
                    ))
                }
                ANY_BOOL => Some(Value::Bool(decode_varint(&mut any).ok()? != 0)),
                ANY_INT => Some(Value::I64(decode_varint(&mut any).ok()? as i64)),
                ANY_DOUBLE => Some(Value::F64(f64::from_le_bytes(
                    any.get(..8)?.try_into().ok()?,
                ))),
                _ => None,
            };
        }
    }
}

/// One attribute value as `AnyValue`'s scalar members.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scalar<'a> {
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(&'a str),
}

fn scalar_len(value: Scalar<'_>) -> usize {
    match value {
        Scalar::Bool(_) => key_len(ANY_BOOL) + 1,
        // Protobuf writes a negative int64 as its two's complement: ten bytes.
        Scalar::Int(int) => key_len(ANY_INT) + encoded_len_varint(int as u64),
        Scalar::Double(_) => key_len(ANY_DOUBLE) + 8,
        Scalar::Str(text) => message_field_len(ANY_STRING, text.len()),
    }
}

fn encode_scalar(value: Scalar<'_>, buf: &mut Vec<u8>) {
    match value {
        Scalar::Bool(flag) => {
            encode_key(ANY_BOOL, WireType::Varint, buf);
            encode_varint(u64::from(flag), buf);
        }
        Scalar::Int(int) => {
            encode_key(ANY_INT, WireType::Varint, buf);
            encode_varint(int as u64, buf);
        }
        Scalar::Double(double) => {
            encode_key(ANY_DOUBLE, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&double.to_le_bytes());
        }
        Scalar::Str(text) => {
            len_delimited(ANY_STRING, text.len(), buf);
            buf.extend_from_slice(text.as_bytes());
        }
    }
}

/// Calls `each` with the array's items in order.
fn for_each_item(array: &Array, mut each: impl FnMut(Scalar<'_>)) {
    match array {
        Array::Bool(items) => items.iter().for_each(|item| each(Scalar::Bool(*item))),
        Array::I64(items) => items.iter().for_each(|item| each(Scalar::Int(*item))),
        Array::F64(items) => items.iter().for_each(|item| each(Scalar::Double(*item))),
        Array::String(items) => items
            .iter()
            .for_each(|item| each(Scalar::Str(item.as_str()))),
        // A kind of array a later `opentelemetry` adds: written empty rather than guessed at.
        _ => {}
    }
}

fn array_len(array: &Array) -> usize {
    let mut len = 0;
    for_each_item(array, |item| {
        len += message_field_len(ARRAY_VALUES, scalar_len(item));
    });
    len
}

/// The scalar, or `None` for an array.
fn scalar(value: &Value) -> Option<Scalar<'_>> {
    match value {
        Value::Bool(flag) => Some(Scalar::Bool(*flag)),
        Value::I64(int) => Some(Scalar::Int(*int)),
        Value::F64(double) => Some(Scalar::Double(*double)),
        Value::String(text) => Some(Scalar::Str(text.as_str())),
        // Arrays, and a kind of value a later `opentelemetry` adds (written as an empty array
        // rather than guessed at).
        _ => None,
    }
}

fn any_value_len(value: &Value) -> usize {
    match (scalar(value), value) {
        (Some(scalar), _) => scalar_len(scalar),
        (None, Value::Array(array)) => message_field_len(ANY_ARRAY, array_len(array)),
        (None, _) => message_field_len(ANY_ARRAY, 0),
    }
}

fn encode_any_value(value: &Value, buf: &mut Vec<u8>) {
    match (scalar(value), value) {
        (Some(scalar), _) => encode_scalar(scalar, buf),
        (None, Value::Array(array)) => {
            len_delimited(ANY_ARRAY, array_len(array), buf);
            for_each_item(array, |item| {
                len_delimited(ARRAY_VALUES, scalar_len(item), buf);
                encode_scalar(item, buf);
            });
        }
        (None, _) => len_delimited(ANY_ARRAY, 0, buf),
    }
}

fn key_value_len(key: &str, value: &Value) -> usize {
    string_field_len(KEY_VALUE_KEY, key) + message_field_len(KEY_VALUE_VALUE, any_value_len(value))
}

fn encode_key_value(key: &str, value: &Value, buf: &mut Vec<u8>) {
    string_field(KEY_VALUE_KEY, key, buf);
    len_delimited(KEY_VALUE_VALUE, any_value_len(value), buf);
    encode_any_value(value, buf);
}

fn key_value_field(tag: u32, attribute: &KeyValue, buf: &mut Vec<u8>) {
    let key = attribute.key.as_str();
    len_delimited(tag, key_value_len(key, &attribute.value), buf);
    encode_key_value(key, &attribute.value, buf);
}

fn attributes_len(tag: u32, attributes: &[KeyValue]) -> usize {
    attributes
        .iter()
        .map(|kv| message_field_len(tag, key_value_len(kv.key.as_str(), &kv.value)))
        .sum()
}

// The wire format's field shapes: the `_len` functions say what the writers write.

fn len_delimited(tag: u32, len: usize, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

fn message_field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn bytes_field(tag: u32, bytes: &[u8], buf: &mut Vec<u8>) {
    if !bytes.is_empty() {
        len_delimited(tag, bytes.len(), buf);
        buf.extend_from_slice(bytes);
    }
}

fn bytes_field_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        message_field_len(tag, len)
    }
}

fn string_field(tag: u32, text: &str, buf: &mut Vec<u8>) {
    bytes_field(tag, text.as_bytes(), buf);
}

fn string_field_len(tag: u32, text: &str) -> usize {
    bytes_field_len(tag, text.len())
}

fn varint_field(tag: u32, value: u64, buf: &mut Vec<u8>) {
    if value != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(value, buf);
    }
}

fn varint_field_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(value)
    }
}

fn fixed64_field(tag: u32, value: u64, buf: &mut Vec<u8>) {
    if value != 0 {
        encode_key(tag, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

fn fixed64_field_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + 8
    }
}

fn fixed32_field(tag: u32, value: u32, buf: &mut Vec<u8>) {
    if value != 0 {
        encode_key(tag, WireType::ThirtyTwoBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

fn fixed32_field_len(tag: u32, value: u32) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + 4
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use opentelemetry::trace::SpanContext;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message as _;

    use super::*;

    fn context(trace: u128, span: u64, state: &str) -> SpanContext {
        let state = if state.is_empty() {
            TraceState::NONE
        } else {
            state.parse().expect("a trace state")
        };
        SpanContext::new(
            TraceId::from_u128(trace),
            SpanId::from_u64(span),
            TraceFlags::SAMPLED,
            false,
            state,
        )
    }

    /// A span with every kind of value, an event and a link: what the ledger sends and more.
    fn full_span(scope: &InstrumentationScope) -> SpanData {
        let start = UNIX_EPOCH + Duration::from_nanos(1_764_777_777_123_456_789);
        let mut events = SpanEvents::default();
        events.events.push(opentelemetry::trace::Event::new(
            "outcome unknown",
            start + Duration::from_millis(3),
            vec![KeyValue::new("error", "connection reset")],
            0,
        ));
        events.dropped_count = 2;
        let mut links = SpanLinks::default();
        links.links.push(Link::new(
            context(7, 8, "vendor=x,other=y"),
            vec![KeyValue::new("opledger.link", "operation_intent")],
            1,
        ));
        SpanData {
            span_context: context(
                0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736,
                0x00f0_67aa,
                "a=b",
            ),
            parent_span_id: SpanId::from_u64(42),
            span_kind: SpanKind::Client,
            name: Cow::Borrowed("send"),
            start_time: start,
            end_time: start + Duration::from_millis(5),
            attributes: scalar_attributes()
                .into_iter()
                .chain([
                    KeyValue::new("codes", Value::Array(Array::I64(vec![200, -1, 0]))),
                    KeyValue::new(
                        "names",
                        Value::Array(Array::String(vec!["a".into(), "".into()])),
                    ),
                    KeyValue::new("flags", Value::Array(Array::Bool(vec![true, false]))),
                    KeyValue::new("weights", Value::Array(Array::F64(vec![1.5]))),
                ])
                .collect(),
            dropped_attributes_count: 3,
            events,
            links,
            status: Status::error("the provider did not answer"),
            instrumentation_scope: scope.clone(),
        }
    }

    /// A root span with nothing but its ids, name and times.
    fn bare_span(scope: &InstrumentationScope) -> SpanData {
        SpanData {
            span_context: context(9, 10, ""),
            parent_span_id: SpanId::INVALID,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed("read_model_batch"),
            start_time: UNIX_EPOCH + Duration::from_secs(1),
            end_time: UNIX_EPOCH + Duration::from_secs(2),
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::Unset,
            instrumentation_scope: scope.clone(),
        }
    }

    fn resource() -> Resource {
        Resource::builder()
            .with_service_name("opledger-test")
            .build()
    }

    /// `batch` encoded under `resource` and decoded with opentelemetry-proto's types.
    fn encoded(resource: &Resource, batch: &[SpanData]) -> ExportTraceServiceRequest {
        let mut encoder = Encoder::default();
        encoder.set_resource(resource);
        let mut body = Vec::new();
        // Twice into the same buffers: what a batch leaves behind must not leak into the next.
        encoder.encode(&batch[..1], &mut body);
        encoder.encode(batch, &mut body);
        ExportTraceServiceRequest::decode(body.as_slice()).expect("valid OTLP protobuf")
    }

    #[test]
    fn a_batch_decodes_as_the_same_request_the_otlp_crates_conversion_makes() {
        let scope = InstrumentationScope::builder("opledger")
            .with_version("1.2.3")
            .with_attributes([KeyValue::new("scope.attribute", 5_i64)])
            .build();
        let batch = vec![full_span(&scope), bare_span(&scope), full_span(&scope)];
        // One resource for both: its attributes are in a hash map, iterated in its own order.
        let resource = resource();
        let expected = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                batch.clone(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(encoded(&resource, &batch), expected);
    }

    #[test]
    fn spans_written_where_they_end_frame_the_same_bytes_as_the_batch_encoder() {
        let scope = InstrumentationScope::builder("opledger")
            .with_version("1.2.3")
            .with_attributes([KeyValue::new("scope.attribute", 5_i64)])
            .build();
        let batch = vec![full_span(&scope), bare_span(&scope), full_span(&scope)];
        let mut encoder = Encoder::default();
        encoder.set_resource(&resource());
        let mut expected = Vec::new();
        encoder.encode(&batch, &mut expected);
        // Two runs, as two threads' queues hold them.
        let (mut scratch, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
        span_field(&SpanParts::of(&batch[0]), &mut scratch, &mut first);
        span_field(&SpanParts::of(&batch[1]), &mut scratch, &mut second);
        span_field(&SpanParts::of(&batch[2]), &mut scratch, &mut second);
        let mut body = vec![7; 3];
        encoder.frame(&scope, &[&first, &second], &mut body);
        assert_eq!(body, expected);
    }

    /// Scalar attributes of every kind, as the span layer records them.
    fn scalar_attributes() -> Vec<KeyValue> {
        vec![
            KeyValue::new("operation_id", "op_01J"),
            KeyValue::new("attempt_number", 1_i64),
            KeyValue::new("negative", -3_i64),
            KeyValue::new("ratio", 0.25),
            KeyValue::new("retry", false),
            KeyValue::new("", "an empty key"),
            KeyValue::new("empty", ""),
        ]
    }

    fn written(attributes: &[KeyValue], replace: bool) -> EncodedAttributes {
        let mut encoded = EncodedAttributes::default();
        for attribute in attributes {
            let value = scalar(&attribute.value).expect("a scalar");
            encoded.set(attribute.key.as_str(), value, replace);
        }
        encoded
    }

    #[test]
    fn attributes_written_as_recorded_make_the_same_span_bytes_as_their_values() {
        let scope = InstrumentationScope::builder("opledger").build();
        let mut span = full_span(&scope);
        span.attributes = scalar_attributes();
        let (mut scratch, mut expected, mut actual) = (Vec::new(), Vec::new(), Vec::new());
        span_field(&SpanParts::of(&span), &mut scratch, &mut expected);
        let encoded = written(&scalar_attributes(), true);
        span.attributes = Vec::new();
        let mut parts = SpanParts::of(&span);
        parts.encoded_attributes = &encoded;
        span_field(&parts, &mut scratch, &mut actual);
        assert_eq!(actual, expected);
        assert_eq!(encoded.key_values(), scalar_attributes());
    }

    #[test]
    fn a_key_written_again_keeps_its_place_and_takes_its_last_value() {
        let mut encoded = EncodedAttributes::default();
        encoded.set("state", Scalar::Str("unknown"), true);
        encoded.set("attempt", Scalar::Int(2), true);
        encoded.set("", Scalar::Bool(true), true);
        encoded.set("state", Scalar::Str("succeeded after a long wait"), true);
        encoded.set("attempt", Scalar::Int(-3), true);
        encoded.set("", Scalar::Bool(false), true);
        encoded.set("state", Scalar::Str("x"), true);
        let expected = vec![
            KeyValue::new("state", "x"),
            KeyValue::new("attempt", -3_i64),
            KeyValue::new("", false),
        ];
        assert_eq!(encoded.key_values(), expected);
        assert_eq!(encoded.bytes, written(&expected, false).bytes);
        // As opentelemetry-proto reads them: a span's attributes and nothing else.
        let span = opentelemetry_proto::tonic::trace::v1::Span::decode(encoded.bytes.as_slice())
            .expect("valid Span fields");
        let converted = opentelemetry_proto::transform::common::tonic::Attributes::from(expected);
        assert_eq!(span.attributes, converted.0);
    }

    #[test]
    fn spans_of_two_scopes_go_in_two_scope_spans_in_order_of_first_use() {
        let ours = InstrumentationScope::builder("opledger").build();
        let other = InstrumentationScope::builder("other").build();
        let batch = vec![bare_span(&ours), full_span(&other), full_span(&ours)];
        let request = encoded(&resource(), &batch);
        assert_eq!(request.resource_spans.len(), 1);
        let scopes: Vec<(String, Vec<String>)> = request.resource_spans[0]
            .scope_spans
            .iter()
            .map(|scope_spans| {
                (
                    scope_spans.scope.as_ref().expect("a scope").name.clone(),
                    scope_spans
                        .spans
                        .iter()
                        .map(|span| span.name.clone())
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            scopes,
            [
                (
                    "opledger".to_owned(),
                    vec!["read_model_batch".to_owned(), "send".to_owned()]
                ),
                ("other".to_owned(), vec!["send".to_owned()]),
            ]
        );
    }
}
