//! `verify`: walks the log and reports every event that was edited, removed or moved behind the
//! ledger's back, by stream and version.
//!
//! Pure: it is fed the log in position order and keeps, per stream, the last version and chain
//! hash it saw — for at most [`MAX_TRACKED_STREAMS`] streams, the most recently active ones, so
//! its memory is bounded whatever the ledger's size. An event of a stream it no longer tracks
//! (an operation decided long after it was recorded) needs that stream's earlier events: the
//! caller reads them ([`Verifier::needs_history`]) and hands them over ([`Verifier::seed`]), and
//! the event is judged exactly as if the stream had been tracked all along. For each event it checks:
//! the version follows the stream's previous one (a gap is a removed event, a step back a
//! moved one); the event id still binds this content to this version (ids are derived from
//! operation, version and content, so a moved event names the version it belongs to); the chain
//! hash links to the previous event; and, where the store numbers its log without gaps (SQLite),
//! that no position is missing. After a finding it re-synchronises on the stored chain hash, so
//! one edit is one finding, not a cascade.

use std::collections::HashMap;
use std::fmt;

use crate::chain;
use crate::chain::ChainHash;
use crate::codec;
use crate::ids::{GlobalPosition, OperationId, StreamVersion};
use crate::store::{RecordedEvent, StreamName};

/// How far around an event's version the verifier looks for the version its id belongs to.
pub const MOVED_SEARCH_WINDOW: u64 = 64;
/// Most streams whose last link the verifier keeps (under 100 bytes each with the map's own
/// overhead: a few MiB). Operations
/// are mostly recorded and settled within moments, so their events sit close together in the log
/// and a stream is rarely needed again after this many others were active; one that is costs one
/// read of its earlier events.
pub const MAX_TRACKED_STREAMS: usize = 65_536;
const _: () = assert!(MAX_TRACKED_STREAMS >= 2);

/// What kind of tampering a finding shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tampering {
    /// The content no longer matches its id or chain hash.
    Edited,
    /// Events are missing: a version gap in a stream, or a position gap in the log.
    Removed,
    /// The event sits at another version than the one it was written at.
    Reordered,
    /// The event carries no usable chain hash, so it cannot be verified.
    Unchained,
    /// Events the log's tree never recorded: added behind the ledger's back.
    Inserted,
    /// The log no longer extends a checkpoint kept outside it.
    Diverged,
}

impl Tampering {
    /// The kind's name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Edited => "edited",
            Self::Removed => "removed",
            Self::Reordered => "reordered",
            Self::Unchained => "unchained",
            Self::Inserted => "inserted",
            Self::Diverged => "diverged",
        }
    }
}

/// One problem found in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What kind.
    pub kind: Tampering,
    /// The stream concerned (`None` for a gap in the global log).
    pub stream: Option<StreamName>,
    /// The version concerned (for a removal: the first missing version).
    pub version: Option<StreamVersion>,
    /// The position of the event where it was noticed.
    pub position: GlobalPosition,
    /// What exactly, in a sentence.
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<9}", self.kind.name().to_uppercase())?;
        if let Some(stream) = &self.stream {
            write!(f, " {stream}")?;
        }
        if let Some(version) = self.version {
            write!(f, " v{version}")?;
        }
        write!(f, " @{}: {}", self.position, self.detail)
    }
}

/// What the verifier remembers of a stream: its last version, the stored chain hash of its last
/// event, and when it was last active (in events checked), for forgetting the least active.
#[derive(Clone, Copy, Debug)]
struct Link {
    version: StreamVersion,
    chain: Option<ChainHash>,
    active_at: u64,
    /// Whether the log's tree showed this last event rewritten: then the next event's broken
    /// link is that rewrite's doing, already reported, not the next event's.
    rewritten: bool,
}

/// What the log's own tree (see [`crate::merkle`]) recorded of an event when it was appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The event's bytes are the ones the tree recorded at its position.
    Matches,
    /// The event's bytes are not the ones the tree recorded at its position.
    Differs,
    /// The event is one the tree recorded at another position: it was moved.
    Moved {
        /// Where the tree recorded it.
        appended_at: GlobalPosition,
    },
    /// The tree does not cover this event (a store without one, or a file from before it).
    Unknown,
}

/// The detail of a broken chain link.
const BROKEN_LINK: &str = "its chain hash does not link to the previous event of its stream";

/// A tracked stream's key: an operation's stream by its id (16 bytes, no allocation: the
/// verifier forgets and meets streams millions of times on a long log, and a heap string per
/// entry left the allocator's memory growing with the log), any other stream by its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum StreamKey {
    Operation(OperationId),
    Named(StreamName),
}

impl StreamKey {
    fn of(stream: &StreamName) -> Self {
        stream
            .operation_id()
            .map_or_else(|| Self::Named(stream.clone()), Self::Operation)
    }
}

