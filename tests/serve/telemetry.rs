//! OpenTelemetry export, against a real OTLP HTTP/protobuf receiver: a loopback
//! server that decodes what `opledger serve` posts with the OTLP protobuf definitions
//! (`opentelemetry-proto`), as a collector would, and a real OTLP/gRPC receiver (the protocol's
//! Python service definitions served by grpcio, `otlp_grpc_receiver.py`). Nothing of the
//! exporter is mocked.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode as AxumStatus;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opledger_crm_stand::{FaultKind, Shape};
use prost::Message;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::python::python_venv::python_with;
use crate::support::{Harness, Server, ACCOUNT, DEADLINE, TENANT_A_TOKEN};

/// The caller's (an agent platform's) trace and span, as its `traceparent` names them.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// An operator's later request, in a trace of its own.
const OPERATOR_TRACE: &str = "a3ce929d0e0e47364bf92f3577b34da6";
const OPERATOR_SPAN: &str = "0ba902b700f067aa";
/// The task's title: an argument, which no span may carry.
const TITLE: &str = "Call the client about invoice 4471";
/// The stand's credential for the account (see support.rs), which no span may carry.
const ACCOUNT_TOKEN: &str = "token-acct-1";

/// A loopback OTLP/HTTP receiver keeping every span posted to `/v1/traces`.
pub(super) struct Receiver {
    pub(super) url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    pub(super) async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(Arc::clone(&spans));
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .expect("the receiver binds");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, spans }
    }

    pub(super) fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("not poisoned").clone()
    }

    /// Waits until a span satisfies `done` (the exporter sends in batches, in the background).
    pub(super) async fn until(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let started = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the receiver never got {what}; it has: {:#?}",
                spans.iter().map(describe).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn receive(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> AxumStatus {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return AxumStatus::BAD_REQUEST;
    };
    let mut kept = spans.lock().expect("not poisoned");
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            kept.extend(scope.spans);
        }
    }
    AxumStatus::OK
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

pub(super) fn attributes(span: &Span) -> BTreeMap<String, String> {
    span.attributes
        .iter()
        .map(|attribute| {
            let value = match attribute
                .value
                .as_ref()
                .and_then(|value| value.value.as_ref())
            {
                Some(AnyValue::StringValue(text)) => text.clone(),
                Some(AnyValue::IntValue(number)) => number.to_string(),
                Some(AnyValue::BoolValue(flag)) => flag.to_string(),
                Some(AnyValue::DoubleValue(number)) => number.to_string(),
                other => format!("{other:?}"),
            };
            (attribute.key.clone(), value)
        })
        .collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    attributes(span).remove(key)
}

fn describe(span: &Span) -> String {
    format!(
        "{} trace={} span={} parent={} {:?}",
        span.name,
        hex(&span.trace_id),
        hex(&span.span_id),
        hex(&span.parent_span_id),
        attributes(span)
    )
}

/// The spans of `operation_id`'s whole history that the receiver has.
fn named<'a>(spans: &'a [Span], name: &str, operation_id: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|span| {
            span.name == name && attribute(span, "operation_id").as_deref() == Some(operation_id)
        })
        .collect()
}

/// Whether `ancestor` is `span` or above it, following parent span ids within the spans held.
fn descends_from(spans: &[Span], span: &Span, ancestor: &[u8]) -> bool {
    let by_id: BTreeMap<&[u8], &Span> = spans.iter().map(|s| (s.span_id.as_slice(), s)).collect();
    let mut current = span;
    for _ in 0..64 {
        if current.span_id == ancestor || current.parent_span_id == ancestor {
            return true;
        }
        match by_id.get(current.parent_span_id.as_slice()) {
            Some(parent) => current = parent,
            None => return false,
        }
    }
    false
}

/// The environment that turns OTLP export on towards `endpoint`, batching every 50 ms.
pub(super) fn exporting_to(endpoint: &str) -> [(&str, &str); 2] {
    [
        // The standard variable alone turns export on.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        // Batches every 50 ms instead of every 5 s, so the test waits less.
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ]
}

fn start_exporting(harness: &Harness, endpoint: &str) -> Server {
    let config = harness.config.display().to_string();
    Server::start_with_env(
        &["serve", "--config", &config, "--log-format", "json"],
        harness.dir.path(),
        &exporting_to(endpoint),
    )
}

