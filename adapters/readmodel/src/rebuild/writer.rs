//! The writer thread: SQLite's writing, on its own core, fed through a bounded queue of
//! batched writes whose buffers go back and forth instead of being allocated per message.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::state::OperationState;
use opledger_projections::duplicates::{DuplicateChange, SimilarIntent, SimilarIntentQuery};
use opledger_projections::id_index::IdIndexChange;
use opledger_projections::metrics::Counter;
use opledger_projections::review_queue::ReviewChange;
use rusqlite::Connection;

use crate::{apply, schema, ReadModelError};

use super::{RebuildWaits, MAX_OPEN_OPERATIONS, REBUILD_CACHE_KIB, REBUILD_PAGE_SIZE};

/// Writes handed from the fold to the writer, in batches of this many: one channel message
/// per batch instead of per row.
pub(super) const WRITES_PER_MESSAGE: usize = 512;

/// Batches of writes the fold may run ahead of the writer. Between the two threads there are at
/// most this many queued, one being written and one being filled, each of at most
/// [`WRITES_PER_MESSAGE`] writes: a row each, or a range of a flush's id-index entries (which
/// share the flush's buffer). The writer's work comes in bursts: an eviction hands over half
/// the open operations at once (8,192 rows at the default limits, 16 batches), after tens of
/// thousands of events whose only writes were id-index ranges. With 8 batches the fold waited
/// for the writer at every eviction, and the writer for the fold between them: on a 1M-event
/// log the fold waited 0.65–0.98 s with 8, 0.25–0.55 s with 32 and 0.1–0.23 s with 64, which
/// cost ~100 MB more peak RSS. At most ~16 MiB of rows queued; still, a 10M-event rebuild peaks
/// 55–100 MB higher with 32 than with 8, during the final index build (`bench projections`).
pub(super) const MESSAGES_IN_FLIGHT: usize = 32;

// An eviction at the default limits fits in the queue, so the fold goes on folding meanwhile.
const _: () = assert!(MESSAGES_IN_FLIGHT * WRITES_PER_MESSAGE >= MAX_OPEN_OPERATIONS / 2);

/// One thing for the writer to do, in the fold's order: a write, or one of the fold's two
/// questions to the file, which travel the same queue so that each answer sees every write the
/// fold made before asking.
pub(super) enum Write {
    /// An operation's row, built by the fold.
    Operation {
        stored: apply::StoredOperation,
        in_file: bool,
    },
    Review(ReviewChange),
    Duplicate(DuplicateChange),
    /// A range of id-index entries in key order; `append`: of the first flush, into tables that
    /// had no rows before it. The buffer goes back to the fold after its last range.
    IdIndex {
        entries: Arc<Vec<IdIndexChange>>,
        range: std::ops::Range<usize>,
        append: bool,
    },
    /// Commit and begin the next transaction.
    Commit,
    CreateIndexes,
    LoadState {
        operation_id: OperationId,
        reply: SyncSender<Result<Option<(OperationState, StreamVersion)>, ReadModelError>>,
    },
    FindSimilar {
        query: SimilarIntentQuery,
        reply: SyncSender<Result<Vec<SimilarIntent>, ReadModelError>>,
    },
}

/// What travels from the fold to the writer.
pub(super) enum Message {
    Writes(Vec<Write>),
    /// The counters and the checkpoint, after every write; then the last commit, and the file is
    /// closed.
    Finish {
        counters: BTreeMap<Counter, u64>,
        gauges: apply::GaugeChanges,
        checkpoint: Option<GlobalPosition>,
    },
}

/// Buffers of done writes the writer hands back to the fold, which drops the writes (their rows
/// and states are its allocations) and fills the buffers again instead of allocating a fresh one
/// per message on its thread and freeing it on the writer's: as many as can exist at once (those
/// queued, the one being written, the one being filled). Each holds at most
/// [`WRITES_PER_MESSAGE`] done writes until the fold takes it (~0.5 MiB of rows and states).
pub(super) const SPARE_WRITE_BUFFERS: usize = MESSAGES_IN_FLIGHT + 2;

/// Emptied buffers of id-index entries the writer hands back (each with room for
/// [`RebuildLimits::max_buffered_id_entries`], ~26 MiB at the default), kept for the next flush.
/// A fresh one was grown by doubling, its pages faulted in and copied at every flush. One: with
/// the one being filled and the one being written, at most three exist, and only while a flush
/// waits for the one before it; a buffer that finds the way back full is dropped. (Two spares
/// measured 40–65 MB more peak RSS than main on a 10M-event log.)
pub(super) const SPARE_ID_ENTRY_BUFFERS: usize = 1;

