//! The writer thread: the only place that writes to the file, committing appends in groups.
//!
//! Callers queue appends on a bounded channel. The thread takes the first, drains whatever else
//! is already queued (up to [`MAX_APPENDS_PER_COMMIT`]), and runs them all in one
//! `BEGIN IMMEDIATE … COMMIT`, so concurrent callers share one fsync. Every refusal (a conflict, a
//! reused event id) is decided before that append writes anything, so a refused append costs the
//! others nothing; a storage failure rolls the whole batch back. Being the single writer is
//! what makes positions increase in commit order, which subscriptions rely on.
//!
//! It must never answer an append with success before the COMMIT that made it durable has
//! returned, and it must never let a statement run outside the batch's transaction.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::store::{AppendOutcome, EventView, RecordedEvent, StoreError, StreamName};
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::{mpsc, watch};

use super::checkpointer::Checkpointer;
use super::codec;
use super::recent::RecentEvents;
use super::schema;
use super::tenant_trees::StreamTenants;
use super::tree::TreeAppender;
use super::{sqlite_error, CommitStats, MAX_APPENDS_PER_COMMIT};
use crate::rules::{self, AppendPlan};

pub(super) use opledger_store_core::queue::AppendRequest;

/// Counts of commits that wrote events and of the appends they wrote, for benchmarks.
#[derive(Debug, Default)]
pub(super) struct CommitCounters {
    commits: AtomicU64,
    appends: AtomicU64,
}

impl CommitCounters {
    pub(super) fn snapshot(&self) -> CommitStats {
        // Two relaxed loads may straddle a commit; the pair is a statistic, not an invariant.
        CommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            appends: self.appends.load(Ordering::Relaxed),
        }
    }
}

/// Starts the writer thread. It runs until every sender of `requests` is dropped and the queue
/// is empty, then closes the connection.
pub(super) fn spawn(
    connection: Connection,
    path: &Path,
    requests: mpsc::Receiver<AppendRequest>,
    head: watch::Sender<Option<GlobalPosition>>,
    recent: Arc<RecentEvents>,
    counters: Arc<CommitCounters>,
    log_tree: bool,
) -> Result<JoinHandle<()>, StoreError> {
    let span = tracing::debug_span!("sqlite_writer", path = %path.display());
    let checkpointer = Checkpointer::spawn(path)?;
    std::thread::Builder::new()
        .name("opledger-sqlite-writer".into())
        .spawn(move || {
            let _entered = span.entered();
            let writer = Writer {
                connection,
                head,
                recent,
                counters,
                checkpointer,
                log_tree,
                stream_tenants: std::cell::RefCell::default(),
            };
            let checkpointer = writer.run(requests);
            // Its connection must close before the writer's, so that the writer's is the last
            // one and checkpoints and removes the WAL on close.
            checkpointer.stop();
        })
        .map_err(|error| StoreError::Unavailable {
            reason: format!("cannot start the SQLite writer thread: {error}"),
        })
}

struct Writer {
    connection: Connection,
    head: watch::Sender<Option<GlobalPosition>>,
    /// The newest committed events, for subscriptions that follow the head.
    recent: Arc<RecentEvents>,
    counters: Arc<CommitCounters>,
    checkpointer: Checkpointer,
    /// Whether the transparency log's tree grows with the log (see `tree.rs`).
    log_tree: bool,
    /// Each stream's tenant, remembered across commits for the tenant trees.
    stream_tenants: std::cell::RefCell<StreamTenants>,
}

/// What one append did inside the batch's transaction.
enum Applied {
    /// It wrote its events, at these positions and versions (in order, at least one); durable
    /// once the batch commits.
    Written(Vec<(GlobalPosition, StreamVersion)>),
    /// Its events were already stored (a retry); it wrote nothing.
    AlreadyStored(AppendOutcome),
}

