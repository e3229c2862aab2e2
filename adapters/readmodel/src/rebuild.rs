//! The rebuild from position zero: the same folds as the runner, written the fast way.
//!
//! The runner ([`super::apply`]) keeps no state between batches and reads each operation's
//! folded state back from the file, so that it can stop and resume anywhere. A rebuild needs
//! neither: it writes a fresh file nobody reads until it is complete. So here the open
//! operations' states are folded in place in memory ([`fold_in_place`]) and each operation's row
//! is built and written once, when it falls out of a bounded cache (or at the end); the
//! similar-intent lookup is answered from a bounded in-memory window; the id-index entries are
//! buffered and written in key order; the secondary indexes are created by sorting after the
//! rows are in; and the file is written without a journal or fsyncs, in large transactions, with
//! 16 KiB pages, and moved into place only after a final fsync. The fold and the building of
//! rows run on one thread and SQLite's writing on another ([`Writer`]), so both cores work.
//! The contents must be exactly the runner's: the same fold with the same inputs, the row from
//! the same function ([`operations::row`]), every row written with the runner's own statements
//! — and tests compare the files table by table, within the default limits and within tiny ones
//! that force every path.
//!
//! Memory is bounded by [`RebuildLimits`], not by the log: open operations, window intents,
//! buffered index entries, SQLite's page cache ([`REBUILD_CACHE_KIB`], which also bounds the
//! index sorter before it spills to temporary files), the batches read ahead, the writes queued
//! for the writer ([`MESSAGES_IN_FLIGHT`]) and the fixed filter of requests the window let go
//! of ([`REQUEST_FILTER_BITS`]).
//!
//! Why dropping SQLite's durability here is safe: the rebuild writes a temporary file that only
//! this rebuild knows. A crash or an error at any point leaves that file incomplete and not at
//! the target path; it is discarded (removed on error, ignored after a crash, since a rebuild
//! never reads it). The target path appears — by a hard link, which never replaces an existing
//! file — only after the finished file has been fsynced, and the directory is fsynced after it.
//! It must never write into a file anyone else has open.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use opledger_domain::codec::{self, DecodeError};
use opledger_domain::event::{IntentRecorded, OperationEvent};
use opledger_domain::ids::{GlobalPosition, OperationId, StreamVersion};
use opledger_domain::state::OperationState;
use opledger_domain::store::{EventStore, EventView, LogStart, StoreError, MAX_READ_BATCH};
use opledger_projections::duplicates::{
    self, DuplicateChange, SimilarIntent, SimilarIntentQuery, POSSIBLE_DUPLICATE_WINDOW_S,
};
use opledger_projections::id_index::IdIndexChange;
use opledger_projections::metrics::Counter;
use opledger_projections::read_models::fold_in_place;
use opledger_projections::review_queue::ReviewChange;
use rusqlite::Connection;
use tokio::sync::mpsc;
use tracing::info;

use super::apply::QueryBounds;
use super::writeback::{EarlyWriteback, WRITEBACK_EVERY_MS};
use super::{apply, schema, sql, ReadModelError, ReadModelStore, ReadModels};

/// Most operations whose folded state the rebuild holds in memory at once. An operation's events
/// are mostly close together in the log, so nearly every event finds its operation here; one
/// that does not is read back from the file, as the runner always does. Bounds the rebuild's
/// memory whatever the length of the log.
pub const MAX_OPEN_OPERATIONS: usize = 16_384;
/// Most earlier intents the similar-intent window holds. The window keeps the intents recorded
/// within a few [`POSSIBLE_DUPLICATE_WINDOW_S`] of the newest one; past this limit it is narrowed
/// further, down to the intents that are newest.
pub const MAX_WINDOW_INTENTS: usize = 65_536;
/// Bits of the filter remembering the requests of the intents the window let go of: 16 MiB. At
/// [`RequestFilter::PROBES`] probes it answers "maybe" for a request it never saw about once in
/// 7 trillion lookups after a million distinct requests, once in 13 million after 3.3 million
/// (a 10M-event log), once in 550 after ten million. The first "maybe" is expensive: the file
/// is asked, so every open row is written and the indexes are built then and kept row by row
/// after (`Rebuilder::find_similar`). A 2 MiB filter said "maybe" six times on a log of 400,000
/// intents and cost that rebuild a quarter of its time.
const REQUEST_FILTER_BITS: usize = 1 << 27;
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

