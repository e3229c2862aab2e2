//! What the agent may say follows the state: never "done" while the CRM has not confirmed, and
//! the concrete task once it has.

use opledger_crm_stand::FaultKind;
use opledger_domain::state::Status;

use super::support::{Crm, Harness, Setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_sentence_says_not_confirmed_while_unknown_and_names_the_task_once_found() {
    // One attempt only, and a lookup that fails once: the operation has to stay unknown for a
    // while. The backoff keeps the second lookup out of the first drive.
    let mut setup = Setup::default();
    setup.policy.retry.max_attempts = 1;
    setup.policy.backoff_base_ms = 1_000;
    setup.policy.backoff_max_ms = 1_000;
    let h = Harness::with(setup).await;
    h.queue(Crm::Labelled.create_fault(FaultKind::DropResponse))
        .await;
    h.queue(Crm::Labelled.lookup_fault(FaultKind::ErrorBeforeCommit { status: 503 }))
        .await;
    let recorded = h.record(h.request(Crm::Labelled, Some("toolcall-1"))).await;
    let intent = recorded.intent();

    let unknown = h.drive(intent.operation_id).await;

    assert_eq!(unknown.state().status, Status::Unknown);
    assert!(
        unknown.sentence.contains("not confirmed") && !unknown.sentence.contains("Done"),
        "{}",
        unknown.sentence
    );
    let objects = h.objects_for(Crm::Labelled, intent).await;
    assert_eq!(objects.len(), 1, "the CRM did create it: {objects:?}");
    assert!(
        !unknown.sentence.contains(&objects[0].id),
        "{}",
        unknown.sentence
    );

    let found = h.settle(intent.operation_id).await;

    assert_eq!(
        found.state().external_id().map(|id| id.as_str()),
        Some(objects[0].id.as_str())
    );
    assert!(
        found.sentence.starts_with("Done") && found.sentence.contains(&objects[0].id),
        "{}",
        found.sentence
    );
    assert!(
        found
            .sentence
            .contains("the request to create a task in account acct-1"),
        "the sentence uses the action's description and names the account: {}",
        found.sentence
    );
    assert_eq!(h.objects_for(Crm::Labelled, intent).await, objects);
    assert_eq!(
        h.event_names(intent.operation_id).await,
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReconciliationRecorded",
            "LookupClaimed",
            "ReconciliationRecorded",
        ]
    );
    h.finish().await;
}
