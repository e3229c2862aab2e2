//! The delivery journal: a SQLite file of the webhooks' own holding each endpoint's checkpoint,
//! its state (active, paused, disabled) and a bounded log of delivery attempts.
//!
//! Why a file of its own and not tables in the read-model file: the read models are rebuilt and
//! swapped whole (`opledger rebuild`, adapters/readmodel/src/swap.rs), which would reset every
//! checkpoint and redeliver the whole history to every endpoint; and their runner commits large
//! batches under one connection lock, which a delivery's small commit must not wait behind.
//!
//! A checkpoint is written only after the event at it was delivered (2xx) or skipped by the
//! endpoint's filter, so a crash repeats a delivery and never skips one. Every operator action
//! (pause, resume, replay) and every disabling bumps the endpoint's `epoch`; a delivery task's
//! checkpoint write names the epoch it started under and does nothing once it has changed, so a
//! replay cannot be overwritten by a delivery that was already under way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

use crate::port::{Acquired, DeliveryJournal, JournalFuture, Lease};
use crate::WebhookError;

/// Most attempts kept per endpoint after a trim; older ones are deleted as new ones are written.
/// At about 200 bytes a row, 10,000 rows keep an endpoint's log near 2 MB.
pub const MAX_ATTEMPTS_KEPT_PER_ENDPOINT: u64 = 10_000;
/// How many attempts of an endpoint are written between two trims of its log (the first write
/// after opening trims too), so the log holds at most `MAX_ATTEMPTS_KEPT_PER_ENDPOINT +
/// ATTEMPTS_BETWEEN_TRIMS` rows. A trim walks the newest `MAX_ATTEMPTS_KEPT_PER_ENDPOINT` index
/// entries: once per write it was most of a delivery's CPU (~170 µs of ~480, profiled under
/// `bench http --webhook`).
pub const ATTEMPTS_BETWEEN_TRIMS: u64 = 1_000;
const _: () = assert!(ATTEMPTS_BETWEEN_TRIMS <= MAX_ATTEMPTS_KEPT_PER_ENDPOINT);
/// Most attempts one listing returns.
pub const MAX_ATTEMPTS_LISTED: u64 = 1_000;
/// Longest error text kept per attempt, in bytes.
pub const MAX_ATTEMPT_ERROR_BYTES: usize = 1_024;
const _: () = assert!(MAX_ATTEMPTS_LISTED <= MAX_ATTEMPTS_KEPT_PER_ENDPOINT);

const SCHEMA_VERSION: i64 = 1;

/// Whether an endpoint is being delivered to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointStatus {
    /// Deliveries go out.
    Active,
    /// An operator paused it; events wait on its checkpoint.
    Paused,
    /// It answered 410 Gone or failed for its whole retry window; an operator resumes it.
    Disabled,
}

impl EndpointStatus {
    /// Its name as journals store it (`active`, `paused`, `disabled`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Disabled => "disabled",
        }
    }

    /// The status a journal stored as `name`.
    pub fn parse(name: &str) -> Result<Self, WebhookError> {
        Ok(match name {
            "active" => Self::Active,
            "paused" => Self::Paused,
            "disabled" => Self::Disabled,
            other => {
                return Err(WebhookError::Journal {
                    reason: format!("an endpoint has the unknown status `{other}`"),
                })
            }
        })
    }
}

/// One endpoint's durable record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointRecord {
    /// The last position delivered or skipped (`None`: none yet; delivery starts at the log's
    /// beginning).
    pub checkpoint: Option<u64>,
    /// Whether it is delivered to.
    pub status: EndpointStatus,
    /// Why it was disabled or paused, when it was.
    pub reason: Option<String>,
    /// Bumped by every operator action and every disabling.
    pub epoch: u64,
}

