//! Recording and executing in one call (`POST /v1/operations?execute=true`): the intent and the
//! claim of its first attempt are one append, durable before the one send; everything that cannot
//! be sent at once is recorded alone and left as recording would leave it.

use opledger_domain::ids::ExternalObjectId;
use opledger_domain::state::Status;
use opledger_store::AnyStore;

use super::support::{Crm, Harness, OTHER_ACCOUNT, OTHER_ACCOUNT_TOKEN, WORKER};

/// Appends the ledger has written so far, where the backend counts them (SQLite).
fn appends_so_far(h: &Harness) -> Option<u64> {
    match h.ledger().store() {
        AnyStore::Sqlite(store) => Some(store.commit_stats().appends),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_and_executing_at_once_appends_the_intent_with_its_claim_then_the_outcome() {
    let h = Harness::start().await;
    let appends_before = appends_so_far(&h);

    let (recorded, report) = h
        .engine
        .record_and_drive(h.request(Crm::Keyed, Some("toolcall-1")))
        .await
        .expect("the intent is recorded");
    let report = report.expect("the operation is driven");

    let intent = recorded.intent().clone();
    assert!(recorded.created);
    // As recorded, before the send: claimed by this engine, with the intent in the same append.
    assert_eq!(recorded.operation.state.status, Status::InFlight);
    let claim = recorded
        .operation
        .state
        .current_attempt
        .as_ref()
        .expect("the claim was appended with the intent");
    assert_eq!(claim.worker.as_str(), WORKER);
    let objects = h.objects_for(Crm::Keyed, &intent).await;
    assert_eq!(objects.len(), 1, "exactly one task: {objects:?}");
    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: ExternalObjectId::new(objects[0].id.clone()).expect("a valid id")
        }
    );
    assert_eq!(
        h.event_names(intent.operation_id).await,
        ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"]
    );
    if let (Some(before), Some(after)) = (appends_before, appends_so_far(&h)) {
        assert_eq!(
            after - before,
            2,
            "one append for the intent and its claim, one for the outcome"
        );
    }
    let creates = h.creates(Crm::Keyed).await;
    assert_eq!(creates.len(), 1, "{creates:?}");
    assert_eq!(
        creates[0].key.as_deref(),
        Some(intent.idempotency_key.as_str())
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_awaiting_approval_is_recorded_alone_and_nothing_is_sent() {
    let h = Harness::start().await;
    let mut request = h.request(Crm::Keyed, None);
    request.requires_approval = true;

    let (recorded, report) = h
        .engine
        .record_and_drive(request)
        .await
        .expect("the intent is recorded");
    let report = report.expect("the operation is driven");

    assert_eq!(report.state().status, Status::AwaitingApproval);
    assert_eq!(
        h.event_names(recorded.intent().operation_id).await,
        ["IntentRecorded"]
    );
    assert!(h.creates(Crm::Keyed).await.is_empty());
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_tool_call_appends_nothing_and_sends_nothing_again() {
    let h = Harness::start().await;
    let request = h.request(Crm::Keyed, Some("toolcall-1"));
    let (first, _) = h
        .engine
        .record_and_drive(request.clone())
        .await
        .expect("the intent is recorded");
    let operation_id = first.intent().operation_id;
    let events_before = h.event_names(operation_id).await;

    let (again, report) = h
        .engine
        .record_and_drive(request)
        .await
        .expect("the redelivery is answered");
    let report = report.expect("the operation is reported");

    assert!(!again.created);
    assert_eq!(again.intent().operation_id, operation_id);
    assert!(matches!(report.state().status, Status::Succeeded { .. }));
    assert_eq!(h.event_names(operation_id).await, events_before);
    assert_eq!(h.creates(Crm::Keyed).await.len(), 1);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_its_engine_cannot_send_is_recorded_alone_then_handed_to_a_person() {
    let h = Harness::start().await;
    // This engine knows the provider but not the account the intent is bound to.
    let engine = h.engine_with(
        h.setup
            .providers(&h.base_url(), &[(OTHER_ACCOUNT, OTHER_ACCOUNT_TOKEN)]),
        "worker-b",
    );

    let (recorded, report) = engine
        .record_and_drive(h.request(Crm::Keyed, None))
        .await
        .expect("the intent is recorded");
    let report = report.expect("the operation is driven");

    assert_eq!(recorded.operation.state.status, Status::Pending);
    assert!(matches!(report.state().status, Status::NeedsReview));
    assert_eq!(
        h.event_names(recorded.intent().operation_id).await,
        ["IntentRecorded", "ReviewRequired"]
    );
    assert!(h.creates(Crm::Keyed).await.is_empty());
    h.finish().await;
}
