//! The fold in memory: the open operations' states, each operation's row built and written once
//! when it falls out of the bounded cache (or at the end), and the id-index entries buffered
//! and handed to the writer in key order.

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use opledger_domain::event::{IntentRecorded, OperationEvent};
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::state::OperationState;
use opledger_domain::store::StoreError;
use opledger_projections::duplicates::{self, SimilarIntent};
use opledger_projections::id_index::IdIndexChange;
use opledger_projections::metrics::Counter;
use opledger_projections::read_models::fold_in_place;
use tokio::sync::mpsc;

use crate::apply::QueryBounds;
use crate::{apply, ReadModelError};

use super::window::{IntentWindow, RequestDigest, WindowAnswer};
use super::writer::{Message, Write, WriteQueue};
use super::{Decoded, FastMap, Feed, RebuildLimits, RebuildReport};

/// An open operation: its folded state, not yet written, and what its row is built from.
pub(super) struct OpenOperation {
    pub(super) state: OperationState,
    /// The version of the last event folded (`None`: none yet).
    pub(super) version: Option<StreamVersion>,
    /// The position of the last event folded.
    pub(super) position: GlobalPosition,
    /// When the last event folded happened.
    pub(super) at: DateTime<Utc>,
    /// Whether the file has a row for it already (it was written once and read back).
    pub(super) in_file: bool,
    /// Whether `state` is newer than the file.
    pub(super) dirty: bool,
    /// What the gauges count of the file's row (`None`: no row yet).
    pub(super) before: Option<apply::Counted>,
    /// The event count when it was last touched; the least recent are written out first.
    pub(super) last_used: u64,
    /// Its row's `request_hash`, from the digest the window was asked with, when this rebuild
    /// folded its intent (`None`: read back from the file, whose row has it), so that the
    /// request's SHA-256 is made once per operation, not again for the row.
    pub(super) request_hash: Option<i64>,
}

/// The fold of a whole log into a fresh file: the open operations, the intent window and the
/// summed counters. It builds the rows and hands them to the writer ([`Writer`]), which owns
/// the file.
pub(super) struct Rebuilder {
    pub(super) writes: WriteQueue,
    pub(super) open: FastMap<OperationId, OpenOperation>,
    pub(super) window: IntentWindow,
    pub(super) counters: BTreeMap<Counter, u64>,
    /// The changes of the row gauges as rows are written, summed: the file starts empty, so at
    /// the end they are those gauges (`shared_external_ids` is counted from the finished table, `Writer::finish`).
    pub(super) gauges: apply::GaugeChanges,
    pub(super) report: RebuildReport,
    /// Events seen, for the cache's recency and the commit rhythm.
    pub(super) clock: u64,
    /// Whether the secondary indexes exist yet.
    pub(super) indexed: bool,
    /// Id-index entries not yet written (at most [`RebuildLimits::max_buffered_id_entries`]).
    pub(super) id_index: Vec<IdIndexChange>,
    /// The operations being written out by [`Self::write_least_recent`], kept between calls so
    /// that its room (half of [`RebuildLimits::max_open_operations`]) is allocated once, not
    /// faulted in afresh at every eviction.
    pub(super) evicted: Vec<(OperationId, OpenOperation)>,
    /// The last flush of id-index entries, sorted, while it is handed to the writer.
    pub(super) draining: Option<Draining>,
    /// Whether the id-index tables have rows yet: until they do, a flush is appended.
    pub(super) id_index_written: bool,
    pub(super) limits: RebuildLimits,
}

/// Where an id-index entry goes: its table, then its primary key as SQLite orders it (text by
/// its bytes, which is also how `str` and a UUID's hyphenated lowercase text compare).
pub(super) fn id_entry_key(
    entry: &IdIndexChange,
) -> (u8, Option<uuid::Uuid>, &str, &str, &str, OperationId) {
    match entry {
        IdIndexChange::Attempt {
            attempt_id,
            operation_id,
            ..
        } => (0, Some(attempt_id.as_uuid()), "", "", "", *operation_id),
        IdIndexChange::Source {
            tenant,
            source_id,
            operation_id,
            ..
        } => (
            1,
            None,
            tenant.as_str(),
            source_id.as_str(),
            "",
            *operation_id,
        ),
        IdIndexChange::ExternalId {
            provider,
            account,
            external_id,
            operation_id,
            ..
        } => (
            2,
            None,
            provider.as_str(),
            account.as_str(),
            external_id.as_str(),
            *operation_id,
        ),
    }
}

/// The object an id-index entry names: its key without the operation (see [`id_entry_key`]).
pub(super) fn id_entry_object(entry: &IdIndexChange) -> (u8, Option<uuid::Uuid>, &str, &str, &str) {
    let (table, uuid, first, second, third, _) = id_entry_key(entry);
    (table, uuid, first, second, third)
}

