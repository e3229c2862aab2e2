//! Pipedrive API v2, as far as the `pipedrive` preset calls it: `POST /api/v2/deals`,
//! `GET /api/v2/deals/search` and `POST /api/v2/activities`.
//!
//! Follows the API v2 reference and the v2 migration guide (developers.pipedrive.com/docs/api/v2:
//! "Deals": add a deal, search deals; "Activities": add an activity; pipedrive.readme.io: "API v2
//! migration guide", "Rate limiting"; the official Node client's v2 models and changelog, which
//! lists the v1 endpoints as deprecated in favour of these). Facts relied on:
//! - Only the `/api/v2/` prefix; the personal API token in the `x-api-token` header; a bad one is
//!   401 `{"success":false,"error":"unauthorized access","errorCode":401,…}`.
//! - Answers are `{"success":true,"data":{…}}`; a create names the new object's integer `id` in
//!   `data`. A refusal names what is wrong in `error` ("Responses": "main error message"); v2's
//!   refusal of a malformed request adds its code, `{"success":false,"error":"'person_id' is a
//!   read-only field. …","code":"ERR_BAD_REQUEST"}`; the other errors (401, 429, 5xx) are the
//!   common answer, `{"success":false,"error":…,"error_info":"Please check
//!   developers.pipedrive.com","data":null}`, `error_info` a hint, not the reason.
//! - v2 validates strictly: a number field given a string is refused (400), not coerced.
//! - A deal's custom fields travel in a `custom_fields` object keyed by the field's 40-character
//!   key; a text field's value is a plain string.
//! - Deal search takes `term` (at least 2 characters, or 1 with `exact_match`), `fields` (any of
//!   `custom_fields`, `notes`, `title`), `exact_match` (a full match, not case sensitive) and
//!   `limit` (at most 500), and answers `{"data":{"items":[{"result_score","item":{"id","type",
//!   "title",…,"custom_fields":[strings],"notes":[…]}}]},"additional_data":{"next_cursor"}}`; a hit's
//!   `custom_fields` is an array of strings whose order is not documented. It is served by a
//!   search index that lags (configurable here).
//! - An activity takes the fields of v2's `AddActivityRequest` (the official Node client's v2 model,
//!   generated from Pipedrive's OpenAPI description): `subject`, `type`, `owner_id`, `deal_id`,
//!   `lead_id`, `org_id`, `project_id`, `due_date`, `due_time`, `duration`, `busy`, `done`,
//!   `location`, `participants`, `attendees`, `public_description`, `priority`, `note`. The
//!   description still lists `person_id`, but the API refuses it: 400 `{"success":false,"error":
//!   "'person_id' is a read-only field. Add a primary participant to set 'person_id' instead.",
//!   "code":"ERR_BAD_REQUEST"}` (the v1→v2 migration guide; Pipedrive's developer community thread
//!   "API v1 to v2 upgrade POST activities http 400 responses"). A participant is `{"person_id":
//!   N, "primary": true}` (`primary` on the way in, `primary_flag` on the way out); the primary
//!   one becomes the activity's `person_id`.
//! - No idempotency: a repeat creates another object.
//! - Rate limits answer 429 with `x-ratelimit-reset`, the seconds left in the 2-second window.
//!
//! Not confirmed from the docs: the search index's lag (not published); which custom field
//! values a hit lists and in what order (this lists every text custom field of the deal, the
//! account's other fields first, so the label is never the first element when the account has
//! others: the preset must find it at any position); whether a v2 create answers 200 or 201
//! (this answers 200; the preset accepts both); the 5xx body; whether v2 refuses two primary
//! participants (this takes the first primary one as the activity's person); which code the other
//! v2 validation errors carry (this answers every 400 with `ERR_BAD_REQUEST`, the documented one's).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::{json, Map, Value};

use super::{carry_out, Connection, Core, Emulator, Reply, Running, Voice};

