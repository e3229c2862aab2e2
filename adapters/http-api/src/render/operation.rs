//! One operation as the API and the CLI show it: a listed row as JSON, and a view read once from
//! its stream (state, events as stored, the readable timeline), so the two always agree.

use chrono::{DateTime, Utc};
use opledger_domain::app::{AppError, LoadedOperation};
use opledger_domain::codec;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{GlobalPosition, OperationId};
use opledger_domain::state::fold;
use opledger_domain::store::{EventStore, RecordedEvent};
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
    view_from(operation_id, recorded)
}

/// A moment of the log, for an answer "as of" it: once the event at a global position was
/// committed, or at a time (the events recorded at or before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsOf {
    /// Up to and including the event at this position.
    Position(GlobalPosition),
    /// Up to and including the events recorded at or before this moment.
    Time(DateTime<Utc>),
}

impl AsOf {
    /// Reads `1200` (a global position, from 1) or an RFC 3339 time (`2026-12-01T14:02:00Z`);
    /// the error says what was expected.
    pub fn parse(text: &str) -> Result<Self, String> {
        if !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit()) {
            return match text.parse::<u64>() {
                Ok(0) | Err(_) => Err(format!(
                    "{text} is not a position: positions start at 1 and fit in 64 bits"
                )),
                Ok(position) => Ok(Self::Position(GlobalPosition::new(position))),
            };
        }
        DateTime::parse_from_rfc3339(text)
            .map(|time| Self::Time(time.with_timezone(&Utc)))
            .map_err(|error| {
                format!(
                    "{text:?} is neither a position nor an RFC 3339 time ({error}); write e.g. 1200 or 2026-12-01T14:02:00Z"
                )
            })
    }

    /// The same moment as the read models' past listings take it.
    pub fn moment(self) -> opledger_readmodel::Moment {
        match self {
            Self::Position(position) => opledger_readmodel::Moment::Position(position),
            Self::Time(time) => opledger_readmodel::Moment::Time(time),
        }
    }

    /// Whether the event was in the ledger at this moment.
    fn includes(&self, recorded: &RecordedEvent, event: &OperationEvent) -> bool {
        match self {
            Self::Position(position) => recorded.position <= *position,
            Self::Time(time) => event.at() <= *time,
        }
    }
}

/// An operation as it stood at `as_of`: folded from the events of its stream up to that moment
/// only, so the state, the sentence and the timeline are the ones the ledger showed then. An
/// operation not yet recorded then is not found.
pub async fn view_as_of<S: EventStore>(
    store: &S,
    operation_id: OperationId,
    as_of: AsOf,
) -> Result<OperationView, RenderError> {
    let mut recorded = timeline::recorded_history(store, operation_id).await?;
    // A stream's events are appended in order, each later than the one before: the moment cuts
    // the stream in two.
    let kept = recorded
        .iter()
        .take_while(|(stored, event)| as_of.includes(stored, event))
        .count();
    recorded.truncate(kept);
    view_from(operation_id, recorded)
}

fn view_from(
    operation_id: OperationId,
    recorded: Vec<(RecordedEvent, OperationEvent)>,
) -> Result<OperationView, RenderError> {
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
        let mut event = json!({
            "version": stored.version,
            "position": stored.position,
            "type": stored.event_type,
            "data": data,
        });
        if let Some(trace_id) = trace_id_of(stored) {
            event["trace_id"] = trace_id.into();
        }
        events.push(event);
    }
    // The trace id beside each line written under one, so an attempt is found in the tracing
    // tool it was exported to.
    let lines = recorded
        .iter()
        .zip(timeline::lines(&history))
        .map(|((stored, _), line)| {
            let trace = trace_id_of(stored)
                .map(|trace_id| format!("  trace={trace_id}"))
                .unwrap_or_default();
            format!(
                "@{:<7} v{:<3} {line}{trace}",
                stored.position, stored.version
            )
        })
        .collect();
    let loaded = LoadedOperation {
        operation_id,
        state: fold(&history),
        version: loaded_version,
        chain,
        origin_traceparent: None,
    };
    Ok(OperationView {
        loaded,
        history,
        events,
        lines,
    })
}

/// The trace id kept in a stored event's metadata, if it was written under a trace.
fn trace_id_of(stored: &RecordedEvent) -> Option<String> {
    let traceparent = codec::traceparent_of(&stored.metadata)?;
    opledger_domain::trace_context::trace_id_of(&traceparent).map(str::to_owned)
}
