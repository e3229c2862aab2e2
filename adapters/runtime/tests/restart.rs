//! A restart resumes every waiting operation from the read models' durable work queue, without
//! reading the log from the start.
//!
//! The first life, two minutes ago by its clock, leaves one operation in every state that is not
//! settled: a due send, an attempt whose lease has since run out, an unknown outcome due for a
//! lookup, one awaiting approval and one in review. The second life opens the same files with
//! the real clock and a store that records where every read of the global log starts. It must
//! drive each due operation to its outcome, drive the approval and the review once people decide,
//! and never read the log from position 0: the runner follows it from the read models'
//! checkpoint and the workers read the work queue.

mod support;

use std::sync::Arc;

use chrono::Utc;
use opledger_domain::app::{IntentRequest, Ledger};
use opledger_domain::command::Command;
use opledger_domain::engine::{Engine, EnginePolicy};
use opledger_domain::event::{IntentRecorded, ReviewDecision};
use opledger_domain::ids::{ActorId, AttemptId, OperationId, WorkerId};
use opledger_domain::ports::IdSource;
use opledger_domain::state::Status;
use opledger_domain::store::LogStart;
use opledger_domain::testing::{claim_of, ManualClock};
use opledger_readmodel::{catch_up, ReadModels};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_runtime::workers::WorkerConfig;
use opledger_store::SqliteStore;

use support::{eventually, request, ConfirmingCrm, Recording, Running};

/// The operations the first life left, one per state that is not settled.
struct LeftOpen {
    due_send: OperationId,
    expired_lease: OperationId,
    due_lookup: OperationId,
    awaiting_approval: IntentRecorded,
    in_review: OperationId,
}

impl LeftOpen {
    fn all(&self) -> [OperationId; 5] {
        [
            self.due_send,
            self.expired_lease,
            self.due_lookup,
            self.awaiting_approval.operation_id,
            self.in_review,
        ]
    }
}

/// Records one intent and applies `commands` to it in order, as the engine would have.
async fn leave(
    ledger: &Ledger<SqliteStore, ManualClock, RandomIds>,
    request: IntentRequest,
    commands: impl Fn(&IntentRecorded, AttemptId) -> Vec<Command>,
) -> IntentRecorded {
    let recorded = ledger.record_intent(request).await.expect("recorded");
    let intent = recorded.intent().clone();
    let mut loaded = recorded.operation;
    for command in commands(&intent, RandomIds.new_attempt_id()) {
        loaded = ledger
            .execute_from(loaded, &command)
            .await
            .expect("the command is accepted");
    }
    intent
}

/// The first life: one operation in every open state, the read models caught up, all closed.
async fn first_life(db: &std::path::Path, views: &std::path::Path) -> LeftOpen {
    let store = SqliteStore::open(db).await.expect("the ledger opens");
    // Long enough ago for the first attempts' leases to have run out, recent enough that the
    // retry budget (15 minutes by default) still allows a retry.
    let two_minutes_ago = Utc::now() - chrono::Duration::minutes(2);
    let ledger = Ledger::new(store.clone(), ManualClock::at(two_minutes_ago), RandomIds);
    let worker = || WorkerId::new("first-life").expect("a valid worker id");
    let unknown = |attempt_id| Command::RecordUnknown {
        attempt_id,
        error: "read timed out".into(),
        check_not_before: None,
    };
    let approval = IntentRequest {
        requires_approval: true,
        ..request("Pay the supplier")
    };
    let left = LeftOpen {
        due_send: leave(&ledger, request("Call the client"), |_, _| vec![])
            .await
            .operation_id,
        expired_lease: leave(&ledger, request("Book the room"), |intent, attempt| {
            vec![claim_of(intent, attempt, worker())]
        })
        .await
        .operation_id,
        due_lookup: leave(&ledger, request("Send the invoice"), |intent, attempt| {
            vec![claim_of(intent, attempt, worker()), unknown(attempt)]
        })
        .await
        .operation_id,
        awaiting_approval: leave(&ledger, approval, |_, _| vec![]).await,
        in_review: leave(&ledger, request("Renew the contract"), |intent, attempt| {
            vec![
                claim_of(intent, attempt, worker()),
                unknown(attempt),
                Command::RequireReview {
                    reason: "no evidence and no retry contract".into(),
                    evidence: "a lookup found nothing".into(),
                },
            ]
        })
        .await
        .operation_id,
    };
    let read_models = ReadModels::open(views).await.expect("the read models open");
    catch_up(&store, &read_models, None, |_| {})
        .await
        .expect("caught up");
    store.close().await.expect("the ledger closes");
    left
}

