//! Pipedrive, as far as the `pipedrive` preset calls it: `POST /v1/deals`,
//! `GET /v1/deals/search` and `POST /v1/activities`.
//!
//! Follows the API v1 reference ("Deals": add a deal, search deals; "Activities": add an
//! activity; "Custom fields"; "Rate limiting"; "Authentication"). Facts relied on:
//! - The personal API token in the `x-api-token` header; a bad one is 401
//!   `{"success":false,"error":"unauthorized access","errorCode":401,…}`.
//! - Answers are `{"success":true,"data":{…}}`; a create answers 201 with the new object's
//!   integer `id`; errors are `{"success":false,"error":…,"error_info":…,"data":null}`.
//! - Custom fields are written and read under their 40-character key.
//! - Deal search takes `term` (at least 2 characters) and `fields=custom_fields`, matches the term
//!   anywhere in a field, and answers `{"data":{"items":[{"result_score","item":{"id","type",
//!   "title","custom_fields":[matching values]}}]}}`; it is served by a search index that lags
//!   (configurable here).
//! - No idempotency: a repeat creates another object.
//! - Rate limits answer 429 with `x-ratelimit-reset` (seconds until the window resets).
//!
//! Not confirmed from the docs: the search index's lag (not published), exactly which custom
//! field values a search result lists (this lists the matching ones), the 5xx body.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::{json, Map, Value};

use super::{carry_out, Connection, Core, Emulator, Reply, Running, Voice};

/// The standard fields a deal or an activity takes here.
const DEAL_FIELDS: &[&str] = &[
    "title",
    "value",
    "currency",
    "person_id",
    "org_id",
    "expected_close_date",
];
const ACTIVITY_FIELDS: &[&str] = &[
    "subject",
    "type",
    "due_date",
    "due_time",
    "deal_id",
    "person_id",
    "note",
];

/// What the emulator is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// API token → the company (account) it belongs to.
    pub tokens: Vec<(String, String)>,
    /// The key of the deal custom field holding the label.
    pub label_field_key: String,
    /// How long a new deal stays out of search, in milliseconds.
    pub search_lag_ms: u64,
}

/// One stored deal or activity.
#[derive(Clone, Debug)]
pub struct Object {
    pub company: String,
    pub kind: &'static str,
    pub body: Map<String, Value>,
    created_ms: u64,
}

#[derive(Default)]
struct Store {
    objects: Vec<Object>,
    next: u64,
}

struct Shared {
    core: Core,
    config: Config,
    store: Mutex<Store>,
}

struct PipedriveVoice;

impl Voice for PipedriveVoice {
    fn server_error(&self, status: u16) -> Reply {
        error(status, "Internal server error", "Please try again later")
    }

    fn rate_limited(&self, retry_after_s: u64) -> Reply {
        error(
            429,
            "Request over limit",
            "Too many requests in the rate-limit window",
        )
        .header("x-ratelimit-reset", retry_after_s.to_string())
    }
}

fn error(status: u16, error: &str, info: &str) -> Reply {
    Reply::json(
        status,
        &json!({"success": false, "error": error, "errorCode": status, "error_info": info, "data": null}),
    )
}

/// A running Pipedrive emulator and its handle.
pub struct Pipedrive {
    pub running: Running,
    shared: Arc<Shared>,
}

impl Pipedrive {
    /// Starts one on a loopback port.
    pub async fn start(config: Config) -> Self {
        let routes = Router::new()
            .route("/v1/deals", post(create_deal))
            .route("/v1/deals/search", get(search))
            .route("/v1/activities", post(create_activity));
        let shared = Shared {
            core: Core::new(&config.tokens),
            config,
            store: Mutex::default(),
        };
        let (running, shared) = super::launch(shared, routes).await;
        Self { running, shared }
    }

