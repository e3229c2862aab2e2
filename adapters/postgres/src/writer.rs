//! The writer task: the only place this store writes, committing appends in groups.
//!
//! Callers queue appends on a bounded channel. The task takes the first, drains whatever else is
//! queued (up to [`MAX_APPENDS_PER_COMMIT`]), and runs them all in one transaction on its own
//! connection, so concurrent callers share one commit (one WAL flush on the server). The
//! transaction's first statement locks the `log_head` row: positions are handed out under that
//! lock and the lock is held until COMMIT returns, so across every instance on the database
//! transactions that write events commit one after another, in position order (see the crate's
//! docs for why that is what makes subscriptions gap-free).
//!
//! Every refusal (a conflict, a reused event id) is decided before that append writes, so it
//! costs the others nothing. A commit whose answer is lost (the connection broke after COMMIT
//! was sent) is resolved at once on a fresh connection by applying the same appends again:
//! their event ids are deterministic, so one that did commit is recognised as stored, and one
//! that did not is written now. It must never answer success before the COMMIT that holds the
//! append returned, and never write an append twice.

use std::sync::Arc;

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::store::{AppendOutcome, EventData, ExpectedVersion, StoreError, StreamName};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_postgres::{Client, Statement};
use uuid::Uuid;

use crate::rules::{self, AppendPlan};
use crate::{
    codec, CommitCounters, Connector, MAX_APPENDS_PER_COMMIT, RESOLVE_ATTEMPTS, RESOLVE_PAUSE_MS,
};

/// One queued append and where to send its answer.
pub(crate) struct AppendRequest {
    pub(crate) stream: StreamName,
    pub(crate) expected: ExpectedVersion,
    pub(crate) events: Vec<EventData>,
    pub(crate) reply: oneshot::Sender<Result<AppendOutcome, StoreError>>,
}

/// The writer's statements, prepared once per connection.
struct Statements {
    lock_head: Statement,
    set_head: Statement,
    find_stream: Statement,
    find_ids: Statement,
    create_stream: Statement,
    set_last_version: Statement,
    insert_events: Statement,
    stored_from: Statement,
}

impl Statements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            lock_head: client
                .prepare("SELECT last_position FROM opledger.log_head FOR UPDATE")
                .await?,
            set_head: client
                .prepare("UPDATE opledger.log_head SET last_position = $1")
                .await?,
            find_stream: client
                .prepare("SELECT stream_id, last_version FROM opledger.streams WHERE name = $1")
                .await?,
            find_ids: client
                .prepare(
                    "SELECT event_id, stream, version FROM opledger.events WHERE event_id = ANY($1)",
                )
                .await?,
            create_stream: client
                .prepare(
                    "INSERT INTO opledger.streams (name, last_version) VALUES ($1, $2) RETURNING stream_id",
                )
                .await?,
            set_last_version: client
                .prepare("UPDATE opledger.streams SET last_version = $2 WHERE stream_id = $1")
                .await?,
            insert_events: client
                .prepare(
                    "INSERT INTO opledger.events \
                     (position, stream_id, version, stream, event_id, event_type, data, metadata) \
                     SELECT position, $2, version, $3, event_id, event_type, data, metadata \
                     FROM UNNEST($1::bigint[], $4::bigint[], $5::uuid[], $6::text[], $7::bytea[], $8::bytea[]) \
                     AS e (position, version, event_id, event_type, data, metadata)",
                )
                .await?,
            stored_from: client
                .prepare(
                    "SELECT event_id, version, position FROM opledger.events \
                     WHERE stream_id = $1 AND version >= $2 ORDER BY version LIMIT $3",
                )
                .await?,
        })
    }
}

/// A live connection and its statements.
struct Session {
    client: Client,
    statements: Statements,
}

pub(crate) struct Writer {
    connector: Arc<Connector>,
    session: Option<Session>,
    /// The newest position this store committed, for its own subscriptions.
    head: watch::Sender<Option<GlobalPosition>>,
    counters: Arc<CommitCounters>,
}

/// What one append did inside the batch's transaction.
#[derive(Clone, Copy)]
enum Applied {
    /// It wrote its events; durable once the batch commits.
    Written(AppendOutcome),
    /// Its events were already stored (a retry); it wrote nothing.
    AlreadyStored(AppendOutcome),
}

