//! Stripe, as far as the `stripe` preset calls it: `POST /v1/customers`, `POST /v1/invoiceitems`
//! and `GET /v1/customers/search`.
//!
//! Follows the Stripe API reference (docs.stripe.com/api: "Idempotent requests", "Errors",
//! "Search customers", "Metadata", "Rate limits"). Facts relied on:
//! - Secret keys authenticate as `Authorization: Bearer sk_…`; a bad key is 401 with
//!   `{"error":{"type":"invalid_request_error","message":…}}`.
//! - Bodies are `application/x-www-form-urlencoded`, nested fields in brackets
//!   (`metadata[opledger_label]=…`); answers are JSON objects with `id` (`cus_…`, `ii_…`) and
//!   `object`, and every answer carries `Request-Id: req_…`.
//! - Idempotency: once the endpoint has started executing, the status and body of the first
//!   request with a key are saved and replayed for a repeat, **including a 500**, with
//!   `Idempotent-Replayed: true`; a repeat with other parameters is 400 with error type
//!   `idempotency_error`; a repeat while the first still runs is 409 with code
//!   `idempotency_key_in_use`; nothing is saved when parameters fail validation; keys may be
//!   pruned once 24 hours old, and a pruned key makes a new request (retention configurable here).
//! - Rate limiting answers 429 (code `rate_limit`) before the idempotency layer: nothing saved.
//! - Customer search takes `query=metadata['key']:'value'`, answers
//!   `{"object":"search_result","data":[…],"has_more":false}`, and lags behind creates ("under
//!   1 minute" normally; configurable here).
//!
//! Not confirmed from the docs: whether a 429 carries `Retry-After` (this emulator sends it, and
//! the preset does not rely on it); the exact parameter comparison Stripe makes (this compares
//! the sorted form pairs and the path); the error type of `idempotency_key_in_use` (taken as
//! `invalid_request_error`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::{json, Map, Value};

use super::keys::{Claim, Keys};
use super::{bearer, carry_out, Connection, Core, Emulator, Fault, Reply, Running, Voice};

/// Stripe's documented retention of an idempotency key, in milliseconds (24 hours).
pub const DEFAULT_KEY_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;

/// What the emulator is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// API key → the Stripe account it belongs to.
    pub keys: Vec<(String, String)>,
    /// How long a key is remembered, in milliseconds.
    pub key_retention_ms: u64,
    /// How long a new customer stays out of search, in milliseconds.
    pub search_lag_ms: u64,
}

/// One stored object.
#[derive(Clone, Debug)]
pub struct Object {
    pub account: String,
    pub body: Value,
    created_ms: u64,
}

#[derive(Default)]
struct Store {
    objects: Vec<Object>,
    keys: Keys,
    next: u64,
}

struct Shared {
    core: Core,
    config: Config,
    store: Mutex<Store>,
}

struct StripeVoice;

impl Voice for StripeVoice {
    fn server_error(&self, status: u16) -> Reply {
        error(status, "api_error", None, "An unknown error occurred")
    }

    fn rate_limited(&self, retry_after_s: u64) -> Reply {
        error(
            429,
            "invalid_request_error",
            Some("rate_limit"),
            "Request rate limit exceeded.",
        )
        .header("retry-after", retry_after_s.to_string())
    }
}

fn error(status: u16, kind: &str, code: Option<&str>, message: &str) -> Reply {
    let mut body = json!({"type": kind, "message": message});
    if let Some(code) = code {
        body["code"] = json!(code);
    }
    Reply::json(status, &json!({ "error": body }))
}

/// A running Stripe emulator and the handle the test drives it with.
pub struct Stripe {
    pub running: Running,
    shared: Arc<Shared>,
}

impl Stripe {
    /// Starts one on a loopback port.
    pub async fn start(config: Config) -> Self {
        let routes = Router::new()
            .route("/v1/customers", post(create_customer))
            .route("/v1/invoiceitems", post(create_invoice_item))
            .route("/v1/customers/search", get(search));
        let shared = Shared {
            core: Core::new(&config.keys),
            config,
            store: Mutex::default(),
        };
        let (running, shared) = super::launch(shared, routes).await;
        Self { running, shared }
    }

    /// Every stored object of `kind` (`customer`, `invoiceitem`), oldest first.
    pub fn objects(&self, kind: &str) -> Vec<Object> {
        let store = self.shared.store.lock().expect("not poisoned");
        store
            .objects
            .iter()
            .filter(|object| object.body["object"] == kind)
            .cloned()
            .collect()
    }
}

impl Emulator for Stripe {
    fn core(&self) -> &Core {
        &self.shared.core
    }
}

fn account_of(shared: &Shared, headers: &HeaderMap) -> Result<String, Reply> {
    let invalid = || {
        error(
            401,
            "invalid_request_error",
            None,
            "Invalid API Key provided.",
        )
    };
    shared
        .core
        .account(bearer(headers).as_deref())
        .ok_or_else(invalid)
}

async fn create_customer(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    create(shared, connection, headers, body, "customer").await
}

async fn create_invoice_item(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    create(shared, connection, headers, body, "invoiceitem").await
}

async fn create(
    shared: Arc<Shared>,
    connection: Connection,
    headers: HeaderMap,
    body: Bytes,
    kind: &'static str,
) -> Reply {
    let reply = create_inner(&shared, &connection, &headers, &body, kind).await;
    let mut store = shared.store.lock().expect("not poisoned");
    store.next += 1;
    reply.header("request-id", format!("req_{}", store.next))
}