#[tokio::test]
async fn a_lost_response_is_one_trace_from_the_callers_span_through_the_lookup_to_the_outcome() {
    let receiver = Receiver::start().await;
    let harness = Harness::new("").await;
    // The lookup-only CRM: the send loses its answer, and a worker's lookup finds the task
    // once its search catches up, after the caller has had its answer.
    harness
        .fault(Shape::Plain, FaultKind::DropResponse, 1)
        .await;
    let server = start_exporting(&harness, &receiver.url);
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let body = json!({
        "provider": "crm-plain", "account": ACCOUNT, "action": "create_task",
        "args": {"title": TITLE},
    });
    let (status, _, answered) = server
        .post_with_headers(
            // A short wait: the caller has its answer (unknown) before the search catches up.
            "/v1/operations?execute=true&wait_ms=100",
            TENANT_A_TOKEN,
            &[
                ("traceparent", &traceparent),
                ("tracestate", "vendor=agent"),
            ],
            &body,
        )
        .await;
    assert!(status.is_success(), "{status} {answered}");
    let operation_id = answered["operation_id"].as_str().expect("an id").to_owned();
    let key = answered["idempotency_key"]
        .as_str()
        .expect("a key")
        .to_owned();
    let settled = server
        .wait_for_state(TENANT_A_TOKEN, &operation_id, &["succeeded"])
        .await;
    let external_id = settled["external_id"]
        .as_str()
        .expect("an external id")
        .to_owned();

    let spans = receiver
        .until("the lookup that found the task", |spans| {
            named(spans, "lookup", &operation_id)
                .iter()
                .any(|span| attribute(span, "state").as_deref() == Some("succeeded"))
        })
        .await;
    let caller_span = (0..8)
        .map(|i| u8::from_str_radix(&CALLER_SPAN[2 * i..2 * i + 2], 16).expect("hex"))
        .collect::<Vec<u8>>();

    // One trace: every span about the operation is in the caller's.
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|span| attribute(span, "operation_id").as_deref() == Some(&operation_id))
        .collect();
    let traces: BTreeSet<String> = ours.iter().map(|span| hex(&span.trace_id)).collect();
    assert_eq!(
        traces,
        BTreeSet::from([CALLER_TRACE.to_owned()]),
        "{:#?}",
        ours.iter().map(|span| describe(span)).collect::<Vec<_>>()
    );

    // The request is the child of the caller's span, and the record its descendant.
    let request = spans
        .iter()
        .find(|span| span.name == "POST /v1/operations" && hex(&span.trace_id) == CALLER_TRACE)
        .expect("the request's span");
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN);
    assert_eq!(
        attribute(request, "http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        attribute(request, "http.response.status_code"),
        Some(status.as_u16().to_string())
    );
    let record = named(&spans, "record", &operation_id);
    let [record] = record.as_slice() else {
        panic!("one record span: {record:?}")
    };
    assert!(descends_from(&spans, record, &request.span_id));
    for (key, value) in [
        ("tenant", "tenant-a"),
        ("provider", "crm-plain"),
        ("account", ACCOUNT),
        ("action", "create_task"),
    ] {
        assert_eq!(
            attribute(record, key).as_deref(),
            Some(value),
            "record {key}"
        );
    }

    // The send that lost its answer, with its HTTP client span below it.
    let sends = named(&spans, "send", &operation_id);
    let [send] = sends.as_slice() else {
        panic!("one send: {sends:?}")
    };
    assert!(descends_from(&spans, send, &request.span_id));
    assert_eq!(attribute(send, "state").as_deref(), Some("unknown"));
    assert!(attribute(send, "attempt_id").is_some_and(|id| !id.is_empty()));
    let client = spans
        .iter()
        .find(|span| span.name == "POST" && descends_from(&spans, span, &send.span_id))
        .expect("the provider request's span under the send");
    let client_attributes = attributes(client);
    assert_eq!(
        client_attributes.get("error.type").map(String::as_str),
        Some("maybe_sent")
    );
    // A failed request is a failed span, as the HTTP client conventions ask (status ERROR).
    assert_eq!(
        client.status.as_ref().map(|status| status.code),
        Some(2),
        "{}",
        describe(client)
    );
    assert_eq!(
        client_attributes.get("server.address").map(String::as_str),
        Some("127.0.0.1")
    );
    assert!(client_attributes
        .get("url.full")
        .is_some_and(|url| url.starts_with("http://127.0.0.1:") && !url.contains('?')));

    // The lookup that found the task: a worker's, after the answer, joined to the trace through
    // the context kept with the intent (its drive's parent is a span of the caller's request).
    let lookup = named(&spans, "lookup", &operation_id)
        .into_iter()
        .find(|span| attribute(span, "state").as_deref() == Some("succeeded"))
        .expect("the successful lookup");
    assert_eq!(
        attribute(lookup, "external_id").as_deref(),
        Some(external_id.as_str())
    );
    assert!(
        descends_from(&spans, lookup, &caller_span),
        "the lookup hangs under the caller's span: {}",
        describe(lookup)
    );
    let drive = spans
        .iter()
        .find(|span| span.span_id == lookup.parent_span_id)
        .expect("the lookup's parent");
    assert_eq!(
        (drive.name.as_str(), drive.parent_span_id.as_slice()),
        ("drive", record.span_id.as_slice()),
        "a worker's drive, joined to the record through the context kept with the intent"
    );
    let lookup_client = spans
        .iter()
        .find(|span| span.name == "GET" && descends_from(&spans, span, &lookup.span_id))
        .expect("the lookup's HTTP span");
    assert_eq!(
        attribute(lookup_client, "http.response.status_code").as_deref(),
        Some("200")
    );

    // Never arguments, keys, tokens or secrets, in any span.
    for span in &spans {
        for (name, value) in attributes(span) {
            for secret in [TITLE, ACCOUNT_TOKEN, TENANT_A_TOKEN, key.as_str()] {
                assert!(
                    !value.contains(secret),
                    "{name} of {} carries `{secret}`",
                    span.name
                );
            }
        }
    }

    // The CRM saw the caller's trace on the send.
    let requests = harness.admin.requests().await.expect("the stand's log");
    let posted = requests
        .iter()
        .find(|request| request.method == "POST")
        .expect("the send reached the stand");
    let seen = posted
        .traceparent
        .as_deref()
        .expect("a traceparent at the CRM");
    assert!(seen.starts_with(&format!("00-{CALLER_TRACE}-")), "{seen}");
    assert_eq!(
        &seen[36..52],
        hex(&client.span_id),
        "the send's HTTP span is the parent"
    );

    // The history shows the trace id beside each event written under it.
    let (status, history) = server
        .call(
            Method::GET,
            &format!("/v1/operations/{operation_id}/events"),
            Some(TENANT_A_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let events = history["events"].as_array().expect("events");
    for event in events {
        assert_eq!(event["trace_id"], CALLER_TRACE, "{event}");
    }

    // The JSON log lines written in the operation's spans carry the caller's trace id.
    let mut logged = 0;
    for entry in std::fs::read_dir(harness.dir.path()).expect("the directory") {
        let path = entry.expect("an entry").path();
        if !path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("serve-"))
        {
            continue;
        }
        for line in std::fs::read_to_string(&path).expect("the log").lines() {
            let line: Value = serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}"));
            let about_it = line["spans"].as_array().is_some_and(|spans| {
                spans
                    .iter()
                    .any(|span| span["operation_id"] == operation_id.as_str())
            });
            if about_it {
                assert_eq!(line["trace_id"], CALLER_TRACE, "{line}");
                assert!(
                    line["span_id"].as_str().is_some_and(|id| id.len() == 16),
                    "{line}"
                );
                logged += 1;
            }
        }
    }
    assert!(
        logged > 0,
        "no log line was written in the operation's spans"
    );

    // An operator's later request, in the operator's own trace, is linked to the operation's.
    let operator_parent = format!("00-{OPERATOR_TRACE}-{OPERATOR_SPAN}-01");
    let executed = reqwest::Client::new()
        .post(format!(
            "{}/v1/operations/{operation_id}/execute?wait_ms=100",
            server.base
        ))
        .bearer_auth(TENANT_A_TOKEN)
        .header("traceparent", &operator_parent)
        .send()
        .await
        .expect("the server answers");
    assert!(executed.status().is_success(), "{executed:?}");
    let spans = receiver
        .until(
            "a span of the operator's trace linked to the caller's",
            |spans| {
                spans.iter().any(|span| {
                    hex(&span.trace_id) == OPERATOR_TRACE
                        && span
                            .links
                            .iter()
                            .any(|link| hex(&link.trace_id) == CALLER_TRACE)
                })
            },
        )
        .await;
    assert!(spans
        .iter()
        .filter(|span| hex(&span.trace_id) == OPERATOR_TRACE)
        .all(|span| attribute(span, "operation_id").is_none_or(|id| id == operation_id)));
}