impl Applied {
    fn outcome(self) -> AppendOutcome {
        match self {
            Self::Written(outcome) | Self::AlreadyStored(outcome) => outcome,
        }
    }
}

/// Why one append did not apply.
enum Failure {
    /// Refused (conflict, reused event id) before it wrote anything.
    Refused(StoreError),
    /// The database failed; the whole batch is rolled back.
    Storage(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Storage(error)
    }
}

/// How a batch's transaction ended.
enum Ended {
    /// COMMIT returned: each append's result, in order.
    Committed(Vec<Result<Applied, StoreError>>),
    /// Nothing was committed (the server refused, or the connection broke before COMMIT).
    NotCommitted(StoreError),
    /// COMMIT was sent and its answer lost: each append's result had it committed.
    Unknown(Vec<Result<Applied, StoreError>>, String),
}

impl Writer {
    pub(crate) fn new(
        connector: Arc<Connector>,
        head: watch::Sender<Option<GlobalPosition>>,
        counters: Arc<CommitCounters>,
    ) -> Self {
        Self {
            connector,
            session: None,
            head,
            counters,
        }
    }

    /// Commits appends until every sender is dropped and the queue is empty.
    pub(crate) async fn run(mut self, mut requests: mpsc::Receiver<AppendRequest>) {
        let mut batch = Vec::with_capacity(MAX_APPENDS_PER_COMMIT);
        // `recv_many` waits for the first request, then takes whatever else is queued: that
        // drain is the group commit. It returns 0 only once the channel is closed and empty.
        while requests.recv_many(&mut batch, MAX_APPENDS_PER_COMMIT).await > 0 {
            let answers = self.commit(&batch).await;
            debug_assert_eq!(answers.len(), batch.len());
            for (request, answer) in batch.drain(..).zip(answers) {
                // A caller that stopped waiting dropped its receiver; its append stands anyway.
                let _ = request.reply.send(answer);
            }
        }
        tracing::debug!("append queue closed; the PostgreSQL writer stops");
    }

    /// Runs `batch` in one transaction and answers each append, resolving a lost COMMIT answer.
    async fn commit(&mut self, batch: &[AppendRequest]) -> Vec<Result<AppendOutcome, StoreError>> {
        let mut last_reason = String::new();
        for attempt in 0..=RESOLVE_ATTEMPTS {
            if attempt > 0 {
                // A broken connection is usually a server restarting or a network blip; asking
                // again at once would only meet the same failure.
                tokio::time::sleep(std::time::Duration::from_millis(
                    RESOLVE_PAUSE_MS * u64::from(attempt),
                ))
                .await;
            }
            match self.transact(batch).await {
                Ended::Committed(results) => {
                    self.publish(&results);
                    return results
                        .into_iter()
                        .map(|result| result.map(Applied::outcome))
                        .collect();
                }
                Ended::NotCommitted(error) => {
                    if attempt == 0 {
                        return vec![Err(error); batch.len()];
                    }
                    last_reason = format!("{last_reason}; then {error}");
                }
                Ended::Unknown(results, reason) => {
                    tracing::warn!(%reason, attempt, appends = batch.len(),
                        "the answer to a COMMIT was lost; applying the same appends again to learn what is stored");
                    // Refusals wrote nothing and stay refusals; the rest are asked again.
                    if results.iter().all(Result::is_err) {
                        return results
                            .into_iter()
                            .map(|r| r.map(Applied::outcome))
                            .collect();
                    }
                    last_reason = reason;
                }
            }
        }
        batch
            .iter()
            .map(|request| {
                Err(StoreError::AppendOutcomeUnknown {
                    stream: request.stream.clone(),
                    reason: format!("the commit's answer was lost ({last_reason}) and the database could not be asked again"),
                })
            })
            .collect()
    }

