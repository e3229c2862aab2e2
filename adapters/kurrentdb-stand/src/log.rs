//! The stand's storage: one in-memory transaction log with KurrentDB's append and read rules.
//!
//! It mirrors what the server documents and does, not what opledger would like: an append states
//! an expected revision and gets a wrong-expected-version answer carrying the current revision; a
//! retry whose event ids match what is stored from the expected revision on is idempotent (a
//! success that writes nothing); a retry that matches only in part is a wrong expected version;
//! event ids are *not* unique across streams or versions (the server only compares them at the
//! expected revision). Every event is its own self-committed record, so its `$all` position has
//! equal commit and prepare parts, as on a server written to through the gRPC API. Positions are
//! byte offsets: each record advances the log by its size.
//!
//! It must never lose or reorder a committed record: the log survives a stand restart.

use std::collections::HashMap;

use tokio::sync::watch;

/// Bytes a record occupies besides its names and payloads, so positions grow like a real log's.
const RECORD_OVERHEAD_BYTES: u64 = 96;
/// Where the first record starts. Never 0: the client reads a missing position as 0, so an event
/// at 0 could not be told apart from "no position".
pub const FIRST_RECORD_POSITION: u64 = 4_096;

/// One event as the log holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub stream: String,
    pub revision: u64,
    /// Both the commit and the prepare position (self-committed record).
    pub position: u64,
    pub id: uuid::Uuid,
    pub event_type: String,
    pub content_type: String,
    pub data: Vec<u8>,
    pub custom_metadata: Vec<u8>,
    /// .NET ticks since the Unix epoch, as the server reports `created`.
    pub created_ticks: u64,
}

/// What an append expects, as the protocol states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    Revision(u64),
    NoStream,
    Any,
    StreamExists,
}

/// An event an append proposes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proposed {
    pub id: uuid::Uuid,
    pub event_type: String,
    pub content_type: String,
    pub data: Vec<u8>,
    pub custom_metadata: Vec<u8>,
}

/// How an append ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendResult {
    /// Written now: the stream's last revision, the first record's position (the transaction
    /// position) and the last record's position.
    Written {
        last_revision: u64,
        first_position: u64,
        last_position: u64,
    },
    /// The same ids were already stored from the expected revision on; nothing was written.
    Idempotent { last_revision: u64 },
    /// The stream is elsewhere (`None`: it does not exist).
    WrongExpectedVersion { current: Option<u64> },
}

/// The log and the index of streams into it.
#[derive(Debug)]
pub struct Log {
    records: Vec<Record>,
    streams: HashMap<String, Vec<usize>>,
    next_position: u64,
    /// The number of records, published after every append so subscriptions wake.
    committed: watch::Sender<usize>,
}

impl Default for Log {
    fn default() -> Self {
        Self::new()
    }
}

impl Log {
    pub fn new() -> Self {
        Self {
            records: Vec::new(),
            streams: HashMap::new(),
            next_position: FIRST_RECORD_POSITION,
            committed: watch::channel(0).0,
        }
    }

    /// A receiver that changes whenever records are committed.
    pub fn watch(&self) -> watch::Receiver<usize> {
        self.committed.subscribe()
    }

    /// The last revision of `stream` (`None`: no such stream).
    pub fn last_revision(&self, stream: &str) -> Option<u64> {
        self.streams
            .get(stream)
            .and_then(|indices| indices.last())
            .map(|&index| self.records[index].revision)
    }

    /// Applies KurrentDB's commit check, then writes. `events` is never empty here; the gRPC
    /// layer answers an empty append itself.
    pub fn append(
        &mut self,
        stream: &str,
        expected: Expected,
        events: Vec<Proposed>,
    ) -> AppendResult {
        let current = self.last_revision(stream);
        let first_revision = match (expected, current) {
            (Expected::Any, current) => current.map_or(0, |last| last + 1),
            (Expected::StreamExists, Some(last)) => last + 1,
            (Expected::StreamExists, None) => {
                return AppendResult::WrongExpectedVersion { current }
            }
            (Expected::NoStream, None) => 0,
            (Expected::Revision(wanted), Some(last)) if wanted == last => last + 1,
            (Expected::NoStream, Some(_)) => return self.check_idempotent(stream, 0, &events),
            (Expected::Revision(wanted), Some(last)) if wanted < last => {
                return self.check_idempotent(stream, wanted + 1, &events)
            }
            (Expected::Revision(_), _) => return AppendResult::WrongExpectedVersion { current },
        };
        let created_ticks = now_ticks();
        let mut first_position = None;
        let mut last_position = self.next_position;
        for (offset, event) in events.into_iter().enumerate() {
            let position = self.next_position;
            self.next_position += RECORD_OVERHEAD_BYTES
                + (stream.len()
                    + event.event_type.len()
                    + event.data.len()
                    + event.custom_metadata.len()) as u64;
            first_position.get_or_insert(position);
            last_position = position;
            let record = Record {
                stream: stream.to_owned(),
                revision: first_revision + offset as u64,
                position,
                id: event.id,
                event_type: event.event_type,
                content_type: event.content_type,
                data: event.data,
                custom_metadata: event.custom_metadata,
                created_ticks,
            };
            self.streams
                .entry(stream.to_owned())
                .or_default()
                .push(self.records.len());
            self.records.push(record);
        }
        self.committed.send_replace(self.records.len());
        AppendResult::Written {
            last_revision: self.last_revision(stream).unwrap_or(first_revision),
            first_position: first_position.unwrap_or(last_position),
            last_position,
        }
    }

