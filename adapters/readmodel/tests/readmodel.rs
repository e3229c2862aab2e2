//! The read-model store and its runner on real SQLite files, fed with histories the real ledger
//! writes (`Ledger` + commands, on the memory store or a SQLite ledger file).
//!
//! What is checked: an incremental run equals a rebuild from zero, table for table; a crash (a
//! store dropped unclosed, a batch failing midway, a runner process killed with SIGKILL) resumes
//! from the checkpoint to that same result and never applies an event twice; every query returns
//! what the folds promise; the lag is the head minus the checkpoint; files the store must not
//! touch are refused.
//!
//! The SIGKILL check runs a real child process: this test binary re-executes itself to run the
//! ignored test [`sigkill_child_runs_the_projection_until_killed`].

use std::collections::BTreeMap;
use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeZone, Utc};
use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::codec;
use opledger_domain::command::Command;
use opledger_domain::contract::{
    Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
};
use opledger_domain::event::{
    IntentRecorded, OperationEvent, ReconciliationResult, ReviewDecision,
};
use opledger_domain::ids::{
    AccountId, ActorId, AttemptId, EventId, ExternalObjectId, GlobalPosition, OperationId,
    StreamVersion, TenantId, WorkerId,
};
use opledger_domain::ports::{Clock, IdSource};
use opledger_domain::state::{fold, OperationState};
use opledger_domain::store::{
    EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StreamName, MAX_READ_BATCH,
};
use opledger_projections::id_index::ExternalIdRole;
use opledger_projections::metrics::Counter;
use opledger_projections::totals::Totals;
use opledger_readmodel::{
    catch_up, lock_path, rebuild, rebuild_to_with, FloorLayout, FloorPhase, FloorRows,
    OperationFilter, ReadModelError, ReadModelRunner, ReadModelStore, ReadModels, RebuildLimits,
    RunReport, MAX_BATCH_EVENTS, MAX_LINGER_MS, MAX_QUERY_ROWS, SCHEMA_VERSION,
};
use opledger_runtime::system::RandomIds;
use opledger_store::{MemoryStore, SqliteStore};
use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags};
use serde_json::json;
use tempfile::TempDir;
use tokio::sync::oneshot;

/// Fails a test that waits longer than any healthy run needs, with what it saw.
const TEST_DEADLINE: Duration = Duration::from_secs(60);
/// The environment variable that tells the child which directory holds its files.
const CHILD_DIR_ENV: &str = "OPLEDGER_READMODEL_CHILD_DIR";
/// The child's test, as the test harness names it.
const CHILD_TEST: &str = "sigkill_child_runs_the_projection_until_killed";
/// The child commits this many events at a time, so a kill lands between many small commits.
const CHILD_BATCH_EVENTS: usize = 4;

// ----- a clock that ticks by itself ---------------------------------------------------------------

/// A simulated clock: every reading is one second after the previous one, so events get distinct,
/// ordered times; tests move it further with [`ManualClock::advance`].
#[derive(Clone, Debug)]
struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    fn new() -> Self {
        let start = Utc
            .with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
            .single()
            .expect("a valid start time");
        Self(Arc::new(Mutex::new(start)))
    }

    fn advance(&self, seconds: i64) {
        let mut now = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *now += chrono::Duration::seconds(seconds);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        let mut now = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let reading = *now;
        *now += chrono::Duration::seconds(1);
        reading
    }
}

// ----- writing realistic histories through the ledger ----------------------------------------------

/// The ledger's commands over a store, with the bits every command needs.
struct Harness<S> {
    ledger: Ledger<S, ManualClock, RandomIds>,
    clock: ManualClock,
}

/// How an operation's life goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Story {
    /// Sent and confirmed.
    Plain,
    /// Provably not sent, sent again, confirmed.
    NotSentThenConfirmed,
    /// Timed out; a lookup found the object.
    UnknownThenFound,
    /// Timed out; nothing found and no safe retry: a person must decide.
    UnknownThenReview,
    /// Timed out; nobody has looked yet.
    Unknown,
    /// The lease ran out with no outcome.
    LeaseExpired,
    /// Timed out, retried safely, confirmed; then the first attempt's late response names a
    /// second object.
    LateDuplicate,
    /// Confirmed; a later lookup finds a second object.
    LookupDuplicate,
    /// Refused by the provider.
    Rejected,
    /// Refused by the approver.
    Denied,
    /// In review; the reviewer sends it again; confirmed.
    ReviewThenRetry,
}

const STORIES: [Story; 11] = [
    Story::Plain,
    Story::NotSentThenConfirmed,
    Story::UnknownThenFound,
    Story::UnknownThenReview,
    Story::Unknown,
    Story::LeaseExpired,
    Story::LateDuplicate,
    Story::LookupDuplicate,
    Story::Rejected,
    Story::Denied,
    Story::ReviewThenRetry,
];

fn external(id: &str) -> ExternalObjectId {
    ExternalObjectId::new(id).expect("a valid external id")
}

fn binding(intent: &IntentRecorded) -> SendBinding {
    SendBinding {
        account: intent.account.clone(),
        credential_fingerprint: intent.credential_fingerprint.clone(),
        args_hash: intent.args_hash.clone(),
    }
}

fn capabilities(deduplication: Deduplication) -> ProviderCapabilities {
    ProviderCapabilities {
        deduplication,
        lookup: LookupSupport::Consistent,
    }
}

impl<S: EventStore> Harness<S> {
    fn new(store: S) -> Self {
        let clock = ManualClock::new();
        Self {
            ledger: Ledger::new(store, clock.clone(), RandomIds),
            clock,
        }
    }

    fn store(&self) -> &S {
        self.ledger.store()
    }

    async fn record(
        &self,
        tenant: &str,
        source_id: Option<&str>,
        title: &str,
        requires_approval: bool,
    ) -> IntentRecorded {
        let recorded = self
            .ledger
            .record_intent(IntentRequest {
                tenant: tenant.into(),
                owner: Some("anna".into()),
                provider: "crm".into(),
                account: "acct-1".into(),
                credential_fingerprint: "fp-1".into(),
                action: "create_task".into(),
                args: json!({"title": title, "due": "tomorrow"}),
                source_id: source_id.map(str::to_owned),
                requires_approval,
            })
            .await
            .expect("the intent is recorded");
        recorded.intent().clone()
    }

    async fn run(&self, intent: &IntentRecorded, command: Command) {
        let operation_id = intent.operation_id;
        if let Err(error) = self.ledger.execute(operation_id, &command).await {
            panic!("{} on {operation_id}: {error}", command.name());
        }
    }

    async fn start(&self, intent: &IntentRecorded, deduplication: Deduplication) -> AttemptId {
        let attempt_id = RandomIds.new_attempt_id();
        self.run(
            intent,
            Command::StartAttempt {
                request: None,
                budget_wait: None,
                attempt_id,
                worker: WorkerId::new("worker-1").expect("valid"),
                lease_ms: 30_000,
                binding: binding(intent),
                capabilities: capabilities(deduplication),
                policy: RetryPolicy::default(),
            },
        )
        .await;
        attempt_id
    }

    async fn succeed(&self, intent: &IntentRecorded, attempt_id: AttemptId, id: &str) {
        self.run(
            intent,
            Command::RecordSuccess {
                attempt_id,
                external_id: external(id),
                provider_request_id: None,
            },
        )
        .await;
    }

    async fn time_out(&self, intent: &IntentRecorded, attempt_id: AttemptId) {
        self.run(
            intent,
            Command::RecordUnknown {
                check_not_before: None,
                attempt_id,
                error: "read timeout after 10 s".into(),
            },
        )
        .await;
    }

    async fn look_up(
        &self,
        intent: &IntentRecorded,
        found: Option<&str>,
        deduplication: Deduplication,
    ) {
        let result = match found {
            Some(id) => ReconciliationResult::Found {
                external_id: external(id),
                account: AccountId::new("acct-1").expect("valid"),
            },
            None => ReconciliationResult::NotFound {
                authoritative: true,
            },
        };
        let now = self.clock.now();
        self.run(
            intent,
            Command::RecordReconciliation {
                duplicates: Vec::new(),
                result,
                evidence: format!("GET /tasks?label={}", intent.idempotency_key),
                binding: binding(intent),
                capabilities: capabilities(deduplication),
                policy: RetryPolicy::default(),
                retry_not_before: now,
                next_check_not_before: now,
                in_progress: false,
            },
        )
        .await;
    }

    /// Plays `story` on a recorded intent; `tag` makes its external ids unique.
    async fn play(&self, story: Story, intent: &IntentRecorded, tag: &str) {
        let task = |n: u32| format!("task-{tag}-{n}");
        match story {
            Story::Plain => {
                let attempt = self.start(intent, Deduplication::UniqueLabel).await;
                self.succeed(intent, attempt, &task(1)).await;
            }
            Story::NotSentThenConfirmed => {
                let attempt = self.start(intent, Deduplication::UniqueLabel).await;
                let now = self.clock.now();
                self.run(
                    intent,
                    Command::RecordNotSent {
                        attempt_id: attempt,
                        reason: "connection refused".into(),
                        retry_not_before: now,
                    },
                )
                .await;
                let attempt = self.start(intent, Deduplication::UniqueLabel).await;
                self.succeed(intent, attempt, &task(1)).await;
            }
            Story::UnknownThenFound => {
                let attempt = self.start(intent, Deduplication::None).await;
                self.time_out(intent, attempt).await;
                self.look_up(intent, Some(&task(1)), Deduplication::None)
                    .await;
            }
            Story::UnknownThenReview => {
                let attempt = self.start(intent, Deduplication::None).await;
                self.time_out(intent, attempt).await;
                self.look_up(intent, None, Deduplication::None).await;
            }
            Story::Unknown => {
                let attempt = self.start(intent, Deduplication::None).await;
                self.time_out(intent, attempt).await;
            }
            Story::LeaseExpired => {
                let attempt = self.start(intent, Deduplication::None).await;
                self.clock.advance(31);
                self.run(
                    intent,
                    Command::ExpireLease {
                        attempt_id: attempt,
                    },
                )
                .await;
            }
            Story::LateDuplicate => {
                let first = self.start(intent, Deduplication::UniqueLabel).await;
                self.time_out(intent, first).await;
                self.look_up(intent, None, Deduplication::UniqueLabel).await;
                let second = self.start(intent, Deduplication::UniqueLabel).await;
                self.succeed(intent, second, &task(1)).await;
                self.succeed(intent, first, &task(2)).await;
            }
            Story::LookupDuplicate => {
                let attempt = self.start(intent, Deduplication::None).await;
                self.succeed(intent, attempt, &task(1)).await;
                self.look_up(intent, Some(&task(2)), Deduplication::None)
                    .await;
            }
            Story::Rejected => {
                let attempt = self.start(intent, Deduplication::None).await;
                self.run(
                    intent,
                    Command::RecordRejection {
                        attempt_id: attempt,
                        code: "422 invalid_due_date".into(),
                        message: "due date is in the past".into(),
                    },
                )
                .await;
            }
            Story::Denied => {
                self.run(
                    intent,
                    Command::DenyApproval {
                        principal: None,
                        approver: ActorId::new("boss").expect("valid"),
                        args_hash: intent.args_hash.clone(),
                        reason: "wrong client".into(),
                    },
                )
                .await;
            }
            Story::ReviewThenRetry => {
                let attempt = self.start(intent, Deduplication::None).await;
                self.time_out(intent, attempt).await;
                self.look_up(intent, None, Deduplication::None).await;
                self.run(
                    intent,
                    Command::ResolveReview {
                        principal: None,
                        accept_duplicate_risk: true,
                        capabilities: None,
                        reviewer: ActorId::new("olga").expect("valid"),
                        decision: ReviewDecision::Retry,
                        note: "checked the CRM by hand: nothing there".into(),
                    },
                )
                .await;
                let attempt = self.start(intent, Deduplication::None).await;
                self.succeed(intent, attempt, &task(1)).await;
            }
        }
    }

    /// Records an intent and plays a story on it, the story chosen by `n`.
    async fn play_nth(&self, n: usize) -> OperationId {
        let intent = self.record_nth(n).await;
        self.play_recorded_nth(n, &intent).await;
        intent.operation_id
    }

    /// Records the intent of story `n` and nothing more.
    async fn record_nth(&self, n: usize) -> IntentRecorded {
        let story = STORIES[n % STORIES.len()];
        // Some titles repeat, so identical intents get flagged as possible duplicates too.
        let title = format!("Call client {}", n % 13);
        let source = n.is_multiple_of(3).then(|| format!("call-{n}"));
        self.record("acme", source.as_deref(), &title, story == Story::Denied)
            .await
    }