/// Sorted id-index entries being handed to the writer a range at a time
/// ([`Rebuilder::drip_id_index`]).
pub(super) struct Draining {
    pub(super) entries: Arc<Vec<IdIndexChange>>,
    /// How many of them the writer has been handed.
    pub(super) sent: usize,
    /// Whether they go into tables that had no rows before them (appended, not upserted).
    pub(super) append: bool,
}

/// Id-index entries of a flush handed to the writer per range while the fold goes on, one range
/// every quarter as many events: 4 entries per event, more than an event adds (at most ~2), so
/// a flush is mostly handed over before the next one fills (what is left then goes at once).
/// Each range costs the writer its statements' lookups, so not much fewer.
pub const ID_ENTRIES_PER_DRIP: usize = 512;

/// Where an id-index entry was recorded.
pub(super) fn id_entry_position(entry: &IdIndexChange) -> GlobalPosition {
    match entry {
        IdIndexChange::Attempt { position, .. }
        | IdIndexChange::Source { position, .. }
        | IdIndexChange::ExternalId { position, .. } => *position,
    }
}

impl Rebuilder {
    pub(super) fn new(writes: WriteQueue, limits: RebuildLimits) -> Self {
        let id_index = writes.spare_id_entries(limits.max_buffered_id_entries);
        Self {
            writes,
            // Room for twice the most it holds, allocated once: the map is filled to the limit
            // and halved over and over, and one grown by reallocating moved every state (several
            // hundred bytes each) into fresh pages each time, 3 % of a rebuild's CPU in page
            // faults and copies. At this size a refill reuses the table in place.
            open: FastMap::with_capacity_and_hasher(
                2 * (limits.max_open_operations + 1),
                foldhash::fast::RandomState::default(),
            ),
            window: IntentWindow::new(limits.max_window_intents),
            counters: BTreeMap::new(),
            gauges: apply::GaugeChanges::default(),
            report: RebuildReport::default(),
            clock: 0,
            indexed: false,
            id_index,
            draining: None,
            evicted: Vec::new(),
            id_index_written: false,
            limits,
        }
    }

    /// Folds what the reader hands over, to the end of the feed.
    pub(super) fn fold_all(
        &mut self,
        mut receiver: mpsc::Receiver<Result<Feed, StoreError>>,
        spent: &SyncSender<Vec<Decoded>>,
    ) -> Result<(), ReadModelError> {
        loop {
            let waiting = std::time::Instant::now();
            let Some(feed) = receiver.blocking_recv() else {
                break;
            };
            self.report.waits.fold_for_log += waiting.elapsed();
            match feed? {
                Feed::Batch(mut batch) => {
                    for decoded in batch.drain(..) {
                        self.fold(decoded)?;
                    }
                    // Back to the reader to fill again; dropped when the way back is full.
                    let _ = spent.try_send(batch);
                }
                Feed::Complete => return Ok(()),
            }
        }
        Err(ReadModelError::Worker {
            reason: "the rebuild was stopped before it read the whole log".to_string(),
        })
    }

