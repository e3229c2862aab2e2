//! One batch of the log in, one transaction out: decode, fold, write, advance the checkpoint.
//!
//! The checkpoint is written in the same transaction as the changes it covers; that is the whole
//! of the exactly-once argument. Each operation's folded state is read from the operations table
//! once per batch and folded in memory, so an event later in the same batch sees the earlier
//! ones; its row is written back once, before the commit. Nothing here keeps state between
//! batches, and nothing here may commit part of a batch.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};

use opledger_domain::args::ArgsHash;
use opledger_domain::codec;
use opledger_domain::event::{IntentRecorded, OperationEvent};
use opledger_domain::ids::{
    AccountId, ActionName, AttemptId, ExternalObjectId, GlobalPosition, OperationId, ProviderId,
    SourceId, StreamVersion, TenantId, WorkerId,
};
use opledger_domain::state::{OperationState, Work};
use opledger_domain::store::RecordedEvent;
use opledger_projections::context::FoldError;
use opledger_projections::duplicates::{self, DuplicateChange, SimilarIntent, SimilarIntentQuery};
use opledger_projections::id_index::{ExternalIdRole, IdIndexChange};
use opledger_projections::metrics::Counter;
use opledger_projections::operations;
use opledger_projections::operations::OperationRow;
use opledger_projections::read_models::fold_in_place;
use opledger_projections::review_queue::{ReviewChange, ReviewProgress};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use super::sql::{self, corrupt};
use super::state_codec;
use super::{ReadModelError, MAX_BATCH_EVENTS};

/// What identifies "the same request" for the possible-duplicate check: the columns of the
/// runner's `operations_by_request` lookup.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct RequestKey {
    tenant: TenantId,
    provider: ProviderId,
    account: AccountId,
    action: ActionName,
    args_hash: ArgsHash,
}

impl RequestKey {
    pub(super) fn of(query: &SimilarIntentQuery) -> Self {
        Self {
            tenant: query.tenant.clone(),
            provider: query.provider.clone(),
            account: query.account.clone(),
            action: query.action.clone(),
            args_hash: query.args_hash.clone(),
        }
    }
}

/// What a similar-intent query asks besides its request: who asks, the time range, how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueryBounds {
    pub(super) operation_id: OperationId,
    pub(super) from: DateTime<Utc>,
    pub(super) to: DateTime<Utc>,
    pub(super) limit: usize,
}

impl QueryBounds {
    pub(super) fn of(query: &SimilarIntentQuery) -> Self {
        Self {
            operation_id: query.operation_id,
            from: query.from,
            to: query.to,
            limit: query.limit,
        }
    }

    /// The bounds [`duplicates::similar_intent_query`] gives `intent`'s query, without copying
    /// its request's names.
    pub(super) fn of_intent(operation_id: OperationId, intent: &IntentRecorded) -> Self {
        let (from, to) = duplicates::similar_intent_range(intent);
        Self {
            operation_id,
            from,
            to,
            limit: duplicates::MAX_SIMILAR_INTENTS_CHECKED,
        }
    }
}

/// Gauge names (see the gauges table in `schema.rs`, whose migration writes the same names).
pub(super) const IN_STATE_GAUGE: &str = "operations_in_state:";
pub(super) const WITH_ATTEMPTS_GAUGE: &str = "operations_with_attempts:";
pub(super) const SHARED_EXTERNAL_IDS_GAUGE: &str = "shared_external_ids";

/// What of an operation's row the gauges count: its state and its attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Counted {
    state: &'static str,
    attempts: u32,
}

impl Counted {
    /// What the row built from `state` holds ([`operations::row`] takes both from the state).
    pub(super) fn of(state: &OperationState) -> Self {
        Self {
            state: state.status.name(),
            attempts: state.attempts,
        }
    }
}

/// Changes to the gauges, summed in memory and written once ([`write_gauges`]).
#[derive(Debug, Default)]
pub(super) struct GaugeChanges(BTreeMap<String, i64>);

impl GaugeChanges {
    /// An operation's row went from `before` (`None`: the file had none) to `after`.
    pub(super) fn row_changed(&mut self, before: Option<Counted>, after: Counted) {
        if before == Some(after) {
            return;
        }
        if let Some(before) = before {
            self.add(format!("{IN_STATE_GAUGE}{}", before.state), -1);
            self.add(format!("{WITH_ATTEMPTS_GAUGE}{}", before.attempts), -1);
        }
        self.add(format!("{IN_STATE_GAUGE}{}", after.state), 1);
        self.add(format!("{WITH_ATTEMPTS_GAUGE}{}", after.attempts), 1);
    }

    fn add(&mut self, name: String, change: i64) {
        *self.0.entry(name).or_default() += change;
    }
}

/// What one batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Events folded into the read models.
    pub applied: usize,
    /// Events at or below the checkpoint, already applied earlier and left alone.
    pub skipped: usize,
    /// Events of streams that are not operation streams; passed over, checkpoint advanced.
    pub other_streams: usize,
    /// The checkpoint after the batch.
    pub checkpoint: Option<GlobalPosition>,
}

/// The checkpoint as committed.
pub(super) fn read_checkpoint(
    connection: &Connection,
) -> Result<Option<GlobalPosition>, ReadModelError> {
    let stored: Option<i64> = connection
        .query_row("SELECT position FROM checkpoint WHERE id = 1", [], |row| {
            row.get(0)
        })
        .optional()
        .map_err(|error| ReadModelError::sqlite("reading the checkpoint", error))?;
    stored.map(sql::position_from).transpose()
}

