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
//! Because the lock serialises every writer of the database, the time a transaction holds it is
//! the store's limit, and beyond the server's work and its WAL flush that time is waiting for
//! the client. So the common round, in which every append is fresh (its stream where it expects
//! it, its event ids new: everything but a lost race or a retry), is one round trip whatever its
//! size ([`ROUND_TRIPS_PER_COMMIT`]): BEGIN, the head moved by the round's event count (which
//! takes the lock and hands out the positions) with the log tree's new size and frontier, one
//! INSERT of the new streams, one UPDATE of the grown ones guarded by their expected versions,
//! one `INSERT … SELECT FROM UNNEST` of all the events, one of the tree's stored hashes
//! (`tree.rs`) and the rows of the tenants' trees the round grew (`tenant_trees.rs`, in the same
//! statement), the `NOTIFY` that wakes other instances' subscriptions (`listener.rs`), and
//! COMMIT, pipelined (sent together, run by the server in order). The tree's hashes and the
//! tenants' rows are computed here from the frontiers this writer's last commit left; the head's
//! `UPDATE` refuses them (the round then goes the checked path) if another instance has written
//! since, and a stream or tenant this writer has not met sends the round there too. The server's constraints
//! check that every append was fresh (see `Fresh`); if one was not, the transaction rolls back
//! and the round is decided on the checked path, two round trips
//! ([`ROUND_TRIPS_PER_CHECKED_COMMIT`]):
//! 1. BEGIN, the lock (which reads the log's head, the tree's frontier and the tenant trees'
//!    cover), every stream head the batch names (`name = ANY($1)`, with each stream's tenant),
//!    the trees of the round's tenants, and every of its event ids already stored
//!    (`event_id = ANY($1)`); the reads run after the lock is granted, so they see every commit
//!    before it;
//! 2. the appends decided here from what step 1 read (conflicts, retries, reused ids: the shared
//!    rules), then the same writes, the head, the `NOTIFY`, and COMMIT.
//!
//! On the peers' benchmark (`opledger serve`, two appends per operation) the second round trip
//! and the reads under the lock were most of a commit's time besides the WAL flush; the read of
//! stored event ids was the slowest statement of a commit.
//!
//! A round reads each stream once, so a batch in which a stream (or an event id) comes twice is
//! cut into rounds, each its own transaction, in queue order (two appends to one stream in one
//! batch are two workers racing for one operation: rare, and the second must see the first).
//!
//! On the checked path every refusal (a conflict, a reused event id) is decided before anything
//! is written, so it costs the others of its round nothing but the refused fresh attempt. A commit whose answer is lost (the connection broke after COMMIT
//! was sent) is resolved at once on a fresh connection by applying the same appends again:
//! their event ids are deterministic, so one that did commit is recognised as stored, and one
//! that did not is written now. It must never answer success before the COMMIT that holds the
//! append returned, and never write an append twice.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use opledger_domain::ids::{EventId, GlobalPosition, StreamVersion};
use opledger_domain::store::{
    AppendOutcome, EventView, ExpectedVersion, StoreError, StreamName, MAX_EVENTS_PER_APPEND,
    MAX_EVENT_BYTES,
};
use tokio::sync::{mpsc, watch};
use tokio_postgres::{Client, Row, Statement};
use uuid::Uuid;

use crate::rules::{self, AppendPlan};
use crate::tenant_trees::{self, Growth, StreamTenants, TenantRows, TenantTip};
use crate::tree::{Frontier, TreeRows};
use crate::{
    codec, CommitCounters, Connection, Connector, WriterWatch, MAX_APPENDS_PER_COMMIT,
    RESOLVE_ATTEMPTS, RESOLVE_PAUSE_MS,
};

/// Why a round's outcome is unknown when its answers did not come within `limit`.
fn no_answer_within(limit: std::time::Duration) -> String {
    format!(
        "no answer from PostgreSQL within {} ms (round_trip_timeout_ms) after COMMIT was sent; the connection was closed",
        limit.as_millis()
    )
}

/// Round trips to the server one group commit of fresh appends costs, whatever the number of
/// appends it carries (see the module's docs); `tests/postgres.rs` counts them through a proxy.
pub const ROUND_TRIPS_PER_COMMIT: usize = 1;
/// Round trips a round costs on the checked path, after its fresh attempt was refused: the
/// reads under the lock, then the writes and COMMIT.
pub const ROUND_TRIPS_PER_CHECKED_COMMIT: usize = 2;
const _: () = assert!(ROUND_TRIPS_PER_COMMIT < ROUND_TRIPS_PER_CHECKED_COMMIT);

/// Most event bytes (data and metadata) one transaction writes, in bytes: all of a round's
/// events travel as one array parameter, which PostgreSQL caps at 1 GiB, and a burst of large
/// events must not make every batch fail. The largest single append always fits.
pub const MAX_BYTES_PER_COMMIT: usize = MAX_EVENTS_PER_APPEND * MAX_EVENT_BYTES;
const _: () = assert!(MAX_BYTES_PER_COMMIT >= MAX_EVENTS_PER_APPEND * MAX_EVENT_BYTES);
const _: () = assert!(MAX_BYTES_PER_COMMIT < 1 << 30);

pub(crate) use opledger_store_core::queue::AppendRequest;

/// The writer's statements, prepared once per connection.
struct Statements {
    lock_head: Statement,
    read_streams: Statement,
    read_tenants: Statement,
    find_ids: Statement,
    stored_in: Statement,
    create_streams: Statement,
    grow_streams: Statement,
    insert_events: Statement,
    set_head: Statement,
    insert_tree: Statement,
    notify: Statement,
    // The one-round-trip path for a round of fresh appends (see `write_fresh`).
    grow_head: Statement,
    grow_expected: Statement,
    insert_fresh: Statement,
    notify_head: Statement,
}