#[tokio::test]
async fn export_to_a_receiver_that_is_down_costs_a_counter_and_no_answer() {
    // A port that refuses: bound, then closed.
    let closed = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a port");
    let endpoint = format!("http://{}", closed.local_addr().expect("an address"));
    drop(closed);
    let harness = Harness::new("").await;
    let server = start_exporting(&harness, &endpoint);
    for n in 0..20 {
        let (status, answered) = server
            .post(
                "/v1/operations?execute=true&wait_ms=2000",
                TENANT_A_TOKEN,
                &json!({
                    "provider": "crm", "account": ACCOUNT, "action": "create_task",
                    "args": {"title": format!("task {n}")},
                }),
            )
            .await;
        assert!(status.is_success(), "{status} {answered}");
        assert_eq!(answered["state"], "succeeded", "{answered}");
    }
    let started = Instant::now();
    loop {
        if export_failures(&server).await > 0 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no export failure was counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Still answering after the failures were counted.
    let (status, _) = server.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK);
}

/// What the OTLP/gRPC receiver needs from PyPI: the protocol's own generated services and grpcio.
const GRPC_RECEIVER_REQUIREMENTS: [&str; 2] = ["grpcio==1.85.1", "opentelemetry-proto==1.45.2"];

/// `tests/serve/otlp_grpc_receiver.py` running in a virtual environment: a real OTLP/gRPC
/// collector endpoint that prints each span it receives as a JSON line.
struct GrpcReceiver {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    endpoint: String,
    spans: Vec<Value>,
}