/// One delivery attempt, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    /// The endpoint.
    pub endpoint: String,
    /// The position of the event delivered.
    pub position: u64,
    /// The `webhook-id` sent.
    pub webhook_id: String,
    /// 1 for the first attempt at this event, then counting.
    pub attempt: u32,
    /// When it started.
    pub at: DateTime<Utc>,
    /// The HTTP status answered (`None`: no answer: refused, timed out, reset).
    pub status: Option<u16>,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
    /// What went wrong, if it did (a status other than 2xx, or the transport error).
    pub error: Option<String>,
}

/// The journal, shared: cloning gives another handle to the same connection. Every call runs on
/// a blocking thread.
#[derive(Clone, Debug)]
pub struct Journal {
    connection: Arc<Mutex<Connection>>,
    /// Per endpoint, the attempts written since its log was last trimmed (none yet: trim at the
    /// next write). Touched only under the connection's lock.
    untrimmed: Arc<Mutex<HashMap<String, u64>>>,
    path: Arc<PathBuf>,
}

impl Journal {
    /// Opens (or creates) the journal at `path`.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, WebhookError> {
        let path = path.as_ref().to_path_buf();
        let opened = path.clone();
        let connection = blocking(move || open(&opened)).await?;
        Ok(Self {
            connection: Arc::new(Mutex::new(connection)),
            untrimmed: Arc::default(),
            path: Arc::new(path),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The endpoint's record, created with `start` as its checkpoint when it has none: a new
    /// endpoint receives what happens from now on, and an operator replays older events.
    pub async fn ensure(
        &self,
        endpoint: &str,
        start: Option<u64>,
    ) -> Result<EndpointRecord, WebhookError> {
        let endpoint = endpoint.to_owned();
        self.call(move |connection| {
            connection
                .execute(
                    "INSERT INTO endpoints (id, checkpoint, status, epoch) VALUES (?1, ?2, 'active', 0)
                     ON CONFLICT (id) DO NOTHING",
                    params![endpoint, start.map(to_sql)],
                )
                .map_err(sqlite("creating an endpoint's record"))?;
            read_record(connection, &endpoint)?.ok_or_else(|| WebhookError::Journal {
                reason: format!("endpoint `{endpoint}` has no record right after it was written"),
            })
        })
        .await
    }

    /// The endpoint's record (`None`: it was never configured here).
    /// Every endpoint defined through the API: its id and its definition (JSON, see
    /// `managed.rs`), in id order.
    pub async fn definitions(&self) -> Result<Vec<(String, String)>, WebhookError> {
        self.call(|connection| {
            let mut statement = connection
                .prepare("SELECT id, definition FROM definitions ORDER BY id")
                .map_err(sqlite("reading endpoint definitions"))?;
            let rows = statement
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
                .map_err(sqlite("reading endpoint definitions"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(sqlite("reading endpoint definitions"))
        })
        .await
    }

    /// Writes (`Some`) or deletes (`None`) an endpoint's definition.
    pub async fn define(
        &self,
        endpoint: &str,
        definition: Option<String>,
    ) -> Result<(), WebhookError> {
        let endpoint = endpoint.to_owned();
        self.call(move |connection| {
            match definition {
                Some(text) => connection.execute(
                    "INSERT INTO definitions (id, definition) VALUES (?1, ?2)
                     ON CONFLICT (id) DO UPDATE SET definition = excluded.definition",
                    params![endpoint, text],
                ),
                None => {
                    connection.execute("DELETE FROM definitions WHERE id = ?1", params![endpoint])
                }
            }
            .map(drop)
            .map_err(sqlite("writing an endpoint definition"))
        })
        .await
    }

    pub async fn record(&self, endpoint: &str) -> Result<Option<EndpointRecord>, WebhookError> {
        let endpoint = endpoint.to_owned();
        self.call(move |connection| read_record(connection, &endpoint))
            .await
    }

    /// Moves the checkpoint to `position` if the endpoint is still at `epoch`; `false` when an
    /// operator action or a disabling came in between (nothing is written then).
    pub async fn advance(
        &self,
        endpoint: &str,
        epoch: u64,
        position: u64,
    ) -> Result<bool, WebhookError> {
        let endpoint = endpoint.to_owned();
        self.call(move |connection| {
            let changed = connection
                .execute(
                    "UPDATE endpoints SET checkpoint = ?3 WHERE id = ?1 AND epoch = ?2",
                    params![endpoint, to_sql(epoch), to_sql(position)],
                )
                .map_err(sqlite("moving a checkpoint"))?;
            Ok(changed == 1)
        })
        .await
    }

    /// Sets the status (and, with `replay_after`, the checkpoint) and bumps the epoch. With
    /// `only_at_epoch`, only if the endpoint is still at that epoch (a delivery task disabling
    /// what it was delivering); `false` when nothing was written.
    pub async fn set_status(
        &self,
        endpoint: &str,
        status: EndpointStatus,
        reason: Option<String>,
        replay_after: Option<Option<u64>>,
        only_at_epoch: Option<u64>,
    ) -> Result<bool, WebhookError> {
        let endpoint = endpoint.to_owned();
        self.call(move |connection| {
            connection
                .pragma_update(None, "synchronous", "FULL")
                .map_err(sqlite("setting synchronous=FULL for a status change"))?;
            let changed = change_status(
                connection,
                &endpoint,
                status,
                reason,
                replay_after,
                only_at_epoch,
            );
            connection
                .pragma_update(None, "synchronous", "NORMAL")
                .map_err(sqlite("setting synchronous=NORMAL after a status change"))?;
            changed
        })
        .await
    }

    /// Records one attempt, deleting the endpoint's oldest beyond
    /// [`MAX_ATTEMPTS_KEPT_PER_ENDPOINT`].
    pub async fn record_attempt(&self, attempt: AttemptRecord) -> Result<(), WebhookError> {
        self.write_attempts(vec![attempt], None).await.map(|_| ())
    }

    /// Records successful attempts (in the order given) and moves the checkpoint to `checkpoint`
    /// (their last event, or a skipped one after it) in one commit, if the endpoint is still at
    /// `epoch`; `false` (the attempts recorded, the checkpoint not moved) otherwise. A burst of
    /// deliveries costs one commit and one trim of the attempt log per batch instead of per
    /// delivery (`delivery.rs` decides the batches).
    pub async fn record_deliveries(
        &self,
        attempts: Vec<AttemptRecord>,
        epoch: u64,
        checkpoint: u64,
    ) -> Result<bool, WebhookError> {
        self.write_attempts(attempts, Some((epoch, checkpoint)))
            .await
    }

    /// Writes `attempts`, trims their endpoints' logs and, with `advance` (epoch, position),
    /// moves the first attempt's endpoint's checkpoint: one commit.
    async fn write_attempts(
        &self,
        mut attempts: Vec<AttemptRecord>,
        advance: Option<(u64, u64)>,
    ) -> Result<bool, WebhookError> {
        for attempt in &mut attempts {
            if let Some(error) = attempt.error.as_mut() {
                truncate(error, MAX_ATTEMPT_ERROR_BYTES);
            }
        }
        let Some(endpoint) = attempts.first().map(|attempt| attempt.endpoint.clone()) else {
            return Ok(false);
        };
        let untrimmed = Arc::clone(&self.untrimmed);
        let written = u64::try_from(attempts.len()).unwrap_or(u64::MAX);
        self.call(move |connection| {
            let transaction = connection
                .transaction()
                .map_err(sqlite("starting an attempt record"))?;
            {
                let mut insert = transaction
                    .prepare_cached(
                        "INSERT INTO attempts (endpoint, position, webhook_id, attempt, at, status, duration_ms, error)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    )
                    .map_err(sqlite("recording an attempt"))?;
                for attempt in &attempts {
                    insert
                        .execute(params![
                            attempt.endpoint,
                            to_sql(attempt.position),
                            attempt.webhook_id,
                            attempt.attempt,
                            attempt.at.to_rfc3339(),
                            attempt.status,
                            to_sql(attempt.duration_ms),
                            attempt.error,
                        ])
                        .map_err(sqlite("recording an attempt"))?;
                }
            }
            let mut untrimmed = lock(&untrimmed);
            let since_trim = untrimmed.get(&endpoint).copied();
            let trim = since_trim.is_none_or(|since| since + written >= ATTEMPTS_BETWEEN_TRIMS);
            if trim {
                transaction
                    .prepare_cached(
                        "DELETE FROM attempts WHERE endpoint = ?1 AND seq <= (
                             SELECT seq FROM attempts WHERE endpoint = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
                    )
                    .and_then(|mut trim| {
                        trim.execute(params![endpoint, to_sql(MAX_ATTEMPTS_KEPT_PER_ENDPOINT)])
                    })
                    .map_err(sqlite("trimming the attempt log"))?;
            }
            let advanced = match advance {
                Some((epoch, position)) => {
                    transaction
                        .prepare_cached(
                            "UPDATE endpoints SET checkpoint = ?3 WHERE id = ?1 AND epoch = ?2",
                        )
                        .and_then(|mut update| {
                            update.execute(params![endpoint, to_sql(epoch), to_sql(position)])
                        })
                        .map_err(sqlite("moving a checkpoint"))?
                        == 1
                }
                None => false,
            };
            transaction
                .commit()
                .map_err(sqlite("committing an attempt record"))?;
            // Counted only once committed: a rolled-back trim is due again at the next write.
            let since = if trim { 0 } else { since_trim.unwrap_or(0) + written };
            untrimmed.insert(endpoint, since);
            Ok(advanced)
        })
        .await
    }

    /// The endpoint's latest attempts, newest first, at most `limit` (capped at
    /// [`MAX_ATTEMPTS_LISTED`]).
    pub async fn attempts(
        &self,
        endpoint: &str,
        limit: u64,
    ) -> Result<Vec<AttemptRecord>, WebhookError> {
        let endpoint = endpoint.to_owned();
        let limit = limit.min(MAX_ATTEMPTS_LISTED);
        self.call(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT position, webhook_id, attempt, at, status, duration_ms, error
                     FROM attempts WHERE endpoint = ?1 ORDER BY seq DESC LIMIT ?2",
                )
                .map_err(sqlite("listing attempts"))?;
            let rows = statement
                .query(params![endpoint, to_sql(limit)])
                .map_err(sqlite("listing attempts"))?;
            attempt_rows(rows, &endpoint)
        })
        .await
    }

    /// The endpoint's attempts at any of `positions` (an operation's events), newest first, at
    /// most [`MAX_ATTEMPTS_LISTED`]: through the position index, whatever the log's length.
    pub async fn attempts_at(
        &self,
        endpoint: &str,
        positions: &[u64],
    ) -> Result<Vec<AttemptRecord>, WebhookError> {
        let endpoint = endpoint.to_owned();
        let positions: Vec<i64> = positions.iter().map(|position| to_sql(*position)).collect();
        self.call(move |connection| {
            let positions =
                serde_json::to_string(&positions).map_err(|error| WebhookError::Journal {
                    reason: format!("positions cannot be written as JSON: {error}"),
                })?;
            let mut statement = connection
                .prepare_cached(
                    "SELECT position, webhook_id, attempt, at, status, duration_ms, error
                     FROM attempts WHERE endpoint = ?1
                     AND position IN (SELECT value FROM json_each(?2))
                     ORDER BY seq DESC LIMIT ?3",
                )
                .map_err(sqlite("listing an operation's attempts"))?;
            let rows = statement
                .query(params![endpoint, positions, to_sql(MAX_ATTEMPTS_LISTED)])
                .map_err(sqlite("listing an operation's attempts"))?;
            attempt_rows(rows, &endpoint)
        })
        .await
    }

    async fn call<T, F>(&self, work: F) -> Result<T, WebhookError>
    where
        F: FnOnce(&mut Connection) -> Result<T, WebhookError> + Send + 'static,
        T: Send + 'static,
    {
        let connection = Arc::clone(&self.connection);
        blocking(move || work(&mut lock(&connection))).await
    }
}

/// The embedded default: one process owns the ledger file (the SQLite store locks it), so it
/// holds every endpoint's lease for ever and the fences are the epochs alone. Its calls are the
/// inherent ones above, unchanged, so a delivery costs what it did before the port existed.
impl DeliveryJournal for Journal {
    fn shared(&self) -> bool {
        false
    }

    fn definitions(&self) -> JournalFuture<'_, Vec<(String, String)>> {
        Box::pin(Journal::definitions(self))
    }

    fn define(&self, endpoint: &str, definition: Option<String>) -> JournalFuture<'_, ()> {
        let endpoint = endpoint.to_owned();
        Box::pin(async move { Journal::define(self, &endpoint, definition).await })
    }

    fn ensure(&self, endpoint: &str, start: Option<u64>) -> JournalFuture<'_, EndpointRecord> {
        let endpoint = endpoint.to_owned();
        Box::pin(async move { Journal::ensure(self, &endpoint, start).await })
    }