/// Applies `events` in one transaction (see [`super::ReadModelStore::apply_batch`]).
pub(super) fn apply_batch(
    connection: &mut Connection,
    events: &[RecordedEvent],
    scratch: &mut BatchScratch,
) -> Result<BatchOutcome, ReadModelError> {
    if events.len() > MAX_BATCH_EVENTS {
        return Err(ReadModelError::BatchTooLarge {
            events: events.len(),
        });
    }
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| ReadModelError::sqlite("starting a batch", error))?;
    let start = read_checkpoint(&transaction)?;
    let mut outcome = BatchOutcome {
        checkpoint: start,
        ..BatchOutcome::default()
    };
    // Counters are summed over the batch and written once: a few rows instead of one per event.
    let mut counters: BTreeMap<Counter, u64> = BTreeMap::new();
    // Emptied here too: a batch that failed half way leaves what it folded behind.
    scratch.clear();
    let BatchScratch {
        touched,
        new_intents,
        rows,
    } = scratch;
    for recorded in events {
        let position = recorded.position;
        // A prefix at or below the checkpoint was applied by an earlier batch (a runner that
        // re-read after a restart, a caller handing the same events over again): skip it. After
        // the first new event, anything not above the last one is out of order, not a repeat.
        if outcome.checkpoint == start && start.is_some_and(|checkpoint| position <= checkpoint) {
            outcome.skipped += 1;
            continue;
        }
        if let Some(last) = outcome.checkpoint.filter(|last| position <= *last) {
            return Err(ReadModelError::OutOfOrder {
                last,
                found: position,
            });
        }
        match recorded.stream.operation_id() {
            Some(operation_id) => {
                apply_event(
                    &transaction,
                    operation_id,
                    recorded,
                    touched,
                    new_intents,
                    &mut counters,
                )?;
                outcome.applied += 1;
            }
            None => outcome.other_streams += 1,
        }
        outcome.checkpoint = Some(position);
    }
    commit_batch(
        transaction,
        touched,
        rows,
        &counters,
        start,
        outcome.checkpoint,
    )?;
    new_intents.clear();
    Ok(outcome)
}

/// What a batch folds into, kept by the store from one batch to the next (emptied, with its
/// capacity): allocated anew per batch, the maps of a large batch (an operation's whole state
/// per entry) took fresh pages every time, which the kernel zeroed first (seen in profiles of
/// `bench http`). Bounded by the largest batch, [`crate::MAX_BATCH_EVENTS`] events.
#[derive(Default)]
pub(super) struct BatchScratch {
    /// The operations this batch touched, folded in memory: each one's stored state is read at
    /// most once per batch, and its row written once at the end (an operation's events usually
    /// arrive together).
    touched: HashMap<OperationId, Touched>,
    /// The intents recorded in this batch, whose rows are not in the file yet: a later intent in
    /// the batch finds its similar ones here and in the file.
    new_intents: HashMap<RequestKey, Vec<SimilarIntent>>,
    /// `touched` in id order, for writing.
    rows: Vec<(OperationId, Touched)>,
}

impl std::fmt::Debug for BatchScratch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("BatchScratch")
            .field("touched_capacity", &self.touched.capacity())
            .field("new_intents_capacity", &self.new_intents.capacity())
            .field("rows_capacity", &self.rows.capacity())
            .finish()
    }
}

impl BatchScratch {
    fn clear(&mut self) {
        self.touched.clear();
        self.new_intents.clear();
        self.rows.clear();
    }
}

/// Writes the operations the batch folded and the gauges they moved, and (when the batch
/// advanced past `start`) its counters and checkpoint; then commits.
fn commit_batch(
    transaction: Transaction<'_>,
    touched: &mut HashMap<OperationId, Touched>,
    rows: &mut Vec<(OperationId, Touched)>,
    counters: &BTreeMap<Counter, u64>,
    start: Option<GlobalPosition>,
    checkpoint: Option<GlobalPosition>,
) -> Result<(), ReadModelError> {
    let mut gauges = GaugeChanges::default();
    write_touched(&transaction, touched, rows, &mut gauges)?;
    write_gauges(&transaction, &gauges)?;
    if checkpoint != start {
        write_counters(&transaction, counters)?;
        if let Some(checkpoint) = checkpoint {
            write_checkpoint(&transaction, checkpoint)?;
        }
    }
    transaction
        .commit()
        .map_err(|error| ReadModelError::sqlite("committing a batch", error))
}

/// An operation folded in this batch, not yet written back.
struct Touched {
    state: OperationState,
    /// The version of its last event folded.
    version: StreamVersion,
    /// The position and time of that event.
    position: GlobalPosition,
    at: DateTime<Utc>,
    /// Whether the file has a row for it (else the batch inserts one).
    in_file: bool,
    /// What the gauges count of the file's row (`None`: no row yet).
    before: Option<Counted>,
}

fn apply_event(
    transaction: &Transaction<'_>,
    operation_id: OperationId,
    recorded: &RecordedEvent,
    touched: &mut HashMap<OperationId, Touched>,
    new_intents: &mut HashMap<RequestKey, Vec<SimilarIntent>>,
    counters: &mut BTreeMap<Counter, u64>,
) -> Result<(), ReadModelError> {
    let position = recorded.position;
    let event =
        codec::decode(recorded).map_err(|source| ReadModelError::Decode { position, source })?;
    let (mut state, last, in_file, before) = match touched.remove(&operation_id) {
        Some(held) => (held.state, Some(held.version), held.in_file, held.before),
        None => match load_state(transaction, operation_id)? {
            Some((state, version)) => {
                let before = Some(Counted::of(&state));
                (state, Some(version), true, before)
            }
            None => (OperationState::initial(), None, false, None),
        },
    };
    let query = duplicates::similar_intent_query(operation_id, &event);
    let similar = match &query {
        Some(query) => similar_in_file_and_batch(transaction, query, new_intents)?,
        None => Vec::new(),
    };
    let changes = fold_in_place(
        operation_id,
        &mut state,
        last,
        recorded.version,
        position,
        &similar,
        &event,
    )
    .map_err(|source| ReadModelError::Fold { position, source })?;
    if let (Some(query), OperationEvent::IntentRecorded(intent)) = (&query, &event) {
        new_intents
            .entry(RequestKey::of(query))
            .or_default()
            .push(SimilarIntent {
                operation_id,
                source_id: intent.source_id.clone(),
                recorded_at: intent.at,
            });
    }
    let held = Touched {
        state,
        version: recorded.version,
        position,
        at: event.at(),
        in_file,
        before,
    };
    touched.insert(operation_id, held);
    if let Some(review) = &changes.review {
        write_review(transaction, review)?;
    }
    for duplicate in &changes.duplicates {
        write_duplicate(transaction, duplicate)?;
    }
    for entry in &changes.id_index {
        write_id_entry(transaction, entry)?;
    }
    for counter in &changes.metrics {
        *counters.entry(*counter).or_default() += 1;
    }
    Ok(())
}

