//! The embedded event store: one SQLite file in WAL mode with `synchronous=FULL`.
//!
//! One writer thread owns the only read-write connection and commits queued appends in groups
//! (see `sqlite/writer.rs`), so concurrent callers share one fsync and positions increase in commit
//! order. Reads go through a small pool of read-only connections on blocking threads (see
//! `sqlite/reader.rs`) and never wait for the writer. Subscriptions read the log after their last
//! position and wait on a `watch` channel the writer updates after each commit; one that follows
//! the head takes the writer's newest events from memory instead of the file (`sqlite/recent.rs`).
//!
//! It must never acknowledge an append before the COMMIT that holds it has returned, never write
//! to a file it did not create or cannot read the schema of, and never run a blocking SQLite call
//! on an async executor thread. Several openers of one file (other processes included) are safe:
//! every write runs under SQLite's write lock and rechecks the stream's version. Group commit
//! only groups one opener's appends, and another opener's commits do not notify this store's
//! subscriptions; a caught-up subscription therefore also looks at the log every
//! `UNANNOUNCED_POLL_MS` (see the subscription module), so it finds them within that delay.

mod checkpointer;
mod codec;
mod reader;
mod recent;
mod schema;
mod tenant_trees;
mod tree;

pub use self::tree::{LogMarks, StreamAhead};
mod writer;

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use opledger_domain::ids::{GlobalPosition, StreamVersion};
use opledger_domain::merkle::{Hash, LogTree, TenantHeads};
use opledger_domain::store::{
    AppendOutcome, EventData, EventStore, EventView, ExpectedVersion, LogStart, RecordedEvent,
    StoreError, StreamName, Subscription,
};
use tokio::sync::{mpsc, watch};

use self::reader::ReadPool;
use self::recent::RecentEvents;
use self::writer::{AppendRequest, CommitCounters};
use super::subscription::{CatchUp, LogSource};
use opledger_store_core::queue::{self, WriterGone};

/// The schema version this build creates and reads (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;
/// Most appends waiting for the writer; callers beyond it wait for room (back-pressure).
pub const APPEND_QUEUE_CAPACITY: usize = 1024;
/// Most appends one group commit carries.
pub const MAX_APPENDS_PER_COMMIT: usize = 256;
/// Read-only connections in the reader pool, and so the most reads running at once.
pub const READ_POOL_SIZE: usize = 4;
/// How long a connection waits for a lock held by another connection before failing, in ms.
pub const BUSY_TIMEOUT_MS: u64 = 5_000;

/// The SQLite event store. Cloning gives another handle to the same store; the store shuts down
/// when [`SqliteStore::close`] is called or the last handle is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    /// The writer's queue; `None` once the store is closed.
    appends: Mutex<Option<mpsc::Sender<AppendRequest>>>,
    /// The writer thread, until someone waits for it to finish.
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Arc<ReadPool>,
    /// The events the writer committed last, for subscriptions that follow the head.
    recent: Arc<RecentEvents>,
    /// The newest committed position, as the writer published it.
    head: watch::Receiver<Option<GlobalPosition>>,
    counters: Arc<CommitCounters>,
}

/// How a [`SqliteStore`] is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Whether the transparency log's tree, and the tenants' trees beside it, grow with the log,
    /// in the same commits (the default). Off only to measure what it costs, on a file of its own: a file written with it
    /// off from the start gets its tree from the log when opened with it on, but one that had a
    /// tree refuses appends with it on again (the tree cannot tell the events it missed from
    /// events inserted behind the ledger's back).
    pub log_tree: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self { log_tree: true }
    }
}

/// How well group commit is working: commits that wrote events, and the appends they wrote.
/// `appends / commits` is the average number of callers that shared one fsync. Appends that
/// wrote nothing (refused, or already stored) are not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Transactions committed that wrote at least one event.
    pub commits: u64,
    /// Appends written by those transactions.
    pub appends: u64,
}

