//! `opledger bench floor`: the least a record-and-execute call costs on this machine, served so
//! the peers' harness can drive it exactly as it drives `opledger serve`.
//!
//! Each `POST /v1/operations` does only what no ledger of this kind can leave out: the intent
//! and the claim of its first attempt appended durably, in one append to a new stream of the
//! real SQLite store (WAL, `synchronous=FULL`, the writer's group commit); the send to the
//! provider with the operation's idempotency key; the outcome appended durably; then the
//! answer. The HTTP stacks are the service's own (axum in, reqwest out). Everything else
//! `serve` does is left out on purpose: no read models, no engine, no hash chain, no contract
//! checks, no lookups, no workers. The events have the sizes of the service's own (intent ~460
//! bytes, claim ~180, outcome ~140, metadata 95), so the store writes the same pages.
//!
//! It is a bound to compare `serve` with, not a ledger: a re-sent `source_id` is refused (the
//! stream exists) instead of answered, and a failed send is an error, not an unknown outcome.
//! With `--without-ledger` it writes nothing at all: what is left is the two HTTP hops, the floor
//! under the floor.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use opledger_domain::error::ValidationError;
use opledger_domain::ids::{EventId, OperationId, SourceId, TenantId};
use opledger_domain::store::{EventData, EventStore, ExpectedVersion, StoreError, StreamName};
use opledger_store::SqliteStore;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::{info, warn};
use uuid::Uuid;

use crate::args::BenchFloorArgs;
use crate::files::fresh_path;
use crate::{BenchError, Product};

/// The default address: loopback, a free port.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
/// Largest request body read, in bytes: the harness sends ~150.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How long one send to the provider may take, in milliseconds.
const SEND_TIMEOUT_MS: u64 = 10_000;
/// The tenant every operation is recorded under (the floor has no tokens).
const TENANT: &str = "floor";
/// Metadata of the service's size (its schema version and a 64-hex-digit chain hash), so the
/// store writes as many bytes per event; the hash here is a constant, not a chain.
const METADATA: &str = r#"{"schema_version":1,"chain":"0000000000000000000000000000000000000000000000000000000000000000"}"#;

/// What a call sends: the fields of `serve`'s record body the floor needs.
#[derive(Debug, Deserialize)]
struct FloorBody {
    provider: String,
    account: String,
    action: String,
    args: Value,
    source_id: String,
}

struct Floor {
    /// The ledger; `None` with `--without-ledger`.
    store: Option<SqliteStore>,
    client: reqwest::Client,
    provider_url: String,
}

pub async fn run(args: BenchFloorArgs, product: &dyn Product) -> Result<(), BenchError> {
    let provider_url = provider_url(&args.provider_url)?;
    let ledger = match (&args.db, args.without_ledger) {
        (Some(_), true) => {
            return Err(ValidationError::new(
                "--db",
                "goes with a ledger; --without-ledger writes none: give one of them",
            )
            .into())
        }
        (Some(path), false) if path.exists() => {
            return Err(ValidationError::new(
                "--db",
                format!(
                    "`{}` exists; the floor writes a fresh ledger: name a file that does not exist yet, or leave --db out",
                    path.display()
                ),
            )
            .into())
        }
        (Some(path), false) => Some((path.clone(), false)),
        (None, false) => Some((fresh_path("bench-floor"), true)),
        (None, true) => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|error| BenchError::Other(format!("cannot listen on {}: {error}", args.listen)))?;
    let address = listener
        .local_addr()
        .map_err(|error| BenchError::Other(format!("no local address: {error}")))?;
    let store = match &ledger {
        Some((path, _)) => Some(SqliteStore::open(path).await?),
        None => None,
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(SEND_TIMEOUT_MS))
        .build()
        .map_err(|error| BenchError::Other(format!("cannot build the HTTP client: {error}")))?;
    // A handle of our own to close with: a connection task may still hold the router's state
    // for a moment after the server returns, and closing closes the store for every handle.
    let closing = store.clone();
    let floor = Arc::new(Floor {
        store,
        client,
        provider_url,
    });
    let app = Router::new()
        .route("/v1/operations", post(record_and_execute))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::clone(&floor));
    let described = match &ledger {
        Some((path, _)) => format!("ledger {}", path.display()),
        None => "without a ledger".to_owned(),
    };
    // The harness reads this line for the address, as it reads `serve`'s.
    println!("opledger bench floor: listening on http://{address} ({described})");
    info!(%address, %described, "floor serving");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(product.shutdown_signal())
        .await
        .map_err(|error| BenchError::Other(format!("serving failed: {error}")));
    drop(floor);
    // Waits for the writer to commit and answer what was queued; later appends fail as closed.
    if let Some(store) = closing {
        store.close().await?;
    }
    println!("opledger bench floor: stopped");
    if let Some((path, true)) = ledger {
        crate::files::remove_database(&path);
    }
    served
}

fn provider_url(text: &str) -> Result<String, BenchError> {
    let parsed = reqwest::Url::parse(text).map_err(|error| {
        ValidationError::new(
            "--provider-url",
            format!("`{text}` is not a URL ({error}); give the provider's full address, e.g. http://127.0.0.1:8080/keyed/bench/tasks"),
        )
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ValidationError::new(
            "--provider-url",
            "must be an http:// or https:// URL, e.g. http://127.0.0.1:8080/keyed/bench/tasks",
        )
        .into());
    }
    Ok(parsed.into())
}

