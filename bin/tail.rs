//! `opledger tail`: follow the global log live and print outcome events, each line starting with
//! the event's global position so a consumer resumes with `--from <last position>`.
//!
//! Why polling: the SQLite store's subscription (adapters/src/store/subscription.rs) waits on a
//! channel its own writer publishes after each commit, so it wakes only for commits made by the
//! same process. `tail` runs beside the process that writes, so it reads the log after the last
//! position it printed and, when nothing is new, waits [`POLL_EVERY`] before reading again. The
//! positions it prints are the log's, so it never repeats or skips an event across restarts.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use opledger_domain::codec;
use opledger_domain::error::ValidationError;
use opledger_domain::event::{LateResponse, OperationEvent, ReconciliationResult, ReviewDecision};
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::state::{evolve, OperationState, Status};
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, MAX_READ_BATCH};
use serde_json::json;

use crate::cli::{CliError, TailArgs};
use crate::intent::{close, open_existing_ledger};
use crate::timeline;

/// How long to wait before reading the log again when nothing new was there.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Most events read from the log at once.
const READ_BATCH: usize = 512;
const _: () = assert!(READ_BATCH <= MAX_READ_BATCH);

/// Every friendly type `--type` accepts; see `opledger tail --help` for the events behind each.
pub const TYPES: [&str; 14] = [
    "succeeded",
    "unknown",
    "rejected",
    "needs_review",
    "duplicate",
    "denied",
    "abandoned",
    "recorded",
    "approved",
    "started",
    "not_sent",
    "lookup",
    "retry",
    "late",
];
/// The outcomes printed when `--type` is not given.
pub const DEFAULT_TYPES: [&str; 7] = [
    "succeeded",
    "unknown",
    "rejected",
    "needs_review",
    "duplicate",
    "denied",
    "abandoned",
];

pub async fn run(args: TailArgs) -> Result<(), CliError> {
    let wanted = wanted_types("--type", &args.types)?;
    if args.limit == Some(0) {
        return Err(ValidationError::new(
            "--limit",
            "is 0; pass a positive number of events, or leave it out to follow until Ctrl-C",
        )
        .into());
    }
    let ledger = open_existing_ledger(&args.store.db).await?;
    let start = args.from.map_or(LogStart::Beginning, |from| {
        LogStart::After(GlobalPosition::new(from))
    });
    let mut last = start;
    let result = tokio::select! {
        result = follow(ledger.store(), &wanted, &args, &mut last) => result,
        _ = tokio::signal::ctrl_c() => Err(CliError::Interrupted),
    };
    let closed = close(&ledger).await;
    if matches!(result, Err(CliError::Interrupted)) {
        if let LogStart::After(position) = last {
            eprintln!("stopped; resume with --from {position}");
        }
    }
    result?;
    closed
}

/// The friendly types named in `given` (the defaults when empty); `field` names the input in errors.
pub fn wanted_types(
    field: &str,
    given: &[String],
) -> Result<BTreeSet<&'static str>, ValidationError> {
    if given.is_empty() {
        return Ok(DEFAULT_TYPES.into_iter().collect());
    }
    let mut wanted = BTreeSet::new();
    for name in given.iter().map(|name| name.trim()) {
        if name == "all" {
            wanted.extend(TYPES);
            continue;
        }
        let known = TYPES.iter().find(|known| **known == name).ok_or_else(|| {
            ValidationError::new(
                field,
                format!(
                    "`{name}` is not an event type; use `all` or some of {}",
                    TYPES.join(", ")
                ),
            )
        })?;
        wanted.insert(*known);
    }
    Ok(wanted)
}

/// Prints matching events after `last` until the limit is reached; `last` is the position of the
/// last event looked at, so an interruption can say where to resume.
async fn follow<S: EventStore>(
    store: &S,
    wanted: &BTreeSet<&'static str>,
    args: &TailArgs,
    last: &mut LogStart,
) -> Result<(), CliError> {
    let mut printed: u64 = 0;
    loop {
        let batch = store.read_all(*last, READ_BATCH).await?;
        if batch.is_empty() {
            tokio::time::sleep(POLL_EVERY).await;
            continue;
        }
        for recorded in batch {
            let position = recorded.position;
            if let Some(line) = render(store, &recorded, wanted, args.json).await? {
                let mut stdout = std::io::stdout().lock();
                // A closed pipe (`opledger tail | head`) is the reader's way of saying "enough".
                if writeln!(stdout, "{line}")
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return Ok(());
                }
                printed += 1;
            }
            *last = LogStart::After(position);
            if args.limit.is_some_and(|limit| printed >= limit) {
                return Ok(());
            }
        }
    }
}

/// An event of the log as an outcome: its operation, friendly type and decoded event.
pub struct Outcome {
    /// The operation it belongs to.
    pub operation_id: OperationId,
    /// Its friendly type (one of [`TYPES`]).
    pub kind: &'static str,
    /// The event.
    pub event: OperationEvent,
}