impl GrpcReceiver {
    async fn start() -> Self {
        let python = tokio::task::spawn_blocking(|| {
            python_with("otlp-grpc-receiver-venv", &GRPC_RECEIVER_REQUIREMENTS)
        })
        .await
        .expect("the virtual environment is made");
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join("serve")
            .join("otlp_grpc_receiver.py");
        let mut child = std::process::Command::new(python)
            .arg(script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the receiver starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let first = lines
            .recv_timeout(DEADLINE)
            .expect("the receiver says its port");
        let port = first
            .strip_prefix("port ")
            .unwrap_or_else(|| panic!("not a port line: {first}"));
        Self {
            child,
            lines,
            endpoint: format!("http://127.0.0.1:{port}"),
            spans: Vec::new(),
        }
    }

    /// Waits until the spans received satisfy `done`.
    fn until(&mut self, what: &str, done: impl Fn(&[Value]) -> bool) -> &[Value] {
        let started = Instant::now();
        while !done(&self.spans) {
            let left = DEADLINE.saturating_sub(started.elapsed());
            match self
                .lines
                .recv_timeout(left.min(Duration::from_millis(100)))
            {
                Ok(line) => self.spans.push(
                    serde_json::from_str(&line)
                        .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}")),
                ),
                Err(_) => assert!(
                    !left.is_zero(),
                    "the gRPC receiver never got {what}; it has: {:#?}",
                    self.spans
                ),
            }
        }
        &self.spans
    }
}

impl Drop for GrpcReceiver {
    fn drop(&mut self) {
        // Our own child: closing its standard input stops it; the kill is for a hung one.
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn grpc_export_brings_the_callers_trace_to_a_real_otlp_grpc_receiver() {
    let mut receiver = GrpcReceiver::start().await;
    let harness = Harness::new("").await;
    let config = harness.config.display().to_string();
    let server = Server::start_with_env(
        &["serve", "--config", &config],
        harness.dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-team=ledger"),
            ("OTEL_SERVICE_NAME", "opledger-grpc-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (status, _, answered) = server
        .post_with_headers(
            "/v1/operations?execute=true&wait_ms=5000",
            TENANT_A_TOKEN,
            &[("traceparent", &traceparent)],
            &json!({
                "provider": "crm", "account": ACCOUNT, "action": "create_task",
                "args": {"title": TITLE},
            }),
        )
        .await;
    assert!(status.is_success(), "{status} {answered}");
    assert_eq!(answered["state"], "succeeded", "{answered}");
    let operation_id = answered["operation_id"].as_str().expect("an id").to_owned();
    let of_operation = |span: &Value, name: &str| {
        span["name"] == name && span["attributes"]["operation_id"] == operation_id.as_str()
    };
    let is_request =
        |span: &Value| span["name"] == "POST /v1/operations" && span["trace_id"] == CALLER_TRACE;
    // The request's span ends last: it is around the others.
    let spans = receiver.until("the request, its record and its send", |spans| {
        spans.iter().any(is_request)
            && ["record", "send"]
                .iter()
                .all(|name| spans.iter().any(|span| of_operation(span, name)))
    });
    let request = spans
        .iter()
        .find(|span| is_request(span))
        .expect("the request's span");
    assert_eq!(request["trace_id"], CALLER_TRACE, "{request}");
    assert_eq!(request["parent_span_id"], CALLER_SPAN, "{request}");
    for name in ["record", "send"] {
        let span = spans
            .iter()
            .find(|span| of_operation(span, name))
            .expect("the span");
        assert_eq!(span["trace_id"], CALLER_TRACE, "{span}");
        assert_eq!(span["service"], "opledger-grpc-test", "{span}");
        // The header from OTEL_EXPORTER_OTLP_HEADERS travels as gRPC metadata.
        assert_eq!(span["metadata"]["x-collector-team"], "ledger", "{span}");
    }
}

/// The JSON log lines in `dir`'s `serve-*.log` files.
fn json_log_lines(dir: &std::path::Path) -> Vec<Value> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the directory") {
        let path = entry.expect("an entry").path();
        if path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("serve-"))
        {
            for line in std::fs::read_to_string(&path).expect("the log").lines() {
                lines.push(
                    serde_json::from_str(line)
                        .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}")),
                );
            }
        }
    }
    lines
}

