//! The exporters: OTLP over HTTP/protobuf posted here (see [`OtlpHttp`], fed by
//! [`crate::spool`]), and the counting wrapper around gRPC's (the SDK's): a batch that could not
//! be delivered adds one to the domain's export-failure count, and nothing else happens to the
//! ledger.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use crate::layer::Backlog;
use crate::spool::Post;

/// Counts a batch that could not be delivered, and logs it at most on the 1st, 2nd, 4th, 8th…
/// failure: a collector that is down must not flood the logs either.
pub(crate) fn count_failure(error: &dyn std::fmt::Display, spans: usize) {
    opledger_domain::trace_context::count_export_failure();
    let failures = opledger_domain::trace_context::export_failures();
    if failures.is_power_of_two() {
        tracing::warn!(%error, spans, failures, "trace export failed; the spans are dropped");
    }
}

/// Wraps an exporter so its failures are counted ([`count_failure`]), and every batch, exported
/// or not, gives its places in the queue back to the span layer's [`Backlog`].
#[derive(Debug)]
pub(crate) struct Counted<E> {
    inner: E,
    backlog: Arc<Backlog>,
}

impl<E> Counted<E> {
    pub(crate) fn new(inner: E, backlog: Arc<Backlog>) -> Self {
        Self { inner, backlog }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        self.backlog.exported(spans);
        if let Err(error) = &result {
            count_failure(error, spans);
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// OTLP over HTTP/protobuf: posts the bodies [`crate::spool`] frames, with reqwest's blocking
/// client, from the spool's export thread.
pub(crate) struct OtlpHttp {
    client: reqwest::blocking::Client,
    /// The full URL batches are posted to (`.../v1/traces`).
    endpoint: String,
}

impl std::fmt::Debug for OtlpHttp {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the headers: their values are secrets.
        formatter
            .debug_struct("OtlpHttp")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl OtlpHttp {
    /// A client posting to `endpoint` with `headers` on every request, each post bounded by
    /// `timeout`.
    pub(crate) fn new(
        endpoint: String,
        headers: &[(String, String)],
        timeout: Duration,
    ) -> Result<Self, String> {
        let mut header_map = HeaderMap::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("the header name {name:?} is not an HTTP header name"))?;
            // The value is a secret: the message says which header, not what it holds.
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("the value of the header {name} is not a header value"))?;
            header_map.insert(name, value);
        }
        header_map.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        // The blocking client runs a runtime of its own, which may be neither built nor dropped
        // on a tokio thread (`install` runs on one): built on a thread of its own, as
        // opentelemetry-otlp does.
        let client = std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .default_headers(header_map)
                .build()
        })
        .join()
        .map_err(|_| "building the HTTP client panicked".to_owned())?
        .map_err(|error| error.to_string())?;
        Ok(Self { client, endpoint })
    }
}

impl Post for OtlpHttp {
    fn post(&mut self, body: &mut Vec<u8>) -> Result<(), String> {
        let sent = Bytes::from(std::mem::take(body));
        let response = self.client.post(&self.endpoint).body(sent.clone()).send();
        // The buffer back for the next body when the client has let go of it (almost always once
        // the answer is in; if not, the next body starts empty). A fresh one per post was
        // allocated on this thread and freed on reqwest's, so this thread's allocator kept taking
        // fresh pages, each zeroed by the kernel (docs/src/performance.md).
        if let Ok(returned) = sent.try_into_mut() {
            *body = Vec::from(returned);
        }
        let response = response.map_err(|error| error.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!(
                "the collector at {} answered {status}",
                self.endpoint
            ));
        }
        Ok(())
    }
}
