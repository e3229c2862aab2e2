//! Helpers shared by the checks: event builders, whole-log reads and a failure guard for waits.

use std::future::Future;
use std::time::Duration;

use opledger_domain::ids::{EventId, StreamVersion};
use opledger_domain::store::{
    EventData, EventStore, LogStart, RecordedEvent, StreamName, MAX_READ_BATCH,
};
use uuid::Uuid;

/// A store the checks can clone into tasks.
pub trait TestStore: EventStore + Clone + 'static {}

impl<S: EventStore + Clone + 'static> TestStore for S {}

/// Fails a wait that takes longer than any healthy run on a slow machine needs. It guards
/// against hangs; no check relies on it for ordering.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT_LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT_LIMIT:?}: {what}"))
}

pub fn stream(name: &str) -> StreamName {
    StreamName::new(name).expect("valid stream name")
}

pub fn event_id(n: u128) -> EventId {
    EventId::from_uuid(Uuid::from_u128(n))
}

/// An event with id `n` and a small JSON payload naming it.
pub fn event(n: u128) -> EventData {
    EventData {
        event_id: event_id(n),
        event_type: "Tested".into(),
        data: format!("{{\"n\":{n}}}").into_bytes(),
        metadata: b"{\"schema\":1}".to_vec(),
    }
}

/// Events with ids `first..first + count`.
pub fn events(first: u128, count: usize) -> Vec<EventData> {
    (first..first + count as u128).map(event).collect()
}

pub fn ids(events: &[RecordedEvent]) -> Vec<EventId> {
    events.iter().map(|event| event.event_id).collect()
}

pub fn versions(events: &[RecordedEvent]) -> Vec<u64> {
    events.iter().map(|event| event.version.value()).collect()
}

/// The whole global log, read page by page.
pub async fn read_whole_log<S: EventStore>(store: &S) -> Vec<RecordedEvent> {
    let mut log = Vec::new();
    let mut start = LogStart::Beginning;
    loop {
        let page = store
            .read_all(start, MAX_READ_BATCH)
            .await
            .expect("read the log");
        let Some(last) = page.last() else { return log };
        start = LogStart::After(last.position);
        log.extend(page);
    }
}

/// The whole stream, read page by page.
pub async fn read_whole_stream<S: EventStore>(store: &S, name: &StreamName) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    let mut from = StreamVersion::FIRST;
    loop {
        let page = store
            .read_stream(name, from, MAX_READ_BATCH)
            .await
            .expect("read the stream");
        let Some(last) = page.last() else {
            return events;
        };
        from = last.version.next();
        events.extend(page);
    }
}

/// Asserts positions strictly increase along the log.
pub fn assert_strictly_increasing(log: &[RecordedEvent]) {
    for pair in log.windows(2) {
        assert!(
            pair[0].position < pair[1].position,
            "position {} is followed by {}",
            pair[0].position,
            pair[1].position
        );
    }
}
