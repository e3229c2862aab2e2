//! The KurrentDB store's fault behaviour, against the protocol stand on a loopback port: answers
//! lost after a commit, late answers, refusals before a write, and node restarts under a running
//! subscription and a running read-model projection.
//!
//! The conformance suite (`store_conformance`, module `kurrentdb`) covers the port's ordinary
//! promises; here every test makes the stand misbehave once and checks what the ledger ends with:
//! one copy of every event, the right outcome, and read models with no gap and no repeat.

use std::time::{Duration, Instant};

use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::ids::{EventId, StreamVersion};
use opledger_domain::store::{
    EventData, EventStore, ExpectedVersion, LogStart, RecordedEvent, StoreError, StreamName,
    Subscription, MAX_READ_BATCH,
};
use opledger_kurrentdb_stand::{AppendFault, KurrentDbStand};
use opledger_projections::metrics::Counter;
use opledger_readmodel::{ReadModelRunner, ReadModels, RunReport};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::kurrentdb::KurrentDbConfig;
use opledger_store::KurrentDbStore;
use serde_json::json;
use tempfile::TempDir;
use tokio::sync::oneshot;

/// Guards every wait against a hang; no test relies on it for ordering.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT_LIMIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT_LIMIT:?}: {what}"))
}

async fn stand() -> KurrentDbStand {
    KurrentDbStand::start()
        .await
        .expect("start the KurrentDB stand")
}

async fn connect(
    stand: &KurrentDbStand,
    adjust: impl FnOnce(&mut KurrentDbConfig),
) -> KurrentDbStore {
    let mut config = KurrentDbConfig::from_connection_string(&stand.connection_string())
        .expect("the stand's connection string");
    adjust(&mut config);
    KurrentDbStore::connect_with(config)
        .await
        .expect("connect to the stand")
}

fn stream(name: &str) -> StreamName {
    StreamName::for_operation(opledger_domain::ids::OperationId::from_uuid(
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()),
    ))
}

fn event(n: u128) -> EventData {
    EventData {
        event_id: EventId::from_uuid(uuid::Uuid::from_u128(n)),
        event_type: "Tested".into(),
        data: format!("{{\"n\":{n}}}").into_bytes(),
        metadata: b"{\"schema\":1}".to_vec(),
    }
}

fn ids(events: &[RecordedEvent]) -> Vec<EventId> {
    events.iter().map(|event| event.event_id).collect()
}

async fn whole_stream(store: &KurrentDbStore, name: &StreamName) -> Vec<RecordedEvent> {
    store
        .read_stream(name, StreamVersion::FIRST, MAX_READ_BATCH)
        .await
        .expect("read the stream")
}

async fn whole_log(store: &KurrentDbStore) -> Vec<RecordedEvent> {
    let mut log = Vec::new();
    let mut start = LogStart::Beginning;
    loop {
        let page = store
            .read_all(start, MAX_READ_BATCH)
            .await
            .expect("read the log");
        let Some(last) = page.last() else { return log };
        start = LogStart::After(last.position);
        log.extend(page);
    }
}

