//! `opledger tail`: follow the global log live and print outcome events, each line starting with
//! the event's global position so a consumer resumes with `--from <last position>`.
//!
//! Why polling: the SQLite store's subscription (adapters/store/src/subscription.rs) waits on a
//! channel its own writer publishes after each commit, so it wakes only for commits made by the
//! same process. `tail` runs beside the process that writes, so it reads the log after the last
//! position it printed and, when nothing is new, waits [`POLL_EVERY`] before reading again. The
//! positions it prints are the log's, so it never repeats or skips an event across restarts.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use opledger_domain::error::ValidationError;
use opledger_domain::ids::GlobalPosition;
use opledger_domain::store::{EventStore, LogStart, RecordedEvent, MAX_READ_BATCH};

use crate::cli::{CliError, TailArgs};
use crate::intent::{close, open_for_reading};
use opledger_http_api::render::{outcome_json, outcome_of, timeline, wanted_types};

/// How long to wait before reading the log again when nothing new was there.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Most events read from the log at once.
const READ_BATCH: usize = 512;
const _: () = assert!(READ_BATCH <= MAX_READ_BATCH);

pub async fn run(args: TailArgs) -> Result<(), CliError> {
    let wanted = wanted_types("--type", &args.types)?;
    if args.limit == Some(0) {
        return Err(ValidationError::new(
            "--limit",
            "is 0; pass a positive number of events, or leave it out to follow until Ctrl-C",
        )
        .into());
    }
    let ledger = open_for_reading(&args.store.db).await?;
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
