//! The admin API: queue and clear faults, move the stand clock, change settings and tokens,
//! look at objects and the request log, reset, and the health check.
//!
//! It has no authentication because the stand only listens on loopback. Its requests are not
//! provider requests: they get no `Request-Id`, are not logged, and never consume a fault.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::clock::MAX_CLOCK_ADVANCE_MS;
use super::exchange::LimitedBody;
use super::faults::QueueError;
use super::state::{check_account, Reply, Shared, MAX_ACCOUNTS};
use super::wire::{Fault, LoggedRequest, Shape, StandObject, StandSettings};

/// `POST /admin/faults` → 201 `{"queued": times, "pending": uses left in the queue}`.
pub(super) async fn queue_fault(State(shared): State<Arc<Shared>>, body: LimitedBody) -> Reply {
    let fault: Fault = match parse(body) {
        Ok(fault) => fault,
        Err(reply) => return reply,
    };
    let times = fault.times;
    let kind = fault.kind.name();
    let mut state = shared.lock();
    match state.faults.push(fault) {
        Ok(()) => {
            tracing::info!(kind, times, "fault queued");
            Reply::json(
                StatusCode::CREATED,
                json!({"queued": times, "pending": state.faults.pending()}),
            )
        }
        Err(QueueError::Invalid(why)) => {
            Reply::error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_fault", why)
        }
        Err(full @ QueueError::Full) => Reply::error(
            StatusCode::INSUFFICIENT_STORAGE,
            "fault_queue_full",
            full.to_string(),
        ),
    }
}

/// `DELETE /admin/faults` → 200 `{"cleared": uses that were left}`.
pub(super) async fn clear_faults(State(shared): State<Arc<Shared>>) -> Reply {
    let cleared = shared.lock().faults.clear();
    Reply::json(StatusCode::OK, json!({ "cleared": cleared }))
}

#[derive(Debug, Deserialize)]
struct Advance {
    ms: u64,
}

/// `POST /admin/clock/advance` `{"ms": N}` → 200 `{"now_ms": ...}`.
pub(super) async fn advance_clock(State(shared): State<Arc<Shared>>, body: LimitedBody) -> Reply {
    let advance: Advance = match parse(body) {
        Ok(advance) => advance,
        Err(reply) => return reply,
    };
    if advance.ms > MAX_CLOCK_ADVANCE_MS {
        return Reply::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("ms must be at most {MAX_CLOCK_ADVANCE_MS}"),
        );
    }
    let now_ms = shared.lock().clock.advance(advance.ms);
    tracing::info!(advance_ms = advance.ms, now_ms, "stand clock advanced");
    Reply::json(StatusCode::OK, json!({ "now_ms": now_ms }))
}

#[derive(Debug, Deserialize)]
struct SettingsPatch {
    key_retention_s: Option<u64>,
    search_lag_ms: Option<u64>,
}

/// `PUT /admin/config` → 200 the settings now in force.
pub(super) async fn set_config(State(shared): State<Arc<Shared>>, body: LimitedBody) -> Reply {
    let patch: SettingsPatch = match parse(body) {
        Ok(patch) => patch,
        Err(reply) => return reply,
    };
    let mut state = shared.lock();
    if let Some(key_retention_s) = patch.key_retention_s {
        state.settings.key_retention_s = key_retention_s;
    }
    if let Some(search_lag_ms) = patch.search_lag_ms {
        state.settings.search_lag_ms = search_lag_ms;
    }
    tracing::info!(?state.settings, "stand settings changed");
    settings(state.settings)
}

/// `GET /admin/config` → 200 the settings in force.
pub(super) async fn get_config(State(shared): State<Arc<Shared>>) -> Reply {
    settings(shared.lock().settings)
}

fn settings(settings: StandSettings) -> Reply {
    Reply::serialized(&settings)
}

#[derive(Debug, Deserialize)]
struct Token {
    token: String,
}

/// `PUT /admin/accounts/{account}` `{"token": ...}` → 200 `{"account", "created"}`.
pub(super) async fn put_account(
    State(shared): State<Arc<Shared>>,
    account: Result<Path<String>, PathRejection>,
    body: LimitedBody,
) -> Reply {
    let Ok(Path(account)) = account else {
        return Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_path",
            "the account segment of the path is not valid UTF-8",
        );
    };
    let Token { token } = match parse(body) {
        Ok(token) => token,
        Err(reply) => return reply,
    };
    if let Err(why) = check_account(&account, &token) {
        return Reply::error(StatusCode::UNPROCESSABLE_ENTITY, "invalid_account", why);
    }
    let mut state = shared.lock();
    let created = !state.accounts.contains_key(&account);
    if created && state.accounts.len() >= MAX_ACCOUNTS {
        return Reply::error(
            StatusCode::INSUFFICIENT_STORAGE,
            "stand_full",
            format!("the stand knows {MAX_ACCOUNTS} accounts already"),
        );
    }
    state.accounts.insert(account.clone(), token);
    tracing::info!(account, created, "account token set");
    Reply::json(
        StatusCode::OK,
        json!({"account": account, "created": created}),
    )
}

#[derive(Debug, Deserialize)]
pub(super) struct ObjectsQuery {
    account: Option<String>,
    shape: Option<Shape>,
}

/// `GET /admin/objects?account=...&shape=...` → 200 `{"objects": [...]}`, in id order.
pub(super) async fn objects(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<ObjectsQuery>, QueryRejection>,
) -> Reply {
    let Ok(Query(query)) = query else {
        return Reply::error(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "account is a name; shape is keyed, labelled or plain",
        );
    };
    let state = shared.lock();
    let objects: Vec<StandObject> = state
        .crm
        .tasks
        .iter()
        .filter(|task| query.account.as_deref().is_none_or(|a| a == task.account))
        .filter(|task| query.shape.is_none_or(|s| s == task.shape))
        .map(|task| task.to_object())
        .collect();
    Reply::serialized(&Objects { objects })
}

#[derive(Serialize)]
struct Objects {
    objects: Vec<StandObject>,
}

#[derive(Serialize)]
struct Requests<'a> {
    requests: &'a VecDeque<LoggedRequest>,
    evicted: u64,
}

/// `GET /admin/requests` → 200 `{"requests": [...], "evicted": N}`, oldest first.
pub(super) async fn requests(State(shared): State<Arc<Shared>>) -> Reply {
    let state = shared.lock();
    Reply::serialized(&Requests {
        requests: &state.log.entries,
        evicted: state.log.evicted,
    })
}

/// `POST /admin/reset` → 200; forgets objects, keys, faults and the request log.
pub(super) async fn reset(State(shared): State<Arc<Shared>>) -> Reply {
    shared.lock().reset();
    tracing::info!("stand reset");
    Reply::json(StatusCode::OK, json!({ "reset": true }))
}

/// `GET /healthz` → 200.
pub(super) async fn healthz() -> Reply {
    Reply::json(StatusCode::OK, json!({ "status": "ok" }))
}

/// An admin body as `T`; a malformed one is 422 `invalid_body`.
fn parse<T: DeserializeOwned>(body: LimitedBody) -> Result<T, Reply> {
    let bytes = body.0?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Reply::error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            e.to_string(),
        )
    })
}
