//! The keyed shape (Stripe-style `Idempotency-Key`): its rules and its two routes,
//! `POST /keyed/{account}/tasks` and `GET /keyed/{account}/requests/{key}`.
//!
//! A key is remembered for `key_retention_s` on the stand clock, then forgotten: a forgotten key
//! creates again, which is the real-world danger the ledger has to avoid. These rules must never
//! create a second task for a remembered key, whatever the timing.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::Extension;
use serde_json::{json, Map, Value};

use super::exchange::{self, task_fields, Call, LimitedBody, Op};
use super::server::ConnectionHandle;
use super::state::{Applied, Crm, KeyRecord, KeyTicket, Outcome, Reply, Shared, MAX_KEY_BYTES};
use super::wire::Shape;

/// The request header that carries the key.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl Crm {
    /// `POST /keyed/{account}/tasks`: create, replay, or refuse.
    pub(super) fn keyed_create(
        &mut self,
        account: &str,
        key: &str,
        fields: Map<String, Value>,
        now_ms: u64,
        retention_ms: u64,
    ) -> Applied {
        let scoped = (account.to_owned(), key.to_owned());
        if let Some(record) = self
            .keys
            .get(&scoped)
            .filter(|record| remembered(record, now_ms, retention_ms))
        {
            // A changed body is checked first: it is a client bug whatever the timing.
            if record.fields != fields {
                return Applied::refused(Reply::error(
                    StatusCode::BAD_REQUEST,
                    "idempotency_key_reused",
                    "this key was used with a different body",
                ));
            }
            if !record.completed {
                return Applied::refused(Reply::error(
                    StatusCode::CONFLICT,
                    "idempotency_in_flight",
                    "the first request with this key is still in flight",
                ));
            }
            let mut reply = created(record.task.to_string());
            reply.replayed = true;
            return Applied::new(reply, Outcome::Replayed);
        }
        let index = match self.create_task(
            Shape::Keyed,
            account,
            Some(key),
            None,
            fields.clone(),
            now_ms,
        ) {
            Ok(index) => index,
            Err(reply) => return Applied::refused(reply),
        };
        let task = self.tasks[index].id;
        let seq = self.next_key_seq();
        // Replaces a forgotten record, if there was one.
        self.keys.insert(
            scoped,
            KeyRecord {
                seq,
                fields,
                task,
                first_seen_ms: now_ms,
                completed: false,
            },
        );
        Applied {
            reply: created(task.to_string()),
            outcome: Outcome::Applied,
            ticket: Some(KeyTicket {
                account: account.to_owned(),
                key: key.to_owned(),
                seq,
            }),
        }
    }

    /// The key's first request has produced its response: the key is no longer in flight.
    pub(super) fn complete_key(&mut self, ticket: &KeyTicket) {
        let scoped = (ticket.account.clone(), ticket.key.clone());
        if let Some(record) = self.keys.get_mut(&scoped) {
            // A record with another seq replaced this one after it was forgotten (or after a
            // reset); completing it would end someone else's flight.
            if record.seq == ticket.seq {
                record.completed = true;
            }
        }
    }

    /// `GET /keyed/{account}/requests/{key}`.
    pub(super) fn keyed_status(
        &self,
        account: &str,
        key: &str,
        now_ms: u64,
        retention_ms: u64,
    ) -> Applied {
        let scoped = (account.to_owned(), key.to_owned());
        let reply = match self
            .keys
            .get(&scoped)
            .filter(|record| remembered(record, now_ms, retention_ms))
        {
            Some(record) if record.completed => Reply::json(
                StatusCode::OK,
                json!({"status": "completed", "id": record.task.to_string()}),
            ),
            Some(_) => Reply::json(StatusCode::OK, json!({"status": "in_progress"})),
            None => Reply::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no request with this key (unknown or forgotten)",
            ),
        };
        Applied::new(reply, Outcome::Applied)
    }
}

/// Whether a key is still remembered at `now_ms`.
fn remembered(record: &KeyRecord, now_ms: u64, retention_ms: u64) -> bool {
    now_ms.saturating_sub(record.first_seen_ms) < retention_ms
}

fn created(id: String) -> Reply {
    Reply::json(StatusCode::CREATED, json!({ "id": id }))
}