/// Writes back the rows of the operations the batch changed since they were last written.
fn write_touched(
    transaction: &Transaction<'_>,
    touched: &mut HashMap<OperationId, Touched>,
    rows: &mut Vec<(OperationId, Touched)>,
    gauges: &mut GaugeChanges,
) -> Result<(), ReadModelError> {
    rows.clear();
    rows.extend(touched.drain());
    // In id order, so consecutive updates land on neighbouring pages.
    rows.sort_unstable_by_key(|(operation_id, _)| *operation_id);
    for (operation_id, held) in rows.drain(..) {
        write_operation(transaction, operation_id, &held)?;
        gauges.row_changed(held.before, Counted::of(&held.state));
    }
    Ok(())
}

/// Inserts or updates one operation's row and stored state.
fn write_operation(
    transaction: &Transaction<'_>,
    operation_id: OperationId,
    held: &Touched,
) -> Result<(), ReadModelError> {
    write_folded(
        transaction,
        operation_id,
        &held.state,
        (held.version, held.position, held.at),
        held.in_file,
    )
}

/// The earlier intents similar to `query`'s: the file's, and those recorded earlier in this
/// batch (their rows go in at its end), merged in the file query's order and limit — exactly
/// what the query would return had each row gone in as its intent was folded.
fn similar_in_file_and_batch(
    transaction: &Connection,
    query: &SimilarIntentQuery,
    new_intents: &HashMap<RequestKey, Vec<SimilarIntent>>,
) -> Result<Vec<SimilarIntent>, ReadModelError> {
    let mut similar = find_similar(transaction, query)?;
    if let Some(same_request) = new_intents.get(&RequestKey::of(query)) {
        add_similar(&mut similar, same_request, QueryBounds::of(query));
    }
    Ok(similar)
}

/// Adds the `candidates` (intents of the query's request) that the file query would return to
/// `found` (already in its order), keeping the query's order and limit.
pub(super) fn add_similar(
    found: &mut Vec<SimilarIntent>,
    candidates: &[SimilarIntent],
    query: QueryBounds,
) {
    let before = found.len();
    found.extend(
        candidates
            .iter()
            .filter(|intent| {
                intent.operation_id != query.operation_id
                    && intent.recorded_at >= query.from
                    && intent.recorded_at <= query.to
            })
            .cloned(),
    );
    if found.len() > before {
        // Stored times sort as text in time order (sql.rs) and a UUID's hyphenated lowercase text
        // sorts as its bytes, so this is the file's `ORDER BY created_at DESC, operation_id DESC`.
        found.sort_by_key(|intent| std::cmp::Reverse((intent.recorded_at, intent.operation_id)));
        found.truncate(query.limit);
    }
}

/// Writes an operation's row, built from its folded state as of its last event (`last`: that
/// event's version, position and time), and the state itself — an update when the file already
/// has a row for it.
pub(super) fn write_folded(
    connection: &Connection,
    operation_id: OperationId,
    state: &OperationState,
    last: (StreamVersion, GlobalPosition, DateTime<Utc>),
    in_file: bool,
) -> Result<(), ReadModelError> {
    stored_operation(operation_id, state, last, None)?.write(connection, in_file)
}

/// An operation's row and its state as stored, built and ready to write. Batches and the
/// rebuild both build rows here and write them with [`StoredOperation::write`], so their rows
/// cannot differ; the rebuild builds on one thread and writes on another.
pub(super) struct StoredOperation {
    row: OperationRow,
    /// The folded state in its stored form (`state_codec.rs`).
    state: Vec<u8>,
    /// The operation's row in the work queue: when its next work falls due, and what it is
    /// (`None`: it waits for a person or is settled, and has no row).
    due: Option<(DateTime<Utc>, Work)>,
    /// The hash of the intent's request (`sql::request_hash`), built with the row, on the
    /// rebuild's fold thread rather than its writer's.
    request_hash: i64,
    /// The operation's search terms (`terms.rs`), written with its row when it is inserted.
    terms: Vec<String>,
}

impl StoredOperation {
    /// Inserts the row, or updates it when the file already has one (`in_file`).
    pub(super) fn write(
        &self,
        connection: &Connection,
        in_file: bool,
    ) -> Result<(), ReadModelError> {
        if in_file {
            update_operation(connection, &self.row, &self.state)?;
        } else {
            insert_operation(connection, &self.row, &self.state, self.request_hash)?;
            insert_terms(connection, &self.row, &self.terms)?;
        }
        write_work(
            connection,
            self.row.operation_id,
            self.due,
            self.row.stream_version,
            in_file,
        )
    }
}

/// Puts an operation's row in the work queue in line with its state: inserted or moved when it
/// waits for the workers, removed when it no longer does (only a row already in the file can
/// have one to remove).
fn write_work(
    connection: &Connection,
    operation_id: OperationId,
    due: Option<(DateTime<Utc>, Work)>,
    version: StreamVersion,
    in_file: bool,
) -> Result<(), ReadModelError> {
    let Some((due_at, work)) = due else {
        if in_file {
            connection
                .prepare_cached("DELETE FROM work_queue WHERE operation_id = ?1")
                .and_then(|mut statement| statement.execute([sql::operation_text(operation_id)]))
                .map_err(|error| ReadModelError::sqlite("removing from the work queue", error))?;
        }
        return Ok(());
    };
    let version = sql::version(version)?;
    connection
        .prepare_cached(
            "INSERT INTO work_queue (operation_id, due_at, work, stream_version)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (operation_id) DO UPDATE
                 SET due_at = excluded.due_at, work = excluded.work,
                     stream_version = excluded.stream_version",
        )
        .and_then(|mut statement| {
            statement.execute(params![
                sql::operation_text(operation_id),
                sql::TimeText::new(due_at),
                work_name(work),
                version,
            ])
        })
        .map_err(|error| ReadModelError::sqlite("writing the work queue", error))?;
    Ok(())
}

/// The work queue's name for `work`.
pub(super) fn work_name(work: Work) -> &'static str {
    match work {
        Work::Send => "send",
        Work::Sweep => "sweep",
        Work::Reconcile => "reconcile",
    }
}

/// Where an operation stands in the work queue, from its folded state: settled operations and
/// those waiting for a person have no work.
fn due_of(state: &OperationState) -> Option<(DateTime<Utc>, Work)> {
    if state.status.is_terminal() || state.intent.is_none() {
        return None;
    }
    state.next_work()
}