/// Queues, at the lookup-only CRM, a send that loses its answer and a lookup that finds the CRM
/// unavailable: a warning in the send and one in the lookup.
async fn lose_the_answer_then_fail_a_lookup(harness: &Harness) {
    harness
        .fault(Shape::Plain, FaultKind::DropResponse, 1)
        .await;
    harness
        .fault_on(
            Shape::Plain,
            opledger_crm_stand::FaultMethod::Get,
            FaultKind::ErrorBeforeCommit { status: 503 },
            1,
        )
        .await;
}

/// Asserts that `lines` hold the send's and the lookup's warnings, and that every one of them
/// carries `trace` and a span id of this process.
#[track_caller]
fn assert_every_line_in(lines: &[Value], trace: &str, parent_span: &str) {
    for message in ["outcome unknown", "lookup gave no answer"] {
        assert!(
            lines
                .iter()
                .any(|line| line["fields"]["message"] == message),
            "no `{message}` line in {lines:#?}"
        );
    }
    // A warning about a send names its operation and attempt itself: at the default level the
    // spans around it are not written.
    for line in lines.iter().filter(|line| {
        line["fields"]["message"] == "outcome unknown"
            || line["fields"]["message"] == "the send may or may not have been applied"
    }) {
        assert!(
            line["fields"]["operation_id"].is_string() && line["fields"]["attempt_id"].is_string(),
            "{line}"
        );
    }
    for line in lines {
        assert_eq!(line["trace_id"], trace, "{line}");
        assert!(
            line["span_id"]
                .as_str()
                .is_some_and(|id| id.len() == 16 && id != parent_span),
            "{line}"
        );
    }
}

/// Posts `body` to `path` as a child of the caller's `trace`/`span`, then waits until the
/// operation it recorded has succeeded.
async fn succeeded_under(server: &Server, path: &str, trace: &str, span: &str, body: &Value) {
    let traceparent = format!("00-{trace}-{span}-01");
    let (status, _, answered) = server
        .post_with_headers(path, TENANT_A_TOKEN, &[("traceparent", &traceparent)], body)
        .await;
    assert!(status.is_success(), "{status} {answered}");
    let operation_id = answered["operation_id"].as_str().expect("an id");
    server
        .wait_for_state(TENANT_A_TOKEN, operation_id, &["succeeded"])
        .await;
}

#[tokio::test]
async fn every_json_log_line_of_a_request_and_of_a_workers_later_drive_carries_the_trace_at_the_default_level(
) {
    let harness = Harness::new("").await;
    let config = harness.config.display().to_string();
    // Export off and the default log level (warnings): the ledger's spans are below it, so the
    // lines list no spans, yet each one belongs to the trace of the request that caused it.
    let server = Server::start_with_env(
        &["serve", "--config", &config, "--log-format", "json"],
        harness.dir.path(),
        &[("RUST_LOG", "warn")],
    );
    let start_up = json_log_lines(harness.dir.path()).len();
    let body = json!({
        "provider": "crm-plain", "account": ACCOUNT, "action": "create_task",
        "args": {"title": TITLE},
    });
    // A request's own work: it records, sends and looks up.
    lose_the_answer_then_fail_a_lookup(&harness).await;
    let path = "/v1/operations?execute=true&wait_ms=100";
    succeeded_under(&server, path, CALLER_TRACE, CALLER_SPAN, &body).await;
    let requested = json_log_lines(harness.dir.path()).len();
    // A worker's drive, later: the request only records; a worker sends and looks up, in the
    // trace kept with the intent.
    lose_the_answer_then_fail_a_lookup(&harness).await;
    succeeded_under(
        &server,
        "/v1/operations",
        OPERATOR_TRACE,
        OPERATOR_SPAN,
        &body,
    )
    .await;
    let lines = json_log_lines(harness.dir.path());
    assert_every_line_in(&lines[start_up..requested], CALLER_TRACE, CALLER_SPAN);
    assert_every_line_in(&lines[requested..], OPERATOR_TRACE, OPERATOR_SPAN);
}