impl Statements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            lock_head: client
                .prepare(
                    "SELECT last_position, tree_size, tree_frontier, tenants_size \
                     FROM opledger.log_head FOR UPDATE",
                )
                .await?,
            read_streams: client
                .prepare(
                    "SELECT name, stream_id, last_version, tenant FROM opledger.streams WHERE name = ANY($1)",
                )
                .await?,
            // The trees of the round's tenants: those its new streams' intents name ($1), and
            // those of its streams that exist ($2), whose tenant is on their row.
            read_tenants: client
                .prepare(
                    "SELECT tenant, size, frontier FROM opledger.tenant_trees \
                     WHERE tenant = ANY($1) \
                     OR tenant IN (SELECT s.tenant FROM opledger.streams s WHERE s.name = ANY($2))",
                )
                .await?,
            find_ids: client
                .prepare(
                    "SELECT event_id, stream, version FROM opledger.events WHERE event_id = ANY($1)",
                )
                .await?,
            // The stored events at the versions a possible retry would have taken, per stream.
            stored_in: client
                .prepare(
                    "SELECT e.stream_id, e.event_id, e.version, e.position \
                     FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[]) AS c (stream_id, first, last) \
                     JOIN opledger.events e ON e.stream_id = c.stream_id \
                     AND e.version BETWEEN c.first AND c.last \
                     ORDER BY e.stream_id, e.version",
                )
                .await?,
            create_streams: client
                .prepare(
                    "INSERT INTO opledger.streams (name, last_version, tenant) \
                     SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::text[])",
                )
                .await?,
            grow_streams: client
                .prepare(
                    "UPDATE opledger.streams AS s SET last_version = g.last_version \
                     FROM UNNEST($1::bigint[], $2::bigint[]) AS g (stream_id, last_version) \
                     WHERE s.stream_id = g.stream_id",
                )
                .await?,
            // The stream's id is looked up by name, so this statement needs no answer from the
            // INSERT of new streams before it (they run in order in one transaction). A name
            // without a row gives NULL, which `NOT NULL` refuses: the transaction fails rather
            // than commit events without their stream.
            insert_events: client
                .prepare(
                    "INSERT INTO opledger.events \
                     (position, stream_id, version, stream, event_id, event_type, data, metadata) \
                     SELECT e.position, \
                     (SELECT s.stream_id FROM opledger.streams s WHERE s.name = e.stream), \
                     e.version, e.stream, e.event_id, e.event_type, e.data, e.metadata \
                     FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::uuid[], $5::text[], $6::bytea[], $7::bytea[]) \
                     AS e (position, stream, version, event_id, event_type, data, metadata)",
                )
                .await?,
            set_head: client
                .prepare(
                    "UPDATE opledger.log_head \
                     SET last_position = $1, tree_size = $2, tree_frontier = $3, tenants_size = $4",
                )
                .await?,
            // The round's stored hashes of the log's tree (`tree.rs`); a stored index written
            // before fails the primary key, so a hash is never written twice. The tenants' trees
            // the round grew (`tenant_trees.rs`) are written by the same statement, so they cost
            // the commit no statement of their own.
            insert_tree: client
                .prepare(
                    "WITH tenants AS ( \
                         INSERT INTO opledger.tenant_trees (tenant, size, frontier) \
                         SELECT * FROM UNNEST($3::text[], $4::bigint[], $5::bytea[]) \
                         ON CONFLICT (tenant) DO UPDATE \
                         SET size = excluded.size, frontier = excluded.frontier) \
                     INSERT INTO opledger.log_tree (stored_index, hash) \
                     SELECT * FROM UNNEST($1::bigint[], $2::bytea[])",
                )
                .await?,
            // Delivered to every listening instance only if, and once, the transaction commits.
            notify: client
                .prepare(&format!(
                    "SELECT pg_notify('{}', $1)",
                    crate::listener::NOTIFY_CHANNEL
                ))
                .await?,
            // Takes the log's lock and hands out the round's positions in one statement, and
            // moves the tree and the tenant trees' cover with them. The tree's rows were computed
            // from the head this writer committed last ($2), the tenant trees' from the cover it
            // left ($5): if another instance wrote since (or the tree is not at the head, or the
            // cover moved), the head becomes -1, which its CHECK refuses, and the round is
            // decided on the checked path, which reads them under the lock.
            grow_head: client
                .prepare(
                    "UPDATE opledger.log_head SET last_position = \
                     CASE WHEN last_position = $2 AND tree_size = $2 \
                     AND tenants_size IS NOT DISTINCT FROM $5 THEN last_position + $1 ELSE -1 END, \
                     tree_size = $3, tree_frontier = $4, tenants_size = $6 \
                     RETURNING last_position",
                )
                .await?,
            // Moves only the streams still at the version their append expects; a stream that
            // is elsewhere keeps its version, and `insert_fresh` then refuses its events.
            grow_expected: client
                .prepare(
                    "UPDATE opledger.streams AS s SET last_version = g.last_version \
                     FROM UNNEST($1::text[], $2::bigint[], $3::bigint[]) AS g (name, expected, last_version) \
                     WHERE s.name = g.name AND s.last_version = g.expected",
                )
                .await?,
            // Positions follow the head `grow_head` moved (this transaction's own update), in
            // the round's order; the head is read once, as an uncorrelated subquery. The stream id is found only if the stream now ends at the
            // append's last version, i.e. this transaction created or moved it: otherwise it is
            // NULL, which `NOT NULL` refuses, and the transaction fails before COMMIT.
            insert_fresh: client
                .prepare(
                    "INSERT INTO opledger.events \
                     (position, stream_id, version, stream, event_id, event_type, data, metadata) \
                     SELECT (SELECT last_position FROM opledger.log_head) - $1 + e.ord, \
                     (SELECT s.stream_id FROM opledger.streams s \
                      WHERE s.name = e.stream AND s.last_version = e.stream_last), \
                     e.version, e.stream, e.event_id, e.event_type, e.data, e.metadata \
                     FROM UNNEST($2::text[], $3::bigint[], $4::bigint[], $5::uuid[], $6::text[], $7::bytea[], $8::bytea[]) \
                     WITH ORDINALITY AS e (stream, version, stream_last, event_id, event_type, data, metadata, ord)",
                )
                .await?,
            notify_head: client
                .prepare(&format!(
                    "SELECT pg_notify('{}', last_position::text) FROM opledger.log_head",
                    crate::listener::NOTIFY_CHANNEL
                ))
                .await?,
        })
    }
}

/// A live connection and its statements.
struct Session {
    client: Client,
    statements: Statements,
    /// Ends the connection's task (and closes its socket) when the session is dropped.
    _task: crate::EndsOnDrop,
}

pub(crate) struct Writer {
    connector: Arc<Connector>,
    session: Option<Session>,
    /// The newest position this store committed, for its own subscriptions.
    head: Arc<watch::Sender<Option<GlobalPosition>>>,
    counters: Arc<CommitCounters>,
    /// What readiness sees of this writer.
    watch: Arc<WriterWatch>,
    /// The log's tree and the tenants' trees as this writer's last commit left them: while no
    /// other instance has written since, the next round grows them without reading them
    /// (`None`: not known, read under the lock).
    tip: Option<Tip>,
    /// Each stream's tenant, as far as this writer met the stream.
    stream_tenants: StreamTenants,
}

/// What a writer knows of the trees after its last commit.
#[derive(Debug)]
struct Tip {
    tree: Frontier,
    tenants: TenantTip,
}

/// The trees after a round's events, and the rows to write for them.
struct Grown {
    tree: Frontier,
    rows: TreeRows,
    /// The log size the tenant trees cover after the round.
    covered: Option<i64>,
    tenants: HashMap<String, opledger_domain::merkle::tenants::Frontier>,
    tenant_rows: TenantRows,
}

/// Grows the log's tree from `tree` (and, when they cover it, the tenant trees from the
/// frontiers in `base`) by `count` events, the `index`-th given by `event`; `None` when a
/// tenant's tree is not in `base` and `missing_is_new` is false.
fn grow<'e>(
    mut tree: Frontier,
    covered: Option<i64>,
    base: &HashMap<String, opledger_domain::merkle::tenants::Frontier>,
    missing_is_new: bool,
    count: usize,
    event: impl Fn(usize) -> Result<(EventView<'e>, Option<&'e str>), StoreError>,
) -> Result<Option<Grown>, StoreError> {
    let in_step = covered == Some(tree.sql_size());
    let mut rows = TreeRows::default();
    let mut growth = Growth::new(base, missing_is_new);
    for index in 0..count {
        let (view, tenant) = event(index)?;
        let leaf = tree.push(&view, &mut rows)?;
        if let (true, Some(tenant)) = (in_step, tenant) {
            if !growth.push(tenant, view.position.value(), leaf) {
                return Ok(None);
            }
        }
    }
    let (tenants, tenant_rows) = growth.finish()?;
    Ok(Some(Grown {
        covered: if in_step {
            Some(tree.sql_size())
        } else {
            covered
        },
        tree,
        rows,
        tenants,
        tenant_rows,
    }))
}