/// The standard fields a deal takes here, besides `custom_fields`.
const DEAL_FIELDS: &[&str] = &[
    "title",
    "value",
    "currency",
    "person_id",
    "org_id",
    "expected_close_date",
];
/// The standard fields that v2 refuses unless they are numbers.
const NUMBER_FIELDS: &[&str] = &["value", "person_id", "org_id", "deal_id"];
/// The most results one search may ask for.
const MAX_SEARCH_LIMIT: u64 = 500;
/// The fields v2's `AddActivityRequest` takes (`person_id` is listed there but read-only).
const ACTIVITY_FIELDS: &[&str] = &[
    "subject",
    "type",
    "owner_id",
    "deal_id",
    "lead_id",
    "org_id",
    "project_id",
    "due_date",
    "due_time",
    "duration",
    "busy",
    "done",
    "location",
    "participants",
    "attendees",
    "public_description",
    "priority",
    "note",
];
/// What v2 answers to an activity carrying `person_id`, word for word.
pub const PERSON_ID_READ_ONLY: &str =
    "'person_id' is a read-only field. Add a primary participant to set 'person_id' instead.";

/// What the emulator is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// API token → the company (account) it belongs to.
    pub tokens: Vec<(String, String)>,
    /// The key of the deal custom field holding the label.
    pub label_field_key: String,
    /// Other text custom fields every deal of an account carries (key, value), as an account's
    /// defaults or automations fill them; a search hit lists their values before the label.
    pub other_custom_fields: Vec<(String, String)>,
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

/// The code v2 gives a request it refuses as malformed (its answer to an activity's `person_id`).
const BAD_REQUEST: &str = "ERR_BAD_REQUEST";

/// v2's refusal of a malformed request: what is wrong in `error`, and its code.
fn refused(message: &str) -> Reply {
    Reply::json(
        400,
        &json!({"success": false, "error": message, "code": BAD_REQUEST}),
    )
}

/// Pipedrive's common error answer ("Responses": the main message in `error`, a hint in
/// `error_info`), with v1's numeric `errorCode` that the 401 answer still carries.
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
            .route("/api/v2/deals", post(create_deal))
            .route("/api/v2/deals/search", get(search))
            .route("/api/v2/activities", post(create_activity));
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
    create(shared, connection, headers, body, "deal", "title", |name| {
        DEAL_FIELDS.contains(&name) || name == "custom_fields"
    })
    .await
}

async fn create_activity(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    if let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&body) {
        if let Err(reply) = check_activity(&fields) {
            return reply;
        }
    }
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