/// An open operation: its folded state, not yet written, and what its row is built from.
struct OpenOperation {
    state: OperationState,
    /// The version of the last event folded (`None`: none yet).
    version: Option<StreamVersion>,
    /// The position of the last event folded.
    position: GlobalPosition,
    /// When the last event folded happened.
    at: DateTime<Utc>,
    /// Whether the file has a row for it already (it was written once and read back).
    in_file: bool,
    /// Whether `state` is newer than the file.
    dirty: bool,
    /// What the gauges count of the file's row (`None`: no row yet).
    before: Option<apply::Counted>,
    /// The event count when it was last touched; the least recent are written out first.
    last_used: u64,
    /// Its row's `request_hash`, from the digest the window was asked with, when this rebuild
    /// folded its intent (`None`: read back from the file, whose row has it), so that the
    /// request's SHA-256 is made once per operation, not again for the row.
    request_hash: Option<i64>,
}

/// The intents folded so far that were recorded at or after `floor`, by request: exactly the
/// rows the runner's lookup could find in that time range. The intents let go of (below `floor`)
/// are remembered only in a fixed-size filter of their requests, which never misses one: a lookup
/// whose window reaches below `floor` for a request the filter may have seen is answered from the
/// file instead. So the answers are always the runner's, and the memory is fixed.
struct IntentWindow {
    by_request: FastMap<RequestDigest, Vec<SimilarIntent>>,
    entries: usize,
    /// Most entries held; at least 2.
    max_entries: usize,
    floor: DateTime<Utc>,
    newest: DateTime<Utc>,
    let_go: RequestFilter,
}

/// What [`IntentWindow::find`] knows.
enum WindowAnswer {
    /// The runner's answer.
    Found(Vec<SimilarIntent>),
    /// The query reaches intents the window let go of: ask the file.
    AskTheFile,
}

impl IntentWindow {
    fn new(max_entries: usize) -> Self {
        Self {
            by_request: FastMap::default(),
            entries: 0,
            max_entries,
            floor: DateTime::<Utc>::MIN_UTC,
            newest: DateTime::<Utc>::MIN_UTC,
            let_go: RequestFilter::new(),
        }
    }

    /// The earlier intents the runner's query would return, newest first (`key`: the query's
    /// request).
    fn find(&self, key: RequestDigest, query: QueryBounds) -> WindowAnswer {
        if query.from < self.floor && self.let_go.may_contain(key) {
            return WindowAnswer::AskTheFile;
        }
        let Some(candidates) = self.by_request.get(&key) else {
            return WindowAnswer::Found(Vec::new());
        };
        let mut found = Vec::new();
        apply::add_similar(&mut found, candidates, query);
        WindowAnswer::Found(found)
    }

    fn insert(&mut self, key: RequestDigest, intent: SimilarIntent) {
        self.newest = self.newest.max(intent.recorded_at);
        if intent.recorded_at < self.floor {
            self.let_go.insert(key);
            return;
        }
        self.by_request.entry(key).or_default().push(intent);
        self.entries += 1;
        if self.entries > self.max_entries {
            self.narrow();
        }
    }

    /// Lets go of the intents too old to matter to the newest ones, and of the older half if
    /// that is not enough (a burst of intents within one window). Intents recorded at the same
    /// time as the middle one go too: with many at one time (an injected clock, a hand-written
    /// log) keeping them would keep the window over its limit.
    fn narrow(&mut self) {
        let span = Duration::seconds(2 * POSSIBLE_DUPLICATE_WINDOW_S);
        let by_age = self.newest.checked_sub_signed(span).unwrap_or(self.newest);
        self.raise_floor(by_age);
        if self.entries > self.max_entries / 2 {
            let mut times: Vec<DateTime<Utc>> = self
                .by_request
                .values()
                .flatten()
                .map(|intent| intent.recorded_at)
                .collect();
            let middle = times.len() / 2;
            let (_, median, _) = times.select_nth_unstable(middle);
            let above_median = median
                .checked_add_signed(Duration::nanoseconds(1))
                .unwrap_or(*median);
            self.raise_floor(above_median);
        }
        assert!(
            self.entries <= self.max_entries,
            "narrowing keeps the intent window within its limit"
        );
    }

    fn raise_floor(&mut self, floor: DateTime<Utc>) {
        if floor <= self.floor {
            return;
        }
        self.floor = floor;
        let let_go = &mut self.let_go;
        self.by_request.retain(|key, intents| {
            let before = intents.len();
            intents.retain(|intent| intent.recorded_at >= floor);
            if intents.len() < before {
                let_go.insert(*key);
            }
            !intents.is_empty()
        });
        self.entries = self.by_request.values().map(Vec::len).sum();
    }
}

/// A request as the similar-intent window keys it: [`sql::request_digest`] of its five names,
/// 16 bytes instead of five strings. The window held ~65,000 keys of five heap strings each
/// (~20 MiB, all copied from the intent), and hashing, comparing and dropping them was a few
/// per cent of the fold; a lookup in the file (rare) is asked with the whole query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct RequestDigest(u128);

impl RequestDigest {
    #[cfg(test)]
    fn of(query: &SimilarIntentQuery) -> Self {
        Self(sql::request_digest([
            query.tenant.as_str(),
            query.provider.as_str(),
            query.account.as_str(),
            query.action.as_str(),
            query.args_hash.as_str(),
        ]))
    }

