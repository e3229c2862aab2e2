//! The rebuild from position zero: the same folds as the runner, written the fast way.
//!
//! The runner ([`super::apply`]) keeps no state between batches and reads each operation's
//! folded state back from the file, so that it can stop and resume anywhere. A rebuild needs
//! neither: it writes a fresh file nobody reads until it is complete. So here the open
//! operations' states are folded in place in memory ([`fold_in_place`](opledger_projections::read_models::fold_in_place)) and each operation's row
//! is built and written once, when it falls out of a bounded cache (or at the end); the
//! similar-intent lookup is answered from a bounded in-memory window; the id-index entries are
//! buffered and written in key order; the secondary indexes are created by sorting after the
//! rows are in; and the file is written without a journal or fsyncs, in large transactions, with
//! 16 KiB pages, and moved into place only after a final fsync. The fold and the building of
//! rows run on one thread and SQLite's writing on another ([`Writer`]), so both cores work.
//! The contents must be exactly the runner's: the same fold with the same inputs, the row from
//! the same function ([`operations::row`](opledger_projections::operations::row)), every row written with the runner's own statements
//! — and tests compare the files table by table, within the default limits and within tiny ones
//! that force every path.
//!
//! Memory is bounded by [`RebuildLimits`], not by the log: open operations, window intents,
//! buffered index entries, SQLite's page cache ([`REBUILD_CACHE_KIB`], which also bounds the
//! index sorter before it spills to temporary files), the batches read ahead, the writes queued
//! for the writer ([`writer::MESSAGES_IN_FLIGHT`]) and the fixed filter of requests the window let go
//! of ([`window::REQUEST_FILTER_BITS`]).
//!
//! Files: this one reads the log and hands it to the fold, and holds the limits and the report;
//! `fold.rs` the fold in memory, `window.rs` the similar-intent window and its request filter,
//! `writer.rs` the writer thread and its queue, `files.rs` the temporary file and its
//! publication, `tests.rs` the parts tested alone.
//!
//! Why dropping SQLite's durability here is safe: the rebuild writes a temporary file that only
//! this rebuild knows. A crash or an error at any point leaves that file incomplete and not at
//! the target path; it is discarded (removed on error, ignored after a crash, since a rebuild
//! never reads it). The target path appears — by a hard link, which never replaces an existing
//! file — only after the finished file has been fsynced, and the directory is fsynced after it.
//! It must never write into a file anyone else has open.

mod files;
mod fold;
#[cfg(test)]
mod tests;
mod window;
mod writer;

pub use self::fold::ID_ENTRIES_PER_DRIP;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use opledger_domain::codec::{self, DecodeError};
use opledger_domain::event::OperationEvent;
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::store::{EventStore, EventView, LogStart, StoreError, MAX_READ_BATCH};
use tokio::sync::mpsc;
use tracing::info;

use super::writeback::{EarlyWriteback, WRITEBACK_EVERY_MS};
use super::{ReadModelError, ReadModelStore, ReadModels};

use self::files::{publish, remove_file_and_journal, temporary_path};
use self::fold::Rebuilder;
use self::writer::{write_channel, Writer};

