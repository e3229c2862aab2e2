//! The reader pool: a few read-only connections used from `spawn_blocking`.
//!
//! In WAL mode a reader sees the last commit that finished before its query began and never
//! waits for the writer, so reads and the group commit run side by side. The pool must never let
//! a query run on the async executor's threads: SQLite calls block.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use opledger_domain::ids::StreamVersion;
use opledger_domain::store::{
    EventView, LogStart, RecordedEvent, StoreError, StreamName, MAX_READ_BATCH,
};
use rusqlite::{params, Connection};
use tokio::sync::Semaphore;

use super::codec::{self, EventRow, EVENT_COLUMNS};
use super::{schema, sqlite_error, READ_POOL_SIZE};

/// Read-only connections shared by every read of one store.
pub(super) struct ReadPool {
    path: PathBuf,
    /// Connections not in use; `None` once the store is closed.
    idle: Mutex<Option<Vec<Connection>>>,
    /// One permit per connection, so at most [`READ_POOL_SIZE`] blocking reads run at once.
    permits: Semaphore,
}

impl ReadPool {
    /// A pool over `connections` (at most [`READ_POOL_SIZE`]); it opens more, up to that size,
    /// when a connection is lost to a cancelled read.
    pub(super) fn new(path: PathBuf, connections: Vec<Connection>) -> Self {
        debug_assert!(connections.len() <= READ_POOL_SIZE);
        Self {
            path,
            idle: Mutex::new(Some(connections)),
            permits: Semaphore::new(READ_POOL_SIZE),
        }
    }

    /// Closes every idle connection now and each busy one when its read ends; later reads fail
    /// with [`StoreError::Closed`].
    pub(super) fn close(&self) {
        self.permits.close();
        drop(self.lock().take());
    }

    /// Takes every connection's permit, so reads wait until it is dropped (tests show what does
    /// not read the file).
    #[cfg(test)]
    pub(super) async fn hold_every_connection(
        &self,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, StoreError> {
        self.permits
            .acquire_many(READ_POOL_SIZE as u32)
            .await
            .map_err(|_| StoreError::Closed)
    }

    /// Whether [`Self::close`] was called.
    pub(super) fn is_closed(&self) -> bool {
        self.permits.is_closed()
    }

    pub(super) async fn read_stream(
        &self,
        stream: &StreamName,
        from: StreamVersion,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let limit = max_count.min(MAX_READ_BATCH);
        // A version SQLite cannot hold has no events at or after it.
        let Some(from) = codec::version_to_sql(from) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let stream = stream.clone();
        self.run(move |connection| {
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM events \
                 WHERE stream_id = (SELECT stream_id FROM streams WHERE name = ?1) AND version >= ?2 \
                 ORDER BY version LIMIT ?3"
            );
            query_events(connection, &sql, params![stream.as_str(), from, limit as i64])
                .map_err(|error| sqlite_error(format_args!("cannot read stream `{stream}`"), error))?
        })
        .await
    }

    pub(super) async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<RecordedEvent>, StoreError> {
        let Some((after, limit)) = log_slice(start, max_count) else {
            return Ok(Vec::new());
        };
        self.run(move |connection| {
            query_events(connection, &log_sql(), params![after, limit])
                .map_err(|error| sqlite_error("cannot read the log", error))?
        })
        .await
    }

    /// [`Self::read_all`], lending each row to `visit` instead of copying it into a
    /// [`RecordedEvent`].
    pub(super) async fn read_all_with<T, F>(
        &self,
        start: LogStart,
        max_count: usize,
        mut visit: F,
        mut into: Vec<T>,
    ) -> Result<Vec<T>, StoreError>
    where
        T: Send + 'static,
        F: FnMut(EventView<'_>) -> T + Send + 'static,
    {
        into.clear();
        let Some((after, limit)) = log_slice(start, max_count) else {
            return Ok(into);
        };
        self.run(move |connection| {
            visit_events(
                connection,
                &log_sql(),
                params![after, limit],
                &mut visit,
                into,
            )
            .map_err(|error| sqlite_error("cannot read the log", error))?
        })
        .await
    }

    /// Runs `work` on a pooled connection in a blocking task.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Closed)?;
        let idle = self.lock().as_mut().ok_or(StoreError::Closed)?.pop();
        let path = self.path.clone();
        let (connection, result) = tokio::task::spawn_blocking(move || {
            let connection = match idle {
                Some(connection) => connection,
                None => match schema::open_reader(&path) {
                    Ok(connection) => connection,
                    Err(error) => return (None, Err(error)),
                },
            };
            let result = work(&connection);
            (Some(connection), result)
        })
        .await
        .map_err(|error| StoreError::Unavailable {
            reason: format!("a read task failed: {error}"),
        })?;
        if let (Some(connection), Some(idle)) = (connection, self.lock().as_mut()) {
            idle.push(connection);
        }
        result
    }

    fn lock(&self) -> MutexGuard<'_, Option<Vec<Connection>>> {
        // The guarded value is a list of idle connections; a panic elsewhere cannot leave it
        // half-changed, so a poisoned lock is still safe to use.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs an event query; the outer error is SQLite's, the inner one a row that does not decode.
fn query_events(
    connection: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Result<Vec<RecordedEvent>, StoreError>> {
    let mut statement = connection.prepare_cached(sql)?;
    let rows = statement.query_map(params, EventRow::from_row)?;
    let mut events = Vec::new();
    for row in rows {
        match row?.decode() {
            Ok(event) => events.push(event),
            Err(error) => return Ok(Err(error)),
        }
    }
    Ok(Ok(events))
}

/// The log's slice after `start`, at most `max_count` events (and at most a batch), as the SQL
/// parameters of [`log_sql`]: `None` when nothing can follow (a limit of zero, or a position past
/// what SQLite stores).
fn log_slice(start: LogStart, max_count: usize) -> Option<(i64, i64)> {
    let limit = max_count.min(MAX_READ_BATCH);
    let after = match start {
        LogStart::Beginning => 0,
        LogStart::After(position) => codec::position_to_sql(position)?,
    };
    (limit > 0).then_some((after, limit as i64))
}

/// The events after position `?1`, at most `?2` of them, in log order.
fn log_sql() -> String {
    format!("SELECT {EVENT_COLUMNS} FROM events WHERE position > ?1 ORDER BY position LIMIT ?2")
}

/// Runs an event query, lending each row to `visit` and appending what it returns to `into`;
/// the errors as [`query_events`]'s.
fn visit_events<T>(
    connection: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    visit: &mut impl FnMut(EventView<'_>) -> T,
    mut into: Vec<T>,
) -> rusqlite::Result<Result<Vec<T>, StoreError>> {
    let mut statement = connection.prepare_cached(sql)?;
    let mut rows = statement.query(params)?;
    while let Some(row) = rows.next()? {
        match codec::view_row(row)? {
            Ok(view) => into.push(visit(view)),
            Err(error) => return Ok(Err(error)),
        }
    }
    Ok(Ok(into))
}
