//! The first application commands over real stores: record an intent (with redelivery), approve,
//! deny, load by folding, and the single-sender claim — on the memory store and on a real SQLite
//! file.

use std::sync::Arc;

use opledger_domain::app::{AppError, IntentRequest, Ledger};
use opledger_domain::args::ArgsSnapshot;
use opledger_domain::command::Command;
use opledger_domain::contract::{
    Deduplication, LookupSupport, ProviderCapabilities, RetryPolicy, SendBinding,
};
use opledger_domain::decider::Rejection;
use opledger_domain::event::{IntentRecorded, ReviewDecision};
use opledger_domain::ids::{ActorId, ExternalObjectId, OperationId, WorkerId};
use opledger_domain::ports::IdSource;
use opledger_domain::state::{OperationState, Status};
use opledger_domain::store::{EventStore, LogStart, StreamName, MAX_READ_BATCH};
use opledger_runtime::system::{RandomIds, SystemClock};
use opledger_store::{MemoryStore, SqliteStore};
use serde_json::json;

fn request(source_id: Option<&str>) -> IntentRequest {
    IntentRequest {
        tenant: "acme".into(),
        owner: Some("anna".into()),
        provider: "crm".into(),
        account: "acct-1".into(),
        credential_fingerprint: "fp-1".into(),
        action: "create_task".into(),
        args: json!({"title": "Call the client", "due": "tomorrow"}),
        source_id: source_id.map(str::to_owned),
        requires_approval: false,
    }
}

/// The follow-up that claims a freshly recorded intent for worker `w-1`.
fn claim_recorded(state: &OperationState) -> Option<Command> {
    state
        .intent
        .as_ref()
        .map(|intent| start_command(intent, "w-1"))
}

fn start_command(intent: &IntentRecorded, worker: &str) -> Command {
    Command::StartAttempt {
        request: None,
        budget_wait: None,
        attempt_id: RandomIds.new_attempt_id(),
        worker: WorkerId::new(worker).expect("valid worker"),
        lease_ms: 30_000,
        binding: SendBinding {
            account: intent.account.clone(),
            credential_fingerprint: intent.credential_fingerprint.clone(),
            args_hash: intent.args_hash.clone(),
        },
        capabilities: ProviderCapabilities {
            deduplication: Deduplication::UniqueLabel,
            lookup: LookupSupport::Consistent,
        },
        policy: RetryPolicy::default(),
    }
}

async fn all_events<S: EventStore>(store: &S) -> usize {
    store
        .read_all(LogStart::Beginning, MAX_READ_BATCH)
        .await
        .expect("read the log")
        .len()
}