/// The `Idempotency-Key` header: present, not empty, visible ASCII, at most [`MAX_KEY_BYTES`].
fn idempotency_key(headers: &HeaderMap) -> Result<String, Reply> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "idempotency_key_missing",
            "the Idempotency-Key header is required",
        ));
    };
    let key = value.to_str().map_err(|_| invalid_key())?.trim();
    if key.is_empty() {
        return Err(Reply::error(
            StatusCode::BAD_REQUEST,
            "idempotency_key_missing",
            "the Idempotency-Key header is empty",
        ));
    }
    if key.len() > MAX_KEY_BYTES || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid_key());
    }
    Ok(key.to_owned())
}

fn invalid_key() -> Reply {
    Reply::error(
        StatusCode::BAD_REQUEST,
        "idempotency_key_invalid",
        format!("an Idempotency-Key has 1 to {MAX_KEY_BYTES} visible ASCII characters"),
    )
}

/// `POST /keyed/{account}/tasks`.
pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    account: Result<Path<String>, PathRejection>,
    connection: Option<Extension<ConnectionHandle>>,
    body: LimitedBody,
) -> Response {
    let key = idempotency_key(&headers);
    let mut call = Call::new(
        Shape::Keyed,
        method,
        &uri,
        &headers,
        account.ok().map(|Path(account)| account),
    );
    call.key = key.as_ref().ok().cloned();
    let op = key.and_then(|key| {
        Ok(Op::KeyedCreate {
            key,
            fields: task_fields(body)?,
        })
    });
    exchange::run(shared, call, op, connection.map(|Extension(c)| c)).await
}

/// `GET /keyed/{account}/requests/{key}`.
pub(super) async fn status(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
    connection: Option<Extension<ConnectionHandle>>,
) -> Response {
    let (account, key) = match params {
        Ok(Path((account, key))) => (Some(account), Ok(key)),
        Err(rejection) => (
            None,
            Err(Reply::error(
                StatusCode::BAD_REQUEST,
                "invalid_path",
                rejection.body_text(),
            )),
        ),
    };
    let mut call = Call::new(Shape::Keyed, method, &uri, &headers, account);
    call.key = key.as_ref().ok().cloned();
    let op = key.map(|key| Op::KeyedStatus { key });
    exchange::run(shared, call, op, connection.map(|Extension(c)| c)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const RETENTION_MS: u64 = 1_000;

    fn fields(title: &str) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("title".to_owned(), json!(title));
        fields
    }

    fn id_of(applied: &Applied) -> Option<&str> {
        applied.reply.body.get("id").and_then(Value::as_str)
    }

    #[test]
    fn a_key_in_flight_refuses_a_retry_until_it_is_completed() {
        let mut crm = Crm::new();
        let first = crm.keyed_create("a", "k", fields("x"), 0, RETENTION_MS);
        let ticket = first
            .ticket
            .clone()
            .expect("a creation leaves the key in flight");
        let retry = crm.keyed_create("a", "k", fields("x"), 1, RETENTION_MS);
        assert_eq!(retry.reply.status, StatusCode::CONFLICT);
        crm.complete_key(&ticket);
        let replay = crm.keyed_create("a", "k", fields("x"), 2, RETENTION_MS);
        assert_eq!(replay.outcome, Outcome::Replayed);
        assert_eq!(id_of(&replay), id_of(&first));
        assert_eq!(crm.tasks.len(), 1);
    }

    #[test]
    fn a_forgotten_key_creates_again_and_a_stale_ticket_completes_nothing() {
        let mut crm = Crm::new();
        let first = crm.keyed_create("a", "k", fields("x"), 0, RETENTION_MS);
        let stale = first.ticket.clone().expect("in flight");
        let second = crm.keyed_create("a", "k", fields("x"), RETENTION_MS, RETENTION_MS);
        assert_eq!(second.outcome, Outcome::Applied);
        assert_ne!(id_of(&second), id_of(&first));
        crm.complete_key(&stale);
        let status = crm.keyed_status("a", "k", RETENTION_MS, RETENTION_MS);
        assert_eq!(status.reply.body, json!({"status": "in_progress"}));
    }

    #[test]
    fn keys_are_per_account() {
        let mut crm = Crm::new();
        let a = crm.keyed_create("a", "k", fields("x"), 0, RETENTION_MS);
        let b = crm.keyed_create("b", "k", fields("y"), 0, RETENTION_MS);
        assert_eq!(b.outcome, Outcome::Applied);
        assert_ne!(id_of(&a), id_of(&b));
    }
}