/// What v2 refuses in an activity beyond the common checks: `person_id` (read-only), and
/// participants that are not `{"person_id": number, "primary": boolean}`.
fn check_activity(fields: &Map<String, Value>) -> Result<(), Reply> {
    if fields.contains_key("person_id") {
        return Err(Reply::json(
            400,
            &json!({"success": false, "error": PERSON_ID_READ_ONLY, "code": BAD_REQUEST}),
        ));
    }
    let Some(participants) = fields.get("participants") else {
        return Ok(());
    };
    let well_formed = participants.as_array().is_some_and(|all| {
        all.iter().all(|one| {
            one.as_object().is_some_and(|one| {
                one.get("person_id").is_some_and(Value::is_number)
                    && one.get("primary").is_none_or(Value::is_boolean)
                    && one.keys().all(|key| key == "person_id" || key == "primary")
            })
        })
    });
    if well_formed {
        Ok(())
    } else {
        Err(refused(
            "participants must be an array of {\"person_id\": number, \"primary\": boolean}",
        ))
    }
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
        return refused("The body is no JSON object");
    };
    if let Err(reply) = check_fields(&shared.config, &fields, required, known) {
        return reply;
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

/// What v2 refuses before anything is written: a missing required field, an unknown field, a
/// number field that is no number, custom fields outside a `custom_fields` object of known keys.
fn check_fields(
    config: &Config,
    fields: &Map<String, Value>,
    required: &str,
    known: impl Fn(&str) -> bool,
) -> Result<(), Reply> {
    if !fields.contains_key(required) {
        return Err(refused(&format!("{required} is required")));
    }
    if let Some(unknown) = fields.keys().find(|name| !known(name)) {
        return Err(refused(&format!("Unknown field `{unknown}`")));
    }
    if let Some(name) = NUMBER_FIELDS
        .iter()
        .find(|name| fields.get(**name).is_some_and(|value| !value.is_number()))
    {
        return Err(refused(&format!("`{name}` must be a number")));
    }
    let Some(custom) = fields.get("custom_fields") else {
        return Ok(());
    };
    let Some(custom) = custom.as_object() else {
        return Err(refused("custom_fields must be an object"));
    };
    let is_field = |key: &str| {
        key == config.label_field_key
            || config
                .other_custom_fields
                .iter()
                .any(|(other, _)| other == key)
    };
    match custom
        .iter()
        .find(|(key, value)| !is_field(key) || !value.is_string())
    {
        Some((key, _)) => Err(refused(&format!(
            "Custom field `{key}` does not exist or is not text"
        ))),
        None => Ok(()),
    }
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
    if kind == "deal" {
        // The account's other text fields are filled on every deal; the request's own win.
        let mut custom: Map<String, Value> = shared
            .config
            .other_custom_fields
            .iter()
            .map(|(key, value)| (key.clone(), json!(value)))
            .collect();
        if let Some(Value::Object(given)) = body.remove("custom_fields") {
            custom.extend(given);
        }
        body.insert("custom_fields".into(), Value::Object(custom));
    }
    if kind == "activity" {
        // The primary participant is the activity's person.
        let primary = body
            .get("participants")
            .and_then(Value::as_array)
            .and_then(|all| all.iter().find(|one| one["primary"] == json!(true)))
            .map(|one| one["person_id"].clone());
        body.insert("person_id".into(), primary.unwrap_or(Value::Null));
    }
    store.objects.push(Object {
        company: company.to_owned(),
        kind,
        body: body.clone(),
        created_ms: now,
    });
    Reply::json(200, &json!({"success": true, "data": body}))
}

/// The text custom field values of a deal as a search hit lists them: the account's other fields
/// first, the label field last.
fn listed_custom_fields(config: &Config, deal: &Map<String, Value>) -> Vec<String> {
    let custom = deal.get("custom_fields").and_then(Value::as_object);
    let value = |key: &str| {
        custom
            .and_then(|custom| custom.get(key))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    config
        .other_custom_fields
        .iter()
        .filter_map(|(key, _)| value(key))
        .chain(value(&config.label_field_key))
        .collect()
}

/// What a search asked for, checked as v2 checks it.
struct SearchQuery {
    term: String,
    in_custom_fields: bool,
    exact: bool,
    limit: usize,
}

fn search_query(query: &BTreeMap<String, String>) -> Result<SearchQuery, Reply> {
    let exact = match query.get("exact_match").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(refused("exact_match must be true or false")),
    };
    let shortest = if exact { 1 } else { 2 };
    let Some(term) = query
        .get("term")
        .filter(|term| term.chars().count() >= shortest)
    else {
        return Err(refused(
            "term must be at least 2 characters (1 with exact_match)",
        ));
    };
    let fields: Vec<&str> = query.get("fields").map_or_else(
        || vec!["custom_fields", "notes", "title"],
        |fields| fields.split(',').collect(),
    );
    if let Some(unknown) = fields
        .iter()
        .find(|field| !["custom_fields", "notes", "title"].contains(field))
    {
        return Err(refused(&format!("`{unknown}` is no searchable field")));
    }
    let limit = match query.get("limit").map(|limit| limit.parse::<u64>()) {
        None => 100,
        Some(Ok(limit)) if (1..=MAX_SEARCH_LIMIT).contains(&limit) => limit,
        Some(_) => return Err(refused("limit must be 1 to 500")),
    };
    Ok(SearchQuery {
        term: term.clone(),
        in_custom_fields: fields.contains(&"custom_fields"),
        exact,
        limit: usize::try_from(limit).expect("at most 500"),
    })
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
    let query = match search_query(&query) {
        Ok(query) => query,
        Err(reply) => return reply,
    };
    let matches = |value: &str| match query.exact {
        true => value.eq_ignore_ascii_case(&query.term),
        false => value.to_lowercase().contains(&query.term.to_lowercase()),
    };
    let now = shared.core.now_ms();
    let store = shared.store.lock().expect("not poisoned");
    let items: Vec<Value> = store
        .objects
        .iter()
        .filter(|object| object.kind == "deal" && object.company == company)
        .filter(|object| now.saturating_sub(object.created_ms) >= shared.config.search_lag_ms)
        .filter_map(|object| {
            let listed = listed_custom_fields(&shared.config, &object.body);
            let hit = query.in_custom_fields && listed.iter().any(|value| matches(value));
            hit.then(|| {
                json!({"result_score": 1.0, "item": {"id": object.body["id"], "type": "deal",
                       "title": object.body["title"], "status": "open", "visible_to": 3,
                       "person": null, "organization": null, "custom_fields": listed,
                       "notes": [], "is_archived": false}})
            })
        })
        .take(query.limit)
        .collect();
    Reply::json(
        200,
        &json!({"success": true, "data": {"items": items},
                "additional_data": {"next_cursor": null}}),
    )
}
