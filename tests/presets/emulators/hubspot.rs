//! HubSpot CRM v3, as far as the `hubspot` preset calls it: `POST /crm/v3/objects/{type}` and
//! `POST /crm/v3/objects/{type}/search` for tasks, notes and deals.
//!
//! Follows the CRM API guides (developers.hubspot.com: "Tasks", "Notes", "Deals", "Search the
//! CRM", "Usage details / rate limits", "Error handling"). Facts relied on:
//! - A private app's token as `Authorization: Bearer …`; a bad one is 401 with category
//!   `INVALID_AUTHENTICATION`.
//! - Errors are `{"status":"error","message":…,"correlationId":…,"category":…}`; a property that
//!   does not exist on the object, or a task without `hs_timestamp`, is 400 `VALIDATION_ERROR`.
//! - A create takes `{"properties":{…},"associations":[…]}` (the OpenAPI description's
//!   SimplePublicObjectInputForCreate requires both, the associations a list; the preset sends an
//!   empty one) and answers 201 `{"id":"<digits>","properties":{…},
//!   "createdAt","updatedAt","archived":false}`; there is no idempotency key: a repeat creates
//!   another object.
//! - Search takes `{"filterGroups":[{"filters":[{"propertyName","operator":"EQ","value"}]}],
//!   "properties":[…],"limit"}` and answers `{"total","results":[{"id","properties":{…}}]}`,
//!   each result carrying the asked properties; it is eventually consistent (a new object is
//!   missing for a while; "several seconds" is what integrators report; configurable here).
//! - Rate limits answer 429 with `"errorType":"RATE_LIMIT"` and the exhausted policy in
//!   `policyName` (`TEN_SECONDLY_ROLLING` for the 10-second window creates are counted in,
//!   `SECONDLY` for the search API's, `DAILY`), with no `Retry-After` and no reset header: the
//!   `X-HubSpot-RateLimit-*` headers give counts and the window's length only (usage
//!   guidelines, developers.hubspot.com/docs/developer-tooling/platform/usage-guidelines).
//! - Every answer carries `X-HubSpot-Correlation-Id`.
//!
//! Not confirmed from the docs: an upper bound on the search lag (none is published), and the
//! 5xx body (taken in the usual error shape with category `INTERNAL_ERROR`).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Extension, Router};
use serde_json::{json, Map, Value};

use super::{bearer, carry_out, Connection, Core, Emulator, Reply, Running, Voice};

/// The object types served, each with the properties it has besides the custom label property.
const OBJECTS: &[(&str, &[&str])] = &[
    (
        "tasks",
        &[
            "hs_task_subject",
            "hs_task_body",
            "hs_timestamp",
            "hs_task_status",
            "hs_task_priority",
            "hubspot_owner_id",
        ],
    ),
    (
        "notes",
        &["hs_note_body", "hs_timestamp", "hubspot_owner_id"],
    ),
    (
        "deals",
        &[
            "dealname",
            "amount",
            "dealstage",
            "pipeline",
            "closedate",
            "hubspot_owner_id",
        ],
    ),
];

/// What the emulator is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Access token → the portal (account) it belongs to.
    pub tokens: Vec<(String, String)>,
    /// The custom property the user created on every object type.
    pub label_property: String,
    /// How long a new object stays out of search, in milliseconds.
    pub search_lag_ms: u64,
}

/// One stored object.
#[derive(Clone, Debug)]
pub struct Object {
    pub portal: String,
    pub kind: String,
    pub id: String,
    pub properties: Map<String, Value>,
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
    /// When each search arrived, in the emulator's milliseconds (a budget test counts them).
    searches: Mutex<Vec<u64>>,
}

struct HubSpotVoice;

impl Voice for HubSpotVoice {
    fn server_error(&self, status: u16) -> Reply {
        error(status, "INTERNAL_ERROR", "internal error")
    }

    fn rate_limited(&self, _retry_after_s: u64) -> Reply {
        Reply::json(
            429,
            &json!({"status": "error", "message": "You have reached your ten_secondly_rolling limit.",
                    "errorType": "RATE_LIMIT", "correlationId": "c0ffee",
                    "policyName": "TEN_SECONDLY_ROLLING"}),
        )
    }
}

fn error(status: u16, category: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &json!({"status": "error", "message": message, "correlationId": "c0ffee", "category": category}),
    )
}

/// A running HubSpot emulator and its handle.
pub struct HubSpot {
    pub running: Running,
    shared: Arc<Shared>,
}

impl HubSpot {
    /// Starts one on a loopback port.
    pub async fn start(config: Config) -> Self {
        let routes = Router::new()
            .route("/crm/v3/objects/{kind}", post(create))
            .route("/crm/v3/objects/{kind}/search", post(search));
        let shared = Shared {
            core: Core::new(&config.tokens),
            config,
            store: Mutex::default(),
            searches: Mutex::default(),
        };
        let routes = routes.merge(super::oauth::routes(
            super::oauth::Dialect::HubSpot,
            Arc::clone(&shared.core.oauth),
        ));
        let (running, shared) = super::launch(shared, routes).await;
        Self { running, shared }
    }

    /// When each search request arrived, in milliseconds since the emulator started.
    pub fn searches(&self) -> Vec<u64> {
        self.shared.searches.lock().expect("not poisoned").clone()
    }