    /// Plays story `n` on from its recorded intent.
    async fn play_recorded_nth(&self, n: usize, intent: &IntentRecorded) {
        self.play(STORIES[n % STORIES.len()], intent, &n.to_string())
            .await;
    }
}

impl<S: EventStore + Clone + 'static> Harness<S> {
    /// Plays stories `range` on `tasks` concurrent tasks, as several agents would.
    async fn play_concurrently(self: &Arc<Self>, range: std::ops::Range<usize>, tasks: usize) {
        let mut handles = Vec::new();
        for task in 0..tasks {
            let harness = Arc::clone(self);
            let range = range.clone();
            handles.push(tokio::spawn(async move {
                for n in range.skip(task).step_by(tasks) {
                    harness.play_nth(n).await;
                }
            }));
        }
        for handle in handles {
            handle.await.expect("a story task");
        }
    }
}

// ----- looking at what was written -------------------------------------------------------------------

async fn whole_log<S: EventStore>(store: &S) -> Vec<RecordedEvent> {
    let mut log = Vec::new();
    loop {
        let start = log
            .last()
            .map_or(LogStart::Beginning, |last: &RecordedEvent| {
                LogStart::After(last.position)
            });
        let batch = store
            .read_all(start, MAX_READ_BATCH)
            .await
            .expect("read the log");
        if batch.is_empty() {
            return log;
        }
        log.extend(batch);
    }
}

/// Every table of a read-model file, each row rendered and the rows sorted.
fn dump(path: &Path) -> BTreeMap<String, Vec<String>> {
    let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open the read models for reading");
    let tables: Vec<String> = connection
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .expect("list tables")
        .query_map([], |row| row.get(0))
        .expect("list tables")
        .collect::<Result<_, _>>()
        .expect("list tables");
    tables
        .into_iter()
        .map(|table| {
            let mut statement = connection
                .prepare(&format!("SELECT * FROM \"{table}\""))
                .expect("select a table");
            let columns = statement.column_count();
            let mut rows: Vec<String> = statement
                .query_map([], |row| {
                    (0..columns)
                        .map(|column| row.get::<_, Value>(column))
                        .collect::<Result<Vec<_>, _>>()
                })
                .expect("read a table")
                .map(|row| format!("{:?}", row.expect("read a row")))
                .collect();
            rows.sort();
            (table, rows)
        })
        .collect()
}

/// Every table and index of a read-model file by name, with the statement that made it: a file
/// made another way (a rebuild, a conversion) must have made each with the same text.
fn schema_entries(path: &Path) -> Vec<(String, String)> {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open the read models for reading")
        .prepare("SELECT name, sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY name")
        .expect("list the schema")
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .and_then(|rows| rows.collect())
        .expect("the schema reads")
}

async fn dump_of(path: PathBuf) -> BTreeMap<String, Vec<String>> {
    tokio::task::spawn_blocking(move || dump(&path))
        .await
        .expect("the dump thread")
}

/// Rebuilds `store`'s read models from position 0 into a fresh file in `dir` and asserts they
/// hold exactly the rows of the file at `live`; returns the rebuilt read models.
async fn assert_equals_a_rebuild<S: EventStore>(
    store: &S,
    dir: &Path,
    live: &Path,
    what: &str,
) -> ReadModels {
    let rebuilt_path = dir.join("rebuilt.db");
    let rebuilt = rebuild(store, &rebuilt_path).await.expect("rebuild");
    assert_same_tables(
        &dump_of(live.to_path_buf()).await,
        &dump_of(rebuilt_path).await,
        what,
    );
    rebuilt
}

/// Asserts that two read-model files hold the same rows in every table, naming the first table
/// that differs.
fn assert_same_tables(
    left: &BTreeMap<String, Vec<String>>,
    right: &BTreeMap<String, Vec<String>>,
    what: &str,
) {
    assert_eq!(
        left.keys().collect::<Vec<_>>(),
        right.keys().collect::<Vec<_>>(),
        "{what}: the same tables"
    );
    for (table, rows) in left {
        assert_eq!(rows, &right[table], "{what}: table `{table}` differs");
    }
    assert!(
        left.values().map(Vec::len).sum::<usize>() > 0,
        "{what}: the tables are not all empty"
    );
}

/// Checks the read models against the ledger itself: every operation's state, attempts, external
/// id and version as the domain folds them, and every counter against a fold of the whole log.
/// An event applied twice or skipped shows up here as a count or a version that is off.
async fn assert_agrees_with_the_ledger<S: EventStore>(
    ledger: &Ledger<S, ManualClock, RandomIds>,
    read_models: &ReadModels,
) {
    let log = whole_log(ledger.store()).await;
    let mut totals = Totals::default();
    let mut operations = std::collections::BTreeSet::new();
    for recorded in &log {
        totals.apply(&codec::decode(recorded).expect("the log decodes"));
        operations.extend(recorded.stream.operation_id());
    }
    for operation_id in operations {
        let loaded = ledger.get(operation_id).await.expect("the operation loads");
        let row = read_models
            .call(move |store| store.operation(operation_id))
            .await
            .expect("query")
            .unwrap_or_else(|| panic!("operation {operation_id} is in the read models"));
        assert_eq!(row.state, loaded.state.status.name(), "{operation_id}");
        assert_eq!(row.attempts, loaded.state.attempts, "{operation_id}");
        assert_eq!(
            row.external_id.as_ref(),
            loaded.state.external_id(),
            "{operation_id}"
        );
        assert_eq!(Some(row.stream_version), loaded.version, "{operation_id}");
    }
    let metrics = read_models
        .call(|store| store.metrics())
        .await
        .expect("metrics");
    assert_eq!(metrics.counter(Counter::Events), totals.events);
    assert_eq!(metrics.counter(Counter::IntentsRecorded), totals.intents);
    assert_eq!(metrics.counter(Counter::AttemptsStarted), totals.attempts);
    assert_eq!(
        metrics.counter(Counter::UnknownOutcomes),
        totals.unknown_outcomes
    );
    assert_eq!(
        metrics.counter(Counter::ReviewsRequired),
        totals.reviews_required
    );
    assert_eq!(
        metrics.counter(Counter::DuplicatesDetected),
        totals.duplicates
    );
    assert_eq!(metrics.attempts.sum, totals.attempts);
    assert_eq!(metrics.attempts.operations, totals.intents);
    let detected = read_models
        .call(|store| store.duplicates(usize::MAX))
        .await
        .expect("duplicates")
        .detected
        .len() as u64;
    assert_eq!(detected, totals.duplicates, "one row per DuplicateDetected");
}

// ----- running the runner --------------------------------------------------------------------------

/// A runner running in the background until [`Running::stop`].
struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<RunReport, ReadModelError>>,
}

impl Running {
    fn start<S: EventStore + Clone + 'static>(
        runner: ReadModelRunner,
        store: &S,
        read_models: &ReadModels,
    ) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let store = store.clone();
        let read_models = read_models.clone();
        let task = tokio::spawn(async move {
            let stop = async {
                // A dropped sender stops the run as well.
                let _ = stopped.await;
            };
            runner.run(&store, &read_models, stop).await
        });
        Self { stop, task }
    }

    async fn stop(self) -> RunReport {
        let _ = self.stop.send(());
        within("the runner stops", self.task)
            .await
            .expect("the runner task")
            .expect("the runner ran without error")
    }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Waits until the read models have applied the whole log.