/// Most operations whose folded state the rebuild holds in memory at once. An operation's events
/// are mostly close together in the log, so nearly every event finds its operation here; one
/// that does not is read back from the file, as the runner always does. Bounds the rebuild's
/// memory whatever the length of the log.
pub const MAX_OPEN_OPERATIONS: usize = 16_384;
/// Most earlier intents the similar-intent window holds. The window keeps the intents recorded
/// within a few [`POSSIBLE_DUPLICATE_WINDOW_S`](opledger_projections::duplicates::POSSIBLE_DUPLICATE_WINDOW_S) of the newest one; past this limit it is narrowed
/// further, down to the intents that are newest.
pub const MAX_WINDOW_INTENTS: usize = 65_536;
/// Events written per transaction. Without a journal a commit costs no fsync; committing still
/// bounds the dirty pages SQLite holds.
pub const REBUILD_COMMIT_EVENTS: u64 = 65_536;
/// Most id-index entries (attempts, sources, external ids) held before they are written, sorted:
/// ~150 bytes each with their strings, so at most ~40 MiB. The first flush goes into empty
/// tables and is appended in key order without a read (`apply::append_id_entries`); later ones
/// are the runner's upserts, each one sorted pass over the tables. Measured on a 1M-event log
/// (668,000 entries), alternated at a load of ~7: 262,144 and 1,048,576 (one flush) both took
/// ~4 % less CPU than 32,768 (20 runs of upserts), and 1,048,576 cost ~100 MB more peak RSS than
/// 262,144, whose peak was below 32,768's.
pub const MAX_BUFFERED_ID_ENTRIES: usize = 1 << 18;
/// The rebuild's in-memory maps, hashed with foldhash: their keys (operation ids, requests) come
/// from our own log, and SipHash, std's default, was 3.4 % of a rebuild's CPU.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
/// Batches of [`MAX_READ_BATCH`] events read ahead of the fold.
const READ_AHEAD_BATCHES: usize = 2;
/// Emptied batch buffers the fold hands back to the reader, which fills them again instead of
/// allocating ~1.5 MiB per batch (4,096 decoded events) on one thread and freeing it on another:
/// as many as can exist at once (those read ahead, the one being folded, the one being read).
/// A buffer that finds the way back full is dropped.
const SPARE_BATCHES: usize = READ_AHEAD_BATCHES + 2;
/// SQLite's page cache for the rebuild connection, in KiB (a negative `cache_size` is KiB).
pub(super) const REBUILD_CACHE_KIB: i64 = 65_536;
/// The rebuilt file's page size, in bytes. Measured on a 1.2M-event log: 4 KiB pages 118k
/// events/s, 16 KiB 144k, 64 KiB about the same as 16 KiB with twice the memory. Bigger pages
/// mean fewer B-tree splits and page headers per row. The rebuilt file becomes the live one;
/// `bench http` on 16 KiB pages was within its run-to-run noise of 4 KiB (−4 % on average).
pub(super) const REBUILD_PAGE_SIZE: u32 = 16384;

/// The bounds on what a rebuild holds in memory, whatever the length of the log. Only tests
/// have a reason to change them: small ones make every path that a long log takes (operations
/// written out early and read back, intents let go of and looked up in the file, several
/// transactions) happen on a short one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RebuildLimits {
    /// Most operations whose folded state is held at once ([`MAX_OPEN_OPERATIONS`]).
    pub max_open_operations: usize,
    /// Most intents the similar-intent window holds ([`MAX_WINDOW_INTENTS`]).
    pub max_window_intents: usize,
    /// Most id-index entries waiting to be written ([`MAX_BUFFERED_ID_ENTRIES`]).
    pub max_buffered_id_entries: usize,
    /// Events per transaction ([`REBUILD_COMMIT_EVENTS`]).
    pub commit_events: u64,
    /// Id-index entries of a flush handed to the writer at a time while the fold goes on
    /// ([`ID_ENTRIES_PER_DRIP`]).
    pub id_entries_per_drip: usize,
}

impl Default for RebuildLimits {
    fn default() -> Self {
        Self {
            max_open_operations: MAX_OPEN_OPERATIONS,
            max_window_intents: MAX_WINDOW_INTENTS,
            max_buffered_id_entries: MAX_BUFFERED_ID_ENTRIES,
            commit_events: REBUILD_COMMIT_EVENTS,
            id_entries_per_drip: ID_ENTRIES_PER_DRIP,
        }
    }
}

impl RebuildLimits {
    fn check(&self) -> Result<(), ReadModelError> {
        if self.max_open_operations == 0
            || self.max_window_intents < 2
            || self.max_buffered_id_entries == 0
            || self.commit_events == 0
            || self.id_entries_per_drip == 0
        {
            return Err(ReadModelError::InvalidQuery {
                reason: format!("rebuild limits too small to make progress: {self:?}"),
            });
        }
        Ok(())
    }
}

/// What a rebuild did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Events folded into the read models.
    pub applied: u64,
    /// Events of streams that are not operation streams; passed over.
    pub other_streams: u64,
    /// The position of the last event applied (`None`: the log was empty).
    pub checkpoint: Option<GlobalPosition>,
    /// Operations whose state was read back from the file because they had been written out
    /// to keep within [`RebuildLimits::max_open_operations`].
    pub read_back: u64,
    /// Similar-intent lookups answered from the file because the window had let go of intents
    /// they may need.
    pub asked_the_file: u64,
    /// Where the rebuild's threads waited for each other: what keeps it from using both cores.
    pub waits: RebuildWaits,
}

/// Wall time the rebuild's stages spent waiting for each other, and the final index build
/// (which runs alone). Measured, not bounded: only a report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebuildWaits {
    /// The fold waited for the next decoded batch of the log.
    pub fold_for_log: std::time::Duration,
    /// The fold waited for the writer: its queue was full, or it waited for an answer.
    pub fold_for_writer: std::time::Duration,
    /// The writer waited for the fold's next writes.
    pub writer_for_fold: std::time::Duration,
    /// The writer built the secondary indexes (`CREATE INDEX`, at the end or mid-way).
    pub writer_indexing: std::time::Duration,
    /// The finished file was synced to the disk and linked into place (alone, at the end).
    pub publishing: std::time::Duration,
}