    pub(super) fn fold(&mut self, decoded: Decoded) -> Result<(), ReadModelError> {
        let Decoded {
            position,
            version,
            event,
        } = decoded;
        if let Some(last) = self.report.checkpoint.filter(|last| position <= *last) {
            return Err(ReadModelError::OutOfOrder {
                last,
                found: position,
            });
        }
        self.report.checkpoint = Some(position);
        let Some((operation_id, event)) = event else {
            self.report.other_streams += 1;
            return Ok(());
        };
        self.clock += 1;
        let event = event.map_err(|source| ReadModelError::Decode { position, source })?;
        // The request's digest, made once per intent: the window is asked with it and then
        // given it, and the row's request hash is cut from it. The names are copied into a
        // query only when the file is asked.
        let (key, similar) = match &event {
            OperationEvent::IntentRecorded(intent) => {
                let key = RequestDigest::of_intent(intent);
                (
                    Some(key),
                    self.find_similar(key, operation_id, &event, intent)?,
                )
            }
            _ => (None, Vec::new()),
        };
        let clock = self.clock;
        let open = match self.open.entry(operation_id) {
            Entry::Occupied(open) => open.into_mut(),
            Entry::Vacant(vacant) => {
                // An operation's first event (version 0) needs no look in the file: a correct
                // log has no earlier one, and a log that repeats an intent fails on the row's
                // key when it is written.
                let loaded = if version == StreamVersion::FIRST {
                    None
                } else {
                    self.writes.ask(|reply| Write::LoadState {
                        operation_id,
                        reply,
                    })??
                };
                let in_file = loaded.is_some();
                self.report.read_back += u64::from(in_file);
                let (state, version, before) = match loaded {
                    Some((state, version)) => {
                        let before = Some(apply::Counted::of(&state));
                        (state, Some(version), before)
                    }
                    None => (OperationState::initial(), None, None),
                };
                vacant.insert(OpenOperation {
                    state,
                    version,
                    position,
                    at: event.at(),
                    in_file,
                    dirty: false,
                    before,
                    last_used: clock,
                    request_hash: None,
                })
            }
        };
        let changes = fold_in_place(
            operation_id,
            &mut open.state,
            open.version,
            version,
            position,
            &similar,
            &event,
        )
        .map_err(|source| ReadModelError::Fold { position, source })?;
        open.version = Some(version);
        open.position = position;
        open.at = event.at();
        open.dirty = true;
        open.last_used = clock;
        if let Some(key) = key {
            open.request_hash = Some(key.row_hash());
        }
        if let (Some(key), OperationEvent::IntentRecorded(intent)) = (key, &event) {
            let recorded_at = open.state.intent.as_ref().map_or(intent.at, |kept| kept.at);
            self.window.insert(
                key,
                SimilarIntent {
                    operation_id,
                    source_id: intent.source_id.clone(),
                    recorded_at,
                },
            );
        }
        if let Some(review) = changes.review {
            self.writes.push(Write::Review(review))?;
        }
        for duplicate in changes.duplicates {
            self.writes.push(Write::Duplicate(duplicate))?;
        }
        // Nothing reads the id index during a rebuild, so its entries wait to be written in
        // key order (see `write_id_index`).
        self.id_index.extend(changes.id_index);
        if self.id_index.len() >= self.limits.max_buffered_id_entries {
            self.write_id_index(false)?;
        } else if self
            .clock
            .is_multiple_of((self.limits.id_entries_per_drip as u64 / 4).max(1))
        {
            self.drip_id_index(false)?;
        }
        for counter in &changes.metrics {
            *self.counters.entry(*counter).or_default() += 1;
        }
        self.report.applied += 1;
        if self.open.len() > self.limits.max_open_operations {
            self.write_least_recent()?;
        }
        if self.clock.is_multiple_of(self.limits.commit_events) {
            self.writes.push(Write::Commit)?;
        }
        Ok(())
    }

    pub(super) fn find_similar(
        &mut self,
        key: RequestDigest,
        operation_id: OperationId,
        event: &OperationEvent,
        intent: &IntentRecorded,
    ) -> Result<Vec<SimilarIntent>, ReadModelError> {
        let bounds = QueryBounds::of_intent(operation_id, intent);
        if let WindowAnswer::Found(found) = self.window.find(key, bounds) {
            return Ok(found);
        }
        let query = duplicates::similar_intent_query(operation_id, event)
            .expect("an intent has a similar-intent query");
        // The window no longer covers the query: write every open row so the file holds every
        // intent folded so far, as the runner's file would, and ask it. Its query needs the
        // request index, so from here on the indexes are kept row by row.
        self.report.asked_the_file += 1;
        self.write_open(|_| true)?;
        self.create_indexes()?;
        self.writes
            .ask(|reply| Write::FindSimilar { query, reply })?
    }

    /// Writes out and forgets the least recently used half of the open operations.
    pub(super) fn write_least_recent(&mut self) -> Result<(), ReadModelError> {
        let mut ages: Vec<u64> = self.open.values().map(|open| open.last_used).collect();
        let middle = ages.len() / 2;
        let (_, cutoff, _) = ages.select_nth_unstable(middle);
        let cutoff = *cutoff;
        // Taken out of the map; their rows and stored states are built here and the states
        // dropped here, on the thread that allocated them. (The writer built them once, when the
        // fold was the busier thread; with the fold's reads and fresh pages cut, the writer
        // became the busier one, by ~1.7 to 1 in samples, and rows built here cost less CPU in
        // all, measured with `bench projections`.)
        let mut evicted = std::mem::take(&mut self.evicted);
        evicted.extend(
            self.open
                .extract_if(|_, open| open.last_used < cutoff)
                .filter(|(_, open)| open.dirty),
        );
        evicted.sort_unstable_by_key(|(operation_id, _)| *operation_id);
        for (operation_id, open) in evicted.drain(..) {
            let version = open
                .version
                .expect("an open operation that is dirty has folded an event");
            self.gauges
                .row_changed(open.before, apply::Counted::of(&open.state));
            let stored = apply::stored_operation(
                operation_id,
                &open.state,
                (version, open.position, open.at),
                open.request_hash,
            )?;
            self.writes.push(Write::Operation {
                stored,
                in_file: open.in_file,
            })?;
        }
        self.evicted = evicted;
        Ok(())
    }

