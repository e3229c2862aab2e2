//! The exporter, counted: a batch that could not be delivered adds one to the domain's
//! export-failure count, and nothing else happens to the ledger.

use std::time::Duration;

use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

/// Wraps an exporter so its failures are counted (and logged at most on the 1st, 2nd, 4th, 8th…
/// failure: a collector that is down must not flood the logs either).
#[derive(Debug)]
pub(crate) struct Counted<E> {
    inner: E,
}

impl<E> Counted<E> {
    pub(crate) fn new(inner: E) -> Self {
        Self { inner }
    }
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(error) = &result {
            opledger_domain::trace_context::count_export_failure();
            let failures = opledger_domain::trace_context::export_failures();
            if failures.is_power_of_two() {
                tracing::warn!(%error, spans, failures, "trace export failed; the spans are dropped");
            }
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