/// Fills the work queue of a file from before schema version 3 from its stored states, inside the
/// schema transaction. Only the operations in a state that can have work are read (the state
/// index finds them), one row at a time, so memory does not grow with the file.
pub(super) fn fill_work_queue(connection: &Connection) -> Result<(), ReadModelError> {
    let mut statement = connection
        .prepare(
            "SELECT operation_id, folded_state, stream_version FROM operations
             WHERE state = 'pending' OR state = 'in_flight' OR state = 'unknown'",
        )
        .map_err(|error| ReadModelError::sqlite("reading states for the work queue", error))?;
    let mut rows = statement
        .query([])
        .map_err(|error| ReadModelError::sqlite("reading states for the work queue", error))?;
    while let Some(row) = rows
        .next()
        .map_err(|error| ReadModelError::sqlite("reading states for the work queue", error))?
    {
        let operation_id = row
            .get::<_, String>(0)
            .map_err(|error| ReadModelError::sqlite("reading a stored operation id", error))?;
        let operation_id = sql::operation_from(&operation_id)?;
        let state = row
            .get_ref(1)
            .and_then(|value| Ok(value.as_blob()?))
            .map_err(|error| ReadModelError::sqlite("reading a stored state", error))?;
        let state = stored_state(operation_id, state)?;
        let version = row
            .get::<_, i64>(2)
            .map_err(|error| ReadModelError::sqlite("reading a stored version", error))?;
        let due = due_of(&state);
        write_work(
            connection,
            operation_id,
            due,
            sql::version_from(version)?,
            false,
        )?;
    }
    Ok(())
}

/// Builds what [`write_folded`] writes. `request_hash`: the intent's [`sql::request_hash`] when
/// the caller has it already (a rebuild keeps its digest); `None`: made here from the row.
pub(super) fn stored_operation(
    operation_id: OperationId,
    state: &OperationState,
    last: (StreamVersion, GlobalPosition, DateTime<Utc>),
    request_hash: Option<i64>,
) -> Result<StoredOperation, ReadModelError> {
    let (version, position, at) = last;
    let row = operations::row(operation_id, state, version, position, at).ok_or(
        ReadModelError::Fold {
            position,
            source: FoldError::NoIntent {
                operation_id,
                version,
            },
        },
    )?;
    Ok(StoredOperation {
        request_hash: request_hash.unwrap_or_else(|| {
            sql::request_hash([
                row.tenant.as_str(),
                row.provider.as_str(),
                row.account.as_str(),
                row.action.as_str(),
                row.args_hash.as_str(),
            ])
        }),
        row,
        due: due_of(state),
        terms: crate::terms::terms_of(state),
        state: {
            // About a third of the JSON it replaced; one allocation of the right size mostly.
            let mut stored = Vec::with_capacity(STORED_STATE_CAPACITY_BYTES);
            state_codec::encode_into(state, &mut stored);
            stored
        },
    })
}

/// The buffer first reserved for a stored state, in bytes: a typical settled operation's state
/// is ~340 bytes (measured on `bench store`'s operations), so one reservation nearly always
/// holds it.
const STORED_STATE_CAPACITY_BYTES: usize = 512;

/// The state stored for `operation_id`, decoded.
fn stored_state(operation_id: OperationId, bytes: &[u8]) -> Result<OperationState, ReadModelError> {
    state_codec::decode(bytes).map_err(|error| {
        corrupt(format!(
            "the stored state of operation {operation_id} cannot be read: {error}"
        ))
    })
}

/// The operation's folded state and the version of its last event, if any event was folded.
pub(super) fn load_state(
    transaction: &Connection,
    operation_id: OperationId,
) -> Result<Option<(OperationState, StreamVersion)>, ReadModelError> {
    let mut statement = transaction
        .prepare_cached(
            "SELECT folded_state, stream_version FROM operations WHERE operation_id = ?1",
        )
        .map_err(|error| ReadModelError::sqlite("preparing to load an operation", error))?;
    let mut rows = statement
        .query([sql::operation_text(operation_id)])
        .map_err(|error| ReadModelError::sqlite("loading an operation's state", error))?;
    let Some(row) = rows
        .next()
        .map_err(|error| ReadModelError::sqlite("loading an operation's state", error))?
    else {
        return Ok(None);
    };
    // Decoded from SQLite's own buffer: no copy of the bytes first.
    let state = row
        .get_ref(0)
        .and_then(|value| Ok(value.as_blob()?))
        .map_err(|error| ReadModelError::sqlite("loading an operation's state", error))?;
    let state = stored_state(operation_id, state)?;
    let version: i64 = row
        .get(1)
        .map_err(|error| ReadModelError::sqlite("loading an operation's version", error))?;
    Ok(Some((state, sql::version_from(version)?)))
}

pub(super) fn find_similar(
    transaction: &Connection,
    query: &SimilarIntentQuery,
) -> Result<Vec<SimilarIntent>, ReadModelError> {
    // `INDEXED BY` because without statistics SQLite prefers the creation-time index (it serves
    // the range and the order) and then reads every operation recorded within the window to
    // compare its request — quadratic in a busy window. The request index narrows to requests
    // with the same hash first and still yields them newest first; the columns themselves then
    // drop the rare other request that shares the hash, before the LIMIT counts a row.
    let mut statement = transaction
        .prepare_cached(
            "SELECT operation_id, source_id, created_at FROM operations
             INDEXED BY operations_by_request
             WHERE request_hash = ?10 AND created_at >= ?6 AND created_at <= ?7
               AND tenant = ?1 AND provider = ?2 AND account = ?3 AND action = ?4
               AND args_hash = ?5 AND operation_id <> ?8
             ORDER BY created_at DESC, operation_id DESC
             LIMIT ?9",
        )
        .map_err(|error| ReadModelError::sqlite("preparing to find similar intents", error))?;
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    let rows = statement
        .query_map(
            params![
                query.tenant.as_str(),
                query.provider.as_str(),
                query.account.as_str(),
                query.action.as_str(),
                query.args_hash.as_str(),
                sql::TimeText::new(query.from),
                sql::TimeText::new(query.to),
                sql::operation_text(query.operation_id),
                limit,
                sql::request_hash([
                    query.tenant.as_str(),
                    query.provider.as_str(),
                    query.account.as_str(),
                    query.action.as_str(),
                    query.args_hash.as_str(),
                ]),
            ],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, String>(2)?,
                ))
            },
        )
        .map_err(|error| ReadModelError::sqlite("finding similar intents", error))?;
    let mut similar = Vec::new();
    for row in rows {
        let (operation_id, source_id, recorded_at) =
            row.map_err(|error| ReadModelError::sqlite("reading a similar intent", error))?;
        similar.push(SimilarIntent {
            operation_id: sql::operation_from(&operation_id)?,
            source_id: source_id
                .map(|source| sql::id_from(source, opledger_domain::ids::SourceId::new))
                .transpose()?,
            recorded_at: sql::time_from(&recorded_at)?,
        });
    }
    Ok(similar)
}