macro_rules! ledger_suite {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            async fn ledger() -> (Arc<Ledger<impl EventStore + Clone + 'static, SystemClock, RandomIds>>, Option<tempfile::TempDir>) {
                let (store, dir) = $make;
                (Arc::new(Ledger::new(store, SystemClock, RandomIds)), dir)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn an_intent_without_a_source_id_is_a_new_operation_every_time() {
                let (ledger, _dir) = ledger().await;
                let first = ledger.record_intent(request(None)).await.expect("recorded");
                let second = ledger.record_intent(request(None)).await.expect("recorded");
                assert!(first.created && second.created);
                assert_ne!(first.intent().operation_id, second.intent().operation_id);
                assert_ne!(first.intent().idempotency_key, second.intent().idempotency_key);
                assert_eq!(first.intent().args_hash, second.intent().args_hash, "same text, same hash, still two operations");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn thirty_two_concurrent_redeliveries_of_one_source_make_one_operation() {
                let (ledger, _dir) = ledger().await;
                let mut tasks = Vec::new();
                for _ in 0..32 {
                    let ledger = Arc::clone(&ledger);
                    tasks.push(tokio::spawn(async move { ledger.record_intent(request(Some("toolcall-1"))).await }));
                }
                let mut created = 0;
                let mut keys = std::collections::HashSet::new();
                for task in tasks {
                    let recorded = task.await.expect("task ran").expect("recorded");
                    created += usize::from(recorded.created);
                    keys.insert(recorded.intent().idempotency_key.clone());
                    assert_eq!(recorded.operation.version.map(|v| v.value()), Some(0));
                }
                assert_eq!(created, 1, "exactly one delivery creates the operation");
                assert_eq!(keys.len(), 1, "every delivery sees the one key");
                assert_eq!(all_events(ledger.store()).await, 1, "one IntentRecorded in the whole log");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn an_intent_and_its_claim_are_appended_together_and_a_refused_claim_leaves_the_intent_alone() {
                let (ledger, _dir) = ledger().await;
                let claimed = ledger
                    .record_intent_then(request(None), claim_recorded)
                    .await
                    .expect("recorded");
                assert!(claimed.created);
                assert_eq!(claimed.operation.state.status, Status::InFlight);
                assert_eq!(claimed.operation.version.map(|v| v.value()), Some(1), "intent and claim");
                assert_eq!(all_events(ledger.store()).await, 2);

                // An intent that needs approval cannot be claimed: the claim is refused and the
                // intent is recorded on its own, waiting for its approver.
                let mut asked = request(None);
                asked.requires_approval = true;
                let waiting = ledger
                    .record_intent_then(asked, claim_recorded)
                    .await
                    .expect("recorded without the claim");
                assert!(waiting.created);
                assert_eq!(waiting.operation.state.status, Status::AwaitingApproval);
                assert_eq!(waiting.operation.version.map(|v| v.value()), Some(0), "the intent alone");
                assert_eq!(all_events(ledger.store()).await, 3);
                let loaded = ledger.get(waiting.intent().operation_id).await.expect("loaded");
                assert_eq!(loaded.state.attempts, 0, "nothing was claimed");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_decision_on_a_version_that_moved_on_is_refused_and_writes_nothing() {
                let (ledger, _dir) = ledger().await;
                let mut asked = request(None);
                asked.requires_approval = true;
                let recorded = ledger.record_intent(asked).await.expect("recorded");
                let seen = recorded.operation.clone();
                let operation_id = seen.operation_id;
                let hash = recorded.intent().args_hash.clone();
                // Someone else approves while a person still looks at version 0.
                ledger.approve(operation_id, ActorId::new("boss").expect("actor"), hash.clone()).await.expect("approved");
                let deny = Command::DenyApproval { principal: None,
                    approver: ActorId::new("auditor").expect("actor"),
                    args_hash: hash,
                    reason: "looked at the old state".into(),
                };
                let error = ledger.execute_on_seen(seen, &deny).await.expect_err("moved on");
                assert!(matches!(error, AppError::Moved { .. }), "{error}");
                assert_eq!(all_events(ledger.store()).await, 2, "nothing appended");
                assert_eq!(ledger.get(operation_id).await.expect("loaded").state.status, Status::Pending);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_source_id_reused_for_other_arguments_is_refused_and_writes_nothing() {
                let (ledger, _dir) = ledger().await;
                ledger.record_intent(request(Some("toolcall-1"))).await.expect("recorded");
                let mut changed = request(Some("toolcall-1"));
                changed.args = json!({"title": "Call someone else"});
                let error = ledger.record_intent(changed).await.expect_err("refused");
                assert!(matches!(error, AppError::SourceReused { differs: "arguments", .. }), "{error}");
                assert_eq!(all_events(ledger.store()).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn invalid_intents_are_refused_with_the_field_named_and_nothing_written() {
                let (ledger, _dir) = ledger().await;
                let mut not_an_object = request(None);
                not_an_object.args = json!("call the client");
                let mut no_tenant = request(None);
                no_tenant.tenant = String::new();
                let mut huge = request(None);
                huge.args = json!({"body": "x".repeat(opledger_domain::args::MAX_ARGS_BYTES + 1)});
                for (bad, field) in [(not_an_object, "args"), (no_tenant, "tenant"), (huge, "args")] {
                    match ledger.record_intent(bad).await {
                        Err(AppError::Invalid(error)) => assert_eq!(error.field, field, "{error}"),
                        other => panic!("expected a validation error on {field}, got {other:?}"),
                    }
                }
                assert_eq!(all_events(ledger.store()).await, 0);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn approval_is_bound_to_the_recorded_snapshot() {
                let (ledger, _dir) = ledger().await;
                let mut needs_approval = request(None);
                needs_approval.requires_approval = true;
                let recorded = ledger.record_intent(needs_approval).await.expect("recorded");
                let operation_id = recorded.intent().operation_id;
                assert_eq!(recorded.operation.state.status, Status::AwaitingApproval);
                let other = ArgsSnapshot::new(json!({"title": "Call the client", "due": "today"})).expect("valid").hash();
                let refused = ledger.approve(operation_id, ActorId::new("boss").expect("valid"), other).await;
                assert!(matches!(refused, Err(AppError::Rejected { rejection: Rejection::ArgsHashMismatch { .. }, .. })));
                let approved = ledger
                    .approve(operation_id, ActorId::new("boss").expect("valid"), recorded.intent().args_hash.clone())
                    .await
                    .expect("approved");
                assert_eq!(approved.state.status, Status::Pending);
                let reloaded = ledger.get(operation_id).await.expect("loads");
                assert_eq!(reloaded, approved, "the folded stream equals the state the command returned");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_denied_operation_cannot_be_claimed() {
                let (ledger, _dir) = ledger().await;
                let mut needs_approval = request(None);
                needs_approval.requires_approval = true;
                let recorded = ledger.record_intent(needs_approval).await.expect("recorded");
                let intent = recorded.intent().clone();
                let denied = ledger
                    .deny(intent.operation_id, ActorId::new("boss").expect("valid"), intent.args_hash.clone(), "wrong client".into())
                    .await
                    .expect("denied");
                assert_eq!(denied.state.status, Status::Denied);
                let claim = ledger.execute(intent.operation_id, &start_command(&intent, "w")).await;
                assert!(matches!(claim, Err(AppError::Rejected { rejection: Rejection::NotAllowed { .. }, .. })));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn of_sixteen_racing_workers_exactly_one_claims_the_send() {
                let (ledger, _dir) = ledger().await;
                let recorded = ledger.record_intent(request(None)).await.expect("recorded");
                let intent = recorded.intent().clone();
                let mut tasks = Vec::new();
                for worker in 0..16 {
                    let ledger = Arc::clone(&ledger);
                    let command = start_command(&intent, &format!("worker-{worker}"));
                    tasks.push(tokio::spawn(async move { ledger.execute(intent.operation_id, &command).await }));
                }
                let mut winners = 0;
                for task in tasks {
                    match task.await.expect("task ran") {
                        Ok(_) => winners += 1,
                        Err(AppError::Rejected { rejection: Rejection::NotAllowed { status: "in_flight", .. }, .. }) => {}
                        Err(other) => panic!("unexpected: {other}"),
                    }
                }
                assert_eq!(winners, 1);
                let state = ledger.get(intent.operation_id).await.expect("loads").state;
                assert_eq!(state.attempts, 1, "one AttemptStarted in the stream");
                let stream = ledger.store().read_stream(&StreamName::for_operation(intent.operation_id), opledger_domain::ids::StreamVersion::FIRST, 100).await.expect("reads");
                assert_eq!(stream.len(), 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_person_may_decide_an_unknown_operation_without_waiting_for_its_review() {
                let (ledger, _dir) = ledger().await;
                let reviewer = || ActorId::new("operator").expect("actor");
                let mut decided = Vec::new();
                for decision in [
                    ReviewDecision::ConfirmSucceeded { external_id: ExternalObjectId::new("731").expect("id") },
                    ReviewDecision::Abandon,
                    ReviewDecision::Retry,
                ] {
                    let recorded = ledger.record_intent(request(None)).await.expect("recorded");
                    let intent = recorded.intent().clone();
                    let claim = start_command(&intent, "w-1");
                    let Command::StartAttempt { request: None, attempt_id, .. } = &claim else { unreachable!() };
                    let attempt_id = *attempt_id;
                    ledger.execute(intent.operation_id, &claim).await.expect("claimed");
                    let timed_out = Command::RecordUnknown { check_not_before: None, attempt_id, error: "timed out".into() };
                    let unknown = ledger.execute(intent.operation_id, &timed_out).await.expect("unknown");
                    assert_eq!(unknown.state.status, Status::Unknown);
                    let command = Command::ResolveReview { principal: None, accept_duplicate_risk: true, capabilities: None, reviewer: reviewer(), decision, note: "the CRM is down; checked by hand".into() };
                    decided.push(ledger.execute(intent.operation_id, &command).await.expect("decided").state.status);
                }
                assert_eq!(
                    decided,
                    [
                        Status::Succeeded { external_id: ExternalObjectId::new("731").expect("id") },
                        Status::Abandoned,
                        Status::Pending,
                    ]
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn an_operation_never_recorded_is_reported_as_not_found() {
                let (ledger, _dir) = ledger().await;
                let missing = OperationId::from_uuid(uuid::Uuid::from_u128(12345));
                assert!(matches!(ledger.get(missing).await, Err(AppError::NotFound { .. })));
            }
        }
    };
}

ledger_suite!(memory, (MemoryStore::new(), None));
ledger_suite!(sqlite, {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("ledger.db"))
        .await
        .expect("opens");
    (store, Some(dir))
});

/// A memory store whose next append is written but reported as "outcome unknown", the way a
/// dropped connection or a failed COMMIT acknowledgement looks to a client.
#[derive(Clone, Default)]
struct UnclearOnce {
    inner: MemoryStore,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl EventStore for UnclearOnce {
    type Subscription = <MemoryStore as EventStore>::Subscription;

    async fn append(
        &self,
        stream: &StreamName,
        expected: opledger_domain::store::ExpectedVersion,
        events: Vec<opledger_domain::store::EventData>,
    ) -> Result<opledger_domain::store::AppendOutcome, opledger_domain::store::StoreError> {
        let outcome = self.inner.append(stream, expected, events).await?;
        if self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(opledger_domain::store::StoreError::AppendOutcomeUnknown {
                stream: stream.clone(),
                reason: "connection dropped after sending".into(),
            });
        }
        Ok(outcome)
    }

    async fn read_stream(
        &self,
        stream: &StreamName,
        from: opledger_domain::ids::StreamVersion,
        max_count: usize,
    ) -> Result<Vec<opledger_domain::store::RecordedEvent>, opledger_domain::store::StoreError>
    {
        self.inner.read_stream(stream, from, max_count).await
    }

    async fn read_all(
        &self,
        start: LogStart,
        max_count: usize,
    ) -> Result<Vec<opledger_domain::store::RecordedEvent>, opledger_domain::store::StoreError>
    {
        self.inner.read_all(start, max_count).await
    }

    async fn head_position(
        &self,
    ) -> Result<Option<opledger_domain::ids::GlobalPosition>, opledger_domain::store::StoreError>
    {
        self.inner.head_position().await
    }

    async fn subscribe_all(
        &self,
        start: LogStart,
    ) -> Result<Self::Subscription, opledger_domain::store::StoreError> {
        self.inner.subscribe_all(start).await
    }
}

#[tokio::test]
async fn an_append_whose_outcome_was_unclear_is_sent_again_and_written_once() {
    let store = UnclearOnce::default();
    let ledger = Ledger::new(store.clone(), SystemClock, RandomIds);
    let recorded = ledger.record_intent(request(None)).await.expect("recorded");
    store.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let intent = recorded.intent().clone();
    let claimed = ledger
        .execute(intent.operation_id, &start_command(&intent, "w"))
        .await
        .expect("the unclear claim is resolved by sending it again");
    assert_eq!(claimed.state.status, Status::InFlight);
    assert_eq!(claimed.version.map(|v| v.value()), Some(1));
    assert_eq!(all_events(&store).await, 2, "the claim is stored once");
}