    fn record(&self, endpoint: &str) -> JournalFuture<'_, Option<EndpointRecord>> {
        let endpoint = endpoint.to_owned();
        Box::pin(async move { Journal::record(self, &endpoint).await })
    }

    fn advance(&self, lease: &Lease, epoch: u64, position: u64) -> JournalFuture<'_, bool> {
        let endpoint = lease.endpoint.clone();
        Box::pin(async move { Journal::advance(self, &endpoint, epoch, position).await })
    }

    fn set_status(
        &self,
        endpoint: &str,
        status: EndpointStatus,
        reason: Option<String>,
        replay_after: Option<Option<u64>>,
        fence: Option<(u64, &Lease)>,
    ) -> JournalFuture<'_, bool> {
        let endpoint = endpoint.to_owned();
        let only_at_epoch = fence.map(|(epoch, _)| epoch);
        Box::pin(async move {
            Journal::set_status(self, &endpoint, status, reason, replay_after, only_at_epoch).await
        })
    }

    fn record_attempt(&self, attempt: AttemptRecord) -> JournalFuture<'_, ()> {
        Box::pin(Journal::record_attempt(self, attempt))
    }

    fn record_deliveries(
        &self,
        attempts: Vec<AttemptRecord>,
        _lease: &Lease,
        epoch: u64,
        checkpoint: u64,
    ) -> JournalFuture<'_, bool> {
        Box::pin(Journal::record_deliveries(
            self, attempts, epoch, checkpoint,
        ))
    }

    fn attempts_at(
        &self,
        endpoint: &str,
        positions: &[u64],
    ) -> JournalFuture<'_, Vec<AttemptRecord>> {
        let endpoint = endpoint.to_owned();
        let positions = positions.to_vec();
        Box::pin(async move { Journal::attempts_at(self, &endpoint, &positions).await })
    }

    fn attempts(&self, endpoint: &str, limit: u64) -> JournalFuture<'_, Vec<AttemptRecord>> {
        let endpoint = endpoint.to_owned();
        Box::pin(async move { Journal::attempts(self, &endpoint, limit).await })
    }

    fn acquire(&self, endpoint: &str, holder: &str, _lease_ms: u64) -> JournalFuture<'_, Acquired> {
        let lease = Lease {
            endpoint: endpoint.to_owned(),
            holder: holder.to_owned(),
            token: 0,
        };
        Box::pin(async move { Ok(Acquired::Held(lease)) })
    }

    fn renew(&self, lease: &Lease, _lease_ms: u64) -> JournalFuture<'_, Option<u64>> {
        let endpoint = lease.endpoint.clone();
        Box::pin(async move {
            Ok(Journal::record(self, &endpoint)
                .await?
                .map(|record| record.epoch))
        })
    }

    fn release(&self, _lease: &Lease) -> JournalFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