fn insert_operation(
    transaction: &Connection,
    row: &OperationRow,
    state: &[u8],
    request_hash: i64,
) -> Result<(), ReadModelError> {
    let mut statement = transaction
        .prepare_cached(
            "INSERT INTO operations (operation_id, tenant, provider, account, action, args_hash,
                 source_id, state, attempts, external_id, last_error, created_at, updated_at,
                 stream_version, last_position, lease_deadline, unknown_since,
                 needs_review_reason, folded_state, request_hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                 ?18, ?19, ?20)",
        )
        .map_err(|error| ReadModelError::sqlite("preparing to insert an operation", error))?;
    statement
        .execute(params![
            sql::operation_text(row.operation_id),
            row.tenant.as_str(),
            row.provider.as_str(),
            row.account.as_str(),
            row.action.as_str(),
            row.args_hash.as_str(),
            row.source_id.as_ref().map(|id| id.as_str()),
            row.state,
            row.attempts,
            row.external_id.as_ref().map(|id| id.as_str()),
            row.last_error,
            sql::TimeText::new(row.created_at),
            sql::TimeText::new(row.updated_at),
            sql::version(row.stream_version)?,
            sql::position(row.last_position)?,
            row.lease_deadline.map(sql::TimeText::new),
            row.unknown_since.map(sql::TimeText::new),
            row.needs_review_reason,
            state,
            request_hash,
        ])
        .map_err(|error| {
            ReadModelError::sqlite(format!("inserting operation {}", row.operation_id), error)
        })?;
    Ok(())
}

/// An operation's search terms, each with its recorded time and id (the index's order).
fn insert_terms(
    connection: &Connection,
    row: &OperationRow,
    terms: &[String],
) -> Result<(), ReadModelError> {
    if terms.is_empty() {
        return Ok(());
    }
    let mut statement = connection
        .prepare_cached("INSERT INTO operation_terms (term, at, operation) VALUES (?1, ?2, ?3)")
        .map_err(|error| ReadModelError::sqlite("preparing to insert search terms", error))?;
    let at = sql::TimeText::new(row.created_at);
    let operation = sql::operation_text(row.operation_id);
    for term in terms {
        statement
            .execute(params![term, at, operation])
            .map_err(|error| {
                ReadModelError::sqlite(
                    format!("inserting operation {}'s search terms", row.operation_id),
                    error,
                )
            })?;
    }
    Ok(())
}

fn update_operation(
    transaction: &Connection,
    row: &OperationRow,
    state: &[u8],
) -> Result<(), ReadModelError> {
    // Only what an event can change: the binding, arguments and creation time are the intent's,
    // fixed forever, and leaving them out of the SET keeps their indexes untouched.
    let mut statement = transaction
        .prepare_cached(
            "UPDATE operations SET state = ?2, attempts = ?3, external_id = ?4, last_error = ?5,
                 updated_at = ?6, stream_version = ?7, last_position = ?8, lease_deadline = ?9,
                 unknown_since = ?10, needs_review_reason = ?11, folded_state = ?12
             WHERE operation_id = ?1",
        )
        .map_err(|error| ReadModelError::sqlite("preparing to update an operation", error))?;
    let changed = statement
        .execute(params![
            sql::operation_text(row.operation_id),
            row.state,
            row.attempts,
            row.external_id.as_ref().map(|id| id.as_str()),
            row.last_error,
            sql::TimeText::new(row.updated_at),
            sql::version(row.stream_version)?,
            sql::position(row.last_position)?,
            row.lease_deadline.map(sql::TimeText::new),
            row.unknown_since.map(sql::TimeText::new),
            row.needs_review_reason,
            state,
        ])
        .map_err(|error| {
            ReadModelError::sqlite(format!("updating operation {}", row.operation_id), error)
        })?;
    expect_one_row(changed, "operation", row.operation_id)
}

pub(super) fn write_review(
    transaction: &Connection,
    change: &ReviewChange,
) -> Result<(), ReadModelError> {
    match change {
        ReviewChange::Enter(entry) => {
            let progress = &entry.progress;
            let lookup = progress.lookup.as_ref();
            let review = progress.review.as_ref();
            let mut statement = transaction
                .prepare_cached(
                    "INSERT INTO review_queue (operation_id, state, since, tenant, provider,
                         account, attempts, lookups, last_error, last_lookup_result,
                         last_lookup_evidence, last_lookup_at, review_reason, review_evidence,
                         updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                )
                .map_err(|error| ReadModelError::sqlite("preparing a review entry", error))?;
            statement
                .execute(params![
                    sql::operation_text(entry.operation_id),
                    progress.state,
                    sql::TimeText::new(entry.since),
                    entry.tenant.as_str(),
                    entry.provider.as_str(),
                    entry.account.as_str(),
                    progress.attempts,
                    progress.lookups,
                    progress.last_error,
                    lookup.map(|l| l.result.as_str()),
                    lookup.map(|l| l.evidence.as_str()),
                    lookup.map(|l| sql::TimeText::new(l.at)),
                    review.map(|r| r.reason.as_str()),
                    review.map(|r| r.evidence.as_str()),
                    sql::TimeText::new(progress.updated_at),
                ])
                .map_err(|error| {
                    ReadModelError::sqlite(
                        format!("queueing operation {} for review", entry.operation_id),
                        error,
                    )
                })?;
            Ok(())
        }
        ReviewChange::Update {
            operation_id,
            progress,
        } => update_review(transaction, *operation_id, progress),
        ReviewChange::Leave { operation_id } => {
            let mut statement = transaction
                .prepare_cached("DELETE FROM review_queue WHERE operation_id = ?1")
                .map_err(|error| ReadModelError::sqlite("preparing a review removal", error))?;
            let removed = statement
                .execute([sql::operation_text(*operation_id)])
                .map_err(|error| {
                    ReadModelError::sqlite(
                        format!("removing operation {operation_id} from the review queue"),
                        error,
                    )
                })?;
            expect_one_row(removed, "review entry", *operation_id)
        }
    }
}

