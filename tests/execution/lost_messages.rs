//! Lost and late messages: the network hides what the CRM did, and the ledger finds out before
//! it ever sends again — and while the CRM says the first request is still in progress, it only
//! looks again.

use opledger_crm_stand::FaultKind;
use opledger_domain::command::Command;
use opledger_domain::event::{OperationEvent, ReconciliationResult};
use opledger_domain::ids::ExternalObjectId;
use opledger_domain::state::Status;
use opledger_projections::work_queue::WorkQueue;

use opledger_domain::engine::Report;

use super::support::{names, Crm, Harness, Setup, ACCOUNT, ACCOUNT_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_arrived_is_retried_with_the_same_key_and_creates_one_task() {
    let h = Harness::start().await;
    h.queue(Crm::Keyed.create_fault(FaultKind::DropRequest))
        .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let intent = recorded.intent();

    let report = h.settle(intent.operation_id).await;

    let objects = h.objects_for(Crm::Keyed, intent).await;
    assert_eq!(objects.len(), 1, "exactly one task: {objects:?}");
    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: ExternalObjectId::new(objects[0].id.clone()).expect("a valid id")
        }
    );
    assert_eq!(
        h.event_names(intent.operation_id).await,
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReconciliationRecorded",
            "RetryScheduled",
            "AttemptStarted",
            "AttemptSucceeded",
        ]
    );
    // Both creates carried the operation's one key; the lookup between them found nothing.
    let posts = h.creates(Crm::Keyed).await;
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(posts
        .iter()
        .all(|post| post.key.as_deref() == Some(intent.idempotency_key.as_str())));
    assert_eq!(posts[0].outcome, "fault:drop_request");
    let events = h.events(intent.operation_id).await;
    assert!(
        matches!(
            &events[4],
            OperationEvent::ReconciliationRecorded(reconciled)
                if reconciled.result == ReconciliationResult::NotFound { authoritative: true }
        ),
        "{:?}",
        events[4]
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_lost_after_the_crm_applied_the_task_is_settled_by_a_lookup_of_its_label() {
    let h = Harness::start().await;
    h.queue(Crm::Labelled.create_fault(FaultKind::DropResponse))
        .await;
    let recorded = h.record(h.request(Crm::Labelled, Some("toolcall-1"))).await;
    let intent = recorded.intent();

    let report = h.settle(intent.operation_id).await;

    let objects = h.objects_for(Crm::Labelled, intent).await;
    assert_eq!(objects.len(), 1, "exactly one task: {objects:?}");
    let external_id = ExternalObjectId::new(objects[0].id.clone()).expect("a valid id");
    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: external_id.clone()
        }
    );
    assert_eq!(
        h.event_names(intent.operation_id).await,
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReconciliationRecorded",
        ],
        "found by the lookup, never sent a second time"
    );
    assert_eq!(h.creates(Crm::Labelled).await.len(), 1);
    assert!(
        report.sentence.contains(external_id.as_str()),
        "the agent names the task: {}",
        report.sentence
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_only_crm_with_a_lagging_index_keeps_the_operation_unknown_until_the_task_is_indexed(
) {
    let h = Harness::with(Setup {
        stand_search_lag_ms: 60_000,
        search_lag_ms: 60_000,
        ..Setup::default()
    })
    .await;
    h.queue(Crm::Plain.create_fault(FaultKind::DropResponse))
        .await;
    let recorded = h.record(h.request(Crm::Plain, Some("toolcall-1"))).await;
    let intent = recorded.intent();
    let operation_id = intent.operation_id;

    let first = h.drive(operation_id).await;
    assert_eq!(first.state().status, Status::Unknown);
    for _ in 0..3 {
        let report = h.drive_when_due(operation_id).await;
        assert_eq!(
            report.state().status,
            Status::Unknown,
            "an empty search of a lagging index proves nothing"
        );
        assert_eq!(report.state().attempts, 1, "no second attempt");
    }
    let objects = h.objects_for(Crm::Plain, intent).await;
    assert_eq!(objects.len(), 1, "the CRM did create it: {objects:?}");
    assert_eq!(h.creates(Crm::Plain).await.len(), 1);
    let searches = h.lookups().await.len();
    assert!(searches >= 4, "it kept looking: {searches} searches");

    // The index catches up.
    h.admin
        .advance_clock_ms(61_000)
        .await
        .expect("the stand clock moves");
    let report = h.drive_when_due(operation_id).await;

    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: ExternalObjectId::new(objects[0].id.clone()).expect("a valid id")
        }
    );
    assert_eq!(h.objects_for(Crm::Plain, intent).await, objects);
    assert_eq!(h.creates(Crm::Plain).await.len(), 1);
    let events = h.events(operation_id).await;
    let names = names(&events);
    assert_eq!(
        names[..3],
        ["IntentRecorded", "AttemptStarted", "OutcomeUnknown"]
    );
    // Each lookup is claimed before it is made; the claims say who looked, not what was found.
    let lookups: Vec<&OperationEvent> = events[3..]
        .iter()
        .filter(|event| !matches!(event, OperationEvent::LookupClaimed(_)))
        .collect();
    assert_eq!(
        events.len() - 3,
        2 * lookups.len(),
        "one claim per lookup: {names:?}"
    );
    assert!(
        lookups.len() >= 5,
        "at least four empty searches and the one that found it: {names:?}"
    );
    let (found, empty) = lookups.split_last().expect("lookups were recorded");
    assert!(
        empty.iter().all(|event| matches!(
            event,
            OperationEvent::ReconciliationRecorded(reconciled)
                if reconciled.result == ReconciliationResult::NotFound { authoritative: false }
        )),
        "{names:?}"
    );
    assert!(
        matches!(
            found,
            OperationEvent::ReconciliationRecorded(reconciled)
                if matches!(&reconciled.result, ReconciliationResult::Found { external_id, .. } if external_id.as_str() == objects[0].id)
        ),
        "{found:?}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_that_settles_inside_its_lag_looks_once_more_after_it_and_finds_the_duplicate_behind(
) {
    // The stand's index lags 60 s on its own clock (moved by hand); the connector declares 1.5 s,
    // the time this test waits for the look after the lag.
    let h = Harness::with(Setup {
        stand_search_lag_ms: 60_000,
        search_lag_ms: 1_500,
        ..Setup::default()
    })
    .await;
    h.queue(Crm::Plain.create_fault(FaultKind::DropResponse))
        .await;
    let recorded = h.record(h.request(Crm::Plain, Some("toolcall-1"))).await;
    let intent = recorded.intent().clone();
    let operation_id = intent.operation_id;
    assert_eq!(h.drive(operation_id).await.state().status, Status::Unknown);
    // The index shows the task the lost answer created; then a second task under the operation's
    // label is created (another sender, a provider's own repeat), which the index does not show yet.
    h.admin
        .advance_clock_ms(61_000)
        .await
        .expect("the stand clock moves");
    let label = opledger_domain::provider::operation_label(operation_id);
    let second: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/plain/{ACCOUNT}/tasks", h.base_url()))
        .bearer_auth(ACCOUNT_TOKEN)
        .json(&serde_json::json!({"title": "the same task again", "opledger_label": label}))
        .send()
        .await
        .expect("the stand answers")
        .json()
        .await
        .expect("the second task");
    let second_id = second["id"].as_str().expect("an id").to_owned();

    // Inside the declared lag the search shows one labelled task: it settles the operation...
    let settled = h.drive_when_due(operation_id).await;
    let first_id = match &settled.state().status {
        Status::Succeeded { external_id } => external_id.clone(),
        other => panic!("settled by the search: {other:?}"),
    };
    assert_ne!(first_id.as_str(), second_id);
    assert!(settled.state().duplicates.is_empty());
    // ...and leaves one more look for after the lag, as work a worker finds due.
    assert!(
        settled.state().next_work().is_some(),
        "{:?}",
        settled.state()
    );

    // The index catches up; the look after the lag sees the second task: a detected duplicate.
    h.admin
        .advance_clock_ms(61_000)
        .await
        .expect("the stand clock moves");
    let looked = h.drive_when_due(operation_id).await;
    let state = looked.state();
    assert_eq!(
        state.status,
        Status::Succeeded {
            external_id: first_id
        },
        "no regression"
    );
    assert_eq!(
        state.duplicates,
        [ExternalObjectId::new(second_id).expect("a valid id")]
    );
    assert_eq!(state.next_work(), None, "looked once, not again");
    let names = h.event_names(operation_id).await;
    assert_eq!(
        names[names.len() - 2..],
        ["ReconciliationRecorded", "DuplicateDetected"],
        "{names:?}"
    );
    assert_eq!(state.attempts, 1, "never sent again");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_after_the_lag_refused_for_credentials_ends_without_a_person_and_is_not_repeated() {
    let h = Harness::with(Setup {
        stand_search_lag_ms: 0,
        search_lag_ms: 1_500,
        ..Setup::default()
    })
    .await;
    h.queue(Crm::Plain.create_fault(FaultKind::DropResponse))
        .await;
    let recorded = h.record(h.request(Crm::Plain, Some("toolcall-1"))).await;
    let operation_id = recorded.intent().operation_id;
    // The answer is lost; the index shows the task at once, so a lookup inside the declared lag
    // (in this drive or a next one) settles it.
    let mut settled = h.drive(operation_id).await;
    for _ in 0..3 {
        if matches!(settled.state().status, Status::Succeeded { .. }) {
            break;
        }
        settled = h.drive_when_due(operation_id).await;
    }
    assert!(
        matches!(settled.state().status, Status::Succeeded { .. }),
        "{:?}",
        settled.state()
    );
    assert!(
        settled.state().next_work().is_some(),
        "a look after the lag is due"
    );
    // The account's token is revoked before that look: the provider refuses it.
    h.admin
        .set_account_token(ACCOUNT, &format!("{ACCOUNT_TOKEN}-revoked"))
        .await
        .expect("the stand takes the new token");
    let looked = h.drive_when_due(operation_id).await;
    let state = looked.state();
    assert!(
        matches!(state.status, Status::Succeeded { .. }),
        "{state:?}"
    );
    assert_eq!(state.next_work(), None, "the look is over, not repeated");
    let names = h.event_names(operation_id).await;
    assert!(!names.contains(&"ReviewRequired"), "{names:?}");
    assert_eq!(names.last(), Some(&"ReconciliationRecorded"), "{names:?}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_after_reconciliation_changes_nothing_and_a_different_late_id_is_a_duplicate(
) {
    let h = Harness::with(Setup {
        request_timeout_ms: 500,
        connect_timeout_ms: 300,
        ..Setup::default()
    })
    .await;
    h.queue(Crm::Labelled.create_fault(FaultKind::LateResponse { delay_ms: 1_500 }))
        .await;
    let recorded = h.record(h.request(Crm::Labelled, Some("toolcall-1"))).await;
    let intent = recorded.intent();
    let operation_id = intent.operation_id;

    let report = h.settle(operation_id).await;

    let objects = h.objects_for(Crm::Labelled, intent).await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    let confirmed = ExternalObjectId::new(objects[0].id.clone()).expect("a valid id");
    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: confirmed.clone()
        }
    );
    let settled = h.event_names(operation_id).await;
    assert_eq!(
        settled,
        [
            "IntentRecorded",
            "AttemptStarted",
            "OutcomeUnknown",
            "LookupClaimed",
            "ReconciliationRecorded",
        ]
    );

    // The answer the client gave up on arrives after all, as the engine would record it.
    let first_attempt = report.state().attempt_ids[0];
    let late = |external_id: ExternalObjectId| Command::RecordSuccess {
        attempt_id: first_attempt,
        external_id,
        provider_request_id: None,
    };
    let unchanged = h
        .ledger()
        .execute(operation_id, &late(confirmed.clone()))
        .await
        .expect("a late confirmation of the same task is accepted");
    assert_eq!(
        unchanged.version, report.operation.version,
        "nothing appended"
    );
    assert_eq!(h.event_names(operation_id).await, settled);

    let other = ExternalObjectId::new("999999").expect("a valid id");
    let after = h
        .ledger()
        .execute(operation_id, &late(other.clone()))
        .await
        .expect("a late confirmation of another task is recorded");
    assert_eq!(
        after.state.status,
        Status::Succeeded {
            external_id: confirmed.clone()
        },
        "no regression: the first confirmed task stays the outcome"
    );
    assert_eq!(after.state.duplicates, std::slice::from_ref(&other));
    let events = h.events(operation_id).await;
    assert_eq!(
        names(&events[settled.len()..]),
        ["LateResponseReceived", "DuplicateDetected"]
    );
    assert!(
        matches!(
            events.last(),
            Some(OperationEvent::DuplicateDetected(duplicate))
                if duplicate.confirmed_external_id == confirmed && duplicate.duplicate_external_id == other
        ),
        "{:?}",
        events.last()
    );
    assert_eq!(h.objects_for(Crm::Labelled, intent).await.len(), 1);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_duplicate_of_a_settled_operation_leaves_no_open_work_for_the_workers() {
    let h = Harness::start().await;
    let recorded = h.record(h.request(Crm::Labelled, Some("toolcall-1"))).await;
    let operation_id = recorded.intent().operation_id;
    let report = h.settle(operation_id).await;
    let first_attempt = report.state().attempt_ids[0];
    h.ledger()
        .execute(
            operation_id,
            &Command::RecordSuccess {
                attempt_id: first_attempt,
                external_id: ExternalObjectId::new("999999").expect("a valid id"),
                provider_request_id: None,
            },
        )
        .await
        .expect("the late duplicate is recorded");
    let events = h.events(operation_id).await;
    assert_eq!(
        names(&events),
        [
            "IntentRecorded",
            "AttemptStarted",
            "AttemptSucceeded",
            "LateResponseReceived",
            "DuplicateDetected",
        ]
    );

    // The workers' read model, folded from the same stream.
    let mut queue = WorkQueue::new();
    for event in &events {
        queue.apply(operation_id, event);
    }

    assert_eq!(queue.next_due_at(), None);
    assert_eq!(
        queue.state(operation_id).map(|state| state.status.name()),
        None,
        "a settled operation is not open work"
    );
    assert_eq!(queue.open_operations(), 0);
    h.finish().await;
}

/// The first create of a keyed CRM answers only after 3 s, long after the adapter's 0.8 s
/// timeout: until then every lookup of its key answers "in progress", and a retry with the key
/// would be refused as in flight.
async fn a_keyed_create_still_in_progress(max_reconciliations: u32) -> (Harness, Report) {
    let mut setup = Setup::default();
    setup.policy.retry.max_reconciliations = max_reconciliations;
    let h = Harness::with(setup).await;
    h.queue(Crm::Keyed.create_fault(FaultKind::LateResponse { delay_ms: 3_000 }))
        .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let report = h.settle(recorded.intent().operation_id).await;
    (h, report)
}

fn count(names: &[&str], name: &str) -> usize {
    names.iter().filter(|each| **each == name).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_still_in_progress_at_the_crm_is_looked_up_again_never_retried_and_confirmed_when_it_completes(
) {
    let (h, report) = a_keyed_create_still_in_progress(20).await;
    let intent = report.state().intent.clone().expect("recorded");

    let objects = h.objects_for(Crm::Keyed, &intent).await;
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(
        report.state().external_id().map(|id| id.as_str()),
        Some(objects[0].id.as_str())
    );
    assert_eq!(h.creates(Crm::Keyed).await.len(), 1, "no retry was sent");
    let names = h.event_names(intent.operation_id).await;
    assert_eq!(count(&names, "AttemptStarted"), 1, "{names:?}");
    assert_eq!(count(&names, "RetryScheduled"), 0, "{names:?}");
    assert!(count(&names, "ReconciliationRecorded") >= 2, "{names:?}");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_still_in_progress_when_the_lookup_budget_runs_out_goes_to_a_person_without_a_retry(
) {
    // Two lookups, about a second apart, both while the first request still runs.
    let (h, report) = a_keyed_create_still_in_progress(2).await;
    let intent = report.state().intent.clone().expect("recorded");

    assert_eq!(report.state().status, Status::NeedsReview);
    let reason = report.state().review_reason.clone().unwrap_or_default();
    assert!(reason.contains("in progress"), "{reason}");
    assert_eq!(
        report.state().attempts,
        1,
        "no attempt spent on a refused retry"
    );
    assert_eq!(h.creates(Crm::Keyed).await.len(), 1, "no retry was sent");
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
            "ReviewRequired",
        ]
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_that_finds_two_tasks_with_the_operations_label_confirms_the_first_and_records_the_other_as_a_duplicate(
) {
    use opledger_domain::ports::IdSource;
    use opledger_domain::provider::{operation_label, Providers, SendOutcome, SendRequest};

    let h = Harness::start().await;
    h.queue(Crm::Plain.create_fault(FaultKind::DropResponse))
        .await;
    let recorded = h.record(h.request(Crm::Plain, Some("toolcall-1"))).await;
    let intent = recorded.intent().clone();
    let operation_id = intent.operation_id;
    let unknown = h.first_attempt_left_unknown(operation_id).await;
    assert_eq!(unknown.status, Status::Unknown);
    // A second task with the same label, as a retry outside the ledger would have made.
    let copy = h
        .engine
        .providers()
        .execute(&SendRequest {
            operation_id,
            attempt_id: h.ledger().ids().new_attempt_id(),
            tenant: intent.tenant.clone(),
            provider: intent.provider.clone(),
            account: intent.account.clone(),
            action: intent.action.clone(),
            args: intent.args.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            label: operation_label(operation_id),
        })
        .await;
    assert!(matches!(copy, SendOutcome::Confirmed { .. }), "{copy:?}");
    let objects = h.objects_for(Crm::Plain, &intent).await;
    assert_eq!(objects.len(), 2, "{objects:?}");
    h.admin
        .advance_clock_ms(h.setup.stand_search_lag_ms + 1)
        .await
        .expect("the stand clock moves");

    let report = h.drive_when_due(operation_id).await;

    let first = ExternalObjectId::new(objects[0].id.clone()).expect("a valid id");
    let second = ExternalObjectId::new(objects[1].id.clone()).expect("a valid id");
    assert_eq!(
        report.state().status,
        Status::Succeeded {
            external_id: first.clone()
        },
        "the earliest task is the operation's outcome"
    );
    assert_eq!(report.state().duplicates, std::slice::from_ref(&second));
    let events = h.events(operation_id).await;
    assert!(
        matches!(
            events.last(),
            Some(OperationEvent::DuplicateDetected(duplicate))
                if duplicate.confirmed_external_id == first && duplicate.duplicate_external_id == second
        ),
        "{:?}",
        names(&events)
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_that_asks_for_a_pause_is_not_looked_up_before_the_pause_ends() {
    let h = Harness::start().await;
    h.queue(Crm::Keyed.create_fault(FaultKind::ErrorAfterCommit {
        status: 503,
        retry_after_s: Some(30),
    }))
    .await;
    let recorded = h.record(h.request(Crm::Keyed, Some("toolcall-1"))).await;
    let operation_id = recorded.intent().operation_id;
    let before = chrono::Utc::now();

    let first = h.drive(operation_id).await;
    assert_eq!(first.state().status, Status::Unknown);
    let check = first
        .state()
        .next_check_not_before
        .expect("the first lookup waits for the pause the provider asked for");
    assert!(
        check >= before + chrono::Duration::seconds(29),
        "looked up at {check}, asked at {before} to wait 30 s"
    );
    // Driving again now finds nothing due: the provider is not asked while it recovers.
    let again = h.drive(operation_id).await;
    assert_eq!(again.state().status, Status::Unknown);
    assert!(
        h.lookups().await.is_empty(),
        "no lookup inside the pause: {:?}",
        h.lookups().await
    );
    h.finish().await;
}