/// Builds the read models from position zero into a new file at `path`, up to the log's head as
/// it was when the rebuild started, and returns them; a [`super::ReadModelRunner`] continues
/// from there.
///
/// The file must not exist: a rebuild never writes over read models someone may be reading (swap
/// files when nothing has them open). The rows are built in a temporary file beside `path`, which
/// appears at `path` only when complete; a rebuild that fails removes it, and one that is
/// interrupted leaves no file at `path`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use opledger_readmodel::rebuild;
/// use opledger_store::MemoryStore;
///
/// let dir = tempfile::tempdir()?;
/// let ledger = MemoryStore::new();
/// let read_models = rebuild(&ledger, dir.path().join("read-models.db")).await?;
/// assert_eq!(read_models.lag(&ledger).await?.positions, 0);
/// let queue = read_models.call(|store| store.review_queue(20)).await?;
/// assert!(queue.is_empty());
/// # Ok(())
/// # }
/// ```
pub async fn rebuild<S: EventStore>(
    store: &S,
    path: impl AsRef<Path>,
) -> Result<ReadModels, ReadModelError> {
    let head = store.head_position().await?;
    Ok(rebuild_to(store, path, head).await?.0)
}

/// [`rebuild`] up to `target` exactly (the position, say, that another file is caught up to),
/// with what it did. Events after `target` are left for a runner.
pub async fn rebuild_to<S: EventStore>(
    store: &S,
    path: impl AsRef<Path>,
    target: Option<GlobalPosition>,
) -> Result<(ReadModels, RebuildReport), ReadModelError> {
    rebuild_to_with(store, path, target, RebuildLimits::default()).await
}

/// [`rebuild_to`] within other memory bounds than the defaults. The file is the same whatever
/// the limits; only the time it takes changes.
pub async fn rebuild_to_with<S: EventStore>(
    store: &S,
    path: impl AsRef<Path>,
    target: Option<GlobalPosition>,
    limits: RebuildLimits,
) -> Result<(ReadModels, RebuildReport), ReadModelError> {
    limits.check()?;
    let path = path.as_ref().to_path_buf();
    if path.exists() {
        return Err(ReadModelError::AlreadyExists { path });
    }
    let temporary = temporary_path(&path);
    let result = build(store, &temporary, &path, target, limits).await;
    // After success the temporary name is already gone; after a failure it is worthless.
    remove_file_and_journal(&temporary);
    let report = result?;
    let opened = tokio::task::spawn_blocking(move || ReadModelStore::open(path))
        .await
        .map_err(|error| ReadModelError::Worker {
            reason: error.to_string(),
        })??;
    let read_models = ReadModels::from_store(opened);
    info!(checkpoint = ?report.checkpoint, applied = report.applied,
        path = %read_models.path().display(), "read models rebuilt");
    Ok((read_models, report))
}