fn update_review(
    transaction: &Connection,
    operation_id: OperationId,
    progress: &ReviewProgress,
) -> Result<(), ReadModelError> {
    // Evidence this event does not bring (NULL) keeps what an earlier event brought.
    let lookup = progress.lookup.as_ref();
    let review = progress.review.as_ref();
    let mut statement = transaction
        .prepare_cached(
            "UPDATE review_queue SET state = ?2, attempts = ?3, lookups = ?4, last_error = ?5,
                 updated_at = ?6,
                 last_lookup_result = coalesce(?7, last_lookup_result),
                 last_lookup_evidence = coalesce(?8, last_lookup_evidence),
                 last_lookup_at = coalesce(?9, last_lookup_at),
                 review_reason = coalesce(?10, review_reason),
                 review_evidence = coalesce(?11, review_evidence)
             WHERE operation_id = ?1",
        )
        .map_err(|error| ReadModelError::sqlite("preparing a review update", error))?;
    let changed = statement
        .execute(params![
            sql::operation_text(operation_id),
            progress.state,
            progress.attempts,
            progress.lookups,
            progress.last_error,
            sql::TimeText::new(progress.updated_at),
            lookup.map(|l| l.result.as_str()),
            lookup.map(|l| l.evidence.as_str()),
            lookup.map(|l| sql::TimeText::new(l.at)),
            review.map(|r| r.reason.as_str()),
            review.map(|r| r.evidence.as_str()),
        ])
        .map_err(|error| {
            ReadModelError::sqlite(
                format!("updating the review entry of operation {operation_id}"),
                error,
            )
        })?;
    expect_one_row(changed, "review entry", operation_id)
}

pub(super) fn write_duplicate(
    transaction: &Connection,
    change: &DuplicateChange,
) -> Result<(), ReadModelError> {
    match change {
        DuplicateChange::Detected(found) => {
            let mut statement = transaction
                .prepare_cached(
                    "INSERT INTO duplicate_detections (position, operation_id, provider, account,
                         confirmed_external_id, duplicate_external_id, found_by, at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(|error| ReadModelError::sqlite("preparing a duplicate record", error))?;
            statement
                .execute(params![
                    sql::position(found.position)?,
                    sql::operation_text(found.operation_id),
                    found.provider.as_str(),
                    found.account.as_str(),
                    found.confirmed_external_id.as_str(),
                    found.duplicate_external_id.as_str(),
                    found.found_by,
                    sql::TimeText::new(found.at),
                ])
                .map_err(|error| ReadModelError::sqlite("recording a detected duplicate", error))?;
        }
        DuplicateChange::PossibleIntent(pair) => {
            let mut statement = transaction
                .prepare_cached(
                    "INSERT INTO possible_duplicate_intents (operation_id, earlier_operation_id,
                         tenant, provider, account, action, args_hash, source_id,
                         earlier_source_id, gap_ms, at, position)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(|error| ReadModelError::sqlite("preparing a possible duplicate", error))?;
            statement
                .execute(params![
                    sql::operation_text(pair.operation_id),
                    sql::operation_text(pair.earlier_operation_id),
                    pair.tenant.as_str(),
                    pair.provider.as_str(),
                    pair.account.as_str(),
                    pair.action.as_str(),
                    pair.args_hash.as_str(),
                    pair.source_id.as_ref().map(|id| id.as_str()),
                    pair.earlier_source_id.as_ref().map(|id| id.as_str()),
                    pair.gap_ms,
                    sql::TimeText::new(pair.at),
                    sql::position(pair.position)?,
                ])
                .map_err(|error| {
                    ReadModelError::sqlite("flagging a possible duplicate intent", error)
                })?;
        }
    }
    Ok(())
}

pub(super) fn write_id_entry(
    transaction: &Connection,
    change: &IdIndexChange,
) -> Result<(), ReadModelError> {
    match change {
        IdIndexChange::Attempt {
            attempt_id,
            operation_id,
            number,
            worker,
            started_at,
            position,
        } => index_attempt(
            transaction,
            *attempt_id,
            *operation_id,
            *number,
            worker,
            *started_at,
            *position,
        ),
        IdIndexChange::Source {
            tenant,
            source_id,
            operation_id,
            position,
        } => index_source(transaction, tenant, source_id, *operation_id, *position),
        IdIndexChange::ExternalId {
            provider,
            account,
            external_id,
            operation_id,
            role,
            position,
        } => index_external_id(
            transaction,
            ExternalName {
                provider,
                account,
                external_id,
            },
            *operation_id,
            *role,
            *position,
        ),
    }
}

fn index_attempt(
    transaction: &Connection,
    attempt_id: AttemptId,
    operation_id: OperationId,
    number: u32,
    worker: &WorkerId,
    started_at: DateTime<Utc>,
    position: GlobalPosition,
) -> Result<(), ReadModelError> {
    let mut statement = transaction
        .prepare_cached(
            "INSERT INTO attempts (attempt_id, operation_id, attempt_number, worker,
                 started_at, position)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(|error| ReadModelError::sqlite("preparing an attempt entry", error))?;
    statement
        .execute(params![
            sql::UuidText::new(attempt_id.as_uuid()),
            sql::operation_text(operation_id),
            number,
            worker.as_str(),
            sql::TimeText::new(started_at),
            sql::position(position)?,
        ])
        .map_err(|error| ReadModelError::sqlite("indexing an attempt", error))?;
    Ok(())
}

fn index_source(
    transaction: &Connection,
    tenant: &TenantId,
    source_id: &SourceId,
    operation_id: OperationId,
    position: GlobalPosition,
) -> Result<(), ReadModelError> {
    let mut statement = transaction
        .prepare_cached(
            "INSERT INTO sources (tenant, source_id, operation_id, position)
             VALUES (?1, ?2, ?3, ?4)",
        )
        .map_err(|error| ReadModelError::sqlite("preparing a source entry", error))?;
    statement
        .execute(params![
            tenant.as_str(),
            source_id.as_str(),
            sql::operation_text(operation_id),
            sql::position(position)?,
        ])
        .map_err(|error| ReadModelError::sqlite("indexing a source id", error))?;
    Ok(())
}

/// Into which tables [`write_sorted_id_entries`] writes a rebuild's flush of id-index entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IdTables {
    /// Tables that hold no rows yet (the first flush): every row is a plain `INSERT`.
    Empty,
    /// Tables that hold earlier flushes: an external-id row this flush names again is merged as
    /// the runner's upsert merges it (first position kept, strongest role).
    Filled,
}