/// What an OTLP/HTTP receiver was sent: each post's headers and decoded request.
type Posts = Arc<Mutex<Vec<(axum::http::HeaderMap, ExportTraceServiceRequest)>>>;

/// A loopback OTLP/HTTP receiver that keeps every post whole and answers `status`.
async fn post_keeping_receiver(status: AxumStatus) -> (String, Posts) {
    let posts = Posts::default();
    let kept = Arc::clone(&posts);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let kept = Arc::clone(&kept);
            async move {
                let request =
                    ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                kept.lock().expect("not poisoned").push((headers, request));
                status
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("the receiver binds");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, posts)
}

/// `opledger_trace_export_failures_total` from `/metrics`.
/// The instance id the server's metrics name (`opledger_instance_info`).
async fn served_instance_id(server: &Server) -> String {
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("the server answers")
        .text()
        .await
        .expect("a body");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("opledger_instance_info{instance_id=\""))
        .and_then(|rest| rest.split('"').next())
        .expect("the instance is named")
        .to_owned()
}

async fn export_failures(server: &Server) -> u64 {
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .expect("the server answers")
        .text()
        .await
        .expect("a body");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("opledger_trace_export_failures_total "))
        .and_then(|count| count.trim().parse().ok())
        .expect("the export failure counter is shown")
}

async fn create_one_task(server: &Server) {
    let (status, answered) = server
        .post(
            "/v1/operations?execute=true&wait_ms=5000",
            TENANT_A_TOKEN,
            &json!({
                "provider": "crm", "account": ACCOUNT, "action": "create_task",
                "args": {"title": TITLE},
            }),
        )
        .await;
    assert!(status.is_success(), "{status} {answered}");
    assert_eq!(answered["state"], "succeeded", "{answered}");
}