    /// Publishes the newest written position to this store's subscriptions.
    fn publish(&self, results: &[Result<Applied, StoreError>]) {
        let written = results
            .iter()
            .filter(|result| matches!(result, Ok(Applied::Written(_))))
            .count() as u64;
        if written > 0 {
            use std::sync::atomic::Ordering::Relaxed;
            self.counters.commits.fetch_add(1, Relaxed);
            self.counters.appends.fetch_add(written, Relaxed);
        }
        let newest = results
            .iter()
            .filter_map(|result| match result {
                Ok(Applied::Written(outcome)) => Some(outcome.position),
                _ => None,
            })
            .max();
        if let Some(newest) = newest {
            self.head.send_if_modified(|head| {
                // Positions are taken under the log's lock, so a commit's newest position is
                // above everything committed before it, by any instance.
                let grows = *head < Some(newest);
                debug_assert!(grows, "positions only grow: {head:?} then {newest}");
                if grows {
                    *head = Some(newest);
                }
                grows
            });
        }
    }

    /// One transaction over the whole batch on the writer's connection (opened if needed).
    async fn transact(&mut self, batch: &[AppendRequest]) -> Ended {
        let session = match self.session.take() {
            Some(session) if !session.client.is_closed() => session,
            _ => match self.connect().await {
                Ok(session) => session,
                Err(error) => return Ended::NotCommitted(error),
            },
        };
        let applied = apply_all(&session, batch).await;
        let results = match applied {
            Ok(results) => results,
            Err(error) => {
                // Nothing is committed until COMMIT: dropping a broken connection rolls back
                // on the server; on a live one, roll back and keep it.
                if !session.client.is_closed()
                    && session.client.batch_execute("ROLLBACK").await.is_ok()
                {
                    self.session = Some(session);
                }
                return Ended::NotCommitted(crate::unavailable(
                    "the append transaction failed",
                    &error,
                ));
            }
        };
        match session.client.batch_execute("COMMIT").await {
            Ok(()) => {
                self.session = Some(session);
                Ended::Committed(results)
            }
            // The server answered: the transaction was rolled back, nothing is stored.
            Err(error) if error.as_db_error().is_some() => {
                self.session = Some(session);
                Ended::NotCommitted(crate::unavailable("the commit was refused", &error))
            }
            // No answer: it may or may not have committed.
            Err(error) => Ended::Unknown(results, crate::describe(&error)),
        }
    }

    async fn connect(&self) -> Result<Session, StoreError> {
        let client = self.connector.connect().await?;
        let statements = Statements::prepare(&client).await.map_err(|error| {
            crate::unavailable("cannot prepare the writer's statements", &error)
        })?;
        Ok(Session { client, statements })
    }
}

/// Opens the transaction, takes the log's lock and applies every append; returns each
/// append's result. An error means nothing may be committed.
async fn apply_all(
    session: &Session,
    batch: &[AppendRequest],
) -> Result<Vec<Result<Applied, StoreError>>, tokio_postgres::Error> {
    let Session { client, statements } = session;
    client.batch_execute("BEGIN").await?;
    let head: i64 = client.query_one(&statements.lock_head, &[]).await?.get(0);
    let mut next_position = head + 1;
    let mut results = Vec::with_capacity(batch.len());
    for request in batch {
        results.push(match apply(session, request, &mut next_position).await {
            Ok(applied) => Ok(applied),
            Err(Failure::Refused(refusal)) => Err(refusal),
            Err(Failure::Storage(error)) => return Err(error),
        });
    }
    if next_position != head + 1 {
        client
            .execute(&statements.set_head, &[&(next_position - 1)])
            .await?;
    }
    Ok(results)
}

