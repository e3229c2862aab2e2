//! Attio, as far as the `attio` preset calls it: `PUT /v2/objects/companies/records?
//! matching_attribute=…` (assert) and `POST /v2/objects/companies/records/query`.
//!
//! Follows the REST API reference ("Assert a record", "List records" (query), "Errors", "Rate
//! limiting"). Facts relied on:
//! - An access token as `Authorization: Bearer …`; a bad one is 401 with type `auth_error`.
//! - Errors are `{"status_code","type","code","message"}`; an unknown matching attribute is 400
//!   `value_not_found`; a write that lost a race is 409 `concurrent_write_conflict` ("please try
//!   again"), nothing written.
//! - Assert takes `{"data":{"values":{slug: [value, …], …}}}` (the OpenAPI description types every
//!   value as an array; the reference also takes a single value bare): no record holds the matching
//!   attribute's value → one is created; one does → it is updated; the attribute must be unique.
//!   Both answer 200 `{"data":{"id":{"workspace_id","object_id","record_id"},"values":{…}}}`, each
//!   value read back as an array of `{"value": …}`-like entries.
//! - The query takes `{"filter":{slug: value},"limit"}` and answers `{"data":[records]}`.
//! - Rate limits answer 429 with `Retry-After`.
//!
//! Not confirmed from the docs: whether the query can lag behind an assert (this one can, by a
//! configurable lag; the preset treats it as a search); the exact shape of every value type (this
//! reads back each value as `{"value": …}`); the body of a 5xx.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::{post, put};
use axum::{Extension, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{bearer, carry_out, Connection, Core, Emulator, Reply, Running, Voice};

/// What the emulator is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Access token → the workspace it belongs to.
    pub tokens: Vec<(String, String)>,
    /// The unique text attribute on companies.
    pub label_attribute: String,
    /// How long a new record stays out of the query, in milliseconds.
    pub query_lag_ms: u64,
}

/// One record.
#[derive(Clone, Debug)]
pub struct Record {
    pub workspace: String,
    pub id: String,
    pub values: Map<String, Value>,
    created_ms: u64,
}

#[derive(Default)]
struct Store {
    records: Vec<Record>,
    next: u64,
}

struct Shared {
    core: Core,
    config: Config,
    store: Mutex<Store>,
}

struct AttioVoice;

impl Voice for AttioVoice {
    fn server_error(&self, status: u16) -> Reply {
        error(
            status,
            "api_error",
            "internal_error",
            "An internal error occurred",
        )
    }

    fn rate_limited(&self, retry_after_s: u64) -> Reply {
        error(
            429,
            "rate_limit_error",
            "rate_limit_exceeded",
            "Rate limit exceeded",
        )
        .header("retry-after", retry_after_s.to_string())
    }
}

fn error(status: u16, kind: &str, code: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &json!({"status_code": status, "type": kind, "code": code, "message": message}),
    )
}

/// A running Attio emulator and its handle.
pub struct Attio {
    pub running: Running,
    shared: Arc<Shared>,
}

impl Attio {
    /// Starts one on a loopback port.
    pub async fn start(config: Config) -> Self {
        let routes = Router::new()
            .route("/v2/objects/{object}/records", put(assert_record))
            .route("/v2/objects/{object}/records/query", post(query));
        let shared = Shared {
            core: Core::new(&config.tokens),
            config,
            store: Mutex::default(),
        };
        let (running, shared) = super::launch(shared, routes).await;
        Self { running, shared }
    }

    /// Every company record, oldest first.
    pub fn records(&self) -> Vec<Record> {
        self.shared
            .store
            .lock()
            .expect("not poisoned")
            .records
            .clone()
    }
}

impl Emulator for Attio {
    fn core(&self) -> &Core {
        &self.shared.core
    }
}

fn workspace_of(shared: &Shared, headers: &HeaderMap) -> Result<String, Reply> {
    let invalid = || error(401, "auth_error", "unauthorized", "Invalid access token");
    shared
        .core
        .account(bearer(headers).as_deref())
        .ok_or_else(invalid)
}

#[derive(Deserialize)]
struct Matching {
    matching_attribute: Option<String>,
}

/// A value as Attio reads it back: an array of entries.
fn stored(value: &Value) -> Value {
    match value {
        Value::Array(items) => {
            Value::Array(items.iter().map(|item| json!({"value": item})).collect())
        }
        other => json!([{ "value": other }]),
    }
}