impl Applied {
    fn outcome(&self) -> AppendOutcome {
        match self {
            Self::Written(placed) => {
                let &(position, next_expected) = placed.last().expect(
                    "an append carries at least one event; check_append refused empty ones",
                );
                AppendOutcome {
                    next_expected,
                    position,
                }
            }
            Self::AlreadyStored(outcome) => *outcome,
        }
    }
}

/// A batch applied inside its transaction, not yet committed.
struct BatchApplied {
    /// The log's last position before the batch, read under the write lock.
    log_head_before: Option<GlobalPosition>,
    /// Each append's result, in order.
    results: Vec<Result<Applied, StoreError>>,
}

/// Why one append did not apply.
enum Failure {
    /// The append was refused (conflict, reused event id) before it wrote anything.
    Refused(StoreError),
    /// Storage failed; the whole batch is rolled back.
    Storage(StoreError),
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Self::Storage(error)
    }
}

impl Writer {
    /// Commits appends until the queue closes; hands back the checkpointer to be stopped.
    fn run(self, mut requests: mpsc::Receiver<AppendRequest>) -> Checkpointer {
        let mut batch = Vec::with_capacity(MAX_APPENDS_PER_COMMIT);
        // `blocking_recv_many` waits for the first request, then takes whatever else is queued:
        // that drain is the group commit. It returns 0 only once the channel is closed and empty.
        while requests.blocking_recv_many(&mut batch, MAX_APPENDS_PER_COMMIT) > 0 {
            let answers = self.commit(&mut batch);
            debug_assert_eq!(answers.len(), batch.len());
            for (request, answer) in batch.drain(..).zip(answers) {
                // A caller that stopped waiting dropped its receiver; its append stands anyway.
                let _ = request.reply.send(answer);
            }
        }
        tracing::debug!("append queue closed; the writer stops");
        self.checkpointer
    }

    /// Runs `batch` in one transaction and returns each append's answer, in order. The events
    /// it wrote move into the recent window once committed.
    fn commit(&self, batch: &mut [AppendRequest]) -> Vec<Result<AppendOutcome, StoreError>> {
        let BatchApplied {
            log_head_before,
            results: applied,
        } = match self.apply_all(batch) {
            Ok(applied) => applied,
            Err(error) => {
                self.roll_back();
                tracing::warn!(%error, appends = batch.len(), "group commit rolled back");
                return vec![Err(error); batch.len()];
            }
        };
        if let Err(error) = exec(&self.connection, "COMMIT") {
            self.roll_back();
            tracing::warn!(%error, appends = batch.len(), "group commit failed");
            // A failed COMMIT may still have reached the disk (an fsync that failed after the
            // write), so a success becomes "unknown", never "done". Refusals stay refusals.
            let reason = format!("the commit failed: {error}");
            return applied
                .into_iter()
                .zip(batch.iter())
                .map(|(applied, request)| match applied {
                    Ok(_) => Err(StoreError::AppendOutcomeUnknown {
                        stream: request.stream.clone(),
                        reason: reason.clone(),
                    }),
                    Err(refusal) => Err(refusal),
                })
                .collect();
        }

        let mut written = 0_u64;
        let mut newest = None;
        let mut recorded = Vec::new();
        for (applied, request) in applied.iter().zip(batch.iter_mut()) {
            if let Ok(written_now @ Applied::Written(placed)) = applied {
                written += 1;
                newest = newest.max(Some(written_now.outcome().position));
                recorded.extend(recorded_events(request, placed));
            }
        }
        if let Some(newest) = newest {
            self.counters.appends.fetch_add(written, Ordering::Relaxed);
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
            // Into the window before the head moves, so a subscription woken by the new head
            // finds the events in memory.
            self.recent.committed(log_head_before, recorded);
            // Publish before answering, so a caller that reads the head after its append
            // returned sees at least its own position.
            let previous = self.head.send_replace(Some(newest));
            self.checkpointer.nudge();
            assert!(
                previous < Some(newest),
                "the single writer's positions only grow"
            );
        }
        tracing::debug!(appends = batch.len(), written, "group commit");
        applied
            .into_iter()
            .map(|applied| applied.map(|applied| applied.outcome()))
            .collect()
    }

