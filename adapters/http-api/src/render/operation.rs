//! One operation as the API and the CLI show it: a listed row as JSON, and a view read once from
//! its stream (state, events as stored, the readable timeline), so the two always agree.

use chrono::Utc;
use opledger_domain::app::{AppError, LoadedOperation};
use opledger_domain::codec;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::OperationId;
use opledger_domain::state::fold;
use opledger_domain::store::EventStore;
use opledger_projections::operations::OperationRow;
use serde_json::json;

use super::{timeline, RenderError};

/// One listed operation as JSON.
pub fn operation_json(row: &OperationRow, now: chrono::DateTime<Utc>) -> serde_json::Value {
    json!({
        "operation_id": row.operation_id,
        "tenant": row.tenant,
        "provider": row.provider,
        "account": row.account,
        "action": row.action,
        "source_id": row.source_id,
        "state": row.state,
        "attempts": row.attempts,
        "external_id": row.external_id,
        "last_error": row.last_error,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "age_s": (now - row.created_at).num_seconds().max(0),
        "needs_review_reason": row.needs_review_reason,
    })
}

/// One operation, read once: its state is folded from exactly the events shown, so the two
/// agree even while other writers append to the stream.
pub struct OperationView {
    /// The operation as folded from `history`.
    pub loaded: LoadedOperation,
    /// Its events, decoded.
    pub history: Vec<OperationEvent>,
    /// Its events as stored (version, position, type, data), for `--json`.
    pub events: Vec<serde_json::Value>,
    /// Its readable timeline, one line per event.
    pub lines: Vec<String>,
}

/// Reads an operation's stream once and builds everything `ops show`, `trace` and `review show`
/// print from it.
pub async fn view_of<S: EventStore>(
    store: &S,
    operation_id: OperationId,
) -> Result<OperationView, RenderError> {
    let recorded = timeline::recorded_history(store, operation_id).await?;
    let Some((last, _)) = recorded.last() else {
        return Err(AppError::NotFound { operation_id }.into());
    };
    let loaded_version = Some(last.version);
    let chain = codec::chain_of(&last.metadata);
    let history: Vec<OperationEvent> = recorded.iter().map(|(_, event)| event.clone()).collect();
    let mut events = Vec::with_capacity(recorded.len());
    for (stored, _) in &recorded {
        let data: serde_json::Value =
            serde_json::from_slice(&stored.data).map_err(|error| RenderError::NotJson {
                operation_id,
                version: stored.version,
                reason: error.to_string(),
            })?;
        events.push(json!({
            "version": stored.version,
            "position": stored.position,
            "type": stored.event_type,
            "data": data,
        }));
    }
    let lines = recorded
        .iter()
        .zip(timeline::lines(&history))
        .map(|((stored, _), line)| format!("@{:<7} v{:<3} {line}", stored.position, stored.version))
        .collect();
    let loaded = LoadedOperation {
        operation_id,
        state: fold(&history),
        version: loaded_version,
        chain,
    };
    Ok(OperationView {
        loaded,
        history,
        events,
        lines,
    })
}