async fn assert_record(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    Path(object): Path<String>,
    Query(matching): Query<Matching>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let (workspace, values, label) =
        match checked_assert(&shared, &object, matching, &headers, &body) {
            Ok(checked) => checked,
            Err(reply) => return reply,
        };
    let fault = shared.core.take_fault();
    let committing = Arc::clone(&shared);
    carry_out(
        fault,
        &connection,
        &AttioVoice,
        move |instead| {
            let reply = apply(&committing, &workspace, values, &label);
            instead.unwrap_or(reply)
        },
        || {},
    )
    .await
}

/// The assert's workspace, values and label value, or Attio's refusal.
fn checked_assert(
    shared: &Shared,
    object: &str,
    matching: Matching,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(String, Map<String, Value>, String), Reply> {
    let workspace = workspace_of(shared, headers)?;
    if object != "companies" {
        let message = format!("Object with slug/ID \"{object}\" not found.");
        return Err(error(404, "invalid_request_error", "not_found", &message));
    }
    let attribute = &shared.config.label_attribute;
    if matching.matching_attribute.as_deref() != Some(attribute.as_str()) {
        let message = "No unique attribute was found for matching_attribute.";
        return Err(error(
            400,
            "invalid_request_error",
            "value_not_found",
            message,
        ));
    }
    let Ok(mut body) = serde_json::from_slice::<Value>(body) else {
        return Err(error(
            400,
            "invalid_request_error",
            "validation_type",
            "Body is no JSON",
        ));
    };
    let Value::Object(values) = body["data"]["values"].take() else {
        return Err(error(
            400,
            "invalid_request_error",
            "validation_type",
            "data.values is required",
        ));
    };
    // A list of one value (the OpenAPI's form) or the value itself (the reference's).
    let Some(label) = values
        .get(attribute)
        .and_then(|value| match value {
            Value::Array(items) if items.len() == 1 => items[0].as_str(),
            other => other.as_str(),
        })
        .map(str::to_owned)
    else {
        let message = "The matching attribute needs a value.";
        return Err(error(
            400,
            "invalid_request_error",
            "validation_type",
            message,
        ));
    };
    Ok((workspace, values, label))
}

/// Find-or-create under one lock: the unique attribute makes it atomic.
fn apply(shared: &Shared, workspace: &str, values: Map<String, Value>, label: &str) -> Reply {
    let attribute = &shared.config.label_attribute;
    let now = shared.core.now_ms();
    let mut store = shared.store.lock().expect("not poisoned");
    let index = store.records.iter().position(|record| {
        record.workspace == workspace && record.values[attribute][0]["value"] == label
    });
    let index = match index {
        Some(index) => index,
        None => {
            store.next += 1;
            let id = format!("bf071e1f-6035-429d-b874-{:012}", store.next);
            store.records.push(Record {
                workspace: workspace.to_owned(),
                id,
                values: Map::new(),
                created_ms: now,
            });
            store.records.len() - 1
        }
    };
    let record = &mut store.records[index];
    for (slug, value) in values {
        record.values.insert(slug, stored(&value));
    }
    Reply::json(200, &json!({ "data": shown(record) }))
}

fn shown(record: &Record) -> Value {
    json!({
        "id": {"workspace_id": record.workspace, "object_id": "companies", "record_id": record.id},
        "created_at": "2026-12-01T00:00:00.000000000Z",
        "values": record.values,
    })
}

async fn query(
    State(shared): State<Arc<Shared>>,
    Path(object): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let workspace = match workspace_of(&shared, &headers) {
        Ok(workspace) => workspace,
        Err(reply) => return reply,
    };
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error(
            400,
            "invalid_request_error",
            "validation_type",
            "Body is no JSON",
        );
    };
    let Some(Value::Object(filter)) = request.get("filter") else {
        return error(
            400,
            "invalid_request_error",
            "validation_type",
            "this emulator reads one equality filter",
        );
    };
    let now = shared.core.now_ms();
    let store = shared.store.lock().expect("not poisoned");
    let data: Vec<Value> = store
        .records
        .iter()
        .filter(|record| {
            object == "companies"
                && record.workspace == workspace
                && now.saturating_sub(record.created_ms) >= shared.config.query_lag_ms
                && filter.iter().all(|(slug, wanted)| {
                    record
                        .values
                        .get(slug)
                        .is_some_and(|value| value[0]["value"] == *wanted)
                })
        })
        .map(shown)
        .collect();
    Reply::json(200, &json!({ "data": data }))
}