    /// Opens the batch's transaction and applies every append in it. Every refusal (a conflict,
    /// a reused event id) is decided before that append writes anything, so a refused append
    /// needs no rollback and costs the others nothing; savepoints per append would copy every
    /// page the batch touches again for each append. An error means the transaction must be
    /// rolled back and nothing in it was written.
    ///
    /// Also returns the log's last position before the batch, read under the write lock: what
    /// tells the recent window whether another process wrote since this one's last commit.
    fn apply_all(&self, batch: &[AppendRequest]) -> Result<BatchApplied, StoreError> {
        let connection = &self.connection;
        exec(connection, "BEGIN IMMEDIATE")?;
        let log_head_before = schema::head_position(connection)?;
        // A tree behind its log (another opener wrote with it off, or events were inserted
        // behind the ledger's back) is not extended: the first append refuses (see tree.rs).
        let mut streams = self.stream_tenants.borrow_mut();
        let mut tree = match self.log_tree {
            true => Some(TreeAppender::open(connection, Some(&mut streams))?),
            false => None,
        };
        let mut results = Vec::with_capacity(batch.len());
        for request in batch {
            let result = match apply(connection, request, tree.as_mut()) {
                Ok(applied) => Ok(applied),
                Err(Failure::Refused(refusal)) => Err(refusal),
                Err(Failure::Storage(error)) => return Err(error),
            };
            // SQLite ends a transaction on its own after some failures (a full disk, an I/O
            // error). Statements after that would run in autocommit mode and commit piecemeal,
            // outside the batch; stop instead.
            if connection.is_autocommit() {
                return Err(StoreError::Unavailable {
                    reason: "the write transaction ended unexpectedly".into(),
                });
            }
            results.push(result);
        }
        if let Some(tree) = tree {
            tree.finish()?;
        }
        Ok(BatchApplied {
            log_head_before,
            results,
        })
    }

    fn roll_back(&self) {
        if !self.connection.is_autocommit() {
            if let Err(error) = exec(&self.connection, "ROLLBACK") {
                // The next BEGIN will fail and refuse that batch too, which is safe: no append is
                // acknowledged while the connection is in this state.
                tracing::error!(%error, "cannot roll back the write transaction");
            }
        }
    }
}

/// Applies one append inside the batch's transaction; a refusal is returned before it writes.
fn apply(
    connection: &Connection,
    request: &AppendRequest,
    tree: Option<&mut TreeAppender<'_>>,
) -> Result<Applied, Failure> {
    let stream = &request.stream;
    let found = find_stream(connection, stream)?;
    let last = found.map(|(_, last)| last);
    let conflict = || Failure::Refused(rules::version_conflict(stream, request.expected, last));
    match rules::plan_append(request.expected, last) {
        AppendPlan::Write { first } => {
            let Some(new_last) = last_version_after(first, request.events.len()) else {
                return Err(Failure::Refused(StoreError::InvalidAppend {
                    reason: format!("stream `{stream}` cannot grow past version {}", i64::MAX),
                }));
            };
            check_ids_unused(connection, request)?;
            let stream_id = match found {
                Some((stream_id, _)) => {
                    set_last_version(connection, stream_id, new_last)?;
                    stream_id
                }
                None => create_stream(connection, stream, new_last)?,
            };
            insert(connection, request, stream_id, first, tree).map(Applied::Written)
        }
        AppendPlan::CheckStored { first } => {
            let Some((stream_id, _)) = found else {
                return Err(conflict());
            };
            let stored = stored_from(connection, stream, stream_id, first, request.events.len())?;
            let ids: Vec<EventId> = stored.iter().map(|(event_id, _)| *event_id).collect();
            match stored.last() {
                Some((_, outcome)) if rules::is_same_append(&ids, &request.events) => {
                    Ok(Applied::AlreadyStored(*outcome))
                }
                _ => Err(conflict()),
            }
        }
        AppendPlan::Conflict => Err(conflict()),
    }
}