/// Reads the log in one task (each batch read and decoded on a blocking thread of the store's),
/// folds on another and writes the file on a third, so reading, folding and writing share the
/// cores. The writer publishes the file at `path` once everything is written, unless the rebuild
/// was dropped meanwhile (checked just before the file is linked into place).
async fn build<S: EventStore>(
    store: &S,
    temporary: &Path,
    path: &Path,
    target: Option<GlobalPosition>,
    limits: RebuildLimits,
) -> Result<RebuildReport, ReadModelError> {
    let (sender, receiver) = mpsc::channel::<Result<Feed, StoreError>>(READ_AHEAD_BATCHES);
    let (spent_batches, spare_batches) = std::sync::mpsc::sync_channel(SPARE_BATCHES);
    let (to_writer, from_fold) = write_channel();
    let (temporary_owned, path_owned) = (temporary.to_path_buf(), path.to_path_buf());
    let wanted = Arc::new(AtomicBool::new(true));
    let _wanted_until_dropped = WantedUntilDropped(Arc::clone(&wanted));
    // Three blocking threads at once (the writer, the fold and a batch's read and decoding): a
    // runtime limited to fewer would leave the fold waiting for a read that never starts.
    let writer = tokio::task::spawn_blocking(move || {
        Writer::create_file(&temporary_owned)?;
        // From here the temporary file is this rebuild's: anything but a finished and published
        // file removes it, here, because after a cancelled rebuild nobody else is left to.
        let result = EarlyWriteback::start(
            &temporary_owned,
            std::time::Duration::from_millis(WRITEBACK_EVERY_MS),
        )
        .and_then(|writeback| {
            let finished =
                Writer::open(&temporary_owned).and_then(|writer| writer.write_all(from_fold))?;
            let Some(mut waits) = finished else {
                return Ok(None);
            };
            // The last events may have been handed over just before the caller went away.
            if !wanted.load(Ordering::SeqCst) {
                return Err(ReadModelError::Worker {
                    reason: "the rebuild was cancelled before its file was published".to_string(),
                });
            }
            let publishing = std::time::Instant::now();
            writeback.stop()?;
            publish(&temporary_owned, &path_owned)?;
            waits.publishing = publishing.elapsed();
            Ok(Some(waits))
        });
        if !matches!(result, Ok(Some(_))) {
            remove_file_and_journal(&temporary_owned);
        }
        result
    });
    let fold = tokio::task::spawn_blocking(move || {
        let mut rebuilder = Rebuilder::new(to_writer, limits);
        rebuilder.fold_all(receiver, &spent_batches)?;
        rebuilder.finish()
    });
    let written = async {
        let (folded, written) = tokio::join!(fold, writer);
        let worker = |error: tokio::task::JoinError| ReadModelError::Worker {
            reason: error.to_string(),
        };
        // The writer's error first: a fold that lost its writer reports only that.
        let finished = written.map_err(worker)??;
        let mut report = folded.map_err(worker)??;
        let Some(writer) = finished else {
            return Err(ReadModelError::Worker {
                reason: "the rebuild's writer stopped before the end".to_string(),
            });
        };
        report.waits.writer_for_fold = writer.writer_for_fold;
        report.waits.writer_indexing = writer.writer_indexing;
        report.waits.publishing = writer.publishing;
        Ok(report)
    };
    let reader = async {
        let mut checkpoint: Option<GlobalPosition> = None;
        while checkpoint < target {
            let start = checkpoint.map_or(LogStart::Beginning, LogStart::After);
            // Each event is decoded from the bytes the store lends, on the store's reading
            // thread (off both the executor and the fold), so no copy of the row is made first.
            // Reading the next batch while this one decodes was measured: no change in CPU or
            // wall time (the fold waited for the log ~10 % of the wall time either way).
            let spare = spare_batches.try_recv().unwrap_or_default();
            let read = match store
                .read_all_with(start, MAX_READ_BATCH, decode, spare)
                .await
            {
                Ok(mut batch) if !batch.is_empty() => {
                    batch.retain(|event| Some(event.position) <= target);
                    checkpoint = batch.last().map(|event| event.position).or(target);
                    Ok(batch)
                }
                Ok(_) => Err(StoreError::Corrupt {
                    reason: format!(
                        "the log's head is at {target:?} but nothing after {start:?} can be read"
                    ),
                }),
                Err(error) => Err(error),
            };
            let failed = read.is_err();
            // A closed channel means the fold stopped; its error is the one to report.
            if sender.send(read.map(Feed::Batch)).await.is_err() || failed {
                return;
            }
        }
        // Only now may the fold finish the file: a feed that just closes is a rebuild that was
        // cancelled (its future dropped) half-way, and must not leave a partial file.
        let _ = sender.send(Ok(Feed::Complete)).await;
    };
    let ((), written) = tokio::join!(reader, written);
    written
}

/// Marks the rebuild unwanted when [`build`]'s future is dropped (a Ctrl-C during `replay`):
/// the threads go on, and the writer must not publish what nobody waits for any more.
struct WantedUntilDropped(Arc<AtomicBool>);

impl Drop for WantedUntilDropped {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// What the reader hands the fold.
enum Feed {
    Batch(Vec<Decoded>),
    /// Every event up to the target was handed over.
    Complete,
}

/// An event as read: where it is, and its decoded form when it belongs to an operation stream.
/// Nothing of the stored bytes is kept.
struct Decoded {
    position: GlobalPosition,
    version: StreamVersion,
    /// The operation whose stream it is in, and the event (`None`: another stream).
    event: Option<(OperationId, Result<OperationEvent, DecodeError>)>,
}

fn decode(stored: EventView<'_>) -> Decoded {
    Decoded {
        position: stored.position,
        version: stored.version,
        event: stored
            .operation_id()
            .map(|operation_id| (operation_id, codec::decode_view(stored))),
    }
}