    /// Every stored object of `kind` (`deal`, `activity`), oldest first.
    pub fn objects(&self, kind: &str) -> Vec<Object> {
        let store = self.shared.store.lock().expect("not poisoned");
        store
            .objects
            .iter()
            .filter(|object| object.kind == kind)
            .cloned()
            .collect()
    }
}

impl Emulator for Pipedrive {
    fn core(&self) -> &Core {
        &self.shared.core
    }
}

fn company_of(shared: &Shared, headers: &HeaderMap) -> Result<String, Reply> {
    let token = headers
        .get("x-api-token")
        .and_then(|value| value.to_str().ok());
    let invalid = || {
        error(
            401,
            "unauthorized access",
            "You need to be authorized to make this request.",
        )
    };
    shared.core.account(token).ok_or_else(invalid)
}

async fn create_deal(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let label_key = shared.config.label_field_key.clone();
    create(
        shared,
        connection,
        headers,
        body,
        "deal",
        "title",
        move |name| DEAL_FIELDS.contains(&name) || name == label_key,
    )
    .await
}

async fn create_activity(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    create(
        shared,
        connection,
        headers,
        body,
        "activity",
        "subject",
        |name| ACTIVITY_FIELDS.contains(&name),
    )
    .await
}

async fn create(
    shared: Arc<Shared>,
    connection: Connection,
    headers: HeaderMap,
    body: Bytes,
    kind: &'static str,
    required: &str,
    known: impl Fn(&str) -> bool,
) -> Reply {
    let company = match company_of(&shared, &headers) {
        Ok(company) => company,
        Err(reply) => return reply,
    };
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&body) else {
        return error(400, "Bad request", "The body is no JSON object");
    };
    if !fields.contains_key(required) {
        return error(
            400,
            &format!("{required} is required"),
            "A required field is missing",
        );
    }
    if let Some(unknown) = fields.keys().find(|name| !known(name)) {
        return error(400, "Bad request", &format!("Unknown field `{unknown}`"));
    }
    let fault = shared.core.take_fault();
    let committing = Arc::clone(&shared);
    carry_out(
        fault,
        &connection,
        &PipedriveVoice,
        move |instead| {
            let reply = apply(&committing, &company, kind, fields);
            instead.unwrap_or(reply)
        },
        || {},
    )
    .await
}

fn apply(
    shared: &Shared,
    company: &str,
    kind: &'static str,
    mut body: Map<String, Value>,
) -> Reply {
    let now = shared.core.now_ms();
    let mut store = shared.store.lock().expect("not poisoned");
    store.next += 1;
    body.insert("id".into(), json!(store.next));
    store.objects.push(Object {
        company: company.to_owned(),
        kind,
        body: body.clone(),
        created_ms: now,
    });
    Reply::json(201, &json!({"success": true, "data": body}))
}

async fn search(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Reply {
    let company = match company_of(&shared, &headers) {
        Ok(company) => company,
        Err(reply) => return reply,
    };
    let Some(term) = query.get("term").filter(|term| term.chars().count() >= 2) else {
        return error(400, "Bad request", "term must be at least 2 characters");
    };
    let key = &shared.config.label_field_key;
    let now = shared.core.now_ms();
    let store = shared.store.lock().expect("not poisoned");
    let items: Vec<Value> = store
        .objects
        .iter()
        .filter(|object| object.kind == "deal" && object.company == company)
        .filter(|object| now.saturating_sub(object.created_ms) >= shared.config.search_lag_ms)
        .filter_map(|object| {
            let value = object.body.get(key)?.as_str()?;
            value.contains(term.as_str()).then(|| {
                json!({"result_score": 1.0, "item": {"id": object.body["id"], "type": "deal",
                       "title": object.body["title"], "custom_fields": [value]}})
            })
        })
        .collect();
    Reply::json(
        200,
        &json!({"success": true, "data": {"items": items},
                "additional_data": {"pagination": {"start": 0, "limit": 10, "more_items_in_collection": false}}}),
    )
}