    /// Every stored object of `kind` (`tasks`, `notes`, `deals`), oldest first.
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

impl Emulator for HubSpot {
    fn core(&self) -> &Core {
        &self.shared.core
    }
}

fn portal_of(shared: &Shared, headers: &HeaderMap) -> Result<String, Reply> {
    let invalid = || {
        error(
            401,
            "INVALID_AUTHENTICATION",
            "Authentication credentials not found.",
        )
    };
    shared
        .core
        .account(bearer(headers).as_deref())
        .ok_or_else(invalid)
}

fn known_properties(kind: &str) -> Option<&'static [&'static str]> {
    OBJECTS
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|(_, properties)| *properties)
}

async fn create(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    Path(kind): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let reply = match checked_create(&shared, &kind, &headers, &body) {
        Ok((portal, properties)) => {
            let fault = shared.core.take_fault();
            let committing = Arc::clone(&shared);
            carry_out(
                fault,
                &connection,
                &HubSpotVoice,
                move |instead| {
                    let reply = apply(&committing, &portal, &kind, properties);
                    instead.unwrap_or(reply)
                },
                || {},
            )
            .await
        }
        Err(reply) => reply,
    };
    reply.header("x-hubspot-correlation-id", "c0ffee")
}

/// The create's portal and properties, or the refusal HubSpot answers.
fn checked_create(
    shared: &Shared,
    kind: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(String, Map<String, Value>), Reply> {
    let portal = portal_of(shared, headers)?;
    let known = known_properties(kind)
        .ok_or_else(|| error(404, "OBJECT_NOT_FOUND", "Unable to infer object type"))?;
    let label_property = &shared.config.label_property;
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(body) else {
        return Err(error(400, "VALIDATION_ERROR", "Invalid input JSON"));
    };
    let Some(Value::Object(properties)) = body.remove("properties") else {
        return Err(error(400, "VALIDATION_ERROR", "properties is required"));
    };
    if body
        .get("associations")
        .is_some_and(|associations| !associations.is_array())
    {
        return Err(error(
            400,
            "VALIDATION_ERROR",
            "Invalid input JSON: associations must be a list",
        ));
    }
    if let Some(unknown) = properties
        .keys()
        .find(|name| !known.contains(&name.as_str()) && *name != label_property)
    {
        let message =
            format!("Property values were not valid: Property \"{unknown}\" does not exist");
        return Err(error(400, "VALIDATION_ERROR", &message));
    }
    if kind != "deals" && !properties.contains_key("hs_timestamp") {
        return Err(error(
            400,
            "VALIDATION_ERROR",
            "Property values were not valid: hs_timestamp is required",
        ));
    }
    Ok((portal, properties))
}

fn apply(shared: &Shared, portal: &str, kind: &str, mut properties: Map<String, Value>) -> Reply {
    let now = shared.core.now_ms();
    let mut store = shared.store.lock().expect("not poisoned");
    store.next += 1;
    let id = (70_000_000_000_u64 + store.next).to_string();
    properties.insert("hs_object_id".into(), json!(id));
    store.objects.push(Object {
        portal: portal.to_owned(),
        kind: kind.to_owned(),
        id: id.clone(),
        properties: properties.clone(),
        created_ms: now,
    });
    Reply::json(
        201,
        &json!({"id": id, "properties": properties, "createdAt": "2026-12-01T00:00:00Z",
                "updatedAt": "2026-12-01T00:00:00Z", "archived": false}),
    )
}

async fn search(
    State(shared): State<Arc<Shared>>,
    Path(kind): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let arrived = shared.core.now_ms();
    shared.searches.lock().expect("not poisoned").push(arrived);
    let portal = match portal_of(&shared, &headers) {
        Ok(portal) => portal,
        Err(reply) => return reply,
    };
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error(400, "VALIDATION_ERROR", "Invalid input JSON");
    };
    let filter = &request["filterGroups"][0]["filters"][0];
    let (Some(name), Some("EQ"), Some(value)) = (
        filter["propertyName"].as_str(),
        filter["operator"].as_str(),
        filter["value"].as_str(),
    ) else {
        return error(400, "VALIDATION_ERROR", "this emulator reads one EQ filter");
    };
    let asked: Vec<&str> = request["properties"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let lag_ms = shared.config.search_lag_ms;
    let now = shared.core.now_ms();
    let store = shared.store.lock().expect("not poisoned");
    let results: Vec<Value> = store
        .objects
        .iter()
        .filter(|object| {
            object.portal == portal
                && object.kind == kind
                && object.properties.get(name).and_then(Value::as_str) == Some(value)
                && now.saturating_sub(object.created_ms) >= lag_ms
        })
        .map(|object| {
            let mut shown = Map::new();
            shown.insert("hs_object_id".into(), json!(object.id));
            for name in &asked {
                if let Some(value) = object.properties.get(*name) {
                    shown.insert((*name).to_owned(), value.clone());
                }
            }
            json!({"id": object.id, "properties": shown, "archived": false})
        })
        .collect();
    Reply::json(200, &json!({"total": results.len(), "results": results}))
        .header("x-hubspot-correlation-id", "c0ffee")
}