/// [`Journal::set_status`]'s transaction.
fn change_status(
    connection: &mut Connection,
    endpoint: &str,
    status: EndpointStatus,
    reason: Option<String>,
    replay_after: Option<Option<u64>>,
    only_at_epoch: Option<u64>,
) -> Result<bool, WebhookError> {
    let transaction = connection
        .transaction()
        .map_err(sqlite("starting a status change"))?;
    let Some(record) = read_record(&transaction, endpoint)? else {
        return Ok(false);
    };
    if only_at_epoch.is_some_and(|epoch| epoch != record.epoch) {
        return Ok(false);
    }
    let checkpoint = replay_after.unwrap_or(record.checkpoint);
    transaction
        .execute(
            "UPDATE endpoints SET status = ?2, reason = ?3, checkpoint = ?4, epoch = epoch + 1
             WHERE id = ?1",
            params![endpoint, status.name(), reason, checkpoint.map(to_sql)],
        )
        .map_err(sqlite("changing an endpoint's status"))?;
    transaction
        .commit()
        .map_err(sqlite("committing a status change"))?;
    Ok(true)
}

fn open(path: &Path) -> Result<Connection, WebhookError> {
    let connection = Connection::open(path).map_err(sqlite("opening the delivery journal"))?;
    // WAL with NORMAL sync for deliveries: a commit survives the process dying (SIGKILL), and a
    // power loss can only take back the last checkpoints, which repeats deliveries (same
    // `webhook-id`) and never skips one — what at-least-once allows. It halves the fsyncs a
    // delivery costs the machine the ledger commits on (`bench http --webhook`, docs/src/performance.md). An
    // operator's pause or replay and a disabling commit with FULL sync (`set_status`): a lost
    // pause would resume deliveries.
    connection
        .pragma_update(None, "journal_mode", "WAL")
        .map_err(sqlite("setting journal_mode=WAL"))?;
    connection
        .pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite("setting synchronous=NORMAL"))?;
    connection
        .busy_timeout(std::time::Duration::from_secs(5))
        .map_err(sqlite("setting the busy timeout"))?;
    let version: i64 = connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(sqlite("reading the journal's schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(WebhookError::Journal {
            reason: format!(
                "{} has schema version {version}, newer than this build's {SCHEMA_VERSION}; run the newer build",
                path.display()
            ),
        });
    }
    connection
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS endpoints (
                 id TEXT PRIMARY KEY,
                 checkpoint INTEGER,
                 status TEXT NOT NULL,
                 reason TEXT,
                 epoch INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS attempts (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 endpoint TEXT NOT NULL,
                 position INTEGER NOT NULL,
                 webhook_id TEXT NOT NULL,
                 attempt INTEGER NOT NULL,
                 at TEXT NOT NULL,
                 status INTEGER,
                 duration_ms INTEGER NOT NULL,
                 error TEXT
             );
             CREATE INDEX IF NOT EXISTS attempts_by_endpoint ON attempts (endpoint, seq);
             -- An operation's deliveries: the attempts at its events' positions.
             CREATE INDEX IF NOT EXISTS attempts_by_position ON attempts (endpoint, position, seq);
             CREATE TABLE IF NOT EXISTS definitions (
                 id TEXT PRIMARY KEY,
                 definition TEXT NOT NULL
             );
             PRAGMA user_version = 1;",
        )
        .map_err(sqlite("creating the journal's tables"))?;
    Ok(connection)
}