/// Writes a rebuild's flush of id-index entries with the rows the runner's upserts would leave,
/// without its reads: `entries` are sorted by each table's key, then by position, so the entries
/// of one key are in log order (see `rebuild/`). Repeats of one external object by one
/// operation are resolved here as the upsert resolves them (the first position stays, the
/// strongest role wins) and written as one row: into empty tables a plain `INSERT` of the next
/// key, an append to the table's B-tree; into filled ones the runner's upsert, whose conflict
/// is found by the same B-tree descent the insert makes. A repeated attempt or source key
/// fails its `INSERT` as the runner's does.
///
/// The `shared_external_ids` gauge is not kept here: the runner's reads of an object's other
/// names (to raise it when a second operation names the object) were a fifth of the later
/// flushes' time. A rebuild counts it once from the finished table
/// ([`write_shared_external_ids`]), the count the runner's increments reach.
pub(super) fn write_sorted_id_entries(
    transaction: &Connection,
    entries: &[IdIndexChange],
    tables: IdTables,
) -> Result<(), ReadModelError> {
    let prepare = |sql| {
        transaction
            .prepare_cached(sql)
            .map_err(|error| ReadModelError::sqlite("preparing an id-index entry", error))
    };
    // Each statement taken from the cache once for the whole range, not once per row: looking
    // one up and handing it back costs about as much as a short insert (`cache_stmt` and
    // dropping the `CachedStatement` were 2.4 % of a rebuild's CPU over all its writes, and a
    // fifth of the later flushes' time when they were written row by row).
    let mut attempts = prepare(
        "INSERT INTO attempts (attempt_id, operation_id, attempt_number, worker, started_at,
             position)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut sources = prepare(
        "INSERT INTO sources (tenant, source_id, operation_id, position) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let mut external_ids = prepare(match tables {
        IdTables::Empty => {
            "INSERT INTO external_ids (provider, account, external_id, operation_id, role,
                 position)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        }
        IdTables::Filled => UPSERT_EXTERNAL_ID,
    })?;
    let mut index = 0;
    while let Some(entry) = entries.get(index) {
        index += 1;
        let (provider, account, external_id, operation_id, role, position) = match entry {
            IdIndexChange::Attempt {
                attempt_id,
                operation_id,
                number,
                worker,
                started_at,
                position,
            } => {
                attempts
                    .execute(params![
                        sql::UuidText::new(attempt_id.as_uuid()),
                        sql::operation_text(*operation_id),
                        number,
                        worker.as_str(),
                        sql::TimeText::new(*started_at),
                        sql::position(*position)?,
                    ])
                    .map_err(|error| ReadModelError::sqlite("indexing an attempt", error))?;
                continue;
            }
            IdIndexChange::Source {
                tenant,
                source_id,
                operation_id,
                position,
            } => {
                sources
                    .execute(params![
                        tenant.as_str(),
                        source_id.as_str(),
                        sql::operation_text(*operation_id),
                        sql::position(*position)?,
                    ])
                    .map_err(|error| ReadModelError::sqlite("indexing a source id", error))?;
                continue;
            }
            IdIndexChange::ExternalId {
                provider,
                account,
                external_id,
                operation_id,
                role,
                position,
            } => (provider, account, external_id, operation_id, role, position),
        };
        let mut strongest = *role;
        while let Some(IdIndexChange::ExternalId {
            provider: next_provider,
            account: next_account,
            external_id: next_external_id,
            operation_id: next_operation_id,
            role: next_role,
            ..
        }) = entries.get(index)
        {
            if (
                next_provider,
                next_account,
                next_external_id,
                next_operation_id,
            ) != (provider, account, external_id, operation_id)
            {
                break;
            }
            strongest = strongest.max(*next_role);
            index += 1;
        }
        external_ids
            .execute(params![
                provider.as_str(),
                account.as_str(),
                external_id.as_str(),
                sql::operation_text(*operation_id),
                strongest.name(),
                sql::position(*position)?,
            ])
            .map_err(|error| ReadModelError::sqlite("indexing an external id", error))?;
    }
    Ok(())
}

/// Sets the `shared_external_ids` gauge of a rebuilt file, which starts at zero, from its
/// finished `external_ids`: the objects two or more operations name. The runner raises it when
/// a second operation names an object and never lowers it (no entry is ever removed), so this is
/// the value its increments reach. One pass over the table in its key order, no sort.
pub(super) fn write_shared_external_ids(transaction: &Connection) -> Result<(), ReadModelError> {
    let shared: i64 = transaction
        .query_row(
            "SELECT count(*) FROM (
                 SELECT 1 FROM external_ids GROUP BY provider, account, external_id
                 HAVING count(*) > 1
             )",
            [],
            |row| row.get(0),
        )
        .map_err(|error| ReadModelError::sqlite("counting shared external ids", error))?;
    if shared > 0 {
        add_to_gauge(transaction, SHARED_EXTERNAL_IDS_GAUGE, shared)?;
    }
    Ok(())
}

/// The runner's write of an external id: naming the same object again keeps the first position
/// and the strongest role.
const UPSERT_EXTERNAL_ID: &str = "INSERT INTO external_ids (provider, account, external_id,
         operation_id, role, position)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
     ON CONFLICT (provider, account, external_id, operation_id) DO UPDATE
     SET role = excluded.role
     WHERE (CASE excluded.role WHEN 'confirmed' THEN 2 WHEN 'duplicate' THEN 1 ELSE 0 END)
         > (CASE external_ids.role WHEN 'confirmed' THEN 2 WHEN 'duplicate' THEN 1 ELSE 0 END)";

/// An external object as a provider's account names it.
struct ExternalName<'a> {
    provider: &'a ProviderId,
    account: &'a AccountId,
    external_id: &'a ExternalObjectId,
}