/// The tenant of the stream of an append of `round`: from its first event when the append opens
/// the stream, else as `known` says (`None`: not known).
fn stream_tenant(
    request: &AppendRequest,
    known: impl FnOnce(&str) -> Option<Option<String>>,
) -> Option<Option<String>> {
    match request.expected {
        ExpectedVersion::NoStream => Some(
            request
                .events
                .first()
                .and_then(|first| tenant_trees::tenant_of(&first.event_type, &first.data)),
        ),
        ExpectedVersion::Exact(_) => known(request.stream.as_str()),
    }
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

/// How a round's transaction ended.
enum Ended {
    /// COMMIT returned: each append's result, in order.
    Committed(Vec<Result<Applied, StoreError>>),
    /// Nothing was committed (the server refused, or the connection broke before COMMIT).
    NotCommitted(StoreError),
    /// COMMIT was sent and its answer lost. `Some` when every append had been refused before
    /// anything was written (the refusals stand whatever happened to the COMMIT).
    Unknown(Option<Vec<StoreError>>, String),
}

impl Writer {
    pub(crate) fn new(
        connector: Arc<Connector>,
        head: Arc<watch::Sender<Option<GlobalPosition>>>,
        counters: Arc<CommitCounters>,
        watch: Arc<WriterWatch>,
    ) -> Self {
        Self {
            connector,
            session: None,
            head,
            counters,
            watch,
            tip: None,
            stream_tenants: StreamTenants::default(),
        }
    }

    /// Commits appends until every sender is dropped and the queue is empty.
    pub(crate) async fn run(mut self, mut requests: mpsc::Receiver<AppendRequest>) {
        let mut batch = Vec::with_capacity(MAX_APPENDS_PER_COMMIT);
        // `recv_many` waits for the first request, then takes whatever else is queued: that
        // drain is the group commit. It returns 0 only once the channel is closed and empty.
        while requests.recv_many(&mut batch, MAX_APPENDS_PER_COMMIT).await > 0 {
            let mut answers = Vec::with_capacity(batch.len());
            self.watch.busy(true);
            for round in rounds(&batch) {
                answers.extend(self.commit(round).await);
            }
            self.watch.busy(false);
            debug_assert_eq!(answers.len(), batch.len());
            for (request, answer) in batch.drain(..).zip(answers) {
                // A caller that stopped waiting dropped its receiver; its append stands anyway.
                let _ = request.reply.send(answer);
            }
        }
        tracing::debug!("append queue closed; the PostgreSQL writer stops");
    }

    /// Runs `round` in one transaction and answers each append, resolving a lost COMMIT answer;
    /// readiness sees the writer as stuck while it resolves.
    async fn commit(&mut self, round: &[AppendRequest]) -> Vec<Result<AppendOutcome, StoreError>> {
        let answers = self.commit_resolving(round).await;
        self.watch.resolving(false);
        answers
    }

    async fn commit_resolving(
        &mut self,
        round: &[AppendRequest],
    ) -> Vec<Result<AppendOutcome, StoreError>> {
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
            match self.transact(round).await {
                Ended::Committed(results) => {
                    self.publish(&results);
                    return results
                        .into_iter()
                        .map(|result| result.map(Applied::outcome))
                        .collect();
                }
                Ended::NotCommitted(error) => {
                    if attempt == 0 {
                        return vec![Err(error); round.len()];
                    }
                    last_reason = format!("{last_reason}; then {error}");
                }
                Ended::Unknown(refusals, reason) => {
                    tracing::warn!(%reason, attempt, appends = round.len(),
                        "the answer to a COMMIT was lost; applying the same appends again to learn what is stored");
                    // Refusals wrote nothing and stay refusals; the rest are asked again.
                    if let Some(refusals) = refusals {
                        return refusals.into_iter().map(Err).collect();
                    }
                    self.watch.resolving(true);
                    last_reason = reason;
                }
            }
        }
        round
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
            // Positions are taken under the log's lock, so a commit's newest position is above
            // everything committed before it, by any instance; the listener may have moved the
            // head there already (this commit's own notification can come first).
            crate::advance(&self.head, newest);
        }
    }

    /// One transaction over the whole round on the writer's connection (opened if needed):
    /// the reads under the lock, the decisions, the writes and COMMIT.
    async fn transact(&mut self, round: &[AppendRequest]) -> Ended {
        let session = match self.session.take() {
            Some(session) if !session.client.is_closed() => session,
            _ => match self.connect().await {
                Ok(session) => session,
                Err(error) => return Ended::NotCommitted(error),
            },
        };
        // Every round trip below is bounded by the round-trip timeout. A deadline that passes
        // drops the session, which closes its socket: the server rolls back what was not
        // committed, and a later round opens a new connection.
        let limit = self.connector.round_trip;
        // Known again only once this round commits.
        let tip = self.tip.take();
        // Another instance's commit that this one heard of makes the tip stale; one not heard of
        // yet is caught by the server (see `grow_head`).
        let seen = self.head.borrow().map_or(0, GlobalPosition::value);
        let tip = tip.filter(|tip| tip.tree.size() == seen);
        // A stream or a tenant this writer does not know sends the round to the checked path,
        // which reads them under the lock.
        let fresh = tip.as_ref().and_then(|tip| {
            let fresh = Fresh::plan(round, &self.stream_tenants, &tip.tenants, &tip.tree)?;
            let grown = fresh.grow(tip).ok().flatten()?;
            Some((fresh, grown))
        });
        if let (Some((fresh, grown)), Some(before)) = (fresh, tip.as_ref()) {
            // COMMIT goes out with the round's statements: no answer in time leaves the outcome
            // unknown, resolved by applying the appends again.
            let write = write_fresh(&session, &fresh, before, &grown);
            let Ok(ended) = tokio::time::timeout(limit, write).await else {
                return Ended::Unknown(None, no_answer_within(limit));
            };
            match ended {
                FreshEnded::Committed(head) => {
                    self.session = Some(session);
                    for (name, tenant) in fresh.new_names.iter().zip(&fresh.new_tenants) {
                        self.stream_tenants.remember(name, tenant.clone());
                    }
                    let mut tenants = tip.map(|tip| tip.tenants).unwrap_or_default();
                    tenants.covered = grown.covered;
                    tenants.keep(grown.tenants);
                    self.tip = Some(Tip {
                        tree: grown.tree,
                        tenants,
                    });
                    return Ended::Committed(fresh.outcomes(head));
                }
                // Something in the round is not what the fresh path assumed (a conflict, a
                // retry, a reused id): the transaction rolled back, and the checked path below
                // decides every append from what is stored.
                FreshEnded::Refused => {}
                FreshEnded::NotCommitted(error) => {
                    if !session.client.is_closed() {
                        self.session = Some(session);
                    }
                    return Ended::NotCommitted(error);
                }
                FreshEnded::Unknown(reason) => return Ended::Unknown(None, reason),
            }
        }
        let snapshot = match tokio::time::timeout(limit, read_under_lock(&session, round)).await {
            Ok(Ok(snapshot)) => snapshot,
            Ok(Err(error)) => {
                // Nothing is committed until COMMIT: dropping a broken connection rolls back
                // on the server; on a live one, roll back and keep it.
                let rolled_back =
                    tokio::time::timeout(limit, session.client.batch_execute("ROLLBACK"));
                if !session.client.is_closed() && matches!(rolled_back.await, Ok(Ok(()))) {
                    self.session = Some(session);
                }
                return Ended::NotCommitted(crate::unavailable(
                    "the append transaction failed",
                    &error,
                ));
            }
            // COMMIT was not sent: dropping the session rolls back.
            Err(_) => {
                return Ended::NotCommitted(crate::no_answer(
                    "the append transaction failed",
                    limit,
                ))
            }
        };
        let plan = plan(round, &snapshot);
        // A tree out of step with the log is never grown (see `tree.rs`): nothing is written.
        let grown = grow_checked(&snapshot, &plan.writes, &self.stream_tenants);
        let grown = match grown {
            Ok(grown) => grown,
            Err(error) => {
                let rolled_back =
                    tokio::time::timeout(limit, session.client.batch_execute("ROLLBACK"));
                if !session.client.is_closed() && matches!(rolled_back.await, Ok(Ok(()))) {
                    self.session = Some(session);
                }
                return Ended::NotCommitted(error);
            }
        };
        let write = write_and_commit(&session, &plan, snapshot.head, &grown);
        let Ok(answers) = tokio::time::timeout(limit, write).await else {
            let refusals = plan.refusals_if_all_refused();
            return Ended::Unknown(refusals, no_answer_within(limit));
        };
        let new_streams: Vec<(String, Option<String>)> = plan
            .writes
            .new_names
            .iter()
            .map(|name| (*name).to_owned())
            .zip(plan.writes.new_tenants.iter().cloned())
            .collect();
        let ended = answers.ended(plan, round);
        if matches!(ended, Ended::Committed(_)) {
            let Snapshot {
                head,
                stream_tenants,
                tenant_trees,
                ..
            } = snapshot;
            for (name, tenant) in new_streams.into_iter().chain(stream_tenants) {
                self.stream_tenants.remember(&name, tenant);
            }
            // What this writer remembered still holds if nobody wrote since its last commit;
            // the rows read under the lock hold in any case.
            let mut tenants = match tip {
                Some(tip) if tip.tree.sql_size() == head => tip.tenants,
                _ => TenantTip::default(),
            };
            tenants.covered = grown.covered;
            tenants.keep(tenant_trees.unwrap_or_default());
            tenants.keep(grown.tenants);
            self.tip = Some(Tip {
                tree: grown.tree,
                tenants,
            });
        }
        if !session.client.is_closed() && !matches!(ended, Ended::Unknown(..)) {
            self.session = Some(session);
        }
        ended
    }

    async fn connect(&self) -> Result<Session, StoreError> {
        let Connection { client, task, .. } = self.connector.connect().await?;
        let statements = crate::bounded(
            self.connector.round_trip,
            "cannot prepare the writer's statements",
            Statements::prepare(&client),
        )
        .await?;
        Ok(Session {
            client,
            statements,
            _task: task,
        })
    }
}

