//! Salesforce REST, as far as the `salesforce` preset calls it: the sObject Rows by External ID
//! resource, `PATCH` (upsert) and `GET` on `/services/data/vXX.X/sobjects/{object}/{field}/{value}`.
//!
//! Follows the REST API Developer Guide ("Insert or Update (Upsert) a Record Using an External
//! ID", "sObject Rows by External ID", "Status Codes and Error Responses") and the API limits
//! pages. Facts relied on:
//! - `Authorization: Bearer <access token>`; a bad token is 401
//!   `[{"message":"Session expired or invalid","errorCode":"INVALID_SESSION_ID"}]`.
//! - Errors are JSON arrays of `{"message","errorCode"}`.
//! - Upsert: no record holds the value → created, 201 `{"id","success":true,"errors":[],
//!   "created":true}`; one does → updated, 200 with `"created":false` (API 46.0 and later);
//!   several do → 300 with the matching records' URLs, nothing changed. The field must be an
//!   External ID field of the object (else 404 NOT_FOUND), and neither it nor `Id` may be in the
//!   body (else 400 INVALID_FIELD). A field marked Unique holds one record per value, enforced by
//!   the database: concurrent upserts of one value make one record.
//! - GET on the same path: 200 with the record (`attributes`, `Id`, fields), 404
//!   `[{"errorCode":"NOT_FOUND","message":"The requested resource does not exist"}]`, or 300.
//! - The org's request limit: 403 `REQUEST_LIMIT_EXCEEDED`, nothing applied.
//! - `GET /services/data/vXX.X/limits` reads the org's limits (`DailyApiRequests` with `Max` and
//!   `Remaining`); any valid session may.
//!
//! Not confirmed from the docs: the body of a 5xx (taken as `UNKNOWN_EXCEPTION`, as integrators
//! report), and whether Task can carry a unique External ID field (the preset avoids Task).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, patch};
use axum::{Extension, Router};
use serde_json::{json, Map, Value};

use super::{bearer, carry_out, Connection, Core, Emulator, Reply, Running, Voice};

/// What the emulator is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Access token → the org it belongs to.
    pub tokens: Vec<(String, String)>,
    /// The External ID field (marked Unique) on Contact and Case.
    pub label_field: String,
}

/// One record.
#[derive(Clone, Debug)]
pub struct Record {
    pub org: String,
    pub object: String,
    pub id: String,
    pub fields: Map<String, Value>,
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

struct SalesforceVoice;

impl Voice for SalesforceVoice {
    fn server_error(&self, status: u16) -> Reply {
        errors(status, "UNKNOWN_EXCEPTION", "An unexpected error occurred.")
    }

    fn rate_limited(&self, _retry_after_s: u64) -> Reply {
        errors(
            403,
            "REQUEST_LIMIT_EXCEEDED",
            "TotalRequests Limit exceeded.",
        )
    }
}

fn errors(status: u16, code: &str, message: &str) -> Reply {
    Reply::json(status, &json!([{ "message": message, "errorCode": code }]))
}

/// The three-letter key prefix of each object with an External ID field here.
fn prefix(object: &str) -> Option<&'static str> {
    match object {
        "Contact" => Some("003"),
        "Case" => Some("500"),
        _ => None,
    }
}

/// A running Salesforce emulator and its handle.
pub struct Salesforce {
    pub running: Running,
    shared: Arc<Shared>,
}

impl Salesforce {
    /// Starts one on a loopback port.
    pub async fn start(config: Config) -> Self {
        let routes = Router::new()
            .route(
                "/services/data/{version}/sobjects/{object}/{field}/{value}",
                patch(upsert).get(read),
            )
            .route("/services/data/{version}/limits", get(limits));
        let shared = Shared {
            core: Core::new(&config.tokens),
            config,
            store: Mutex::default(),
        };
        let routes = routes.merge(super::oauth::routes(
            super::oauth::Dialect::Salesforce,
            Arc::clone(&shared.core.oauth),
        ));
        let (running, shared) = super::launch(shared, routes).await;
        Self { running, shared }
    }

    /// Every record of `object`, oldest first.
    pub fn records(&self, object: &str) -> Vec<Record> {
        let store = self.shared.store.lock().expect("not poisoned");
        store
            .records
            .iter()
            .filter(|record| record.object == object)
            .cloned()
            .collect()
    }
}

impl Emulator for Salesforce {
    fn core(&self) -> &Core {
        &self.shared.core
    }
}

type Target = Path<(String, String, String, String)>;

fn org_of(shared: &Shared, headers: &HeaderMap) -> Result<String, Reply> {
    let invalid = || errors(401, "INVALID_SESSION_ID", "Session expired or invalid");
    shared
        .core
        .account(bearer(headers).as_deref())
        .ok_or_else(invalid)
}

