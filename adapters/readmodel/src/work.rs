//! The durable work queue (`work_queue`, schema version 3): what the workers read to find due
//! work, instead of folding the log from position 0 at every start.
//!
//! Rows are written with the operation's row in every batch and rebuild (`apply.rs`), so the
//! queue is exactly as current as the checkpoint. Reads are index range scans, one per kind of
//! work, each bounded by its limit: their cost follows what is due, not the file's size.

use chrono::{DateTime, Utc};
use opledger_domain::state::Work;
use opledger_runtime::work_source::{DuePage, DueWork, WorkSource};
use rusqlite::params;
use tokio::sync::watch;

use super::apply::work_name;
use super::sql;
use super::{ReadModelError, ReadModelStore, ReadModels, MAX_QUERY_ROWS};

/// Every kind of work, each read by its own range scan of the index.
const KINDS: [Work; 3] = [Work::Send, Work::Sweep, Work::Reconcile];

impl ReadModelStore {
    /// Up to `limit` (at most [`MAX_QUERY_ROWS`]) operations whose work is due at `now` — sends
    /// only `send_delay` after they fell due — the longest-waiting first, and when the next
    /// work not returned falls due.
    pub fn due_work(
        &self,
        now: DateTime<Utc>,
        send_delay: chrono::Duration,
        limit: usize,
    ) -> Result<DuePage, ReadModelError> {
        let limit = limit.min(MAX_QUERY_ROWS);
        let mut due = Vec::new();
        let mut next_due_at: Option<DateTime<Utc>> = None;
        for work in KINDS {
            let delay = if work == Work::Send {
                send_delay.max(chrono::Duration::zero())
            } else {
                chrono::Duration::zero()
            };
            // A send due at t is offered at t + delay: due now when t <= now − delay.
            let cutoff = now - delay;
            due.extend(self.due_of_kind(work, cutoff, limit)?);
            if let Some(later) = self.first_after(work, cutoff)? {
                let offered = later + delay;
                next_due_at = Some(next_due_at.map_or(offered, |next| next.min(offered)));
            }
        }
        due.sort_by_key(|item| (item.due_at, item.operation_id));
        // Those cut off here are due too: they are offered at once next time.
        if due.len() > limit {
            next_due_at = Some(now);
            due.truncate(limit);
        }
        Ok(DuePage { due, next_due_at })
    }

    /// Up to `limit` operations waiting for `work` that fell due at or before `cutoff`.
    fn due_of_kind(
        &self,
        work: Work,
        cutoff: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<DueWork>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare_cached(
                "SELECT operation_id, due_at, stream_version FROM work_queue
                 WHERE work = ?1 AND due_at <= ?2 ORDER BY due_at, operation_id LIMIT ?3",
            )
            .map_err(|error| ReadModelError::sqlite("preparing the due-work query", error))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = statement
            .query_map(params![work_name(work), sql::time(cutoff), limit], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            })
            .map_err(|error| ReadModelError::sqlite("reading due work", error))?;
        let mut due = Vec::new();
        for row in rows {
            let (operation_id, due_at, version) =
                row.map_err(|error| ReadModelError::sqlite("reading due work", error))?;
            due.push(DueWork {
                operation_id: sql::operation_from(&operation_id)?,
                work,
                due_at: sql::time_from(&due_at)?,
                version: sql::version_from(version)?,
            });
        }
        Ok(due)
    }

    /// When the first operation waiting for `work` after `cutoff` falls due.
    fn first_after(
        &self,
        work: Work,
        cutoff: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, ReadModelError> {
        let mut statement = self
            .connection
            .prepare_cached(
                "SELECT due_at FROM work_queue WHERE work = ?1 AND due_at > ?2
                 ORDER BY due_at LIMIT 1",
            )
            .map_err(|error| ReadModelError::sqlite("preparing the next-due query", error))?;
        let mut rows = statement
            .query(params![work_name(work), sql::time(cutoff)])
            .map_err(|error| ReadModelError::sqlite("reading the next due work", error))?;
        let Some(row) = rows
            .next()
            .map_err(|error| ReadModelError::sqlite("reading the next due work", error))?
        else {
            return Ok(None);
        };
        let due_at: String = row
            .get(0)
            .map_err(|error| ReadModelError::sqlite("reading the next due work", error))?;
        sql::time_from(&due_at).map(Some)
    }

    /// How many operations wait in the work queue (due or not).
    pub fn queued_work(&self) -> Result<u64, ReadModelError> {
        let count: i64 = self
            .connection
            .query_row("SELECT count(*) FROM work_queue", [], |row| row.get(0))
            .map_err(|error| ReadModelError::sqlite("counting the work queue", error))?;
        sql::count_from(count)
    }
}

impl WorkSource for ReadModels {
    type Error = ReadModelError;

    async fn due(
        &self,
        now: DateTime<Utc>,
        send_delay: chrono::Duration,
        limit: usize,
    ) -> Result<DuePage, ReadModelError> {
        self.call(move |store| store.due_work(now, send_delay, limit))
            .await
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.committed.subscribe()
    }
}