#[tokio::test]
async fn http_export_posts_protobuf_with_the_service_name_and_the_headers_from_the_environment() {
    let (endpoint, posts) = post_keeping_receiver(AxumStatus::OK).await;
    let harness = Harness::new("").await;
    let config = harness.config.display().to_string();
    let server = Server::start_with_env(
        &["serve", "--config", &config],
        harness.dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-team=ledger"),
            ("OTEL_SERVICE_NAME", "opledger-http-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    create_one_task(&server).await;
    let instance_id = served_instance_id(&server).await;
    let started = Instant::now();
    while posts.lock().expect("not poisoned").is_empty() {
        assert!(started.elapsed() < DEADLINE, "nothing was posted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let posts = posts.lock().expect("not poisoned").clone();
    for (headers, request) in &posts {
        assert_eq!(headers["content-type"], "application/x-protobuf");
        assert_eq!(headers["x-collector-team"], "ledger");
        for resource_spans in &request.resource_spans {
            let resource = resource_spans.resource.as_ref().expect("a resource");
            let service = resource
                .attributes
                .iter()
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| attribute.value.as_ref()?.value.clone());
            assert_eq!(
                service,
                Some(AnyValue::StringValue("opledger-http-test".to_owned()))
            );
            // The build's version and an id of this process, as the resource conventions ask.
            for key in ["service.version", "service.instance.id"] {
                assert!(
                    resource
                        .attributes
                        .iter()
                        .any(|attribute| attribute.key == key),
                    "no {key} in {:?}",
                    resource.attributes
                );
            }
            // The instance id is the one the instance's metrics (and logs and events) carry.
            let instance = resource
                .attributes
                .iter()
                .find(|attribute| attribute.key == "service.instance.id")
                .and_then(|attribute| attribute.value.as_ref()?.value.clone());
            assert_eq!(
                instance,
                Some(AnyValue::StringValue(instance_id.clone())),
                "the resource's service.instance.id"
            );
            for scope_spans in &resource_spans.scope_spans {
                let scope = scope_spans.scope.as_ref().expect("a scope");
                assert_eq!(scope.name, "opledger");
            }
        }
    }
}

#[tokio::test]
async fn a_collector_that_answers_an_error_costs_a_counter_and_no_answer() {
    let (endpoint, posts) = post_keeping_receiver(AxumStatus::SERVICE_UNAVAILABLE).await;
    let harness = Harness::new("").await;
    let server = start_exporting(&harness, &endpoint);
    create_one_task(&server).await;
    let started = Instant::now();
    while export_failures(&server).await == 0 {
        assert!(
            started.elapsed() < DEADLINE,
            "a 503 was not counted as a failed export"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!posts.lock().expect("not poisoned").is_empty());
    create_one_task(&server).await;
}

#[tokio::test]
async fn no_exported_span_carries_an_attribute_twice() {
    let (endpoint, posts) = post_keeping_receiver(AxumStatus::OK).await;
    let harness = Harness::new("").await;
    let server = start_exporting(&harness, &endpoint);
    create_one_task(&server).await;
    let has_send = |posts: &Posts| {
        posts
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|(_, request)| {
                request
                    .resource_spans
                    .iter()
                    .flat_map(|resource| &resource.scope_spans)
                    .flat_map(|scope| &scope.spans)
                    .any(|span| span.name == "send")
            })
    };
    let started = Instant::now();
    while !has_send(&posts) {
        assert!(started.elapsed() < DEADLINE, "no send span was posted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let posts = posts.lock().expect("not poisoned").clone();
    let spans = posts
        .iter()
        .flat_map(|(_, request)| &request.resource_spans)
        .flat_map(|resource| &resource.scope_spans)
        .flat_map(|scope| &scope.spans);
    for span in spans {
        let mut keys: Vec<&str> = span.attributes.iter().map(|kv| kv.key.as_str()).collect();
        keys.sort_unstable();
        let before = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), before, "{}", describe(span));
    }
}

#[tokio::test]
async fn batches_are_posted_over_one_connection_when_the_collector_answers_with_a_body() {
    // A collector's answer with a body (a partial-success message: `rejected_spans` = 0 and an
    // error message), on a receiver that counts the connections it accepts.
    const ANSWER: &[u8] = &[0x0a, 0x04, 0x12, 0x02, b'o', b'k'];
    let posts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&posts);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let counted = Arc::clone(&counted);
            async move {
                ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                ([("content-type", "application/x-protobuf")], ANSWER)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("the receiver binds");
    let endpoint = format!("http://{}", listener.local_addr().expect("an address"));
    let accepted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    let harness = Harness::new("").await;
    let server = start_exporting(&harness, &endpoint);
    let started = Instant::now();
    // Batches go every 50 ms: one task per batch period until three posts are in.
    while posts.load(std::sync::atomic::Ordering::SeqCst) < 3 {
        assert!(
            started.elapsed() < DEADLINE,
            "fewer than three posts arrived"
        );
        create_one_task(&server).await;
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "every batch opened a connection of its own"
    );
}

/// The Python OpenTelemetry SDK's own propagator: the `traceparent` it injects for a sampled span
/// of its own (whatever flags that SDK sets), then for contexts carrying flags `03` (sampled and
/// the Level 2 random-trace-id bit) and `09` (sampled and a bit no version defines yet), printed
/// as a JSON list.
const PYTHON_CALLER: &str = r#"
import json
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("agent-platform")
headers = []
for flags in (None, 0x03, 0x09):
    with tracer.start_as_current_span("agent tool call") as span:
        context = None
        if flags is not None:
            own = span.get_span_context()
            forced = SpanContext(own.trace_id, own.span_id, False, TraceFlags(flags))
            context = set_span_in_context(NonRecordingSpan(forced))
        carrier = {}
        propagate.inject(carrier, context=context)
        headers.append(carrier["traceparent"])
print(json.dumps(headers))
"#;

#[tokio::test]
async fn a_callers_trace_from_the_python_sdks_propagator_continues_whatever_its_unknown_flags() {
    let python = tokio::task::spawn_blocking(|| {
        python_with("otel-sdk-venv", &["opentelemetry-sdk==1.45.2"])
    })
    .await
    .expect("the virtual environment is made");
    let printed = super::python::python_venv::run(
        std::process::Command::new(python).args(["-c", PYTHON_CALLER]),
        "the Python SDK injecting traceparents",
    );
    // Its output's last line (pip or Python may warn before it).
    let last = printed.lines().last().unwrap_or_default();
    let headers: Vec<String> = serde_json::from_str(last).expect("a JSON list");
    assert!(
        headers[1].ends_with("-03") && headers[2].ends_with("-09"),
        "{headers:?}"
    );
    let receiver = Receiver::start().await;
    let harness = Harness::new("").await;
    let server = start_exporting(&harness, &receiver.url);
    for traceparent in &headers {
        let (status, _, answered) = server
            .post_with_headers(
                "/v1/operations?execute=true&wait_ms=5000",
                TENANT_A_TOKEN,
                &[
                    ("traceparent", traceparent),
                    ("user-agent", "agent-platform/1"),
                ],
                &json!({
                    "provider": "crm", "account": ACCOUNT, "action": "create_task",
                    "args": {"title": TITLE},
                }),
            )
            .await;
        assert!(status.is_success(), "{status} {answered}");
        let mut parts = traceparent.split('-').skip(1);
        let (trace, caller) = (
            parts.next().expect("a trace id"),
            parts.next().expect("a span id"),
        );
        let spans = receiver
            .until(&format!("a request span under {traceparent}"), |spans| {
                spans
                    .iter()
                    .any(|span| hex(&span.trace_id) == trace && hex(&span.parent_span_id) == caller)
            })
            .await;
        // The HTTP server conventions: the scheme, the host and port asked for, the user agent.
        let request = spans
            .iter()
            .find(|span| hex(&span.trace_id) == trace && hex(&span.parent_span_id) == caller)
            .expect("the request's span");
        let attributes = attributes(request);
        for (key, value) in [
            ("url.scheme", "http"),
            ("server.address", "127.0.0.1"),
            ("user_agent.original", "agent-platform/1"),
        ] {
            assert_eq!(
                attributes.get(key).map(String::as_str),
                Some(value),
                "{}",
                describe(request)
            );
        }
        assert!(
            attributes.contains_key("server.port"),
            "{}",
            describe(request)
        );
    }
}

/// What the webhook receiver below kept: each delivery's `traceparent` header and body.
type Deliveries = Arc<Mutex<Vec<(Option<String>, Value)>>>;

/// A loopback webhook receiver keeping each delivery's `traceparent` header and body; it
/// answers 200 without verifying (the webhook tests verify with the Standard Webhooks library).
async fn traceparent_keeping_receiver() -> (String, Deliveries) {
    let kept: Deliveries = Arc::default();
    let keep = Arc::clone(&kept);
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let keep = Arc::clone(&keep);
            async move {
                let traceparent = headers
                    .get("traceparent")
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                keep.lock().expect("not poisoned").push((traceparent, body));
                AxumStatus::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("the receiver binds");
    let url = format!(
        "http://{}/hooks",
        listener.local_addr().expect("an address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, kept)
}

#[tokio::test]
async fn a_webhook_delivery_is_a_span_of_the_operations_trace_and_sends_the_receiver_its_context() {
    const SECRET_ENV: &str = "OPLEDGER_TEST_WEBHOOK_SECRET";
    let receiver = Receiver::start().await;
    let (hooks, delivered) = traceparent_keeping_receiver().await;
    let harness = Harness::new("").await;
    let mut config = std::fs::read_to_string(&harness.config).expect("the configuration");
    config.push_str(&format!(
        "\n[[webhooks]]\nid = \"traced\"\nurl = \"{hooks}\"\nsecret_env = \"{SECRET_ENV}\"\nevents = [\"succeeded\"]\n"
    ));
    let path = harness.dir.path().join("serve-traced-webhooks.toml");
    std::fs::write(&path, config).expect("configuration written");
    let server = Server::start_with_env(
        &["serve", "--config", &path.display().to_string()],
        harness.dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            (SECRET_ENV, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
        ],
    );
    succeeded_under(
        &server,
        "/v1/operations?execute=true&wait_ms=5000",
        CALLER_TRACE,
        CALLER_SPAN,
        &json!({
            "provider": "crm", "account": ACCOUNT, "action": "create_task",
            "args": {"title": TITLE},
        }),
    )
    .await;
    let started = Instant::now();
    let traceparent = loop {
        let first = delivered.lock().expect("not poisoned").first().cloned();
        if let Some((traceparent, body)) = first {
            assert_eq!(body["type"], "operation.succeeded", "{body}");
            break traceparent.expect("the delivery carries a traceparent");
        }
        assert!(started.elapsed() < DEADLINE, "nothing was delivered");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert!(
        traceparent.starts_with(&format!("00-{CALLER_TRACE}-")),
        "the receiver is sent the operation's trace: {traceparent}"
    );
    let spans = receiver
        .until("the delivery's span in the caller's trace", |spans| {
            spans
                .iter()
                .any(|span| span.name == "webhook_delivery" && hex(&span.trace_id) == CALLER_TRACE)
        })
        .await;
    let delivery = spans
        .iter()
        .find(|span| span.name == "webhook_delivery")
        .expect("a delivery span");
    // The receiver's parent is the delivery's own span.
    assert!(
        traceparent.contains(&hex(&delivery.span_id)),
        "{traceparent} {}",
        describe(delivery)
    );
}