async fn caught_up<S: EventStore>(store: &S, read_models: &ReadModels) {
    let deadline = Instant::now() + TEST_DEADLINE;
    loop {
        let lag = read_models.lag(store).await.expect("the lag");
        if lag.positions == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the read models are still behind the log: {lag:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ----- incremental equals rebuild ----------------------------------------------------------------

/// A SQLite ledger with a story harness over it, and empty read models beside it, in a
/// temporary directory: what the live-runner tests start from.
struct LiveOnSqlite {
    dir: TempDir,
    store: SqliteStore,
    harness: Arc<Harness<SqliteStore>>,
    live_path: PathBuf,
    read_models: ReadModels,
}

impl LiveOnSqlite {
    async fn open() -> Self {
        let dir = TempDir::new().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("ledger.db"))
            .await
            .expect("open the ledger");
        let harness = Arc::new(Harness::new(store.clone()));
        let live_path = dir.path().join("live.db");
        let read_models = ReadModels::open(&live_path).await.expect("open");
        Self {
            dir,
            store,
            harness,
            live_path,
            read_models,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_incremental_run_alongside_live_writes_equals_a_rebuild_from_zero() {
    let LiveOnSqlite {
        dir,
        store,
        harness,
        live_path,
        read_models,
    } = LiveOnSqlite::open().await;

    // Some history exists before the runner starts (catch-up), the rest is written while it runs
    // (live), by several concurrent writers; the runner is restarted once in between.
    harness.play_concurrently(0..40, 4).await;
    let first = Running::start(ReadModelRunner::new(), &store, &read_models);
    harness.play_concurrently(40..90, 4).await;
    caught_up(&store, &read_models).await;
    first.stop().await;
    harness.play_concurrently(90..130, 4).await;
    let second = Running::start(
        ReadModelRunner::new().with_max_batch_events(7),
        &store,
        &read_models,
    );
    harness.play_concurrently(130..200, 4).await;
    caught_up(&store, &read_models).await;
    let report = second.stop().await;
    assert!(report.applied > 0);

    let rebuilt =
        assert_equals_a_rebuild(&store, dir.path(), &live_path, "incremental vs rebuild").await;
    assert_eq!(
        rebuilt.checkpoint().await.expect("checkpoint"),
        store.head_position().await.expect("head")
    );
    assert_agrees_with_the_ledger(&harness.ledger, &read_models).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lingering_runner_gathers_live_events_into_fewer_commits_and_still_equals_a_rebuild() {
    let LiveOnSqlite {
        dir,
        store,
        harness,
        live_path,
        read_models,
    } = LiveOnSqlite::open().await;
    let running = Running::start(
        ReadModelRunner::new().with_linger_ms(200),
        &store,
        &read_models,
    );
    let started = std::time::Instant::now();
    harness.play_concurrently(0..60, 4).await;
    caught_up(&store, &read_models).await;
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let report = running.stop().await;
    let events = whole_log(&store).await.len() as u64;
    assert_eq!(report.applied, events, "every event applied exactly once");
    // Every batch but the last waited its 200 ms (none can fill MAX_BATCH_EVENTS here), so
    // there cannot be more batches than 200 ms periods in the run, plus the last.
    assert!(
        report.batches <= elapsed_ms / 200 + 2,
        "{} batches for {} events in {elapsed_ms} ms: each batch should linger 200 ms",
        report.batches,
        report.applied
    );
    assert_equals_a_rebuild(
        &store,
        dir.path(),
        &live_path,
        "lingering incremental vs rebuild",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_asked_to_hurry_commits_without_waiting_out_its_linger() {
    let LiveOnSqlite {
        dir: _dir,
        store,
        harness,
        read_models,
        ..
    } = LiveOnSqlite::open().await;
    let running = Running::start(
        ReadModelRunner::new().with_linger_ms(MAX_LINGER_MS),
        &store,
        &read_models,
    );
    for n in 0..3 {
        harness.play_nth(n).await;
    }
    let started = Instant::now();
    // As a listing does: ask on every look until the read models reach the log's head.
    while read_models.lag(&store).await.expect("the lag").positions > 0 {
        read_models.hurry();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let waited = started.elapsed();
    let report = running.stop().await;
    assert_eq!(report.applied, whole_log(&store).await.len() as u64);
    // Unhurried, the last batch alone would linger a whole second.
    assert!(
        waited < Duration::from_millis(MAX_LINGER_MS / 2),
        "caught up {waited:?} after asking; the linger is {MAX_LINGER_MS} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asking_an_idle_runner_to_hurry_does_not_cut_its_next_batch_short() {
    let LiveOnSqlite {
        dir: _dir,
        store,
        harness,
        read_models,
        ..
    } = LiveOnSqlite::open().await;
    let running = Running::start(
        ReadModelRunner::new().with_linger_ms(MAX_LINGER_MS),
        &store,
        &read_models,
    );
    harness.play_nth(0).await;
    caught_up(&store, &read_models).await;
    // Nothing lingers now: these asks must leave nothing behind for the next batch. (A stored
    // wake-up would have turned the linger off under steady listings.)
    for _ in 0..5 {
        read_models.hurry();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let recorded = Instant::now();
    harness.record_nth(1).await;
    tokio::time::sleep(Duration::from_millis(MAX_LINGER_MS / 4)).await;
    let lag = read_models.lag(&store).await.expect("the lag").positions;
    // Only meaningful while the linger can still be running; a stalled machine may get here
    // after it ran out, and then the batch has rightly been written.
    if recorded.elapsed() < Duration::from_millis(MAX_LINGER_MS * 3 / 4) {
        assert!(lag > 0, "the batch of the new intent still lingers");
    }
    caught_up(&store, &read_models).await;
    let report = running.stop().await;
    assert_eq!(report.applied, whole_log(&store).await.len() as u64);
}

/// Limits small enough that a short log takes every path a long one does: operations written
/// out early and read back, intents let go of by the window and looked up in the file (which
/// also creates the indexes before the end), several id-index flushes, each handed to the writer
/// in ranges while the fold goes on, and several transactions.
const TINY_LIMITS: RebuildLimits = RebuildLimits {
    max_open_operations: 3,
    max_window_intents: 4,
    max_buffered_id_entries: 5,
    commit_events: 7,
    id_entries_per_drip: 2,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_within_tiny_limits_writes_out_reads_back_and_still_equals_the_incremental_run() {
    let dir = TempDir::new().expect("temp dir");
    let store = MemoryStore::new();
    let harness = Arc::new(Harness::new(store.clone()));
    // Concurrent stories interleave operations in the log, so with three open at most many are
    // written out and read back; titles repeat every 13 stories, so the window, holding four
    // intents, must ask the file about requests it let go of. Five intents recorded first and
    // played last keep more operations open than the limit whatever the interleaving.
    let mut early = Vec::new();
    for n in 120..125 {
        early.push((n, harness.record_nth(n).await));
    }
    harness.play_concurrently(0..120, 4).await;
    for (n, intent) in &early {
        harness.play_recorded_nth(*n, intent).await;
    }
    let live_path = dir.path().join("live.db");
    let read_models = ReadModels::open(&live_path).await.expect("open");
    let running = Running::start(ReadModelRunner::new(), &store, &read_models);
    caught_up(&store, &read_models).await;
    running.stop().await;

    let head = store.head_position().await.expect("head");
    let tiny_path = dir.path().join("tiny.db");
    let (tiny, report) = rebuild_to_with(&store, &tiny_path, head, TINY_LIMITS)
        .await
        .expect("a rebuild within tiny limits");
    assert_eq!(report.checkpoint, head);
    assert!(
        report.read_back > 0,
        "operations were read back: {report:?}"
    );
    assert!(
        report.asked_the_file > 0,
        "the window asked the file: {report:?}"
    );
    drop(tiny);
    let default_path = dir.path().join("default.db");
    let (default, report) = rebuild_to_with(&store, &default_path, head, RebuildLimits::default())
        .await
        .expect("a rebuild within the default limits");
    assert_eq!(
        (report.read_back, report.asked_the_file),
        (0, 0),
        "a short log fits the default limits"
    );
    drop(default);
    // The indexes a rebuild builds at the end, or (having asked the file, as the tiny rebuild
    // did) mid-way, are the incremental file's, statement for statement.
    let live_schema = schema_entries(&live_path);
    assert!(
        [
            "operations_by_created",
            "operations_by_request",
            "external_ids_by_id"
        ]
        .iter()
        .all(|index| live_schema.iter().any(|(name, _)| name == index)),
        "the schema lists the indexes: {live_schema:?}"
    );
    assert_eq!(
        schema_entries(&tiny_path),
        live_schema,
        "tiny rebuild's schema"
    );
    assert_eq!(
        schema_entries(&default_path),
        live_schema,
        "default rebuild's schema"
    );
    let live = dump_of(live_path).await;
    assert_same_tables(
        &live,
        &dump_of(tiny_path).await,
        "incremental vs tiny rebuild",
    );
    assert_same_tables(
        &live,
        &dump_of(default_path).await,
        "incremental vs default rebuild",
    );
    let flagged = &live["possible_duplicate_intents"];
    assert!(
        !flagged.is_empty(),
        "the stories flag possible duplicates, so the window's answers were compared"
    );
}

/// The floor (`opledger bench projections --floor`) is only a bound on a rebuild if it writes
/// what the rebuild writes: the same rows in every table, and the same indexes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_writes_exactly_the_rows_and_indexes_of_the_rebuild_it_was_loaded_from() {
    let dir = TempDir::new().expect("temp dir");
    let store = MemoryStore::new();
    let harness = Arc::new(Harness::new(store.clone()));
    harness.play_concurrently(0..40, 4).await;
    let rebuilt_path = dir.path().join("rebuilt.db");
    drop(rebuild(&store, &rebuilt_path).await.expect("rebuild"));
    let rows = FloorRows::load(&rebuilt_path).expect("the rows load");
    assert!(rows.rows() > 40, "at least a row per operation");
    let Err(too_many) = FloorRows::load_at_most(&rebuilt_path, 40) else {
        panic!("more rows than the floor may hold are refused");
    };
    assert!(
        too_many.to_string().contains("more than 40 rows"),
        "{too_many}"
    );
    let floor_path = dir.path().join("floor.db");
    let mut phases = Vec::new();
    rows.write(&floor_path, FloorLayout::CURRENT, 2, |phase| {
        phases.push(phase)
    })
    .expect("the floor writes");
    assert_eq!(
        phases,
        [
            FloorPhase::Inserting,
            FloorPhase::CreatingIndexes,
            FloorPhase::Closing,
            FloorPhase::Done
        ]
    );
    assert_same_tables(
        &dump_of(rebuilt_path.clone()).await,
        &dump_of(floor_path.clone()).await,
        "rebuild vs floor",
    );
    let schema_of = |path: &Path| -> Vec<(String, String)> {
        let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open read-only");
        let mut statement = connection
            .prepare("SELECT name, sql FROM sqlite_schema WHERE sql IS NOT NULL ORDER BY name")
            .expect("prepare");
        statement
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .and_then(|rows| rows.collect())
            .expect("the schema reads")
    };
    assert_eq!(schema_of(&rebuilt_path), schema_of(&floor_path));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_that_fails_midway_reports_the_event_and_leaves_no_file_behind() {
    let dir = TempDir::new().expect("temp dir");
    let harness = Harness::new(MemoryStore::new());
    for n in 0..30 {
        harness.play_nth(n).await;
    }
    // An operation stream whose only event cannot be decoded, after thirty operations, so the
    // writer has rows, index entries and a commit behind it (tiny limits) when the fold fails.
    let broken = OperationId::from_uuid(uuid::Uuid::from_u128(7));
    let data = b"{\"not\": \"an event\"}".to_vec();
    let at = Utc
        .with_ymd_and_hms(2026, 11, 30, 9, 0, 0)
        .single()
        .expect("valid");
    let outcome = harness
        .store()
        .append(
            &StreamName::for_operation(broken),
            ExpectedVersion::NoStream,
            vec![EventData {
                event_id: EventId::for_operation_event(
                    broken,
                    StreamVersion::FIRST,
                    at,
                    "IntentRecorded",
                    &data,
                ),
                event_type: "IntentRecorded".to_owned(),
                data,
                metadata: b"{}".to_vec(),
            }],
        )
        .await
        .expect("the store takes any bytes");
    harness.play_nth(30).await;
    let head = harness.store().head_position().await.expect("head");
    let path = dir.path().join("read.db");
    let error = rebuild_to_with(harness.store(), &path, head, TINY_LIMITS)
        .await
        .expect_err("an undecodable event fails the rebuild");
    assert!(
        matches!(error, ReadModelError::Decode { position, .. } if position == outcome.position),
        "{error}"
    );
    let left = files_in(dir.path());
    assert!(left.is_empty(), "no file is left behind: {left:?}");
}

/// The names of the files in `dir`.
fn files_in(dir: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .expect("list")
        .map(|entry| entry.expect("entry").file_name())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_cancelled_half_way_leaves_no_file_behind() {
    let dir = TempDir::new().expect("temp dir");
    let harness = Harness::new(MemoryStore::new());
    for n in 0..300 {
        harness.play_nth(n).await;
    }
    let head = harness.store().head_position().await.expect("head");
    let path = dir.path().join("read.db");
    let files = || files_in(dir.path());
    // Dropped as soon as its temporary file exists, as a Ctrl-C drops a replay's future.
    let rebuilding = rebuild_to_with(harness.store(), &path, head, TINY_LIMITS);
    let started = async {
        while files().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::select! {
        finished = rebuilding => panic!("the rebuild finished before it could be cancelled: {:?}",
            finished.map(|(_, report)| report)),
        () = started => {}
    }
    // The fold and the writer notice on their own threads and clean up.
    let deadline = Instant::now() + TEST_DEADLINE;
    while !files().is_empty() {
        assert!(Instant::now() < deadline, "left behind: {:?}", files());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!path.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_limits_that_cannot_make_progress_are_refused() {
    let dir = TempDir::new().expect("temp dir");
    let harness = Harness::new(MemoryStore::new());
    harness.play_nth(0).await;
    let head = harness.store().head_position().await.expect("head");
    let limits = RebuildLimits {
        max_open_operations: 0,
        ..RebuildLimits::default()
    };
    let path = dir.path().join("read.db");
    let error = rebuild_to_with(harness.store(), &path, head, limits)
        .await
        .expect_err("refused");
    assert!(
        matches!(error, ReadModelError::InvalidQuery { .. }),
        "{error}"
    );
    assert!(!path.exists(), "nothing was created");
}

// ----- crashes -----------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_dropped_without_closing_resumes_from_its_checkpoint_and_applies_nothing_twice() {
    let dir = TempDir::new().expect("temp dir");
    let harness = Harness::new(MemoryStore::new());
    for n in 0..60 {
        harness.play_nth(n).await;
    }
    let log = whole_log(harness.store()).await;
    let half = log.len() / 2;
    let path = dir.path().join("read.db");

    // Apply the first half in batches of 9, then drop the store without closing its connection.
    let first_half = log[..half].to_vec();
    let crashed_at = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            let mut store = ReadModelStore::open(&path).expect("open");
            for batch in first_half.chunks(9) {
                store.apply_batch(batch).expect("a batch applies");
            }
            let checkpoint = store.checkpoint().expect("checkpoint");
            // No destructor, no close: the connection is simply abandoned, as in a crash.
            std::mem::forget(store);
            checkpoint
        })
        .await
        .expect("the blocking thread")
    };
    assert_eq!(crashed_at, Some(log[half - 1].position));

    let read_models = ReadModels::open(&path).await.expect("reopen");
    assert_eq!(
        read_models.checkpoint().await.expect("checkpoint"),
        crashed_at
    );
    // Handing over events already applied (a runner that re-reads after a restart) applies none.
    let replayed = read_models
        .apply_batch(log[half - 20..half].to_vec())
        .await
        .expect("a replayed batch");
    assert_eq!((replayed.applied, replayed.skipped), (0, 20));
    // A replayed prefix followed by new events applies only the new ones.
    let overlapping = read_models
        .apply_batch(log[half - 5..half + 5].to_vec())
        .await
        .expect("an overlapping batch");
    assert_eq!((overlapping.applied, overlapping.skipped), (5, 5));

    let running = Running::start(ReadModelRunner::new(), harness.store(), &read_models);
    caught_up(harness.store(), &read_models).await;
    running.stop().await;

    assert_equals_a_rebuild(harness.store(), dir.path(), &path, "resumed vs rebuild").await;
    assert_agrees_with_the_ledger(&harness.ledger, &read_models).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_midway_leaves_nothing_behind_and_the_next_try_applies_it_whole() {
    let dir = TempDir::new().expect("temp dir");
    let harness = Harness::new(MemoryStore::new());
    for n in 0..20 {
        harness.play_nth(n).await;
    }
    let log = whole_log(harness.store()).await;
    let path = dir.path().join("read.db");
    let read_models = ReadModels::open(&path).await.expect("open");
    read_models
        .apply_batch(log[..30].to_vec())
        .await
        .expect("the first batch");
    let before = dump_of(path.clone()).await;

    // The seventh event of the next batch cannot be decoded; six before it were already folded
    // inside the transaction when it fails.
    let mut broken = log[30..45].to_vec();
    broken[6].data = b"{\"not\": \"an event\"}".to_vec();
    let error = read_models
        .apply_batch(broken)
        .await
        .expect_err("an undecodable event fails the batch");
    assert!(
        matches!(error, ReadModelError::Decode { position, .. } if position == log[36].position),
        "{error}"
    );
    assert_eq!(
        read_models.checkpoint().await.expect("checkpoint"),
        Some(log[29].position)
    );
    assert_same_tables(
        &before,
        &dump_of(path.clone()).await,
        "after a failed batch",
    );

    // Out of order and oversized batches are refused the same way.
    let repeated = vec![log[30].clone(), log[31].clone(), log[31].clone()];
    assert!(matches!(
        read_models.apply_batch(repeated).await,
        Err(ReadModelError::OutOfOrder { last, found }) if last == found
    ));
    let too_many = vec![log[30].clone(); MAX_BATCH_EVENTS + 1];
    assert!(matches!(
        read_models.apply_batch(too_many).await,
        Err(ReadModelError::BatchTooLarge { .. })
    ));
    assert_same_tables(&before, &dump_of(path).await, "after refused batches");

    let outcome = read_models
        .apply_batch(log[30..].to_vec())
        .await
        .expect("the batch, intact");
    assert_eq!(outcome.applied, log.len() - 30);
    assert_agrees_with_the_ledger(&harness.ledger, &read_models).await;
}

/// A child process entry point: runs the projection over the ledger in `CHILD_DIR_ENV` into the
/// read models there, committing every few events, until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "entry point of the SIGKILL child; run by acknowledged_progress_survives_a_sigkill_of_the_runner_and_resumes_to_equal_a_rebuild"]
async fn sigkill_child_runs_the_projection_until_killed() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let store = SqliteStore::open(dir.join("ledger.db"))
        .await
        .expect("the child opens the ledger");
    let read_models = ReadModels::open(dir.join("read.db"))
        .await
        .expect("the child opens the read models");
    ReadModelRunner::new()
        .with_max_batch_events(CHILD_BATCH_EVENTS)
        .run(&store, &read_models, std::future::pending())
        .await
        .expect("the child's runner");
}

/// Kills the child when the test ends, however it ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The checkpoint in a read-model file another process is writing, if it has one yet.
fn checkpoint_in(path: &Path) -> Option<u64> {
    let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    connection
        .query_row("SELECT position FROM checkpoint WHERE id = 1", [], |row| {
            row.get::<_, i64>(0)
        })
        .ok()
        .and_then(|position| u64::try_from(position).ok())
}

#[test]
fn acknowledged_progress_survives_a_sigkill_of_the_runner_and_resumes_to_equal_a_rebuild() {
    let dir = TempDir::new().expect("temp dir");
    let ledger_path = dir.path().join("ledger.db");
    let read_path = dir.path().join("read.db");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let head = runtime.block_on(async {
        let store = SqliteStore::open(&ledger_path).await.expect("open");
        let harness = Arc::new(Harness::new(store.clone()));
        harness.play_concurrently(0..300, 8).await;
        let head = store.head_position().await.expect("head").expect("events");
        drop(harness);
        // One store per file at a time: the child owns the ledger file while it runs.
        store.close().await.expect("close the ledger");
        head.value()
    });

    let stderr_path = dir.path().join("child.stderr");
    let child_stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let mut child = ChildGuard(
        Process::new(std::env::current_exe().expect("the test binary's path"))
            .args(["--ignored", "--exact", CHILD_TEST, "--nocapture"])
            .env(CHILD_DIR_ENV, dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr_path).expect("create the child's stderr file"))
            .spawn()
            .expect("start the child"),
    );
    // Kill it once it has committed a third of the log: with a few events per commit, that is
    // almost always in the middle of a batch.
    let deadline = Instant::now() + TEST_DEADLINE;
    let killed_at = loop {
        if let Some(position) = checkpoint_in(&read_path).filter(|p| *p >= head / 3) {
            break position;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!(
                "the child exited with {status}; its stderr:\n{}",
                child_stderr()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the child committed too little in {TEST_DEADLINE:?}; its stderr:\n{}",
            child_stderr()
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    // `Child::kill` sends SIGKILL on Unix: no destructor, rollback or close runs in the child.
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().expect("reap the child");
    let after_kill = checkpoint_in(&read_path).expect("a checkpoint survives");
    assert!(
        after_kill >= killed_at,
        "a committed checkpoint never goes back"
    );
    assert!(
        after_kill < head,
        "the child was killed before it caught up (at {after_kill} of {head}), so the resume has work to do"
    );
    eprintln!("killed the child at checkpoint {after_kill} of {head}");

    runtime.block_on(async {
        let store = SqliteStore::open(&ledger_path).await.expect("reopen");
        let read_models = ReadModels::open(&read_path).await.expect("reopen");
        let running = Running::start(ReadModelRunner::new(), &store, &read_models);
        caught_up(&store, &read_models).await;
        running.stop().await;
        assert_equals_a_rebuild(
            &store,
            dir.path(),
            &read_path,
            "resumed after SIGKILL vs rebuild",
        )
        .await;
        let harness = Harness::new(store.clone());
        assert_agrees_with_the_ledger(&harness.ledger, &read_models).await;
        drop(harness);
        store.close().await.expect("close");
    });
}

// ----- queries -----------------------------------------------------------------------------------

/// A small history with one operation per story, a few identical intents, and read models built
/// from it.
struct Fixture {
    harness: Harness<MemoryStore>,
    read_models: ReadModels,
    ops: BTreeMap<&'static str, IntentRecorded>,
    _dir: TempDir,
}

impl Fixture {
    async fn build() -> Self {
        let harness = Harness::new(MemoryStore::new());
        let mut ops = BTreeMap::new();
        let named: [(&'static str, Story, Option<&str>); 11] = [
            ("plain", Story::Plain, Some("call-plain")),
            ("not_sent", Story::NotSentThenConfirmed, None),
            ("found", Story::UnknownThenFound, None),
            ("review", Story::UnknownThenReview, None),
            ("unknown", Story::Unknown, None),
            ("expired", Story::LeaseExpired, None),
            ("late_dup", Story::LateDuplicate, None),
            ("lookup_dup", Story::LookupDuplicate, None),
            ("rejected", Story::Rejected, None),
            ("denied", Story::Denied, None),
            ("review_retry", Story::ReviewThenRetry, None),
        ];
        for (name, story, source) in named {
            let intent = harness
                .record(
                    "acme",
                    source,
                    &format!("Call {name}"),
                    story == Story::Denied,
                )
                .await;
            harness.play(story, &intent, name).await;
            ops.insert(name, intent);
        }
        // Another operation whose lookup finds the very object `plain` was confirmed with.
        let shared = harness.record("acme", None, "Call shared", false).await;
        let attempt = harness.start(&shared, Deduplication::None).await;
        harness.time_out(&shared, attempt).await;
        harness
            .look_up(&shared, Some("task-plain-1"), Deduplication::None)
            .await;
        ops.insert("shared", shared);

        // The same request from three deliveries within the window, a redelivery, one more after
        // the window, and one for another tenant.
        let same = "Call the client about the invoice";
        ops.insert(
            "dup_a",
            harness.record("acme", Some("call-a"), same, false).await,
        );
        harness.clock.advance(60);
        ops.insert(
            "dup_b",
            harness.record("acme", Some("call-b"), same, false).await,
        );
        harness.clock.advance(60);
        let redelivered = harness.record("acme", Some("call-a"), same, false).await;
        assert_eq!(redelivered.operation_id, ops["dup_a"].operation_id);
        ops.insert("dup_c", harness.record("acme", None, same, false).await);
        harness.clock.advance(11 * 60);
        ops.insert(
            "dup_d",
            harness.record("acme", Some("call-d"), same, false).await,
        );
        ops.insert("globex", harness.record("globex", None, same, false).await);

        let dir = TempDir::new().expect("temp dir");
        let read_models = rebuild(harness.store(), dir.path().join("read.db"))
            .await
            .expect("rebuild");
        Self {
            harness,
            read_models,
            ops,
            _dir: dir,
        }
    }

    fn id(&self, name: &str) -> OperationId {
        self.ops[name].operation_id
    }

    async fn trace(&self, id: String) -> Option<OperationId> {
        self.read_models
            .call(move |store| store.trace(&id))
            .await
            .expect("trace")
    }

    /// The ids of the operation's stream, as the ledger recorded them.
    async fn attempt_ids(&self, name: &str) -> Vec<AttemptId> {
        let loaded = self.harness.ledger.get(self.id(name)).await.expect("loads");
        loaded.state.attempt_ids
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_queue_lists_unresolved_operations_oldest_first_with_their_evidence() {
    let fixture = Fixture::build().await;
    let queue = fixture
        .read_models
        .call(|store| store.review_queue(100))
        .await
        .expect("the review queue");
    let listed: Vec<OperationId> = queue.iter().map(|item| item.operation_id).collect();
    assert_eq!(
        listed,
        vec![
            fixture.id("review"),
            fixture.id("unknown"),
            fixture.id("expired")
        ],
        "only the unresolved, in the order they became unresolved"
    );
    assert!(queue.windows(2).all(|pair| pair[0].since <= pair[1].since));

    let review = &queue[0];
    assert_eq!(review.state, "needs_review");
    assert_eq!(review.account.as_str(), "acct-1");
    assert_eq!(review.attempts, 1);
    assert_eq!(review.lookups, 1);
    assert_eq!(
        review.last_error.as_deref(),
        Some("read timeout after 10 s")
    );
    let lookup = review.last_lookup.as_ref().expect("the lookup is kept");
    assert_eq!(lookup.result, "not found (consistent lookup)");
    assert!(
        lookup.evidence.starts_with("GET /tasks?label="),
        "{lookup:?}"
    );
    let handed_over = review.review.as_ref().expect("the hand-over is kept");
    assert!(
        handed_over
            .reason
            .starts_with("no evidence, and no safe retry"),
        "{handed_over:?}"
    );
    let row = fixture
        .read_models
        .call({
            let id = fixture.id("review");
            move |store| store.operation(id)
        })
        .await
        .expect("query")
        .expect("the operation");
    assert_eq!(row.unknown_since, Some(review.since));
    assert_eq!(
        row.needs_review_reason.as_deref(),
        Some(handed_over.reason.as_str())
    );

    assert_eq!(queue[1].state, "unknown");
    assert_eq!(queue[1].last_lookup, None);
    assert_eq!(queue[2].state, "unknown");
    assert!(queue[2]
        .last_error
        .as_deref()
        .is_some_and(|error| error.starts_with("lease expired")));

    let first_only = fixture
        .read_models
        .call(|store| store.review_queue(1))
        .await
        .expect("the review queue");
    assert_eq!(
        first_only,
        queue[..1].to_vec(),
        "the limit keeps the oldest"
    );

    // An operator's scope filters the same queue, in the same order.
    let tenant = queue[0].tenant.clone();
    let scoped_tenant = tenant.clone();
    let scoped = fixture
        .read_models
        .call(move |store| store.review_queue_of(&[scoped_tenant], 100))
        .await
        .expect("the scoped review queue");
    let expected: Vec<_> = queue
        .iter()
        .filter(|item| item.tenant == tenant)
        .cloned()
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(scoped, expected);
    let elsewhere = fixture
        .read_models
        .call(|store| {
            store.review_queue_of(&[TenantId::new("nobody-here").expect("a tenant id")], 100)
        })
        .await
        .expect("the scoped review queue");
    assert!(elsewhere.is_empty());
    let no_scope = fixture
        .read_models
        .call(|store| store.review_queue_of(&[], 100))
        .await
        .expect("the scoped review queue");
    assert!(no_scope.is_empty(), "an empty scope lists nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_finds_the_operation_from_an_attempt_id_an_external_id_a_source_id_or_its_own_id() {
    let fixture = Fixture::build().await;
    let plain = fixture.id("plain");
    let attempts = fixture.attempt_ids("not_sent").await;
    assert_eq!(attempts.len(), 2);
    for attempt in attempts {
        assert_eq!(
            fixture.trace(attempt.to_string()).await,
            Some(fixture.id("not_sent")),
            "every attempt leads back"
        );
    }
    assert_eq!(fixture.trace("call-plain".into()).await, Some(plain));
    assert_eq!(fixture.trace(plain.to_string()).await, Some(plain));
    assert_eq!(
        fixture.trace(plain.to_string().to_uppercase()).await,
        Some(plain),
        "any spelling of a UUID"
    );
    assert_eq!(
        fixture.trace("task-found-1".into()).await,
        Some(fixture.id("found"))
    );
    assert_eq!(
        fixture.trace("task-late_dup-2".into()).await,
        Some(fixture.id("late_dup")),
        "a duplicate object leads to the operation it duplicates"
    );
    // Named by two operations: the first one confirmed with it wins.
    assert_eq!(fixture.trace(" task-plain-1 ".into()).await, Some(plain));
    for nothing in ["task-404", "", "x".repeat(10_000).as_str()] {
        assert_eq!(fixture.trace(nothing.to_owned()).await, None);
    }
    let unknown_uuid = uuid::Uuid::from_u128(7).to_string();
    assert_eq!(fixture.trace(unknown_uuid).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_external_id_shared_by_more_operations_of_other_tenants_than_a_query_reads_still_finds_the_callers_own(
) {
    // Task 731 exists in many tenants' CRMs. More than MAX_QUERY_ROWS operations of other
    // tenants name it before the caller's own does, so a limit applied before the tenant filter
    // would see only other tenants' rows.
    let harness = Harness::new(MemoryStore::new());
    let others = MAX_QUERY_ROWS + 5;
    for n in 0..others {
        let intent = harness
            .record(
                &format!("tenant-{n}"),
                None,
                &format!("Call client {n}"),
                false,
            )
            .await;
        let attempt = harness.start(&intent, Deduplication::UniqueLabel).await;
        harness.succeed(&intent, attempt, "731").await;
    }
    let own = harness
        .record("acme", Some("731"), "Call the client", false)
        .await;
    let attempt = harness.start(&own, Deduplication::UniqueLabel).await;
    harness.succeed(&own, attempt, "731").await;
    let dir = TempDir::new().expect("temp dir");
    let read_models = rebuild(harness.store(), dir.path().join("read.db"))
        .await
        .expect("rebuild");

    let unscoped = read_models
        .call(|store| store.trace_candidates("731", MAX_QUERY_ROWS))
        .await
        .expect("trace");
    assert_eq!(unscoped.len(), MAX_QUERY_ROWS);
    assert!(
        !unscoped.contains(&own.operation_id),
        "the caller's own is beyond the first MAX_QUERY_ROWS candidates of every tenant"
    );
    let acme = TenantId::new("acme").expect("a tenant id");
    let scoped = read_models
        .call(move |store| store.trace_candidates_of("731", &[acme], 10))
        .await
        .expect("trace");
    assert_eq!(
        scoped,
        vec![own.operation_id],
        "by external id and by source id, once"
    );
    let attempt_id = attempt.to_string();
    let acme = TenantId::new("acme").expect("a tenant id");
    let by_attempt = read_models
        .call(move |store| store.trace_candidates_of(&attempt_id, &[acme], 10))
        .await
        .expect("trace");
    assert_eq!(by_attempt, vec![own.operation_id]);
    let other = TenantId::new("tenant-0").expect("a tenant id");
    let own_id = own.operation_id.to_string();
    let hidden = read_models
        .call(move |store| store.trace_candidates_of(&own_id, &[other], 10))
        .await
        .expect("trace");
    assert!(
        hidden.is_empty(),
        "another tenant's operation id finds nothing"
    );
    let nobody = read_models
        .call(|store| store.trace_candidates_of("731", &[], 10))
        .await
        .expect("trace");
    assert!(nobody.is_empty(), "an empty scope finds nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_intents_from_different_sources_within_the_window_are_flagged_and_a_redelivery_is_not(
) {
    let fixture = Fixture::build().await;
    let report = fixture
        .read_models
        .call(|store| store.duplicates(100))
        .await
        .expect("duplicates");
    let pairs: Vec<(OperationId, OperationId)> = report
        .possible_intents
        .iter()
        .map(|pair| (pair.operation_id, pair.earlier_operation_id))
        .collect();
    // Newest first: both of dup_c's pairs (in id order), then dup_b's.
    let mut expected = vec![
        (fixture.id("dup_c"), fixture.id("dup_a")),
        (fixture.id("dup_c"), fixture.id("dup_b")),
    ];
    expected.sort();
    expected.push((fixture.id("dup_b"), fixture.id("dup_a")));
    assert_eq!(
        pairs, expected,
        "dup_b and dup_c are flagged; the redelivery of call-a, dup_d (outside the window) and the \
         other tenant are not"
    );
    let b_after_a = report
        .possible_intents
        .iter()
        .find(|pair| pair.operation_id == fixture.id("dup_b"))
        .expect("dup_b is flagged");
    assert_eq!(
        b_after_a.source_id.as_ref().map(|s| s.as_str()),
        Some("call-b")
    );
    assert_eq!(
        b_after_a.earlier_source_id.as_ref().map(|s| s.as_str()),
        Some("call-a")
    );
    let gap = fixture.ops["dup_b"].at - fixture.ops["dup_a"].at;
    assert!(gap > chrono::Duration::seconds(60));
    assert_eq!(b_after_a.gap_ms, gap.num_milliseconds());
    assert_eq!(b_after_a.tenant.as_str(), "acme");
    assert_eq!(b_after_a.args_hash, fixture.ops["dup_a"].args_hash);
    // Flagged, never blocked: every one of them is an operation of its own, pending.
    for name in ["dup_a", "dup_b", "dup_c", "dup_d"] {
        let id = fixture.id(name);
        let row = fixture
            .read_models
            .call(move |store| store.operation(id))
            .await
            .expect("query")
            .expect("recorded");
        assert_eq!(row.state, "pending", "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn similar_intents_in_one_batch_are_flagged_as_when_each_batch_holds_one_event() {
    // The fixture's log holds identical intents close together; one batch folds them all before
    // any row is in the file, the other writes each one's row before the next is folded.
    let fixture = Fixture::build().await;
    let log = whole_log(fixture.harness.store()).await;
    assert!(log.len() <= MAX_BATCH_EVENTS, "the fixture fits one batch");
    for (what, batch_size) in [("one batch", log.len()), ("one event per batch", 1)] {
        let flagged = flagged_in_batches_of(fixture.harness.store(), &log, batch_size, what).await;
        assert_eq!(flagged, 3, "{what}: dup_b once, dup_c twice");
    }
}

/// Applies `log` to fresh read models in batches of `batch_size`, checks the file equals a
/// rebuild, and returns how many possible duplicate intents it flagged.
async fn flagged_in_batches_of<S: EventStore>(
    store: &S,
    log: &[RecordedEvent],
    batch_size: usize,
    what: &str,
) -> usize {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("read.db");
    let read_models = ReadModels::open(&path).await.expect("open");
    for batch in log.chunks(batch_size) {
        read_models
            .apply_batch(batch.to_vec())
            .await
            .expect("a batch applies");
    }
    let flagged = read_models
        .call(|store| store.duplicates(MAX_QUERY_ROWS))
        .await
        .expect("duplicates")
        .possible_intents
        .len();
    drop(read_models);
    assert_equals_a_rebuild(store, dir.path(), &path, what).await;
    flagged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_similar_intents_than_are_checked_flag_the_newest_whatever_the_batches() {
    // Fourteen identical requests from different deliveries: each flags at most
    // MAX_SIMILAR_INTENTS_CHECKED earlier ones, the newest. Batches of five mix earlier intents
    // already in the file with ones recorded earlier in the same batch, whose merge must keep
    // the file query's order and limit.
    let harness = Harness::new(MemoryStore::new());
    let intents = 14;
    for n in 0..intents {
        harness
            .record(
                "acme",
                Some(&format!("burst-{n}")),
                "Call the same client",
                false,
            )
            .await;
    }
    let log = whole_log(harness.store()).await;
    let checked = opledger_projections::duplicates::MAX_SIMILAR_INTENTS_CHECKED;
    let expected: usize = (0..intents).map(|earlier| earlier.min(checked)).sum();
    assert!(intents > checked + 1, "the limit is reached");
    for (what, batch_size) in [
        ("one batch", log.len()),
        ("batches of five", 5),
        ("one event per batch", 1),
    ] {
        let flagged = flagged_in_batches_of(harness.store(), &log, batch_size, what).await;
        assert_eq!(flagged, expected, "{what}");
    }
}

fn name_of(fixture: &Fixture, id: OperationId) -> &'static str {
    fixture
        .ops
        .iter()
        .find(|(_, intent)| intent.operation_id == id)
        .map(|(name, _)| *name)
        .expect("a named operation")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detected_duplicates_and_external_ids_shared_by_operations_are_reported() {
    let fixture = Fixture::build().await;
    let report = fixture
        .read_models
        .call(|store| store.duplicates(100))
        .await
        .expect("duplicates");
    let detected: Vec<(OperationId, &str, &str, &str)> = report
        .detected
        .iter()
        .map(|found| {
            (
                found.operation_id,
                found.confirmed_external_id.as_str(),
                found.duplicate_external_id.as_str(),
                found.found_by.as_str(),
            )
        })
        .collect();
    let late_found_by = format!(
        "late response to attempt {}",
        fixture.attempt_ids("late_dup").await[0]
    );
    assert_eq!(
        detected,
        vec![
            (
                fixture.id("lookup_dup"),
                "task-lookup_dup-1",
                "task-lookup_dup-2",
                "reconciliation"
            ),
            (
                fixture.id("late_dup"),
                "task-late_dup-1",
                "task-late_dup-2",
                late_found_by.as_str()
            ),
        ],
        "newest first"
    );
    assert!(report
        .detected
        .iter()
        .all(|found| found.account.as_str() == "acct-1"));

    let [shared] = report.shared_external_ids.as_slice() else {
        panic!(
            "one object named by two operations: {:?}",
            report.shared_external_ids
        );
    };
    assert_eq!(shared.external_id.as_str(), "task-plain-1");
    assert_eq!(shared.provider.as_str(), "crm");
    assert_eq!(
        shared.operations,
        vec![
            (fixture.id("plain"), ExternalIdRole::Confirmed),
            (fixture.id("shared"), ExternalIdRole::Confirmed),
        ]
    );

    // Per operation: only what concerns it, found by query rather than among the newest rows.
    let late_dup = fixture.id("late_dup");
    let of_late = fixture
        .read_models
        .call(move |store| store.duplicates_of(late_dup, 100))
        .await
        .expect("duplicates of one operation");
    assert_eq!(of_late.detected.len(), 1);
    assert_eq!(of_late.detected[0].operation_id, late_dup);
    assert!(of_late.shared_external_ids.is_empty());
    let shared_op = fixture.id("shared");
    let of_shared = fixture
        .read_models
        .call(move |store| store.duplicates_of(shared_op, 100))
        .await
        .expect("duplicates of one operation");
    assert!(of_shared.detected.is_empty());
    assert_eq!(of_shared.shared_external_ids.len(), 1);
    assert_eq!(
        of_shared.shared_external_ids[0].external_id.as_str(),
        "task-plain-1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_states_confirmations_duplicates_attempts_and_the_oldest_unresolved() {
    let fixture = Fixture::build().await;
    let metrics = fixture
        .read_models
        .call(|store| store.metrics())
        .await
        .expect("metrics");
    let states: BTreeMap<&str, u64> = metrics
        .by_state
        .iter()
        .filter(|(_, count)| **count > 0)
        .map(|(state, count)| (*state, *count))
        .collect();
    assert_eq!(
        states,
        BTreeMap::from([
            ("denied", 1),
            ("needs_review", 1),
            ("pending", 5),
            ("rejected", 1),
            ("succeeded", 7),
            ("unknown", 2),
        ])
    );
    assert_eq!(metrics.by_state["in_flight"], 0, "every state is listed");
    assert_eq!(
        metrics.counter(Counter::ReconciliationsConfirmed),
        2,
        "found and shared were confirmed by a lookup; a lookup finding a duplicate is not one"
    );
    assert_eq!(metrics.counter(Counter::DuplicatesDetected), 2);
    assert_eq!(metrics.counter(Counter::ReviewsRequired), 2);
    assert_eq!(metrics.possible_duplicate_intents, 3);
    assert_eq!(metrics.shared_external_ids, 1);
    assert_eq!(
        metrics.attempts.histogram,
        vec![(0, 6), (1, 8), (2, 3)],
        "denied and five pending never sent; three took two attempts"
    );
    assert_eq!(metrics.attempts.sum, 14);
    assert_eq!(metrics.attempts.operations, 17);
    let oldest = metrics.oldest_unknown.expect("an unknown operation");
    assert_eq!(oldest.operation_id, fixture.id("unknown"));
    assert_eq!(
        metrics
            .oldest_needs_review
            .map(|oldest| oldest.operation_id),
        Some(fixture.id("review"))
    );
    assert_agrees_with_the_ledger(&fixture.harness.ledger, &fixture.read_models).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_oldest_unknown_and_duplicates_are_its_own_and_all_tenants_match_the_metrics() {
    let fixture = Fixture::build().await;
    let numbers = |tenant: Option<&str>| {
        let tenant = tenant.map(|t| TenantId::new(t).expect("a tenant id"));
        let read_models = &fixture.read_models;
        async move {
            read_models
                .call(move |store| store.scope_numbers(tenant.as_ref()))
                .await
                .expect("the scope's numbers")
        }
    };
    let metrics = fixture
        .read_models
        .call(|store| store.metrics())
        .await
        .expect("metrics");
    let everyone = numbers(None).await;
    assert_eq!(everyone.oldest_unknown, metrics.oldest_unknown);
    assert_eq!(
        everyone.duplicates_detected,
        metrics.counter(Counter::DuplicatesDetected)
    );
    let acme = numbers(Some("acme")).await;
    assert_eq!(
        acme.oldest_unknown.map(|oldest| oldest.operation_id),
        Some(fixture.id("unknown"))
    );
    assert_eq!(acme.duplicates_detected, 2);
    let globex = numbers(Some("globex")).await;
    assert_eq!(
        globex.oldest_unknown, None,
        "acme's unknown is not globex's"
    );
    assert_eq!(globex.duplicates_detected, 0, "nor are its duplicates");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_are_listed_by_state_tenant_and_age_oldest_first_in_pages() {
    let fixture = Fixture::build().await;
    let list = |filter: OperationFilter, limit: usize| {
        fixture.read_models.call(move |store| {
            let mut all = Vec::new();
            let mut after = None;
            loop {
                let page = store.list_operations(&filter, limit, after.as_ref())?;
                assert!(page.operations.len() <= limit);
                all.extend(page.operations.into_iter().map(|row| row.operation_id));
                match page.next {
                    Some(next) => after = Some(next),
                    None => return Ok(all),
                }
            }
        })
    };
    let everything = list(OperationFilter::default(), 1000).await.expect("list");
    let mut by_creation: Vec<&IntentRecorded> = fixture.ops.values().collect();
    by_creation.sort_by_key(|intent| (intent.at, intent.operation_id));
    let expected: Vec<OperationId> = by_creation
        .iter()
        .map(|intent| intent.operation_id)
        .collect();
    assert_eq!(everything, expected);
    assert_eq!(
        list(OperationFilter::default(), 4).await.expect("paged"),
        expected,
        "pages of four add up to the whole list"
    );

    let pending = list(
        OperationFilter {
            state: Some("pending".into()),
            ..OperationFilter::default()
        },
        2,
    )
    .await
    .expect("pending");
    let names: Vec<&str> = pending.iter().map(|id| name_of(&fixture, *id)).collect();
    assert_eq!(names, vec!["dup_a", "dup_b", "dup_c", "dup_d", "globex"]);

    let globex = list(
        OperationFilter {
            tenant: Some(TenantId::new("globex").expect("valid")),
            ..OperationFilter::default()
        },
        10,
    )
    .await
    .expect("by tenant");
    assert_eq!(globex, vec![fixture.id("globex")]);

    let older = list(
        OperationFilter {
            state: Some("pending".into()),
            older_than: Some(fixture.ops["dup_c"].at),
            ..OperationFilter::default()
        },
        10,
    )
    .await
    .expect("older");
    assert_eq!(older, vec![fixture.id("dup_a"), fixture.id("dup_b")]);

    let refused = list(
        OperationFilter {
            state: Some("done".into()),
            ..OperationFilter::default()
        },
        10,
    )
    .await;
    assert!(
        matches!(&refused, Err(ReadModelError::InvalidQuery { reason }) if reason.contains("needs_review")),
        "{refused:?}"
    );
}

// ----- lag -------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_the_head_minus_the_checkpoint() {
    let dir = TempDir::new().expect("temp dir");
    let harness = Harness::new(MemoryStore::new());
    let read_models = ReadModels::open(dir.path().join("read.db"))
        .await
        .expect("open");
    let empty = read_models.lag(harness.store()).await.expect("lag");
    assert_eq!(
        (empty.head, empty.checkpoint, empty.positions),
        (None, None, 0)
    );

    for n in 0..10 {
        harness.play_nth(n).await;
    }
    let log = whole_log(harness.store()).await;
    let head = log.last().expect("events").position;
    let nothing_applied = read_models.lag(harness.store()).await.expect("lag");
    assert_eq!(nothing_applied.positions, head.value());

    read_models
        .apply_batch(log[..17].to_vec())
        .await
        .expect("a batch");
    let partly = read_models.lag(harness.store()).await.expect("lag");
    assert_eq!(partly.head, Some(head));
    assert_eq!(partly.checkpoint, Some(log[16].position));
    assert_eq!(partly.positions, head.value() - log[16].position.value());

    let running = Running::start(ReadModelRunner::new(), harness.store(), &read_models);
    caught_up(harness.store(), &read_models).await;
    harness.play_nth(10).await;
    caught_up(harness.store(), &read_models).await;
    let report = running.stop().await;
    let caught = read_models.lag(harness.store()).await.expect("lag");
    assert_eq!(caught.positions, 0);
    assert_eq!(report.checkpoint, caught.head);
    assert_eq!(
        report.checkpoint.map(GlobalPosition::value),
        Some(whole_log(harness.store()).await.len() as u64),
        "memory-store positions count events"
    );
}

// ----- files the store must not touch ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_from_a_newer_opledger_or_another_program_is_refused_and_left_untouched() {
    let dir = TempDir::new().expect("temp dir");
    let newer = dir.path().join("newer.db");
    let foreign = dir.path().join("foreign.db");
    let (newer_bytes, foreign_bytes) = {
        let (newer, foreign) = (newer.clone(), foreign.clone());
        tokio::task::spawn_blocking(move || {
            drop(ReadModelStore::open(&newer).expect("create"));
            let connection = Connection::open(&newer).expect("open");
            connection
                .pragma_update(None, "user_version", 99)
                .expect("pretend a newer schema");
            drop(connection);
            let connection = Connection::open(&foreign).expect("open");
            connection
                .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
                .expect("another program's table");
            drop(connection);
            (
                std::fs::read(&newer).expect("read"),
                std::fs::read(&foreign).expect("read"),
            )
        })
        .await
        .expect("the blocking thread")
    };

    let error = ReadModels::open(&newer).await.expect_err("refused");
    assert!(
        matches!(
            error,
            ReadModelError::IncompatibleSchema {
                found: 99,
                supported: SCHEMA_VERSION,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("schema version 99"), "{error}");
    let error = ReadModels::open(&foreign).await.expect_err("refused");
    assert!(
        matches!(error, ReadModelError::ForeignDatabase { .. }),
        "{error}"
    );
    assert_eq!(std::fs::read(&newer).expect("read"), newer_bytes);
    assert_eq!(std::fs::read(&foreign).expect("read"), foreign_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_file_gains_its_gauges_on_opening_when_alone_and_reports_the_same_metrics() {
    let fixture = Fixture::build().await;
    let metrics = || async {
        fixture
            .read_models
            .call(|store| store.metrics())
            .await
            .expect("metrics")
    };
    let before = metrics().await;
    assert!(
        before.shared_external_ids > 0,
        "the fixture shares an object"
    );
    let path = fixture.read_models.path().to_path_buf();
    let dir = path.parent().expect("a directory").to_path_buf();
    // What a version 1 file looks like: no gauges, no work queue, version 1.
    let (rebuilt, old) = rebuilt_and_a_copy(&fixture, &dir, "version-1.db").await;
    let states = folded_states(fixture.harness.store()).await;
    let connection = Connection::open(&old).expect("open");
    store_states_as_json(&connection, &states);
    connection
        .execute_batch("DROP TABLE gauges; DROP TABLE work_queue; PRAGMA user_version = 1;")
        .expect("back to version 1");
    drop(connection);
    let version_of = |path: &Path| -> i64 {
        Connection::open(path)
            .expect("open")
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("version")
    };

    // An older opledger with the file open (its shared lock) would not see an upgrade.
    let older_process = std::fs::File::create(lock_path(&old)).expect("lock file");
    rustix::fs::flock(&older_process, rustix::fs::FlockOperation::LockShared).expect("locked");
    let refused = ReadModels::open(&old).await.expect_err("not while shared");
    assert!(
        matches!(refused, ReadModelError::UpgradeBlocked { found: 1, .. }),
        "{refused}"
    );
    assert_eq!(version_of(&old), 1, "left as it was");
    drop(older_process);

    let migrated = ReadModels::open(&old)
        .await
        .expect("a version 1 file opens");
    assert_eq!(
        migrated
            .call(|store| store.metrics())
            .await
            .expect("metrics"),
        before
    );
    drop(migrated);
    assert_eq!(version_of(&old), SCHEMA_VERSION);
    assert_same_tables(
        &dump_of(rebuilt).await,
        &dump_of(old).await,
        "migrated vs rebuilt",
    );
}

/// Every operation's state, folded from the log as the read models fold it, by id.
async fn folded_states<S: EventStore>(store: &S) -> BTreeMap<String, OperationState> {
    let mut events: BTreeMap<OperationId, Vec<OperationEvent>> = BTreeMap::new();
    for recorded in whole_log(store).await {
        if let Some(operation_id) = recorded.stream.operation_id() {
            let event = codec::decode(&recorded).expect("an event of the log decodes");
            events.entry(operation_id).or_default().push(event);
        }
    }
    events
        .into_iter()
        .map(|(operation_id, events)| (operation_id.to_string(), fold(&events)))
        .collect()
}

/// The id index's tables.
const ID_TABLES: [&str; 3] = ["attempts", "sources", "external_ids"];

/// How SQLite stores `table`: its `CREATE TABLE` statement.
fn create_statement(connection: &Connection, table: &str) -> String {
    connection
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1",
            [table],
            |row| row.get(0),
        )
        .expect("the table exists")
}

/// Puts the operations table back as version 4 had it: no request hash, and the request index
/// on the request's five columns.
fn back_to_version_4(connection: &Connection) {
    back_to_version_5(connection);
    connection
        .execute_batch(
            "DROP INDEX operations_by_request;
             ALTER TABLE operations DROP COLUMN request_hash;
             CREATE INDEX operations_by_request ON operations
                 (tenant, provider, account, action, args_hash, created_at, operation_id);",
        )
        .expect("the version 4 operations table");
}

/// Takes away what version 6 added: the search terms and their index.
fn back_to_version_5(connection: &Connection) {
    connection
        .execute_batch("DROP TABLE operation_terms;")
        .expect("the version 5 tables");
}

/// Puts the tables back as versions 1 to 3 had them: the operations table with
/// `folded_state TEXT`, the state's JSON (versions 1-3 wrote exactly
/// `serde_json::to_string(&state)` there), and the id index's tables with rowids.
fn store_states_as_json(connection: &Connection, states: &BTreeMap<String, OperationState>) {
    back_to_version_4(connection);
    for table in ID_TABLES {
        let create = create_statement(connection, table);
        assert!(create.contains("WITHOUT ROWID"), "{create}");
        let old = create
            .replacen(
                &format!("CREATE TABLE {table} "),
                &format!("CREATE TABLE {table}_v3 "),
                1,
            )
            .replacen(", WITHOUT ROWID", "", 1);
        connection
            .execute_batch(&format!(
                "{old};
                 INSERT INTO {table}_v3 SELECT * FROM {table};
                 DROP TABLE {table};
                 ALTER TABLE {table}_v3 RENAME TO {table};"
            ))
            .expect("a version 3 id table");
    }
    connection
        .execute_batch(
            "CREATE INDEX sources_by_id ON sources (source_id, position);
             CREATE INDEX external_ids_by_id ON external_ids (external_id, position);",
        )
        .expect("the version 3 id indexes");
    let create: String = connection
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'operations'",
            [],
            |row| row.get(0),
        )
        .expect("the operations table");
    assert!(create.contains("folded_state        BLOB"), "{create}");
    let old = create
        .replacen("CREATE TABLE operations", "CREATE TABLE operations_v3", 1)
        .replacen("folded_state        BLOB", "folded_state        TEXT", 1);
    connection.execute_batch(&old).expect("the version 3 table");
    let mut insert = connection
        .prepare(
            "INSERT INTO operations_v3 SELECT operation_id, tenant, provider, account, action,
                 args_hash, source_id, state, attempts, external_id, last_error, created_at,
                 updated_at, stream_version, last_position, lease_deadline, unknown_since,
                 needs_review_reason, ?2 FROM operations WHERE operation_id = ?1",
        )
        .expect("prepare");
    for (operation_id, state) in states {
        let json = serde_json::to_string(state).expect("a state serializes");
        assert_eq!(
            insert.execute([operation_id, &json]).expect("insert"),
            1,
            "{operation_id} has a row"
        );
    }
    drop(insert);
    connection
        .execute_batch(
            "DROP TABLE operations;
             ALTER TABLE operations_v3 RENAME TO operations;
             CREATE INDEX operations_by_created ON operations (created_at, operation_id);
             CREATE INDEX operations_by_state ON operations (state, created_at, operation_id);
             CREATE INDEX operations_by_tenant ON operations (tenant, created_at, operation_id);
             CREATE INDEX operations_by_request ON operations
                 (tenant, provider, account, action, args_hash, created_at, operation_id);",
        )
        .expect("the version 3 operations table in place");
}

/// A rebuild of the fixture's log into `dir`, and a copy of it named `name` for a test to turn
/// into an older version's file.
async fn rebuilt_and_a_copy(
    fixture: &Fixture,
    dir: &std::path::Path,
    name: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let rebuilt = dir.join("rebuilt.db");
    drop(
        rebuild(fixture.harness.store(), &rebuilt)
            .await
            .expect("rebuild"),
    );
    let copy = dir.join(name);
    std::fs::copy(&rebuilt, &copy).expect("copy");
    (rebuilt, copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_file_with_json_states_opens_with_compact_states_equal_to_a_rebuild() {
    let fixture = Fixture::build().await;
    let path = fixture.read_models.path().to_path_buf();
    let dir = path.parent().expect("a directory").to_path_buf();
    let (rebuilt, old) = rebuilt_and_a_copy(&fixture, &dir, "version-3.db").await;
    let states = folded_states(fixture.harness.store()).await;
    assert!(states.len() > 1, "the fixture has operations");
    let connection = Connection::open(&old).expect("open");
    store_states_as_json(&connection, &states);
    connection
        .execute_batch("PRAGMA user_version = 3;")
        .expect("back to version 3");
    drop(connection);
    assert_ne!(
        dump_of(rebuilt.clone()).await,
        dump_of(old.clone()).await,
        "the states differ in form before the upgrade"
    );

    let migrated = ReadModels::open(&old)
        .await
        .expect("a version 3 file opens");
    drop(migrated);
    let connection = Connection::open(&old).expect("open");
    let version: i64 = connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    for table in ID_TABLES {
        let create = create_statement(&connection, table);
        assert!(create.contains("WITHOUT ROWID"), "{table}: {create}");
    }
    drop(connection);
    assert_same_tables(
        &dump_of(rebuilt).await,
        &dump_of(old).await,
        "migrated vs rebuilt",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_file_opens_with_its_requests_hashed_and_indexed_by_hash_equal_to_a_rebuild() {
    let fixture = Fixture::build().await;
    let path = fixture.read_models.path().to_path_buf();
    let dir = path.parent().expect("a directory").to_path_buf();
    let (rebuilt, old) = rebuilt_and_a_copy(&fixture, &dir, "version-4.db").await;
    let connection = Connection::open(&old).expect("open");
    back_to_version_4(&connection);
    connection
        .execute_batch("PRAGMA user_version = 4;")
        .expect("back to version 4");
    drop(connection);
    assert_ne!(
        dump_of(rebuilt.clone()).await,
        dump_of(old.clone()).await,
        "no request hashes before the upgrade"
    );

    drop(
        ReadModels::open(&old)
            .await
            .expect("a version 4 file opens"),
    );
    let schema_of = |path: &Path, kind: &str, name: &str| -> String {
        Connection::open(path)
            .expect("open")
            .query_row(
                "SELECT sql FROM sqlite_schema WHERE type = ?1 AND name = ?2",
                [kind, name],
                |row| row.get(0),
            )
            .expect("in the schema")
    };
    let version: i64 = Connection::open(&old)
        .expect("open")
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    for (kind, name) in [("table", "operations"), ("index", "operations_by_request")] {
        assert_eq!(
            schema_of(&old, kind, name),
            schema_of(&rebuilt, kind, name),
            "a converted file's {name} is a new file's"
        );
    }
    assert_same_tables(
        &dump_of(rebuilt).await,
        &dump_of(old).await,
        "converted vs rebuilt",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_never_writes_over_an_existing_file() {
    let dir = TempDir::new().expect("temp dir");
    let harness = Harness::new(MemoryStore::new());
    harness.play_nth(0).await;
    let path = dir.path().join("read.db");
    let existing = rebuild(harness.store(), &path)
        .await
        .expect("a fresh rebuild");
    drop(existing);
    let error = rebuild(harness.store(), &path)
        .await
        .expect_err("the file exists");
    assert!(
        matches!(error, ReadModelError::AlreadyExists { .. }),
        "{error}"
    );
}

// ----- listings as of a moment -------------------------------------------------------------------

/// A small seeded generator, so the moments picked are the same on every run.
struct Moments(u64);

impl Moments {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound.max(1)
    }

    /// `count` distinct positions of a log of `head` events, in order, the head among them.
    fn positions(&mut self, head: u64, count: usize) -> Vec<u64> {
        let mut picked: std::collections::BTreeSet<u64> =
            (0..count).map(|_| 1 + self.below(head)).collect();
        picked.insert(head);
        picked.into_iter().collect()
    }
}

/// What the read models list at their checkpoint: every operation, one state's, a first page of
/// five and the review queue.
async fn listings_now(
    read_models: &ReadModels,
) -> (
    Vec<opledger_readmodel::OperationPage>,
    Vec<opledger_readmodel::ReviewItem>,
) {
    read_models
        .call(|store| {
            let mut pages = Vec::new();
            for (filter, limit) in listing_filters() {
                pages.push(store.list_operations(&filter, limit, None)?);
            }
            Ok((pages, store.review_queue(MAX_QUERY_ROWS)?))
        })
        .await
        .expect("listed")
}

/// The same listings from the log folded up to `moment`.
fn listings_then(
    past: &opledger_readmodel::PastReadModels,
) -> (
    Vec<opledger_readmodel::OperationPage>,
    Vec<opledger_readmodel::ReviewItem>,
) {
    let pages = listing_filters()
        .into_iter()
        .map(|(filter, limit)| past.list_operations(&filter, limit, None).expect("listed"))
        .collect();
    (pages, past.review_queue(MAX_QUERY_ROWS))
}

fn listing_filters() -> Vec<(OperationFilter, usize)> {
    let state = |name: &str| OperationFilter {
        state: Some(name.to_owned()),
        ..OperationFilter::default()
    };
    vec![
        (OperationFilter::default(), MAX_QUERY_ROWS),
        (OperationFilter::default(), 5),
        (state("unknown"), MAX_QUERY_ROWS),
        (state("succeeded"), MAX_QUERY_ROWS),
        (
            OperationFilter {
                tenant: Some(TenantId::new("acme").expect("valid")),
                state: Some("needs_review".into()),
                ..OperationFilter::default()
            },
            MAX_QUERY_ROWS,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_as_of_any_position_is_what_the_read_models_listed_there() {
    let LiveOnSqlite {
        dir: _dir,
        store,
        harness,
        read_models,
        ..
    } = LiveOnSqlite::open().await;
    // Four writers at once, so streams interleave in the log as they do under load.
    harness.play_concurrently(0..44, 4).await;
    let head = store.head_position().await.expect("head").expect("events");
    let mut moments = Moments(29);
    let picked = moments.positions(head.value(), 40);
    let mut queue_lengths = std::collections::BTreeSet::new();
    for position in picked {
        let position = GlobalPosition::new(position);
        catch_up(&store, &read_models, Some(position), |_| {})
            .await
            .expect("caught up");
        let live = listings_now(&read_models).await;
        queue_lengths.insert(live.1.len());
        let past = opledger_readmodel::PastReadModels::fold(
            &store,
            opledger_readmodel::Moment::Position(position),
            &opledger_readmodel::PastScope::default(),
        )
        .await
        .expect("folded");
        assert_eq!(listings_then(&past), live, "as of position {position}");
    }
    assert!(
        queue_lengths.len() >= 3,
        "the review queue changed over the moments: {queue_lengths:?}"
    );
}

#[tokio::test]
async fn a_listing_as_of_a_time_is_what_the_read_models_listed_after_its_last_event() {
    let LiveOnSqlite {
        dir: _dir,
        store,
        harness,
        read_models,
        ..
    } = LiveOnSqlite::open().await;
    // One writer, so the log is in time order: a time names the last event at or before it
    // (the events one append writes share their time).
    for n in 0..22 {
        harness.play_nth(n).await;
    }
    let log = whole_log(&store).await;
    let times: Vec<DateTime<Utc>> = log
        .iter()
        .map(|recorded| codec::decode(recorded).expect("decodes").at())
        .collect();
    assert!(times.is_sorted(), "one writer writes in time order");
    let mut moments = Moments(31);
    for position in moments.positions(log.len() as u64, 20) {
        let time = times[usize::try_from(position - 1).expect("small")];
        let last = times.partition_point(|at| *at <= time);
        catch_up(&store, &read_models, Some(log[last - 1].position), |_| {})
            .await
            .expect("caught up");
        let live = listings_now(&read_models).await;
        let past = opledger_readmodel::PastReadModels::fold(
            &store,
            opledger_readmodel::Moment::Time(time),
            &opledger_readmodel::PastScope::default(),
        )
        .await
        .expect("folded");
        assert_eq!(past.time(), Some(time));
        assert_eq!(
            listings_then(&past),
            live,
            "as of {time} (position {position})"
        );
    }
}

#[tokio::test]
async fn a_past_listing_beyond_its_limits_is_refused_with_what_to_ask_instead() {
    let LiveOnSqlite {
        dir: _dir,
        store,
        harness,
        ..
    } = LiveOnSqlite::open().await;
    for n in 0..6 {
        harness.play_nth(n).await;
    }
    let head = store.head_position().await.expect("head").expect("events");
    let at_head = opledger_readmodel::Moment::Position(head);
    let everyone = opledger_readmodel::PastScope::default();
    let limits = |fold_events, operations| opledger_readmodel::PastLimits {
        fold_events,
        operations,
    };
    let refused = opledger_readmodel::PastReadModels::fold_within(
        &store,
        at_head,
        &everyone,
        limits(10, 100),
    )
    .await
    .err()
    .expect("more than 10 events to fold");
    assert!(
        matches!(&refused, ReadModelError::AsOfBeyondLimit { reason }
            if reason.contains("at most 10 events") && reason.contains("export")),
        "{refused}"
    );
    let refused = opledger_readmodel::PastReadModels::fold_within(
        &store,
        at_head,
        &everyone,
        limits(1_000, 2),
    )
    .await
    .err()
    .expect("more than 2 operations to hold");
    assert!(
        matches!(&refused, ReadModelError::AsOfBeyondLimit { reason }
            if reason.contains("at most 2 operations") && reason.contains("name a tenant")),
        "{refused}"
    );
    // Another tenant's operations are passed over, not held: a scope with none of them fits.
    let nobody = opledger_readmodel::PastScope {
        tenants: Some([TenantId::new("nobody").expect("valid")].into()),
        ..opledger_readmodel::PastScope::default()
    };
    let past =
        opledger_readmodel::PastReadModels::fold_within(&store, at_head, &nobody, limits(1_000, 2))
            .await
            .expect("nothing of theirs to hold");
    let page = past
        .list_operations(&OperationFilter::default(), MAX_QUERY_ROWS, None)
        .expect("listed");
    assert!(page.operations.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_by_title_or_owner_answers_the_same_from_the_live_runner_a_rebuild_and_a_past_moment(
) {
    let fixture = Fixture::build().await;
    let path = fixture.read_models.path().to_path_buf();
    let dir = path.parent().expect("a directory").to_path_buf();
    let search = |read_models: &ReadModels, filter: OperationFilter| {
        let read_models = read_models.clone();
        async move {
            read_models
                .call(move |store| {
                    let page = store.list_operations(&filter, MAX_QUERY_ROWS, None)?;
                    Ok(page
                        .operations
                        .into_iter()
                        .map(|row| row.operation_id)
                        .collect::<Vec<_>>())
                })
                .await
                .expect("the search answers")
        }
    };
    let by_title = OperationFilter {
        // Another case and spacing than recorded ("Call review").
        argument: Some(("title".into(), "  call   REVIEW ".into())),
        ..OperationFilter::default()
    };
    let by_owner = OperationFilter {
        owner: Some("Anna".into()),
        newest_first: true,
        ..OperationFilter::default()
    };
    let both = OperationFilter {
        owner: Some("anna".into()),
        argument: Some(("title".into(), "Call plain".into())),
        ..OperationFilter::default()
    };
    let nobody = OperationFilter {
        owner: Some("boris".into()),
        ..OperationFilter::default()
    };
    let live = (
        search(&fixture.read_models, by_title.clone()).await,
        search(&fixture.read_models, by_owner.clone()).await,
        search(&fixture.read_models, both.clone()).await,
        search(&fixture.read_models, nobody.clone()).await,
    );
    assert_eq!(live.0, vec![fixture.ops["review"].operation_id]);
    assert_eq!(live.1.len(), fixture.ops.len(), "anna owns every operation");
    assert_eq!(live.2, vec![fixture.ops["plain"].operation_id]);
    assert!(live.3.is_empty());

    let rebuilt = assert_equals_a_rebuild(
        fixture.harness.store(),
        &dir,
        &path,
        "the terms of the live runner and of a rebuild",
    )
    .await;
    let from_rebuild = (
        search(&rebuilt, by_title.clone()).await,
        search(&rebuilt, by_owner.clone()).await,
        search(&rebuilt, both.clone()).await,
        search(&rebuilt, nobody.clone()).await,
    );
    assert_eq!(
        live, from_rebuild,
        "a rebuild answers as the live projection"
    );

    // As of the log's head, a search folds the log and matches the same terms.
    let head = fixture
        .harness
        .store()
        .head_position()
        .await
        .expect("the head")
        .expect("events");
    let past = opledger_readmodel::PastReadModels::fold(
        fixture.harness.store(),
        opledger_readmodel::Moment::Position(head),
        &opledger_readmodel::PastScope::default(),
    )
    .await
    .expect("the past");
    let past_search = |filter: &OperationFilter| -> Vec<OperationId> {
        past.list_operations(filter, MAX_QUERY_ROWS, None)
            .expect("the past search")
            .operations
            .into_iter()
            .map(|row| row.operation_id)
            .collect()
    };
    assert_eq!(
        (
            past_search(&by_title),
            past_search(&by_owner),
            past_search(&both),
            past_search(&nobody)
        ),
        live,
        "as of the head, the same answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_5_file_opens_with_every_operations_search_terms_equal_to_a_rebuild() {
    let fixture = Fixture::build().await;
    let path = fixture.read_models.path().to_path_buf();
    let dir = path.parent().expect("a directory").to_path_buf();
    let (rebuilt, old) = rebuilt_and_a_copy(&fixture, &dir, "version-5.db").await;
    let connection = Connection::open(&old).expect("open");
    back_to_version_5(&connection);
    connection
        .execute_batch("PRAGMA user_version = 5;")
        .expect("back to version 5");
    drop(connection);
    drop(
        ReadModels::open(&old)
            .await
            .expect("a version 5 file opens"),
    );
    assert_eq!(
        schema_entries(&old),
        schema_entries(&rebuilt),
        "a converted file's tables and indexes are a new file's"
    );
    assert_same_tables(
        &dump_of(rebuilt).await,
        &dump_of(old).await,
        "converted vs rebuilt",
    );
}

/// Operations in the search test: enough that a scan of them would be felt, as an operator's
/// ledger after a busy month is.
const SEARCHED_OPERATIONS: usize = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_by_title_among_a_hundred_thousand_operations_reads_through_the_terms_index() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("views.db");
    seed_searchable(&path, SEARCHED_OPERATIONS).await;
    let read_models = ReadModels::open(&path).await.expect("opens");
    let wanted = uuid::Uuid::from_u128(77_778).to_string();
    let (found, title_plan, owner_plan, owner_page) = read_models
        .call(|store| {
            let by_title = OperationFilter {
                argument: Some(("title".into(), "incident task 77777".into())),
                ..OperationFilter::default()
            };
            let by_owner = OperationFilter {
                owner: Some("owner-7".into()),
                state: Some("succeeded".into()),
                newest_first: true,
                ..OperationFilter::default()
            };
            Ok((
                store.list_operations(&by_title, 50, None)?,
                store.listing_plan(&by_title, 50)?,
                store.listing_plan(&by_owner, 50)?,
                store.list_operations(&by_owner, 50, None)?,
            ))
        })
        .await
        .expect("the searches answer");
    assert_eq!(
        found
            .operations
            .iter()
            .map(|row| row.operation_id.to_string())
            .collect::<Vec<_>>(),
        vec![wanted]
    );
    assert_eq!(
        owner_page.operations.len(),
        50,
        "a full page of one owner's"
    );
    assert!(owner_page.next.is_some());
    for plan in [&title_plan, &owner_plan] {
        // The terms index gives the rows in the page's order (no sort of the matches), and each
        // operation is found by its key: no step scans a table.
        assert!(
            plan.iter().any(|line| line
                .contains("operation_terms USING COVERING INDEX operation_terms_by_term (term=?")),
            "{plan:#?}"
        );
        assert!(
            plan.iter()
                .any(|line| line.contains("SEARCH operations USING INDEX")),
            "{plan:#?}"
        );
        assert!(
            !plan
                .iter()
                .any(|line| line.starts_with("SCAN") || line.contains("TEMP B-TREE")),
            "{plan:#?}"
        );
    }
}

/// Writes `count` operations straight into a new read-model file at `path` (the shape the runner
/// writes, folded states left empty: a listing never reads them), so a search test or benchmark
/// spends its time on the search, not on folding histories: titled `Incident task N`, owned by
/// `owner-{N % 50}`, one a second from 2026-11-01.
async fn seed_searchable(path: &Path, count: usize) {
    drop(ReadModels::open(path).await.expect("a new file"));
    let mut connection = Connection::open(path).expect("open");
    let transaction = connection.transaction().expect("a transaction");
    {
        let mut operation = transaction
            .prepare(
                "INSERT INTO operations (operation_id, tenant, provider, account, action,
                     args_hash, state, attempts, created_at, updated_at, stream_version,
                     last_position, folded_state, request_hash)
                 VALUES (?1, 'acme', 'crm', 'acct-1', 'create_task', ?4, 'succeeded', 1, ?2, ?2,
                     3, ?3, x'', 0)",
            )
            .expect("prepare");
        let mut term = transaction
            .prepare("INSERT INTO operation_terms (term, at, operation) VALUES (?1, ?2, ?3)")
            .expect("prepare");
        let start = Utc
            .with_ymd_and_hms(2026, 11, 1, 0, 0, 0)
            .single()
            .expect("a time");
        for n in 0..count {
            let id = uuid::Uuid::from_u128(n as u128 + 1).to_string();
            let at = (start + chrono::Duration::seconds(n as i64))
                .format("%Y-%m-%dT%H:%M:%S%.9fZ")
                .to_string();
            operation
                .execute(rusqlite::params![
                    id,
                    at,
                    n as i64 * 3,
                    format!("sha256:{}", "0".repeat(64))
                ])
                .expect("an operation");
            for text in [
                opledger_readmodel::terms::argument_term("title", &format!("Incident task {n}")),
                opledger_readmodel::terms::owner_term(&format!("owner-{}", n % 50)),
            ] {
                term.execute(rusqlite::params![text, at, id])
                    .expect("a term");
            }
        }
    }
    transaction.commit().expect("commit");
    connection.execute_batch("ANALYZE;").expect("statistics");
    drop(connection);
}

/// The search benchmark (`bench/operations_search.sh`): seeds `OPLEDGER_SEARCH_OPERATIONS`
/// operations (default 1,000,000) and prints the latency of a search by title and of a page of
/// one owner's, p50 and p99 over 200 searches each, and the plans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run by bench/operations_search.sh"]
async fn search_latency_at_scale() {
    let count = std::env::var("OPLEDGER_SEARCH_OPERATIONS")
        .ok()
        .and_then(|text| text.parse::<usize>().ok())
        .unwrap_or(1_000_000);
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("views.db");
    let seeded = Instant::now();
    seed_searchable(&path, count).await;
    println!(
        "seeded {count} operations in {} ms",
        seeded.elapsed().as_millis()
    );
    let read_models = ReadModels::open(&path).await.expect("opens");
    let report = read_models
        .call(move |store| {
            let mut lines = Vec::new();
            for (what, make) in [
                ("title", (|n: usize| OperationFilter {
                    argument: Some(("title".into(), format!("Incident task {n}"))),
                    ..OperationFilter::default()
                }) as fn(usize) -> OperationFilter),
                ("owner page", |n: usize| OperationFilter {
                    owner: Some(format!("owner-{}", n % 50)),
                    newest_first: true,
                    ..OperationFilter::default()
                }),
            ] {
                let mut took = Vec::with_capacity(200);
                for i in 0..200 {
                    let filter = make((i * 7_919) % count);
                    let started = Instant::now();
                    let page = store.list_operations(&filter, 50, None)?;
                    took.push(started.elapsed());
                    assert!(!page.operations.is_empty(), "{what} finds something");
                }
                took.sort();
                lines.push(format!(
                    "bench=operations-search what={what} operations={count} p50_us={} p99_us={} plan={:?}",
                    took[took.len() / 2].as_micros(),
                    took[took.len() * 99 / 100].as_micros(),
                    store.listing_plan(&make(1), 50)?
                ));
            }
            Ok(lines)
        })
        .await
        .expect("the searches answer");
    for line in report {
        println!("{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_review_queue_is_searched_by_title_owner_and_time_with_its_count_and_pages() {
    let fixture = Fixture::build().await;
    let review = |filter: opledger_readmodel::ReviewFilter, limit: usize| {
        let read_models = fixture.read_models.clone();
        async move {
            read_models
                .call(move |store| {
                    let mut found = Vec::new();
                    let mut after = None;
                    loop {
                        let page = store.review_page(
                            &filter,
                            opledger_readmodel::ReviewOrder::OldestFirst,
                            limit,
                            after.as_ref(),
                        )?;
                        found.extend(page.items.iter().map(|item| item.operation_id));
                        match page.next {
                            Some(next) => after = Some(next),
                            None => break,
                        }
                    }
                    Ok((found, store.review_count(&filter)?))
                })
                .await
                .expect("the review search answers")
        }
    };
    let queue = fixture
        .read_models
        .call(|store| store.review_queue(100))
        .await
        .expect("the queue");
    // Another case and spacing than recorded ("Call unknown").
    let by_title = opledger_readmodel::ReviewFilter {
        argument: Some(("title".into(), " call  UNKNOWN".into())),
        ..Default::default()
    };
    assert_eq!(review(by_title, 50).await, (vec![fixture.id("unknown")], 1));
    let by_owner = opledger_readmodel::ReviewFilter {
        owner: Some("ANNA".into()),
        ..Default::default()
    };
    let every: Vec<OperationId> = queue.iter().map(|item| item.operation_id).collect();
    assert_eq!(
        review(by_owner.clone(), 1).await,
        (every.clone(), 3),
        "one item a page reaches every item of the owner's"
    );
    // A term naming few operations (here, each) is read from its matches, each found in the
    // queue by key; a further term is tested item by item with one point lookup of the terms'
    // index (term, time, operation), never by walking the rows of a term many operations share.
    let two_terms = opledger_readmodel::ReviewFilter {
        argument: Some(("due".into(), "Tomorrow".into())),
        ..by_owner.clone()
    };
    assert_eq!(review(two_terms.clone(), 2).await, (every.clone(), 3));
    let plan = fixture
        .read_models
        .call(move |store| store.review_plan(&two_terms))
        .await
        .expect("a plan");
    assert!(
        plan.iter().any(|line| line.contains(
            "SEARCH found USING COVERING INDEX operation_terms_by_term (term=? AND at=? AND operation=?)"
        )),
        "{plan:#?}"
    );
    assert!(
        plan.iter().any(|line| line.contains(
            "SEARCH review_queue USING INDEX sqlite_autoindex_review_queue_1 (operation_id=?)"
        )),
        "{plan:#?}"
    );
    assert!(
        !plan.iter().any(|line| line.starts_with("SCAN review_queue")
            || line.starts_with("SCAN found")
            || line.starts_with("SCAN operations")),
        "{plan:#?}"
    );
    let nobody = opledger_readmodel::ReviewFilter {
        owner: Some("boris".into()),
        ..Default::default()
    };
    assert_eq!(review(nobody, 50).await, (Vec::new(), 0));
    // A time range on when each became unresolved: from the second item's time, before the
    // third's.
    let window = opledger_readmodel::ReviewFilter {
        since: Some(queue[1].since),
        until: Some(queue[2].since),
        ..by_owner
    };
    assert_eq!(review(window, 50).await, (vec![every[1]], 1));

    // As of the head, the past queue's items have the same terms.
    let head = fixture
        .harness
        .store()
        .head_position()
        .await
        .expect("the head")
        .expect("events");
    let past = opledger_readmodel::PastReadModels::fold(
        fixture.harness.store(),
        opledger_readmodel::Moment::Position(head),
        &opledger_readmodel::PastScope::default(),
    )
    .await
    .expect("the past");
    let title = [opledger_readmodel::terms::argument_term(
        "title",
        "call unknown",
    )];
    let matching: Vec<OperationId> = past
        .review_queue(100)
        .iter()
        .map(|item| item.operation_id)
        .filter(|id| past.has_terms(*id, &title))
        .collect();
    assert_eq!(matching, vec![fixture.id("unknown")]);
}