/// One operation: intent and claim durable, the send, the outcome durable, the answer (without
/// a ledger: the send and the answer).
async fn record_and_execute(State(floor): State<Arc<Floor>>, body: Bytes) -> Response {
    let body: FloorBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(error) => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!(
                "the body must be JSON with provider, account, action, args and source_id: {error}"
            ),
            )
        }
    };
    let operation_id = match operation_of(&body.source_id) {
        Ok(operation_id) => operation_id,
        Err(message) => return refused(StatusCode::BAD_REQUEST, message),
    };
    let stream = StreamName::for_operation(operation_id);
    let attempt_id = Uuid::now_v7();
    let key = format!("opk_{}", Uuid::new_v4().simple());
    let recorded = match &floor.store {
        Some(store) => {
            let intent = json!({
                "operation_id": operation_id.to_string(), "tenant": TENANT, "owner": null,
                "provider": body.provider, "account": body.account,
                "credential_fingerprint": "sha256:0000000000000000", "action": body.action,
                "args": body.args, "args_hash": format!("sha256:{}", "0".repeat(64)),
                "idempotency_key": key, "source_id": body.source_id, "requires_approval": false,
                "at": now(),
            });
            let claim = json!({
                "attempt_id": attempt_id.to_string(), "attempt_number": 1, "worker": "floor",
                "lease_ms": 30_000, "binding": {"credential_fingerprint": "sha256:0000000000000000"},
                "at": now(),
            });
            let events = vec![
                event("IntentRecorded", &intent),
                event("AttemptStarted", &claim),
            ];
            match store
                .append(&stream, ExpectedVersion::NoStream, events)
                .await
            {
                Ok(recorded) => Some((store, recorded)),
                Err(error) => return store_refused(operation_id, error),
            }
        }
        None => None,
    };
    let external_id = match send(&floor, &key, &body.args).await {
        Ok(external_id) => external_id,
        Err(message) => {
            warn!(%operation_id, %attempt_id, %message, "send failed");
            return refused(StatusCode::BAD_GATEWAY, message);
        }
    };
    let mut answer = json!({
        "operation_id": operation_id.to_string(), "state": "succeeded",
        "external_id": external_id, "attempts": 1,
    });
    if let Some((store, recorded)) = recorded {
        let outcome = json!({
            "attempt_id": attempt_id.to_string(), "external_id": external_id,
            "provider_request_id": null, "at": now(),
        });
        let expected = ExpectedVersion::Exact(recorded.next_expected);
        let events = vec![event("AttemptSucceeded", &outcome)];
        match store.append(&stream, expected, events).await {
            Ok(settled) => {
                answer["position"] = settled.position.value().into();
                answer["stream_version"] = settled.next_expected.value().into();
            }
            Err(error) => return store_refused(operation_id, error),
        }
    }
    (StatusCode::CREATED, axum::Json(answer)).into_response()
}

fn operation_of(source_id: &str) -> Result<OperationId, String> {
    let tenant = TenantId::new(TENANT).map_err(|error| error.to_string())?;
    let source = SourceId::new(source_id).map_err(|error| format!("source_id: {error}"))?;
    Ok(OperationId::for_source(&tenant, &source))
}

/// POSTs the arguments with the key and reads the new object's id from the answer's `id`.
async fn send(floor: &Floor, key: &str, args: &Value) -> Result<String, String> {
    let response = floor
        .client
        .post(&floor.provider_url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(args.to_string())
        .send()
        .await
        .map_err(|error| format!("the provider did not answer: {error}"))?;
    let status = response.status();
    let answer = response
        .bytes()
        .await
        .map_err(|error| format!("the provider's answer was cut off: {error}"))?;
    let answer: Value = serde_json::from_slice(&answer)
        .map_err(|error| format!("the provider's answer is not JSON: {error}"))?;
    if !status.is_success() {
        return Err(format!("the provider answered {status}"));
    }
    match &answer["id"] {
        Value::String(id) => Ok(id.clone()),
        Value::Number(id) => Ok(id.to_string()),
        _ => Err("the provider's answer has no id".into()),
    }
}

fn event(event_type: &str, data: &Value) -> EventData {
    EventData {
        event_id: EventId::from_uuid(Uuid::now_v7()),
        event_type: event_type.to_owned(),
        data: data.to_string().into_bytes(),
        metadata: METADATA.as_bytes().to_vec(),
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

fn store_refused(operation_id: OperationId, error: StoreError) -> Response {
    match error {
        StoreError::VersionConflict { .. } => refused(
            StatusCode::CONFLICT,
            format!("operation {operation_id} exists: the floor records each source_id once (it is a bound, not a ledger)"),
        ),
        error => {
            warn!(%operation_id, %error, "append failed");
            refused(StatusCode::SERVICE_UNAVAILABLE, error.to_string())
        }
    }
}

fn refused(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_url_that_is_not_http_is_refused_with_an_example() {
        let refused = provider_url("ftp://example.com/tasks")
            .unwrap_err()
            .to_string();
        assert!(refused.contains("http://"), "{refused}");
        let refused = provider_url("tasks").unwrap_err().to_string();
        assert!(refused.contains("e.g. http://127.0.0.1"), "{refused}");
        assert_eq!(
            provider_url("http://127.0.0.1:9/keyed/a/tasks").unwrap(),
            "http://127.0.0.1:9/keyed/a/tasks"
        );
    }

    #[test]
    fn one_source_id_always_names_one_operation() {
        assert_eq!(
            operation_of("call-1").unwrap(),
            operation_of("call-1").unwrap()
        );
        assert_ne!(
            operation_of("call-1").unwrap(),
            operation_of("call-2").unwrap()
        );
        assert!(operation_of("").is_err());
    }
}
