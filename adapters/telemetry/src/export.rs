//! The exporters the export thread ([`crate::batch`]) hands batches to: OTLP over HTTP/protobuf
//! written here (see [`OtlpHttp`]), and gRPC through opentelemetry-otlp's tonic exporter.

use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use crate::batch::Exporter;
use crate::otlp_proto::Encoder;

/// gRPC: opentelemetry-otlp's exporter, whose `export` takes an owned batch and is async (its
/// tonic channel was built on the runtime `install` ran in; the future is driven here, on the
/// export thread, as the SDK's batch processor did).
#[derive(Debug)]
pub(crate) struct Grpc(pub(crate) opentelemetry_otlp::SpanExporter);

impl Exporter for Grpc {
    fn export(&mut self, spans: &mut Vec<SpanData>) -> Result<(), String> {
        // Moved into a batch of its own, so `spans` keeps its capacity for the next one.
        let mut batch = Vec::with_capacity(spans.len());
        batch.append(spans);
        futures_executor::block_on(self.0.export(batch)).map_err(|error| error.to_string())
    }
}

/// OTLP over HTTP/protobuf: each batch encoded in place by [`Encoder`] (no copy of a span) and
/// posted with reqwest's blocking client, from the batch processor's own thread.
pub(crate) struct OtlpHttp {
    client: reqwest::blocking::Client,
    /// The full URL batches are posted to (`.../v1/traces`).
    endpoint: String,
    /// The encoder and the body buffer, reused batch after batch.
    buffers: Buffers,
}

#[derive(Debug, Default)]
struct Buffers {
    encoder: Encoder,
    /// The last body's buffer, back from the client. A fresh one per post was allocated on this
    /// thread and freed on reqwest's, so this thread's allocator kept taking fresh pages, each
    /// zeroed by the kernel (README, "Trace export").
    body: Vec<u8>,
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
        Ok(Self {
            client,
            endpoint,
            buffers: Buffers::default(),
        })
    }

    /// `service.name` and the SDK's resource attributes, on every batch.
    pub(crate) fn set_resource(&mut self, resource: &Resource) {
        self.buffers.encoder.set_resource(resource);
    }

    fn post(&mut self, batch: &[SpanData]) -> Result<(), String> {
        let Buffers { encoder, body } = &mut self.buffers;
        encoder.encode(batch, body);
        let sent = Bytes::from(std::mem::take(body));
        let response = self.client.post(&self.endpoint).body(sent.clone()).send();
        // Back when the client has let go of it (almost always once the answer is in); if not,
        // the next body starts empty.
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

impl Exporter for OtlpHttp {
    fn export(&mut self, spans: &mut Vec<SpanData>) -> Result<(), String> {
        self.post(spans)
    }
}
