//! SQLite specifics the conformance suite cannot see: connection settings, the schema version,
//! and how group commit shares one transaction between queued appends.

use std::future::Future;
use std::time::Duration;

use opledger_domain::ids::EventId;
use opledger_domain::store::LogStart;
use rusqlite::Connection;
use tempfile::TempDir;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::*;

/// Fails a test that waits for longer than any healthy run needs.
const TEST_TIMEOUT: Duration = Duration::from_secs(30);

fn event(id: u128) -> EventData {
    EventData {
        event_id: EventId::from_uuid(Uuid::from_u128(id)),
        event_type: "Tested".into(),
        data: format!("{{\"n\":{id}}}").into_bytes(),
        metadata: b"{}".to_vec(),
    }
}

fn stream(name: &str) -> StreamName {
    StreamName::new(name).expect("valid stream name")
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// How many appends wait in the writer's queue.
fn queued(store: &SqliteStore) -> usize {
    let appends = lock(&store.shared.appends);
    let sender = appends.as_ref().expect("store is open");
    sender.max_capacity() - sender.capacity()
}

/// Polls `condition` until it holds; the writer thread gives no other signal to wait on.
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    within(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
}

/// Holds SQLite's write lock from another connection, so the writer stalls in `BEGIN IMMEDIATE`
/// while the test lines appends up in its queue.
struct WriteLockHolder(Connection);

impl WriteLockHolder {
    fn take(path: &Path) -> Self {
        let connection = Connection::open(path).expect("open a second connection");
        connection
            .execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        Self(connection)
    }

    fn release(self) {
        self.0
            .execute_batch("COMMIT")
            .expect("release the write lock");
    }
}

/// Queues an append directly on the writer's queue and returns where its answer will arrive.
/// Appends queued this way reach the writer in the order they were queued.
async fn enqueue(
    store: &SqliteStore,
    name: &str,
    expected: ExpectedVersion,
    events: Vec<EventData>,
) -> oneshot::Receiver<Result<AppendOutcome, StoreError>> {
    let sender = lock(&store.shared.appends).clone().expect("store is open");
    let (reply, answer) = oneshot::channel();
    let request = AppendRequest {
        stream: stream(name),
        expected,
        events,
        reply,
    };
    sender
        .send(request)
        .await
        .unwrap_or_else(|_| panic!("the writer is running"));
    answer
}

async fn answer_of(
    answer: oneshot::Receiver<Result<AppendOutcome, StoreError>>,
) -> Result<AppendOutcome, StoreError> {
    within("the writer answers", answer)
        .await
        .expect("the writer answers every append")
}

/// Queues a first append and waits until the writer has taken it: the writer is then stuck in
/// `BEGIN IMMEDIATE` behind a [`WriteLockHolder`], with an empty queue.
async fn stall_writer(store: &SqliteStore) -> oneshot::Receiver<Result<AppendOutcome, StoreError>> {
    let pilot = enqueue(
        store,
        "pilot",
        ExpectedVersion::NoStream,
        vec![event(1_000)],
    )
    .await;
    wait_until("the writer took the pilot append", || queued(store) == 0).await;
    pilot
}

#[test]
fn the_writer_connection_runs_in_wal_mode_with_full_synchronous() {
    let dir = TempDir::new().expect("temp dir");
    let connection =
        schema::open_writer(&dir.path().join("events.db")).expect("open the writer connection");
    let mode: String = connection
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .expect("journal mode");
    let synchronous: i64 = connection
        .pragma_query_value(None, "synchronous", |row| row.get(0))
        .expect("synchronous");
    assert_eq!(mode, "wal");
    assert_eq!(synchronous, 2, "2 is FULL");
}

#[test]
fn reader_connections_see_wal_mode_and_cannot_write() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("events.db");
    let _writer = schema::open_writer(&path).expect("open the writer connection");
    let reader = schema::open_reader(&path).expect("open a reader connection");
    let mode: String = reader
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal");
    let written = reader.execute(
        "INSERT INTO streams (name, last_version) VALUES ('s', 0)",
        [],
    );
    assert!(written.is_err(), "a reader connection must be read-only");
}

