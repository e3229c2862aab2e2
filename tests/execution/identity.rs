//! Which requests are the same operation: a redelivered source event is, a new request with the
//! same text is not, and a redelivery with changed arguments is refused.

use opledger_domain::app::AppError;
use opledger_domain::ids::ExternalObjectId;
use opledger_domain::state::Status;
use serde_json::json;

use super::support::{Crm, Harness, ACCOUNT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tool_call_delivered_again_after_a_restart_sends_nothing() {
    let mut h = Harness::start().await;
    let request = h.request(Crm::Keyed, Some("toolcall-1"));
    let recorded = h.record(request.clone()).await;
    let intent = recorded.intent().clone();
    let first = h.settle(intent.operation_id).await;
    let confirmed = first
        .state()
        .external_id()
        .cloned()
        .expect("the first delivery succeeded");
    let requests_before = h.requests().await;
    let events_before = h.event_names(intent.operation_id).await;
    assert_eq!(
        events_before,
        ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"]
    );

    h.close_store().await;
    h.reopen_store().await;
    let again = h.record(request).await;
    let report = h.drive(again.intent().operation_id).await;

    assert!(!again.created, "the redelivery found the operation");
    assert_eq!(again.intent().operation_id, intent.operation_id);
    assert_eq!(again.intent().idempotency_key, intent.idempotency_key);
    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: confirmed.clone()
        }
    );
    assert_eq!(
        h.requests().await,
        requests_before,
        "no request reached the CRM"
    );
    assert_eq!(h.event_names(intent.operation_id).await, events_before);
    let objects = h.objects_for(Crm::Keyed, &intent).await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(objects[0].id, confirmed.as_str());
    h.finish().await;
}

/// Records `first` and `second`, drives both, and checks that they are two operations with two
/// keys and two tasks.
async fn two_requests_with_the_same_text_make_two_tasks(
    h: &Harness,
    first: Option<&str>,
    second: Option<&str>,
) {
    let a = h.record(h.request(Crm::Keyed, first)).await;
    let b = h.record(h.request(Crm::Keyed, second)).await;
    assert!(a.created && b.created);
    assert_eq!(a.intent().args, b.intent().args, "the same text");
    assert_ne!(a.intent().operation_id, b.intent().operation_id);
    assert_ne!(a.intent().idempotency_key, b.intent().idempotency_key);

    let mut external_ids = Vec::new();
    for recorded in [&a, &b] {
        let intent = recorded.intent();
        let report = h.settle(intent.operation_id).await;
        let objects = h.objects_for(Crm::Keyed, intent).await;
        assert_eq!(objects.len(), 1, "{objects:?}");
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
        external_ids.push(objects[0].id.clone());
    }
    assert_ne!(external_ids[0], external_ids[1]);
    assert_eq!(
        h.objects_in(ACCOUNT).await.len(),
        2,
        "two tasks, legitimately"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_request_with_the_same_text_and_no_source_id_is_a_second_operation_and_a_second_task()
{
    let h = Harness::start().await;
    two_requests_with_the_same_text_make_two_tasks(&h, None, None).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_text_under_a_different_source_id_is_a_second_operation_and_a_second_task() {
    let h = Harness::start().await;
    two_requests_with_the_same_text_make_two_tasks(&h, Some("toolcall-1"), Some("toolcall-2"))
        .await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_arguments_under_an_old_source_id_are_refused_and_never_sent() {
    let h = Harness::start().await;
    let request = h.request(Crm::Keyed, Some("toolcall-1"));
    let recorded = h.record(request.clone()).await;
    let intent = recorded.intent().clone();
    let mut changed = request;
    changed.args = json!({"title": "Call the client", "due": "2026-12-24"});

    let refused = h.ledger().record_intent(changed.clone()).await;

    assert!(
        matches!(
            &refused,
            Err(AppError::SourceReused { operation_id, differs: "arguments", .. })
                if *operation_id == intent.operation_id
        ),
        "{refused:?}"
    );
    assert!(h.requests().await.is_empty(), "nothing was sent");
    assert_eq!(h.event_names(intent.operation_id).await, ["IntentRecorded"]);

    // The operation itself goes out with the arguments it froze, under its own key.
    let report = h.settle(intent.operation_id).await;
    let objects = h.objects_for(Crm::Keyed, &intent).await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(
        serde_json::Value::Object(objects[0].fields.clone()),
        json!({"title": "Call the client", "due": "2026-12-01"})
    );
    assert_eq!(
        report.state().external_id().map(|id| id.as_str()),
        Some(objects[0].id.as_str())
    );
    assert_eq!(
        h.event_names(intent.operation_id).await,
        ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"]
    );

    // Refused again after the success, and still nothing sent.
    let requests = h.requests().await;
    assert!(matches!(
        h.ledger().record_intent(changed).await,
        Err(AppError::SourceReused { .. })
    ));
    assert_eq!(h.requests().await, requests);
    assert_eq!(h.objects_in(ACCOUNT).await.len(), 1);
    h.finish().await;
}