    /// Writes the rows of the open operations `which` selects that are newer than the file, in
    /// the order of their ids, so that consecutive rows land next to each other in the id index.
    pub(super) fn write_open(
        &mut self,
        which: impl Fn(&OpenOperation) -> bool,
    ) -> Result<(), ReadModelError> {
        let mut chosen: Vec<(&OperationId, &mut OpenOperation)> = self
            .open
            .iter_mut()
            .filter(|(_, open)| open.dirty && which(open))
            .collect();
        chosen.sort_unstable_by_key(|(operation_id, _)| **operation_id);
        for (operation_id, open) in chosen {
            let version = open
                .version
                .expect("an open operation that is dirty has folded an event");
            let stored = apply::stored_operation(
                *operation_id,
                &open.state,
                (version, open.position, open.at),
                open.request_hash,
            )?;
            self.writes.push(Write::Operation {
                stored,
                in_file: open.in_file,
            })?;
            let after = apply::Counted::of(&open.state);
            self.gauges.row_changed(open.before, after);
            open.before = Some(after);
            open.in_file = true;
            open.dirty = false;
        }
        Ok(())
    }

    /// Writes the buffered id-index entries, each table's in the order of its key, so that each
    /// insert lands beside the last one in the key's B-tree instead of on a random page. The
    /// entries of one key are ordered by position, so they keep their log order, which the
    /// external-id upsert (first position kept, strongest role) depends on; entries of one key
    /// and one position (one event naming one object twice) give the same row in either order.
    /// Unstable: the stable sort's scratch buffer, half the entries, was fresh memory faulted in
    /// on every flush (the sort was 3.8 % of a rebuild's CPU with a whole log's entries).
    ///
    /// The sorted entries are handed over a range at a time as the fold goes on
    /// ([`Self::drip_id_index`]), not at once (`at_once`: at the end): a whole flush is ~0.5 s
    /// of the writer's time, during which a fold that handed it over at once soon found the
    /// queue full and waited, leaving one core idle.
    pub(super) fn write_id_index(&mut self, at_once: bool) -> Result<(), ReadModelError> {
        // The previous flush first, whole: the entries of one key keep their log order.
        self.drip_id_index(true)?;
        let spare = self
            .writes
            .spare_id_entries(self.limits.max_buffered_id_entries);
        let mut entries = std::mem::replace(&mut self.id_index, spare);
        entries.sort_unstable_by(|left, right| {
            id_entry_key(left)
                .cmp(&id_entry_key(right))
                .then_with(|| id_entry_position(left).cmp(&id_entry_position(right)))
        });
        if entries.is_empty() {
            return Ok(());
        }
        self.draining = Some(Draining {
            entries: Arc::new(entries),
            sent: 0,
            append: !std::mem::replace(&mut self.id_index_written, true),
        });
        if at_once {
            self.drip_id_index(true)?;
        }
        Ok(())
    }

    /// Hands the writer the next range of the sorted id-index entries (`all`: every one left),
    /// never ending it between two entries of one object, which an append resolves together.
    pub(super) fn drip_id_index(&mut self, all: bool) -> Result<(), ReadModelError> {
        let Some(draining) = &mut self.draining else {
            return Ok(());
        };
        let entries = &draining.entries;
        let mut end = if all {
            entries.len()
        } else {
            (draining.sent + self.limits.id_entries_per_drip).min(entries.len())
        };
        while end < entries.len()
            && id_entry_object(&entries[end - 1]) == id_entry_object(&entries[end])
        {
            end += 1;
        }
        let range = draining.sent..end;
        draining.sent = end;
        let append = draining.append;
        // The last range takes the fold's hold of the buffer, so the writer can hand it back.
        let entries = if end == entries.len() {
            self.draining
                .take()
                .map(|draining| draining.entries)
                .expect("draining")
        } else {
            Arc::clone(entries)
        };
        self.writes.push(Write::IdIndex {
            entries,
            range,
            append,
        })
    }

    /// Creates the secondary indexes, once: at the end, or before the first query that needs
    /// them.
    pub(super) fn create_indexes(&mut self) -> Result<(), ReadModelError> {
        if !self.indexed {
            self.writes.push(Write::CreateIndexes)?;
            self.indexed = true;
        }
        Ok(())
    }

    /// Writes what is still open, then has the writer write the counters and the checkpoint
    /// and close the file.
    pub(super) fn finish(mut self) -> Result<RebuildReport, ReadModelError> {
        self.write_open(|_| true)?;
        self.write_id_index(true)?;
        self.create_indexes()?;
        self.writes.flush()?;
        self.writes.send(Message::Finish {
            counters: std::mem::take(&mut self.counters),
            gauges: std::mem::take(&mut self.gauges),
            checkpoint: self.report.checkpoint,
        })?;
        self.report.waits.fold_for_writer = self.writes.waited;
        Ok(self.report)
    }
}