/// Applies one append inside the batch's transaction; a refusal is returned before it writes.
async fn apply(
    session: &Session,
    request: &AppendRequest,
    next_position: &mut i64,
) -> Result<Applied, Failure> {
    let Session { client, statements } = session;
    let stream = &request.stream;
    let found = client
        .query_opt(&statements.find_stream, &[&stream.as_str()])
        .await?
        .map(|row| Ok::<_, StoreError>((row.get::<_, i64>(0), codec::version(row.get(1))?)))
        .transpose()
        .map_err(Failure::Refused)?;
    let last = found.map(|(_, last)| last);
    let conflict = || Failure::Refused(rules::version_conflict(stream, request.expected, last));
    match rules::plan_append(request.expected, last) {
        AppendPlan::Write { first } => {
            let count = request.events.len();
            let Some(new_last) = codec::last_version_after(first, count) else {
                return Err(Failure::Refused(StoreError::InvalidAppend {
                    reason: format!("stream `{stream}` cannot grow past version {}", i64::MAX),
                }));
            };
            check_ids_unused(session, request).await?;
            let stream_id = match found {
                Some((stream_id, _)) => {
                    client
                        .execute(&statements.set_last_version, &[&stream_id, &new_last])
                        .await?;
                    stream_id
                }
                None => client
                    .query_one(&statements.create_stream, &[&stream.as_str(), &new_last])
                    .await?
                    .get(0),
            };
            let first_sql = new_last - (count as i64 - 1);
            let positions: Vec<i64> = (0..count as i64).map(|i| *next_position + i).collect();
            let versions: Vec<i64> = (0..count as i64).map(|i| first_sql + i).collect();
            let ids: Vec<Uuid> = request
                .events
                .iter()
                .map(|e| e.event_id.as_uuid())
                .collect();
            let types: Vec<&str> = request
                .events
                .iter()
                .map(|e| e.event_type.as_str())
                .collect();
            let data: Vec<&[u8]> = request.events.iter().map(|e| e.data.as_slice()).collect();
            let metadata: Vec<&[u8]> = request
                .events
                .iter()
                .map(|e| e.metadata.as_slice())
                .collect();
            client
                .execute(
                    &statements.insert_events,
                    &[
                        &positions,
                        &stream_id,
                        &stream.as_str(),
                        &versions,
                        &ids,
                        &types,
                        &data,
                        &metadata,
                    ],
                )
                .await?;
            *next_position += count as i64;
            let last_position = positions
                .last()
                .copied()
                .expect("an append carries at least one event");
            Ok(Applied::Written(AppendOutcome {
                next_expected: codec::version(new_last).map_err(Failure::Refused)?,
                position: codec::position(last_position).map_err(Failure::Refused)?,
            }))
        }
        AppendPlan::CheckStored { first } => {
            let Some((stream_id, _)) = found else {
                return Err(conflict());
            };
            let Some(first_sql) = codec::version_to_sql(first) else {
                return Err(conflict());
            };
            let rows = client
                .query(
                    &statements.stored_from,
                    &[&stream_id, &first_sql, &(request.events.len() as i64)],
                )
                .await?;
            let mut ids: Vec<EventId> = Vec::with_capacity(rows.len());
            let mut outcome = None;
            for row in &rows {
                ids.push(EventId::from_uuid(row.get(0)));
                outcome = Some(AppendOutcome {
                    next_expected: codec::version(row.get(1)).map_err(Failure::Refused)?,
                    position: codec::position(row.get(2)).map_err(Failure::Refused)?,
                });
            }
            match outcome {
                Some(outcome) if rules::is_same_append(&ids, &request.events) => {
                    Ok(Applied::AlreadyStored(outcome))
                }
                _ => Err(conflict()),
            }
        }
        AppendPlan::Conflict => Err(conflict()),
    }
}

/// Refuses an append whose event ids are already stored anywhere (an id names one event for
/// ever); checked before the append writes, the `UNIQUE` index still backs it up.
async fn check_ids_unused(session: &Session, request: &AppendRequest) -> Result<(), Failure> {
    let ids: Vec<Uuid> = request
        .events
        .iter()
        .map(|e| e.event_id.as_uuid())
        .collect();
    let rows = session
        .client
        .query(&session.statements.find_ids, &[&ids])
        .await?;
    let Some(row) = rows.first() else {
        return Ok(());
    };
    let event_id = EventId::from_uuid(row.get(0));
    let stored_stream = StreamName::new(row.get::<_, String>(1)).map_err(|_| {
        Failure::Refused(StoreError::Corrupt {
            reason: format!("the row holding event id {event_id} names an invalid stream"),
        })
    })?;
    let stored_version: StreamVersion = codec::version(row.get(2)).map_err(Failure::Refused)?;
    Err(Failure::Refused(rules::event_id_reused(
        &request.stream,
        event_id,
        &stored_stream,
        stored_version,
    )))
}
