//! Several workers at once: the claim is one conditional append, so exactly one of them sends.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use opledger_crm_stand::FaultKind;
use opledger_domain::ids::OperationId;
use opledger_domain::state::Status;
use opledger_runtime::workers::WorkerConfig;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::support::{eventually, names, Crm, Harness, ACCOUNT};

const RACED_OPERATIONS: usize = 20;
const WORKER_OPERATIONS: usize = 10;
const RACED_LOOKUPS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_operation_driven_by_two_workers_at_the_same_moment_is_sent_once() {
    let h = Harness::start().await;
    let other = h.second_worker("worker-b");
    let mut intents = Vec::new();
    for n in 0..RACED_OPERATIONS {
        let recorded = h
            .record(h.request(Crm::Plain, Some(&format!("toolcall-{n}"))))
            .await;
        intents.push(recorded.intent().clone());
    }

    // Both workers get every operation at the same moment.
    let mut drives = JoinSet::new();
    for intent in &intents {
        let together = Arc::new(Barrier::new(2));
        for engine in [Arc::clone(&h.engine), Arc::clone(&other)] {
            let together = Arc::clone(&together);
            let operation_id = intent.operation_id;
            drives.spawn(async move {
                together.wait().await;
                engine.drive(operation_id).await
            });
        }
    }
    while let Some(joined) = drives.join_next().await {
        let report = joined
            .expect("the drive task")
            .expect("both drives succeed");
        assert!(
            matches!(
                report.state().status,
                Status::InFlight | Status::Succeeded { .. }
            ),
            "a loser reports the winner's progress: {:?}",
            report.state()
        );
    }

    // A plain CRM creates on every POST: a double send would show up as a second task.
    assert_eq!(h.creates(Crm::Plain).await.len(), RACED_OPERATIONS);
    assert_eq!(h.objects_in(ACCOUNT).await.len(), RACED_OPERATIONS);
    for intent in &intents {
        let objects = h.objects_for(Crm::Plain, intent).await;
        assert_eq!(objects.len(), 1, "{objects:?}");
        assert_eq!(
            h.state(intent.operation_id)
                .await
                .external_id()
                .map(|id| id.as_str()),
            Some(objects[0].id.as_str())
        );
        assert_eq!(
            h.event_names(intent.operation_id).await,
            ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"],
            "exactly one claim"
        );
    }
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_operation_due_for_two_workers_at_the_same_moment_is_looked_up_once_and_retried_once(
) {
    let h = Harness::start().await;
    let other = h.second_worker("worker-b");
    h.queue(
        Crm::Keyed
            .create_fault(FaultKind::DropRequest)
            .times(RACED_LOOKUPS as u32),
    )
    .await;
    let mut intents = Vec::new();
    for n in 0..RACED_LOOKUPS {
        let recorded = h
            .record(h.request(Crm::Keyed, Some(&format!("toolcall-{n}"))))
            .await;
        let intent = recorded.intent().clone();
        h.first_attempt_left_unknown(intent.operation_id).await;
        intents.push(intent);
    }

    // Both workers find every unknown operation due for a lookup at the same moment.
    let mut drives = JoinSet::new();
    for intent in &intents {
        let together = Arc::new(Barrier::new(2));
        for engine in [Arc::clone(&h.engine), Arc::clone(&other)] {
            let together = Arc::clone(&together);
            let operation_id = intent.operation_id;
            drives.spawn(async move {
                together.wait().await;
                (operation_id, engine.drive(operation_id).await)
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(joined) = drives.join_next().await {
        let (operation_id, drive) = joined.expect("the drive task");
        if let Err(error) = drive {
            failures.push(format!("{operation_id}: {error}"));
        }
    }
    for intent in &intents {
        h.settle(intent.operation_id).await;
    }

    for intent in &intents {
        let objects = h.objects_for(Crm::Keyed, intent).await;
        assert_eq!(objects.len(), 1, "{objects:?}");
        let names = h.event_names(intent.operation_id).await;
        assert_eq!(
            names
                .iter()
                .filter(|name| **name == "RetryScheduled")
                .count(),
            1,
            "one retry: {names:?}"
        );
        assert_eq!(
            names
                .iter()
                .filter(|name| **name == "AttemptStarted")
                .count(),
            2,
            "the first attempt and one retry: {names:?}"
        );
        assert_eq!(names.last(), Some(&"AttemptSucceeded"), "{names:?}");
        // The lookup is claimed before it is made: the worker that lost the claim leaves it.
        let key = Some(intent.idempotency_key.as_str());
        let lookups = h.lookups().await;
        let lookups = lookups
            .iter()
            .filter(|lookup| lookup.key.as_deref() == key)
            .count();
        assert_eq!(lookups, 1, "one lookup at the CRM: {names:?}");
        assert_eq!(
            names
                .iter()
                .filter(|name| **name == "LookupClaimed")
                .count(),
            1,
            "one claim: {names:?}"
        );
    }
    assert!(
        failures.is_empty(),
        "a worker that lost the race to record a lookup reports where the operation stands, it does not fail: {failures:#?}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_drive_every_recorded_intent_to_exactly_one_task_and_shut_down_cleanly() {
    let h = Harness::start().await;
    h.queue(Crm::Keyed.create_fault(FaultKind::DropResponse))
        .await;
    let workers = h
        .spawn_workers(WorkerConfig {
            max_concurrent: 4,
            idle_poll_ms: 20,
            redrive_pause_ms: 50,
            shutdown_grace_ms: 5_000,
            ..WorkerConfig::default()
        })
        .await;
    let mut intents = Vec::new();
    for n in 0..WORKER_OPERATIONS {
        let recorded = h
            .record(h.request(Crm::Keyed, Some(&format!("toolcall-{n}"))))
            .await;
        intents.push(recorded.intent().clone());
    }
    let operations: Vec<OperationId> = intents.iter().map(|intent| intent.operation_id).collect();

    // The test never drives: it only watches the ledger.
    eventually(
        "every operation succeeded",
        Duration::from_secs(30),
        || async {
            for operation_id in &operations {
                if !matches!(
                    h.state(*operation_id).await.status,
                    Status::Succeeded { .. }
                ) {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let stats = workers.shutdown().await.expect("the workers stop cleanly");

    assert!(stats.drives >= WORKER_OPERATIONS as u64, "{stats:?}");
    assert_eq!(stats.abandoned_at_shutdown, 0, "{stats:?}");
    assert_eq!(stats.failed_drives, 0, "{stats:?}");
    assert_eq!(h.objects_in(ACCOUNT).await.len(), WORKER_OPERATIONS);
    let mut external_ids = HashSet::new();
    let mut reconciled = 0;
    for intent in &intents {
        let objects = h.objects_for(Crm::Keyed, intent).await;
        assert_eq!(objects.len(), 1, "one task per key: {objects:?}");
        let state = h.state(intent.operation_id).await;
        assert_eq!(
            state.external_id().map(|id| id.as_str()),
            Some(objects[0].id.as_str())
        );
        external_ids.insert(objects[0].id.clone());
        let names = names(&h.events(intent.operation_id).await);
        if names
            == [
                "IntentRecorded",
                "AttemptStarted",
                "OutcomeUnknown",
                "LookupClaimed",
                "ReconciliationRecorded",
            ]
        {
            reconciled += 1;
        } else {
            assert_eq!(
                names,
                ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"]
            );
        }
    }
    assert_eq!(external_ids.len(), WORKER_OPERATIONS);
    assert_eq!(
        reconciled, 1,
        "the one lost response was settled by a key lookup"
    );
    assert_eq!(h.creates(Crm::Keyed).await.len(), WORKER_OPERATIONS);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_cut_off_by_the_workers_shutdown_is_recorded_unknown_and_later_reconciled_to_one_task(
) {
    let h = Harness::start().await;
    h.queue(Crm::Keyed.create_fault(FaultKind::LateResponse { delay_ms: 3_000 }))
        .await;
    let workers = h
        .spawn_workers(WorkerConfig {
            max_concurrent: 4,
            idle_poll_ms: 20,
            redrive_pause_ms: 50,
            shutdown_grace_ms: 100,
            ..WorkerConfig::default()
        })
        .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("cut-off-1"))).await;
    let operation_id = recorded.intent().operation_id;
    // The CRM has applied it and holds its answer back: the send is in progress.
    eventually(
        "the CRM holds the task",
        Duration::from_secs(10),
        || async { (!h.objects_in(ACCOUNT).await.is_empty()).then_some(()) },
    )
    .await;
    let stats = workers.shutdown().await.expect("the workers stop");
    assert_eq!(stats.abandoned_at_shutdown, 1, "{stats:?}");
    assert_eq!(stats.recorded_unknown_at_shutdown, 1, "{stats:?}");
    assert!(
        matches!(h.state(operation_id).await.status, Status::Unknown),
        "recorded unknown at once, not left in flight until the lease"
    );
    assert_eq!(
        names(&h.events(operation_id).await),
        ["IntentRecorded", "AttemptStarted", "OutcomeUnknown"]
    );
    // Reconciliation takes it from there (a key lookup, or a retry with the same key once the
    // CRM has finished the first request): one task, confirmed.
    eventually("the operation settles", Duration::from_secs(20), || async {
        let report = h.engine.drive(operation_id).await.ok()?;
        matches!(report.state().status, Status::Succeeded { .. }).then_some(())
    })
    .await;
    assert_eq!(h.objects_in(ACCOUNT).await.len(), 1);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execute_call_and_a_background_worker_on_one_unknown_operation_make_one_lookup() {
    let h = Harness::start().await;
    h.queue(Crm::Keyed.create_fault(FaultKind::DropRequest))
        .await;
    // Each lookup takes 400 ms at the CRM, so the two drives certainly overlap.
    h.queue(Crm::Keyed.lookup_fault(FaultKind::LateResponse { delay_ms: 400 }))
        .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent().clone();
    h.first_attempt_left_unknown(intent.operation_id).await;

    // The background workers and an execute call, all on the one engine of this process.
    let workers = h
        .spawn_workers(WorkerConfig {
            max_concurrent: 4,
            idle_poll_ms: 20,
            redrive_pause_ms: 50,
            shutdown_grace_ms: 5_000,
            ..WorkerConfig::default()
        })
        .await;
    let together = Arc::new(Barrier::new(2));
    let mut drives = JoinSet::new();
    for _ in 0..2 {
        let (engine, together) = (Arc::clone(&h.engine), Arc::clone(&together));
        drives.spawn(async move {
            together.wait().await;
            engine.drive(intent.operation_id).await
        });
    }
    while let Some(joined) = drives.join_next().await {
        joined.expect("the drive task").expect("the drive succeeds");
    }
    eventually(
        "the operation succeeded",
        Duration::from_secs(20),
        || async {
            matches!(
                h.state(intent.operation_id).await.status,
                Status::Succeeded { .. }
            )
            .then_some(())
        },
    )
    .await;
    workers.shutdown().await.expect("the workers stop cleanly");

    let lookups = h.lookups().await;
    assert_eq!(
        lookups.len(),
        1,
        "one lookup, not one per driver: {lookups:?}"
    );
    let names = h.event_names(intent.operation_id).await;
    assert_eq!(
        names
            .iter()
            .filter(|name| **name == "ReconciliationRecorded")
            .count(),
        1,
        "{names:?}"
    );
    assert_eq!(h.objects_for(Crm::Keyed, &intent).await.len(), 1);
    h.finish().await;
}