/// The version of the last event of an append of `count` events starting at `first`, as SQLite
/// stores it; `None` past what SQLite can hold.
fn last_version_after(first: StreamVersion, count: usize) -> Option<i64> {
    let count = i64::try_from(count).ok()?;
    codec::version_to_sql(first)?.checked_add(count - 1)
}

/// The stream's id and last version, read inside the write transaction so no other commit can
/// move it before this append is applied.
fn find_stream(
    connection: &Connection,
    stream: &StreamName,
) -> Result<Option<(i64, StreamVersion)>, StoreError> {
    let mut statement = connection
        .prepare_cached("SELECT stream_id, last_version FROM streams WHERE name = ?1")
        .map_err(|error| sqlite_error("cannot prepare the stream query", error))?;
    let found: Option<(i64, i64)> = statement
        .query_row([stream.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
        .map_err(|error| {
            sqlite_error(format_args!("cannot read the version of `{stream}`"), error)
        })?;
    found
        .map(|(stream_id, last)| Ok((stream_id, codec::version_from_sql(last)?)))
        .transpose()
}

fn create_stream(
    connection: &Connection,
    stream: &StreamName,
    last: i64,
) -> Result<i64, StoreError> {
    connection
        .prepare_cached("INSERT INTO streams (name, last_version) VALUES (?1, ?2)")
        .and_then(|mut statement| statement.execute(params![stream.as_str(), last]))
        .map_err(|error| sqlite_error(format_args!("cannot create stream `{stream}`"), error))?;
    Ok(connection.last_insert_rowid())
}

fn set_last_version(connection: &Connection, stream_id: i64, last: i64) -> Result<(), StoreError> {
    connection
        .prepare_cached("UPDATE streams SET last_version = ?2 WHERE stream_id = ?1")
        .and_then(|mut statement| statement.execute(params![stream_id, last]))
        .map(drop)
        .map_err(|error| sqlite_error("cannot record the stream's version", error))
}

/// Up to `count` stored events of `stream` from version `first` on: their ids, and the outcome
/// an append ending at each would have had.
fn stored_from(
    connection: &Connection,
    stream: &StreamName,
    stream_id: i64,
    first: StreamVersion,
    count: usize,
) -> Result<Vec<(EventId, AppendOutcome)>, StoreError> {
    // `first` is at most the stream's last version, which SQLite holds.
    let first =
        codec::version_to_sql(first).expect("a version at or below a stored one fits in SQLite");
    let mut statement = connection
        .prepare_cached(
            "SELECT event_id, version, position FROM events WHERE stream_id = ?1 AND version >= ?2 \
             ORDER BY version LIMIT ?3",
        )
        .map_err(|error| sqlite_error("cannot prepare the stored-events query", error))?;
    let rows = statement
        .query_map(params![stream_id, first, count as i64], |row| {
            Ok((
                row.get::<_, Vec<u8>>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .map_err(|error| sqlite_error(format_args!("cannot read `{stream}`"), error))?;
    let mut stored = Vec::with_capacity(count);
    for row in rows {
        let (event_id, version, position) =
            row.map_err(|error| sqlite_error(format_args!("cannot read `{stream}`"), error))?;
        let outcome = AppendOutcome {
            next_expected: codec::version_from_sql(version)?,
            position: codec::position_from_sql(position)?,
        };
        stored.push((codec::event_id_from_sql(&event_id)?, outcome));
    }
    Ok(stored)
}

/// Inserts the append's events from version `first` on and returns each one's position and
/// version, in order. The caller checked that every version fits in SQLite.
fn insert(
    connection: &Connection,
    request: &AppendRequest,
    stream_id: i64,
    first: StreamVersion,
    mut tree: Option<&mut TreeAppender<'_>>,
) -> Result<Vec<(GlobalPosition, StreamVersion)>, Failure> {
    let stream = &request.stream;
    let mut statement = connection
        .prepare_cached(
            "INSERT INTO events (stream_id, version, stream, event_id, event_type, data, metadata) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(|error| sqlite_error("cannot prepare the insert", error))?;
    let mut version = first;
    let mut placed = Vec::with_capacity(request.events.len());
    for event in &request.events {
        let sql_version = codec::version_to_sql(version)
            .expect("the caller checked the append's last version fits");
        let inserted = statement.execute(params![
            stream_id,
            sql_version,
            stream.as_str(),
            event.event_id.as_uuid().as_bytes().as_slice(),
            event.event_type,
            event.data,
            event.metadata,
        ]);
        match inserted {
            Ok(_) => {}
            // The ids were checked unused before writing, so any failure here is storage's.
            Err(error) => {
                return Err(Failure::Storage(sqlite_error(
                    format_args!("cannot append to `{stream}`"),
                    error,
                )))
            }
        }
        let position = codec::position_from_sql(connection.last_insert_rowid())?;
        if let Some(tree) = tree.as_deref_mut() {
            tree.append(&EventView {
                stream: stream.as_str(),
                version,
                position,
                event_id: event.event_id,
                event_type: &event.event_type,
                data: &event.data,
                metadata: &event.metadata,
            })?;
        }
        placed.push((position, version));
        version = version.next();
    }
    Ok(placed)
}

/// The committed append's events as the log holds them, moved out of the request: its caller
/// gets only the outcome, so the data is not copied.
fn recorded_events(
    request: &mut AppendRequest,
    placed: &[(GlobalPosition, StreamVersion)],
) -> Vec<RecordedEvent> {
    debug_assert_eq!(request.events.len(), placed.len());
    std::mem::take(&mut request.events)
        .into_iter()
        .zip(placed)
        .map(|(event, &(position, version))| RecordedEvent {
            stream: request.stream.clone(),
            version,
            position,
            event_id: event.event_id,
            event_type: event.event_type,
            data: event.data,
            metadata: event.metadata,
        })
        .collect()
}

/// Refuses an append whose event ids are already stored anywhere: an id names one event, and
/// reusing it elsewhere would make a retried append impossible to recognise. Checked before the
/// append writes, so the refusal needs no rollback; the `UNIQUE` index still backs it up.
fn check_ids_unused(connection: &Connection, request: &AppendRequest) -> Result<(), Failure> {
    let mut statement = connection
        .prepare_cached("SELECT stream, version FROM events WHERE event_id = ?1")
        .map_err(|error| sqlite_error("cannot prepare the event id query", error))?;
    for event in &request.events {
        let event_id = event.event_id;
        let stored: Option<(String, i64)> = statement
            .query_row([event_id.as_uuid().as_bytes().as_slice()], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
            .map_err(|error| {
                sqlite_error(format_args!("cannot look up event id {event_id}"), error)
            })?;
        if let Some((stored_stream, stored_version)) = stored {
            let corrupt = || StoreError::Corrupt {
                reason: format!("the row holding event id {event_id} does not decode"),
            };
            let stored_stream = StreamName::new(stored_stream).map_err(|_| corrupt())?;
            let stored_version = codec::version_from_sql(stored_version).map_err(|_| corrupt())?;
            return Err(Failure::Refused(rules::event_id_reused(
                &request.stream,
                event_id,
                &stored_stream,
                stored_version,
            )));
        }
    }
    Ok(())
}

/// Runs a statement without results through the statement cache.
fn exec(connection: &Connection, sql: &str) -> Result<(), StoreError> {
    connection
        .prepare_cached(sql)
        .and_then(|mut statement| statement.execute([]))
        .map(drop)
        .map_err(|error| sqlite_error(format_args!("`{sql}` failed"), error))
}