/// Checks a log fed to it in position order.
#[derive(Debug)]
pub struct Verifier {
    streams: HashMap<StreamKey, Link>,
    last_position: Option<GlobalPosition>,
    contiguous_positions: bool,
    events: u64,
    /// Streams whose first version was seen: the streams of an untampered log.
    streams_started: u64,
    /// Streams re-read because they were no longer tracked.
    seeded: u64,
    /// Most streams tracked at once ([`MAX_TRACKED_STREAMS`] unless a test says otherwise).
    max_tracked: usize,
}

impl Verifier {
    /// A verifier; `contiguous_positions` when the store numbers its log 1, 2, 3… without gaps
    /// (SQLite does; KurrentDB's positions are byte offsets and do not).
    pub fn new(contiguous_positions: bool) -> Self {
        Self::with_limit(contiguous_positions, MAX_TRACKED_STREAMS)
    }

    /// A verifier that tracks at most `max_tracked` streams (at least 2, at most
    /// [`MAX_TRACKED_STREAMS`]): a small limit makes a short log take the paths of a long one.
    pub fn with_limit(contiguous_positions: bool, max_tracked: usize) -> Self {
        Self {
            max_tracked: max_tracked.clamp(2, MAX_TRACKED_STREAMS),
            streams: HashMap::new(),
            last_position: None,
            contiguous_positions,
            events: 0,
            streams_started: 0,
            seeded: 0,
        }
    }

    /// Streams tracked now (never more than the limit).
    pub fn tracked_streams(&self) -> usize {
        self.streams.len()
    }

    /// Whether `event` belongs to a stream the verifier no longer tracks and is not its first:
    /// then the caller must [`Verifier::seed`] the stream's earlier events before checking it.
    pub fn needs_history(&self, event: &RecordedEvent) -> bool {
        event.version > StreamVersion::FIRST
            && !self.streams.contains_key(&StreamKey::of(&event.stream))
    }

    /// Remembers a stream from its stored events before `event` (those at earlier positions):
    /// the link it would have had, had it been tracked all along. Their own checks were made
    /// when the log passed them.
    pub fn seed(&mut self, event: &RecordedEvent, stored: &[RecordedEvent]) {
        let earlier = stored
            .iter()
            .filter(|earlier| earlier.stream == event.stream && earlier.position < event.position);
        let Some(last) = earlier.clone().max_by_key(|earlier| earlier.position) else {
            return;
        };
        let version = earlier
            .map(|earlier| earlier.version)
            .max()
            .expect("a stream with a last event has a highest version");
        self.seeded += 1;
        self.remember(&event.stream, version, codec::chain_of(&last.metadata));
    }

    /// Streams re-read because they were no longer tracked, so far.
    pub fn seeded_streams(&self) -> u64 {
        self.seeded
    }

    /// Keeps `stream`'s link, forgetting the least active half of the streams first when the map
    /// is full: those not active in the last `max_tracked / 2` events; at most that many remain,
    /// so the map never holds more than the limit.
    fn remember(&mut self, stream: &StreamName, version: StreamVersion, chain: Option<ChainHash>) {
        let key = StreamKey::of(stream);
        if self.streams.len() >= self.max_tracked && !self.streams.contains_key(&key) {
            let horizon = self.events.saturating_sub((self.max_tracked / 2) as u64);
            self.streams.retain(|_, link| link.active_at > horizon);
        }
        let link = Link {
            version,
            chain,
            active_at: self.events,
            rewritten: false,
        };
        self.streams.insert(key, link);
        debug_assert!(self.streams.len() <= self.max_tracked);
    }

    /// Events checked so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Streams seen so far (those whose first event was checked).
    pub fn streams(&self) -> u64 {
        self.streams_started
    }

    /// Checks the next event of the log, also against what the log's tree recorded of it: an
    /// event whose bytes differ from the recorded ones is reported as edited even when its link
    /// and id were recomputed to fit, and the next event of its stream, recorded as it is, is
    /// not blamed for the link that rewrite broke.
    pub fn check_recorded(&mut self, event: &RecordedEvent, recorded: Recorded) -> Vec<Finding> {
        let key = StreamKey::of(&event.stream);
        let previous_rewritten = self.streams.get(&key).is_some_and(|link| link.rewritten);
        let mut findings = self.check(event);
        match recorded {
            Recorded::Matches if previous_rewritten => findings.retain(|finding| {
                !(finding.kind == Tampering::Edited && finding.detail == BROKEN_LINK)
            }),
            Recorded::Differs if findings.is_empty() => findings.push(finding(
                event,
                Tampering::Edited,
                Some(event.version),
                "its bytes are not the ones the log's tree recorded when it was appended".into(),
            )),
            Recorded::Moved { appended_at } => {
                findings.retain(|finding| finding.kind != Tampering::Removed);
                findings.push(finding(
                    event,
                    Tampering::Reordered,
                    Some(event.version),
                    format!("the log's tree recorded this event at position {appended_at}"),
                ));
            }
            _ => {}
        }
        if let Some(link) = self.streams.get_mut(&key) {
            link.rewritten = matches!(recorded, Recorded::Differs | Recorded::Moved { .. });
        }
        findings
    }