/// The attempts of `endpoint` a listing's rows hold (position, webhook id, attempt, time,
/// status, duration, error).
fn attempt_rows(
    mut rows: rusqlite::Rows<'_>,
    endpoint: &str,
) -> Result<Vec<AttemptRecord>, WebhookError> {
    let mut attempts = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite("reading an attempt"))? {
        let read = |row: &rusqlite::Row<'_>| {
            Ok::<_, rusqlite::Error>((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, u32>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, Option<u16>>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, Option<String>>(6)?,
            ))
        };
        let (position, webhook_id, attempt, at, status, duration_ms, error) =
            read(row).map_err(sqlite("reading an attempt"))?;
        let at = DateTime::parse_from_rfc3339(&at)
            .map_err(|error| WebhookError::Journal {
                reason: format!("an attempt's time `{at}` is not RFC 3339: {error}"),
            })?
            .with_timezone(&Utc);
        attempts.push(AttemptRecord {
            endpoint: endpoint.to_owned(),
            position: from_sql(position),
            webhook_id,
            attempt,
            at,
            status,
            duration_ms: from_sql(duration_ms),
            error,
        });
    }
    Ok(attempts)
}

fn read_record(
    connection: &Connection,
    endpoint: &str,
) -> Result<Option<EndpointRecord>, WebhookError> {
    let row = connection
        .query_row(
            "SELECT checkpoint, status, reason, epoch FROM endpoints WHERE id = ?1",
            params![endpoint],
            |row| {
                Ok((
                    row.get::<_, Option<i64>>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, i64>(3)?,
                ))
            },
        )
        .optional()
        .map_err(sqlite("reading an endpoint's record"))?;
    let Some((checkpoint, status, reason, epoch)) = row else {
        return Ok(None);
    };
    Ok(Some(EndpointRecord {
        checkpoint: checkpoint.map(from_sql),
        status: EndpointStatus::parse(&status)?,
        reason,
        epoch: from_sql(epoch),
    }))
}