/// Cuts a batch into rounds, each one transaction, in queue order, so that no stream and no
/// event id comes twice in a round: every append of a round is then decided from what the
/// round's one read saw, and a later append to the same stream sees the earlier one committed.
/// A round also stays within [`MAX_BYTES_PER_COMMIT`].
fn rounds(batch: &[AppendRequest]) -> Vec<&[AppendRequest]> {
    let mut rounds = Vec::with_capacity(1);
    let mut start = 0;
    let mut bytes = 0;
    let mut streams: HashSet<&str> = HashSet::with_capacity(batch.len());
    let mut ids: HashSet<Uuid> = HashSet::with_capacity(batch.len());
    for (index, request) in batch.iter().enumerate() {
        let size: usize = request
            .events
            .iter()
            .map(|event| event.data.len() + event.metadata.len())
            .sum();
        let clashes = streams.contains(request.stream.as_str())
            || request
                .events
                .iter()
                .any(|event| ids.contains(&event.event_id.as_uuid()));
        if index > start && (clashes || bytes + size > MAX_BYTES_PER_COMMIT) {
            rounds.push(&batch[start..index]);
            start = index;
            bytes = 0;
            streams.clear();
            ids.clear();
        }
        bytes += size;
        streams.insert(request.stream.as_str());
        ids.extend(request.events.iter().map(|event| event.event_id.as_uuid()));
    }
    if start < batch.len() {
        rounds.push(&batch[start..]);
    }
    rounds
}

// ----- pipelining -------------------------------------------------------------------------------

/// A statement's parameter.
type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

/// A statement on its way: tokio-postgres encodes a request and queues it for the connection
/// on the first poll of its future, so polling several once, in order, before awaiting any
/// answer sends them together (one round trip) and the server runs them in that order.
enum Sent<F: Future> {
    Waiting(Pin<Box<F>>),
    Answered(F::Output),
}

/// Sends `statement` (see [`Sent`]).
async fn send<F: Future>(statement: F) -> Sent<F> {
    let mut statement = Box::pin(statement);
    let first = std::future::poll_fn(|cx| Poll::Ready(statement.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(output) => Sent::Answered(output),
        Poll::Pending => Sent::Waiting(statement),
    }
}

/// Sends `statement` if `wanted`; an unsent statement's future is dropped without being polled,
/// so nothing of it reaches the server.
async fn send_if<F: Future>(wanted: bool, statement: F) -> Option<Sent<F>> {
    match wanted {
        true => Some(send(statement).await),
        false => None,
    }
}

impl<F: Future> Sent<F> {
    async fn answer(self) -> F::Output {
        match self {
            Self::Waiting(statement) => statement.await,
            Self::Answered(output) => output,
        }
    }
}

impl<T, F: Future<Output = Result<T, tokio_postgres::Error>>> Sent<F> {
    /// Whether it failed before it reached the server (not encodable, or the connection was
    /// already closed): the server saw no error then, so a COMMIT after it would commit the
    /// transaction without it.
    fn failed_unsent(&self) -> bool {
        matches!(self, Self::Answered(Err(_)))
    }
}

/// Awaits an optional statement's answer, dropping what a write returns (its row count).
async fn answer_of<T, F: Future<Output = Result<T, tokio_postgres::Error>>>(
    sent: Option<Sent<F>>,
) -> Option<Result<(), tokio_postgres::Error>> {
    match sent {
        Some(sent) => Some(sent.answer().await.map(drop)),
        None => None,
    }
}

// ----- the common case in one round trip: fresh appends ----------------------------------------

/// A round whose appends are all assumed fresh: each stream is where its append expects it and
/// no event id is stored yet, as for every append but a lost race or a retry. Then nothing needs
/// to be read before writing, and the whole transaction is one pipelined round trip
/// ([`ROUND_TRIPS_PER_COMMIT`]), which is what the position lock is held for besides the
/// server's own work and its WAL flush. The server checks the assumption as it writes: a stream
/// that exists fails the `UNIQUE` name of the new streams, a stream elsewhere than expected is not
/// moved and its events find no stream id (`NOT NULL`), a stored event id or version fails its
/// `UNIQUE` index. Any of these aborts the transaction, its pipelined COMMIT becomes a rollback,
/// and the round is decided again on the checked path (two more round trips).
struct Fresh<'a> {
    new_names: Vec<&'a str>,
    new_lasts: Vec<i64>,
    /// The tenant each new stream's intent names.
    new_tenants: Vec<Option<String>>,
    /// Per event: its stream's tenant (`None` too while the tenant trees are not grown).
    tenants: Vec<Option<String>>,
    grown_names: Vec<&'a str>,
    grown_expected: Vec<i64>,
    grown_lasts: Vec<i64>,
    streams: Vec<&'a str>,
    versions: Vec<i64>,
    stream_lasts: Vec<i64>,
    event_ids: Vec<Uuid>,
    types: Vec<&'a str>,
    data: Vec<&'a [u8]>,
    metadata: Vec<&'a [u8]>,
    /// Per append: its new last version and how many events of the round end with it.
    ends: Vec<(i64, i64)>,
}