    /// The server's idempotency check for an append whose expected revision is behind the stream:
    /// all ids stored from `first` on, in order → idempotent; anything else → wrong version.
    fn check_idempotent(&self, stream: &str, first: u64, events: &[Proposed]) -> AppendResult {
        let stored = self.read_stream_forward(stream, first, events.len());
        let matches = stored.len() == events.len()
            && stored
                .iter()
                .zip(events)
                .all(|(record, event)| record.id == event.id);
        if matches {
            AppendResult::Idempotent {
                last_revision: first + events.len() as u64 - 1,
            }
        } else {
            AppendResult::WrongExpectedVersion {
                current: self.last_revision(stream),
            }
        }
    }

    /// Up to `count` records of `stream` from revision `from` on.
    pub fn read_stream_forward(&self, stream: &str, from: u64, count: usize) -> Vec<Record> {
        let Some(indices) = self.streams.get(stream) else {
            return Vec::new();
        };
        indices
            .iter()
            .map(|&index| &self.records[index])
            .filter(|record| record.revision >= from)
            .take(count)
            .cloned()
            .collect()
    }

    /// Up to `count` records of `stream` from revision `from` (`None`: the end) backwards.
    pub fn read_stream_backward(
        &self,
        stream: &str,
        from: Option<u64>,
        count: usize,
    ) -> Vec<Record> {
        let Some(indices) = self.streams.get(stream) else {
            return Vec::new();
        };
        indices
            .iter()
            .rev()
            .map(|&index| &self.records[index])
            .filter(|record| from.is_none_or(|from| record.revision <= from))
            .take(count)
            .cloned()
            .collect()
    }

    /// Whether `stream` exists.
    pub fn has_stream(&self, stream: &str) -> bool {
        self.streams.contains_key(stream)
    }

    /// The index of the first record at or after `position` (inclusive, as reads are).
    pub fn index_at_or_after(&self, position: u64) -> usize {
        self.records
            .partition_point(|record| record.position < position)
    }

    /// The index of the first record strictly after `position` (exclusive, as subscriptions are).
    pub fn index_after(&self, position: u64) -> usize {
        self.records
            .partition_point(|record| record.position <= position)
    }

    /// The record at `index`, if committed.
    pub fn record(&self, index: usize) -> Option<&Record> {
        self.records.get(index)
    }

    /// The number of committed records.
    pub fn len(&self) -> usize {
        self.records.len()
    }
}

/// The server reports `created` in .NET ticks (100 ns) since the Unix epoch.
fn now_ticks() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_nanos() / 100).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposed(n: u128) -> Proposed {
        Proposed {
            id: uuid::Uuid::from_u128(n),
            event_type: "T".into(),
            content_type: "application/json".into(),
            data: b"{}".to_vec(),
            custom_metadata: Vec::new(),
        }
    }

    #[test]
    fn a_retry_matching_the_stored_ids_is_idempotent_and_a_partial_match_is_a_wrong_version() {
        let mut log = Log::new();
        assert!(matches!(
            log.append("s", Expected::NoStream, vec![proposed(1), proposed(2)]),
            AppendResult::Written {
                last_revision: 1,
                ..
            }
        ));
        assert_eq!(
            log.append("s", Expected::NoStream, vec![proposed(1), proposed(2)]),
            AppendResult::Idempotent { last_revision: 1 }
        );
        assert_eq!(
            log.append(
                "s",
                Expected::NoStream,
                vec![proposed(1), proposed(2), proposed(3)]
            ),
            AppendResult::WrongExpectedVersion { current: Some(1) }
        );
        assert_eq!(
            log.append("s", Expected::Revision(5), vec![proposed(9)]),
            AppendResult::WrongExpectedVersion { current: Some(1) }
        );
        assert_eq!(log.len(), 2);
    }

    #[test]
    fn every_record_gets_a_larger_position_and_ids_may_repeat_across_streams() {
        let mut log = Log::new();
        log.append("a", Expected::NoStream, vec![proposed(1), proposed(2)]);
        // The server does not index event ids globally; only opledger's own rules would refuse.
        log.append("b", Expected::NoStream, vec![proposed(1)]);
        let positions: Vec<u64> = (0..log.len())
            .map(|index| log.record(index).expect("committed").position)
            .collect();
        assert!(
            positions.windows(2).all(|pair| pair[0] < pair[1]),
            "{positions:?}"
        );
        assert_eq!(positions[0], FIRST_RECORD_POSITION);
        assert_eq!(log.index_after(positions[0]), 1);
        assert_eq!(log.index_at_or_after(positions[1]), 1);
    }
}
