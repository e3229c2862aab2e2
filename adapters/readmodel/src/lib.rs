//! The read-model store: the projections' read models in their own SQLite file, fed from the
//! ledger's global log by a checkpointed runner.
//!
//! What people and services query — operations by state, the review queue, duplicates, the
//! attempt/external/source id index, metrics — is folded by the pure folds of
//! `opledger_projections` and written here. The file is disposable: it can always be rebuilt
//! from position zero ([`rebuild`]), and nothing in it is ever a ground for a decision, because it
//! lags the log.
//!
//! The one promise it must never break: every event of the log is applied exactly once. Each
//! batch's changes and the checkpoint (the position of the last event applied) are committed in
//! one SQLite transaction with `synchronous=FULL`, so after a crash the file holds either all of a
//! batch or none of it, and the runner resumes right after the checkpoint. Events at or below the
//! checkpoint are skipped, and an event that does not continue its operation's stream stops the
//! runner instead of being folded. It must never run a blocking SQLite call on an async executor
//! thread: [`ReadModelStore`] is blocking, and [`ReadModels`] moves each call to a blocking thread.
//!
//! - `schema.rs`: opening the file, its settings, the schema and its version;
//! - `apply.rs`: one batch of events → one transaction;
//! - `query.rs`: the query API;
//! - `as_of.rs`: listings and the review queue as of a past moment, folded from the log;
//! - `runner.rs`: the async handle, the runner and the lag;
//! - `rebuild/`: the rebuild from position zero into a fresh file, folded in memory;
//! - `floor.rs`: what SQLite alone costs to write a rebuild's rows (a measurement);
//! - `catch_up.rs`: a bounded catch-up to a position, and a table-by-table comparison of files;
//! - `work.rs`: the durable work queue the workers read (what is due, when);
//! - `swap.rs`: the lock that lets `opledger replay` replace a read-model file nobody has open.

mod apply;
mod as_of;
mod catch_up;
mod floor;
mod query;
mod rebuild;
mod review;
mod runner;
mod schema;
mod sql;
mod state_codec;
mod supervise;
mod swap;
pub mod terms;
mod work;
mod writeback;

use std::path::{Path, PathBuf};
use std::time::Duration;

use opledger_domain::codec::DecodeError;
use opledger_domain::ids::{EventId, GlobalPosition};
use opledger_domain::store::{RecordedEvent, StoreError};
use opledger_projections::context::FoldError;
use rusqlite::{Connection, OptionalExtension};

pub use apply::BatchOutcome;
pub use as_of::{
    Moment, PastLimits, PastReadModels, PastScope, MAX_AS_OF_FOLD_EVENTS, MAX_AS_OF_OPERATIONS,
};
pub use catch_up::{
    catch_up, check_ledger, compare_files, is_read_model_file, CatchUpProgress, TableDifference,
};
pub use floor::{FloorLayout, FloorPhase, FloorRows, FloorWritten, MAX_FLOOR_ROWS};
pub use query::{
    AttemptStats, DuplicatesReport, Metrics, OldestUnresolved, OperationCursor, OperationFilter,
    OperationPage, ReviewItem, ScopeNumbers, SharedExternalId, Shown,
};
pub use rebuild::{
    rebuild, rebuild_to, rebuild_to_with, RebuildLimits, RebuildReport, RebuildWaits,
    ID_ENTRIES_PER_DRIP, MAX_BUFFERED_ID_ENTRIES, MAX_OPEN_OPERATIONS, MAX_WINDOW_INTENTS,
    REBUILD_COMMIT_EVENTS,
};
pub use review::{ReviewCursor, ReviewFilter, ReviewOrder, ReviewPage, REVIEW_STATES};
pub use runner::{
    Lag, ReadModelRunner, ReadModels, RunReport, MAX_LINGER_MS, RUNNER_BUFFER_EVENTS,
};
pub use supervise::{
    RunnerHealth, RunnerHealthReport, RunnerState, RUNNER_RETRY_FIRST_MS, RUNNER_RETRY_MAX_MS,
    RUNNER_STALL_MS,
};
pub use swap::{lock_path, replace_read_models};

/// The schema version this build creates and reads (`PRAGMA user_version`). Raise it whenever
/// a table or the stored form of an operation's folded state changes. An addition that can be
/// filled from what a file already holds is migrated in place when the file is opened (version
/// 2 added the gauges, version 3 the durable work queue, version 4 converted the stored folded
/// states from JSON to the compact form of `state_codec.rs` and made the id index's tables
/// `WITHOUT ROWID`, version 5 indexed the requests of intents by a stored hash, version 6 added
/// the search terms of `terms.rs`); anything else
/// would need a rebuild
/// from the log, the source of truth.
pub const SCHEMA_VERSION: i64 = 6;
/// Most events one batch may carry, and so one transaction; bounds the runner's memory and how
/// long a query waits behind a commit.
pub const MAX_BATCH_EVENTS: usize = 4096;
/// Most rows one query returns.
pub const MAX_QUERY_ROWS: usize = 1000;
/// How long a connection waits for a lock held by another connection before failing, in ms.
pub const BUSY_TIMEOUT_MS: u64 = 5_000;