impl<'a> Fresh<'a> {
    /// The round's writes if every append were fresh; `None` when a version would not fit a
    /// `bigint` (the checked path refuses it with its reason), or while the tenant trees grow
    /// with the log, when a stream's tenant or a tenant's tree is not known here (the checked
    /// path reads them).
    fn plan(
        round: &'a [AppendRequest],
        known: &StreamTenants,
        tip: &TenantTip,
        tree: &Frontier,
    ) -> Option<Self> {
        let in_step = tip.covered == Some(tree.sql_size());
        let events = round.iter().map(|request| request.events.len()).sum();
        let mut fresh = Self {
            new_names: Vec::with_capacity(round.len()),
            new_lasts: Vec::with_capacity(round.len()),
            new_tenants: Vec::with_capacity(round.len()),
            tenants: Vec::with_capacity(events),
            grown_names: Vec::with_capacity(round.len()),
            grown_expected: Vec::with_capacity(round.len()),
            grown_lasts: Vec::with_capacity(round.len()),
            streams: Vec::with_capacity(events),
            versions: Vec::with_capacity(events),
            stream_lasts: Vec::with_capacity(events),
            event_ids: Vec::with_capacity(events),
            types: Vec::with_capacity(events),
            data: Vec::with_capacity(events),
            metadata: Vec::with_capacity(events),
            ends: Vec::with_capacity(round.len()),
        };
        let mut through = 0_i64;
        for request in round {
            let name = request.stream.as_str();
            let count = request.events.len();
            // An expected version within a `bigint` has a next one.
            let (first, expected) = match request.expected {
                ExpectedVersion::NoStream => (StreamVersion::FIRST, None),
                ExpectedVersion::Exact(version) => {
                    let expected = codec::version_to_sql(version)?;
                    (version.next(), Some(expected))
                }
            };
            let new_last = codec::last_version_after(first, count)?;
            let first = codec::version_to_sql(first)?;
            let tenant = match stream_tenant(request, |name| known.get(name).cloned()) {
                Some(tenant) => tenant,
                None if in_step => return None,
                None => None,
            };
            if let (true, Some(tenant)) = (in_step, &tenant) {
                if !tip.trees.contains_key(tenant) {
                    return None;
                }
            }
            match expected {
                None => {
                    fresh.new_names.push(name);
                    fresh.new_lasts.push(new_last);
                    fresh.new_tenants.push(tenant.clone());
                }
                Some(expected) => {
                    fresh.grown_names.push(name);
                    fresh.grown_expected.push(expected);
                    fresh.grown_lasts.push(new_last);
                }
            }
            for (offset, event) in (0..).zip(&request.events) {
                fresh.tenants.push(tenant.clone());
                fresh.streams.push(name);
                fresh.versions.push(first + offset);
                fresh.stream_lasts.push(new_last);
                fresh.event_ids.push(event.event_id.as_uuid());
                fresh.types.push(event.event_type.as_str());
                fresh.data.push(event.data.as_slice());
                fresh.metadata.push(event.metadata.as_slice());
            }
            through += count as i64;
            fresh.ends.push((new_last, through));
        }
        Some(fresh)
    }

    fn event_count(&self) -> i64 {
        self.streams.len() as i64
    }

    /// The trees after the round's events, taken at the positions after `tip`'s last leaf, and
    /// the rows to store; an error when a position would not fit (the checked path says why),
    /// `None` when a tenant's tree is not known here.
    fn grow(&self, tip: &Tip) -> Result<Option<Grown>, StoreError> {
        let first = tip.tree.sql_size() + 1;
        grow(
            tip.tree.clone(),
            tip.tenants.covered,
            &tip.tenants.trees,
            false,
            self.streams.len(),
            |index| {
                let view = EventView {
                    stream: self.streams[index],
                    version: codec::version(self.versions[index])?,
                    position: codec::position(first + index as i64)?,
                    event_id: EventId::from_uuid(self.event_ids[index]),
                    event_type: self.types[index],
                    data: self.data[index],
                    metadata: self.metadata[index],
                };
                Ok((view, self.tenants[index].as_deref()))
            },
        )
    }

    /// Each append's outcome once the round committed with the log's head at `head`.
    fn outcomes(&self, head: i64) -> Vec<Result<Applied, StoreError>> {
        let first_position = head - self.event_count();
        self.ends
            .iter()
            .map(|&(new_last, through)| {
                Ok(Applied::Written(AppendOutcome {
                    next_expected: codec::version(new_last)?,
                    position: codec::position(first_position + through)?,
                }))
            })
            .collect()
    }
}

/// SQLSTATE class 23, integrity constraint violations: how the server says an append of a
/// fresh round was not fresh (`unique_violation`, `not_null_violation`).
const INTEGRITY_CONSTRAINT_CLASS: &str = "23";

/// How a fresh round's transaction ended.
enum FreshEnded {
    /// COMMIT returned; the log's head after it.
    Committed(i64),
    /// A constraint refused a statement, so some append was not fresh: rolled back, nothing
    /// stored, the connection usable.
    Refused,
    /// Nothing committed, and the server did not say why (the connection broke before COMMIT
    /// was sent, or a statement could not be sent).
    NotCommitted(StoreError),
    /// COMMIT was sent and its answer lost.
    Unknown(String),
}

/// BEGIN, the lock and the positions, the streams, the events, the `NOTIFY` and COMMIT, in one
/// round trip (see [`Fresh`]).
async fn write_fresh(
    session: &Session,
    fresh: &Fresh<'_>,
    before: &Tip,
    grown: &Grown,
) -> FreshEnded {
    let Session {
        client, statements, ..
    } = session;
    let count = fresh.event_count();
    let (head_before, tree_size, frontier) = (
        before.tree.sql_size(),
        grown.tree.sql_size(),
        grown.tree.encode(),
    );
    let head_params: [Param; 6] = [
        &count,
        &head_before,
        &tree_size,
        &frontier,
        &before.tenants.covered,
        &grown.covered,
    ];
    let (rows, tenants) = (&grown.rows, &grown.tenant_rows);
    let tree_params: [Param; 5] = [
        &rows.indexes,
        &rows.hashes,
        &tenants.tenants,
        &tenants.sizes,
        &tenants.frontiers,
    ];
    let create_params: [Param; 3] = [&fresh.new_names, &fresh.new_lasts, &fresh.new_tenants];
    let grow_params: [Param; 3] = [
        &fresh.grown_names,
        &fresh.grown_expected,
        &fresh.grown_lasts,
    ];
    let insert_params: [Param; 8] = [
        &count,
        &fresh.streams,
        &fresh.versions,
        &fresh.stream_lasts,
        &fresh.event_ids,
        &fresh.types,
        &fresh.data,
        &fresh.metadata,
    ];
    let s = statements;
    let begin = send(client.batch_execute("BEGIN")).await;
    let head = send(client.query_one(&s.grow_head, &head_params)).await;
    let new = !fresh.new_names.is_empty();
    let created = send_if(new, client.execute(&s.create_streams, &create_params)).await;
    let grow = !fresh.grown_names.is_empty();
    let grown = send_if(grow, client.execute(&s.grow_expected, &grow_params)).await;
    let inserted = send(client.execute(&s.insert_fresh, &insert_params)).await;
    let tree = send(client.execute(&s.insert_tree, &tree_params)).await;
    let notified = send(client.query(&s.notify_head, &[])).await;
    let unsent = begin.failed_unsent()
        || head.failed_unsent()
        || created.as_ref().is_some_and(Sent::failed_unsent)
        || grown.as_ref().is_some_and(Sent::failed_unsent)
        || inserted.failed_unsent()
        || tree.failed_unsent()
        || notified.failed_unsent();
    let end = send(client.batch_execute(if unsent { "ROLLBACK" } else { "COMMIT" })).await;
    // Every answer is awaited before any is judged, so none is left unread on the connection.
    let begin = begin.answer().await;
    let head = head.answer().await;
    let created = answer_of(created).await;
    let grown = answer_of(grown).await;
    let inserted = inserted.answer().await.map(drop);
    let tree = tree.answer().await.map(drop);
    let notified = notified.answer().await.map(drop);
    let end = end.answer().await;
    let errors = [
        begin.as_ref().err(),
        head.as_ref().err(),
        created.as_ref().and_then(|answer| answer.as_ref().err()),
        grown.as_ref().and_then(|answer| answer.as_ref().err()),
        inserted.as_ref().err(),
        tree.as_ref().err(),
        notified.as_ref().err(),
        end.as_ref().err(),
    ];
    let mut lost = None;
    for error in errors.into_iter().flatten() {
        // The first refusal is the cause (the statements after it only report the aborted
        // transaction). A constraint is the server finding an append not fresh; anything else
        // (a statement timeout behind another instance's lock, say) would fail the checked
        // path the same way, after as long a wait.
        match error.as_db_error() {
            Some(db) if db.code().code().starts_with(INTEGRITY_CONSTRAINT_CLASS) => {
                return FreshEnded::Refused
            }
            Some(_) => {
                return FreshEnded::NotCommitted(crate::unavailable(
                    "the append transaction failed",
                    error,
                ))
            }
            None => lost = lost.or(Some(error)),
        }
    }
    match (lost, unsent) {
        (None, false) => match head {
            Ok(row) => FreshEnded::Committed(row.get(0)),
            // Unreachable: an error of `head` is among those judged above.
            Err(error) => FreshEnded::NotCommitted(crate::unavailable(
                "the append transaction failed",
                &error,
            )),
        },
        (Some(error), false) => FreshEnded::Unknown(crate::describe(error)),
        (Some(error), true) => {
            FreshEnded::NotCommitted(crate::unavailable("the append transaction failed", error))
        }
        (None, true) => FreshEnded::NotCommitted(StoreError::Unavailable {
            reason: "the append transaction was rolled back".into(),
        }),
    }
}

