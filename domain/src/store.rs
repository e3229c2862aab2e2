//! The event-store port: append-only streams with optimistic concurrency and one global log.
//!
//! The semantics mirror KurrentDB (EventStoreDB) so that the embedded SQLite store and a
//! KurrentDB cluster both fit it exactly:
//! - every append states what it expects the stream to be (no stream yet, or an exact version);
//!   there is deliberately no "any version", because an unconditional append is how two workers
//!   both believe they own an operation;
//! - re-appending events with the same ids at the same expected version is a success that writes
//!   nothing (an append retried after an unclear error is safe);
//! - the global log orders every event by a position that strictly increases in commit order,
//!   and a subscription delivers it catch-up-then-live with no gap and no repeat at the seam.
//!
//! Implementations must never return a success for an append that is not durable.

use std::future::Future;

use serde::{Deserialize, Serialize};

use crate::ids::{EventId, GlobalPosition, OperationId, StreamVersion};

/// Most events one append may carry; an operation's lifecycle step writes one to three.
pub const MAX_EVENTS_PER_APPEND: usize = 64;
/// Largest event payload (data plus metadata) a store accepts, in bytes.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;
/// Most events one read returns; callers page with the last version or position they saw.
pub const MAX_READ_BATCH: usize = 4096;
/// Longest stream name, in bytes.
pub const MAX_STREAM_NAME_BYTES: usize = 256;

/// The prefix of every operation stream; KurrentDB's category features key on it.
pub const OPERATION_STREAM_PREFIX: &str = "operation-";

/// The name of one stream, e.g. `operation-6f1c…`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamName(String);

impl StreamName {
    /// The stream that holds every event of one operation.
    pub fn for_operation(operation: OperationId) -> Self {
        Self(format!("{OPERATION_STREAM_PREFIX}{operation}"))
    }

    /// Wraps a stream name read from storage or given by a caller, refusing empty, oversized or
    /// control-character names.
    pub fn new(name: impl Into<String>) -> Result<Self, StoreError> {
        let name = name.into();
        Self::check(&name)?;
        Ok(Self(name))
    }

    /// Whether `name` is a valid stream name, checked without making one (a store handing out
    /// [`EventView`]s checks its names as [`StreamName::new`] would).
    pub fn check(name: &str) -> Result<(), StoreError> {
        if name.is_empty()
            || name.len() > MAX_STREAM_NAME_BYTES
            || name.chars().any(char::is_control)
        {
            return Err(StoreError::InvalidAppend {
                reason: format!(
                    "stream name `{}` must be 1 to {MAX_STREAM_NAME_BYTES} bytes without control characters",
                    name.escape_debug()
                ),
            });
        }
        Ok(())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The operation this stream belongs to, when it is an operation stream.
    pub fn operation_id(&self) -> Option<OperationId> {
        operation_of(&self.0)
    }
}

impl std::fmt::Display for StreamName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an append expects the stream to be before it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpectedVersion {
    /// The stream must not exist yet: this append creates it.
    NoStream,
    /// The stream's last event must have exactly this version.
    Exact(StreamVersion),
}

impl ExpectedVersion {
    /// The version the first event of this append will get.
    pub fn first_new_version(self) -> StreamVersion {
        match self {
            Self::NoStream => StreamVersion::FIRST,
            Self::Exact(version) => version.next(),
        }
    }

    /// The expectation that matches a stream whose last event is `last` (`None`: no stream).
    pub fn from_last(last: Option<StreamVersion>) -> Self {
        last.map_or(Self::NoStream, Self::Exact)
    }
}

/// An event to append: its deterministic id, type name and encoded payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventData {
    /// Deterministic id; the same logical event always gets the same id.
    pub event_id: EventId,
    /// The event's type name, e.g. `IntentRecorded`.
    pub event_type: String,
    /// The encoded event (JSON).
    pub data: Vec<u8>,
    /// Encoded metadata (JSON): schema version and, later, the tamper-evidence chain.
    pub metadata: Vec<u8>,
}

/// An event as stored: the appended data plus where it landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEvent {
    /// The stream it belongs to.
    pub stream: StreamName,
    /// Its version in that stream.
    pub version: StreamVersion,
    /// Its position in the global log.
    pub position: GlobalPosition,
    /// Its deterministic id.
    pub event_id: EventId,
    /// Its type name.
    pub event_type: String,
    /// The encoded event.
    pub data: Vec<u8>,
    /// The encoded metadata.
    pub metadata: Vec<u8>,
}

impl RecordedEvent {
    /// The event borrowed, as [`EventStore::read_all_with`] hands it to its visitor.
    pub fn view(&self) -> EventView<'_> {
        EventView {
            stream: self.stream.as_str(),
            version: self.version,
            position: self.position,
            event_id: self.event_id,
            event_type: &self.event_type,
            data: &self.data,
            metadata: &self.metadata,
        }
    }
}

