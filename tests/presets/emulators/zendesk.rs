//! Zendesk Support, as far as the `zendesk` preset calls it: `POST /api/v2/tickets.json` and
//! `GET /api/v2/tickets.json?external_id=…`.
//!
//! Follows the Support API reference ("Tickets": create ticket, list tickets by external id) and
//! the API introduction ("Idempotency", "Rate limits", "Security and authentication"). Facts
//! relied on:
//! - An OAuth access token as `Authorization: Bearer …`; a bad one is 401
//!   `{"error":"Couldn't authenticate you"}`.
//! - A create takes `{"ticket":{"subject","comment":{"body"},…,"external_id"}}` and answers 201
//!   `{"ticket":{"id":<integer>,…}}`; a ticket without a comment is 422 `RecordInvalid`.
//! - `Idempotency-Key` on ticket creation: kept 2 hours (configurable here); a repeat inside the
//!   window answers the first response with `x-idempotency-lookup: hit` (a first use: `miss`);
//!   the same key with other parameters is 400 `{"error":"IdempotentRequestError",
//!   "description":"Request parameters don't match the given idempotency key"}`.
//! - The ticket list filtered by `external_id` answers `{"tickets":[…],"count":n,…}` from the
//!   tickets themselves (no search index in between).
//! - Rate limits answer 429 with `Retry-After` in seconds.
//!
//! Not confirmed from the docs: what a repeat gets while the first request with its key still
//! runs (this answers 409 `IdempotentRequestInProgress`, which the preset does not rely on: it
//! reads as unclear, and the lookup decides); whether an error answered after the ticket was
//! written is what a repeat replays (this replays what was sent, as Stripe documents); the JSON
//! bodies of 429 and 5xx answers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Extension, Router};
use serde_json::{json, Map, Value};

use super::keys::{Claim, Keys};
use super::{bearer, carry_out, Connection, Core, Emulator, Reply, Running, Voice};

/// Zendesk's documented key retention, in milliseconds (2 hours).
pub const DEFAULT_KEY_RETENTION_MS: u64 = 2 * 60 * 60 * 1000;

/// What the emulator is started with.
#[derive(Clone, Debug)]
pub struct Config {
    /// Access token → the Zendesk account (subdomain) it belongs to.
    pub tokens: Vec<(String, String)>,
    /// How long a key is remembered, in milliseconds.
    pub key_retention_ms: u64,
}

/// One stored ticket.
#[derive(Clone, Debug)]
pub struct Ticket {
    pub account: String,
    pub body: Value,
}

#[derive(Default)]
struct Store {
    tickets: Vec<Ticket>,
    keys: Keys,
    next: u64,
}

struct Shared {
    core: Core,
    config: Config,
    store: Mutex<Store>,
}

struct ZendeskVoice;

impl Voice for ZendeskVoice {
    fn server_error(&self, status: u16) -> Reply {
        error(status, "InternalServerError", "Something went wrong")
    }

    fn rate_limited(&self, retry_after_s: u64) -> Reply {
        error(
            429,
            "APIRateLimitExceeded",
            "Number of allowed API requests per minute exceeded",
        )
        .header("retry-after", retry_after_s.to_string())
    }
}

fn error(status: u16, code: &str, description: &str) -> Reply {
    Reply::json(status, &json!({"error": code, "description": description}))
}

/// A running Zendesk emulator and its handle.
pub struct Zendesk {
    pub running: Running,
    shared: Arc<Shared>,
}

impl Zendesk {
    /// Starts one on a loopback port.
    pub async fn start(config: Config) -> Self {
        let routes = Router::new().route("/api/v2/tickets.json", post(create).get(list));
        let shared = Shared {
            core: Core::new(&config.tokens),
            config,
            store: Mutex::default(),
        };
        let routes = routes.merge(super::oauth::routes(
            super::oauth::Dialect::Zendesk,
            Arc::clone(&shared.core.oauth),
        ));
        let (running, shared) = super::launch(shared, routes).await;
        Self { running, shared }
    }

    /// Every ticket, oldest first.
    pub fn tickets(&self) -> Vec<Ticket> {
        self.shared
            .store
            .lock()
            .expect("not poisoned")
            .tickets
            .clone()
    }
}