// ----- round trip 1: the reads under the lock ---------------------------------------------------

/// What the first round trip read under the log's lock.
struct Snapshot {
    /// The newest position handed out before this transaction.
    head: i64,
    /// Each stream of the round that exists: its id and last version.
    streams: HashMap<String, (i64, i64)>,
    /// Each of the round's event ids already stored: the stream and version holding it.
    stored_ids: HashMap<Uuid, (String, i64)>,
    /// The log's tree as the head row holds it: its size and frontier.
    tree_size: i64,
    tree_frontier: Vec<u8>,
    /// The log size the tenant trees cover (`None`: never built).
    tenants_size: Option<i64>,
    /// Each existing stream of the round: its tenant.
    stream_tenants: HashMap<String, Option<String>>,
    /// The trees of the round's tenants that have one.
    tenant_trees: Result<HashMap<String, opledger_domain::merkle::tenants::Frontier>, StoreError>,
}

impl Snapshot {
    /// The log's tree, which must be at the log's head: a tree behind it means events were
    /// added behind the ledger's back (or its rows changed), and it is never grown then.
    fn tree(&self) -> Result<Frontier, StoreError> {
        let frontier = Frontier::decode(self.tree_size, &self.tree_frontier)?;
        if self.tree_size != self.head {
            return Err(crate::tree::corrupt(&format!(
                "the log's tree has {} leaves, but the log's head is at position {}, so the tree's next leaf is not the next event",
                self.tree_size, self.head
            )));
        }
        Ok(frontier)
    }
}

/// The trees after the checked round's writes, and the rows to store: the log's tree from the
/// head row, each tenant's from its row read under the lock (a tenant without one has no tree
/// yet).
fn grow_checked(
    snapshot: &Snapshot,
    writes: &Writes<'_>,
    known: &StreamTenants,
) -> Result<Grown, StoreError> {
    let tree = snapshot.tree()?;
    let in_step = snapshot.tenants_size == Some(tree.sql_size());
    let opened: HashMap<&str, Option<&str>> = writes
        .new_names
        .iter()
        .zip(&writes.new_tenants)
        .map(|(name, tenant)| (*name, tenant.as_deref()))
        .collect();
    let tenant_of = |name: &str| -> Result<Option<&str>, StoreError> {
        if let Some(tenant) = opened.get(name) {
            return Ok(*tenant);
        }
        match snapshot
            .stream_tenants
            .get(name)
            .or_else(|| known.get(name))
        {
            Some(tenant) => Ok(tenant.as_deref()),
            // Unreachable: a stream the round grows and does not open exists, and was read.
            None if in_step => Err(crate::tree::corrupt(&format!(
                "the tenant of stream `{name}` is not known"
            ))),
            None => Ok(None),
        }
    };
    let none = HashMap::new();
    let base = match &snapshot.tenant_trees {
        Ok(trees) => trees,
        Err(error) if in_step => return Err(error.clone()),
        Err(_) => &none,
    };
    let grown = grow(
        tree,
        snapshot.tenants_size,
        base,
        true,
        writes.positions.len(),
        |index| {
            let view = EventView {
                stream: writes.streams[index],
                version: codec::version(writes.versions[index])?,
                position: codec::position(writes.positions[index])?,
                event_id: EventId::from_uuid(writes.event_ids[index]),
                event_type: writes.types[index],
                data: writes.data[index],
                metadata: writes.metadata[index],
            };
            Ok((view, tenant_of(writes.streams[index])?))
        },
    )?;
    Ok(grown.expect("a tenant without a row read under the lock has no tree yet"))
}

/// BEGIN, the lock and the round's reads, in one round trip. An error means nothing may be
/// committed.
async fn read_under_lock(
    session: &Session,
    round: &[AppendRequest],
) -> Result<Snapshot, tokio_postgres::Error> {
    let Session {
        client, statements, ..
    } = session;
    let names: Vec<&str> = round
        .iter()
        .map(|request| request.stream.as_str())
        .collect();
    let ids: Vec<Uuid> = round
        .iter()
        .flat_map(|request| request.events.iter().map(|event| event.event_id.as_uuid()))
        .collect();
    // The tenants the round's new streams' intents name.
    let opened: Vec<String> = round
        .iter()
        .filter_map(|request| stream_tenant(request, |_| None).flatten())
        .collect();
    let begin = send(client.batch_execute("BEGIN")).await;
    let lock = send(client.query_one(&statements.lock_head, &[])).await;
    let (tenant_params, names, ids): ([Param; 2], [Param; 1], [Param; 1]) =
        ([&opened, &names], [&names], [&ids]);
    let streams = send(client.query(&statements.read_streams, &names)).await;
    let tenants = send(client.query(&statements.read_tenants, &tenant_params)).await;
    let stored = send(client.query(&statements.find_ids, &ids)).await;
    // Every answer is awaited before any is judged, so none is left unread on the connection.
    let (begin, lock, streams, tenants, stored) = (
        begin.answer().await,
        lock.answer().await,
        streams.answer().await,
        tenants.answer().await,
        stored.answer().await,
    );
    begin?;
    let lock = lock?;
    let (head, tree_size, tree_frontier, tenants_size): (i64, i64, Vec<u8>, Option<i64>) =
        (lock.get(0), lock.get(1), lock.get(2), lock.get(3));
    let streams = streams?;
    let stream_tenants = streams.iter().map(|row| (row.get(0), row.get(3))).collect();
    let streams = streams
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect();
    // A row that is not a frontier refuses the round while the tenant trees are grown, as in
    // the SQLite store (`opledger verify` names the tenant).
    let tenant_trees = tenants?
        .iter()
        .map(|row| {
            let tenant: String = row.get(0);
            tenant_trees::frontier_of(&tenant, row.get(1), row.get(2)).map(|tree| (tenant, tree))
        })
        .collect();
    let stored_ids = stored?
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect();
    Ok(Snapshot {
        head,
        streams,
        stored_ids,
        tree_size,
        tree_frontier,
        tenants_size,
        stream_tenants,
        tenant_trees,
    })
}

// ----- the decisions, in memory -----------------------------------------------------------------

/// What the round does, decided from its snapshot.
struct Plan<'a> {
    /// Per append, in order: its result now, or "compare with what is stored".
    decisions: Vec<Decision>,
    writes: Writes<'a>,
    checks: Checks,
    /// The newest position the round hands out (the snapshot's head when it writes nothing).
    last_position: i64,
}