async fn status_of<S: opledger_domain::store::EventStore>(
    ledger: &Ledger<S, SystemClock, RandomIds>,
    operation_id: OperationId,
) -> Status {
    ledger
        .get(operation_id)
        .await
        .expect("it loads")
        .state
        .status
}

/// Waits (bounded) until `operation_id` has succeeded.
async fn succeeds<S: opledger_domain::store::EventStore>(
    ledger: &Ledger<S, SystemClock, RandomIds>,
    operation_id: OperationId,
    what: &str,
) {
    eventually(what, || async {
        matches!(
            status_of(ledger, operation_id).await,
            Status::Succeeded { .. }
        )
        .then_some(())
    })
    .await;
}

/// A person approves the operation awaiting approval and sends the one in review again; the
/// workers take it from there.
async fn people_decide<S: opledger_domain::store::EventStore>(
    ledger: &Ledger<S, SystemClock, RandomIds>,
    left: &LeftOpen,
) {
    let person = ActorId::new("boss").expect("a valid actor");
    ledger
        .approve(
            left.awaiting_approval.operation_id,
            person.clone(),
            left.awaiting_approval.args_hash.clone(),
        )
        .await
        .expect("approved");
    let retry = Command::ResolveReview {
        principal: None,
        reviewer: person,
        decision: ReviewDecision::Retry,
        note: "the CRM has no such task; send it again".into(),
        accept_duplicate_risk: false,
        capabilities: Some(opledger_domain::testing::labelled()),
    };
    ledger
        .execute(left.in_review, &retry)
        .await
        .expect("the review is resolved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_every_open_operation_from_the_work_queue_without_reading_the_log_from_the_start(
) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = dir.path().join("ledger.db");
    let views = dir.path().join("ledger.db.views");
    let left = first_life(&db, &views).await;

    let store = Recording::new(SqliteStore::open(&db).await.expect("the ledger opens"));
    let read_models = ReadModels::open(&views)
        .await
        .expect("the read models open");
    let queued = read_models
        .call(|store| store.queued_work())
        .await
        .expect("the queue counts");
    assert_eq!(
        queued, 3,
        "the send, the sweep and the lookup wait; people's decisions do not"
    );
    let crm = ConfirmingCrm::default();
    let engine = Arc::new(Engine::new(
        Ledger::new(store.clone(), SystemClock, RandomIds),
        crm.clone(),
        EnginePolicy::default(),
        WorkerId::new("second-life").expect("a valid worker id"),
    ));
    let config = WorkerConfig {
        idle_poll_ms: 20,
        redrive_pause_ms: 20,
        ..WorkerConfig::default()
    };
    let running = Running::start(&engine, store.clone(), &read_models, config);
    let ledger = engine.ledger();

    for operation_id in [left.due_send, left.expired_lease, left.due_lookup] {
        succeeds(ledger, operation_id, "each due operation succeeds").await;
    }
    assert_eq!(
        status_of(ledger, left.awaiting_approval.operation_id).await,
        Status::AwaitingApproval,
        "nothing is sent before a person approves"
    );
    assert_eq!(status_of(ledger, left.in_review).await, Status::NeedsReview);
    people_decide(ledger, &left).await;
    for operation_id in [left.awaiting_approval.operation_id, left.in_review] {
        succeeds(ledger, operation_id, "each decided operation succeeds").await;
    }
    let stats = running.stop().await;

    let mut sent = crm.sent();
    sent.sort_unstable();
    let mut expected = left.all().to_vec();
    expected.sort_unstable();
    assert_eq!(
        sent, expected,
        "each operation was sent once in the second life"
    );
    assert_eq!(stats.failed_drives, 0, "{stats:?}");
    let starts = store.log_starts();
    assert!(!starts.is_empty(), "the runner followed the log");
    assert!(
        starts
            .iter()
            .all(|start| matches!(start, LogStart::After(_))),
        "every read of the global log started after the read models' checkpoint: {starts:?}"
    );
}