// ----- answers lost after a commit --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_append_whose_connection_drops_is_resolved_by_reading_back_without_a_duplicate()
{
    let stand = stand().await;
    let store = connect(&stand, |_| {}).await;
    let name = stream("dropped");
    let first = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await
        .expect("create the stream");

    stand
        .inject(AppendFault::DropConnectionAfterCommit)
        .expect("queue the fault");
    let outcome = within(
        "the unclear append is resolved",
        store.append(
            &name,
            ExpectedVersion::Exact(first.next_expected),
            vec![event(2), event(3)],
        ),
    )
    .await
    .expect("the read-back finds the append written");

    assert_eq!(stand.pending_faults(), 0, "the fault was injected");
    assert_eq!(
        stand.connections_dropped_by_faults(),
        1,
        "the answer really was lost"
    );
    let stored = whole_stream(&store, &name).await;
    assert_eq!(
        ids(&stored),
        [event(1), event(2), event(3)].map(|e| e.event_id)
    );
    assert_eq!(outcome.next_expected, StreamVersion::new(2));
    assert_eq!(
        outcome.position, stored[2].position,
        "the outcome names the last event"
    );
    assert_eq!(stand.record_count(), 3, "written once on the server");

    // The domain's answer to an unknown outcome is to send the very same events again: the
    // server sees a retry of a stored append and writes nothing.
    let again = store
        .append(
            &name,
            ExpectedVersion::Exact(first.next_expected),
            vec![event(2), event(3)],
        )
        .await
        .expect("a retry of a stored append succeeds");
    assert_eq!(again, outcome);
    assert_eq!(stand.record_count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_answered_after_the_deadline_is_resolved_by_reading_back() {
    let stand = stand().await;
    let store = connect(&stand, |config| config.append_deadline_ms = 300).await;
    let name = stream("late");
    stand
        .inject(AppendFault::DelayAfterCommit { delay_ms: 2_000 })
        .expect("queue the fault");
    let started = Instant::now();
    let outcome = within(
        "the late append is resolved",
        store.append(&name, ExpectedVersion::NoStream, vec![event(1)]),
    )
    .await
    .expect("the read-back finds the append written");
    assert!(
        started.elapsed() < Duration::from_millis(1_900),
        "the deadline, not the late answer, ended the wait: {:?}",
        started.elapsed()
    );
    assert_eq!(outcome.next_expected, StreamVersion::FIRST);
    assert_eq!(ids(&whole_stream(&store, &name).await), [event(1).event_id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_refused_before_writing_is_unknown_and_the_same_events_sent_again_land_once() {
    let stand = stand().await;
    let store = connect(&stand, |_| {}).await;
    let name = stream("refused");
    stand
        .inject(AppendFault::UnavailableBeforeCommit)
        .expect("queue the fault");
    let unclear = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1), event(2)])
        .await;
    assert!(
        matches!(unclear, Err(StoreError::AppendOutcomeUnknown { .. })),
        "nothing is stored yet, so the outcome stays unknown: {unclear:?}"
    );
    assert!(whole_stream(&store, &name).await.is_empty());

    let sent_again = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1), event(2)])
        .await
        .expect("the same events sent again");
    assert_eq!(sent_again.next_expected, StreamVersion::new(1));
    assert_eq!(whole_log(&store).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_where_another_writer_won_is_a_version_conflict() {
    let stand = stand().await;
    let store = connect(&stand, |_| {}).await;
    let name = stream("contended");
    store
        .append(&name, ExpectedVersion::NoStream, vec![event(7)])
        .await
        .expect("the other writer wins");
    // Our append fails before the server writes, and the read-back finds the winner's event.
    stand
        .inject(AppendFault::UnavailableBeforeCommit)
        .expect("queue the fault");
    let lost = store
        .append(&name, ExpectedVersion::NoStream, vec![event(1)])
        .await;
    assert_eq!(
        lost,
        Err(StoreError::VersionConflict {
            stream: name.clone(),
            expected: ExpectedVersion::NoStream,
            actual: Some(StreamVersion::FIRST),
        })
    );
    assert_eq!(ids(&whole_stream(&store, &name).await), [event(7).event_id]);
}

// ----- restarts under a subscription ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_resumes_after_a_node_restart_with_no_gap_and_no_repeat() {
    let mut stand = stand().await;
    let store = connect(&stand, |_| {}).await;
    let name = stream("followed");
    let mut subscription = store
        .subscribe_all(LogStart::Beginning)
        .await
        .expect("subscribe");
    let mut expected = ExpectedVersion::NoStream;
    let mut append = |first: u128| {
        let (store, name) = (store.clone(), name.clone());
        let at = expected;
        expected = ExpectedVersion::Exact(StreamVersion::new(at.first_new_version().value() + 4));
        async move {
            store
                .append(&name, at, (first..first + 5).map(event).collect())
                .await
                .expect("append five")
        }
    };
    append(0).await;
    let mut delivered = Vec::new();
    for _ in 0..5 {
        delivered.push(
            within("an event before the restart", subscription.next())
                .await
                .expect("next"),
        );
    }

    stand.stop().await;
    // Non-matching records pile up while subscribers are away, so the resumed subscription has
    // to skip them.
    stand.write_system_events(40);
    stand.resume().await.expect("resume the stand");
    append(5).await;
    append(10).await;
    for _ in 0..10 {
        delivered.push(
            within("an event after the restart", subscription.next())
                .await
                .expect("next"),
        );
    }
    let ids_delivered: Vec<u128> = delivered
        .iter()
        .map(|event| event.event_id.as_uuid().as_u128())
        .collect();
    assert_eq!(
        ids_delivered,
        (0..15).collect::<Vec<_>>(),
        "every event once, in order"
    );
    assert_eq!(delivered, whole_log(&store).await);
}