/// What went wrong with the read models. None of these leaves a batch half-applied.
#[derive(Debug, thiserror::Error)]
pub enum ReadModelError {
    /// The file was written by a newer opledger.
    #[error("read-model file `{path}` uses schema version {found}; this opledger supports up to {supported}. Upgrade opledger, or rebuild the read models into a new file")]
    IncompatibleSchema {
        /// The file.
        path: PathBuf,
        /// The schema version found.
        found: i64,
        /// The newest schema version this build knows.
        supported: i64,
    },
    /// The file is another program's database.
    #[error("`{path}` is an SQLite database that opledger did not create (it has tables but no schema version); refusing to write into it")]
    ForeignDatabase {
        /// The file.
        path: PathBuf,
    },
    /// The read models have applied more of a log than the ledger holds: they were built from
    /// another ledger file (or the ledger was cut), and every answer from them would be wrong.
    #[error("the read models are at position {checkpoint} but the ledger ends at {head}: they belong to another ledger file (or events were removed). Rebuild them with `opledger replay`, or pass the right --db / --read-models")]
    AheadOfLedger {
        /// The read models' checkpoint.
        checkpoint: u64,
        /// The ledger's last position (0: empty).
        head: u64,
    },
    /// The read models were built from a ledger whose first event differs from this one's.
    #[error("the read models in `{path}` were built from another ledger (its first event differs); rebuild them with `opledger replay`, or pass the right --db / --read-models")]
    AnotherLedger {
        /// The read-model file.
        path: PathBuf,
    },
    /// A rebuild was pointed at a file that exists.
    #[error("`{path}` already exists; a rebuild writes a fresh file, so remove it or choose another path")]
    AlreadyExists {
        /// The file.
        path: PathBuf,
    },
    /// A read-model file cannot be replaced: another process has it open.
    #[error("`{path}` is open in another process (a worker, a service or a query); stop it and run `opledger replay` again, or pass --read-models to replay into another file")]
    InUse {
        /// The read-model file.
        path: PathBuf,
    },
    /// An older read-model file must be upgraded, and another process has it open.
    #[error("`{path}` holds read models of schema version {found}; this opledger upgrades them to version {SCHEMA_VERSION} when it opens them, and only while no other process has them open (an older opledger would not see the upgrade). Stop the other opledger processes using them (an older `opledger serve`, workers, queries) and try again")]
    UpgradeBlocked {
        /// The read-model file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
    },
    /// A read-model file stayed locked by a replacement for longer than [`BUSY_TIMEOUT_MS`].
    #[error("`{path}` is being replaced by `opledger replay` and stayed locked for over {BUSY_TIMEOUT_MS} ms; try again")]
    BeingReplaced {
        /// The read-model file.
        path: PathBuf,
    },
    /// A read-model file's lock file cannot be opened or locked.
    #[error("cannot lock `{path}`: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A rebuild's new file cannot be created.
    #[error("cannot create `{path}`: {source}")]
    Create {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// SQLite failed.
    #[error("read-model database error while {context}: {source}")]
    Sqlite {
        /// What was being done.
        context: String,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// Stored data is not what this build wrote.
    #[error("read-model data is corrupt: {reason}; rebuild the read models")]
    Corrupt {
        /// What is wrong.
        reason: String,
    },
    /// The event store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An event of the log cannot be decoded.
    #[error("the event at position {position} cannot be read: {source}")]
    Decode {
        /// Its position.
        position: GlobalPosition,
        /// Why.
        #[source]
        source: DecodeError,
    },
    /// An event cannot be folded into the read models.
    #[error("the event at position {position} cannot be applied: {source}")]
    Fold {
        /// Its position.
        position: GlobalPosition,
        /// Why.
        #[source]
        source: FoldError,
    },
    /// A batch is not in position order after the checkpoint.
    #[error("position {found} does not follow {last} in the batch; events must come in log order")]
    OutOfOrder {
        /// The last position accepted.
        last: GlobalPosition,
        /// The position offered after it.
        found: GlobalPosition,
    },
    /// A batch is over the limit.
    #[error("a batch of {events} events is over the limit of {MAX_BATCH_EVENTS}")]
    BatchTooLarge {
        /// Its size.
        events: usize,
    },
    /// A listing as of a moment would fold more of the log, or hold more operations, than its
    /// limits allow.
    #[error("{reason}")]
    AsOfBeyondLimit {
        /// Which limit, and what to ask instead.
        reason: String,
    },
    /// A query's input is invalid.
    #[error("invalid query: {reason}")]
    InvalidQuery {
        /// What is wrong, in a sentence.
        reason: String,
    },
    /// The blocking thread running a call failed (it panicked or the runtime is shutting down).
    #[error("the read-model worker failed: {reason}")]
    Worker {
        /// What happened.
        reason: String,
    },
}

impl ReadModelError {
    fn sqlite(context: impl Into<String>, source: rusqlite::Error) -> Self {
        Self::Sqlite {
            context: context.into(),
            source,
        }
    }
}

/// The read models in one SQLite file: blocking, one connection. Use [`ReadModels`] from async
/// code.
#[derive(Debug)]
pub struct ReadModelStore {
    connection: Connection,
    path: PathBuf,
    /// Held while the file is open, so `opledger replay` never renames a file over it (see
    /// `swap.rs`). Declared after the connection: fields drop in order, so the connection is
    /// closed (its write-ahead log folded in) before the lock is released.
    _lock: swap::ViewsLock,
    /// What each batch folds into, kept with its capacity (see [`apply::BatchScratch`]).
    batch_scratch: apply::BatchScratch,
}

impl ReadModelStore {
    /// Opens the read models in the file at `path`, creating the file and the schema if needed.
    /// A file from a newer opledger or from another program is refused and left unmodified.
    /// While open it holds a shared lock on `<path>.lock` (created if needed): a replacement of
    /// the file ([`replace_read_models`]) is refused while any store has it open, and an open waits
    /// for a replacement in progress to end (at most [`BUSY_TIMEOUT_MS`]). A file of an older
    /// schema version is upgraded first, holding that lock exclusively: if another process keeps
    /// the file open for longer than [`BUSY_TIMEOUT_MS`], the open fails with
    /// [`ReadModelError::UpgradeBlocked`] and the file is left as it was.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ReadModelError> {
        let path = path.as_ref().to_path_buf();
        // Upgraded in place, only when alone: a process of the older build that has the file
        // open would never notice, and would go on writing batches without the new tables.
        if let Some(found) = schema::older_version(&path)? {
            let alone = swap::exclusive_within(&path, Duration::from_millis(BUSY_TIMEOUT_MS))?
                .ok_or_else(|| ReadModelError::UpgradeBlocked {
                    path: path.clone(),
                    found,
                })?;
            // The conversion reads and rewrites every row in one transaction (~10 s for a
            // million operations), and the command says nothing meanwhile: say why it waits. An
            // interrupted upgrade leaves the file as it was.
            tracing::warn!(path = %path.display(), from = found, to = SCHEMA_VERSION,
                "upgrading the read models' schema; this rewrites every row once and may take a \
                 while on a large file (about 10 s per million operations)");
            let started = std::time::Instant::now();
            drop(schema::open(&path)?);
            drop(alone);
            tracing::info!(path = %path.display(), elapsed_ms = started.elapsed().as_millis(),
                "read models upgraded");
        }
        let lock = swap::shared(&path)?;
        let connection = schema::open(&path)?;
        Ok(Self {
            connection,
            path,
            _lock: lock,
            batch_scratch: apply::BatchScratch::default(),
        })
    }

    /// The file the read models live in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The position of the last event applied (`None`: nothing yet).
    pub fn checkpoint(&self) -> Result<Option<GlobalPosition>, ReadModelError> {
        apply::read_checkpoint(&self.connection)
    }

    /// Ties the read models to one ledger by the id of its first event, remembered on first use:
    /// a read-model file reused after its ledger was replaced would otherwise skip the new ledger's
    /// events up to the old checkpoint and answer with the old ledger's operations. `first` is
    /// the ledger's first event id now (`None`: the ledger is empty). The identity lives in its own
    /// table, outside the read models proper, so rebuilds and comparisons ignore it.
    pub fn check_ledger_identity(&self, first: Option<EventId>) -> Result<(), ReadModelError> {
        self.connection
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS ledger_identity (first_event_id BLOB NOT NULL) STRICT",
            )
            .map_err(|error| ReadModelError::sqlite("preparing the ledger identity", error))?;
        let stored: Option<Vec<u8>> = self
            .connection
            .query_row(
                "SELECT first_event_id FROM ledger_identity LIMIT 1",
                [],
                |row| row.get(0),
            )
            .optional()
            .map_err(|error| ReadModelError::sqlite("reading the ledger identity", error))?;
        let now = first.map(|id| id.as_uuid().as_bytes().to_vec());
        match (stored, now) {
            (Some(stored), Some(now)) if stored == now => Ok(()),
            (None, Some(now)) => self
                .connection
                .execute(
                    "INSERT INTO ledger_identity (first_event_id) VALUES (?1)",
                    [now],
                )
                .map(drop)
                .map_err(|error| ReadModelError::sqlite("recording the ledger identity", error)),
            (None, None) => Ok(()),
            (Some(_), _) => Err(ReadModelError::AnotherLedger {
                path: self.path.clone(),
            }),
        }
    }

    /// Decodes and folds `events` (in log order) and writes every read model's changes and the
    /// new checkpoint in one transaction. Events at or below the checkpoint are skipped, so
    /// handing the same events over again applies nothing twice. On any error nothing of the
    /// batch is written.
    pub fn apply_batch(
        &mut self,
        events: &[RecordedEvent],
    ) -> Result<BatchOutcome, ReadModelError> {
        apply::apply_batch(&mut self.connection, events, &mut self.batch_scratch)
    }
}