    /// The digest of the request `intent` makes: the same as of its query
    /// ([`duplicates::similar_intent_query`]), from the intent's own names, uncopied.
    fn of_intent(intent: &IntentRecorded) -> Self {
        Self(sql::request_digest([
            intent.tenant.as_str(),
            intent.provider.as_str(),
            intent.account.as_str(),
            intent.action.as_str(),
            intent.args_hash.as_str(),
        ]))
    }

    /// The row's `request_hash` of the same request.
    fn row_hash(self) -> i64 {
        sql::request_hash_of_digest(self.0)
    }

    /// 32 bits of the digest, from bit `shift` up.
    fn low_bits(self, shift: u32) -> u64 {
        u64::try_from((self.0 >> shift) & 0xffff_ffff).expect("32 bits fit")
    }
}

/// A Bloom filter of requests: fixed size, no false negatives, and false positives that only
/// cost a lookup in the file.
struct RequestFilter {
    bits: Vec<u64>,
}

impl RequestFilter {
    /// Probes per request. Twelve, not the six of before: with six, a 10M-event log (3.3
    /// million requests, ~40 bits of the filter each) drew three false "maybe"s, each rebuild's
    /// first one building every index mid-way; twelve is nearer the optimum for that load
    /// (ln 2 × bits per request) and no worse at ten million requests. A request never seen
    /// stops at its first clear bit, so only inserts pay the extra probes.
    const PROBES: u64 = 12;

    fn new() -> Self {
        Self {
            bits: vec![0; REQUEST_FILTER_BITS / 64],
        }
    }

    /// The bits of `key`, by double hashing two 32-bit parts of its digest (SHA-256 bits, so
    /// independent; and fixed, so a rebuild's "maybe"s, and so its time, are the same on every
    /// run over one log).
    fn probes(key: RequestDigest) -> impl Iterator<Item = usize> {
        let (first, step) = (key.low_bits(0), key.low_bits(32) | 1);
        (0..Self::PROBES).map(move |probe| {
            // The modulus is a power of two below 2^32, so the value fits any usize.
            (first.wrapping_add(probe.wrapping_mul(step)) % REQUEST_FILTER_BITS as u64) as usize
        })
    }

    fn insert(&mut self, key: RequestDigest) {
        for bit in Self::probes(key) {
            self.bits[bit / 64] |= 1 << (bit % 64);
        }
    }

    fn may_contain(&self, key: RequestDigest) -> bool {
        Self::probes(key).all(|bit| self.bits[bit / 64] & (1 << (bit % 64)) != 0)
    }
}

/// The fold of a whole log into a fresh file: the open operations, the intent window and the
/// summed counters. It builds the rows and hands them to the writer ([`Writer`]), which owns
/// the file.
struct Rebuilder {
    writes: WriteQueue,
    open: FastMap<OperationId, OpenOperation>,
    window: IntentWindow,
    counters: BTreeMap<Counter, u64>,
    /// The changes of the row gauges as rows are written, summed: the file starts empty, so at
    /// the end they are those gauges (`shared_external_ids` is counted from the finished table, `Writer::finish`).
    gauges: apply::GaugeChanges,
    report: RebuildReport,
    /// Events seen, for the cache's recency and the commit rhythm.
    clock: u64,
    /// Whether the secondary indexes exist yet.
    indexed: bool,
    /// Id-index entries not yet written (at most [`RebuildLimits::max_buffered_id_entries`]).
    id_index: Vec<IdIndexChange>,
    /// The operations being written out by [`Self::write_least_recent`], kept between calls so
    /// that its room (half of [`RebuildLimits::max_open_operations`]) is allocated once, not
    /// faulted in afresh at every eviction.
    evicted: Vec<(OperationId, OpenOperation)>,
    /// The last flush of id-index entries, sorted, while it is handed to the writer.
    draining: Option<Draining>,
    /// Whether the id-index tables have rows yet: until they do, a flush is appended.
    id_index_written: bool,
    limits: RebuildLimits,
}