/// Checks the path names an External ID field of a known object.
fn check_target(shared: &Shared, version: &str, object: &str, field: &str) -> Result<(), Reply> {
    let numbered = version
        .strip_prefix('v')
        .and_then(|number| number.parse::<f64>().ok());
    if !numbered.is_some_and(|number| number >= 46.0) {
        return Err(errors(
            404,
            "NOT_FOUND",
            "The requested resource does not exist",
        ));
    }
    if prefix(object).is_none() {
        return Err(errors(
            404,
            "NOT_FOUND",
            "The requested resource does not exist",
        ));
    }
    if field != shared.config.label_field {
        let message =
            format!("Provided external ID field does not exist or is not accessible: {field}");
        return Err(errors(404, "NOT_FOUND", &message));
    }
    Ok(())
}

async fn upsert(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    Path((version, object, field, value)): Target,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let org = match org_of(&shared, &headers) {
        Ok(org) => org,
        Err(reply) => return reply,
    };
    if let Err(reply) = check_target(&shared, &version, &object, &field) {
        return reply;
    }
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&body) else {
        return errors(
            400,
            "JSON_PARSER_ERROR",
            "The request body is no JSON object.",
        );
    };
    if fields.keys().any(|name| *name == field || name == "Id") {
        return errors(
            400,
            "INVALID_FIELD",
            "Do not give Id or the External ID field in the body.",
        );
    }
    let fault = shared.core.take_fault();
    let committing = Arc::clone(&shared);
    carry_out(
        fault,
        &connection,
        &SalesforceVoice,
        move |instead| {
            let reply = apply(&committing, &org, &version, &object, &value, fields);
            instead.unwrap_or(reply)
        },
        || {},
    )
    .await
}

/// The upsert itself, under one lock: the Unique index makes find-or-create atomic.
fn apply(
    shared: &Shared,
    org: &str,
    version: &str,
    object: &str,
    value: &str,
    fields: Map<String, Value>,
) -> Reply {
    let label_field = &shared.config.label_field;
    let mut store = shared.store.lock().expect("not poisoned");
    let matching: Vec<usize> = (0..store.records.len())
        .filter(|&index| {
            let record = &store.records[index];
            record.org == org && record.object == object && record.fields[label_field] == value
        })
        .collect();
    match matching.as_slice() {
        [] => {
            store.next += 1;
            let id = format!("{}{:015}", prefix(object).unwrap_or("001"), store.next);
            let mut fields = fields;
            fields.insert(label_field.clone(), json!(value));
            store.records.push(Record {
                org: org.to_owned(),
                object: object.to_owned(),
                id: id.clone(),
                fields,
            });
            Reply::json(
                201,
                &json!({"id": id, "success": true, "errors": [], "created": true}),
            )
        }
        [one] => {
            let record = &mut store.records[*one];
            record.fields.extend(fields);
            Reply::json(
                200,
                &json!({"id": record.id, "success": true, "errors": [], "created": false}),
            )
        }
        several => {
            let urls: Vec<String> = several
                .iter()
                .map(|&index| record_url(version, object, &store.records[index].id))
                .collect();
            Reply::json(300, &json!(urls))
        }
    }
}

fn record_url(version: &str, object: &str, id: &str) -> String {
    format!("/services/data/{version}/sobjects/{object}/{id}")
}

/// The Limits resource: the org's limits and what is left of them (the preset's probe).
async fn limits(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Reply {
    match org_of(&shared, &headers) {
        Ok(_) => Reply::json(
            200,
            &json!({"DailyApiRequests": {"Max": 15000, "Remaining": 14998}}),
        ),
        Err(reply) => reply,
    }
}

async fn read(
    State(shared): State<Arc<Shared>>,
    Path((version, object, field, value)): Target,
    headers: HeaderMap,
) -> Reply {
    let org = match org_of(&shared, &headers) {
        Ok(org) => org,
        Err(reply) => return reply,
    };
    if let Err(reply) = check_target(&shared, &version, &object, &field) {
        return reply;
    }
    let store = shared.store.lock().expect("not poisoned");
    let matching: Vec<&Record> = store
        .records
        .iter()
        .filter(|record| {
            record.org == org && record.object == object && record.fields[&field] == value.as_str()
        })
        .collect();
    match matching.as_slice() {
        [] => errors(404, "NOT_FOUND", "The requested resource does not exist"),
        [record] => {
            let mut body = record.fields.clone();
            body.insert(
                "attributes".into(),
                json!({"type": object, "url": record_url(&version, &object, &record.id)}),
            );
            body.insert("Id".into(), json!(record.id));
            Reply::json(200, &Value::Object(body))
        }
        several => {
            let urls: Vec<String> = several
                .iter()
                .map(|record| record_url(&version, &object, &record.id))
                .collect();
            Reply::json(300, &json!(urls))
        }
    }
}
