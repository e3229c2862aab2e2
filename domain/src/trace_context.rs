//! The trace context port: how the ledger keeps the W3C trace context of the request that
//! recorded an intent, and joins later work on that operation to it, without the domain (or any
//! adapter but `adapters/telemetry`) depending on OpenTelemetry.
//!
//! The binary installs one [`TraceContext`] when export is configured; until then every function
//! here is one atomic load and returns nothing, so a ledger without telemetry pays nothing for it
//! (the hot path's numbers are in docs/src/performance.md). Trace context is a pointer for people reading a
//! tracing tool: it must never decide anything, and it never carries arguments or secrets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The longest `traceparent` kept, in bytes. Version 00 is exactly 55; later versions may only
/// append fields, and a header longer than this is not kept (W3C Trace Context, section 3.2.4).
pub const MAX_TRACEPARENT_BYTES: usize = 256;

/// What the telemetry adapter does for the rest of the code.
pub trait TraceContext: Send + Sync + 'static {
    /// The `traceparent` of `span` (W3C Trace Context), when it belongs to a sampled trace.
    fn traceparent_of(&self, span: &tracing::Span) -> Option<String>;
    /// The `traceparent` of the current span. The default asks [`TraceContext::traceparent_of`]
    /// of `Span::current()`; an adapter that can read the current span in place overrides it,
    /// since `Span::current()` is a handle (a reference count taken and given back through the
    /// subscriber), and every event written asks.
    fn traceparent_of_current(&self) -> Option<String> {
        self.traceparent_of(&tracing::Span::current())
    }
    /// Makes the caller's `traceparent` (and `tracestate`) the parent of `span`; a malformed
    /// header is ignored, as the W3C specification says, and `span` starts a trace of its own.
    fn set_remote_parent(&self, span: &tracing::Span, traceparent: &str, tracestate: Option<&str>);
    /// Joins `span`, work done later on an operation, to the trace `stored` (the
    /// `traceparent` kept with its intent): as its child when `span` has no trace of its own
    /// (a background worker's drive), else by a link (an operator's request, in the trace of
    /// its own caller).
    fn continue_from(&self, span: &tracing::Span, stored: &str);
}

static INSTALLED: OnceLock<Box<dyn TraceContext>> = OnceLock::new();
static EXPORT_FAILURES: AtomicU64 = AtomicU64::new(0);

/// Installs the adapter; `false` when one was installed already (the first stays).
pub fn install(adapter: Box<dyn TraceContext>) -> bool {
    INSTALLED.set(adapter).is_ok()
}

/// Whether an adapter is installed (trace export is on).
pub fn enabled() -> bool {
    INSTALLED.get().is_some()
}

/// The `traceparent` of the current span, to keep with the events being written.
pub fn current() -> Option<String> {
    let adapter = INSTALLED.get()?;
    adapter
        .traceparent_of_current()
        .filter(|traceparent| traceparent.len() <= MAX_TRACEPARENT_BYTES)
}

/// The `traceparent` of `span`, for a header on an outbound request.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    INSTALLED.get()?.traceparent_of(span)
}

/// See [`TraceContext::set_remote_parent`]; nothing when export is off.
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    if let Some(adapter) = INSTALLED.get() {
        if traceparent.len() <= MAX_TRACEPARENT_BYTES {
            adapter.set_remote_parent(span, traceparent, tracestate);
        }
    }
}

/// See [`TraceContext::continue_from`]; nothing when export is off or nothing was stored.
pub fn continue_from(span: &tracing::Span, stored: Option<&str>) {
    if let (Some(adapter), Some(stored)) = (INSTALLED.get(), stored) {
        adapter.continue_from(span, stored);
    }
}

/// The trace id (32 hex digits) in a `traceparent`, for people matching an attempt with their
/// tracing tool; `None` for anything that is not a version-00-shaped header.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (_version, trace_id) = (parts.next()?, parts.next()?);
    let hex = trace_id.len() == 32 && trace_id.bytes().all(|byte| byte.is_ascii_hexdigit());
    hex.then_some(trace_id)
}

/// Counts one batch of spans the exporter could not deliver. Export failing must cost the ledger
/// nothing but this count (the `/metrics` counter `opledger_trace_export_failures_total`).
pub fn count_export_failure() {
    EXPORT_FAILURES.fetch_add(1, Ordering::Relaxed);
}

/// How many span batches could not be exported since start.
pub fn export_failures() -> u64 {
    EXPORT_FAILURES.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_id_is_read_from_a_traceparent_and_nothing_from_garbage() {
        assert_eq!(
            trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_id_of("00-xyz-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id_of(""), None);
    }

    #[test]
    fn without_an_installed_adapter_nothing_is_captured() {
        assert_eq!(current(), None);
        assert!(!enabled());
    }
}
