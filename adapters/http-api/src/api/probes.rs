//! The probes an orchestrator reads by status code alone: `/livez` (the process is alive and
//! worth keeping) and `/readyz` (it can serve now). `/healthz` stays, with its fuller body, for
//! people.
//!
//! `/readyz` answers 503 while the server drains (a shutdown signal came: requests are still
//! served, but traffic should go elsewhere before the listener closes), while the store cannot
//! be reached or its writer is stuck in a commit or its connections reach a copy of the ledger
//! it refuses (PostgreSQL), and while the read models are far behind the log or cannot follow
//! it. `/livez` answers 503 only when a restart is the remedy: a probe that restarts an instance
//! for a store that is down would restart every instance at once and cure nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use opledger_domain::store::EventStore;
use serde_json::json;

use super::super::error::json_reply;
use super::super::{ServeStore, Shared};

/// The longest `/readyz` waits for the store's answer, in ms: a probe must answer within its own
/// timeout (Kubernetes' default is 1 s), and a store slower than this cannot serve well anyway.
pub(crate) const STORE_PROBE_TIMEOUT_MS: u64 = 900;

/// `/livez`: 200 while the process serves and can recover on its own.
pub(crate) async fn live(State(shared): State<Arc<Shared>>) -> Response {
    let runner = shared.runner_health.report();
    if runner.needs_restart() {
        let reason = runner
            .problem(0)
            .unwrap_or_else(|| "the read-model runner has stopped".into());
        return json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "status": "restart", "reasons": [reason] }),
        );
    }
    json_reply(StatusCode::OK, &json!({ "status": "alive" }))
}

/// `/readyz`: 200 when the server can serve now, else 503 with every reason it cannot.
pub(crate) async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    let mut reasons = Vec::new();
    if shared.draining.load(Ordering::Relaxed) {
        reasons.push(
            "draining: the server is shutting down; requests are still served until the listener closes"
                .to_owned(),
        );
    }
    let store = shared.engine.ledger().store();
    if let Err(reason) = store_ready(store).await {
        reasons.push(format!("store: {reason}"));
    }
    // The lag reads the store's head too: bounded like the store's check.
    let limit = Duration::from_millis(STORE_PROBE_TIMEOUT_MS);
    match tokio::time::timeout(limit, shared.read_models.lag(store)).await {
        Err(_) => reasons.push(format!(
            "the log's head and the read models' checkpoint were not read within {STORE_PROBE_TIMEOUT_MS} ms"
        )),
        Ok(Err(error)) => reasons.push(format!("the read models cannot be read: {error}")),
        Ok(Ok(lag)) => {
            if let Some(problem) = shared.runner_health.report().problem(lag.positions) {
                reasons.push(problem);
            }
            if lag.positions > crate::READY_LAG_POSITIONS {
                reasons.push(format!(
                    "the read models are {} positions behind the log (ready within {})",
                    lag.positions,
                    crate::READY_LAG_POSITIONS
                ));
            }
        }
    }
    if reasons.is_empty() {
        json_reply(StatusCode::OK, &json!({ "status": "ready" }))
    } else {
        json_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({ "status": "not_ready", "reasons": reasons }),
        )
    }
}

/// Whether the store can serve: PostgreSQL's own check (reachable, writer not stuck, ledger
/// identity accepted); for the others a read of the log's head within the probe's time.
async fn store_ready(store: &ServeStore) -> Result<(), String> {
    let check = async {
        match store {
            ServeStore::Postgres(store) => store.readiness().await,
            other => other
                .head_position()
                .await
                .map(drop)
                .map_err(|error| error.to_string()),
        }
    };
    let limit = Duration::from_millis(STORE_PROBE_TIMEOUT_MS);
    tokio::time::timeout(limit, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {STORE_PROBE_TIMEOUT_MS} ms")))
}