impl SqliteStore {
    /// Opens the store in the file at `path`, creating the file and the schema if needed.
    ///
    /// It is async because opening reads the file (and may recover a WAL left by a crash): the
    /// work runs on a blocking thread, not the caller's executor thread. Fails with
    /// [`StoreError::IncompatibleSchema`] for a file from a newer opledger,
    /// [`StoreError::Corrupt`] for a file that is not an SQLite database, and
    /// [`StoreError::Unavailable`] when the file cannot be opened, is another program's database,
    /// or cannot be put in WAL mode. A refused file is left unmodified.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// [`SqliteStore::open`] with options.
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(path, options))
            .await
            .map_err(|error| StoreError::Unavailable {
                reason: format!("opening the store failed: {error}"),
            })?
    }

    fn open_blocking(path: PathBuf, options: SqliteOptions) -> Result<Self, StoreError> {
        let connection = schema::open_writer(&path)?;
        let head = schema::head_position(&connection)?;
        if options.log_tree {
            tree::catch_up_at_open(&connection, head)?;
        }
        let readers = (0..READ_POOL_SIZE)
            .map(|_| schema::open_reader(&path))
            .collect::<Result<Vec<_>, _>>()?;
        let (head_sender, head_receiver) = watch::channel(head);
        let (append_sender, append_receiver) = mpsc::channel(APPEND_QUEUE_CAPACITY);
        let counters = Arc::new(CommitCounters::default());
        let recent = Arc::new(RecentEvents::new(head));
        let writer = writer::spawn(
            connection,
            &path,
            append_receiver,
            head_sender,
            Arc::clone(&recent),
            Arc::clone(&counters),
            options.log_tree,
        )?;
        tracing::debug!(path = %path.display(), ?head, "sqlite event store opened");
        Ok(Self {
            shared: Arc::new(Shared {
                readers: Arc::new(ReadPool::new(path.clone(), readers)),
                recent,
                path,
                appends: Mutex::new(Some(append_sender)),
                writer: Mutex::new(Some(writer)),
                head: head_receiver,
                counters,
            }),
        })
    }

    /// Closes the store for every handle: appends already queued are committed and answered,
    /// later calls fail with [`StoreError::Closed`], and so do subscriptions, from their next
    /// read or wait on; the file is left with its WAL checkpointed. Waits for
    /// the writer thread to finish; if another handle closed the store first, returns at once.
    pub async fn close(self) -> Result<(), StoreError> {
        let Some(writer) = self.shared.shut_down() else {
            return Ok(());
        };
        let joined = tokio::task::spawn_blocking(move || writer.join())
            .await
            .map_err(|error| StoreError::Unavailable {
                reason: format!("waiting for the writer failed: {error}"),
            })?;
        joined.map_err(|_| StoreError::Unavailable {
            reason:
                "the writer thread panicked; appends it had not answered may or may not be stored"
                    .into(),
        })
    }

    /// Counts of commits and of the appends they carried since the store was opened.
    pub fn commit_stats(&self) -> CommitStats {
        self.shared.counters.snapshot()
    }

    /// What the file remembers of its log beside the events: the highest position it handed
    /// out and the streams whose last version has no event (what `opledger verify` checks a
    /// removed tail against).
    pub async fn log_marks(&self) -> Result<LogMarks, StoreError> {
        self.shared.readers.run(tree::log_marks).await
    }

    /// The file this store keeps its events in.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    fn ensure_open(&self) -> Result<(), StoreError> {
        if lock(&self.shared.appends).is_some() {
            Ok(())
        } else {
            Err(StoreError::Closed)
        }
    }
}

impl Shared {
    /// Stops accepting work and returns the writer thread, if nobody has taken it yet.
    fn shut_down(&self) -> Option<JoinHandle<()>> {
        // Readers first: the last connection to close checkpoints the WAL into the file and
        // removes it, and only the writer's connection can do that.
        self.readers.close();
        // Dropping our sender lets the writer finish the queue and stop once every append in
        // flight (which holds a clone of the sender) has been queued.
        drop(lock(&self.appends).take());
        lock(&self.writer).take()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let Some(writer) = self.shut_down() else {
            return;
        };
        // Outside an async runtime, wait for the writer to finish the queued appends. Inside one,
        // blocking here could stall the very tasks the writer waits for, so the writer finishes
        // on its own; callers that must know when it is done use `close().await`.
        if tokio::runtime::Handle::try_current().is_err() && writer.join().is_err() {
            tracing::error!("the SQLite writer thread panicked");
        }
    }
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

/// The tree is read on the reader pool (stored hashes never change once committed, so a reader
/// that sees a size sees every hash below it); checkpoints are kept through a connection of
/// their own, opened for the one insert, since the writer thread only appends events.
impl LogTree for SqliteStore {
    async fn tree_size(&self) -> Result<u64, StoreError> {
        self.shared.readers.run(tree::size).await
    }