enum Decision {
    Done(Result<Applied, StoreError>),
    /// The stream is past the expected version: a retry if the stored events carry the
    /// appended ids (compared once the round's check answered), a conflict otherwise.
    CompareStored {
        stream_id: i64,
        last: Option<StreamVersion>,
    },
}

/// The round's writes, as the columns of its statements.
#[derive(Default)]
struct Writes<'a> {
    new_names: Vec<&'a str>,
    new_lasts: Vec<i64>,
    /// The tenant each new stream's intent names.
    new_tenants: Vec<Option<String>>,
    grown_ids: Vec<i64>,
    grown_lasts: Vec<i64>,
    positions: Vec<i64>,
    streams: Vec<&'a str>,
    versions: Vec<i64>,
    event_ids: Vec<Uuid>,
    types: Vec<&'a str>,
    data: Vec<&'a [u8]>,
    metadata: Vec<&'a [u8]>,
}

/// The stored versions to read for the appends that may be retries: per stream, first..=last.
#[derive(Default)]
struct Checks {
    stream_ids: Vec<i64>,
    firsts: Vec<i64>,
    lasts: Vec<i64>,
}

impl Checks {
    fn is_empty(&self) -> bool {
        self.stream_ids.is_empty()
    }
}

fn plan<'a>(round: &'a [AppendRequest], snapshot: &Snapshot) -> Plan<'a> {
    let mut plan = Plan {
        decisions: Vec::with_capacity(round.len()),
        writes: Writes::default(),
        checks: Checks::default(),
        last_position: snapshot.head,
    };
    for request in round {
        let decision = decide(request, snapshot, &mut plan).unwrap_or_else(|refusal| {
            // Refused before anything of it was added to the writes.
            Decision::Done(Err(refusal))
        });
        plan.decisions.push(decision);
    }
    plan
}

/// Decides one append against the snapshot; a refusal adds nothing to the plan.
fn decide<'a>(
    request: &'a AppendRequest,
    snapshot: &Snapshot,
    plan: &mut Plan<'a>,
) -> Result<Decision, StoreError> {
    let stream = &request.stream;
    let found = snapshot.streams.get(stream.as_str()).copied();
    let last = found.map(|(_, last)| codec::version(last)).transpose()?;
    let conflict = || rules::version_conflict(stream, request.expected, last);
    let count = request.events.len();
    match rules::plan_append(request.expected, last) {
        AppendPlan::Write { first } => {
            let Some(new_last) = codec::last_version_after(first, count) else {
                return Err(StoreError::InvalidAppend {
                    reason: format!("stream `{stream}` cannot grow past version {}", i64::MAX),
                });
            };
            refuse_reused_ids(request, snapshot)?;
            let outcome = plan.add_write(request, found.map(|(id, _)| id), new_last)?;
            Ok(Decision::Done(Ok(Applied::Written(outcome))))
        }
        AppendPlan::CheckStored { first } => {
            let (Some((stream_id, _)), Some(first)) = (found, codec::version_to_sql(first)) else {
                return Err(conflict());
            };
            plan.checks.stream_ids.push(stream_id);
            plan.checks.firsts.push(first);
            plan.checks
                .lasts
                .push(first.saturating_add(count as i64 - 1));
            Ok(Decision::CompareStored { stream_id, last })
        }
        AppendPlan::Conflict => Err(conflict()),
    }
}

impl<'a> Plan<'a> {
    /// Every append's refusal when every append of the round was refused before anything was
    /// written (they stand whatever happened to the COMMIT); `None` otherwise.
    fn refusals_if_all_refused(&self) -> Option<Vec<StoreError>> {
        self.decisions
            .iter()
            .map(|decision| match decision {
                Decision::Done(Err(refusal)) => Some(refusal.clone()),
                _ => None,
            })
            .collect()
    }

    /// Adds an append's events after the round's last position; returns its outcome.
    fn add_write(
        &mut self,
        request: &'a AppendRequest,
        stream_id: Option<i64>,
        new_last: i64,
    ) -> Result<AppendOutcome, StoreError> {
        let count = request.events.len() as i64;
        let last_position = self.last_position + count;
        // Both checked before anything is added, so a refusal leaves the writes as they were.
        let outcome = AppendOutcome {
            next_expected: codec::version(new_last)?,
            position: codec::position(last_position)?,
        };
        let name = request.stream.as_str();
        let writes = &mut self.writes;
        match stream_id {
            Some(stream_id) => {
                writes.grown_ids.push(stream_id);
                writes.grown_lasts.push(new_last);
            }
            None => {
                writes.new_names.push(name);
                writes.new_lasts.push(new_last);
                writes
                    .new_tenants
                    .push(stream_tenant(request, |_| None).flatten());
            }
        }
        let first_version = new_last - (count - 1);
        for (offset, event) in (0..).zip(&request.events) {
            writes.positions.push(self.last_position + 1 + offset);
            writes.streams.push(name);
            writes.versions.push(first_version + offset);
            writes.event_ids.push(event.event_id.as_uuid());
            writes.types.push(event.event_type.as_str());
            writes.data.push(event.data.as_slice());
            writes.metadata.push(event.metadata.as_slice());
        }
        self.last_position = last_position;
        Ok(outcome)
    }
}

/// Refuses an append whose event ids are already stored anywhere (an id names one event for
/// ever); decided before the append writes, the `UNIQUE` index still backs it up.
fn refuse_reused_ids(request: &AppendRequest, snapshot: &Snapshot) -> Result<(), StoreError> {
    for event in &request.events {
        let Some((stored_stream, stored_version)) =
            snapshot.stored_ids.get(&event.event_id.as_uuid())
        else {
            continue;
        };
        let stored_stream =
            StreamName::new(stored_stream.clone()).map_err(|_| StoreError::Corrupt {
                reason: format!(
                    "the row holding event id {} names an invalid stream",
                    event.event_id
                ),
            })?;
        return Err(rules::event_id_reused(
            &request.stream,
            event.event_id,
            &stored_stream,
            codec::version(*stored_version)?,
        ));
    }
    Ok(())
}

// ----- round trip 2: the writes and COMMIT ------------------------------------------------------

/// What the second round trip answered.
struct Answers {
    /// The stored events the retries are compared with (`None`: no append needed them).
    stored: Option<Result<Vec<Row>, tokio_postgres::Error>>,
    /// Each write statement sent.
    writes: Vec<Result<(), tokio_postgres::Error>>,
    /// The COMMIT (or the ROLLBACK sent instead).
    end: Result<(), tokio_postgres::Error>,
    /// Whether COMMIT was sent (not ROLLBACK).
    commit_sent: bool,
}

