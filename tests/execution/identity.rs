//! Which requests are the same operation: a redelivered source event is — also after the
//! account's credentials rotated or the account was removed from the configuration — a new
//! request with the same text is not, and a redelivery with changed arguments is refused.

use opledger_domain::app::AppError;
use opledger_domain::ids::ExternalObjectId;
use opledger_domain::state::Status;
use serde_json::json;

use super::support::{
    fingerprint_at, Crm, Harness, ACCOUNT, ACCOUNT_TOKEN, OTHER_ACCOUNT, OTHER_ACCOUNT_TOKEN,
    WORKER,
};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tool_call_delivered_again_after_the_token_rotated_finds_its_operation_and_sends_nothing(
) {
    let h = Harness::start().await;
    let request = h.request(Crm::Keyed, Some("toolcall-1"));
    let recorded = h.record(request.clone()).await;
    let intent = recorded.intent().clone();
    let first = h.settle(intent.operation_id).await;
    let requests_before = h.requests().await;

    // The process restarts with a new token for the account: its fingerprint is another one.
    let rotated = h.engine_with(
        h.setup.providers(
            &h.base_url(),
            &[(ACCOUNT, &format!("{ACCOUNT_TOKEN}-rotated"))],
        ),
        WORKER,
    );
    let mut redelivered = request.clone();
    redelivered.credential_fingerprint =
        fingerprint_at(rotated.providers(), Crm::Keyed.provider()).to_string();
    assert_ne!(
        redelivered.credential_fingerprint,
        intent.credential_fingerprint.to_string()
    );
    let again = rotated
        .ledger()
        .record_intent(redelivered.clone())
        .await
        .expect("a redelivery is not a new request");
    let report = rotated
        .drive(again.intent().operation_id)
        .await
        .expect("the engine drives it");

    assert!(!again.created, "the redelivery found the operation");
    assert_eq!(again.intent(), &intent, "the intent as it was recorded");
    assert_eq!(report.state().status, first.state().status);
    assert_eq!(
        h.requests().await,
        requests_before,
        "nothing reached the CRM"
    );
    assert_eq!(
        h.event_names(intent.operation_id).await,
        ["IntentRecorded", "AttemptStarted", "AttemptSucceeded"]
    );
    // Other arguments under the same source id stay another request.
    let mut changed = redelivered;
    changed.args = json!({"title": "Call the client", "due": "2026-12-24"});
    assert!(matches!(
        rotated.ledger().record_intent(changed).await,
        Err(AppError::SourceReused {
            differs: "arguments",
            ..
        })
    ));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_whose_account_is_no_longer_configured_finds_its_operation_which_then_goes_to_a_person(
) {
    let h = Harness::start().await;
    let request = h.request(Crm::Keyed, Some("toolcall-1"));
    let intent = h.record(request.clone()).await.intent().clone();
    // Restarted with the account removed: the caller cannot name its credentials any more.
    let removed = h.engine_with(
        h.setup
            .providers(&h.base_url(), &[(OTHER_ACCOUNT, OTHER_ACCOUNT_TOKEN)]),
        WORKER,
    );
    let mut redelivered = request;
    redelivered.credential_fingerprint = String::new();

    let found = removed
        .ledger()
        .find_redelivery(&redelivered)
        .await
        .expect("a redelivery is looked up without credentials")
        .expect("the source id recorded an operation");
    let report = removed
        .drive(found.intent().operation_id)
        .await
        .expect("the engine drives it");

    assert!(!found.created);
    assert_eq!(found.intent(), &intent);
    // The binding is checked at the send, as for any operation: a person decides.
    assert_eq!(report.state().status, Status::NeedsReview);
    assert!(h.requests().await.is_empty(), "nothing reached the CRM");
    let mut fresh = redelivered.clone();
    fresh.source_id = Some("toolcall-2".into());
    assert!(matches!(
        removed.ledger().find_redelivery(&fresh).await,
        Ok(None)
    ));
    let mut changed = redelivered;
    changed.args = json!({"title": "Call someone else"});
    assert!(matches!(
        removed.ledger().find_redelivery(&changed).await,
        Err(AppError::SourceReused {
            differs: "arguments",
            ..
        })
    ));
    h.finish().await;
}