    async fn stored_hashes(&self, indexes: Vec<u64>) -> Result<Vec<Hash>, StoreError> {
        self.shared
            .readers
            .run(move |connection| tree::read(connection, &indexes))
            .await
    }

    async fn keep_checkpoint(&self, size: u64, note: String) -> Result<(), StoreError> {
        self.ensure_open()?;
        let path = self.shared.path.clone();
        tokio::task::spawn_blocking(move || {
            let connection = schema::open_side_writer(&path)?;
            tree::keep_checkpoint(&connection, size, &note)
        })
        .await
        .map_err(|error| StoreError::Unavailable {
            reason: format!("keeping the checkpoint failed: {error}"),
        })?
    }

    async fn kept_checkpoint(
        &self,
        size: Option<u64>,
    ) -> Result<Option<(u64, String)>, StoreError> {
        self.shared
            .readers
            .run(move |connection| tree::kept_checkpoint(connection, size))
            .await
    }

    async fn tenant_heads(&self) -> Result<Option<TenantHeads>, StoreError> {
        self.shared.readers.run(tenant_trees::tenant_heads).await
    }
}

impl EventStore for SqliteStore {
    type Subscription = SqliteSubscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        let gone = WriterGone {
            stopped: "the SQLite writer thread has stopped; reopen the store",
            unanswered: "the SQLite writer thread stopped before answering",
        };
        queue::append(&self.shared.appends, &gone, stream, expected, events).await
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.shared
            .readers
            .read_stream(stream, from, max_count)
            .await
    }

    async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        self.shared.readers.read_all(start, max_count).await
    }

    /// Decodes nothing into [`RecordedEvent`]s: `visit` reads each row's bytes where SQLite
    /// holds them, on the reading thread.
    async fn read_all_with<T, F>(
        &self,
        start: LogStart,
        max_count: usize,
        visit: F,
        into: Vec<T>,
    ) -> Result<Vec<T>, StoreError>
    where
        T: Send + 'static,
        F: FnMut(EventView<'_>) -> T + Send + 'static,
    {
        self.shared
            .readers
            .read_all_with(start, max_count, visit, into)
            .await
    }

    /// Answered from the position the writer publishes after each commit, without a query: the
    /// writer is the only one that moves it, and publishes before acknowledging.
    async fn head_position(&self) -> Result<Option<GlobalPosition>, StoreError> {
        self.ensure_open()?;
        Ok(*self.shared.head.borrow())
    }

    async fn subscribe_all(&self, start: LogStart) -> Result<SqliteSubscription, StoreError> {
        self.ensure_open()?;
        let source = LogFeed {
            recent: Arc::clone(&self.shared.recent),
            readers: Arc::clone(&self.shared.readers),
        };
        Ok(SqliteSubscription {
            inner: CatchUp::new(source, start, self.shared.head.clone()),
        })
    }
}

/// A catch-up subscription to a [`SqliteStore`]'s log. It does not keep the store open: once the
/// store is closed or its last handle dropped, `next` fails with [`StoreError::Closed`].
pub struct SqliteSubscription {
    inner: CatchUp<LogFeed>,
}

/// What a subscription reads the log through: the writer's recent window when it holds every
/// event asked for, the file otherwise (see `sqlite/recent.rs`).
struct LogFeed {
    recent: Arc<RecentEvents>,
    readers: Arc<ReadPool>,
}

impl LogSource for LogFeed {
    async fn read_log(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        // A closed store answers nothing, from memory either.
        if self.readers.is_closed() {
            return Err(StoreError::Closed);
        }
        match self.recent.after(start, max_count) {
            Some(events) => Ok(events),
            None => self.readers.read_all(start, max_count).await,
        }
    }
}

impl std::fmt::Debug for SqliteSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteSubscription").finish_non_exhaustive()
    }
}

impl Subscription for SqliteSubscription {
    async fn next(&mut self) -> Result<RecordedEvent, StoreError> {
        self.inner.next().await
    }
}

/// Maps a SQLite error to the port's: a file that is not a database or fails SQLite's own
/// checks is corrupt, anything else makes the store unavailable. `context` says what was being
/// done.
fn sqlite_error(context: impl Display, error: rusqlite::Error) -> StoreError {
    match error.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
            StoreError::Corrupt {
                reason: format!("{context}: {error}"),
            }
        }
        _ => StoreError::Unavailable {
            reason: format!("{context}: {error}"),
        },
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values (an optional sender, an optional join handle) are replaced whole, so a
    // panic elsewhere cannot leave them half-changed.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tree_tests;