impl Emulator for Zendesk {
    fn core(&self) -> &Core {
        &self.shared.core
    }
}

fn account_of(shared: &Shared, headers: &HeaderMap) -> Result<String, Reply> {
    let invalid = || Reply::json(401, &json!({"error": "Couldn't authenticate you"}));
    shared
        .core
        .account(bearer(headers).as_deref())
        .ok_or_else(invalid)
}

async fn create(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let account = match account_of(&shared, &headers) {
        Ok(account) => account,
        Err(reply) => return reply,
    };
    let ticket = match checked_ticket(&body) {
        Ok(ticket) => ticket,
        Err(reply) => return reply,
    };
    let fault = shared.core.take_fault();
    let slot = headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .map(|key| (account.clone(), key.to_owned()));
    if let Some(slot) = &slot {
        let now = shared.core.now_ms();
        let retention_ms = shared.config.key_retention_ms;
        let request = Value::Object(ticket.clone()).to_string();
        let claim = shared.store.lock().expect("not poisoned").keys.claim(
            slot,
            &request,
            now,
            retention_ms,
        );
        match claim {
            Claim::New => {}
            Claim::Replay(reply) => return reply.header("x-idempotency-lookup", "hit"),
            Claim::InFlight => {
                return error(
                    409,
                    "IdempotentRequestInProgress",
                    "A request with this key is in progress",
                )
            }
            Claim::Mismatch => {
                return error(
                    400,
                    "IdempotentRequestError",
                    "Request parameters don't match the given idempotency key",
                )
            }
        }
    }
    let (committing, releasing) = (Arc::clone(&shared), Arc::clone(&shared));
    let (commit_slot, release_slot) = (slot.clone(), slot);
    let reply = carry_out(
        fault,
        &connection,
        &ZendeskVoice,
        move |instead| apply(&committing, &account, ticket, commit_slot, instead),
        move || {
            if let Some(slot) = release_slot {
                releasing
                    .store
                    .lock()
                    .expect("not poisoned")
                    .keys
                    .release(&slot);
            }
        },
    )
    .await;
    reply.header("x-idempotency-lookup", "miss")
}

/// The ticket of a create body, or Zendesk's refusal.
fn checked_ticket(body: &[u8]) -> Result<Map<String, Value>, Reply> {
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(body) else {
        return Err(error(
            400,
            "InvalidJSON",
            "The request body is no JSON object",
        ));
    };
    let Some(Value::Object(ticket)) = body.remove("ticket") else {
        return Err(error(
            422,
            "RecordInvalid",
            "Record validation errors: ticket is required",
        ));
    };
    if !ticket["comment"]["body"].is_string() {
        return Err(error(
            422,
            "RecordInvalid",
            "Record validation errors: a comment is required",
        ));
    }
    Ok(ticket)
}

fn apply(
    shared: &Shared,
    account: &str,
    mut ticket: Map<String, Value>,
    slot: Option<(String, String)>,
    instead: Option<Reply>,
) -> Reply {
    let mut store = shared.store.lock().expect("not poisoned");
    store.next += 1;
    ticket.insert("id".into(), json!(35_000 + store.next));
    ticket.insert("status".into(), json!("new"));
    ticket.remove("comment");
    let body = Value::Object(ticket);
    store.tickets.push(Ticket {
        account: account.to_owned(),
        body: body.clone(),
    });
    let reply = instead.unwrap_or_else(|| Reply::json(201, &json!({ "ticket": body })));
    if let Some(slot) = slot {
        store.keys.save(&slot, &reply);
    }
    reply
}

async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
) -> Reply {
    let account = match account_of(&shared, &headers) {
        Ok(account) => account,
        Err(reply) => return reply,
    };
    let external_id = query.get("external_id");
    let store = shared.store.lock().expect("not poisoned");
    let tickets: Vec<Value> = store
        .tickets
        .iter()
        .filter(|ticket| ticket.account == account)
        .filter(|ticket| {
            external_id.is_none_or(|wanted| ticket.body["external_id"] == wanted.as_str())
        })
        .map(|ticket| ticket.body.clone())
        .collect();
    Reply::json(
        200,
        &json!({"tickets": tickets, "count": tickets.len(), "next_page": null, "previous_page": null}),
    )
}