/// A stored event borrowed from wherever the store holds it while it is read (an SQLite row):
/// what a reader that keeps only its own decoding of each event needs, without the copy of every
/// byte into a [`RecordedEvent`] first. The store has checked its values as for a
/// [`RecordedEvent`] (the stream name as [`StreamName::new`] does).
#[derive(Clone, Copy, Debug)]
pub struct EventView<'a> {
    /// The stream it belongs to.
    pub stream: &'a str,
    /// Its version in that stream.
    pub version: StreamVersion,
    /// Its position in the global log.
    pub position: GlobalPosition,
    /// Its deterministic id.
    pub event_id: EventId,
    /// Its type name.
    pub event_type: &'a str,
    /// The encoded event.
    pub data: &'a [u8],
    /// The encoded metadata.
    pub metadata: &'a [u8],
}

impl EventView<'_> {
    /// The operation whose stream the event belongs to, if it is an operation stream.
    pub fn operation_id(&self) -> Option<OperationId> {
        operation_of(self.stream)
    }
}

/// The operation a stream name belongs to, if it is an operation stream's.
fn operation_of(stream: &str) -> Option<OperationId> {
    stream.strip_prefix(OPERATION_STREAM_PREFIX)?.parse().ok()
}

/// Where a successful append left the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    /// The version of the last event now in the stream: the expected version of the next append.
    pub next_expected: StreamVersion,
    /// The global position of that last event.
    pub position: GlobalPosition,
}

/// Where a read or a subscription of the global log starts. Both are exclusive of the position
/// named, as KurrentDB's subscriptions are, so a consumer resumes with the last position it handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogStart {
    /// From the first event ever written.
    Beginning,
    /// From the first event after this position.
    After(GlobalPosition),
}

impl LogStart {
    /// Whether an event at `position` comes after this start.
    pub fn admits(self, position: GlobalPosition) -> bool {
        match self {
            Self::Beginning => true,
            Self::After(last) => position > last,
        }
    }
}

/// Infrastructure failures of a store, kept apart from the domain's refusals.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Another writer got there first: the stream is not at the expected version.
    #[error("stream `{stream}` is at {}, but the append expected {expected:?}; reload and decide again", display_last(*.actual))]
    VersionConflict {
        /// The stream appended to.
        stream: StreamName,
        /// What the append expected.
        expected: ExpectedVersion,
        /// The stream's actual last version (`None`: the stream does not exist).
        actual: Option<StreamVersion>,
    },
    /// The append itself is malformed (empty, too large, bad name, an event id used elsewhere).
    #[error("append refused: {reason}")]
    InvalidAppend {
        /// What is wrong, in a sentence.
        reason: String,
    },
    /// The store may or may not have written the append (a connection dropped after sending it);
    /// read the stream back and look for the event ids before doing anything else.
    #[error(
        "append to `{stream}` may or may not have been written ({reason}); read the stream back"
    )]
    AppendOutcomeUnknown {
        /// The stream appended to.
        stream: StreamName,
        /// What went wrong.
        reason: String,
    },
    /// The store cannot be reached or failed to do its work; nothing was confirmed.
    #[error("event store unavailable: {reason}")]
    Unavailable {
        /// What went wrong.
        reason: String,
    },
    /// The stored data is not what this version of opledger can read.
    #[error("event store file uses schema version {found}; this opledger supports up to {supported}. Upgrade opledger or use another file")]
    IncompatibleSchema {
        /// The schema version found.
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },
    /// Stored data failed a consistency check.
    #[error("event store data is corrupt: {reason}")]
    Corrupt {
        /// What is inconsistent.
        reason: String,
    },
    /// The store was shut down.
    #[error("event store is closed")]
    Closed,
}

fn display_last(actual: Option<StreamVersion>) -> String {
    actual.map_or_else(
        || "no stream".to_owned(),
        |version| format!("version {version}"),
    )
}

/// Append-only streams with optimistic concurrency, a global log and catch-up subscriptions.
pub trait EventStore: Send + Sync {
    /// A live feed of the global log.
    type Subscription: Subscription;

    /// Appends `events` to `stream` if it is at `expected`; returns where the stream now ends.
    ///
    /// A stream at another version gives [`StoreError::VersionConflict`] with the actual version,
    /// unless the events at the expected position carry exactly these event ids, in which case
    /// the append already happened and its outcome is returned without writing again.
    fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> impl Future<Output = Result<AppendOutcome, StoreError>> + Send;

    /// Reads up to `max_count` events of `stream` from version `from` on; a stream that does not
    /// exist reads as empty.
    fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send;