    /// Checks the next event of the log.
    pub fn check(&mut self, event: &RecordedEvent) -> Vec<Finding> {
        self.events += 1;
        let mut findings = Vec::new();
        findings.extend(self.check_position(event));
        findings.extend(self.check_in_stream(event));
        // Re-synchronise on what is stored, so the next event is judged on its own.
        let version = self
            .streams
            .get(&StreamKey::of(&event.stream))
            .map_or(event.version, |link| link.version.max(event.version));
        if event.version == StreamVersion::FIRST {
            self.streams_started += 1;
        }
        self.remember(&event.stream, version, codec::chain_of(&event.metadata));
        findings
    }

    /// Whether the event's global position follows the last one: never backwards, and with
    /// no gap in a log whose positions are contiguous.
    fn check_position(&mut self, event: &RecordedEvent) -> Option<Finding> {
        let expected_position = self.last_position.map_or(1, |last| last.value() + 1);
        let finding = if self
            .last_position
            .is_some_and(|last| event.position <= last)
        {
            Some(finding(
                event,
                Tampering::Reordered,
                Some(event.version),
                "the log's positions go backwards here".into(),
            ))
        } else if self.contiguous_positions && event.position.value() > expected_position {
            Some(Finding {
                kind: Tampering::Removed,
                stream: None,
                version: None,
                position: event.position,
                detail: format!(
                    "positions {expected_position}..{} are missing from the log",
                    event.position.value() - 1
                ),
            })
        } else {
            None
        };
        self.last_position = Some(
            self.last_position
                .map_or(event.position, |last| last.max(event.position)),
        );
        finding
    }

    /// Whether the event belongs where its stream has it: its content matches its id at its
    /// version, no version is missing or repeated, and its chain hash links to the previous one.
    fn check_in_stream(&self, event: &RecordedEvent) -> Option<Finding> {
        let (expected_version, previous) = match self.streams.get(&StreamKey::of(&event.stream)) {
            Some(link) => (link.version.next(), link.chain),
            None => (StreamVersion::FIRST, None),
        };
        if !content_belongs_at(event, event.version) {
            return Some(moved_or_edited(event));
        }
        if event.version > expected_version {
            return Some(finding(
                event,
                Tampering::Removed,
                Some(expected_version),
                format!(
                    "versions {expected_version}..{} of the stream are missing",
                    event.version.value() - 1
                ),
            ));
        }
        if event.version < expected_version {
            return Some(finding(
                event,
                Tampering::Reordered,
                Some(event.version),
                format!(
                    "version {} comes after version {}",
                    event.version,
                    expected_version.value().saturating_sub(1)
                ),
            ));
        }
        check_chain(event, previous.as_ref())
    }
}

/// A finding about `event` in its stream.
fn finding(
    event: &RecordedEvent,
    kind: Tampering,
    version: Option<StreamVersion>,
    detail: String,
) -> Finding {
    Finding {
        kind,
        stream: Some(event.stream.clone()),
        version,
        position: event.position,
        detail,
    }
}

/// Whether the event's id was derived from its type and data at `version`.
fn content_belongs_at(event: &RecordedEvent, version: StreamVersion) -> bool {
    match event.stream.operation_id() {
        Some(operation) => {
            event
                .event_id
                .matches(operation, version, &event.event_type, &event.data)
        }
        // An erasure's stream is named by its key's id, which stands in for the operation's.
        None => match crate::personal::SubjectErased::stream_uuid(event.stream.as_str()) {
            Some(key) => event.event_id.matches(
                OperationId::from_uuid(key),
                version,
                &event.event_type,
                &event.data,
            ),
            // Streams that are not opledger's carry ids it did not derive; skip the check.
            None => true,
        },
    }
}

/// An event whose content does not belong at its version: either the content was changed, or
/// the whole event was moved to another version (found within [`MOVED_SEARCH_WINDOW`]).
fn moved_or_edited(event: &RecordedEvent) -> Finding {
    let low = event.version.value().saturating_sub(MOVED_SEARCH_WINDOW);
    let high = event.version.value().saturating_add(MOVED_SEARCH_WINDOW);
    match (low..=high)
        .map(StreamVersion::new)
        .find(|version| content_belongs_at(event, *version))
    {
        Some(original) => finding(
            event,
            Tampering::Reordered,
            Some(event.version),
            format!("this event was written as version {original}"),
        ),
        None => finding(
            event,
            Tampering::Edited,
            Some(event.version),
            "its type or data no longer match its event id".into(),
        ),
    }
}

/// Whether the event's chain hash links to the previous event of its stream.
fn check_chain(event: &RecordedEvent, previous: Option<&ChainHash>) -> Option<Finding> {
    let Some(stored) = codec::chain_of(&event.metadata) else {
        return Some(finding(
            event,
            Tampering::Unchained,
            Some(event.version),
            "no chain hash in its metadata".into(),
        ));
    };
    let computed = chain::link(previous, event.version, &event.event_type, &event.data);
    (computed != stored).then(|| {
        finding(
            event,
            Tampering::Edited,
            Some(event.version),
            BROKEN_LINK.into(),
        )
    })
}