/// The round's writes and COMMIT, in one round trip; empty statements are not sent.
async fn write_and_commit(session: &Session, plan: &Plan<'_>, head: i64, grown: &Grown) -> Answers {
    let Session {
        client, statements, ..
    } = session;
    let (writes, checks) = (&plan.writes, &plan.checks);
    // Each statement's parameters outlive the statement's future, which holds them until the
    // statement is sent.
    let check_params: [Param; 3] = [&checks.stream_ids, &checks.firsts, &checks.lasts];
    let create_params: [Param; 3] = [&writes.new_names, &writes.new_lasts, &writes.new_tenants];
    let grow_params: [Param; 2] = [&writes.grown_ids, &writes.grown_lasts];
    let insert_params: [Param; 7] = [
        &writes.positions,
        &writes.streams,
        &writes.versions,
        &writes.event_ids,
        &writes.types,
        &writes.data,
        &writes.metadata,
    ];
    let (tree_size, frontier) = (grown.tree.sql_size(), grown.tree.encode());
    let head_params: [Param; 4] = [&plan.last_position, &tree_size, &frontier, &grown.covered];
    let (rows, tenants) = (&grown.rows, &grown.tenant_rows);
    let tree_params: [Param; 5] = [
        &rows.indexes,
        &rows.hashes,
        &tenants.tenants,
        &tenants.sizes,
        &tenants.frontiers,
    ];
    let newest = plan.last_position.to_string();
    let notify_params: [Param; 1] = [&newest];
    let (s, no_writes) = (statements, plan.last_position == head);
    let stored = send_if(
        !checks.is_empty(),
        client.query(&s.stored_in, &check_params),
    )
    .await;
    let new = !writes.new_names.is_empty();
    let created = send_if(new, client.execute(&s.create_streams, &create_params)).await;
    let grow = !writes.grown_ids.is_empty();
    let grown = send_if(grow, client.execute(&s.grow_streams, &grow_params)).await;
    let inserted = send_if(!no_writes, client.execute(&s.insert_events, &insert_params)).await;
    let moved_head = send_if(!no_writes, client.execute(&s.set_head, &head_params)).await;
    let grown_tree = send_if(!no_writes, client.execute(&s.insert_tree, &tree_params)).await;
    let notified = send_if(!no_writes, client.query(&s.notify, &notify_params)).await;
    let unsent = stored.as_ref().is_some_and(Sent::failed_unsent)
        || created.as_ref().is_some_and(Sent::failed_unsent)
        || grown.as_ref().is_some_and(Sent::failed_unsent)
        || inserted.as_ref().is_some_and(Sent::failed_unsent)
        || moved_head.as_ref().is_some_and(Sent::failed_unsent)
        || grown_tree.as_ref().is_some_and(Sent::failed_unsent)
        || notified.as_ref().is_some_and(Sent::failed_unsent);
    let end = send(client.batch_execute(if unsent { "ROLLBACK" } else { "COMMIT" })).await;
    let stored = match stored {
        Some(stored) => Some(stored.answer().await),
        None => None,
    };
    let writes = [
        answer_of(created).await,
        answer_of(grown).await,
        answer_of(inserted).await,
        answer_of(moved_head).await,
        answer_of(grown_tree).await,
        answer_of(notified).await,
    ]
    .into_iter()
    .flatten()
    .collect();
    Answers {
        stored,
        writes,
        end: end.answer().await,
        commit_sent: !unsent,
    }
}

impl Answers {
    /// How the transaction ended. A statement the server refused aborted the transaction, and
    /// a COMMIT in an aborted transaction is a rollback: nothing is stored. No refusal, but an
    /// answer lost on the way (the connection broke): the COMMIT may have run, the outcome is
    /// unknown.
    fn ended(self, plan: Plan<'_>, round: &[AppendRequest]) -> Ended {
        let statements = self
            .stored
            .iter()
            .map(|stored| stored.as_ref().map(drop))
            .chain(self.writes.iter().map(|write| write.as_ref().map(drop)));
        let mut refused = None;
        let mut lost = None;
        for error in statements.filter_map(Result::err) {
            match error.as_db_error() {
                Some(_) => refused = refused.or(Some(error)),
                None => lost = lost.or(Some(error)),
            }
        }
        if let Some(error) = refused {
            return Ended::NotCommitted(crate::unavailable("the append transaction failed", error));
        }
        match &self.end {
            // The server answered: the transaction was rolled back, nothing is stored.
            Err(error) if error.as_db_error().is_some() => {
                return Ended::NotCommitted(crate::unavailable("the commit was refused", error));
            }
            Err(error) if lost.is_none() => lost = Some(error),
            _ => {}
        }
        if let Some(error) = lost {
            if !self.commit_sent {
                return Ended::NotCommitted(crate::unavailable(
                    "the append transaction failed",
                    error,
                ));
            }
            return Ended::Unknown(plan.refusals_if_all_refused(), crate::describe(error));
        }
        if !self.commit_sent {
            // Unreachable in practice: a statement that failed unsent returned an error above.
            return Ended::NotCommitted(StoreError::Unavailable {
                reason: "the append transaction was rolled back".into(),
            });
        }
        let rows = self.stored.and_then(Result::ok).unwrap_or_default();
        Ended::Committed(compare_stored(plan.decisions, round, &rows))
    }
}

/// Answers each append of a committed round: the decided ones as they are, the possible
/// retries by comparing their ids with what is stored at the versions they would have taken.
fn compare_stored(
    decisions: Vec<Decision>,
    round: &[AppendRequest],
    rows: &[Row],
) -> Vec<Result<Applied, StoreError>> {
    let mut stored: HashMap<i64, Vec<&Row>> = HashMap::new();
    for row in rows {
        stored.entry(row.get(0)).or_default().push(row);
    }
    decisions
        .into_iter()
        .zip(round)
        .map(|(decision, request)| match decision {
            Decision::Done(result) => result,
            Decision::CompareStored { stream_id, last } => {
                let rows = stored
                    .get(&stream_id)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let ids: Vec<EventId> = rows
                    .iter()
                    .map(|row| EventId::from_uuid(row.get(1)))
                    .collect();
                match rows.last() {
                    Some(row) if rules::is_same_append(&ids, &request.events) => {
                        Ok(Applied::AlreadyStored(AppendOutcome {
                            next_expected: codec::version(row.get(2))?,
                            position: codec::position(row.get(3))?,
                        }))
                    }
                    _ => Err(rules::version_conflict(
                        &request.stream,
                        request.expected,
                        last,
                    )),
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::store::{EventData, ExpectedVersion};
    use tokio::sync::oneshot;

    fn request(stream: &str, ids: &[u128]) -> AppendRequest {
        sized_request(stream, ids, 0)
    }

    fn sized_request(stream: &str, ids: &[u128], bytes: usize) -> AppendRequest {
        AppendRequest {
            stream: StreamName::new(stream).expect("a valid stream name"),
            expected: ExpectedVersion::NoStream,
            events: ids
                .iter()
                .map(|id| EventData {
                    event_id: EventId::from_uuid(Uuid::from_u128(*id)),
                    event_type: "Tested".into(),
                    data: vec![b' '; bytes],
                    metadata: Vec::new(),
                })
                .collect(),
            reply: oneshot::channel().0,
        }
    }

    fn sizes(batch: &[AppendRequest]) -> Vec<usize> {
        rounds(batch).iter().map(|round| round.len()).collect()
    }

    #[test]
    fn a_batch_of_distinct_streams_and_ids_is_one_round() {
        let batch = [
            request("a", &[1]),
            request("b", &[2, 3]),
            request("c", &[4]),
        ];
        assert_eq!(sizes(&batch), [3]);
    }

    #[test]
    fn a_stream_or_an_event_id_coming_again_starts_a_new_round_in_queue_order() {
        let batch = [
            request("a", &[1]),
            request("b", &[2]),
            request("a", &[3]),
            request("c", &[3]),
            request("d", &[5]),
        ];
        assert_eq!(sizes(&batch), [2, 1, 2]);
        assert_eq!(rounds(&[]).len(), 0);
    }

    #[test]
    fn a_round_carries_at_most_the_bytes_of_one_commit_and_the_largest_append_fits_alone() {
        let third = MAX_BYTES_PER_COMMIT / 3;
        let batch = [
            sized_request("a", &[1], third),
            sized_request("b", &[2], third),
            sized_request("c", &[3], third),
            sized_request("d", &[4], third),
        ];
        assert_eq!(sizes(&batch), [3, 1]);
        let largest = [
            sized_request("a", &[1], MAX_BYTES_PER_COMMIT),
            sized_request("b", &[2], 1),
        ];
        assert_eq!(sizes(&largest), [1, 1]);
    }
}