fn index_external_id(
    transaction: &Connection,
    name: ExternalName<'_>,
    operation_id: OperationId,
    role: ExternalIdRole,
    position: GlobalPosition,
) -> Result<(), ReadModelError> {
    let ExternalName {
        provider,
        account,
        external_id,
    } = name;
    // The object becomes shared when a second operation names it.
    let mut named_by = transaction
        .prepare_cached(
            "SELECT operation_id FROM external_ids
             WHERE provider = ?1 AND account = ?2 AND external_id = ?3 LIMIT 2",
        )
        .map_err(|error| ReadModelError::sqlite("preparing an external id lookup", error))?;
    let named_by: Vec<String> = named_by
        .query_map(
            params![provider.as_str(), account.as_str(), external_id.as_str()],
            |row| row.get(0),
        )
        .and_then(|rows| rows.collect())
        .map_err(|error| ReadModelError::sqlite("looking up an external id", error))?;
    let operation = operation_id.to_string();
    if let [only] = named_by.as_slice() {
        if *only != operation {
            add_to_gauge(transaction, SHARED_EXTERNAL_IDS_GAUGE, 1)?;
        }
    }
    // Naming the same object again keeps the first position and the strongest role.
    let mut statement = transaction
        .prepare_cached(UPSERT_EXTERNAL_ID)
        .map_err(|error| ReadModelError::sqlite("preparing an external id entry", error))?;
    statement
        .execute(params![
            provider.as_str(),
            account.as_str(),
            external_id.as_str(),
            operation,
            role.name(),
            sql::position(position)?,
        ])
        .map_err(|error| ReadModelError::sqlite("indexing an external id", error))?;
    Ok(())
}

/// Adds the changes to the gauges and deletes those that reach zero.
pub(super) fn write_gauges(
    transaction: &Connection,
    changes: &GaugeChanges,
) -> Result<(), ReadModelError> {
    for (name, change) in &changes.0 {
        if *change != 0 {
            add_to_gauge(transaction, name, *change)?;
        }
    }
    Ok(())
}

fn add_to_gauge(transaction: &Connection, name: &str, change: i64) -> Result<(), ReadModelError> {
    let failed = |error| ReadModelError::sqlite(format!("changing gauge {name}"), error);
    if change > 0 {
        let mut raise = transaction
            .prepare_cached(
                "INSERT INTO gauges (name, value) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            )
            .map_err(failed)?;
        raise.execute(params![name, change]).map_err(failed)?;
        return Ok(());
    }
    // Not an upsert: SQLite checks the row an upsert would insert against the table's CHECK
    // before it finds the conflict, so a negative change could never reach an existing gauge.
    let mut lower = transaction
        .prepare_cached("UPDATE gauges SET value = value + ?2 WHERE name = ?1 AND value + ?2 >= 0")
        .map_err(failed)?;
    // A missing gauge or one that would fall below zero changes no row: either way the file
    // and its log disagree.
    if lower.execute(params![name, change]).map_err(failed)? != 1 {
        return Err(corrupt(format!(
            "gauge {name} would fall below zero: the read models do not match the log; \
             rebuild them with `opledger replay`"
        )));
    }
    let mut delete = transaction
        .prepare_cached("DELETE FROM gauges WHERE name = ?1 AND value = 0")
        .map_err(failed)?;
    delete.execute([name]).map_err(failed)?;
    Ok(())
}

pub(super) fn write_counters(
    transaction: &Connection,
    counters: &BTreeMap<Counter, u64>,
) -> Result<(), ReadModelError> {
    let mut statement = transaction
        .prepare_cached(
            "INSERT INTO counters (name, value) VALUES (?1, ?2)
             ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        )
        .map_err(|error| ReadModelError::sqlite("preparing a counter", error))?;
    for (counter, raise) in counters {
        let raise = i64::try_from(*raise)
            .map_err(|_| corrupt(format!("counter {} overflows", counter.name())))?;
        statement
            .execute(params![counter.name(), raise])
            .map_err(|error| ReadModelError::sqlite("raising a counter", error))?;
    }
    Ok(())
}

pub(super) fn write_checkpoint(
    transaction: &Connection,
    position: GlobalPosition,
) -> Result<(), ReadModelError> {
    transaction
        .execute(
            "INSERT INTO checkpoint (id, position) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET position = excluded.position",
            [sql::position(position)?],
        )
        .map_err(|error| ReadModelError::sqlite("advancing the checkpoint", error))?;
    Ok(())
}

/// A row that must exist was not there: the read model lost track of the operation.
fn expect_one_row(
    changed: usize,
    what: &str,
    operation_id: OperationId,
) -> Result<(), ReadModelError> {
    if changed == 1 {
        Ok(())
    } else {
        Err(corrupt(format!(
            "the {what} of operation {operation_id} was expected but {changed} rows matched"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use opledger_domain::ids::{AccountId, ActionName, ProviderId, TenantId};

    /// The request index holds only the request's hash (schema version 5), so two requests that
    /// share a hash meet in it; the lookup must still tell them apart by their columns.
    #[test]
    fn a_row_sharing_the_request_hash_but_not_the_request_is_not_a_similar_intent() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let connection = super::super::schema::open(&dir.path().join("views.db")).expect("open");
        let at = Utc
            .with_ymd_and_hms(2026, 12, 3, 9, 0, 0)
            .single()
            .expect("valid");
        let hash_of = |letter: &str| format!("sha256:{}", letter.repeat(64));
        let query = SimilarIntentQuery {
            operation_id: OperationId::from_uuid(uuid::Uuid::from_u128(9)),
            tenant: TenantId::new("t").expect("valid"),
            provider: ProviderId::new("p").expect("valid"),
            account: AccountId::new("a").expect("valid"),
            action: ActionName::new("create").expect("valid"),
            args_hash: ArgsHash::parse(&hash_of("a")).expect("valid"),
            from: at - chrono::Duration::seconds(60),
            to: at + chrono::Duration::seconds(60),
            limit: 10,
        };
        let shared = sql::request_hash(["t", "p", "a", "create", &hash_of("a")]);
        // The same request, and another (other arguments) given the same hash by hand.
        for (n, args_hash) in [(1_u128, hash_of("a")), (2, hash_of("b"))] {
            connection
                .execute(
                    "INSERT INTO operations (operation_id, tenant, provider, account, action,
                         args_hash, state, attempts, created_at, updated_at, stream_version,
                         last_position, folded_state, request_hash)
                     VALUES (?1, 't', 'p', 'a', 'create', ?2, 'pending', 0, ?3, ?3, 0, ?4, x'',
                         ?5)",
                    params![
                        sql::operation_text(OperationId::from_uuid(uuid::Uuid::from_u128(n))),
                        args_hash,
                        sql::TimeText::new(at),
                        n as i64,
                        shared,
                    ],
                )
                .expect("a row");
        }
        let found: Vec<OperationId> = find_similar(&connection, &query)
            .expect("the lookup")
            .into_iter()
            .map(|intent| intent.operation_id)
            .collect();
        assert_eq!(
            found,
            [OperationId::from_uuid(uuid::Uuid::from_u128(1))],
            "only the same request"
        );
    }
}