/// The queue from the fold to the writer, with the ways back for the buffers the writer empties.
pub(super) fn write_channel() -> (WriteQueue, WriterFeed) {
    let (sender, messages) = std::sync::mpsc::sync_channel(MESSAGES_IN_FLIGHT);
    let (spent_writes, spare_writes) = std::sync::mpsc::sync_channel(SPARE_WRITE_BUFFERS);
    let (spent_id_entries, spare_id_entries) =
        std::sync::mpsc::sync_channel(SPARE_ID_ENTRY_BUFFERS);
    let queue = WriteQueue {
        pending: Vec::with_capacity(WRITES_PER_MESSAGE),
        sender,
        spare_writes,
        spare_id_entries,
        waited: std::time::Duration::ZERO,
    };
    let feed = WriterFeed {
        messages,
        spent_writes,
        spent_id_entries,
    };
    (queue, feed)
}

/// The writer's end of the queue.
pub(super) struct WriterFeed {
    pub(super) messages: Receiver<Message>,
    pub(super) spent_writes: SyncSender<Vec<Write>>,
    pub(super) spent_id_entries: SyncSender<Vec<IdIndexChange>>,
}

/// The fold's end of the queue to the writer.
pub(super) struct WriteQueue {
    pub(super) pending: Vec<Write>,
    pub(super) sender: SyncSender<Message>,
    pub(super) spare_writes: Receiver<Vec<Write>>,
    pub(super) spare_id_entries: Receiver<Vec<IdIndexChange>>,
    /// Time spent waiting for the writer (a full queue, an answer).
    pub(super) waited: std::time::Duration,
}

impl WriteQueue {
    /// An empty buffer for id-index entries: one the writer handed back, or a new one with room
    /// for `capacity`.
    pub(super) fn spare_id_entries(&self, capacity: usize) -> Vec<IdIndexChange> {
        self.spare_id_entries
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(capacity))
    }

    pub(super) fn push(&mut self, write: Write) -> Result<(), ReadModelError> {
        self.pending.push(write);
        if self.pending.len() >= WRITES_PER_MESSAGE {
            self.flush()?;
        }
        Ok(())
    }

    pub(super) fn flush(&mut self) -> Result<(), ReadModelError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let spare = match self.spare_writes.try_recv() {
            Ok(mut written) => {
                // The writes the writer did, dropped here where they were allocated.
                written.clear();
                written
            }
            Err(_) => Vec::with_capacity(WRITES_PER_MESSAGE),
        };
        let writes = std::mem::replace(&mut self.pending, spare);
        self.send(Message::Writes(writes))
    }

    pub(super) fn send(&mut self, message: Message) -> Result<(), ReadModelError> {
        let waiting = std::time::Instant::now();
        let sent = self.sender.send(message).map_err(|_| writer_gone());
        self.waited += waiting.elapsed();
        sent
    }

    /// Sends the question `ask` makes, after everything pushed before it, and waits for the
    /// answer.
    pub(super) fn ask<T>(
        &mut self,
        ask: impl FnOnce(SyncSender<T>) -> Write,
    ) -> Result<T, ReadModelError> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.push(ask(reply))?;
        self.flush()?;
        let waiting = std::time::Instant::now();
        let answer = answer.recv().map_err(|_| writer_gone());
        self.waited += waiting.elapsed();
        answer
    }
}

/// The fold's error when the writer stopped; the writer's own error is the one reported.
pub(super) fn writer_gone() -> ReadModelError {
    ReadModelError::Worker {
        reason: "the rebuild's writer stopped".to_string(),
    }
}

/// The thread that owns the file being built and does every write the fold hands it, in order.
/// SQLite writes a file from one thread at a time; with the fold and the row building on
/// another, the two cores share the work instead of one doing all of it.
pub(super) struct Writer {
    pub(super) connection: Connection,
    /// What the writer measured of itself (`writer_for_fold`, `writer_indexing`).
    pub(super) waits: RebuildWaits,
}