/// Records `count` intents through the domain's ledger on `store`.
async fn record_intents(
    ledger: &Ledger<KurrentDbStore, SystemClock, RandomIds>,
    from: usize,
    count: usize,
) {
    for n in from..from + count {
        ledger
            .record_intent(IntentRequest {
                tenant: "acme".into(),
                owner: Some("anna".into()),
                provider: "crm".into(),
                account: "acct-1".into(),
                credential_fingerprint: "fp-1".into(),
                action: "create_task".into(),
                args: json!({"title": format!("call client {n}"), "due": "tomorrow"}),
                source_id: Some(format!("tool-call-{n}")),
                requires_approval: false,
            })
            .await
            .expect("the intent is recorded");
    }
}

struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<RunReport, opledger_readmodel::ReadModelError>>,
}

fn run_projection(store: &KurrentDbStore, read_models: &ReadModels) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let (store, read_models) = (store.clone(), read_models.clone());
    let task = tokio::spawn(async move {
        let stop = async {
            let _ = stopped.await;
        };
        ReadModelRunner::new()
            .with_max_batch_events(4)
            .run(&store, &read_models, stop)
            .await
    });
    Running { stop, task }
}

async fn caught_up(store: &KurrentDbStore, read_models: &ReadModels) {
    let deadline = Instant::now() + WAIT_LIMIT;
    loop {
        let lag = read_models.lag(store).await.expect("the lag");
        if lag.positions == 0 && lag.head.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the read models stay behind: {lag:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn assert_every_event_applied_once(
    store: &KurrentDbStore,
    read_models: &ReadModels,
    intents: u64,
) {
    let log = whole_log(store).await;
    let metrics = read_models
        .call(|store| store.metrics())
        .await
        .expect("metrics");
    assert_eq!(
        metrics.counter(Counter::Events),
        log.len() as u64,
        "no gap, no repeat"
    );
    assert_eq!(metrics.counter(Counter::IntentsRecorded), intents);
    assert_eq!(
        read_models.checkpoint().await.expect("checkpoint"),
        log.last().map(|event| event.position)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_models_ride_through_a_node_restart_with_no_gap_and_no_repeat() {
    let mut stand = stand().await;
    let store = connect(&stand, |_| {}).await;
    let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
    let dir = TempDir::new().expect("temp dir");
    let read_models = ReadModels::open(dir.path().join("views.db"))
        .await
        .expect("open the views");

    record_intents(&ledger, 0, 6).await;
    let running = run_projection(&store, &read_models);
    caught_up(&store, &read_models).await;

    stand.restart().await.expect("restart the stand");
    record_intents(&ledger, 6, 6).await;
    caught_up(&store, &read_models).await;

    let _ = running.stop.send(());
    let report = within("the runner stops", running.task)
        .await
        .expect("the runner task")
        .expect("the runner rode through the restart without an error");
    assert_eq!(report.applied, whole_log(&store).await.len() as u64);
    assert_every_event_applied_once(&store, &read_models, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_models_stopped_by_a_long_outage_resume_from_their_checkpoint_with_no_gap_and_no_repeat(
) {
    let mut stand = stand().await;
    // Two reconnections in a row, then the subscription gives up and the runner stops.
    let store = connect(&stand, |config| config.resubscribe_attempts = 2).await;
    let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
    let dir = TempDir::new().expect("temp dir");
    let read_models = ReadModels::open(dir.path().join("views.db"))
        .await
        .expect("open the views");

    record_intents(&ledger, 0, 5).await;
    let running = run_projection(&store, &read_models);
    caught_up(&store, &read_models).await;
    let checkpoint = read_models.checkpoint().await.expect("checkpoint");

    stand.stop().await;
    let stopped = within("the runner gives up during the outage", running.task)
        .await
        .expect("the runner task");
    assert!(
        stopped.is_err(),
        "the outage outlasted the subscription's reconnections: {stopped:?}"
    );
    assert_eq!(
        read_models.checkpoint().await.expect("checkpoint"),
        checkpoint
    );

    stand.resume().await.expect("resume the stand");
    record_intents(&ledger, 5, 5).await;
    let running = run_projection(&store, &read_models);
    caught_up(&store, &read_models).await;
    let _ = running.stop.send(());
    let report = within("the runner stops", running.task)
        .await
        .expect("the runner task")
        .expect("the second run");
    assert_eq!(
        report.applied, 5,
        "the second run applied only what came after its checkpoint"
    );
    assert_every_event_applied_once(&store, &read_models, 10).await;
}
