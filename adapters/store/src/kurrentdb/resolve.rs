//! Turning the server's answer to an append into the port's outcome, and resolving an append
//! whose answer was lost by reading the stream back.
//!
//! The rule for a lost answer: the events at the versions our append would have taken decide.
//! Exactly our ids there → it was written (success). Other ids there → someone else won (a
//! version conflict with the stream's actual version). Nothing there and the stream still at the
//! expected version → it may yet be written (the request may still be in flight on the server):
//! "outcome unknown", which the caller answers by sending the same events again — safe, because
//! the server treats the same ids at the same expected revision as already written. Nothing here
//! ever appends with new ids, and a read-back that fails leaves the outcome unknown.

use kurrentdb::WriteResult;
use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::store::{
    AppendOutcome, EventData, ExpectedVersion, RecordedEvent, StoreError, StreamName,
};
use tracing::{info, warn};

use super::KurrentDbStore;

/// The outcome of an append the server confirmed. The answer's revision is checked against ours;
/// its position is used only when it names exactly one record (a single event whose commit and
/// prepare parts agree). Otherwise (several events: the answer names the transaction, not the
/// last event; or a retry the server found already written: no position) the last event is read
/// back for its position.
pub(super) async fn written(
    store: &KurrentDbStore,
    stream: &StreamName,
    expected: ExpectedVersion,
    events: &[EventData],
    answer: WriteResult,
) -> Result<AppendOutcome, StoreError> {
    let last = last_version(expected, events);
    if answer.next_expected_version != last.value() {
        warn!(
            answered = answer.next_expected_version,
            expected = last.value(),
            "the server confirmed another revision than the append's; reading the stream back"
        );
        return unclear(
            store,
            stream,
            expected,
            events,
            "the confirmed revision does not match the append",
        )
        .await;
    }
    let position = answer.position;
    if events.len() == 1 && position.commit == position.prepare && position.commit != 0 {
        return Ok(AppendOutcome {
            next_expected: last,
            position: GlobalPosition::new(position.commit),
        });
    }
    let stored = store
        .read_stream_events(stream, last, 1)
        .await
        .map_err(|error| StoreError::AppendOutcomeUnknown {
            stream: stream.clone(),
            reason: format!("the append was confirmed but its position could not be read: {error}"),
        })?;
    match stored.first() {
        Some(event) if event.event_id == events[events.len() - 1].event_id => Ok(AppendOutcome {
            next_expected: last,
            position: event.position,
        }),
        other => Err(StoreError::Corrupt {
            reason: format!(
                "the server confirmed `{stream}` up to version {last}, but that version holds {:?}",
                other.map(|event| event.event_id)
            ),
        }),
    }
}

/// Resolves an append whose answer was lost (see the module docs).
pub(super) async fn unclear(
    store: &KurrentDbStore,
    stream: &StreamName,
    expected: ExpectedVersion,
    events: &[EventData],
    reason: &str,
) -> Result<AppendOutcome, StoreError> {
    let unknown = |why: String| StoreError::AppendOutcomeUnknown {
        stream: stream.clone(),
        reason: why,
    };
    let first = expected.first_new_version();
    let stored = store
        .read_stream_events(stream, first, events.len())
        .await
        .map_err(|error| {
            unknown(format!(
                "{reason}; reading the stream back failed too: {error}"
            ))
        })?;
    match compare(&stored, events) {
        Comparison::Ours => {
            let last = &stored[stored.len() - 1];
            info!(version = %last.version, "a lost append answer resolved: the events are stored");
            return Ok(AppendOutcome {
                next_expected: last.version,
                position: last.position,
            });
        }
        Comparison::OursSoFar => {
            return Err(unknown(format!(
                "{reason}; only part of the append is visible yet"
            )));
        }
        Comparison::Others | Comparison::Nothing => {}
    }
    let actual = store.last_version(stream).await.map_err(|error| {
        unknown(format!(
            "{reason}; reading the stream's version failed too: {error}"
        ))
    })?;
    if matches!(compare(&stored, events), Comparison::Nothing)
        && ExpectedVersion::from_last(actual) == expected
    {
        return Err(unknown(format!(
            "{reason}; the stream is still at the expected version, so the append may yet land"
        )));
    }
    info!(
        ?actual,
        "a lost append answer resolved: another writer got there first"
    );
    Err(StoreError::VersionConflict {
        stream: stream.clone(),
        expected,
        actual,
    })
}

enum Comparison {
    /// Exactly our ids, in order.
    Ours,
    /// A prefix of our ids: the rest may still become visible.
    OursSoFar,
    /// Something else stands where our events would be.
    Others,
    /// Nothing stands there.
    Nothing,
}

fn compare(stored: &[RecordedEvent], events: &[EventData]) -> Comparison {
    if stored.is_empty() {
        return Comparison::Nothing;
    }
    let matching = stored
        .iter()
        .zip(events)
        .take_while(|(stored, ours)| stored.event_id == ours.event_id)
        .count();
    match (matching == stored.len(), stored.len() == events.len()) {
        (true, true) => Comparison::Ours,
        (true, false) => Comparison::OursSoFar,
        (false, _) => Comparison::Others,
    }
}

/// The version the last of `events` gets when appended at `expected`.
fn last_version(expected: ExpectedVersion, events: &[EventData]) -> StreamVersion {
    StreamVersion::new(expected.first_new_version().value() + events.len() as u64 - 1)
}
