//! One operation as the API and the CLI show it: a listed row as JSON, and a view read once from
//! its stream (state, events as stored, the readable timeline), so the two always agree.

use chrono::{DateTime, Utc};
use opledger_domain::app::{AppError, LoadedOperation};
use opledger_domain::args::ArgsHash;
use opledger_domain::codec;
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{
    AccountId, ActionName, AttemptId, ExternalObjectId, GlobalPosition, IdempotencyKey,
    OperationId, OwnerId, ProviderId, SourceId, StreamVersion, TenantId,
};
use opledger_domain::sentence::described_sentence;
use opledger_domain::state::fold;
use opledger_domain::store::{EventStore, RecordedEvent};
use opledger_projections::operations::OperationRow;
use serde::Serialize;
use serde_json::{json, Value};

use super::{timeline, RenderError};

/// An operation as every endpoint of the API returns it and `ops show --json` prints it: one
/// object, rendered here, so the two cannot drift apart. Serialised straight from the state it
/// borrows: the hottest answer of the API (every record and execute) builds no JSON tree on the
/// way.
#[derive(Serialize)]
pub struct OperationBody<'a> {
    pub operation_id: OperationId,
    pub state: &'static str,
    pub message: String,
    pub external_id: Option<&'a ExternalObjectId>,
    pub attempts: u32,
    pub attempt_ids: &'a [AttemptId],
    pub tenant: Option<&'a TenantId>,
    pub provider: Option<&'a ProviderId>,
    pub account: Option<&'a AccountId>,
    pub action: Option<&'a ActionName>,
    pub args: Option<&'a serde_json::Map<String, Value>>,
    pub args_hash: Option<&'a ArgsHash>,
    pub idempotency_key: Option<&'a IdempotencyKey>,
    pub source_id: Option<&'a SourceId>,
    pub owner: Option<&'a OwnerId>,
    pub requires_approval: Option<bool>,
    pub last_error: Option<&'a str>,
    pub review_reason: Option<&'a str>,
    pub unknown_since: Option<DateTime<Utc>>,
    pub duplicates: &'a [ExternalObjectId],
    pub updated_at: Option<DateTime<Utc>>,
    pub version: Option<StreamVersion>,
    /// Recording: whether this call created the operation (else a redelivery found it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    /// Recording and executing: why executing failed after the intent was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execute_error: Option<Value>,
}

/// The operation as the API shows it; its sentence in the words of `description` (the action's
/// configured one; the action's name stands in without it).
pub fn operation_body<'a>(
    loaded: &'a LoadedOperation,
    description: Option<&str>,
) -> OperationBody<'a> {
    let state = &loaded.state;
    let intent = state.intent.as_ref();
    OperationBody {
        operation_id: loaded.operation_id,
        state: state.status.name(),
        message: described_sentence(state, description),
        external_id: state.external_id(),
        attempts: state.attempts,
        attempt_ids: &state.attempt_ids,
        tenant: intent.map(|i| &i.tenant),
        provider: intent.map(|i| &i.provider),
        account: intent.map(|i| &i.account),
        action: intent.map(|i| &i.action),
        args: intent.map(|i| i.args.as_map()),
        args_hash: intent.map(|i| &i.args_hash),
        idempotency_key: intent.map(|i| &i.idempotency_key),
        source_id: intent.and_then(|i| i.source_id.as_ref()),
        owner: intent.and_then(|i| i.owner.as_ref()),
        requires_approval: intent.map(|i| i.requires_approval),
        last_error: state.last_error.as_deref(),
        review_reason: state.review_reason.as_deref(),
        unknown_since: state.unknown_since,
        duplicates: &state.duplicates,
        updated_at: state.updated_at,
        version: loaded.version,
        created: None,
        execute_error: None,
    }
}

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
        // chrono's own words ("premature end of input") describe its parser, not the input:
        // the message says what was expected instead.
        DateTime::parse_from_rfc3339(text)
            .map(|time| Self::Time(time.with_timezone(&Utc)))
            .map_err(|_| {
                format!(
                    "{text:?} is neither a position nor an RFC 3339 time: write a whole number from 1 (e.g. 1200) or a time with its offset (e.g. 2026-12-01T14:02:00Z)"
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
            Self::Time(time) => opledger_domain::timestamp::at_or_before(event.at(), *time),
        }
    }
}

/// The log position `as_of` stands for, which every answer "as of" a moment names: the position
/// itself, or for a time the position of the last event recorded at or before it (to the
/// millisecond, see [`opledger_domain::timestamp::at_or_before`]; 0 when there was none), found
/// by bisecting the log. (A time's answer still holds every event recorded at or before it:
/// times follow the log's order only up to a writer's batching, so concurrent writers' events
/// may sit a few positions either side of the one named.) A position past the log's head, or a
/// time after `now`, is refused: the log cannot say yet what will be in it, and answering with
/// today's state would pass it off as the past's.
pub async fn resolve_as_of<S: EventStore>(
    store: &S,
    as_of: AsOf,
    now: DateTime<Utc>,
) -> Result<u64, RenderError> {
    let head = store
        .head_position()
        .await?
        .map_or(0, GlobalPosition::value);
    match as_of {
        AsOf::Position(position) if position.value() > head => {
            Err(opledger_domain::error::ValidationError::new(
                "as_of",
                format!(
                    "position {position} is past the log's newest position {head}; ask for a position from 1 to {head}, or leave as_of out for now"
                ),
            )
            .into())
        }
        AsOf::Position(position) => Ok(position.value()),
        AsOf::Time(time) if !opledger_domain::timestamp::at_or_before(time, now) => {
            Err(opledger_domain::error::ValidationError::new(
                "as_of",
                format!(
                    "{} is later than now ({}); the log cannot say yet what will be in it, so ask for a moment up to now, or leave as_of out",
                    time.to_rfc3339(),
                    now.to_rfc3339()
                ),
            )
            .into())
        }
        AsOf::Time(time) => last_position_at_or_before(store, time, head).await,
    }
}

/// The last position whose event was recorded at or before `time` (0: none), by bisecting
/// positions: a few dozen one-event reads however long the log. Events are appended in time order
/// by one writer, so their times grow with their positions (clock steps aside).
async fn last_position_at_or_before<S: EventStore>(
    store: &S,
    time: DateTime<Utc>,
    head: u64,
) -> Result<u64, RenderError> {
    // The first position whose event is after `time` (head + 1 when none is), less one.
    let (mut low, mut high) = (1u64, head.saturating_add(1));
    while low < high {
        let middle = low + (high - low) / 2;
        let start = opledger_domain::store::LogStart::After(GlobalPosition::new(middle - 1));
        let after = match store.read_all(start, 1).await?.first() {
            Some(event) => {
                let at = codec::decode(event).map_err(AppError::from)?.at();
                !opledger_domain::timestamp::at_or_before(at, time)
            }
            None => true,
        };
        if after {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Ok(low - 1)
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
        // A view is shown, never appended to.
        sealed_with: None,
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