/// Where an id-index entry goes: its table, then its primary key as SQLite orders it (text by
/// its bytes, which is also how `str` and a UUID's hyphenated lowercase text compare).
fn id_entry_key(entry: &IdIndexChange) -> (u8, Option<uuid::Uuid>, &str, &str, &str, OperationId) {
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
fn id_entry_object(entry: &IdIndexChange) -> (u8, Option<uuid::Uuid>, &str, &str, &str) {
    let (table, uuid, first, second, third, _) = id_entry_key(entry);
    (table, uuid, first, second, third)
}

/// Sorted id-index entries being handed to the writer a range at a time
/// ([`Rebuilder::drip_id_index`]).
struct Draining {
    entries: Arc<Vec<IdIndexChange>>,
    /// How many of them the writer has been handed.
    sent: usize,
    /// Whether they go into tables that had no rows before them (appended, not upserted).
    append: bool,
}

/// Id-index entries of a flush handed to the writer per range while the fold goes on, one range
/// every quarter as many events: 4 entries per event, more than an event adds (at most ~2), so
/// a flush is mostly handed over before the next one fills (what is left then goes at once).
/// Each range costs the writer its statements' lookups, so not much fewer.
pub const ID_ENTRIES_PER_DRIP: usize = 512;

/// Where an id-index entry was recorded.
fn id_entry_position(entry: &IdIndexChange) -> GlobalPosition {
    match entry {
        IdIndexChange::Attempt { position, .. }
        | IdIndexChange::Source { position, .. }
        | IdIndexChange::ExternalId { position, .. } => *position,
    }
}

impl Rebuilder {
    fn new(writes: WriteQueue, limits: RebuildLimits) -> Self {
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
    fn fold_all(
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

    fn fold(&mut self, decoded: Decoded) -> Result<(), ReadModelError> {
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

    fn find_similar(
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
    fn write_least_recent(&mut self) -> Result<(), ReadModelError> {
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
    fn write_open(&mut self, which: impl Fn(&OpenOperation) -> bool) -> Result<(), ReadModelError> {
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
    fn write_id_index(&mut self, at_once: bool) -> Result<(), ReadModelError> {
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
    fn drip_id_index(&mut self, all: bool) -> Result<(), ReadModelError> {
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
    fn create_indexes(&mut self) -> Result<(), ReadModelError> {
        if !self.indexed {
            self.writes.push(Write::CreateIndexes)?;
            self.indexed = true;
        }
        Ok(())
    }

    /// Writes what is still open, then has the writer write the counters and the checkpoint
    /// and close the file.
    fn finish(mut self) -> Result<RebuildReport, ReadModelError> {
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

/// Writes handed from the fold to the writer, in batches of this many: one channel message
/// per batch instead of per row.
const WRITES_PER_MESSAGE: usize = 512;
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
const MESSAGES_IN_FLIGHT: usize = 32;
// An eviction at the default limits fits in the queue, so the fold goes on folding meanwhile.
const _: () = assert!(MESSAGES_IN_FLIGHT * WRITES_PER_MESSAGE >= MAX_OPEN_OPERATIONS / 2);

/// One thing for the writer to do, in the fold's order: a write, or one of the fold's two
/// questions to the file, which travel the same queue so that each answer sees every write the
/// fold made before asking.
enum Write {
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
enum Message {
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
const SPARE_WRITE_BUFFERS: usize = MESSAGES_IN_FLIGHT + 2;
/// Emptied buffers of id-index entries the writer hands back (each with room for
/// [`RebuildLimits::max_buffered_id_entries`], ~26 MiB at the default), kept for the next flush.
/// A fresh one was grown by doubling, its pages faulted in and copied at every flush. One: with
/// the one being filled and the one being written, at most three exist, and only while a flush
/// waits for the one before it; a buffer that finds the way back full is dropped. (Two spares
/// measured 40–65 MB more peak RSS than main on a 10M-event log.)
const SPARE_ID_ENTRY_BUFFERS: usize = 1;

/// The queue from the fold to the writer, with the ways back for the buffers the writer empties.
fn write_channel() -> (WriteQueue, WriterFeed) {
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
struct WriterFeed {
    messages: Receiver<Message>,
    spent_writes: SyncSender<Vec<Write>>,
    spent_id_entries: SyncSender<Vec<IdIndexChange>>,
}

/// The fold's end of the queue to the writer.
struct WriteQueue {
    pending: Vec<Write>,
    sender: SyncSender<Message>,
    spare_writes: Receiver<Vec<Write>>,
    spare_id_entries: Receiver<Vec<IdIndexChange>>,
    /// Time spent waiting for the writer (a full queue, an answer).
    waited: std::time::Duration,
}

impl WriteQueue {
    /// An empty buffer for id-index entries: one the writer handed back, or a new one with room
    /// for `capacity`.
    fn spare_id_entries(&self, capacity: usize) -> Vec<IdIndexChange> {
        self.spare_id_entries
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(capacity))
    }

    fn push(&mut self, write: Write) -> Result<(), ReadModelError> {
        self.pending.push(write);
        if self.pending.len() >= WRITES_PER_MESSAGE {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ReadModelError> {
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

    fn send(&mut self, message: Message) -> Result<(), ReadModelError> {
        let waiting = std::time::Instant::now();
        let sent = self.sender.send(message).map_err(|_| writer_gone());
        self.waited += waiting.elapsed();
        sent
    }

    /// Sends the question `ask` makes, after everything pushed before it, and waits for the
    /// answer.
    fn ask<T>(&mut self, ask: impl FnOnce(SyncSender<T>) -> Write) -> Result<T, ReadModelError> {
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
fn writer_gone() -> ReadModelError {
    ReadModelError::Worker {
        reason: "the rebuild's writer stopped".to_string(),
    }
}

/// The thread that owns the file being built and does every write the fold hands it, in order.
/// SQLite writes a file from one thread at a time; with the fold and the row building on
/// another, the two cores share the work instead of one doing all of it.
struct Writer {
    connection: Connection,
    /// What the writer measured of itself (`writer_for_fold`, `writer_indexing`).
    waits: RebuildWaits,
}

impl Writer {
    /// Creates the file exclusively: a name another rebuild is using is never shared (nor
    /// removed by this one).
    fn create_file(temporary: &Path) -> Result<(), ReadModelError> {
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
    fn open(temporary: &Path) -> Result<Self, ReadModelError> {
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
    fn write_all(mut self, feed: WriterFeed) -> Result<Option<RebuildWaits>, ReadModelError> {
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

    fn write(&mut self, write: &mut Write, feed: &WriterFeed) -> Result<(), ReadModelError> {
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

    fn finish(
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

fn begin(connection: &Connection) -> Result<(), ReadModelError> {
    connection
        .execute_batch("BEGIN IMMEDIATE")
        .map_err(|error| ReadModelError::sqlite("starting a rebuild transaction", error))
}

fn commit(connection: &Connection) -> Result<(), ReadModelError> {
    connection
        .execute_batch("COMMIT")
        .map_err(|error| ReadModelError::sqlite("committing a rebuild transaction", error))
}

/// Makes the finished temporary file durable and gives it its name, without replacing a file
/// that appeared there meanwhile.
fn publish(temporary: &Path, path: &Path) -> Result<(), ReadModelError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReadModelError::Create { path, source }
    };
    File::open(temporary)
        .and_then(|file| file.sync_all())
        .map_err(io(temporary))?;
    std::fs::hard_link(temporary, path).map_err(|source| match source.kind() {
        std::io::ErrorKind::AlreadyExists => ReadModelError::AlreadyExists {
            path: path.to_path_buf(),
        },
        _ => ReadModelError::Create {
            path: path.to_path_buf(),
            source,
        },
    })?;
    std::fs::remove_file(temporary).map_err(io(temporary))?;
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(directory)
        .and_then(|file| file.sync_all())
        .map_err(io(directory))
}

/// A name beside `path` for the file being built, unique to this process and call.
fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(
        ".rebuild-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    PathBuf::from(name)
}

fn remove_file_and_journal(path: &Path) {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        // Absent is the expected case; anything else leaves a stray temporary file, nothing more.
        let _ = std::fs::remove_file(PathBuf::from(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use opledger_domain::args::ArgsHash;
    use opledger_domain::ids::{AccountId, ActionName, ProviderId, TenantId};

    /// Distinct, evenly spread stand-ins for SHA-256 digests (splitmix64 of a counter, twice),
    /// the same on every run.
    fn digests(from: u64, count: u64) -> impl Iterator<Item = RequestDigest> {
        let mix = |mut value: u64| {
            value = value.wrapping_add(0x9e37_79b9_7f4a_7c15);
            value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            value ^ (value >> 31)
        };
        (from..from + count)
            .map(move |n| RequestDigest(u128::from(mix(2 * n)) << 64 | u128::from(mix(2 * n + 1))))
    }

    #[test]
    fn the_request_filter_full_of_a_ten_million_event_logs_requests_almost_never_says_maybe() {
        // A 10M-event log of three events per operation lets the window go of ~3.3 million
        // requests; each false "maybe" after that makes a rebuild build every index mid-way.
        // With six probes the filter said it ~7 times in a million (three times in a real 10M
        // rebuild); with twelve, ~8 times in a hundred million.
        let mut filter = RequestFilter::new();
        for key in digests(0, 3_300_000) {
            filter.insert(key);
        }
        assert!(digests(0, 1_000).all(|key| filter.may_contain(key)));
        let maybes = digests(1 << 40, 1_000_000)
            .filter(|key| filter.may_contain(*key))
            .count();
        assert!(maybes <= 1, "{maybes} false maybes in a million lookups");
    }

    /// 09:00 UTC on the given day.
    fn at_nine(year: i32, month: u32, day: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(year, month, day, 9, 0, 0)
            .single()
            .expect("valid")
    }

    fn query(operation: u128, at: DateTime<Utc>) -> SimilarIntentQuery {
        let window = Duration::seconds(POSSIBLE_DUPLICATE_WINDOW_S);
        SimilarIntentQuery {
            operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(operation)),
            tenant: TenantId::new("t").expect("valid"),
            provider: ProviderId::new("p").expect("valid"),
            account: AccountId::new("a").expect("valid"),
            action: ActionName::new("create").expect("valid"),
            args_hash: ArgsHash::parse(&format!("sha256:{}", "a".repeat(64))).expect("valid"),
            from: at - window,
            to: at + window,
            limit: duplicates::MAX_SIMILAR_INTENTS_CHECKED,
        }
    }

    fn intent(operation: u128, at: DateTime<Utc>) -> SimilarIntent {
        SimilarIntent {
            operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(operation)),
            source_id: None,
            recorded_at: at,
        }
    }

    #[test]
    fn the_window_answers_newest_first_without_the_asker_and_refuses_below_its_floor() {
        let base = at_nine(2026, 11, 30);
        let mut window = IntentWindow::new(MAX_WINDOW_INTENTS);
        for n in 1..=3 {
            window.insert(
                RequestDigest::of(&query(n, base)),
                intent(n, base + Duration::seconds(n as i64)),
            );
        }
        let WindowAnswer::Found(found) = window.find(
            RequestDigest::of(&query(2, base)),
            QueryBounds::of(&query(2, base)),
        ) else {
            panic!("nothing let go of yet");
        };
        let ids: Vec<_> = found.iter().map(|i| i.operation_id).collect();
        assert_eq!(
            ids,
            vec![
                OperationId::from_uuid(uuid::Uuid::from_u128(3)),
                OperationId::from_uuid(uuid::Uuid::from_u128(1)),
            ]
        );
        // Letting go of nothing (all are newer than the floor) keeps answering.
        window.raise_floor(base);
        assert!(matches!(
            window.find(
                RequestDigest::of(&query(9, base)),
                QueryBounds::of(&query(9, base))
            ),
            WindowAnswer::Found(_)
        ));
        // Letting go of the first two sends an overlapping query to the file.
        window.raise_floor(base + Duration::seconds(3));
        assert!(matches!(
            window.find(
                RequestDigest::of(&query(9, base)),
                QueryBounds::of(&query(9, base))
            ),
            WindowAnswer::AskTheFile
        ));
        let later = base + Duration::seconds(POSSIBLE_DUPLICATE_WINDOW_S + 3);
        assert!(matches!(
            window.find(
                RequestDigest::of(&query(9, later)),
                QueryBounds::of(&query(9, later))
            ),
            WindowAnswer::Found(_)
        ));
    }

    #[test]
    fn a_request_digest_tells_requests_apart_by_their_names_and_where_the_names_split() {
        let at = at_nine(2026, 12, 4);
        let asked = query(7, at);
        // Who asks and when is not the request.
        assert_eq!(
            RequestDigest::of(&asked),
            RequestDigest::of(&query(8, at + Duration::seconds(5)))
        );
        let mut other_action = asked.clone();
        other_action.action = ActionName::new("update").expect("valid");
        assert_ne!(RequestDigest::of(&asked), RequestDigest::of(&other_action));
        // The same bytes split differently between two names are another request.
        let split = |tenant: &str, provider: &str| {
            let mut split = asked.clone();
            split.tenant = TenantId::new(tenant).expect("valid");
            split.provider = ProviderId::new(provider).expect("valid");
            RequestDigest::of(&split)
        };
        assert_ne!(split("ab", "c"), split("a", "bc"));
    }

    #[test]
    fn an_intent_is_keyed_and_bounded_as_its_query_and_its_row_hash_is_the_one_made_from_the_row() {
        use opledger_domain::args::ArgsSnapshot;
        use opledger_domain::ids::{CredentialFingerprint, IdempotencyKey};
        let at = at_nine(2026, 12, 4);
        let args = ArgsSnapshot::parse(r#"{"title": "Call the client"}"#).expect("valid");
        let operation_id = OperationId::from_uuid(uuid::Uuid::from_u128(7));
        let intent = IntentRecorded {
            operation_id,
            tenant: TenantId::new("tenant").expect("valid"),
            owner: None,
            provider: ProviderId::new("crm").expect("valid"),
            account: AccountId::new("acct").expect("valid"),
            credential_fingerprint: CredentialFingerprint::new("fp").expect("valid"),
            action: ActionName::new("create_task").expect("valid"),
            args_hash: args.hash(),
            args,
            idempotency_key: IdempotencyKey::new("opk_1").expect("valid"),
            source_id: None,
            requires_approval: false,
            at,
        };
        let event = OperationEvent::IntentRecorded(intent.clone());
        let query = duplicates::similar_intent_query(operation_id, &event).expect("an intent");
        assert_eq!(RequestDigest::of_intent(&intent), RequestDigest::of(&query));
        assert_eq!(
            QueryBounds::of_intent(operation_id, &intent),
            QueryBounds::of(&query)
        );
        let from_row = sql::request_hash([
            intent.tenant.as_str(),
            intent.provider.as_str(),
            intent.account.as_str(),
            intent.action.as_str(),
            intent.args_hash.as_str(),
        ]);
        assert_eq!(RequestDigest::of_intent(&intent).row_hash(), from_row);
        // Another request, another hash: the hash is not a constant.
        let mut other = intent;
        other.action = ActionName::new("update_task").expect("valid");
        assert_ne!(RequestDigest::of_intent(&other).row_hash(), from_row);
    }

    #[test]
    fn a_writer_that_fails_answers_the_folds_question_with_an_error_instead_of_a_hang() {
        let dir = tempfile::tempdir().expect("temp dir");
        let temporary = dir.path().join("read.db.rebuild");
        let (mut writes, from_fold) = write_channel();
        let file = temporary.clone();
        let writer = std::thread::spawn(move || {
            Writer::create_file(&file)?;
            Writer::open(&file)?.write_all(from_fold)
        });
        // Creating the indexes twice fails the writer; the question waits behind it.
        writes.push(Write::CreateIndexes).expect("queued");
        writes.push(Write::CreateIndexes).expect("queued");
        let answer = writes.ask(|reply| Write::LoadState {
            operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(1)),
            reply,
        });
        assert!(
            matches!(answer, Err(ReadModelError::Worker { .. })),
            "the fold learns that its writer stopped: {answer:?}"
        );
        drop(writes);
        let written = writer.join().expect("the writer does not panic");
        assert!(
            matches!(written, Err(ReadModelError::Sqlite { .. })),
            "the writer reports its own error: {written:?}"
        );
    }

    /// Every row of the id-index tables and the gauges, in key order.
    fn id_tables(connection: &Connection) -> Vec<String> {
        let mut rows = Vec::new();
        for table in ["attempts", "sources", "external_ids", "gauges"] {
            let mut statement = connection
                .prepare(&format!("SELECT * FROM {table}"))
                .expect("select a table");
            let columns = statement.column_count();
            let mut found = statement
                .query_map([], |row| {
                    (0..columns)
                        .map(|column| row.get::<_, rusqlite::types::Value>(column))
                        .collect::<Result<Vec<_>, _>>()
                })
                .expect("read a table")
                .map(|row| format!("{table}: {:?}", row.expect("read a row")))
                .collect::<Vec<_>>();
            found.sort();
            rows.extend(found);
        }
        rows
    }

    #[test]
    fn id_entries_appended_then_merged_leave_the_rows_and_gauge_the_runners_upserts_leave() {
        use opledger_domain::ids::{AttemptId, ExternalObjectId, SourceId, WorkerId};
        use opledger_projections::id_index::ExternalIdRole::{Confirmed, Duplicate, Reported};
        let operation = |n: u128| OperationId::from_uuid(uuid::Uuid::from_u128(n));
        let at = at_nine(2026, 12, 3);
        let mut position = 0;
        let mut next = || {
            position += 1;
            GlobalPosition::new(position)
        };
        let named = |object: &str, by: u128, role, position| IdIndexChange::ExternalId {
            provider: ProviderId::new("crm").expect("valid"),
            account: AccountId::new("a").expect("valid"),
            external_id: ExternalObjectId::new(object).expect("valid"),
            operation_id: operation(by),
            role,
            position,
        };
        // In log order: one operation naming an object weakly, then strongly, then weakly again;
        // another naming it strongly first; an object three operations share; one named once.
        let entries = vec![
            named("task-1", 1, Reported, next()),
            IdIndexChange::Attempt {
                attempt_id: AttemptId::from_uuid(uuid::Uuid::from_u128(9)),
                operation_id: operation(1),
                number: 1,
                worker: WorkerId::new("w").expect("valid"),
                started_at: at,
                position: next(),
            },
            named("task-1", 1, Confirmed, next()),
            named("task-2", 2, Confirmed, next()),
            named("task-1", 1, Duplicate, next()),
            named("task-2", 2, Reported, next()),
            named("task-3", 3, Confirmed, next()),
            named("task-5", 7, Reported, next()),
            named("task-3", 4, Duplicate, next()),
            named("task-3", 5, Reported, next()),
            named("task-3", 4, Confirmed, next()),
            named("task-4", 1, Duplicate, next()),
            named("task-4", 6, Reported, next()),
            named("task-5", 7, Confirmed, next()),
            IdIndexChange::Source {
                tenant: TenantId::new("t").expect("valid"),
                source_id: SourceId::new("call-1").expect("valid"),
                operation_id: operation(1),
                position: next(),
            },
        ];
        let dir = tempfile::tempdir().expect("temp dir");
        let fresh = |name: &str| {
            let path = dir.path().join(name);
            Writer::create_file(&path).expect("a new file");
            schema::create_for_rebuild(&path, REBUILD_PAGE_SIZE, 1024).expect("a fresh file")
        };
        let upserted = fresh("upserted.db");
        for entry in &entries {
            apply::write_id_entry(&upserted, entry).expect("the runner's upsert");
        }
        let sorted = |flush: &[IdIndexChange]| {
            let mut flush = flush.to_vec();
            flush.sort_unstable_by(|left, right| {
                id_entry_key(left)
                    .cmp(&id_entry_key(right))
                    .then_with(|| id_entry_position(left).cmp(&id_entry_position(right)))
            });
            flush
        };
        let expected = id_tables(&upserted);
        assert!(
            expected.contains(&"gauges: [Text(\"shared_external_ids\"), Integer(2)]".to_string()),
            "two objects are shared: {expected:#?}"
        );
        // One flush, appended into the empty tables.
        let appended = fresh("appended.db");
        apply::write_sorted_id_entries(&appended, &sorted(&entries), apply::IdTables::Empty)
            .expect("appended");
        apply::write_shared_external_ids(&appended).expect("counted");
        assert_eq!(id_tables(&appended), expected);
        // Two flushes: the second names objects of the first again (task-3 by other
        // operations, task-5 by the same one, stronger) and is merged into filled tables.
        let (first, second) = entries.split_at(8);
        let merged = fresh("merged.db");
        apply::write_sorted_id_entries(&merged, &sorted(first), apply::IdTables::Empty)
            .expect("appended");
        apply::write_sorted_id_entries(&merged, &sorted(second), apply::IdTables::Filled)
            .expect("merged");
        apply::write_shared_external_ids(&merged).expect("counted");
        assert_eq!(id_tables(&merged), expected);
    }

    #[test]
    fn a_flush_is_handed_over_in_ranges_that_never_part_one_objects_entries() {
        use opledger_domain::ids::{ExternalObjectId, WorkerId};
        use opledger_projections::id_index::ExternalIdRole::{Confirmed, Duplicate, Reported};
        let operation = |n: u128| OperationId::from_uuid(uuid::Uuid::from_u128(n));
        let named = |object: &str, by: u128, role, position| IdIndexChange::ExternalId {
            provider: ProviderId::new("crm").expect("valid"),
            account: AccountId::new("a").expect("valid"),
            external_id: ExternalObjectId::new(object).expect("valid"),
            operation_id: operation(by),
            role,
            position: GlobalPosition::new(position),
        };
        let attempt = |n: u128| IdIndexChange::Attempt {
            attempt_id: opledger_domain::ids::AttemptId::from_uuid(uuid::Uuid::from_u128(n)),
            operation_id: operation(n),
            number: 1,
            worker: WorkerId::new("w").expect("valid"),
            started_at: at_nine(2026, 12, 4),
            position: GlobalPosition::new(100 + n as u64),
        };
        let (writes, feed) = write_channel();
        let limits = RebuildLimits {
            id_entries_per_drip: 1,
            ..RebuildLimits::default()
        };
        let mut rebuilder = Rebuilder::new(writes, limits);
        // In key order, as a flush sorts them: two attempts, then one object named three times
        // by two operations, then another object.
        rebuilder.id_index.extend([
            attempt(1),
            attempt(2),
            named("task-1", 1, Reported, 1),
            named("task-1", 1, Confirmed, 2),
            named("task-1", 2, Duplicate, 3),
            named("task-2", 3, Confirmed, 4),
        ]);
        rebuilder.write_id_index(false).expect("sorted and kept");
        for _ in 0..4 {
            rebuilder.drip_id_index(false).expect("handed over");
        }
        assert!(
            rebuilder.draining.is_none(),
            "the whole flush was handed over"
        );
        rebuilder.writes.flush().expect("sent");
        let Ok(Message::Writes(handed)) = feed.messages.try_recv() else {
            panic!("the ranges were sent");
        };
        let ranges: Vec<_> = handed
            .iter()
            .map(|write| match write {
                Write::IdIndex { range, append, .. } => (range.clone(), *append),
                _ => panic!("only id-index ranges"),
            })
            .collect();
        assert_eq!(
            ranges,
            vec![(0..1, true), (1..2, true), (2..5, true), (5..6, true)],
            "one range per entry, except the object three entries name, in one range"
        );
    }

    #[test]
    fn a_window_full_of_intents_recorded_at_one_time_lets_them_all_go_and_asks_the_file() {
        let at = at_nine(2026, 11, 30);
        let mut window = IntentWindow::new(2);
        for n in 1..=5 {
            window.insert(RequestDigest::of(&query(n, at)), intent(n, at));
            assert!(window.entries <= 2, "the window keeps within its limit");
        }
        assert!(matches!(
            window.find(
                RequestDigest::of(&query(9, at)),
                QueryBounds::of(&query(9, at))
            ),
            WindowAnswer::AskTheFile
        ));
    }
}