    /// Reads up to `max_count` events of the global log after `start`, in position order.
    fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> impl Future<Output = Result<Vec<RecordedEvent>, StoreError>> + Send;

    /// [`Self::read_all`], handing each event to `visit` borrowed and keeping what it returns,
    /// in `into` (cleared first; a reader passes back the buffer of a batch it is done with, so
    /// that batches reuse memory): for a reader that keeps only its own decoding of each event
    /// (a rebuild), so that a store which can lend its rows (SQLite) never copies them into
    /// [`RecordedEvent`]s first. `visit` may run on a blocking thread of the store's. This
    /// default reads the events and lends them.
    fn read_all_with<T, F>(
        &self,
        start: LogStart,
        max_count: usize,
        mut visit: F,
        mut into: Vec<T>,
    ) -> impl Future<Output = Result<Vec<T>, StoreError>> + Send
    where
        T: Send + 'static,
        F: FnMut(EventView<'_>) -> T + Send + 'static,
    {
        async move {
            let events = self.read_all(start, max_count).await?;
            into.clear();
            into.extend(events.iter().map(|event| visit(event.view())));
            Ok(into)
        }
    }

    /// The position of the newest event in the log (`None`: the log is empty).
    fn head_position(
        &self,
    ) -> impl Future<Output = Result<Option<GlobalPosition>, StoreError>> + Send;

    /// Follows the global log after `start`: first what is stored, then new events as they commit.
    fn subscribe_all(
        &self,
        start: LogStart,
    ) -> impl Future<Output = Result<Self::Subscription, StoreError>> + Send;
}

/// A catch-up subscription to the global log.
pub trait Subscription: Send {
    /// The next event of the log, waiting for one to be committed if the subscriber is caught up.
    /// Every event is delivered exactly once, in position order.
    fn next(&mut self) -> impl Future<Output = Result<RecordedEvent, StoreError>> + Send;
}

/// Checks the limits every store enforces on an append before touching storage, so all stores
/// refuse the same inputs with the same message.
pub fn check_append_limits(stream: &StreamName, events: &[EventData]) -> Result<(), StoreError> {
    if events.is_empty() {
        return Err(StoreError::InvalidAppend {
            reason: format!("append to `{stream}` carries no events"),
        });
    }
    if events.len() > MAX_EVENTS_PER_APPEND {
        return Err(StoreError::InvalidAppend {
            reason: format!(
                "append to `{stream}` carries {} events; the limit is {MAX_EVENTS_PER_APPEND}",
                events.len()
            ),
        });
    }
    for event in events {
        let size = event.data.len() + event.metadata.len();
        if size > MAX_EVENT_BYTES {
            return Err(StoreError::InvalidAppend {
                reason: format!(
                    "event {} of `{stream}` is {size} bytes; the limit is {MAX_EVENT_BYTES} bytes",
                    event.event_id
                ),
            });
        }
        if event.event_type.is_empty() || event.event_type.len() > MAX_STREAM_NAME_BYTES {
            return Err(StoreError::InvalidAppend {
                reason: format!(
                    "event {} of `{stream}` has an empty or oversized type name",
                    event.event_id
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn operation_streams_round_trip_their_operation_id() {
        let operation = OperationId::from_uuid(Uuid::from_u128(42));
        let stream = StreamName::for_operation(operation);
        assert!(stream.as_str().starts_with(OPERATION_STREAM_PREFIX));
        assert_eq!(stream.operation_id(), Some(operation));
        assert_eq!(StreamName::new("other-1").unwrap().operation_id(), None);
    }

    #[test]
    fn log_start_is_exclusive_of_the_named_position() {
        let start = LogStart::After(GlobalPosition::new(5));
        assert!(!start.admits(GlobalPosition::new(5)));
        assert!(start.admits(GlobalPosition::new(6)));
        assert!(LogStart::Beginning.admits(GlobalPosition::new(1)));
    }

    #[test]
    fn appends_without_events_or_over_the_limits_are_refused() {
        let stream = StreamName::new("s").unwrap();
        assert!(check_append_limits(&stream, &[]).is_err());
        let event = |bytes: usize| EventData {
            event_id: EventId::from_uuid(Uuid::from_u128(1)),
            event_type: "T".into(),
            data: vec![b' '; bytes],
            metadata: Vec::new(),
        };
        assert!(check_append_limits(&stream, &[event(10)]).is_ok());
        assert!(check_append_limits(&stream, &[event(MAX_EVENT_BYTES + 1)]).is_err());
        let many = vec![event(1); MAX_EVENTS_PER_APPEND + 1];
        assert!(check_append_limits(&stream, &many).is_err());
    }
}