async fn create_inner(
    shared: &Arc<Shared>,
    connection: &Connection,
    headers: &HeaderMap,
    body: &[u8],
    kind: &'static str,
) -> Reply {
    let account = match account_of(shared, headers) {
        Ok(account) => account,
        Err(reply) => return reply,
    };
    let form = headers
        .get("content-type")
        .is_some_and(|value| value.as_bytes() == b"application/x-www-form-urlencoded");
    if !form {
        return error(
            400,
            "invalid_request_error",
            None,
            "Invalid request: send a form-encoded body.",
        );
    }
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    pairs.sort();
    // The rate limiter answers before the idempotency layer: nothing is saved for a 429.
    let fault = shared.core.take_fault();
    if let Some(Fault::RateLimit { retry_after_s }) = fault {
        return StripeVoice.rate_limited(retry_after_s);
    }
    if let Some(missing) = missing_parameter(kind, &pairs) {
        let message = format!("Missing required param: {missing}.");
        return error(
            400,
            "invalid_request_error",
            Some("parameter_missing"),
            &message,
        );
    }
    let slot = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .map(|key| (account.clone(), format!("{kind}:{key}")));
    if let Some(slot) = &slot {
        if let Some(answer) = replay_or_claim(shared, slot, &pairs) {
            return answer;
        }
    }
    let (commit_shared, abandon_shared) = (Arc::clone(shared), Arc::clone(shared));
    let (commit_slot, abandon_slot) = (slot.clone(), slot);
    carry_out(
        fault,
        connection,
        &StripeVoice,
        move |instead| commit(&commit_shared, &account, kind, &pairs, commit_slot, instead),
        move || {
            if let Some(slot) = abandon_slot {
                abandon_shared
                    .store
                    .lock()
                    .expect("not poisoned")
                    .keys
                    .release(&slot);
            }
        },
    )
    .await
}

fn missing_parameter(kind: &str, pairs: &[(String, String)]) -> Option<&'static str> {
    let required: &[&'static str] = match kind {
        "invoiceitem" => &["customer", "currency"],
        _ => &[],
    };
    required
        .iter()
        .find(|name| !pairs.iter().any(|(key, _)| key == *name))
        .copied()
}

/// The answer for a key already known (a replay, 409 or 400), or `None` after claiming the key
/// for this request.
fn replay_or_claim(
    shared: &Shared,
    slot: &(String, String),
    pairs: &[(String, String)],
) -> Option<Reply> {
    let retention_ms = shared.config.key_retention_ms;
    let now = shared.core.now_ms();
    let request = format!("{pairs:?}");
    let mut store = shared.store.lock().expect("not poisoned");
    match store.keys.claim(slot, &request, now, retention_ms) {
        Claim::New => None,
        Claim::Mismatch => Some(error(
            400,
            "idempotency_error",
            None,
            "Keys for idempotent requests can only be used with the same parameters they were first used with.",
        )),
        Claim::InFlight => Some(error(
            409,
            "invalid_request_error",
            Some("idempotency_key_in_use"),
            "There is currently another in-progress request using this Idempotent Key.",
        )),
        Claim::Replay(reply) => Some(reply.header("idempotent-replayed", "true")),
    }
}

fn commit(
    shared: &Shared,
    account: &str,
    kind: &str,
    pairs: &[(String, String)],
    slot: Option<(String, String)>,
    instead: Option<Reply>,
) -> Reply {
    let now = shared.core.now_ms();
    let mut store = shared.store.lock().expect("not poisoned");
    store.next += 1;
    let prefix = if kind == "customer" { "cus" } else { "ii" };
    let mut body = Map::new();
    body.insert("id".into(), json!(format!("{prefix}_{:08}", store.next)));
    body.insert("object".into(), json!(kind));
    body.insert("livemode".into(), json!(false));
    let mut metadata = Map::new();
    for (key, value) in pairs {
        match key
            .strip_prefix("metadata[")
            .and_then(|rest| rest.strip_suffix(']'))
        {
            Some(name) => metadata.insert(name.to_owned(), json!(value)),
            None => body.insert(key.clone(), json!(value)),
        };
    }
    body.insert("metadata".into(), Value::Object(metadata));
    let body = Value::Object(body);
    store.objects.push(Object {
        account: account.to_owned(),
        body: body.clone(),
        created_ms: now,
    });
    let reply = instead.unwrap_or_else(|| Reply::json(200, &body));
    if let Some(slot) = slot {
        store.keys.save(&slot, &reply);
    }
    reply
}

async fn search(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Reply {
    let account = match account_of(&shared, &headers) {
        Ok(account) => account,
        Err(reply) => return reply,
    };
    let Some((key, value)) = query.get("query").and_then(|text| metadata_clause(text)) else {
        return error(
            400,
            "invalid_request_error",
            None,
            "This emulator reads only metadata['key']:'value' queries.",
        );
    };
    let lag_ms = shared.config.search_lag_ms;
    let now = shared.core.now_ms();
    let store = shared.store.lock().expect("not poisoned");
    let data: Vec<Value> = store
        .objects
        .iter()
        .filter(|object| {
            object.account == account
                && object.body["object"] == "customer"
                && object.body["metadata"][&key] == value
                && now.saturating_sub(object.created_ms) >= lag_ms
        })
        .map(|object| object.body.clone())
        .collect();
    Reply::json(
        200,
        &json!({"object": "search_result", "url": "/v1/customers/search", "has_more": false, "data": data}),
    )
}

/// `metadata['key']:'value'` → (key, value).
fn metadata_clause(text: &str) -> Option<(String, String)> {
    let rest = text.strip_prefix("metadata['")?;
    let (key, rest) = rest.split_once("']:'")?;
    let value = rest.strip_suffix('\'')?;
    Some((key.to_owned(), value.to_owned()))
}