impl Writer {
    /// Creates the file exclusively: a name another rebuild is using is never shared (nor
    /// removed by this one).
    pub(super) fn create_file(temporary: &Path) -> Result<(), ReadModelError> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(temporary)
            .map(drop)
            .map_err(|source| ReadModelError::Create {
                path: temporary.to_path_buf(),
                source,
            })
    }

    /// Sets up the file [`Writer::create_file`] created, and begins the first transaction.
    pub(super) fn open(temporary: &Path) -> Result<Self, ReadModelError> {
        let connection =
            schema::create_for_rebuild(temporary, REBUILD_PAGE_SIZE, REBUILD_CACHE_KIB)?;
        // No sorter helper threads (`PRAGMA threads`): measured by the floor, each index of a
        // 1M-event rebuild sorts within the page cache in one run, which helpers do not split
        // (the indexes took 0.65 µs per event without them, 0.78 with two).
        begin(&connection)?;
        Ok(Self {
            connection,
            waits: RebuildWaits::default(),
        })
    }

    /// Does the writes until [`Message::Finish`], and says how long it waited and indexed;
    /// `Ok(None)` when the fold stopped before it (its error is the one to report).
    pub(super) fn write_all(
        mut self,
        feed: WriterFeed,
    ) -> Result<Option<RebuildWaits>, ReadModelError> {
        loop {
            let waiting = std::time::Instant::now();
            let Ok(message) = feed.messages.recv() else {
                return Ok(None);
            };
            self.waits.writer_for_fold += waiting.elapsed();
            match message {
                Message::Writes(mut writes) => {
                    for write in &mut writes {
                        self.write(write, &feed)?;
                    }
                    // Back to the fold with the writes still in it: the fold drops them, on the
                    // thread that allocated their rows and states, where a free is a local one
                    // (freeing them here, cross-thread, was ~3 % of the writer's samples).
                    // Dropped here when the way back is full.
                    let _ = feed.spent_writes.try_send(writes);
                }
                Message::Finish {
                    counters,
                    gauges,
                    checkpoint,
                } => {
                    let waits = self.waits;
                    return self
                        .finish(&counters, &gauges, checkpoint)
                        .map(|()| Some(waits));
                }
            }
        }
    }

    pub(super) fn write(
        &mut self,
        write: &mut Write,
        feed: &WriterFeed,
    ) -> Result<(), ReadModelError> {
        let connection = &self.connection;
        match write {
            Write::Operation { stored, in_file } => stored.write(connection, *in_file),
            Write::Review(review) => apply::write_review(connection, review),
            Write::Duplicate(duplicate) => apply::write_duplicate(connection, duplicate),
            Write::IdIndex {
                entries,
                range,
                append,
            } => {
                let tables = if *append {
                    apply::IdTables::Empty
                } else {
                    apply::IdTables::Filled
                };
                apply::write_sorted_id_entries(connection, &entries[range.clone()], tables)?;
                // Only the last range's holder gets the buffer back.
                if let Some(entries) = Arc::get_mut(entries) {
                    let mut entries = std::mem::take(entries);
                    entries.clear();
                    let _ = feed.spent_id_entries.try_send(entries);
                }
                Ok(())
            }
            Write::Commit => commit(connection).and_then(|()| begin(connection)),
            Write::CreateIndexes => {
                let indexing = std::time::Instant::now();
                schema::create_indexes(connection)?;
                self.waits.writer_indexing += indexing.elapsed();
                Ok(())
            }
            Write::LoadState {
                operation_id,
                reply,
            } => {
                // A fold that stopped waiting has failed already; its error is reported.
                let _ = reply.send(apply::load_state(connection, *operation_id));
                Ok(())
            }
            Write::FindSimilar { query, reply } => {
                let _ = reply.send(apply::find_similar(connection, query));
                Ok(())
            }
        }
    }

    pub(super) fn finish(
        self,
        counters: &BTreeMap<Counter, u64>,
        gauges: &apply::GaugeChanges,
        checkpoint: Option<GlobalPosition>,
    ) -> Result<(), ReadModelError> {
        if let Some(checkpoint) = checkpoint {
            apply::write_counters(&self.connection, counters)?;
            apply::write_gauges(&self.connection, gauges)?;
            // The id-index writes leave this gauge to the end (`write_sorted_id_entries`).
            apply::write_shared_external_ids(&self.connection)?;
            apply::write_checkpoint(&self.connection, checkpoint)?;
        }
        commit(&self.connection)?;
        self.connection
            .close()
            .map_err(|(_, error)| ReadModelError::sqlite("closing the rebuilt file", error))
    }
}

pub(super) fn begin(connection: &Connection) -> Result<(), ReadModelError> {
    connection
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(|error| ReadModelError::sqlite("starting a rebuild transaction", error))
}

pub(super) fn commit(connection: &Connection) -> Result<(), ReadModelError> {
    connection
        .execute_batch("COMMIT")
        .map_err(|error| ReadModelError::sqlite("committing a rebuild transaction", error))
}