/// The line for one event, if its friendly type is wanted.
async fn render<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
    wanted: &BTreeSet<&'static str>,
    json: bool,
) -> Result<Option<String>, CliError> {
    let Some(outcome) = outcome_of(store, recorded).await? else {
        return Ok(None);
    };
    if !wanted.contains(outcome.kind) {
        return Ok(None);
    }
    let line = if json {
        outcome_json(recorded, &outcome).to_string()
    } else {
        format!(
            "{:<8} {}  {}  {:<12} {:<22} {}",
            recorded.position,
            outcome.event.at().format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            outcome.operation_id,
            outcome.kind,
            recorded.event_type,
            timeline::describe(&outcome.event)
        )
    };
    Ok(Some(line))
}

/// One outcome as JSON, as `tail --json` prints it and the server streams it.
pub fn outcome_json(recorded: &RecordedEvent, outcome: &Outcome) -> serde_json::Value {
    json!({
        "position": recorded.position,
        "type": outcome.kind,
        "event_type": recorded.event_type,
        "operation_id": outcome.operation_id,
        "version": recorded.version,
        "at": outcome.event.at(),
        "detail": timeline::describe(&outcome.event),
    })
}

/// Classifies one event of the log; `None` for events outside operation streams.
pub async fn outcome_of<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
) -> Result<Option<Outcome>, CliError> {
    // Only operation streams carry operation events.
    let Some(operation_id) = recorded.stream.operation_id() else {
        return Ok(None);
    };
    let event = codec::decode(recorded).map_err(opledger_domain::app::AppError::from)?;
    let kind = match friendly_type(&event) {
        Some(kind) => kind,
        // Whether a late success or a found object settles the operation depends on the state
        // before it: on an operation already confirmed it is a late answer or a lookup (its
        // duplicate, if any, follows as its own event), never a second success.
        None => {
            let before = state_before(store, recorded).await?;
            match (&event, &before.status) {
                (_, Status::Succeeded { .. })
                    if matches!(event, OperationEvent::ReconciliationRecorded(_)) =>
                {
                    "lookup"
                }
                (_, Status::Succeeded { .. }) => "late",
                _ => "succeeded",
            }
        }
    };
    Ok(Some(Outcome {
        operation_id,
        kind,
        event,
    }))
}

/// The friendly type of an event; `None` for a late success or a found object, which need the
/// state before them.
fn friendly_type(event: &OperationEvent) -> Option<&'static str> {
    Some(match event {
        OperationEvent::IntentRecorded(_) => "recorded",
        OperationEvent::ApprovalGranted(_) => "approved",
        OperationEvent::ApprovalDenied(_) => "denied",
        OperationEvent::AttemptStarted(_) => "started",
        OperationEvent::AttemptSucceeded(_) => "succeeded",
        OperationEvent::AttemptRejected(_) => "rejected",
        OperationEvent::OutcomeUnknown(_) | OperationEvent::LeaseExpired(_) => "unknown",
        OperationEvent::AttemptNotSent(_) => "not_sent",
        OperationEvent::ReconciliationRecorded(e) => match e.result {
            ReconciliationResult::Found { .. } => return None,
            _ => "lookup",
        },
        OperationEvent::RetryScheduled(_) => "retry",
        OperationEvent::ReviewRequired(_) => "needs_review",
        OperationEvent::ReviewResolved(e) => match e.decision {
            ReviewDecision::Retry => "retry",
            ReviewDecision::ConfirmSucceeded { .. } => "succeeded",
            ReviewDecision::Abandon => "abandoned",
        },
        OperationEvent::LateResponseReceived(e) => match e.response {
            LateResponse::Succeeded { .. } => return None,
            LateResponse::Rejected { .. } => "late",
        },
        OperationEvent::DuplicateDetected(_) => "duplicate",
    })
}

/// The operation's state just before `recorded`, folded from its stream.
async fn state_before<S: EventStore>(
    store: &S,
    recorded: &RecordedEvent,
) -> Result<OperationState, CliError> {
    let mut state = OperationState::initial();
    let mut from = StreamVersion::FIRST;
    while from < recorded.version {
        let wanted = usize::try_from(recorded.version.value() - from.value())
            .unwrap_or(MAX_READ_BATCH)
            .min(MAX_READ_BATCH);
        let batch = store.read_stream(&recorded.stream, from, wanted).await?;
        let Some(last) = batch.last() else { break };
        from = last.version.next();
        for event in batch
            .iter()
            .filter(|event| event.version < recorded.version)
        {
            let decoded = codec::decode(event).map_err(opledger_domain::app::AppError::from)?;
            state = evolve(state, &decoded);
        }
    }
    Ok(state)
}