#[tokio::test]
async fn a_fresh_file_gets_schema_version_one_and_positions_from_one() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("events.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let outcome = store
        .append(&stream("s"), ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("append");
    assert_eq!(outcome.position, GlobalPosition::new(1));
    store.close().await.expect("close");

    let connection = Connection::open(&path).expect("reopen with plain SQLite");
    let version: i64 = connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .expect("user_version");
    assert_eq!(version, SCHEMA_VERSION);
}

#[tokio::test]
async fn an_in_memory_database_is_refused_because_it_cannot_use_wal() {
    let refused = SqliteStore::open(":memory:")
        .await
        .expect_err("an in-memory database has no WAL");
    assert!(
        matches!(&refused, StoreError::Unavailable { reason } if reason.contains("WAL")),
        "unexpected error: {refused:?}"
    );
}

#[tokio::test]
async fn a_database_from_another_program_is_refused_and_left_untouched() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("other.db");
    Connection::open(&path)
        .expect("create")
        .execute_batch("CREATE TABLE notes (body TEXT);")
        .expect("create a table");
    let before = std::fs::read(&path).expect("read the file");

    let refused = SqliteStore::open(&path)
        .await
        .expect_err("another program's database");
    assert!(
        matches!(refused, StoreError::Unavailable { .. }),
        "unexpected error: {refused:?}"
    );
    assert_eq!(
        std::fs::read(&path).expect("read the file"),
        before,
        "the file must not change"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_queued_behind_a_busy_commit_share_one_transaction() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("events.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let write_lock = WriteLockHolder::take(&path);
    let pilot = stall_writer(&store).await;
    let mut queued_appends = Vec::new();
    for n in 0..31 {
        queued_appends.push(
            enqueue(
                &store,
                &format!("s-{n}"),
                ExpectedVersion::NoStream,
                vec![event(n)],
            )
            .await,
        );
    }
    write_lock.release();

    answer_of(pilot).await.expect("pilot append");
    for answer in queued_appends {
        answer_of(answer).await.expect("queued append");
    }
    assert_eq!(
        store.commit_stats(),
        CommitStats {
            commits: 2,
            appends: 32
        },
        "the pilot alone, then 31 together"
    );
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_append_rolls_back_only_itself_within_a_shared_commit() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("events.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let write_lock = WriteLockHolder::take(&path);
    let pilot = stall_writer(&store).await;
    let created = enqueue(
        &store,
        "a",
        ExpectedVersion::NoStream,
        vec![event(1), event(2)],
    )
    .await;
    let raced = enqueue(&store, "a", ExpectedVersion::NoStream, vec![event(3)]).await;
    let reused = enqueue(
        &store,
        "c",
        ExpectedVersion::NoStream,
        vec![event(4), event(2)],
    )
    .await;
    let retried = enqueue(
        &store,
        "a",
        ExpectedVersion::NoStream,
        vec![event(1), event(2)],
    )
    .await;
    let other = enqueue(&store, "d", ExpectedVersion::NoStream, vec![event(5)]).await;
    write_lock.release();

    answer_of(pilot).await.expect("pilot append");
    let created = answer_of(created).await.expect("the creating append");
    let raced = answer_of(raced).await;
    assert!(
        matches!(&raced, Err(StoreError::VersionConflict { actual: Some(version), .. }) if *version == StreamVersion::new(1)),
        "the second creation sees the first one, written earlier in the same transaction: {raced:?}"
    );
    let reused = answer_of(reused).await;
    assert!(
        matches!(reused, Err(StoreError::InvalidAppend { .. })),
        "{reused:?}"
    );
    let retried = answer_of(retried).await.expect("the retried append");
    assert_eq!(
        retried, created,
        "a retry in the same batch gets the first outcome"
    );
    answer_of(other)
        .await
        .expect("the append after the refusals");

    let log = store
        .read_all(LogStart::Beginning, 100)
        .await
        .expect("read the log");
    let streams: Vec<&str> = log.iter().map(|event| event.stream.as_str()).collect();
    assert_eq!(
        streams,
        ["pilot", "a", "a", "d"],
        "the refused appends left nothing behind"
    );
    assert_eq!(
        store.commit_stats(),
        CommitStats {
            commits: 2,
            appends: 3
        }
    );
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_answers_every_queued_append_and_refuses_later_calls() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("events.db");
    let store = SqliteStore::open(&path).await.expect("open");
    store
        .append(&stream("first"), ExpectedVersion::NoStream, vec![event(0)])
        .await
        .expect("append");
    let mut subscription = store
        .subscribe_all(LogStart::Beginning)
        .await
        .expect("subscribe");
    let write_lock = WriteLockHolder::take(&path);
    let pilot = stall_writer(&store).await;
    let mut queued_appends = Vec::new();
    for n in 1..=8 {
        queued_appends.push(
            enqueue(
                &store,
                &format!("s-{n}"),
                ExpectedVersion::NoStream,
                vec![event(n)],
            )
            .await,
        );
    }
    let handle = store.clone();
    let closing = tokio::spawn(store.close());
    // Closing waits for the writer, which waits for the lock: release it only now, so the
    // queued appends are still pending while the store closes.
    wait_until("the store refuses new appends", || {
        lock(&handle.shared.appends).is_none()
    })
    .await;
    write_lock.release();
    within("close", closing)
        .await
        .expect("task")
        .expect("close");

    answer_of(pilot)
        .await
        .expect("the pilot was queued before closing");
    for answer in queued_appends {
        answer_of(answer)
            .await
            .expect("queued before closing, so written");
    }
    let refused = handle
        .append(&stream("late"), ExpectedVersion::NoStream, vec![event(99)])
        .await;
    assert_eq!(refused, Err(StoreError::Closed));
    assert_eq!(
        handle.read_all(LogStart::Beginning, 10).await,
        Err(StoreError::Closed)
    );
    assert_eq!(handle.head_position().await, Err(StoreError::Closed));
    assert!(matches!(
        handle.subscribe_all(LogStart::Beginning).await,
        Err(StoreError::Closed)
    ));
    assert_eq!(
        within("next", subscription.next()).await,
        Err(StoreError::Closed)
    );
    assert!(
        !dir.path().join("events.db-wal").exists(),
        "closing checkpoints and removes the WAL"
    );

    let reopened = SqliteStore::open(&path).await.expect("reopen");
    let log = reopened
        .read_all(LogStart::Beginning, 100)
        .await
        .expect("read the log");
    assert_eq!(log.len(), 10, "first, the pilot and the 8 queued appends");
    reopened.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_gets_another_processs_events_in_order_between_its_own_stores_commits() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("events.db");
    let service = SqliteStore::open(&path).await.expect("open");
    // A second store on the same file stands for a CLI beside the service: its commits never
    // reach the service's writer, so they cannot be in the service's recent window.
    let cli = SqliteStore::open(&path).await.expect("open a second store");
    let mut subscription = service
        .subscribe_all(LogStart::Beginning)
        .await
        .expect("subscribe");
    let append = |store: &SqliteStore, name: &str, id: u128| {
        let store = store.clone();
        let name = stream(name);
        async move {
            store
                .append(&name, ExpectedVersion::NoStream, vec![event(id)])
                .await
                .expect("append")
        }
    };
    append(&service, "s-1", 1).await;
    let first = within("the service's own event", subscription.next())
        .await
        .expect("next");
    append(&cli, "c-2", 2).await;
    append(&cli, "c-3", 3).await;
    append(&service, "s-4", 4).await;
    let mut seen = vec![first];
    for _ in 0..3 {
        seen.push(
            within("the next event", subscription.next())
                .await
                .expect("next"),
        );
    }
    let ids: Vec<EventId> = seen.iter().map(|event| event.event_id).collect();
    let expected: Vec<EventId> = (1..=4)
        .map(|id| EventId::from_uuid(Uuid::from_u128(id)))
        .collect();
    assert_eq!(
        ids, expected,
        "no gap and no repeat at either store's commits"
    );
    let positions: Vec<u64> = seen.iter().map(|event| event.position.value()).collect();
    assert_eq!(positions, vec![1, 2, 3, 4]);
    cli.close().await.expect("close the second store");
    service.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_up_subscription_reads_the_writers_events_from_memory() {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("events.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let mut subscription = store
        .subscribe_all(LogStart::Beginning)
        .await
        .expect("subscribe");
    store
        .append(
            &stream("s"),
            ExpectedVersion::NoStream,
            vec![event(1), event(2)],
        )
        .await
        .expect("append");
    // With every reader taken, a read from the file would wait; memory answers at once.
    let permits = store
        .shared
        .readers
        .hold_every_connection()
        .await
        .expect("take every reader");
    let first = within("an event from memory", subscription.next())
        .await
        .expect("next");
    let second = within("an event from memory", subscription.next())
        .await
        .expect("next");
    assert_eq!(
        (first.position.value(), second.position.value()),
        (1, 2),
        "in position order"
    );
    assert_eq!(second.data, event(2).data, "the data as appended");
    drop(permits);
    store.close().await.expect("close");
}

#[tokio::test]
async fn reading_the_log_with_a_visitor_lends_exactly_the_events_read_all_returns() {
    let dir = TempDir::new().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("events.db"))
        .await
        .expect("open");
    store
        .append(
            &stream("a"),
            ExpectedVersion::NoStream,
            vec![event(1), event(2)],
        )
        .await
        .expect("append a");
    store
        .append(&stream("b"), ExpectedVersion::NoStream, vec![event(3)])
        .await
        .expect("append b");
    store
        .append(
            &stream("a"),
            ExpectedVersion::Exact(StreamVersion::new(1)),
            vec![event(4)],
        )
        .await
        .expect("append a again");
    let start = LogStart::After(GlobalPosition::new(1));
    let owned: Vec<RecordedEvent> = store.read_all(start, 2).await.expect("read_all");
    // A buffer with an event of an earlier batch in it: the visitor's batch replaces it.
    let stale = vec![store.read_all(LogStart::Beginning, 1).await.expect("one")[0].clone()];
    let lent = store
        .read_all_with(
            start,
            2,
            |view| RecordedEvent {
                stream: StreamName::new(view.stream).expect("a checked name"),
                version: view.version,
                position: view.position,
                event_id: view.event_id,
                event_type: view.event_type.to_owned(),
                data: view.data.to_vec(),
                metadata: view.metadata.to_vec(),
            },
            stale,
        )
        .await
        .expect("read_all_with");
    assert_eq!(owned.len(), 2, "the batch is bounded by max_count");
    assert_eq!(lent, owned);
    store.close().await.expect("close");
}