/// SQLite integers are signed; positions and counts here stay far below `i64::MAX`.
fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn from_sql(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn truncate(text: &mut String, max_bytes: usize) {
    if text.len() > max_bytes {
        let mut end = max_bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

fn sqlite(doing: &'static str) -> impl Fn(rusqlite::Error) -> WebhookError {
    move |error| WebhookError::Journal {
        reason: format!("{doing}: {error}"),
    }
}

async fn blocking<T, F>(work: F) -> Result<T, WebhookError>
where
    F: FnOnce() -> Result<T, WebhookError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| WebhookError::Journal {
            reason: format!("a journal call failed: {error}"),
        })?
}

fn lock<T>(connection: &Mutex<T>) -> MutexGuard<'_, T> {
    // A call that panicked dropped its open transaction, which rolls it back: the connection is
    // as the last commit left it (and the trim counts, updated only after a commit, with it).
    connection.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32) -> AttemptRecord {
        AttemptRecord {
            endpoint: "billing".into(),
            position: u64::from(n),
            webhook_id: format!("msg_{n}"),
            attempt: 1,
            at: Utc::now(),
            status: Some(500),
            duration_ms: 3,
            error: Some("x".repeat(5_000)),
        }
    }

    #[tokio::test]
    async fn a_checkpoint_moves_only_under_the_epoch_it_was_read_at() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let journal = Journal::open(dir.path().join("j.webhooks"))
            .await
            .expect("opens");
        let record = journal.ensure("billing", Some(4)).await.expect("created");
        assert_eq!(record.checkpoint, Some(4));
        assert_eq!(
            journal
                .ensure("billing", Some(9))
                .await
                .expect("kept")
                .checkpoint,
            Some(4)
        );
        assert!(journal
            .advance("billing", record.epoch, 5)
            .await
            .expect("moves"));
        // An operator replays from 1 while a delivery at 6 is under way: the delivery's
        // checkpoint write must not undo the replay.
        assert!(journal
            .set_status("billing", EndpointStatus::Active, None, Some(Some(1)), None)
            .await
            .expect("replays"));
        assert!(!journal
            .advance("billing", record.epoch, 6)
            .await
            .expect("refused"));
        let after = journal
            .record("billing")
            .await
            .expect("reads")
            .expect("exists");
        assert_eq!(after.checkpoint, Some(1));
        assert_eq!(after.epoch, record.epoch + 1);
    }

    #[tokio::test]
    async fn the_attempt_log_keeps_a_bounded_number_of_rows_and_bounded_errors() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let journal = Journal::open(dir.path().join("j.webhooks"))
            .await
            .expect("opens");
        journal.ensure("billing", None).await.expect("created");
        for n in 0..5 {
            journal.record_attempt(attempt(n)).await.expect("recorded");
        }
        let listed = journal.attempts("billing", 2).await.expect("lists");
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].position, 4, "newest first");
        assert_eq!(
            listed[0].error.as_deref().map(str::len),
            Some(MAX_ATTEMPT_ERROR_BYTES)
        );
    }

    async fn rows(journal: &Journal) -> u64 {
        journal
            .call(|connection| {
                connection
                    .query_row("SELECT count(*) FROM attempts", [], |row| row.get(0))
                    .map(from_sql)
                    .map_err(sqlite("counting attempts"))
            })
            .await
            .expect("counted")
    }

    #[tokio::test]
    async fn the_attempt_log_is_trimmed_once_per_thousand_attempts_not_at_every_write() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let journal = Journal::open(dir.path().join("j.webhooks"))
            .await
            .expect("opens");
        let record = journal.ensure("billing", None).await.expect("created");
        let batch = |from: u64| -> Vec<AttemptRecord> {
            (from..from + ATTEMPTS_BETWEEN_TRIMS)
                .map(|n| AttemptRecord {
                    status: Some(200),
                    error: None,
                    ..attempt(u32::try_from(n).expect("small"))
                })
                .collect()
        };
        // Full batches trim at each write: the log is at its bound.
        let mut written = 0;
        while written < MAX_ATTEMPTS_KEPT_PER_ENDPOINT + ATTEMPTS_BETWEEN_TRIMS {
            assert!(journal
                .record_deliveries(batch(written), record.epoch, written)
                .await
                .expect("recorded"));
            written += ATTEMPTS_BETWEEN_TRIMS;
        }
        assert_eq!(rows(&journal).await, MAX_ATTEMPTS_KEPT_PER_ENDPOINT);
        // Single attempts do not walk the log each: it grows until the next trim is due.
        for n in 1..ATTEMPTS_BETWEEN_TRIMS {
            journal
                .record_attempt(attempt(u32::try_from(written + n).expect("small")))
                .await
                .expect("recorded");
        }
        assert_eq!(
            rows(&journal).await,
            MAX_ATTEMPTS_KEPT_PER_ENDPOINT + ATTEMPTS_BETWEEN_TRIMS - 1
        );
        journal.record_attempt(attempt(0)).await.expect("recorded");
        assert_eq!(rows(&journal).await, MAX_ATTEMPTS_KEPT_PER_ENDPOINT);
        let newest = journal.attempts("billing", 1).await.expect("lists");
        assert_eq!(newest[0].position, 0, "the trim keeps the newest");
    }

    #[tokio::test]
    async fn records_survive_reopening_the_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("j.webhooks");
        {
            let journal = Journal::open(&path).await.expect("opens");
            journal.ensure("billing", None).await.expect("created");
            journal
                .set_status(
                    "billing",
                    EndpointStatus::Paused,
                    Some("by ops".into()),
                    None,
                    None,
                )
                .await
                .expect("paused");
        }
        let journal = Journal::open(&path).await.expect("reopens");
        let record = journal
            .record("billing")
            .await
            .expect("reads")
            .expect("exists");
        assert_eq!(record.status, EndpointStatus::Paused);
        assert_eq!(record.reason.as_deref(), Some("by ops"));
    }
}
